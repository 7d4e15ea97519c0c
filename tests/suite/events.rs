//! Run events end to end (PROTOCOL.md 2.6 and section 5): the real binary's
//! redaction of the agent's output, the spool, the sender against a
//! coordinator that fails, stalls or refuses, and resume after a kill.

use std::time::Duration;

use hosted_boot::wire::{ErrorCode, Event};
use hosted_boot_coordinator::{CoordinatorOptions, Fault, RecordedRequest, Route, RunRecord};
use pretty_assertions::assert_eq;
use serde_json::Value;

use super::support::{
    Runner, Sandbox, WAIT, agent_events, assert_events_clean, assert_no_secret, kill_group, signal,
    wait_for_file,
};

/// The spool of `run_id` under the sandbox's root.
fn spool_path(sb: &Sandbox, run_id: &str) -> std::path::PathBuf {
    sb.root()
        .join(".orizu-run")
        .join(run_id)
        .join("events.ndjson")
}

/// The `text` of each `output` and `stderr` event, in order.
fn texts(run: &RunRecord) -> Vec<String> {
    run.events
        .iter()
        .filter(|e| e.kind == "output" || e.kind == "stderr")
        .filter_map(|e| e.data["text"].as_str().map(str::to_string))
        .collect()
}

fn assert_contiguous(events: &[Event]) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
}

/// The events requests the coordinator received, with the seqs each carried.
fn event_posts(requests: &[RecordedRequest]) -> Vec<(Vec<u64>, Option<u16>)> {
    requests
        .iter()
        .filter(|r| r.route == Route::Events)
        .map(|r| {
            let seqs = r.body["events"]
                .as_array()
                .map(|a| a.iter().filter_map(|e| e["seq"].as_u64()).collect())
                .unwrap_or_default();
            (seqs, r.response_status)
        })
        .collect()
}

/// A kibibyte field (`VmHWM`, `VmRSS`) of `/proc/<pid>/status`.
fn proc_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
}

