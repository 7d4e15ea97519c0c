//! Throughput of the agent-output pipeline (PROTOCOL.md 2.6 and section 5):
//! streaming redaction, line framing, mapping to events and appending to the
//! run's spool, with 100 secrets registered. Run with
//! `cargo bench --bench pipeline`; the figures go to BENCHMARKS.md.
//!
//! Each case feeds the same bytes the supervisor would (64 KiB reads) through
//! the runner's own path (`agent::drive` with the `command` adapter: the
//! reader's `ChannelSink`, then `agent::command::lines_to_events`) into a
//! spool file in a temporary directory, and prints the best and median of 5
//! runs in MB/s of agent output (1 MB = 10^6 bytes).

// A benchmark that cannot set up (no temporary directory, no runtime) has
// nothing to measure: it stops with the reason, as a test would.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark set-up: a panic names what is missing"
)]

use std::time::{Duration, Instant};

use hosted_boot::events::EventSender;
use hosted_boot::events::spool::Spool;
use hosted_boot::process::output::{ChannelSink, OutputSink, READ_BYTES};
use hosted_boot::process::supervisor::Stream;
use hosted_boot::redact::{Redactor, SecretKind};
use hosted_boot::secret::Secret;

const SECRETS: usize = 100;
const TOTAL: usize = 256 * 1024 * 1024;
const RUNS: usize = 5;

/// A small deterministic generator (xorshift), so runs are comparable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn token(&mut self, len: usize) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
        (0..len)
            .map(|_| ALPHABET[self.below(ALPHABET.len())] as char)
            .collect()
    }
}

const WORDS: &[&str] = &[
    "the",
    "agent",
    "reads",
    "src/main.rs",
    "and",
    "runs",
    "cargo",
    "test",
    "--",
    "ok",
    "error:",
    "warning:",
    "fn",
    "let",
    "=",
    "{",
    "}",
    "compiling",
    "hosted-boot",
    "v0.1.0",
    "finished",
    "in",
    "2.31s",
    "passed;",
    "0",
    "failed;",
    "diff",
    "--git",
    "a/README.md",
    "b/README.md",
];

fn words(rng: &mut Rng, bytes: usize) -> String {
    let mut s = String::new();
    while s.len() < bytes {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[rng.below(WORDS.len())]);
    }
    s
}

/// About `TOTAL` bytes of lines made by `line`, with one of the secrets in
/// roughly one line in 500.
fn corpus(
    rng: &mut Rng,
    secrets: &[String],
    mut line: impl FnMut(&mut Rng, Option<&str>) -> String,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(TOTAL + 128 * 1024);
    while out.len() < TOTAL {
        let secret = (rng.below(500) == 0).then(|| secrets[rng.below(secrets.len())].as_str());
        out.extend_from_slice(line(rng, secret).as_bytes());
        out.push(b'\n');
    }
    out
}

/// The path agent output takes in the runner (`agent::drive`): the reader's
/// `ChannelSink` (streaming redaction, framing, a bounded channel of 4
/// reads; the drive's per-line observer, which stamps the watchdog's output
/// clock) and the `command` adapter's task (`agent::command::lines_to_events`:
/// map the queued lines, redact by value, number, append to the spool in one
/// write), on a two-worker runtime.
fn run_drive_path(redactor: &Redactor, input: &[u8]) -> (Duration, u64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("temporary directory");
        let (spool, _) = Spool::open(dir.path(), redactor.clone()).expect("spool");
        let path = spool.path().to_path_buf();
        let events = EventSender::detached(spool);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let adapter = tokio::spawn(async move {
            let mut lines = hosted_boot::process::output::LineReceiver::new(rx);
            hosted_boot::agent::command::lines_to_events(&mut lines, &events).await;
        });
        // What `agent::drive`'s observer does per line: the watchdog's
        // output clock is stamped under its lock (stdout: no stderr tail).
        let clock = std::sync::Arc::new(std::sync::Mutex::new(Instant::now()));
        let observe = move |_: Stream, _: &_| {
            *clock.lock().unwrap() = Instant::now();
        };
        let start = Instant::now();
        let mut sink = ChannelSink::new(Stream::Stdout, redactor, observe, tx);
        for chunk in input.chunks(READ_BYTES) {
            sink.write(chunk);
            sink.ready().await;
        }
        sink.end();
        sink.ready().await;
        drop(sink);
        adapter.await.expect("adapter task");
        let elapsed = start.elapsed();
        let spooled = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        (elapsed, spooled)
    })
}

