//! Time (issue 15, RELIABILITY.md row "Time"; PROTOCOL.md 2.1 "Clocks"): a
//! sandbox paused and restored, whose wall clock jumps ahead while its
//! monotonic clock stood still, refreshes its bearer before the next use of
//! the old one; an `expiresAt` in the past or years ahead and a coordinator
//! whose `Date` is far from the local clock never fail the boot.
//!
//! The pause is made with libfaketime (Debian's `libfaketime`; `.ci/run`
//! installs it) for the runner's process only: its wall clock moves ahead by
//! what the test writes to the timestamp file, its monotonic clock
//! (`FAKETIME_DONT_FAKE_MONOTONIC`) does not.

use std::path::{Path, PathBuf};

use hosted_boot::wire::RunOutcome;
use hosted_boot_coordinator::{CoordinatorOptions, Route, Snapshot, Target};

use super::reliability_log::record;
use super::support::{Runner, Sandbox, WAIT};

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The runner under libfaketime, its wall clock offset by what
/// `timestamp_file` holds (re-read at every call), or `None` (with the
/// reason printed) where libfaketime is not installed.
fn faked_runner(sb: &Sandbox, script: &Path, timestamp_file: &Path) -> Option<Runner> {
    if let Err(reason) = hosted_boot_test_support::program(LIBFAKETIME, "libfaketime") {
        hosted_boot_test_support::skip(reason);
        return None;
    }
    std::fs::write(timestamp_file, "+0s\n").unwrap();
    let mut cmd = sb.runner(script);
    cmd.env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME_TIMESTAMP_FILE", timestamp_file)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    Some(Runner::reading(cmd.spawn().unwrap()))
}

/// Moves the runner's wall clock ahead by `offset` (libfaketime syntax,
/// e.g. `+3h`): the restore after a pause its monotonic clock did not count.
fn jump(timestamp_file: &Path, offset: &str) {
    let tmp = timestamp_file.with_extension("new");
    std::fs::write(&tmp, format!("{offset}\n")).unwrap();
    std::fs::rename(&tmp, timestamp_file).unwrap();
}

fn pulls_after(s: &Snapshot, at_ms: u64) -> Vec<u64> {
    s.requests
        .iter()
        .filter(|r| r.route == Route::AgentToken && r.at_ms >= at_ms)
        .map(|r| r.at_ms)
        .collect()
}

/// Bearer-route answers `401` at or after `at_ms`: each one a use of a
/// bearer the runner should have known was stale.
fn refused_after(s: &Snapshot, at_ms: u64) -> usize {
    s.requests
        .iter()
        .filter(|r| {
            r.at_ms >= at_ms
                && r.response_status == Some(401)
                && !matches!(
                    r.route,
                    Target::Route(Route::AgentToken)
                        | Target::Route(Route::BootStatus)
                        | Target::Git
                        | Target::Dev
                )
        })
        .count()
}

/// The pause: the wall clock jumps 3 h, the coordinator expires every bearer
/// issued before it once the runner pulled a fresh one. The runner must
/// notice at its next use of the bearer (a pull after the jump) and never
/// use an old one again (no `401`).
async fn paused_and_restored(during_turn: bool) {
    let test = if during_turn {
        "suite::clocks::a_pause_during_a_turn_refreshes_the_bearer_before_its_next_use"
    } else {
        "suite::clocks::a_pause_between_turns_refreshes_the_bearer_before_its_next_use"
    };
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let stamp: PathBuf = sb.dir.path().join("faketime");
    // Turn 1 waits for `go-1` (the pause happens while it runs, when
    // `during_turn`); turn 2 runs at once.
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  touch "$AGENT_OUT/running-1"
  while [ ! -e "$AGENT_OUT/go-1" ]; do sleep 0.02; done
fi
echo "{\"type\":\"message\",\"text\":\"done $ORIZU_RUN_ID\"}"
"#,
    );
    let Some(runner) = faked_runner(&sb, &script, &stamp) else {
        return;
    };
    let running = sb.out().join("running-1");
    if during_turn {
        super::support::wait_for_file(&running).await;
    } else {
        std::fs::write(sb.out().join("go-1"), "").unwrap();
        sb.wait_sealed("run-1").await;
        // The runner is between turns: wait for an idle session read.
        let sealed_at = sb.coordinator.elapsed_ms();
        sb.coordinator
            .wait_for(WAIT, |s| {
                s.requests
                    .iter()
                    .any(|r| r.route == Route::Session && r.at_ms > sealed_at)
            })
            .await
            .unwrap();
    }

    let old = sb.coordinator.issued_bearers();
    let jumped_at = sb.coordinator.elapsed_ms();
    let jumps = ["+3h"];
    for offset in jumps {
        jump(&stamp, offset);
    }
    let noticed = sb
        .coordinator
        .wait_for(WAIT, |s| !pulls_after(s, jumped_at).is_empty())
        .await;
    if noticed.is_err() {
        panic!(
            "no bearer pull after the wall clock jumped 3 h\n{}",
            runner.kill().await
        );
    }
    // The pause outlasted the old bearers: the coordinator no longer takes them.
    sb.coordinator.expire_bearers(&old);
    let expired_at = sb.coordinator.elapsed_ms();
    if during_turn {
        std::fs::write(sb.out().join("go-1"), "").unwrap();
    }
    let run1 = sb.wait_sealed("run-1").await;
    sb.coordinator.queue_turn("second turn", None);
    let (snap, output) = sb.end_after_seal("run-2", runner).await;

    for (run, seal) in [("run-1", &run1), ("run-2", &snap)] {
        let r = seal.run(run).unwrap();
        assert_eq!(
            r.finish.as_ref().unwrap().status,
            RunOutcome::Succeeded,
            "{run}\n{output}"
        );
        assert!(
            r.events
                .iter()
                .any(|e| e.data["text"] == format!("done {run}")),
            "{run}: its event is missing\n{output}"
        );
    }
    let stale = refused_after(&snap, expired_at);
    assert_eq!(stale, 0, "an old bearer was used after the pause\n{output}");
    assert!(
        output.contains("the wall clock ran ahead of the monotonic clock"),
        "{output}"
    );
    let pulls = pulls_after(&snap, jumped_at).len();
    // One refresh for the pause, not one per use: the fresh bearer's own
    // clocks agree (the turns may pull for their own reasons, a few).
    assert!(pulls <= 4, "{pulls} pulls after one jump\n{output}");
    record(
        if during_turn {
            "time: a pause and restore during a turn"
        } else {
            "time: a pause and restore between turns"
        },
        "the bearer is refreshed before its next use; the old one is never used again",
        test,
        &[
            ("faults_injected", jumps.len() as u64),
            ("bearer_pulls_after_jump", pulls as u64),
            ("stale_bearer_uses", stale as u64),
            (
                "events_lost",
                [("run-1", &run1), ("run-2", &snap)]
                    .iter()
                    .filter(|(run, s)| {
                        !s.run(run)
                            .unwrap()
                            .events
                            .iter()
                            .any(|e| e.data["text"] == format!("done {run}"))
                    })
                    .count() as u64,
            ),
        ],
    );
}

