//! Leaving the sandbox (PROTOCOL.md 4.2, "Leaving the sandbox"): the idle
//! release (`--release-idle-after`, only with the coordinator's
//! `acceptsReleased`) and the retirement (`--max-lifetime`,
//! `--retire-at`), the real binary against the reference coordinator. The
//! bounds are the flags' own (not scaled): a test asserts only that
//! nothing happens before one, which a loaded machine cannot break.

use std::time::{Duration, Instant};

use hosted_boot_coordinator::CoordinatorOptions;
use pretty_assertions::assert_eq;

use super::support::{Sandbox, finish};

/// A quick agent: one event, exit 0.
const QUICK: &str = r#"echo '{"type":"message","text":"done"}'"#;

fn released_reason(sb: &Sandbox) -> Option<String> {
    sb.coordinator
        .snapshot()
        .statuses
        .iter()
        .find(|s| s.status.as_str() == "released")
        .map(|s| s.reason.clone().unwrap_or_default())
}

/// After `--release-idle-after` with no turn, and not before: `released`
/// (reason `idle`), exit 0, the session's files removed.
#[tokio::test]
async fn an_idle_session_is_released_after_the_bound_and_not_before() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let mut cmd = sb.runner(&sb.script(QUICK));
    cmd.args(["--release-idle-after", "2s"]);
    let child = cmd.spawn().unwrap();
    sb.wait_sealed("run-1").await;
    let sealed = Instant::now();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(released_reason(&sb), None, "released before the bound");
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(sealed.elapsed() >= Duration::from_secs(2));
    assert_eq!(released_reason(&sb).as_deref(), Some("idle"));
    let names = sb.coordinator.snapshot().status_names();
    assert_eq!(names, ["turn_started", "turn_completed", "released"]);
    assert!(output.contains("released the session (idle)"), "{output}");
    assert!(!sb.session_dir().exists());
}

/// A turn queued before the bound runs, and the bound starts again after
/// it: no turn is stranded by a release.
#[tokio::test]
async fn a_turn_queued_before_the_bound_runs_and_the_bound_starts_again() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let mut cmd = sb.runner(&sb.script(QUICK));
    cmd.args(["--release-idle-after", "2s"]);
    let child = cmd.spawn().unwrap();
    sb.wait_sealed("run-1").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(sb.coordinator.queue_turn("again", None), "run-2");
    sb.wait_sealed("run-2").await;
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-2").unwrap().status, "succeeded");
    assert_eq!(
        snap.status_names(),
        [
            "turn_started",
            "turn_completed",
            "turn_started",
            "turn_completed",
            "released"
        ]
    );
}

/// Without the coordinator's `acceptsReleased` the idle bound is ignored,
/// said once: the runner waits for turns as before.
#[tokio::test]
async fn without_accepts_released_the_idle_bound_is_ignored() {
    let sb = Sandbox::start(CoordinatorOptions {
        accepts_released: false,
        ..CoordinatorOptions::default()
    })
    .await;
    let mut cmd = sb.runner(&sb.script(QUICK));
    cmd.args(["--release-idle-after", "500ms"]);
    let child = cmd.spawn().unwrap();
    sb.wait_sealed("run-1").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(released_reason(&sb), None);
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(
        output.contains("--release-idle-after is ignored"),
        "{output}"
    );
    assert_eq!(
        sb.coordinator.snapshot().status_names(),
        ["turn_started", "turn_completed", "complete"]
    );
}

/// A retirement that comes during a turn lets it end as it would (sealed,
/// its work pushed), then releases the session (reason `retired`); a turn
/// queued meanwhile is left for the next sandbox.
#[tokio::test]
async fn a_retirement_mid_turn_lets_the_turn_end_then_releases() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"sleep 2
echo retired-work > "$PWD/work.txt"
echo '{"type":"message","text":"done"}'"#,
    );
    let mut cmd = sb.runner(&script);
    cmd.args(["--max-lifetime", "1s"]);
    let child = cmd.spawn().unwrap();
    let started = sb
        .coordinator
        .wait_for(super::support::WAIT, |s| {
            s.status_names().contains(&"turn_started")
        })
        .await;
    assert!(started.is_ok());
    assert_eq!(sb.coordinator.queue_turn("later", None), "run-2");
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded", "{output}");
    assert_eq!(snap.run("run-2").unwrap().status, "pending");
    assert_eq!(released_reason(&sb).as_deref(), Some("retired"));
    assert_eq!(
        sb.remote_file("work.txt").as_deref(),
        Some("retired-work\n")
    );
}

/// A retirement with a coordinator that does not accept `released`: the
/// runner posts nothing (as a stop does) and exits 75, not 0, so that a
/// platform tells it from a session that ended; files removed.
#[tokio::test]
async fn a_retirement_without_accepts_released_exits_and_posts_nothing() {
    let sb = Sandbox::start(CoordinatorOptions {
        accepts_released: false,
        ..CoordinatorOptions::default()
    })
    .await;
    let mut cmd = sb.runner(&sb.script(QUICK));
    let at =
        humantime::format_rfc3339_seconds(std::time::SystemTime::now() + Duration::from_secs(2));
    cmd.args(["--retire-at", &at.to_string()]);
    let child = cmd.spawn().unwrap();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(75), "{output}");
    assert!(output.contains("nothing posted"), "{output}");
    assert_eq!(
        sb.coordinator.snapshot().status_names(),
        ["turn_started", "turn_completed"]
    );
    assert!(!sb.session_dir().exists());
}

/// `--retire-at` that is not a time is refused naming the value and the
/// form to write.
#[tokio::test]
async fn a_retire_at_that_is_not_a_time_is_refused() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let mut cmd = sb.runner(&sb.script(QUICK));
    cmd.args(["--retire-at", "tomorrow"]);
    let (status, output) = finish(cmd.spawn().unwrap()).await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(
        output.contains("\"tomorrow\" is not an RFC 3339 time"),
        "{output}"
    );
}

/// Bounds too far for the clock are never, not a crash: the runner runs
/// its turn and ends with the session.
#[tokio::test]
async fn bounds_too_far_for_the_clock_are_never() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let mut cmd = sb.runner(&sb.script(QUICK));
    cmd.args(["--max-lifetime", "500000000000y"])
        .args(["--release-idle-after", "500000000000y"]);
    let child = cmd.spawn().unwrap();
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_eq!(released_reason(&sb), None);
}

/// The idle release applies to the wait for the first turn too: a sandbox
/// started for a session with nothing to run gives it back, before any
/// clone.
#[tokio::test]
async fn a_sandbox_with_no_first_turn_is_released_too() {
    let sb = Sandbox::start(CoordinatorOptions {
        start_idle: true,
        ..CoordinatorOptions::default()
    })
    .await;
    let mut cmd = sb.runner(&sb.script(QUICK));
    cmd.args(["--release-idle-after", "1s"]);
    let (status, output) = finish(cmd.spawn().unwrap()).await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_eq!(
        sb.coordinator.snapshot().status_names(),
        ["ready", "released"]
    );
    assert!(!sb.root().join("repo").exists());
}
