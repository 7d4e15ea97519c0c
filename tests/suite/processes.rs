//! A turn's processes and the runner's own, end to end (the real binary
//! against the reference coordinator): the grace period of an interrupt,
//! the time cap, SIGKILL to the runner, a second stop signal, SIGHUP and
//! SIGPIPE, the runner as PID 1 under the reaper, and the `/proc`
//! protections of PROTOCOL.md section 3 seen by an unprivileged reader.
//! After every test the sandbox checks that no agent's group has a live
//! process, and `finish` that the test process keeps no zombie child.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use hosted_boot_coordinator::{CoordinatorOptions, Fault, Route, Target};
use pretty_assertions::assert_eq;
use serde_json::json;

use super::support::{
    IN_PID_NAMESPACE, Pty, Sandbox, WAIT, assert_groups_empty, assert_no_zombie_children, finish,
    kill_group, pid_namespace_wrapper, signal,
};

/// The only child of `pid` (as `/proc/<pid>/task/<pid>/children` lists it).
fn only_child(pid: u32) -> u32 {
    let deadline = Instant::now() + WAIT;
    loop {
        let text =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        let kids: Vec<u32> = text
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        if kids.len() == 1 {
            return kids[0];
        }
        assert!(Instant::now() < deadline, "{pid} has children {kids:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn error_code(sb: &Sandbox, run_id: &str) -> serde_json::Value {
    let run = sb.coordinator.run(run_id).unwrap();
    let error = run.finish.as_ref().unwrap().error.as_ref().unwrap();
    serde_json::to_value(error.code).unwrap()
}

#[tokio::test]
async fn an_agent_ignoring_sigint_is_sealed_interrupted_after_the_grace_period() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
trap '' INT
echo '{"type":"message","text":"working"}'
sleep 1000
"#,
    );
    let child = sb.spawn(&script);
    sb.wait_text("run-1", "working").await;
    let asked = Instant::now();
    sb.coordinator.interrupt(Some("run-1")).unwrap();
    let snap = sb.wait_sealed("run-1").await;
    // The interrupt grace is 10 s scaled by 0.05: only SIGKILL ends it.
    assert!(
        asked.elapsed() >= Duration::from_millis(500),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(snap.run("run-1").unwrap().status, "interrupted");
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(output.contains("after the grace period"), "{output}");
}

#[tokio::test]
async fn the_time_cap_fails_the_turn_with_agent_timeout() {
    let sb = Sandbox::start(CoordinatorOptions {
        // 0.6 s (the cap is the session's number, not scaled).
        duration_minutes: Some(0.01),
        ..CoordinatorOptions::default()
    })
    .await;
    let script = sb.script(
        r#"
trap '' INT
echo '{"type":"message","text":"working"}'
sleep 1000
"#,
    );
    let started = Instant::now();
    let (status, output) = finish(sb.spawn(&script)).await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(started.elapsed() >= Duration::from_millis(600));
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "failed");
    assert_eq!(error_code(&sb, "run-1"), json!("agent_timeout"));
    assert_eq!(
        snap.status_names(),
        vec!["turn_started", "turn_completed", "turn_failed"]
    );
}

#[tokio::test]
async fn a_turn_within_its_time_cap_is_not_touched_by_it() {
    let sb = Sandbox::start(CoordinatorOptions {
        duration_minutes: Some(5.0),
        ..CoordinatorOptions::default()
    })
    .await;
    let child = sb.spawn(&sb.script("echo done"));
    sb.end_after_seal("run-1", child).await;
    assert_eq!(sb.coordinator.run("run-1").unwrap().status, "succeeded");
}

#[tokio::test]
async fn a_not_executable_agent_is_a_failed_turn_with_agent_spawn_failed() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script("exit 0");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut cmd = sb.runner(&script);
    cmd.env("HOSTED_BOOT_AGENT_COMMAND", script.display().to_string());
    let (status, output) = finish(cmd.spawn().unwrap()).await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert_eq!(error_code(&sb, "run-1"), json!("agent_spawn_failed"));
    let run = sb.coordinator.run("run-1").unwrap();
    let message = &run.finish.as_ref().unwrap().error.as_ref().unwrap().message;
    assert!(
        message.contains("agent.sh") && message.contains("Permission denied"),
        "{message}"
    );
}