#[tokio::test]
async fn a_pause_between_turns_refreshes_the_bearer_before_its_next_use() {
    paused_and_restored(false).await;
}

#[tokio::test]
async fn a_pause_during_a_turn_refreshes_the_bearer_before_its_next_use() {
    paused_and_restored(true).await;
}

/// Boots with `opts`, runs the initial turn, then idles for `ticks` session
/// reads; returns the snapshot, the output and the agent-token pulls made
/// while idle.
async fn boot_idle(opts: CoordinatorOptions, ticks: usize) -> (Snapshot, String, usize) {
    let sb = Sandbox::start(opts).await;
    let runner = Runner::spawn(
        &sb,
        &sb.script(r#"echo '{"type":"message","text":"hello"}'"#),
    );
    sb.wait_sealed("run-1").await;
    let sealed_at = sb.coordinator.elapsed_ms();
    sb.coordinator
        .wait_for(WAIT, |s| {
            s.requests
                .iter()
                .filter(|r| r.route == Route::Session && r.at_ms > sealed_at)
                .count()
                >= ticks
        })
        .await
        .unwrap();
    let idle = pulls_after(&sb.coordinator.snapshot(), sealed_at).len();
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let snap = sb.coordinator.snapshot();
    let run = snap.run("run-1").unwrap();
    assert_eq!(
        run.finish.as_ref().unwrap().status,
        RunOutcome::Succeeded,
        "{output}"
    );
    (snap, output, idle)
}

/// `expiresAt` an hour in the past, and ten years ahead: the lifetime is
/// invalid, which means "refresh at the earliest", never a failed boot.
#[tokio::test]
async fn an_expires_at_in_the_past_or_years_ahead_refreshes_early_and_never_fails() {
    for (name, expires_in_s) in [("past", -3600_i64), ("years ahead", 10 * 365 * 24 * 3600)] {
        let (_, output, idle_pulls) = boot_idle(
            CoordinatorOptions {
                bearer_expires_in_s: Some(expires_in_s),
                ..CoordinatorOptions::default()
            },
            8,
        )
        .await;
        // Refreshed before the idle reads (the lifetime counts as over).
        assert!(idle_pulls >= 1, "{name}: no refresh while idle\n{output}");
        record(
            &format!("time: expiresAt {name}"),
            "the lifetime is invalid: refresh at the earliest, the boot and the turn go on",
            "suite::clocks::an_expires_at_in_the_past_or_years_ahead_refreshes_early_and_never_fails",
            &[
                ("inputs_tried", 1),
                ("idle_bearer_pulls", idle_pulls as u64),
            ],
        );
    }
}

/// The coordinator's clock a year ahead of the sandbox's, and a year behind:
/// the lifetime comes from `expiresAt` minus its `Date`, so the one-hour
/// bearer is not refreshed at every idle read as an invalid one would be.
#[tokio::test]
async fn a_coordinator_date_far_from_the_local_clock_keeps_the_bearer_lifetime() {
    let year = 365 * 24 * 3600_i64;
    for (name, offset) in [("a year ahead", year), ("a year behind", -year)] {
        let (_, output, idle_pulls) = boot_idle(
            CoordinatorOptions {
                clock_offset_s: offset,
                ..CoordinatorOptions::default()
            },
            8,
        )
        .await;
        assert_eq!(
            idle_pulls, 0,
            "{name}: the bearer was refreshed while idle\n{output}"
        );
        record(
            &format!("time: coordinator Date {name}"),
            "the bearer's lifetime is expiresAt minus Date: no early refresh",
            "suite::clocks::a_coordinator_date_far_from_the_local_clock_keeps_the_bearer_lifetime",
            &[
                ("inputs_tried", 1),
                ("idle_bearer_pulls", idle_pulls as u64),
            ],
        );
    }
}
