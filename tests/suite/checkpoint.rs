//! The checkpoint on notice (PROTOCOL.md 4.5, "Checkpoint"): `hosted-boot
//! checkpoint` (SIGUSR1) while the agent runs saves the work as it stands
//! to `<branch>-recovered-checkpoint-<runId>` without touching the agent's
//! git state; the real binary against the reference coordinator and its
//! git server.

use std::path::Path;
use std::time::{Duration, Instant};

use hosted_boot::wire::Event;
use pretty_assertions::assert_eq;
use serde_json::Value;

use super::harvest::{CONNECTOR, bare_git, tip};
use super::support::{Sandbox, WAIT};

/// Waits until `path` exists.
pub(super) async fn wait_file(path: &Path) {
    let deadline = Instant::now() + WAIT;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `hosted-boot checkpoint` for the sandbox's runner: its exit code and
/// output.
pub(super) async fn checkpoint(sb: &Sandbox, args: &[&str]) -> (Option<i32>, String) {
    let out = sb
        .command("checkpoint", Path::new("/nonexistent"))
        .args(args)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

pub(super) fn checkpoint_events(sb: &Sandbox, run_id: &str) -> Vec<Value> {
    sb.coordinator
        .snapshot()
        .run(run_id)
        .map(|r| {
            r.events
                .iter()
                .filter(|e| e.kind == "hosted_boot.checkpoint")
                .map(|e| e.data.clone())
                .collect()
        })
        .unwrap_or_default()
}

fn is_checkpoint(e: &Event) -> bool {
    e.kind == "hosted_boot.checkpoint"
}

/// A checkpoint mid-turn: the agent's commit, staged, changed and new
/// files go to the checkpoint branch, a file holding a secret does not;
/// the agent's `HEAD`, index, merge in progress and `index.lock` are as it
/// left them, and the turn goes on to its own harvest as before.
#[tokio::test]
async fn a_checkpoint_mid_turn_saves_the_work_and_leaves_the_agents_git_alone() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let script = sb.script(
        r#"
g() { git -c user.name=a -c user.email=a@example.invalid "$@"; }
echo committed > COMMITTED.md && g add COMMITTED.md && g commit -qm "the agent's commit"
echo staged > STAGED.md && g add STAGED.md
echo unstaged >> README.md
echo new > NEW.md
echo "key $ACME_API_KEY" > SECRET.txt
g rev-parse HEAD > .git/MERGE_HEAD
touch .git/index.lock
g status --porcelain > "$AGENT_OUT/status-before"
sha256sum .git/index > "$AGENT_OUT/index-before"
g rev-parse HEAD > "$AGENT_OUT/head-before"
touch "$AGENT_OUT/ready"
while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.05; done
sha256sum .git/index > "$AGENT_OUT/index-after"
g rev-parse HEAD > "$AGENT_OUT/head-after"
g status --porcelain > "$AGENT_OUT/status-after"
[ -e .git/index.lock ] && echo kept > "$AGENT_OUT/lock"
[ -e .git/MERGE_HEAD ] && echo kept > "$AGENT_OUT/merge"
rm .git/index.lock .git/MERGE_HEAD SECRET.txt
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = sb.spawn(&script);
    wait_file(&sb.out().join("ready")).await;

    let (code, said) = checkpoint(&sb, &[]).await;
    assert_eq!(code, Some(0), "{said}");
    let branch = sb.coordinator.branch();
    let saved = format!("{branch}-recovered-checkpoint-run-1");
    assert!(said.contains(&format!("to {saved}")), "{said}");
    let commit = tip(&sb, &saved);
    assert!(!commit.is_empty(), "no checkpoint branch: {said}");
    let files = bare_git(&sb, &["ls-tree", "-r", "--name-only", &commit]);
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        [
            "COMMITTED.md",
            "NEW.md",
            "README.md",
            "STAGED.md",
            "src/greeting.txt"
        ],
        "SECRET.txt must stay out"
    );
    let readme = bare_git(&sb, &["show", &format!("{commit}:README.md")]);
    assert!(readme.ends_with("unstaged"), "{readme}");
    sb.wait_event("run-1", "checkpoint", is_checkpoint).await;
    let events = checkpoint_events(&sb, "run-1");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["outcome"], "pushed");
    assert_eq!(events[0]["recoveryBranch"], saved.as_str());
    assert_eq!(events[0]["headSha"], commit.as_str());
    assert_eq!(events[0]["blockedPaths"], serde_json::json!(["SECRET.txt"]));
    let status = hosted_boot::status::read(&sb.root()).unwrap();
    let last = status.last_checkpoint.unwrap();
    assert_eq!(
        (last.outcome.as_str(), last.commit.as_deref()),
        ("pushed", Some(commit.as_str()))
    );

    std::fs::write(sb.out().join("go"), "").unwrap();
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    for (before, after) in [
        ("index-before", "index-after"),
        ("head-before", "head-after"),
        ("status-before", "status-after"),
    ] {
        assert_eq!(sb.read_out(before), sb.read_out(after), "{before}");
    }
    assert_eq!(sb.read_out("lock"), "kept\n", "index.lock removed");
    assert_eq!(sb.read_out("merge"), "kept\n", "the merge state cleaned up");
    // The turn's own harvest as before: everything on the session branch.
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded");
    assert_eq!(sb.remote_file("NEW.md").as_deref(), Some("new\n"));
    assert_eq!(sb.remote_file("STAGED.md").as_deref(), Some("staged\n"));
    assert_eq!(sb.remote_file("SECRET.txt"), None);
    assert!(!output.contains(CONNECTOR.1), "a secret in the log");
}