#[tokio::test]
async fn sigkill_to_the_runner_kills_the_agent_group_and_a_restart_finds_no_stale_bearer() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
record_group > "$AGENT_OUT/pgid"
sleep 1000 &
sleep 1000 &
echo '{"type":"message","text":"working"}'
wait
"#,
    );
    let mut child = sb.spawn(&script);
    sb.wait_text("run-1", "working").await;
    let group = sb.read_group("pgid");
    let bearer = sb.session_dir().join("bearer");
    assert!(bearer.exists(), "the turn's bearer file is written");
    signal(child.id().unwrap(), rustix::process::Signal::KILL);
    child.wait().await.unwrap();
    // The leader dies of PR_SET_PDEATHSIG, the rest of the group through
    // the turn's guard.
    assert_groups_empty(&[group]);
    assert!(bearer.exists(), "a SIGKILLed runner cannot clean up");

    // A restarted runner removes the stale session directory before its
    // first request, which is held back here for 3 s: the file goes before
    // the new boot can have done anything else.
    sb.coordinator
        .add_fault(Fault::delay(Route::AgentToken, Duration::from_secs(3)))
        .unwrap();
    let restarted = sb.spawn(&sb.script("echo again"));
    let deadline = Instant::now() + Duration::from_secs(2);
    while bearer.exists() {
        assert!(Instant::now() < deadline, "the stale bearer file stayed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sb.end_after_seal("run-1", restarted).await;
    assert_no_zombie_children().await;
}

#[tokio::test]
async fn a_second_sigterm_during_the_graceful_stop_kills_the_tree_at_once() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
trap '' INT
echo '{"type":"message","text":"working"}'
sleep 1000
"#,
    );
    // Durations scaled by 0.5: the stop's SIGINT → SIGKILL grace is 2.5 s.
    let mut cmd = sb.runner(&script);
    cmd.env("HOSTED_BOOT_TEST_TIME_SCALE", "0.5");
    let child = cmd.spawn().unwrap();
    sb.wait_text("run-1", "working").await;
    let pid = child.id().unwrap();
    let first = Instant::now();
    signal(pid, rustix::process::Signal::TERM);
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(pid, rustix::process::Signal::TERM);
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(143), "{output}");
    assert!(
        first.elapsed() < Duration::from_secs(2),
        "the second signal did not cut the 2.5 s grace short: {:?}",
        first.elapsed()
    );
    assert!(!sb.session_dir().exists());
}

#[tokio::test]
async fn sighup_and_sigpipe_do_not_stop_the_runner_even_with_its_output_closed() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
echo '{"type":"message","text":"working"}'
while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.02; done
echo done
"#,
    );
    let mut child = sb.spawn(&script);
    // Whoever read the runner's output is gone: every log line now meets
    // a closed pipe (EPIPE, and SIGPIPE if it were not ignored).
    drop(child.stdout.take());
    drop(child.stderr.take());
    sb.wait_text("run-1", "working").await;
    let pid = child.id().unwrap();
    signal(pid, rustix::process::Signal::HUP);
    signal(pid, rustix::process::Signal::PIPE);
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::write(sb.out().join("go"), "").unwrap();
    let snap = sb.wait_sealed("run-1").await;
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded");
    sb.coordinator.end_session();
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_no_zombie_children().await;
}