fn redact_only(redactor: &Redactor, input: &[u8]) -> Duration {
    let start = Instant::now();
    let mut s = redactor.stream();
    let mut out = Vec::with_capacity(2 * READ_BYTES);
    let mut total = 0usize;
    for chunk in input.chunks(READ_BYTES) {
        out.clear();
        s.push(chunk, &mut out);
        total += out.len();
    }
    s.finish(&mut out);
    std::hint::black_box(total);
    start.elapsed()
}

fn report(name: &str, bytes: usize, mut times: Vec<Duration>, extra: &str) {
    times.sort();
    let mbps = |d: Duration| bytes as f64 / 1e6 / d.as_secs_f64();
    println!(
        "{name:<44} {:>8.0} MB/s best {:>8.0} MB/s median  ({} MB{extra})",
        mbps(times[0]),
        mbps(times[times.len() / 2]),
        bytes / 1_000_000
    );
}

fn main() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let redactor = Redactor::new();
    let mut secrets = Vec::new();
    for i in 0..SECRETS {
        // Tokens of the shapes the runner sees: 64-hex boot secret, ~40-char
        // bearers and repo tokens, connector values of various lengths.
        let value = match i % 4 {
            0 => format!("ghs_{}", rng.token(36)),
            1 => rng.token(64),
            2 => format!("sk-{}", rng.token(45)),
            _ => {
                let n = 12 + rng.below(20);
                rng.token(n)
            }
        };
        let kind = if i % 2 == 0 {
            SecretKind::Credential
        } else {
            SecretKind::Configured
        };
        redactor.add(&Secret::new(value.clone()), kind);
        secrets.push(value);
    }

    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "text lines (~80 B), output events",
            corpus(&mut rng, &secrets, |rng, s| {
                let n = 20 + rng.below(100);
                let mut l = words(rng, n);
                if let Some(s) = s {
                    l.push_str(" token=");
                    l.push_str(s);
                }
                l
            }),
        ),
        (
            "JSON agent events (~400 B)",
            corpus(&mut rng, &secrets, |rng, s| {
                let n = 200 + rng.below(400);
                let text = words(rng, n);
                let text = match s {
                    Some(s) => format!("{text} key={s}"),
                    None => text,
                };
                serde_json::json!({"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": text}]}}).to_string()
            }),
        ),
        (
            "JSON events with escapes (~400 B)",
            corpus(&mut rng, &secrets, |rng, s| {
                // What CLIs print: newlines, quotes, tabs, PHP's `\/`,
                // Python's `\u00e9` (none of them a byte any secret holds).
                let n = 200 + rng.below(400);
                let mut text = String::new();
                for w in words(rng, n).split(' ') {
                    text.push_str(w);
                    text.push_str(match rng.below(8) {
                        0 => "\\n",
                        1 => "\\\"",
                        2 => "\\/",
                        3 => "\\u00e9 ",
                        4 => "\\t",
                        _ => " ",
                    });
                }
                if let Some(s) = s {
                    text.push_str(" key=");
                    text.push_str(s);
                }
                format!(
                    r#"{{"type":"assistant","message":{{"role":"assistant","content":[{{"type":"text","text":"{text}"}}]}}}}"#
                )
            }),
        ),
        (
            "long lines (64 KiB), output events",
            corpus(&mut rng, &secrets, |rng, s| {
                let mut l = words(rng, 64 * 1024);
                if let Some(s) = s {
                    l.push_str(s);
                }
                l
            }),
        ),
    ];

    println!(
        "hosted-boot pipeline benchmark: {SECRETS} secrets, reads of {READ_BYTES} bytes, best of {RUNS}"
    );
    // `HOSTED_BOOT_BENCH_REDACT_ONLY=1`: only the redaction figures (a quick
    // before/after for a change to the byte redactor).
    let redact_only_run = std::env::var_os("HOSTED_BOOT_BENCH_REDACT_ONLY").is_some();
    for (name, input) in cases.iter().filter(|_| !redact_only_run) {
        let mut times = Vec::new();
        let mut spooled = 0;
        for _ in 0..RUNS {
            let (t, s) = run_drive_path(&redactor, input);
            times.push(t);
            spooled = s;
        }
        report(
            &format!("redact+frame+spool (drive path): {name}"),
            input.len(),
            times,
            &format!(", spool {} MB", spooled / 1_000_000),
        );
    }
    for (name, input) in &cases {
        let times = (0..RUNS).map(|_| redact_only(&redactor, input)).collect();
        report(&format!("redaction only: {name}"), input.len(), times, "");
    }
}
