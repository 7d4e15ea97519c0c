//! The repository's setup script (PROTOCOL.md 4.1, "Setup"), end to end
//! with the real binary: it runs before the agent, in `repo/`, its output in
//! the first turn's events, redacted; its failure and its time-out fail the
//! turn `setup_failed` with the tail of its output, after the harvest;
//! nothing it started survives it; the setup cache skips it on a restart
//! with the same inputs and runs it again when one changed; a setup-only
//! connector reaches setup and no other process; an interrupt or SIGTERM
//! stops it as it stops an agent; its changes to tracked files are undone.
//! Every setup script records its process group with the agent's, so the
//! sandbox checks that no process of it is left.

use std::path::{Path, PathBuf};

use hosted_boot::wire::{BootStatus, Event, SessionSetup};
use hosted_boot_coordinator::CoordinatorOptions;
use pretty_assertions::assert_eq;
use serde_json::json;

use super::support::{
    Process, RECORD_GROUP, RECORD_PROCESS, Sandbox, assert_groups_empty, assert_no_secret, finish,
    signal,
};

const SETUP_SECRET: &str = "setup-only-secret-5e7a9c";
const AGENT_SECRET: &str = "agent-connector-secret-3b1d";

/// Writes the setup script (run through `sh`, as a path that is not
/// executable); it first records its process group for the sandbox's
/// check.
fn setup_script(sb: &Sandbox, body: &str) -> PathBuf {
    let path = sb.dir.path().join("setup.sh");
    std::fs::write(
        &path,
        format!(
            "set -u\n{RECORD_PROCESS}\n{RECORD_GROUP} >> \"$AGENT_OUT/.agent-pgids\"\n{body}\n"
        ),
    )
    .unwrap();
    path
}

fn runner_with_setup(
    sb: &Sandbox,
    agent: &Path,
    setup: &Path,
    extra: &[(&str, &str)],
) -> tokio::process::Command {
    let mut cmd = sb.runner(agent);
    cmd.env("HOSTED_BOOT_SETUP_SCRIPT", setup);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd
}

fn events(sb: &Sandbox, run_id: &str) -> Vec<Event> {
    sb.coordinator.run(run_id).unwrap().events
}

fn setup_phases(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.kind == "hosted_boot.setup")
        .map(|e| e.data["phase"].as_str().unwrap_or("").to_string())
        .collect()
}

fn setup_output(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.kind == "hosted_boot.setup_output")
        .map(|e| {
            format!(
                "{}:{}",
                e.data["stream"].as_str().unwrap(),
                e.data["text"].as_str().unwrap()
            )
        })
        .collect()
}

fn error(sb: &Sandbox, run_id: &str) -> hosted_boot::wire::FinishError {
    let run = sb.coordinator.run(run_id).unwrap();
    run.finish.unwrap().error.unwrap()
}

fn seq_of(events: &[Event], what: impl Fn(&Event) -> bool) -> u64 {
    events
        .iter()
        .find(|e| what(e))
        .map(|e| e.seq)
        .unwrap_or(u64::MAX)
}

/// Whether the process a setup recorded (`record_process`) is alive.
fn alive(record: &str) -> bool {
    Process::recorded(record).alive()
}

/// The session branch's content of `path` on the coordinator's repository.
fn remote_file(sb: &Sandbox, path: &str) -> String {
    let repo = git2::Repository::open_bare(sb.coordinator.bare_repo()).unwrap();
    let branch = format!("refs/heads/{}", sb.coordinator.branch());
    let tree = repo
        .find_reference(&branch)
        .unwrap()
        .peel_to_tree()
        .unwrap();
    let blob = tree
        .get_path(Path::new(path))
        .unwrap()
        .to_object(&repo)
        .unwrap();
    String::from_utf8_lossy(blob.as_blob().unwrap().content()).into_owned()
}