const KEY: (&str, &str) = ("ACME_API_KEY", "acme-0123456789-abcdefghij");
const OVERLAP_A: (&str, &str) = ("OVERLAP_A", "ovl-abcdef123");
const OVERLAP_B: (&str, &str) = ("OVERLAP_B", "def123-xyz789");
const QUOTED: (&str, &str) = ("QUOTED_KEY", r#"pa"ss\word-42"#);
const SHORT: (&str, &str) = ("SHORT_PIN", "ab12c");

#[tokio::test]
async fn secrets_split_overlapping_escaped_or_at_the_edges_never_leave_the_runner() {
    let sb = Sandbox::start(CoordinatorOptions {
        connectors: [KEY, OVERLAP_A, OVERLAP_B, QUOTED, SHORT]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..CoordinatorOptions::default()
    })
    .await;
    // The very first bytes of stdout are a secret; then a secret split
    // across two, three and N writes with pauses; two overlapping secrets; a
    // JSON event whose string holds a secret with a quote and a backslash
    // (escaped); the short value (not redacted); the very last bytes of
    // stdout, without a newline, are a secret. The agent keeps a copy of
    // the spool as it stands before the turn ends, and exits 3 so that a
    // failure reason is posted too.
    let script = sb.script(
        r#"
printf '%s at start\n' "$ACME_API_KEY"
k=$ACME_API_KEY
printf 'split2: %s' "$(printf %s "$k" | cut -c1-9)"; sleep 0.2; printf '%s end\n' "$(printf %s "$k" | cut -c10-)"
printf 'split3: %s' "$(printf %s "$k" | cut -c1-5)"; sleep 0.1
printf '%s' "$(printf %s "$k" | cut -c6-14)"; sleep 0.1; printf '%s end\n' "$(printf %s "$k" | cut -c15-)"
printf 'splitN: '
i=1
while [ $i -le ${#k} ]; do printf '%s' "$(printf %s "$k" | cut -c$i)"; sleep 0.01; i=$((i+1)); done
printf ' end\n'
echo "overlap: ovl-abcdef123-xyz789 done"
esc=$(printf %s "$QUOTED_KEY" | sed 's/\\/\\\\/g; s/"/\\"/g')
printf '{"type":"message","text":"key=%s","nested":{"k":["%s"]}}\n' "$esc" "$esc"
sleep 0.1
echo "short: $SHORT_PIN" >&2
sleep 0.3
cp "$(dirname "$ORIZU_TASK_FILE")/events.ndjson" "$AGENT_OUT/spool"
printf 'at end %s' "$ACME_API_KEY"
exit 3
"#,
    );
    let child = Runner::spawn(&sb, &script);
    sb.wait_sealed("run-1").await;
    let (status, output) = child.finish().await;
    assert_eq!(status.code(), Some(1), "{output}");

    let run = sb.coordinator.run("run-1").unwrap();
    assert_contiguous(&run.events);
    assert_eq!(
        texts(&run),
        vec![
            "[REDACTED] at start",
            "split2: [REDACTED] end",
            "split3: [REDACTED] end",
            "splitN: [REDACTED] end",
            "overlap: [REDACTED] done",
            "short: ab12c",
            "at end [REDACTED]",
        ]
    );
    let message = run.events.iter().find(|e| e.kind == "message").unwrap();
    assert_eq!(
        message.data,
        serde_json::json!({"type": "message", "text": "key=[REDACTED]", "nested": {"k": ["[REDACTED]"]}})
    );
    assert_eq!(
        run.finish.as_ref().unwrap().error.as_ref().unwrap().code,
        ErrorCode::AgentCrashed
    );

    // No secret, raw or JSON-escaped, anywhere: events, every request body
    // (the reasons of the seal and of turn_failed included), the runner's
    // trace-level log, the spool.
    let escaped = serde_json::to_string(QUOTED.1).unwrap();
    let escaped = escaped.trim_matches('"').to_string();
    let mut secrets = sb.secrets(&[KEY.1, OVERLAP_A.1, OVERLAP_B.1, QUOTED.1]);
    secrets.push(escaped);
    let events = serde_json::to_string(&run.events).unwrap();
    assert_no_secret("events", &events, &secrets);
    let bodies: String = sb
        .coordinator
        .requests()
        .iter()
        .map(|r| r.body.to_string())
        .collect();
    assert!(bodies.contains("the agent exited with status 3"));
    assert_no_secret("request bodies", &bodies, &secrets);
    assert_no_secret("runner output (trace level)", &output, &secrets);
    let spool = sb.read_out("spool");
    assert!(spool.contains("split2: [REDACTED] end"), "{spool}");
    assert_no_secret("spool", &spool, &secrets);
    // Every spooled line is an event as sent.
    for line in spool.lines() {
        let e: Event = serde_json::from_str(line).unwrap();
        assert!(e.seq >= 1);
    }
    // The short value is named once in the log, without its value.
    assert_eq!(
        output
            .lines()
            .filter(|l| l.contains("shorter than 6 bytes") && l.contains(SHORT.0))
            .count(),
        1,
        "{output}"
    );
    // Delivered: the run directory is gone.
    assert!(!sb.root().join(".orizu-run/run-1").exists());
}

#[tokio::test]
async fn a_repo_token_minted_by_the_helper_mid_turn_is_redacted() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // Clear the helper's cache so that `git credential fill` mints a new
    // token in the helper's process, and print what git answers.
    let script = sb.script(
        r#"
url=$(git remote get-url origin)
printf 'url=%s\n\n' "$url" | git credential reject
printf 'url=%s\n\n' "$url" | git credential fill
"#,
    );
    let child = Runner::spawn(&sb, &script);
    let (_, output) = sb.end_after_seal("run-1", child).await;
    let run = sb.coordinator.run("run-1").unwrap();
    let lines = texts(&run);
    assert!(
        lines.iter().any(|l| l == "password=[REDACTED]"),
        "{lines:?}"
    );
    let secrets = sb.secrets(&[]);
    assert_no_secret(
        "events",
        &serde_json::to_string(&run.events).unwrap(),
        &secrets,
    );
    assert_no_secret("runner output", &output, &secrets);
}

#[tokio::test]
async fn events_503_mid_turn_then_recovery_delivers_every_event_once_in_order() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
i=1
while [ $i -le 60 ]; do echo "line $i"; sleep 0.02; i=$((i+1)); done
"#,
    );
    let child = Runner::spawn(&sb, &script);
    sb.wait_text("run-1", "line 5").await;
    sb.coordinator
        .add_fault(Fault::status(Route::Events, 503).times(8))
        .unwrap();
    sb.end_after_seal("run-1", child).await;

    let snap = sb.coordinator.snapshot();
    let run = snap.run("run-1").unwrap();
    assert_contiguous(&run.events);
    let expected: Vec<String> = (1..=60).map(|i| format!("line {i}")).collect();
    assert_eq!(texts(run), expected);
    assert_eq!(run.events[0].kind, "hosted_boot.runner");
    assert!(run.finish.as_ref().unwrap().error.is_none());
    // Every fault was met, and the batch refused was sent again whole: no
    // request skipped an event, none went past the first unaccepted one.
    assert!(snap.faults.is_empty());
    let posts = event_posts(&snap.requests);
    assert_eq!(posts.iter().filter(|p| p.1 == Some(503)).count(), 8);
    let mut accepted = 0;
    for (seqs, status) in &posts {
        assert!(!seqs.is_empty() && seqs.len() <= 500);
        assert_eq!(seqs[0], accepted + 1, "{posts:?}");
        if *status == Some(200) {
            accepted = *seqs.last().unwrap();
        }
    }
    assert_eq!(accepted, run.events.len() as u64);
}

