//! The on-stop hook (`--on-stop-script`, PROTOCOL.md 4.7, 4.4): the
//! real binary against the reference coordinator. It runs once as the boot
//! ends (the session ended, the sandbox released, a graceful stop, a
//! failure), after the last harvest and the seal and before the final
//! report, with the session directory gone, as the agent user, in `repo/`;
//! its output goes to the runner's log, redacted and capped; its result to
//! the status file's `onStop`. Its timeout and the stop budget kill its
//! whole tree; a second stop signal keeps it from running, or kills it.
//! Every hook records its process group with the agents', so the sandbox
//! checks that nothing of it is left.

use std::time::{Duration, Instant};

use hosted_boot_coordinator::CoordinatorOptions;
use pretty_assertions::assert_eq;

use super::support::{
    Process, RECORD_GROUP, RECORD_PROCESS, Runner, Sandbox, assert_no_secret, signal, wait_for_file,
};

/// A quick agent: one event, exit 0.
const QUICK: &str = r#"echo '{"type":"message","text":"done"}'"#;

/// A connector's value the hook prints: the log must show it redacted.
const HOOK_SECRET: &str = "on-stop-hook-secret-7c41e2";

/// The hook's command: it records its process group for the sandbox's
/// check, appends its ending to `on-stop-runs`, writes where it ran, as
/// whom and with which environment, whether the session directory
/// (`$HOOK_SESSION_DIR`) still existed, and `on-stop-started` (empty,
/// last); then `body`.
fn hook(body: &str) -> String {
    format!(
        r#"set -u
{RECORD_PROCESS}
{RECORD_GROUP} >> "$AGENT_OUT/.agent-pgids"
o="$AGENT_OUT/on-stop"
echo "$ORIZU_BOOT_ENDING" >> "$o-runs"
pwd > "$o-cwd"
id -u > "$o-uid"
echo "$HOME" > "$o-home"
env > "$o-env"
if [ -e "$HOOK_SESSION_DIR" ]; then echo present; else echo absent; fi > "$o-session-dir"
touch "$o-started"
{body}
"#
    )
}

/// The hook's timeout unless a test sets its own: 30 s once scaled by
/// 0.05, which no hook of these tests reaches on a loaded machine.
const ROOMY_TIMEOUT: &str = "10m";

/// The runner on `agent` with the hook `body` ([`hook`]) and `extra`
/// variables.
fn runner_with_hook(sb: &Sandbox, agent: &str, body: &str, extra: &[(&str, &str)]) -> Runner {
    let mut cmd = sb.runner(&sb.script(agent));
    cmd.env("HOSTED_BOOT_ON_STOP_SCRIPT", hook(body))
        .env("HOSTED_BOOT_ON_STOP_TIMEOUT", ROOMY_TIMEOUT)
        .env("HOOK_SESSION_DIR", sb.session_dir());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    Runner::reading(cmd.spawn().unwrap())
}

/// The status file's `onStop`, once the runner exited.
fn on_stop_record(sb: &Sandbox) -> Option<hosted_boot::status::OnStop> {
    hosted_boot::status::read(&sb.root()).unwrap().on_stop
}

fn status_names(sb: &Sandbox) -> Vec<&'static str> {
    sb.coordinator.snapshot().status_names()
}

/// Whether the process the hook recorded in `name` is alive.
fn alive(sb: &Sandbox, name: &str) -> bool {
    Process::recorded(&sb.read_out(name)).alive()
}