#[tokio::test]
async fn setup_runs_before_the_agent_in_repo_redacted_and_its_secret_reaches_no_other_process() {
    let sb = Sandbox::start(CoordinatorOptions {
        connectors: vec![("AGENT_KEY".into(), AGENT_SECRET.into())],
        setup_connectors: vec![("SETUP_KEY".into(), SETUP_SECRET.into())],
        ..CoordinatorOptions::default()
    })
    .await;
    let setup = setup_script(
        &sb,
        r#"
pwd > "$AGENT_OUT/setup-cwd"
echo "installing with $SETUP_KEY"
echo "warning: $SETUP_KEY on stderr" >&2
echo "agent key $AGENT_KEY"
echo "set up" > "$AGENT_OUT/setup-ran"
echo "Hello from setup" > src/greeting.txt
"#,
    );
    let agent = sb.script(
        r#"
env > "$AGENT_OUT/agent-env"
cat "$AGENT_OUT/setup-ran" > "$AGENT_OUT/agent-saw" 2>&1
cat src/greeting.txt > "$AGENT_OUT/agent-greeting"
echo '{"type":"message","text":"agent ran"}'
"#,
    );
    let child = runner_with_setup(&sb, &agent, &setup, &[]).spawn().unwrap();
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded", "{output}");
    let repo = sb.root().join("repo");
    assert_eq!(sb.read_out("setup-cwd").trim(), repo.to_str().unwrap());
    assert_eq!(
        sb.read_out("agent-saw").trim(),
        "set up",
        "setup ran before the agent"
    );

    let events = events(&sb, "run-1");
    assert_eq!(setup_phases(&events), ["started", "succeeded"]);
    // Two pipes: their lines interleave in no set order.
    let mut lines = setup_output(&events);
    lines.sort();
    assert_eq!(
        lines,
        [
            "stderr:warning: [REDACTED] on stderr",
            "stdout:agent key [REDACTED]",
            "stdout:installing with [REDACTED]",
        ]
    );
    let started = seq_of(&events, |e| e.kind == "hosted_boot.setup");
    let agent_said = seq_of(&events, |e| e.data["text"] == "agent ran");
    assert!(started < agent_said, "{events:?}");
    // After the workspace sync, before the agent.
    assert!(seq_of(&events, |e| e.kind == "hosted_boot.workspace_sync") < started);
    let secrets = sb.secrets(&[SETUP_SECRET, AGENT_SECRET]);
    assert_no_secret("events", &serde_json::to_string(&events).unwrap(), &secrets);
    assert_no_secret("the runner's log", &output, &secrets);

    // The setup-only connector is in no other environment.
    let agent_env = sb.read_out("agent-env");
    assert!(
        agent_env.contains(AGENT_SECRET),
        "the agent's connector is there"
    );
    assert!(
        !agent_env.contains(SETUP_SECRET) && !agent_env.contains("SETUP_KEY"),
        "{agent_env}"
    );

    // Setup's change to a tracked file is undone before the agent starts and
    // never committed; what git does not track stays for the agent.
    let succeeded = events
        .iter()
        .find(|e| e.kind == "hosted_boot.setup" && e.data["phase"] == "succeeded")
        .unwrap();
    assert_eq!(succeeded.data["restoredPaths"], json!(["src/greeting.txt"]));
    assert_eq!(succeeded.data["source"], "image");
    assert_eq!(sb.read_out("agent-greeting"), "Hello, world!\n");
    assert_eq!(remote_file(&sb, "src/greeting.txt"), "Hello, world!\n");
}

#[tokio::test]
async fn a_failing_setup_fails_the_first_turn_with_setup_failed_after_the_harvest() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let setup = setup_script(
        &sb,
        r#"
echo "resolving"
echo "npm ERR! the last words" >&2
exit 3
"#,
    );
    let agent = sb.script(r#"echo ran > "$AGENT_OUT/agent-ran""#);
    let child = runner_with_setup(&sb, &agent, &setup, &[]).spawn().unwrap();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(
        !sb.out().join("agent-ran").exists(),
        "no agent after a failed setup"
    );
    let run = sb.coordinator.run("run-1").unwrap();
    assert_eq!(run.status, "failed");
    let e = error(&sb, "run-1");
    assert_eq!(serde_json::to_value(e.code).unwrap(), "setup_failed");
    assert!(!e.retryable);
    assert!(
        e.message.contains("exited with code 3") && e.message.contains("npm ERR! the last words"),
        "{}",
        e.message
    );
    // The harvest ran (its report is the seal's result and an event), then
    // turn_completed and turn_failed (PROTOCOL.md 4.1 step 7).
    assert!(run.finish.as_ref().unwrap().result.is_some(), "{output}");
    let events = events(&sb, "run-1");
    assert!(events.iter().any(|e| e.kind == "hosted_boot.harvest"));
    assert_eq!(setup_phases(&events), ["started", "failed"]);
    let statuses: Vec<BootStatus> = sb.coordinator.statuses().iter().map(|s| s.status).collect();
    assert_eq!(
        &statuses[statuses.len() - 2..],
        [BootStatus::TurnCompleted, BootStatus::TurnFailed]
    );
    assert!(!sb.root().join(".orizu-setup-fingerprint").exists());
}