#[tokio::test]
async fn a_413_halves_the_batch_and_everything_arrives() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // Once the first lines are delivered: one line, whose post is answered
    // late, so that the burst of 299 lines after it queues up and goes in
    // the next post, which is refused as too large.
    let script = sb.script(
        r#"
echo start
while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.02; done
echo "line 301"
sleep 0.2
seq 302 600
"#,
    );
    let child = Runner::spawn(&sb, &script);
    sb.wait_text("run-1", "start").await;
    sb.coordinator
        .add_fault(Fault::delay(Route::Events, Duration::from_millis(600)))
        .unwrap();
    sb.coordinator
        .add_fault(Fault::status(Route::Events, 413))
        .unwrap();
    std::fs::write(sb.out().join("go"), "").unwrap();
    sb.end_after_seal("run-1", child).await;
    let snap = sb.coordinator.snapshot();
    let run = snap.run("run-1").unwrap();
    assert_contiguous(&run.events);
    let mut expected = vec!["start".to_string(), "line 301".to_string()];
    expected.extend((302..=600).map(|i| i.to_string()));
    assert_eq!(texts(run), expected);
    let posts = event_posts(&snap.requests);
    let refused = posts
        .iter()
        .position(|p| p.1 == Some(413))
        .unwrap_or_else(|| panic!("no 413 in {posts:?}"));
    let (too_big, next) = (&posts[refused].0, &posts[refused + 1].0);
    assert!(too_big.len() > 1, "{posts:?}");
    assert_eq!(next.len(), too_big.len() / 2, "{posts:?}");
    assert_eq!(next[0], too_big[0]);
    assert!(run.finish.as_ref().unwrap().error.is_none());
}

#[tokio::test]
async fn a_4xx_on_events_stops_sending_and_the_seal_counts_what_was_lost() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator
        .add_fault(Fault::status(Route::Events, 400))
        .unwrap();
    let script = sb.script("echo one; sleep 0.1; echo two; sleep 0.1; echo three");
    let child = Runner::spawn(&sb, &script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let run = snap.run("run-1").unwrap();
    assert_eq!(run.status, "succeeded");
    assert!(run.events.is_empty());
    let posts = event_posts(&sb.coordinator.requests());
    assert_eq!(posts.len(), 1, "{posts:?}");
    let error = run.finish.as_ref().unwrap().error.as_ref().unwrap();
    assert_eq!(error.code, ErrorCode::EventsUndelivered);
    assert!(!error.retryable);
    // The runner's event, the workspace sync's, the three lines and the
    // harvest's event.
    assert!(
        error.message.starts_with("6 events could not be delivered"),
        "{}",
        error.message
    );
    // The spool is kept (the run's events are not delivered).
    let spool = std::fs::read_to_string(spool_path(&sb, "run-1")).unwrap();
    assert_eq!(spool.lines().count(), 6);
}

#[tokio::test]
async fn a_runner_killed_mid_turn_resumes_from_the_cursor_without_loss_or_duplicate() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // First run: five lines, then (once the test says so) fifteen more, then
    // wait to be killed. The restarted runner runs the turn again: the
    // agent says so and ends.
    let script = sb.script(
        r#"
if [ -e "$AGENT_OUT/first" ]; then echo "second run"; exit 0; fi
touch "$AGENT_OUT/first"
record_group > "$AGENT_OUT/pgid"
i=1
while [ $i -le 5 ]; do echo "line $i"; i=$((i+1)); done
while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.02; done
while [ $i -le 20 ]; do echo "line $i"; i=$((i+1)); done
sleep 1000
"#,
    );
    let first = Runner::spawn(&sb, &script);
    sb.wait_text("run-1", "line 5").await;
    // The coordinator stops accepting; lines 6..20 reach only the spool.
    sb.coordinator
        .add_fault(Fault::status(Route::Events, 503).times(1_000_000))
        .unwrap();
    std::fs::write(sb.out().join("go"), "").unwrap();
    let spool = spool_path(&sb, "run-1");
    let deadline = tokio::time::Instant::now() + WAIT;
    while !std::fs::read_to_string(&spool)
        .unwrap_or_default()
        .contains("\"line 20\"")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "line 20 never spooled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    signal(first.pid(), rustix::process::Signal::KILL);
    let (status, _) = first.finish().await;
    assert_eq!(status.code(), None);
    let group = sb.read_group("pgid");
    kill_group(&group);
    let cursor = sb.coordinator.run("run-1").unwrap().accepted_through();
    let spooled = std::fs::read_to_string(&spool).unwrap().lines().count() as u64;
    assert!(
        cursor >= 6 && cursor < spooled,
        "cursor {cursor}, spooled {spooled}"
    );
    sb.coordinator.clear_faults();
    let requests_before = sb.coordinator.requests().len();

    let second = Runner::spawn(&sb, &script);
    sb.end_after_seal("run-1", second).await;

    let run = sb.coordinator.run("run-1").unwrap();
    assert_contiguous(&run.events);
    let mut expected: Vec<String> = (1..=20).map(|i| format!("line {i}")).collect();
    expected.push("second run".into());
    assert_eq!(texts(&run), expected);
    let runner_events: Vec<u64> = run
        .events
        .iter()
        .filter(|e| e.kind == "hosted_boot.runner")
        .map(|e| e.seq)
        .collect();
    assert_eq!(runner_events, vec![1, spooled + 1]);
    // The restarted runner read the cursor and sent only what was missing.
    let after = &sb.coordinator.requests()[requests_before..];
    assert!(after.iter().any(|r| r.route == Route::Cursor));
    let posts = event_posts(after);
    assert_eq!(posts[0].0[0], cursor + 1, "{posts:?}");
    assert!(!sb.root().join(".orizu-run/run-1").exists());
}