/// The session ends: the hook runs once, in `repo/`, before `complete` is
/// posted, once the session directory is gone, with the agent's
/// environment and no turn variable or credential; its lines are in the
/// log, redacted, the first 200 of them; its exit code is recorded and
/// changes nothing.
#[tokio::test]
async fn the_hook_runs_once_when_the_session_ends_before_complete_redacted_in_the_log() {
    let sb = Sandbox::with_connectors(&[("HOOK_KEY", HOOK_SECRET)]).await;
    let runner = runner_with_hook(
        &sb,
        QUICK,
        r#"echo "hook says $HOOK_KEY"
i=0; while [ $i -lt 300 ]; do i=$((i+1)); echo "line $i"; done
echo "to stderr" >&2
sleep 2
exit 3"#,
        &[],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    wait_for_file(&sb.out().join("on-stop-started")).await;
    assert_eq!(
        status_names(&sb),
        ["turn_started", "turn_completed"],
        "complete was posted before the hook ended"
    );
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_eq!(
        status_names(&sb),
        ["turn_started", "turn_completed", "complete"]
    );
    assert_eq!(sb.read_out("on-stop-runs"), "complete\n");
    assert_eq!(
        sb.read_out("on-stop-cwd").trim(),
        sb.root().join("repo").to_str().unwrap()
    );
    assert_eq!(sb.read_out("on-stop-session-dir").trim(), "absent");
    // Its output: redacted, 200 lines logged, the rest counted.
    assert!(output.contains("hook says [REDACTED]"), "{output}");
    assert_no_secret("the runner's log", &output, &sb.secrets(&[HOOK_SECRET]));
    assert_eq!(output.matches("on-stop hook output").count(), 200);
    assert!(
        output.contains("the on-stop hook printed 102 more lines than the 200 logged"),
        "{output}"
    );
    // Its environment: the connectors, no turn variable, no credential.
    let env = sb.read_out("on-stop-env");
    assert!(env.contains(&format!("HOOK_KEY={HOOK_SECRET}\n")), "{env}");
    assert!(env.contains("ORIZU_BOOT_ENDING=complete\n"), "{env}");
    for name in [
        "ORIZU_TOKEN_FILE=",
        "ORIZU_TURN_FILE=",
        "ORIZU_TASK_FILE=",
        "ORIZU_BOOT_SECRET",
        "ORIZU_AGENT_TOKEN_URL=",
        "ORIZU_API_BASE_URL=",
    ] {
        assert!(!env.contains(name), "the hook got {name}: {env}");
    }
    assert_no_secret("the hook's environment", &env, &sb.secrets(&[]));
    let record = on_stop_record(&sb).expect("no onStop in the status file");
    assert_eq!(
        (
            record.ending.as_str(),
            record.result.as_str(),
            record.exit_code,
            record.timed_out
        ),
        ("complete", "exited with code 3", Some(3), false)
    );
    assert!(record.duration_ms >= 2000, "{record:?}");
    assert!(!sb.session_dir().exists());
}

/// The runner leaves its sandbox idle: the hook runs (`idle`) after the
/// harvest and before `released` is posted.
#[tokio::test]
async fn the_hook_runs_on_a_release_before_released_is_posted() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with_hook(
        &sb,
        QUICK,
        "sleep 2",
        &[("HOSTED_BOOT_RELEASE_IDLE_AFTER", "1s")],
    );
    wait_for_file(&sb.out().join("on-stop-started")).await;
    assert_eq!(
        status_names(&sb),
        ["turn_started", "turn_completed"],
        "released was posted before the hook ended"
    );
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_eq!(
        status_names(&sb),
        ["turn_started", "turn_completed", "released"]
    );
    assert_eq!(sb.read_out("on-stop-runs"), "idle\n");
    assert_eq!(
        sb.read_out("on-stop-cwd").trim(),
        sb.root().join("repo").to_str().unwrap()
    );
    let record = on_stop_record(&sb).unwrap();
    assert_eq!(
        (record.ending.as_str(), record.exit_code),
        ("idle", Some(0))
    );
}

/// A sandbox released before its first turn has no `repo/`: the hook runs
/// in the root.
#[tokio::test]
async fn without_a_clone_the_hook_runs_in_the_root() {
    let sb = Sandbox::start(CoordinatorOptions {
        start_idle: true,
        ..CoordinatorOptions::default()
    })
    .await;
    let runner = runner_with_hook(
        &sb,
        QUICK,
        "",
        &[("HOSTED_BOOT_RELEASE_IDLE_AFTER", "500ms")],
    );
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_eq!(status_names(&sb), ["ready", "released"]);
    assert_eq!(sb.read_out("on-stop-runs"), "idle\n");
    assert_eq!(
        sb.read_out("on-stop-cwd").trim(),
        sb.root().to_str().unwrap()
    );
}