#[tokio::test]
async fn as_pid1_the_runner_reaps_orphans_forwards_sigterm_and_hands_the_secret_through_a_pipe() {
    let wrapper = match pid_namespace_wrapper() {
        Ok(w) => w,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
tr '\0' ' ' < /proc/1/cmdline > "$AGENT_OUT/pid1"
echo $PPID > "$AGENT_OUT/parent"
i=0
while [ $i -lt 100 ]; do (sleep 0.01 &); i=$((i + 1)); done
sleep 0.5
grep -l '^State:[[:space:]]*Z' /proc/[0-9]*/status 2>/dev/null | wc -l > "$AGENT_OUT/zombies"
trap '' INT
echo '{"type":"message","text":"ready"}'
sleep 1000
"#,
    );
    let mut cmd = sb.wrapped_command(&wrapper, "run", &script);
    cmd.env(IN_PID_NAMESPACE, "1");
    let child = cmd.spawn().unwrap();
    sb.wait_text("run-1", "ready").await;

    // PID 1 is the reaper; the agent's parent is the worker, not PID 1.
    assert!(
        sb.read_out("pid1").contains("hosted-boot run"),
        "{}",
        sb.read_out("pid1")
    );
    assert_ne!(sb.read_out("parent").trim(), "1");
    // 100 orphans came and went; none stayed a zombie.
    assert_eq!(sb.read_out("zombies").trim(), "0");

    // Neither the reaper's nor the worker's /proc/<pid>/environ holds the
    // boot secret (read as root, which reads through non-dumpable).
    let reaper = only_child(child.id().unwrap());
    let worker = only_child(reaper);
    let secret = sb.coordinator.boot_secret();
    for (name, pid) in [("reaper", reaper), ("worker", worker)] {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let environ = String::from_utf8_lossy(&environ);
        assert!(environ.contains("ORIZU_SESSION_ID="), "{name}: {environ}");
        assert!(
            !environ.contains(&secret),
            "the {name}'s environ holds the boot secret"
        );
    }

    // SIGTERM to PID 1 is forwarded: the turn is sealed `interrupted`, the
    // files removed, and PID 1 exits 143.
    signal(reaper, rustix::process::Signal::TERM);
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(143), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "interrupted");
    assert_eq!(snap.status_names(), vec!["turn_started", "turn_completed"]);
    assert!(!sb.session_dir().exists());
}

/// The agent script of the controlling-terminal tests: it records its
/// session, then writes a marker to `/dev/tty` and reads a line from it,
/// recording each outcome (`$OUT` is where).
pub const TTY_AGENT: &str = r#"
cut -d' ' -f6 /proc/$$/stat > "$OUT/sid"
echo $$ > "$OUT/pid"
if (echo tty-marker-5c1e > /dev/tty) 2> "$OUT/write-error"; then echo yes > "$OUT/wrote"; fi
if (read -r line < /dev/tty) 2> "$OUT/read-error"; then echo yes > "$OUT/read"; fi
echo '{"type":"message","text":"done"}'
"#;

/// What the agent of [`TTY_AGENT`] recorded in `out`, checked: it ran in a
/// session of its own (not `runner_sid`) with no controlling terminal, so
/// that both opens of `/dev/tty` failed at once, and nothing reached the
/// terminal (`terminal`: what the pty's master read).
pub fn assert_no_terminal(out: &Path, runner_sid: i32, terminal: &str) {
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    let sid: i32 = read("sid").trim().parse().unwrap();
    let pid: i32 = read("pid").trim().parse().unwrap();
    assert_ne!(sid, runner_sid, "the agent is in the runner's session");
    assert_eq!(sid, pid, "the agent leads a session of its own");
    assert!(
        !terminal.contains("tty-marker"),
        "the agent wrote onto the runner's terminal: {terminal:?}"
    );
    assert_eq!(read("wrote"), "", "/dev/tty opened for writing");
    assert_eq!(read("read"), "", "/dev/tty opened for reading");
    for name in ["write-error", "read-error"] {
        assert!(
            read(name).contains("No such device or address"),
            "{name}: {:?}",
            read(name)
        );
    }
}

#[tokio::test]
async fn an_agent_opening_dev_tty_finds_no_controlling_terminal() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(&format!("OUT=\"$AGENT_OUT\"\n{TTY_AGENT}"));
    let pty = Pty::open();
    let mut cmd = sb.runner(&script);
    // 60 s scaled: 3 s. An agent stopped by SIGTTIN would end `agent_hung`.
    cmd.env("HOSTED_BOOT_AGENT_IDLE_TIMEOUT", "60s");
    pty.control(&mut cmd);
    let started = Instant::now();
    let child = cmd.spawn().unwrap();
    // The runner leads the session whose controlling terminal is the pty.
    let runner_sid = child.id().unwrap() as i32;
    let snap = sb.wait_sealed("run-1").await;
    let elapsed = started.elapsed();
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    let terminal = pty.output();
    let run = snap.run("run-1").unwrap();
    assert_eq!(run.status, "succeeded", "{:?}\n{output}", run.finish);
    assert!(run.events.iter().any(|e| e.data["text"] == "done"));
    assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    assert_eq!(status.code(), Some(0), "{output}");
    assert_no_terminal(&sb.out(), runner_sid, &terminal);
}

