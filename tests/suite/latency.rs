//! The boot's critical path and the gap between turns (issue 16), held by
//! the order and count of the requests in the coordinator's record, never by
//! a measured duration (those are `bench/boot-latency`'s): what is asked
//! before the first `turn_started`, what goes out together, and what comes
//! between a `turn_completed` and the next queued turn's `turn_started`.

use std::time::Duration;

use hosted_boot_coordinator::{CoordinatorOptions, RecordedRequest, Route, Snapshot, Target};
use pretty_assertions::assert_eq;

use super::support::Sandbox;

/// A route name for the record, with the boot status it posts.
fn name(r: &RecordedRequest) -> String {
    match r.route {
        Target::Route(Route::BootStatus) => {
            format!("status:{}", r.body["status"].as_str().unwrap_or("?"))
        }
        other => other.name().to_string(),
    }
}

/// Index in the record of the boot status `status` posted for `run_id`.
fn status_at(snap: &Snapshot, status: &str, run_id: &str) -> usize {
    snap.requests
        .iter()
        .position(|r| {
            r.route == Route::BootStatus && r.body["status"] == status && r.body["runId"] == run_id
        })
        .unwrap_or_else(|| panic!("no {status} for {run_id}: {:?}", names(&snap.requests)))
}

fn names(requests: &[RecordedRequest]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| r.route != Target::Dev)
        .map(name)
        .collect()
}

/// With every route answered after L, the boot asks each thing once before
/// the first `turn_started` (one bearer pull, one repo-token mint: the clone
/// uses the boot's read token, PROTOCOL.md 2.5 and 3), and the three reads
/// of step 3 are all out before the first of them is answered (concurrent).
#[tokio::test]
async fn before_the_first_turn_each_thing_is_asked_once_and_step_3_goes_out_together() {
    let sb = Sandbox::start(CoordinatorOptions {
        latency: Duration::from_millis(50),
        ..CoordinatorOptions::default()
    })
    .await;
    let child = sb.spawn(&sb.script("echo '{\"type\":\"message\",\"text\":\"hi\"}'"));
    let (snap, _output) = sb.end_after_seal("run-1", child).await;
    let started = status_at(&snap, "turn_started", "run-1");
    let before: Vec<&RecordedRequest> = snap.requests[..started]
        .iter()
        .filter(|r| r.route != Target::Dev)
        .collect();
    let mut api: Vec<String> = before
        .iter()
        .filter(|r| r.route != Target::Git)
        .map(|r| name(r))
        .collect();
    api.sort();
    assert_eq!(
        api,
        ["agent-token", "env-bundle", "repo-token", "session"],
        "{:?}",
        names(&snap.requests)
    );
    let mint = before.iter().find(|r| r.route == Route::RepoToken).unwrap();
    assert_eq!(mint.body["access"], "read");
    // Step 3: each of the three arrived before any of them was answered.
    let step3: Vec<&&RecordedRequest> = before
        .iter()
        .filter(|r| {
            matches!(
                r.route,
                Target::Route(Route::EnvBundle)
                    | Target::Route(Route::Session)
                    | Target::Route(Route::RepoToken)
            )
        })
        .collect();
    let last_arrival = step3.iter().map(|r| r.at_ms).max().unwrap();
    let first_answer = step3
        .iter()
        .map(|r| r.answered_at_ms.unwrap())
        .min()
        .unwrap();
    assert!(
        last_arrival < first_answer,
        "step 3 went out one at a time: {step3:?}"
    );
    // The clone comes after them and before the turn.
    let git: Vec<&&RecordedRequest> = before.iter().filter(|r| r.route == Target::Git).collect();
    assert!(!git.is_empty(), "{:?}", names(&snap.requests));
}

/// A turn queued while the last one ran starts as soon as `turn_completed`
/// is answered: the session is read at once after a turn, not after the
/// idle poll (PROTOCOL.md 4.2). With the contract's 5 s poll (time scale
/// 1), nothing but that one read comes between `turn_completed` of run-1
/// and `turn_started` of run-2, and it arrives before a poll could have
/// passed.
#[tokio::test]
async fn a_turn_queued_during_a_turn_starts_right_after_turn_completed() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  echo '{"type":"message","text":"first"}'
  while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.02; done
fi
echo "{\"type\":\"message\",\"text\":\"done $ORIZU_RUN_ID\"}"
"#,
    );
    let mut cmd = sb.runner(&script);
    // The contract's durations: a 5 s idle poll.
    cmd.env("HOSTED_BOOT_TEST_TIME_SCALE", "1");
    let child = cmd.spawn().unwrap();
    sb.wait_text("run-1", "first").await;
    let queued = sb.coordinator.queue_turn("the follow-up", None);
    assert_eq!(queued, "run-2");
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (snap, output) = sb.end_after_seal("run-2", child).await;
    let completed = status_at(&snap, "turn_completed", "run-1");
    let started = status_at(&snap, "turn_started", "run-2");
    let between = names(&snap.requests[completed + 1..started]);
    assert_eq!(between, ["session"], "{output}");
    let answered = snap.requests[completed].answered_at_ms.unwrap();
    let next = snap.requests[started].at_ms;
    // The idle poll would have put at least 5 s here.
    assert!(
        next - answered < 5000,
        "run-2 started {} ms after turn_completed",
        next - answered
    );
}
