//! The record the reliability matrix keeps of what its tests observed
//! (issue 15, RELIABILITY.md): each matrix test appends one JSON line per
//! case to `target/reliability/<row>.jsonl`, and `scripts/reliability-report`
//! sums them into RELIABILITY.md. Counts come from what a test observed
//! (faults the coordinator injected, inputs tried, secrets checked, events
//! lost, orphans left), never from constants typed into the test.
//!
//! A line: `{"row": "...", "must": "...", "test": "...", "counts": {"faults_injected": 3, ...}}`.
//! `row` names the matrix row (one fault or input class, e.g.
//! `coordinator faults: session read, 503`); `must` is what the runner must
//! do; `test` is the test's path (`suite::…::name`).

use std::io::Write;
use std::path::PathBuf;

/// The directory the lines go to: `target/reliability/`.
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map(|p| p.join("reliability"))
        .unwrap_or_else(|| PathBuf::from("target/reliability"))
}

/// Appends one case of matrix row `row` to its file. `counts` are names
/// (`faults_injected`, `inputs_tried`, `secrets_checked`, `events_lost`,
/// `orphans_left`, or a row's own) and what the test observed.
pub fn record(row: &str, must: &str, test: &str, counts: &[(&str, u64)]) {
    let dir = dir();
    std::fs::create_dir_all(&dir).unwrap();
    let slug: String = row
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let counts: serde_json::Map<String, serde_json::Value> = counts
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    let line = serde_json::json!({"row": row, "must": must, "test": test, "counts": counts});
    // One write of a line under PIPE_BUF with O_APPEND: tests in other
    // processes appending to the same row do not interleave.
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{slug}.jsonl")))
        .unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}