/// Runs `argv` as uid/gid 65534 (nobody) and returns (success, stdout+stderr).
fn as_nobody(argv: &[&str]) -> (bool, String) {
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn proc_protections_hold_against_a_reader_of_the_runners_own_uid() {
    if let Err(reason) =
        super::support::root_and_setpriv("running the runner and a reader as uid 65534")
    {
        hosted_boot_test_support::skip(reason);
        return;
    }
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // The runner and the reader share the unprivileged uid 65534; the
    // sandbox's files are theirs (the coordinator's stay root's).
    let nobody = |p: &Path| std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(sb.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for p in [sb.dir.path(), &sb.root(), &sb.out()] {
        nobody(p);
    }
    let script = sb.script(
        r#"
echo $PPID > "$AGENT_OUT/runner"
sleep 1000 &
echo $! > "$AGENT_OUT/sibling"
echo '{"type":"message","text":"ready"}'
while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.02; done
"#,
    );
    let setpriv = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ];
    let child = sb
        .wrapped_command(&setpriv, "run", &script)
        .spawn()
        .unwrap();
    sb.wait_text("run-1", "ready").await;
    let runner = sb.read_out("runner").trim().to_string();
    let sibling = sb.read_out("sibling").trim().to_string();
    assert_eq!(runner, child.id().unwrap().to_string());
    let secret = sb.coordinator.boot_secret();
    let open_mem = "exec 3< /proc/$0/mem && echo opened";

    // The control: the same reader reads a dumpable process of its uid.
    let (ok, text) = as_nobody(&["cat", &format!("/proc/{sibling}/environ")]);
    assert!(ok && text.contains("ORIZU_SESSION_ID="), "{text}");
    assert!(
        !text.contains(&secret),
        "the agent's environment holds the boot secret"
    );
    let (_, text) = as_nobody(&["sh", "-c", open_mem, &sibling]);
    assert!(text.contains("opened"), "{text}");

    // The runner: non-dumpable, so neither its environ nor its memory opens.
    let (ok, text) = as_nobody(&["cat", &format!("/proc/{runner}/environ")]);
    assert!(!ok && text.contains("Permission denied"), "{text}");
    assert!(!text.contains(&secret));
    let (_, text) = as_nobody(&["sh", "-c", open_mem, &runner]);
    assert!(
        !text.contains("opened") && text.contains("Permission denied"),
        "{text}"
    );

    // And even root, which reads through non-dumpable, finds the initial
    // environment block scrubbed.
    let environ = std::fs::read(format!("/proc/{runner}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.contains("ORIZU_SESSION_ID="), "{environ}");
    assert!(
        !environ.contains(&secret),
        "the runner's environ holds the boot secret"
    );

    std::fs::write(sb.out().join("go"), "").unwrap();
    sb.end_after_seal("run-1", child).await;
}

/// The processes (pids in the test's namespace) that have `path` open.
fn processes_holding(path: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == path))
        {
            out.push(pid);
        }
    }
    out
}

/// Every file under `dir` with its inode, size and modification time.
fn tree_state(dir: &Path) -> Vec<(std::path::PathBuf, u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            out.push((e.path(), m.ino(), m.len(), m.mtime(), m.mtime_nsec()));
        }
    }
    out.sort();
    out
}

/// A second runner on a root in use: it exits 2 at once, naming the
/// holder's pid, and touches nothing (no request, no file of the first
/// runner's session or run).
async fn a_second_runner_is_refused(sb: &Sandbox, script: &Path, holder_pid: u32) {
    let session = tree_state(&sb.session_dir());
    let run = tree_state(&sb.root().join(".orizu-run"));
    let requests = sb.coordinator.requests().len();
    let second = sb.spawn(script);
    let (status, output) = tokio::time::timeout(Duration::from_secs(10), finish(second))
        .await
        .expect("the second runner on the root was not refused");
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(
        output.contains("configuration error") && output.contains(&format!("pid {holder_pid}")),
        "{output}"
    );
    assert!(
        output.contains(&sb.root().display().to_string()),
        "{output}"
    );
    assert_eq!(tree_state(&sb.session_dir()), session);
    assert_eq!(tree_state(&sb.root().join(".orizu-run")), run);
    let after = sb.coordinator.requests();
    assert!(
        after[requests..]
            .iter()
            .all(|r| r.route == Route::Session || r.route == Target::Dev),
        "the second runner made requests: {:?}",
        after[requests..]
            .iter()
            .map(|r| r.route.name())
            .collect::<Vec<_>>()
    );
    assert_eq!(
        sb.coordinator.snapshot().status_names(),
        vec!["turn_started"]
    );
}