/// A graceful stop during a turn: the hook runs (`stopped`) once the run is
/// sealed `interrupted` and `turn_completed` posted, in what the stop
/// budget leaves; the exit is the stop's.
#[tokio::test]
async fn on_a_stop_during_a_turn_the_hook_runs_after_the_seal() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with_hook(
        &sb,
        r#"echo '{"type":"message","text":"working"}'
sleep 1000"#,
        "",
        // Scaled by 0.05: 10 s, room for the harvest of a debug build.
        &[("HOSTED_BOOT_STOP_BUDGET", "200s")],
    );
    sb.wait_text("run-1", "working").await;
    signal(runner.pid(), rustix::process::Signal::TERM);
    wait_for_file(&sb.out().join("on-stop-started")).await;
    let snap = sb.coordinator.snapshot();
    assert_eq!(
        snap.run("run-1").unwrap().status,
        "interrupted",
        "the hook ran before the seal"
    );
    assert_eq!(snap.status_names(), ["turn_started", "turn_completed"]);
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(143), "{output}");
    assert_eq!(sb.read_out("on-stop-runs"), "stopped\n");
    let record = on_stop_record(&sb).unwrap();
    assert_eq!(
        (record.ending.as_str(), record.exit_code),
        ("stopped", Some(0))
    );
    assert_eq!(status_names(&sb), ["turn_started", "turn_completed"]);
}

/// A graceful stop between turns: a hook that would outlast the stop
/// budget is killed, with what it started, when the budget (counted from
/// the signal) runs out, well before its own timeout.
#[tokio::test]
async fn on_a_graceful_stop_the_hook_is_bounded_by_what_the_stop_budget_leaves() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with_hook(
        &sb,
        QUICK,
        r#"sleep 1000 &
record_process $! > "$AGENT_OUT/hook-child"
wait"#,
        // Scaled by 0.05: a 2 s budget, a 30 s timeout.
        &[
            ("HOSTED_BOOT_STOP_BUDGET", "40s"),
            ("HOSTED_BOOT_ON_STOP_TIMEOUT", "10m"),
        ],
    );
    sb.coordinator
        .wait_for(super::support::WAIT, |s| {
            s.status_names().contains(&"turn_completed")
        })
        .await
        .unwrap();
    signal(runner.pid(), rustix::process::Signal::TERM);
    let signalled = Instant::now();
    let (status, output) = runner.finish().await;
    let took = signalled.elapsed();
    assert_eq!(status.code(), Some(143), "{output}");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(8),
        "the hook was not bounded by the 2 s stop budget: the runner exited {took:?} after the signal"
    );
    let record = on_stop_record(&sb).unwrap();
    assert_eq!(record.ending, "stopped");
    assert!(record.timed_out, "{record:?}");
    assert_eq!(
        record.result,
        "was killed at the end of the stop budget with every process it started"
    );
    assert!(!alive(&sb, "hook-child"), "the hook's child survived it");
}

/// Past `--on-stop-timeout` the hook's whole tree is killed: its
/// background child and a process that left its session alike; the report
/// follows.
#[tokio::test]
async fn past_its_timeout_the_hooks_whole_tree_is_killed() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with_hook(
        &sb,
        QUICK,
        r#"sleep 1000 &
record_process $! > "$AGENT_OUT/hook-child"
setsid sleep 1000 &
record_process $! > "$AGENT_OUT/hook-daemon"
echo "flushing"
wait"#,
        // Scaled by 0.05: 2 s.
        &[("HOSTED_BOOT_ON_STOP_TIMEOUT", "40s")],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(output.contains("flushing"), "{output}");
    let record = on_stop_record(&sb).unwrap();
    assert!(record.timed_out, "{record:?}");
    assert_eq!(
        record.result,
        "was killed at --on-stop-timeout (2s) with every process it started"
    );
    assert_eq!(record.signal.as_deref(), Some("SIGKILL"));
    for name in ["hook-child", "hook-daemon"] {
        assert!(!alive(&sb, name), "the hook's {name} survived its timeout");
    }
    assert_eq!(
        status_names(&sb),
        ["turn_started", "turn_completed", "complete"]
    );
}

/// A second stop signal skips the hook: an immediate stop during a turn
/// ends the runner without it.
#[tokio::test]
async fn a_second_stop_signal_during_a_turn_skips_the_hook() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with_hook(
        &sb,
        r#"trap '' INT TERM
echo '{"type":"message","text":"working"}'
sleep 1000"#,
        "",
        // Scaled by 0.2: the agent, which ignores its stop signal, is
        // killed 1 s after the first signal; the second comes before.
        &[("HOSTED_BOOT_TEST_TIME_SCALE", "0.2")],
    );
    sb.wait_text("run-1", "working").await;
    signal(runner.pid(), rustix::process::Signal::TERM);
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(runner.pid(), rustix::process::Signal::TERM);
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(143), "{output}");
    assert!(
        output.contains("second stop signal: stopping at once"),
        "{output}"
    );
    assert!(
        !sb.out().join("on-stop-started").exists(),
        "the hook ran after a second stop signal"
    );
    assert_eq!(on_stop_record(&sb), None);
}