#[tokio::test]
async fn a_setup_past_its_timeout_is_stopped_with_every_process_it_started() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let setup = setup_script(
        &sb,
        r#"
sleep 1000 &
record_process $! > "$AGENT_OUT/child"
setsid sleep 1000 &
record_process $! > "$AGENT_OUT/daemon"
echo "downloading"
wait
"#,
    );
    let agent = sb.script(r#"echo ran > "$AGENT_OUT/agent-ran""#);
    // 20 s scaled by 0.05: 1 s.
    let child = runner_with_setup(&sb, &agent, &setup, &[("HOSTED_BOOT_SETUP_TIMEOUT", "20s")])
        .spawn()
        .unwrap();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let e = error(&sb, "run-1");
    assert_eq!(serde_json::to_value(e.code).unwrap(), "setup_failed");
    assert!(
        e.message
            .contains("did not end within --setup-timeout (1s)")
            && e.message.contains("downloading"),
        "{}",
        e.message
    );
    assert!(!sb.out().join("agent-ran").exists());
    for name in ["child", "daemon"] {
        assert!(!alive(&sb.read_out(name)), "setup's {name} survived it");
    }
    assert_groups_empty(&sb.agent_groups());
}

#[tokio::test]
async fn the_setup_cache_skips_setup_on_a_restart_and_a_changed_input_runs_it_again() {
    let sb = &Sandbox::start(CoordinatorOptions::default()).await;
    let setup = setup_script(sb, r#"echo run >> "$AGENT_OUT/setup-count""#);
    let agent = sb.script(r#"echo '{"type":"message","text":"agent ran"}'"#);
    let inputs = [("HOSTED_BOOT_SETUP_INPUTS", "deps/*.lock,README.md")];
    let count = || sb.read_out("setup-count").lines().count();

    // Each runner runs one turn and is stopped between turns (exit 143, as
    // a sandbox that is restarted on the same root).
    let turn = |run_id: &'static str| {
        let runner = runner_with_setup(sb, &agent, &setup, &inputs)
            .spawn()
            .unwrap();
        async move {
            sb.wait_sealed(run_id).await;
            sb.coordinator
                .wait_for(super::support::WAIT, |s| {
                    s.statuses
                        .last()
                        .is_some_and(|b| b.status == BootStatus::TurnCompleted)
                })
                .await
                .unwrap();
            signal(runner.id().unwrap(), rustix::process::Signal::TERM);
            let (status, output) = finish(runner).await;
            assert_eq!(status.code(), Some(143), "{output}");
            setup_phases(&events(sb, run_id))
        }
    };
    assert_eq!(turn("run-1").await, ["started", "succeeded"]);
    assert_eq!(count(), 1);
    assert!(sb.root().join(".orizu-setup-fingerprint").exists());

    // Same script, inputs and machine boot: skipped, and the event says so.
    sb.coordinator.queue_turn("again", None);
    assert_eq!(turn("run-2").await, ["skipped"]);
    assert_eq!(count(), 1);

    // An input changed: setup runs again.
    std::fs::create_dir_all(sb.root().join("repo/deps")).unwrap();
    std::fs::write(sb.root().join("repo/deps/a.lock"), "v2").unwrap();
    sb.coordinator.queue_turn("once more", None);
    assert_eq!(turn("run-3").await, ["started", "succeeded"]);
    assert_eq!(count(), 2);

    // The session's script wins over the image's, and a new script is a
    // change too.
    sb.coordinator.set_setup(Some(SessionSetup {
        script: Some(
            format!("echo session >> \"$AGENT_OUT/setup-count\"; {RECORD_GROUP} >> \"$AGENT_OUT/.agent-pgids\""),
        ),
        inputs: None,
    }));
    sb.coordinator.queue_turn("last", None);
    let runner = runner_with_setup(sb, &agent, &setup, &inputs)
        .spawn()
        .unwrap();
    let (_, output) = sb.end_after_seal("run-4", runner).await;
    let events = events(sb, "run-4");
    assert_eq!(setup_phases(&events), ["started", "succeeded"]);
    assert_eq!(
        events
            .iter()
            .find(|e| e.kind == "hosted_boot.setup")
            .unwrap()
            .data["source"],
        "session"
    );
    assert_eq!(sb.read_out("setup-count").lines().last(), Some("session"));
    assert!(
        output.contains("the session's setup.script wins"),
        "{output}"
    );
}

/// A setup that waits until stopped the first time, and ends at once after.
const SLOW_ONCE: &str = r#"
if [ ! -e "$AGENT_OUT/setup-started" ]; then
  echo started > "$AGENT_OUT/setup-started"
  sleep 1000 &
  record_process $! > "$AGENT_OUT/child"
  echo "setting up"
  wait
fi
echo "quick this time"
"#;

#[tokio::test]
async fn an_interrupt_during_setup_stops_it_and_the_next_turn_runs_it_again() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let setup = setup_script(&sb, SLOW_ONCE);
    let agent = sb.script(r#"echo "$ORIZU_RUN_ID" >> "$AGENT_OUT/agent-ran""#);
    let child = runner_with_setup(&sb, &agent, &setup, &[]).spawn().unwrap();
    sb.wait_event("run-1", "setup output", |e| e.data["text"] == "setting up")
        .await;
    sb.coordinator.interrupt(Some("run-1")).unwrap();
    let snap = sb.wait_sealed("run-1").await;
    assert_eq!(snap.run("run-1").unwrap().status, "interrupted");
    assert!(
        !alive(&sb.read_out("child")),
        "setup's child survived the interrupt"
    );
    assert_eq!(
        setup_phases(&events(&sb, "run-1")),
        ["started", "interrupted"]
    );
    assert_eq!(
        sb.read_out("agent-ran"),
        "",
        "no agent in an interrupted setup's turn"
    );

    let run_id = sb.coordinator.queue_turn("go on", None);
    let (snap, _) = sb.end_after_seal(&run_id, child).await;
    assert_eq!(snap.run(&run_id).unwrap().status, "succeeded");
    assert_eq!(
        setup_phases(&events(&sb, &run_id)),
        ["started", "succeeded"]
    );
    assert_eq!(sb.read_out("agent-ran").trim(), run_id);
}

#[tokio::test]
async fn sigterm_during_setup_stops_it_and_seals_the_turn_interrupted() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let setup = setup_script(&sb, SLOW_ONCE);
    let agent = sb.script(r#"echo ran > "$AGENT_OUT/agent-ran""#);
    let child = runner_with_setup(&sb, &agent, &setup, &[]).spawn().unwrap();
    sb.wait_event("run-1", "setup output", |e| e.data["text"] == "setting up")
        .await;
    signal(child.id().unwrap(), rustix::process::Signal::TERM);
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(143), "{output}");
    assert_eq!(sb.coordinator.run("run-1").unwrap().status, "interrupted");
    assert!(
        !alive(&sb.read_out("child")),
        "setup's child survived the stop"
    );
    assert!(!sb.out().join("agent-ran").exists());
    let statuses: Vec<BootStatus> = sb.coordinator.statuses().iter().map(|s| s.status).collect();
    assert!(!statuses.contains(&BootStatus::TurnFailed), "{statuses:?}");
    assert!(!sb.session_dir().exists());
}