#[tokio::test]
async fn a_second_runner_on_the_same_root_is_refused_and_a_sigkilled_holder_frees_the_root() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
[ -e "$AGENT_OUT/pgid" ] && { echo again; exit 0; }
record_group > "$AGENT_OUT/pgid"
echo '{"type":"message","text":"working"}'
sleep 1000 &
wait
"#,
    );
    let mut first = sb.spawn(&script);
    sb.wait_text("run-1", "working").await;
    let first_pid = first.id().unwrap();
    a_second_runner_is_refused(&sb, &script, first_pid).await;

    // The runner holds the lock; the agent (another program) does not.
    let lock = sb.root().join(".hosted-boot/lock");
    assert_eq!(processes_holding(&lock), vec![first_pid]);
    assert_eq!(
        std::fs::read_to_string(&lock).unwrap(),
        format!("{first_pid}\n")
    );

    // The kernel releases the lock of a SIGKILLed runner: a restart boots.
    signal(first_pid, rustix::process::Signal::KILL);
    first.wait().await.unwrap();
    let restarted = sb.spawn(&script);
    sb.end_after_seal("run-1", restarted).await;
    assert_eq!(sb.coordinator.run("run-1").unwrap().status, "succeeded");
}

#[tokio::test]
async fn under_the_pid_1_reaper_the_worker_holds_the_root_lock() {
    let wrapper = match pid_namespace_wrapper() {
        Ok(w) => w,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
[ -e "$AGENT_OUT/started" ] && exit 0
touch "$AGENT_OUT/started"
echo '{"type":"message","text":"working"}'
sleep 1000
"#,
    );
    let mut cmd = sb.wrapped_command(&wrapper, "run", &script);
    cmd.env(IN_PID_NAMESPACE, "1");
    let mut first = cmd.spawn().unwrap();
    sb.wait_text("run-1", "working").await;
    let reaper = only_child(first.id().unwrap());
    let worker = only_child(reaper);
    let lock = sb.root().join(".hosted-boot/lock");
    assert_eq!(processes_holding(&lock), vec![worker]);
    // The pid the worker has in its namespace (the reaper is 1).
    let inner = std::fs::read_to_string(format!("/proc/{worker}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|l| l.split_whitespace().last().map(str::to_string))
        .unwrap();
    assert_ne!(inner, "1");
    a_second_runner_is_refused(&sb, &script, inner.parse().unwrap()).await;
    // SIGKILL of the worker ends the namespace; the root is free again.
    signal(worker, rustix::process::Signal::KILL);
    first.wait().await.unwrap();
    let restarted = sb.spawn(&script);
    sb.end_after_seal("run-1", restarted).await;
}

/// The agent runs as the runner's user in the root: it can remove (or
/// replace) `.hosted-boot/lock`. A second runner started then must still be
/// refused (PROTOCOL.md 3: one runner per root); it locks a new file of the
/// same name instead and boots on the root in use.
#[tokio::test]
async fn break_a_second_runner_is_refused_after_the_agent_removed_the_lock_file() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
[ -e "$AGENT_OUT/pgid" ] && { echo again; exit 0; }
record_group > "$AGENT_OUT/pgid"
rm -f ../.hosted-boot/lock
echo '{"type":"message","text":"working"}'
sleep 1000 &
wait
"#,
    );
    let first = sb.spawn(&script);
    sb.wait_text("run-1", "working").await;
    assert!(!sb.root().join(".hosted-boot/lock").exists());
    let first_pid = first.id().unwrap();
    a_second_runner_is_refused(&sb, &script, first_pid).await;
}