#[tokio::test]
async fn fifty_mb_of_output_with_the_coordinator_stalled_keeps_the_runner_small() {
    // What 50 MB of output may add to the runner's peak RSS: memory must not
    // follow the output (main at 7583e1a grew 2.5 MiB here). The absolute
    // bound is a debug build's (its code pages count in VmHWM and grow with
    // the binary: 28 MiB before the output at 7583e1a, 30 MiB after the
    // least-privilege merge); the release figure is a benchmark's.
    const GROWTH_KIB: u64 = 8 * 1024;
    const BOUND_KIB: u64 = 40 * 1024;
    const OUTPUT: u64 = 50 * 1024 * 1024;
    let sb = Sandbox::with_connectors(&[KEY]).await;
    // Every events request hangs (each attempt times out and is retried).
    sb.coordinator
        .add_fault(Fault::delay(Route::Events, Duration::from_secs(120)).times(1_000_000))
        .unwrap();
    let script = sb.script(&format!(
        r#"
touch "$AGENT_OUT/started"
while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.02; done
yes "a line of agent output with a secret $ACME_API_KEY in it, and some more words" | head -c {OUTPUT}
touch "$AGENT_OUT/done"
while [ ! -e "$AGENT_OUT/measured" ]; do sleep 0.02; done
"#
    ));
    let child = Runner::spawn(&sb, &script);
    let pid = child.pid();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut child = child;
    // The runner's footprint before the output (for the record).
    while !sb.out().join("started").exists() {
        if tokio::time::Instant::now() >= deadline || child.exited() {
            panic!("the agent never started: {}", child.kill().await);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = proc_kib(pid, "VmHWM").unwrap();
    let started = std::time::Instant::now();
    std::fs::write(sb.out().join("go"), "").unwrap();
    while !sb.out().join("done").exists() {
        if tokio::time::Instant::now() >= deadline || child.exited() {
            panic!("the agent never finished writing: {}", child.kill().await);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The agent wrote everything into the pipe; wait until the runner has
    // spooled it (the last line is in the file), then read its peak RSS.
    let spool = spool_path(&sb, "run-1");
    let mut last_len = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let len = std::fs::metadata(&spool).map(|m| m.len()).unwrap_or(0);
        if len == last_len && len > OUTPUT {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the spool stopped growing at {len}"
        );
        last_len = len;
    }
    let peak = proc_kib(pid, "VmHWM").unwrap();
    eprintln!(
        "runner peak RSS {before} KiB before the output, {peak} KiB after spooling {OUTPUT} bytes in {:?}",
        started.elapsed()
    );
    std::fs::write(sb.out().join("measured"), "").unwrap();
    assert!(
        peak.saturating_sub(before) < GROWTH_KIB,
        "50 MB of output grew the runner's peak RSS from {before} to {peak} KiB"
    );
    assert!(peak < BOUND_KIB, "runner peak RSS {peak} KiB");

    // The turn ends; the flush deadline passes; the seal says how many events
    // were not delivered; the spool keeps them all.
    let sealed = sb
        .coordinator
        .wait_for(WAIT, |s| s.run("run-1").is_some_and(|r| r.finish.is_some()))
        .await;
    let snap = match sealed {
        Ok(s) => s,
        Err(e) => {
            let output = child.kill().await;
            let ours: Vec<&str> = output
                .lines()
                .filter(|l| l.contains("\"target\":\"hosted_boot"))
                .collect();
            panic!("not sealed: {e:?}\n{}", ours.join("\n"));
        }
    };
    sb.coordinator.clear_faults();
    sb.coordinator.end_session();
    let (status, output) = child.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let error = snap
        .run("run-1")
        .unwrap()
        .finish
        .as_ref()
        .unwrap()
        .error
        .clone()
        .unwrap();
    assert_eq!(error.code, ErrorCode::EventsUndelivered);
    let text = std::fs::read_to_string(&spool).unwrap();
    let lines = text.lines().count();
    assert!(
        error
            .message
            .starts_with(&format!("{lines} events could not be delivered")),
        "{} vs {lines} spooled",
        error.message
    );
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["seq"], lines as u64);
    assert!(text.contains("a secret [REDACTED] in it"));
    assert_no_secret("spool", &text, &sb.secrets(&[KEY.1]));
    assert_no_secret("runner output", &output, &sb.secrets(&[KEY.1]));
}

#[tokio::test]
async fn events_left_undelivered_are_delivered_by_the_next_boot() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // run-1's events are refused (a 4xx stops sending): it is sealed with
    // events_undelivered and its spool stays. The runner is stopped between
    // turns; a new one boots for run-2 and first delivers run-1's spool.
    sb.coordinator
        .add_fault(Fault::status(Route::Events, 400))
        .unwrap();
    let script = sb.script(r#"echo "turn $ORIZU_RUN_ID""#);
    let first = Runner::spawn(&sb, &script);
    sb.coordinator
        .wait_for(WAIT, |s| s.status_names().contains(&"turn_completed"))
        .await
        .unwrap();
    signal(first.pid(), rustix::process::Signal::TERM);
    let (status, output) = first.finish().await;
    assert_eq!(status.code(), Some(143), "{output}");
    let run1 = sb.coordinator.run("run-1").unwrap();
    assert!(run1.events.is_empty());
    let error = run1.finish.as_ref().unwrap().error.clone().unwrap();
    assert_eq!(error.code, ErrorCode::EventsUndelivered);
    let spooled = std::fs::read_to_string(spool_path(&sb, "run-1"))
        .unwrap()
        .lines()
        .count();
    // The runner's event, the workspace sync's, the agent's line and the
    // harvest's event.
    assert_eq!(spooled, 4);

    sb.coordinator.queue_turn("next", None);
    let second = Runner::spawn(&sb, &script);
    sb.end_after_seal("run-2", second).await;
    let snap = sb.coordinator.snapshot();
    let run1 = snap.run("run-1").unwrap();
    assert_contiguous(&run1.events);
    assert_eq!(run1.events.len(), spooled);
    assert_eq!(texts(run1), vec!["turn run-1"]);
    assert_eq!(texts(snap.run("run-2").unwrap()), vec!["turn run-2"]);
    assert!(!sb.root().join(".orizu-run/run-1").exists());
    // Before run-2 started.
    let cursor_at = snap
        .requests
        .iter()
        .position(|r| r.route == Route::Cursor && r.path.contains("run-1"))
        .unwrap();
    let run2_started = snap
        .requests
        .iter()
        .position(|r| r.route == Route::BootStatus && r.body["runId"] == "run-2")
        .unwrap();
    assert!(cursor_at < run2_started);
}

#[tokio::test]
async fn a_line_over_1_mib_is_cut_into_continued_pieces_with_a_secret_on_the_cut() {
    let sb = Sandbox::with_connectors(&[KEY]).await;
    // 2.5 MiB on one line; the secret straddles the first 1 MiB cut.
    let script = sb.script(
        r#"
{ head -c 1048570 /dev/zero | tr '\0' x; printf '%s' "$ACME_API_KEY"; head -c 1572864 /dev/zero | tr '\0' y; echo; echo after; }
"#,
    );
    let child = Runner::spawn(&sb, &script);
    sb.end_after_seal("run-1", child).await;
    let run = sb.coordinator.run("run-1").unwrap();
    let pieces: Vec<(usize, bool)> = run
        .events
        .iter()
        .filter(|e| e.kind == "output")
        .map(|e| {
            (
                e.data["text"].as_str().unwrap().len(),
                e.data["continued"] == true,
            )
        })
        .collect();
    let total = 1048570 + "[REDACTED]".len() + 1572864;
    assert_eq!(
        pieces,
        vec![
            (1 << 20, false),
            (1 << 20, true),
            (total - 2 * (1 << 20), true),
            ("after".len(), false)
        ]
    );
    let joined: String = run
        .events
        .iter()
        .filter(|e| {
            e.data["continued"] == true
                || e.data["text"].as_str().is_some_and(|t| t.starts_with('x'))
        })
        .map(|e| e.data["text"].as_str().unwrap())
        .collect();
    assert!(joined.contains("x[REDACTED]y"));
    assert_no_secret(
        "events",
        &serde_json::to_string(&run.events).unwrap(),
        &sb.secrets(&[KEY.1]),
    );
}

#[tokio::test]
async fn agent_event_types_are_redacted_and_cannot_claim_the_runners_namespace() {
    let sb = Sandbox::with_connectors(&[KEY]).await;
    // The connector value spelled with JSON escapes (`\u0061…`), which the
    // byte stream does not show and a JSON parse decodes: as the whole
    // type, inside one, after the reserved prefix; then the reserved prefix
    // plain and itself escaped; then the value raw.
    let script = sb.script(
        r#"
esc=$(printf %s "$ACME_API_KEY" | od -An -v -tx1 | tr -d ' \n' | sed 's/../\\u00&/g')
printf '{"type":"%s"}\n' "$esc"
printf '{"type":"tool-%s-call","k":"%s"}\n' "$esc" "$esc"
printf '{"type":"hosted_boot.harvest","forged":true}\n'
printf '{"type":"hosted_boot.%s","forged":true}\n' "$esc"
printf '{"type":"\\u0068osted_boot.runner","forged":true}\n'
printf '{"type":"%s"}\n' "$ACME_API_KEY"
"#,
    );
    let child = Runner::spawn(&sb, &script);
    sb.end_after_seal("run-1", child).await;
    let run = sb.coordinator.run("run-1").unwrap();
    assert_contiguous(&run.events);
    assert_events_clean(
        &run.events,
        &sb.secrets(&[KEY.1]),
        &[
            "hosted_boot.runner",
            "hosted_boot.workspace_sync",
            "hosted_boot.harvest",
        ],
    );
    let json = |s: &str| serde_json::from_str::<Value>(s).unwrap();
    assert_eq!(
        agent_events(&run.events),
        vec![
            ("[REDACTED]".into(), json(r#"{"type":"[REDACTED]"}"#)),
            (
                "tool-[REDACTED]-call".into(),
                json(r#"{"type":"tool-[REDACTED]-call","k":"[REDACTED]"}"#)
            ),
            (
                "output".into(),
                json(r#"{"type":"hosted_boot.harvest","forged":true}"#)
            ),
            (
                "output".into(),
                json(r#"{"type":"hosted_boot.[REDACTED]","forged":true}"#)
            ),
            (
                "output".into(),
                json(r#"{"type":"hosted_boot.runner","forged":true}"#)
            ),
            ("[REDACTED]".into(), json(r#"{"type":"[REDACTED]"}"#)),
        ]
    );
}

/// The events of `run_id` still in its spool, as lines.
fn spooled_lines(sb: &Sandbox, run_id: &str) -> Vec<String> {
    std::fs::read_to_string(spool_path(sb, run_id))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Boots a second runner on the sandbox's root with the events route
/// healthy again and a session with nothing to run: it delivers `run_id`'s
/// leftover spool (every spooled event, in order, once) and only then
/// removes the run directory.
async fn a_later_boot_delivers(
    sb: &Sandbox,
    script: &std::path::Path,
    run_id: &str,
    spooled: usize,
) {
    sb.coordinator.clear_faults();
    let run_dir = sb.root().join(".orizu-run").join(run_id);
    let second = Runner::spawn(sb, script);
    sb.coordinator
        .wait_for(WAIT, |s| s.status_names().last() == Some(&"ready"))
        .await
        .unwrap();
    sb.coordinator.end_session();
    let (status, output) = second.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let run = sb.coordinator.run(run_id).unwrap();
    assert_contiguous(&run.events);
    assert_eq!(run.events.len(), spooled, "{output}");
    assert_eq!(texts(&run), vec![format!("turn {run_id}")]);
    assert!(
        !run_dir.exists(),
        "the run directory outlived the delivery of its events"
    );
}

#[tokio::test]
async fn a_failed_turns_undelivered_events_stay_until_a_later_boot_delivers_them() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator
        .add_fault(Fault::status(Route::Events, 503).times(1_000_000))
        .unwrap();
    let script = sb.script(
        r#"echo "turn $ORIZU_RUN_ID"
[ -e "$AGENT_OUT/failed-once" ] && exit 0
touch "$AGENT_OUT/failed-once"
exit 1"#,
    );
    let (status, output) = Runner::spawn(&sb, &script).finish().await;
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    let run1 = snap.run("run-1").unwrap();
    assert_eq!(run1.status, "failed");
    assert!(run1.events.is_empty());
    let error = run1.finish.as_ref().unwrap().error.clone().unwrap();
    assert_eq!(error.code, ErrorCode::AgentCrashed);
    assert!(
        error.message.contains("remain in the sandbox's run spool"),
        "{}",
        error.message
    );
    assert_eq!(
        snap.status_names(),
        vec!["turn_started", "turn_completed", "turn_failed"]
    );
    // What finish said remains in the spool does remain.
    let spooled = spooled_lines(&sb, "run-1");
    assert!(
        spooled.iter().any(|l| l.contains("\"turn run-1\"")),
        "the failed turn's spool is gone: {spooled:?}\n{output}"
    );
    assert!(!sb.session_dir().exists());

    a_later_boot_delivers(&sb, &script, "run-1", spooled.len()).await;
}

#[tokio::test]
async fn an_interrupted_turns_undelivered_events_stay_when_the_boot_then_fails() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    sb.coordinator
        .add_fault(Fault::status(Route::Events, 503).times(1_000_000))
        .unwrap();
    let script = sb.script(
        r#"echo "turn $ORIZU_RUN_ID"
[ -e "$AGENT_OUT/started" ] && exit 0
touch "$AGENT_OUT/started"
sleep 1000 &
wait"#,
    );
    let first = Runner::spawn(&sb, &script);
    wait_for_file(&sb.out().join("started")).await;
    sb.coordinator.interrupt(Some("run-1")).unwrap();
    let snap = sb
        .coordinator
        .wait_for(WAIT, |s| s.status_names().contains(&"turn_completed"))
        .await
        .unwrap();
    let run1 = snap.run("run-1").unwrap();
    assert_eq!(run1.status, "interrupted");
    let error = run1.finish.as_ref().unwrap().error.clone().unwrap();
    assert_eq!(error.code, ErrorCode::EventsUndelivered);
    // Between turns the boot secret stops being valid: a fatal error
    // reported for the last run, run-1.
    sb.coordinator
        .add_fault(Fault::status(Route::Session, 401).times(1_000_000))
        .unwrap();
    sb.coordinator
        .add_fault(Fault::status(Route::AgentToken, 401).times(1_000_000))
        .unwrap();
    let (status, output) = first.finish().await;
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(
        snap.status_names(),
        vec!["turn_started", "turn_completed", "turn_failed"]
    );
    assert!(snap.run("run-1").unwrap().events.is_empty());
    let spooled = spooled_lines(&sb, "run-1");
    assert!(
        spooled.iter().any(|l| l.contains("\"turn run-1\"")),
        "the interrupted turn's spool is gone: {spooled:?}\n{output}"
    );

    a_later_boot_delivers(&sb, &script, "run-1", spooled.len()).await;
}

// ---------------------------------------------------------------------------
// Breaks found by review (an attacker controlling the agent's output). These
// tests fail on purpose against the current code; see each comment.

/// The connector value spelled with `\u00XX` JSON escapes for every byte
/// (shell snippet; sets `esc`).
const ESCAPE_KEY: &str =
    r#"esc=$(printf %s "$ACME_API_KEY" | od -An -v -tx1 | tr -d ' \n' | sed 's/../\\u00&/g')"#;

/// Break: what an adapter decodes from the agent's JSON and sends outside
/// the events (`finish.agentSessionId`, `finish.usage.model`) is never
/// redacted by value. A Claude-style CLI names its session (and model) with
/// the connector value spelled with JSON escapes: the byte stream shows no
/// secret, the parse decodes it, and the decoded value goes to the
/// coordinator's finish as is (PROTOCOL.md 5: "What the runner decodes from
/// the agent's JSON ... is redacted again after decoding"). The
/// `hosted_boot.agent_session` event is redacted (the spool redacts runner
/// events), the finish body is not (only `error.message` is).
#[tokio::test]
async fn a_session_id_or_model_decoded_from_the_agents_json_never_reaches_the_finish() {
    let sb = Sandbox::with_connectors(&[KEY]).await;
    let script = sb.script(&format!(
        r#"
if [ "${{1:-}}" = "--version" ]; then echo "2.1.240 (Claude Code)"; exit 0; fi
{ESCAPE_KEY}
read -r init
read -r user
printf '{{"type":"system","subtype":"init","session_id":"%s","model":"%s"}}\n' "$esc" "$esc"
printf '{{"type":"result","subtype":"success","is_error":false,"result":"done","usage":{{"input_tokens":1,"output_tokens":1}}}}\n'
cat >/dev/null
"#
    ));
    let mut cmd = sb.runner(&script);
    cmd.env("HOSTED_BOOT_AGENT", "claude");
    let child = cmd.spawn().unwrap();
    let (_, output) = sb.end_after_seal("run-1", child).await;
    let run = sb.coordinator.run("run-1").unwrap();
    assert_eq!(run.status, "succeeded", "{output}");
    let secrets = sb.secrets(&[KEY.1]);
    assert_events_clean(
        &run.events,
        &secrets,
        &[
            "hosted_boot.runner",
            "hosted_boot.workspace_sync",
            "hosted_boot.agent_session",
            "hosted_boot.harvest",
        ],
    );
    assert_no_secret("logs", &output, &secrets);
    let finish = serde_json::to_value(&run.finish).unwrap();
    for field in ["agentSessionId", "usage"] {
        assert_no_secret(
            &format!("finish.{field}"),
            &finish[field].to_string(),
            &secrets,
        );
    }
    assert_no_secret("the finish body", &finish.to_string(), &secrets);
    assert_no_secret(
        "the coordinator's state",
        &sb.coordinator.state_json().to_string(),
        &secrets,
    );
}

/// Break: PROTOCOL.md 5 promises "the value's JSON-escaped form" is
/// redacted, but only the forms serde_json / JavaScript / Python write are
/// matched. `\/` (PHP's `json_encode`, Ruby's and Java's with some options)
/// and `\u0026` / `\u003c` / `\u003e` (Go's `encoding/json`, which escapes
/// `&<>` by default) are as much the JSON-escaped form of a value and pass
/// the byte stream untouched, so a tool the agent runs that prints a value
/// with `/` or `&` (an AWS secret key, a password) in JSON leaks it to the
/// `stderr` and `output` events (the runner does not decode their text).
#[tokio::test]
async fn json_escaped_forms_that_other_serializers_write_are_redacted() {
    const SLASHY: (&str, &str) = ("AWS_SECRET", "wJalrXUtnFEMI/K7MDENG&bPxRfiCYKEY");
    let sb = Sandbox::with_connectors(&[SLASHY]).await;
    // What `php -r 'echo json_encode(getenv("AWS_SECRET"));'` and Go's
    // json.Marshal print.
    let script = sb.script(
        r#"
php=$(printf %s "$AWS_SECRET" | sed 's,/,\\/,g')
go=$(printf %s "$AWS_SECRET" | sed 's,&,\\u0026,g')
printf '"%s"\n' "$php" >&2
printf 'secret: "%s"\n' "$go"
"#,
    );
    let child = Runner::spawn(&sb, &script);
    sb.end_after_seal("run-1", child).await;
    let run = sb.coordinator.run("run-1").unwrap();
    let stored = serde_json::to_string(&run.events).unwrap();
    let php = SLASHY.1.replace('/', "\\/");
    let go = SLASHY.1.replace('&', "\\u0026");
    for (what, form) in [("PHP's \\/", &php), ("Go's \\u0026", &go)] {
        // In the stored JSON the text's backslash is itself escaped.
        let in_json = form.replace('\\', "\\\\");
        assert!(
            !stored.contains(&in_json),
            "the events hold the value in {what} form: {}",
            run.events
                .iter()
                .filter(|e| !e.kind.starts_with(super::support::RUNNER_PREFIX))
                .map(|e| format!("{} {}", e.kind, e.data))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    let texts: Vec<String> = texts(&run);
    assert!(texts.iter().any(|t| t.contains("[REDACTED]")), "{texts:?}");
}

/// Break (the residual named in review): a stdout line that is a JSON
/// object without a string `type` (or an array, or a bare string) is sent
/// as `output` text as printed, so the connector value spelled with JSON
/// escapes is stored and anyone who parses that text, as the suite's own
/// `assert_events_clean` does ("not even once an `output` text that is JSON
/// is decoded"), gets the value. The same line with a `type` is redacted by
/// value; the missing `type` should not change what a consumer can read.
#[tokio::test]
async fn an_untyped_json_line_spelling_a_secret_with_escapes_is_clean_once_decoded() {
    let sb = Sandbox::with_connectors(&[KEY]).await;
    let script = sb.script(&format!(
        r#"
{ESCAPE_KEY}
printf '{{"tool":"env","value":"%s"}}\n' "$esc"
printf '["%s"]\n' "$esc"
"#
    ));
    let child = Runner::spawn(&sb, &script);
    sb.end_after_seal("run-1", child).await;
    let run = sb.coordinator.run("run-1").unwrap();
    assert_events_clean(
        &run.events,
        &sb.secrets(&[KEY.1]),
        &[
            "hosted_boot.runner",
            "hosted_boot.workspace_sync",
            "hosted_boot.harvest",
        ],
    );
}

/// Break: a typed JSON line over 1 MiB is never parsed (its pieces are
/// `output` text, `continued` on the later ones), so the by-value redaction
/// of 4.6 does not run on it: the connector value spelled with escapes is
/// stored, and a consumer that joins the `continued` pieces (what the flag
/// is for) and parses the line reads it. Under 1 MiB the same line is an
/// event with the value `[REDACTED]`.
#[tokio::test]
async fn a_typed_line_over_1_mib_is_redacted_by_value_like_a_short_one() {
    let sb = Sandbox::with_connectors(&[KEY]).await;
    let script = sb.script(&format!(
        r#"
{ESCAPE_KEY}
{{ printf '{{"type":"tool_result","k":"%s","pad":"' "$esc"; head -c 1200000 /dev/zero | tr '\0' x; printf '"}}\n'; }}
"#
    ));
    let child = Runner::spawn(&sb, &script);
    sb.end_after_seal("run-1", child).await;
    let run = sb.coordinator.run("run-1").unwrap();
    let joined: String = run
        .events
        .iter()
        .filter(|e| e.kind == "output")
        .map(|e| e.data["text"].as_str().unwrap())
        .collect();
    let line: Value = serde_json::from_str(&joined).expect("the pieces join into the line");
    assert_no_secret(
        "the over-long line, its pieces joined and decoded",
        &line.to_string(),
        &sb.secrets(&[KEY.1]),
    );
}

/// Break: the runner's namespace is refused "ignoring ASCII case, so that a
/// consumer that folds case cannot be fooled either" (src/turn/event.rs),
/// but a consumer folding case the Unicode way (JavaScript's
/// `toUpperCase`, Python's `upper`/`casefold`, Rust's `to_uppercase`) maps
/// `ſ` (U+017F LATIN SMALL LETTER LONG S) to `S`: `hoſted_boot.harvest`
/// passes the check and folds to `HOSTED_BOOT.HARVEST`, a forged runner
/// event for such a consumer.
#[tokio::test]
async fn a_type_that_unicode_case_folds_into_the_runners_namespace_is_refused() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
printf '{"type":"ho\305\277ted_boot.harvest","forged":true}\n'
printf '{"type":"HO\305\277TED_BOOT.runner","forged":true}\n'
"#,
    );
    let child = Runner::spawn(&sb, &script);
    sb.end_after_seal("run-1", child).await;
    let run = sb.coordinator.run("run-1").unwrap();
    let forged: Vec<&str> = run
        .events
        .iter()
        .filter(|e| e.data.get("forged").is_some())
        .map(|e| e.kind.as_str())
        .filter(|k| k.to_uppercase().starts_with("HOSTED_BOOT."))
        .collect();
    assert!(
        forged.is_empty(),
        "agent types that a Unicode case fold puts in the runner's namespace: {forged:?}"
    );
}

/// Break (a form PROTOCOL.md 5 does not list): a value percent-encoded in a
/// URL, as git, curl and every HTTP client write a password with `/`, `+`,
/// `@` or `&` in the user info or a query, passes the byte redaction: a
/// tool that prints its URL (`git remote -v`, `curl -v`, an error message)
/// leaks the value to the events.
#[tokio::test]
async fn a_value_percent_encoded_in_a_url_is_redacted() {
    const SLASHY: (&str, &str) = ("AWS_SECRET", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYKEY");
    let sb = Sandbox::with_connectors(&[SLASHY]).await;
    let script = sb.script(
        r#"
enc=$(printf %s "$AWS_SECRET" | sed 's,/,%2F,g; s,+,%2B,g')
printf 'fatal: unable to access https://bot:%s@example.com/repo.git/\n' "$enc" >&2
"#,
    );
    let child = Runner::spawn(&sb, &script);
    sb.end_after_seal("run-1", child).await;
    let run = sb.coordinator.run("run-1").unwrap();
    let encoded = SLASHY.1.replace('/', "%2F").replace('+', "%2B");
    let stored = serde_json::to_string(&run.events).unwrap();
    assert!(
        !stored.contains(&encoded),
        "the events hold the value percent-encoded: {:?}",
        texts(&run)
    );
}