#[tokio::test]
async fn setup_runs_as_the_agent_user_and_leaves_repo_the_agent_users() {
    let user = match super::agent_user::TestUser::create() {
        Ok(u) => u,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = super::agent_user::sandbox_for(&user).await;
    let setup = setup_script(
        &sb,
        r#"
id -u > "$AGENT_OUT/setup-uid"
echo "$HOME" > "$AGENT_OUT/setup-home"
echo "changed by setup" > src/greeting.txt
"#,
    );
    let agent = sb.script(
        r#"
find . -not -user "$(id -u)" > "$AGENT_OUT/not-mine" 2>&1
cat src/greeting.txt > "$AGENT_OUT/agent-greeting"
"#,
    );
    let child = sb
        .wrapped_command(&["env"], "run", &agent)
        .env("HOSTED_BOOT_AGENT_USER", &user.name)
        .env("HOSTED_BOOT_SETUP_SCRIPT", &setup)
        .spawn()
        .unwrap();
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded", "{output}");
    assert_eq!(sb.read_out("setup-uid").trim(), user.uid.to_string());
    assert_eq!(
        sb.read_out("setup-home").trim(),
        user.home.to_str().unwrap()
    );
    assert_eq!(sb.read_out("agent-greeting"), "Hello, world!\n");
    assert_eq!(
        sb.read_out("not-mine"),
        "",
        "the undo of setup's change left files that are not the agent user's"
    );
}