/// Notices are coalesced and rate-limited: two right after a checkpoint
/// make one more, after the interval, and with nothing changed it makes
/// no commit (the run's checkpoint holds it all already).
#[tokio::test]
async fn notices_in_a_row_make_one_more_checkpoint_after_the_interval() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
echo work > WORK.md
touch "$AGENT_OUT/ready"
while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.05; done
"#,
    );
    let child = sb.spawn(&script);
    wait_file(&sb.out().join("ready")).await;
    let (code, said) = checkpoint(&sb, &[]).await;
    assert_eq!(code, Some(0), "{said}");
    let saved = format!("{}-recovered-checkpoint-run-1", sb.coordinator.branch());
    let first = tip(&sb, &saved);
    for _ in 0..2 {
        let (code, said) = checkpoint(&sb, &["--no-wait"]).await;
        assert_eq!(code, Some(0), "{said}");
    }
    sb.coordinator
        .wait_for(WAIT, |s| {
            s.run("run-1")
                .is_some_and(|r| r.events.iter().filter(|e| is_checkpoint(e)).count() >= 2)
        })
        .await
        .unwrap();
    // Long enough for a third (the interval is 30 s × 0.05).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let events = checkpoint_events(&sb, "run-1");
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[1]["outcome"], "on_remote");
    assert_eq!(events[1]["headSha"], first.as_str());
    assert_eq!(tip(&sb, &saved), first);
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (_, output) = sb.end_after_seal("run-1", child).await;
    assert!(
        output.contains("the last checkpoint was too recent"),
        "{output}"
    );
}

/// With no agent running, a notice is answered at once: nothing to save,
/// exit 0; and with no runner at all, `hosted-boot checkpoint` says so,
/// exit 1.
#[tokio::test]
async fn a_notice_between_turns_is_answered_at_once() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(r#"echo '{"type":"message","text":"done"}'"#);
    let child = sb.spawn(&script);
    sb.wait_sealed("run-1").await;
    sb.coordinator
        .wait_for(WAIT, |s| s.status_names().last() == Some(&"turn_completed"))
        .await
        .unwrap();
    let (code, said) = checkpoint(&sb, &[]).await;
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("no agent was running"), "{said}");
    sb.coordinator.end_session();
    let (status, output) = super::support::finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
    let (code, said) = checkpoint(&sb, &[]).await;
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("is not running"), "{said}");
}

/// As PID 1 (the reaper, in a PID namespace), notices from the very start
/// (before the worker listens for them) neither end the runner nor the
/// worker: the reaper blocks them, and the worker starts with them ignored
/// until its handler is installed. The turn runs as usual.
#[tokio::test]
async fn notices_from_the_start_do_not_end_the_runner_as_pid1() {
    let wrapper = match super::support::pid_namespace_wrapper() {
        Ok(w) => w,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(r#"echo '{"type":"message","text":"done"}'"#);
    let mut cmd = sb.wrapped_command(&wrapper, "run", &script);
    cmd.env(super::support::IN_PID_NAMESPACE, "1");
    let child = cmd.spawn().unwrap();
    let unshare = child.id().unwrap();
    // The namespace's PID 1 (the reaper), then the worker when it exists.
    let started = Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_millis(300) {
        let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
            .unwrap_or_default();
        for pid in children
            .split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok())
        {
            let grandchildren = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            for target in std::iter::once(pid).chain(
                grandchildren
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok()),
            ) {
                if let Some(p) = rustix::process::Pid::from_raw(target as i32) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::USR1);
                    sent += 1;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(sent > 10, "only {sent} notices sent");
    let (_, output) = sb.end_after_seal("run-1", child).await;
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded", "{output}");
}