/// The agent edits a tracked file and then switches to an orphan branch
/// (`git checkout --orphan`: the work tree and index are kept, `HEAD` is
/// unborn). The runner dies (SIGKILL); its restart reuses `repo/`, whose
/// unborn `HEAD` makes it check the session branch out by force over the
/// agent's edit before anything harvests it (PROTOCOL.md 3: a reused
/// `repo/` is harvested first, never cloned over).
#[tokio::test]
async fn break_a_restart_keeps_the_work_of_a_repo_with_an_unborn_head() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
[ -e "$AGENT_OUT/pgid" ] && { echo again; exit 0; }
record_group > "$AGENT_OUT/pgid"
echo 'the agent edit' >> README.md
git checkout -q --orphan scratch
echo '{"type":"message","text":"working"}'
sleep 1000 &
wait
"#,
    );
    let mut first = sb.spawn(&script);
    sb.wait_text("run-1", "working").await;
    signal(first.id().unwrap(), rustix::process::Signal::KILL);
    first.wait().await.unwrap();
    let restarted = sb.spawn(&script);
    sb.end_after_seal("run-1", restarted).await;
    let in_tree = std::fs::read_to_string(sb.root().join("repo/README.md")).unwrap_or_default();
    let on_remote = std::process::Command::new("git")
        .arg("-C")
        .arg(sb.coordinator.bare_repo())
        .args(["log", "--all", "-p"])
        .output()
        .unwrap();
    let on_remote = String::from_utf8_lossy(&on_remote.stdout);
    assert!(
        in_tree.contains("the agent edit") || on_remote.contains("the agent edit"),
        "the agent's edit is gone: README.md is now {in_tree:?}"
    );
}

/// Break: nothing watches the turn's guard. An agent that kills it (here
/// by pid; `pkill -9 -f hosted-boot` does the same, and may take the
/// runner with it) leaves nothing to act on the runner's death: after a
/// SIGKILL of the runner the leader dies of `PR_SET_PDEATHSIG`, but the rest
/// of its group (never left the session or group) lives on, against "If
/// the runner itself dies, the program's session, process group and cgroup
/// die with it" (README, PROTOCOL.md 4.1).
#[tokio::test]
async fn break_an_agent_that_kills_its_guard_outlives_a_sigkilled_runner() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
record_group > "$AGENT_OUT/pgid"
sleep 1000 &
for p in /proc/[0-9]*; do
  sid=$(cut -d' ' -f6 "$p/stat" 2>/dev/null)
  if [ "$sid" = "$$" ] && tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -q turn-guard; then
    kill -9 "${p#/proc/}" && echo "${p#/proc/}" > "$AGENT_OUT/guard"
  fi
done
echo '{"type":"message","text":"working"}'
wait
"#,
    );
    let mut child = sb.spawn(&script);
    // Waits for the guard's kill, not for "working": a runner that watches
    // its guard kills the turn (and seals the run) before the agent gets
    // there, maybe before it records the guard's pid.
    wait_guard_killed(&sb).await;
    let group = sb.read_group("pgid");
    tokio::time::sleep(Duration::from_millis(200)).await;
    signal(child.id().unwrap(), rustix::process::Signal::KILL);
    child.wait().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let left = group.live_members().len();
    // Clean up before asserting, so a failure leaves nothing behind.
    kill_group(&group);
    assert_eq!(
        left, 0,
        "processes of the agent's group outlived the runner"
    );
}