/// A second stop signal while the hook runs kills its tree at once; the
/// ending stands (the session ended: `complete`).
#[tokio::test]
async fn a_second_stop_signal_kills_a_running_hook_at_once() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with_hook(
        &sb,
        QUICK,
        r#"sleep 1000 &
record_process $! > "$AGENT_OUT/hook-child"
wait"#,
        // Scaled by 0.05: a 10 s budget, a 30 s timeout: neither ends it.
        &[
            ("HOSTED_BOOT_STOP_BUDGET", "200s"),
            ("HOSTED_BOOT_ON_STOP_TIMEOUT", "10m"),
        ],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    wait_for_file(&sb.out().join("on-stop-started")).await;
    signal(runner.pid(), rustix::process::Signal::TERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(runner.pid(), rustix::process::Signal::TERM);
    let second = Instant::now();
    let (status, output) = runner.finish().await;
    assert!(
        second.elapsed() < Duration::from_secs(5),
        "{:?}",
        second.elapsed()
    );
    assert_eq!(status.code(), Some(0), "{output}");
    let record = on_stop_record(&sb).unwrap();
    assert_eq!(
        (record.ending.as_str(), record.timed_out),
        ("complete", false)
    );
    assert_eq!(
        record.result,
        "was killed by a second stop signal with every process it started"
    );
    assert!(!alive(&sb, "hook-child"), "the hook's child survived it");
    assert_eq!(
        status_names(&sb),
        ["turn_started", "turn_completed", "complete"]
    );
}

/// A failed turn: the hook runs (`failed`), after the run is sealed and
/// before `turn_failed` is posted; the exit is the failure's.
#[tokio::test]
async fn after_a_failure_the_hook_runs_before_turn_failed() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with_hook(&sb, "exit 1", "sleep 2", &[]);
    wait_for_file(&sb.out().join("on-stop-started")).await;
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "failed");
    assert_eq!(snap.status_names(), ["turn_started", "turn_completed"]);
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert_eq!(
        status_names(&sb),
        ["turn_started", "turn_completed", "turn_failed"]
    );
    assert_eq!(sb.read_out("on-stop-runs"), "failed\n");
}

/// With `--agent-user` the hook runs as that user, with its home, in the
/// `repo/` it owns.
#[tokio::test]
async fn the_hook_runs_as_the_agent_user() {
    let user = match super::agent_user::TestUser::create() {
        Ok(u) => u,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = super::agent_user::sandbox_for(&user).await;
    let child = sb
        .wrapped_command(&["env"], "run", &sb.script(QUICK))
        .env("HOSTED_BOOT_AGENT_USER", &user.name)
        .env("HOSTED_BOOT_ON_STOP_SCRIPT", hook(""))
        .env("HOSTED_BOOT_ON_STOP_TIMEOUT", ROOMY_TIMEOUT)
        .env("HOOK_SESSION_DIR", sb.session_dir())
        .spawn()
        .unwrap();
    let runner = Runner::reading(child);
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_eq!(sb.read_out("on-stop-uid").trim(), user.uid.to_string());
    assert_eq!(
        sb.read_out("on-stop-home").trim(),
        user.home.to_str().unwrap()
    );
    assert_eq!(
        sb.read_out("on-stop-cwd").trim(),
        sb.root().join("repo").to_str().unwrap()
    );
    assert_eq!(on_stop_record(&sb).unwrap().exit_code, Some(0));
}

/// A zero `--on-stop-timeout` is refused before any request, naming the
/// flag, its variable and the value.
#[tokio::test]
async fn a_zero_on_stop_timeout_is_a_configuration_error() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with_hook(&sb, QUICK, "", &[("HOSTED_BOOT_ON_STOP_TIMEOUT", "0s")]);
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(
        output.contains(
            "--on-stop-timeout (HOSTED_BOOT_ON_STOP_TIMEOUT): \"0s\" is not a positive duration"
        ),
        "{output}"
    );
    assert!(sb.coordinator.requests().is_empty());
    assert!(!sb.out().join("on-stop-started").exists());
}