/// Waits (bounded) until the agent recorded the guard it killed, or the
/// run was sealed.
async fn wait_guard_killed(sb: &Sandbox) {
    let deadline = Instant::now() + WAIT;
    while sb.read_out("guard").trim().is_empty()
        && sb
            .coordinator
            .run("run-1")
            .is_none_or(|r| r.finish.is_none())
    {
        assert!(
            Instant::now() < deadline,
            "the agent never killed its guard"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Fail closed (PROTOCOL.md 4.1 step 4): when the turn's guard dies before
/// the turn ends, the runner kills every process of the turn at once (no
/// runner death needed), logs the guard's pid, and fails the turn with
/// `runner_error` (fatal, as every failed turn).
#[tokio::test]
async fn an_agent_that_kills_its_guard_fails_the_turn_with_runner_error() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
record_group > "$AGENT_OUT/pgid"
sleep 1000 &
for p in /proc/[0-9]*; do
  sid=$(cut -d' ' -f6 "$p/stat" 2>/dev/null)
  if [ "$sid" = "$$" ] && tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -q turn-guard; then
    echo "${p#/proc/}" > "$AGENT_OUT/guard" && kill -9 "${p#/proc/}"
  fi
done
wait
echo '{"type":"message","text":"never"}'
"#,
    );
    let child = sb.spawn(&script);
    let snap = sb.wait_sealed("run-1").await;
    let guard = sb.read_out("guard").trim().to_string();
    assert!(!guard.is_empty(), "no guard found");
    let group = sb.read_group("pgid");
    let left = group.live_members().len();
    kill_group(&group);
    assert_eq!(left, 0, "processes of the turn outlived its guard");
    let run = snap.run("run-1").unwrap();
    assert_eq!(run.status, "failed");
    assert!(!run.events.iter().any(|e| e.data["text"] == "never"));
    assert_eq!(error_code(&sb, "run-1"), json!("runner_error"));
    let message = &run.finish.as_ref().unwrap().error.as_ref().unwrap().message;
    assert!(message.contains("turn guard"), "{message}");
    // A failed turn is fatal (PROTOCOL.md 4.1 step 7).
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(
        output
            .lines()
            .any(|l| l.contains("guard died") && l.contains(&format!("\"guard_pid\":{guard}"))),
        "{output}"
    );
}

/// Issue 30: the orphan check identifies an agent's group by its id and its
/// leader's start time. After pids wrap, an unrelated group leader that
/// holds a recorded id (here: a live leader recorded as if an older
/// process had held the id before it) is not an orphan; a real survivor
/// still is, with its leader alive or gone.
#[tokio::test]
async fn the_orphan_check_tells_a_reused_group_id_from_a_survivor() {
    use super::support::{Group, Process};
    use hosted_boot::process::tree::{read_proc, scan};

    // A group whose leader lives.
    let mut leader = tokio::process::Command::new("sleep")
        .arg("1000")
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = leader.id().unwrap() as i32;
    let start = read_proc(pid).unwrap().start_time;
    // What a pgid-only check sees: a live process in group `pid`.
    assert!(scan().iter().any(|p| p.pgid == pid && !p.zombie));
    let this_one = Group::recorded(&format!("{pid} {start}"));
    assert_eq!(
        this_one.live_members(),
        vec![pid],
        "a live leader is a survivor"
    );
    // The same id recorded for an earlier process (its start time before
    // this one's): the number was reused, so that group had emptied.
    let earlier = Group::recorded(&format!("{pid} {}", start - 1));
    assert_eq!(earlier.live_members(), Vec::<i32>::new(), "a reused id");
    assert_eq!(
        Group::of_exited_leader(pid).live_members(),
        Vec::<i32>::new()
    );
    leader.kill().await.unwrap();
    leader.wait().await.unwrap();

    // A group whose leader is gone, with a member left: a survivor.
    let out = tokio::process::Command::new("sh")
        .args([
            "-c",
            r#"echo "$$ $(cut -d' ' -f22 /proc/$$/stat)"; sleep 1000 > /dev/null 2>&1 & echo "$!""#,
        ])
        .process_group(0)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let group = Group::recorded(lines.next().unwrap());
    let member: i32 = lines.next().unwrap().parse().unwrap();
    let left = group.live_members();
    kill_group(&group);
    assert_eq!(left, vec![member], "a member outliving its leader");
    assert!(!Process::recorded(&format!("{pid} {start}")).alive());
    assert_groups_empty(&[group]);
}

/// Issue 40, item 3: `finish.resources` says what the agent's processes
/// used. The agent's shell waits for a child that touches 96 MiB and burns
/// half a second of CPU: both are counted (the leader's `rusage` covers
/// the children it waited for; a turn cgroup with its controllers, where
/// the machine gives one, covers them too).
#[tokio::test]
async fn finish_reports_what_the_agents_processes_used() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
python3 -c '
import time
b = bytearray(96 * 1024 * 1024)
for i in range(0, len(b), 4096):
    b[i] = 1
t = time.process_time()
while time.process_time() - t < 0.5:
    pass
'
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = sb.spawn(&script);
    sb.end_after_seal("run-1", child).await;
    let run = sb.coordinator.run("run-1").unwrap();
    assert_eq!(run.status, "succeeded");
    let resources = run
        .finish
        .as_ref()
        .and_then(|f| f.resources.clone())
        .expect("finish.resources");
    assert!(
        (0.45..60.0).contains(&resources.cpu_seconds),
        "{resources:?}"
    );
    assert!(
        (96 << 20..4 << 30).contains(&resources.peak_rss_bytes),
        "{resources:?}"
    );
    // No cgroup controllers on CI's machines: the rusage path.
    if !std::path::Path::new("/sys/fs/cgroup/cgroup.subtree_control").exists() {
        assert_eq!(resources.source, hosted_boot::wire::ResourceSource::Rusage);
    }
}
