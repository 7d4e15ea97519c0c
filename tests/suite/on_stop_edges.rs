//! The edges of the on-stop hook (issue 41 item 4, PROTOCOL.md 4.7 and
//! 4.4): a reviewer's probes, as an attacker (secrets the hook could reach,
//! daemons, output that tries the redaction) and of the stop budget, kept
//! as regression tests; each asserts a promise.

use std::time::{Duration, Instant};

use hosted_boot_coordinator::{CoordinatorOptions, Fault, Route};

use super::support::{
    Process, RECORD_GROUP, RECORD_PROCESS, Runner, Sandbox, assert_no_secret, signal, wait_for_file,
};

/// A quick agent: one event, exit 0. It also keeps the turn's proxy token
/// (and bearer, in bearer mode) so that the probes can look for it later.
const QUICK: &str = r#"cat "$ORIZU_TOKEN_FILE" > "$AGENT_OUT/agent-token" 2>/dev/null
echo '{"type":"message","text":"done"}'"#;

const KEY: &str = "probe-connector-secret-9f3a1c77";

/// Hook prologue: records its group (the sandbox checks it is empty at
/// the end) and marks its start; then `body`.
fn hook(body: &str) -> String {
    format!(
        r#"{RECORD_PROCESS}
{RECORD_GROUP} >> "$AGENT_OUT/.agent-pgids"
touch "$AGENT_OUT/on-stop-started"
{body}
"#
    )
}

fn runner_with(sb: &Sandbox, agent: &str, body: &str, extra: &[(&str, &str)]) -> Runner {
    let mut cmd = sb.runner(&sb.script(agent));
    cmd.env("HOSTED_BOOT_ON_STOP_SCRIPT", hook(body))
        .env("HOSTED_BOOT_ON_STOP_TIMEOUT", "10m");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    Runner::reading(cmd.spawn().unwrap())
}

fn record(sb: &Sandbox) -> Option<hosted_boot::status::OnStop> {
    hosted_boot::status::read(&sb.root()).unwrap().on_stop
}

/// What the hook dumps of everything it can reach: its environment, the
/// runner's /proc entries, its inherited descriptors, git's configuration
/// and a `git credential fill` for the remote, every file under the root
/// (but git's objects), and the home's git credential files.
const DUMP: &str = r#"o="$AGENT_OUT/dump"
mkdir -p "$o"
env > "$o/env"
cat /proc/$PPID/environ > "$o/ppid-environ" 2>&1
tr '\0' ' ' < /proc/$PPID/cmdline > "$o/ppid-cmdline" 2>&1
head -c 100 /proc/$PPID/mem > /dev/null 2>&1; echo "mem=$?" > "$o/ppid-mem"
ls -l /proc/$$/fd > "$o/fds" 2>&1
cat /proc/net/unix > "$o/unix" 2>&1
git config --list --show-origin > "$o/git-config" 2>&1
url=$(git remote get-url origin 2>/dev/null)
printf 'url=%s\n\n' "$url" | timeout 10 git credential fill > "$o/cred-fill" 2>&1
echo "fill=$?" >> "$o/cred-fill"
root=$(cd .. && pwd)
[ -d .git ] || root=$(pwd)
find "$root" -xdev -path '*/.git/objects' -prune -o -type f -print > "$o/file-list" 2>&1
find "$root" -xdev -path '*/.git/objects' -prune -o -type f -exec cat {} + > "$o/files" 2>&1
find "$root" -xdev -type s > "$o/sockets" 2>&1
cat "$HOME/.git-credentials" "$HOME/.gitconfig" "$HOME/.config/git/credentials" > "$o/home-creds" 2>&1
echo done > "$o/done"
"#;

/// Every secret the runner holds that the hook must not reach: what the
/// coordinator issued, and the token the turn's agent was given.
fn all_secrets(sb: &Sandbox) -> Vec<String> {
    let mut s = sb.secrets(&[]);
    let token = sb.read_out("agent-token").trim().to_string();
    if token.len() >= 8 {
        s.push(token);
    }
    s
}

fn assert_dump_clean(sb: &Sandbox, output: &str) {
    assert_eq!(
        sb.read_out("dump/done").trim(),
        "done",
        "the dump did not finish: {output}"
    );
    let secrets = all_secrets(sb);
    for name in [
        "env",
        "ppid-environ",
        "ppid-cmdline",
        "fds",
        "git-config",
        "cred-fill",
        "files",
        "home-creds",
    ] {
        let text = std::fs::read(sb.out().join("dump").join(name)).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        assert_no_secret(&format!("the hook's dump {name}"), &text, &secrets);
    }
    let fill = sb.read_out("dump/cred-fill");
    assert!(
        !fill.contains("password="),
        "git credential fill in repo/ gave the hook a password: {fill}"
    );
    let sockets = sb.read_out("dump/sockets");
    assert!(
        !sockets.contains(".orizu-session"),
        "a socket of the session directory is still there: {sockets}"
    );
}

/// Same uid, broker + proxy (the defaults): nothing the hook can reach
/// holds a secret.
#[tokio::test]
async fn probe_same_uid_hook_reaches_no_secret() {
    let sb = Sandbox::with_connectors(&[("HOOK_KEY", KEY)]).await;
    let runner = runner_with(&sb, QUICK, DUMP, &[]);
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_dump_clean(&sb, &output);
    eprintln!("fds: {}", sb.read_out("dump/fds"));
    eprintln!("cred-fill: {}", sb.read_out("dump/cred-fill"));
    eprintln!("ppid-mem: {}", sb.read_out("dump/ppid-mem"));
    eprintln!("file-list: {}", sb.read_out("dump/file-list"));
}

/// Same uid, file mode and the bearer API (the most exposing modes): the
/// session directory held the boot secret and the bearer; nothing is left.
#[tokio::test]
async fn probe_file_mode_bearer_api_hook_reaches_no_secret() {
    let sb = Sandbox::with_connectors(&[("HOOK_KEY", KEY)]).await;
    let runner = runner_with(
        &sb,
        QUICK,
        DUMP,
        &[
            ("HOSTED_BOOT_CREDENTIAL_MODE", "file"),
            ("HOSTED_BOOT_AGENT_API", "bearer"),
        ],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_dump_clean(&sb, &output);
    eprintln!("cred-fill: {}", sb.read_out("dump/cred-fill"));
    eprintln!("file-list: {}", sb.read_out("dump/file-list"));
}

/// As the agent user, file mode: nothing is left either.
#[tokio::test]
async fn probe_agent_user_file_mode_hook_reaches_no_secret() {
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
        .env("HOSTED_BOOT_CREDENTIAL_MODE", "file")
        .env("HOSTED_BOOT_ON_STOP_SCRIPT", hook(DUMP))
        .env("HOSTED_BOOT_ON_STOP_TIMEOUT", "10m")
        .spawn()
        .unwrap();
    let runner = Runner::reading(child);
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_dump_clean(&sb, &output);
    eprintln!("ppid-environ: {}", sb.read_out("dump/ppid-environ"));
    eprintln!("cred-fill: {}", sb.read_out("dump/cred-fill"));
}

/// The hook's output, redacted in the runner's log in every shape: a
/// secret at the end without a newline, in binary output, in a JSON
/// string with escapes, straddling the 1000-character cut and the 1 MiB
/// line cut, in a line of 200 KiB.
#[tokio::test]
async fn probe_hook_output_redaction_edges() {
    let sb = Sandbox::with_connectors(&[("HOOK_KEY", KEY)]).await;
    let runner = runner_with(
        &sb,
        QUICK,
        r#"printf 'bin \000\377\001 %s \002\n' "$HOOK_KEY"
esc=$(printf '%s' "$HOOK_KEY" | sed 's/-/\\u002d/g')
printf '{"k":"%s"}\n' "$esc"
printf '"%s"\n' "$esc"
x=$(head -c 995 /dev/zero | tr '\0' x)
printf '%s%s\n' "$x" "$HOOK_KEY"
# a line of 1 MiB + 10 bytes whose secret straddles the 1 MiB cut
big=$(head -c 1048566 /dev/zero | tr '\0' y)
printf '%s%s\n' "$big" "$HOOK_KEY"
# a line of 200 KiB with the secret in the middle
mid=$(head -c 100000 /dev/zero | tr '\0' z)
printf '%s%s%s\n' "$mid" "$HOOK_KEY" "$mid"
printf 'tail without newline %s' "$HOOK_KEY"
"#,
        &[],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let lines: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("on-stop hook output"))
        .collect();
    let logged = lines.join("\n");
    eprintln!(
        "{}",
        lines
            .iter()
            .map(|l| hosted_boot::text::clip(l, 300))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_no_secret("the runner's log", &output, &sb.secrets(&[KEY]));
    // No piece of it either (16 characters or more), nor its JSON escape.
    for start in 0..KEY.len() - 16 {
        let piece = &KEY[start..start + 16];
        assert!(
            !output.contains(piece),
            "a 16-character piece of the secret is in the log: {piece}"
        );
    }
    assert!(
        !logged.contains("probe\\\\u002dconnector"),
        "the JSON-escaped secret is in the log: {logged}"
    );
    assert!(
        logged.contains("tail without newline [REDACTED]"),
        "the last line without a newline is not logged redacted: {logged}"
    );
}

/// A hook that daemonizes (double fork, setsid, SIGTERM and SIGHUP
/// ignored), forks a hundred children that hold its stdout open, and
/// exits 0 at once: the runner does not wait on the pipe, exits promptly,
/// and nothing of the hook is left.
#[tokio::test]
async fn probe_daemonizing_hook_leaves_nothing_and_does_not_hang() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with(
        &sb,
        QUICK,
        r#"( setsid sh -c 'trap "" TERM HUP INT; sleep 1000 & echo "$! $(sed "s/.*) //" /proc/$!/stat | cut -d" " -f20)" > "$AGENT_OUT/daemon.tmp"; mv "$AGENT_OUT/daemon.tmp" "$AGENT_OUT/daemon"; wait' & ) 
i=0; while [ $i -lt 100 ]; do i=$((i+1)); sleep 1000 & done
record_process $! > "$AGENT_OUT/last-child"
while [ ! -e "$AGENT_OUT/daemon" ]; do sleep 0.05; done
echo "bye"
exit 0"#,
        &[],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    wait_for_file(&sb.out().join("on-stop-started")).await;
    let started = Instant::now();
    let (status, output) = runner.finish().await;
    let took = started.elapsed();
    assert_eq!(status.code(), Some(0), "{output}");
    for name in ["daemon", "last-child"] {
        let p = Process::recorded(&sb.read_out(name));
        assert!(!p.alive(), "the hook's {name} outlived the runner");
    }
    let rec = record(&sb).unwrap();
    assert_eq!(rec.exit_code, Some(0), "{rec:?}");
    assert!(took < Duration::from_secs(8), "the runner took {took:?}");
    eprintln!("took {took:?}; record {rec:?}");
}

/// The same as the agent user.
#[tokio::test]
async fn probe_agent_user_daemonizing_hook_leaves_nothing() {
    let user = match super::agent_user::TestUser::create() {
        Ok(u) => u,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = super::agent_user::sandbox_for(&user).await;
    let body = r#"( setsid sh -c 'trap "" TERM HUP INT; sleep 1000 & echo "$! $(sed "s/.*) //" /proc/$!/stat | cut -d" " -f20)" > "$AGENT_OUT/daemon.tmp"; mv "$AGENT_OUT/daemon.tmp" "$AGENT_OUT/daemon"; wait' & )
while [ ! -e "$AGENT_OUT/daemon" ]; do sleep 0.05; done
exit 0"#;
    let child = sb
        .wrapped_command(&["env"], "run", &sb.script(QUICK))
        .env("HOSTED_BOOT_AGENT_USER", &user.name)
        .env("HOSTED_BOOT_ON_STOP_SCRIPT", hook(body))
        .env("HOSTED_BOOT_ON_STOP_TIMEOUT", "10m")
        .spawn()
        .unwrap();
    let runner = Runner::reading(child);
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let p = Process::recorded(&sb.read_out("daemon"));
    assert!(!p.alive(), "the agent user's daemon outlived the runner");
}

/// A huge `--on-stop-timeout` panicked the runner (found by a review): a
/// configuration error now, exit 2, nothing posted.
#[tokio::test]
async fn probe_huge_on_stop_timeout() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with(
        &sb,
        QUICK,
        "true",
        &[
            ("HOSTED_BOOT_ON_STOP_TIMEOUT", "18446744073709551615s"),
            ("HOSTED_BOOT_TEST_TIME_SCALE", "1"),
        ],
    );
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(output.contains("longer than 24h"), "{output}");
    assert!(sb.coordinator.snapshot().status_names().is_empty());
}

/// A stop signal while the hook runs at a session's end: the hook is
/// killed at the budget's end, and `complete` (still posted) must not take
/// the runner past the budget either (PROTOCOL 4.4: "never takes the runner
/// past the budget"). The coordinator is slow to answer `complete`.
#[tokio::test]
async fn probe_stop_during_hook_then_complete_runs_past_the_budget() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with(
        &sb,
        QUICK,
        "sleep 1000 & wait",
        // Scaled by 0.05: a 2 s budget.
        &[("HOSTED_BOOT_STOP_BUDGET", "40s")],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    wait_for_file(&sb.out().join("on-stop-started")).await;
    sb.coordinator
        .add_fault(Fault::delay(Route::BootStatus, Duration::from_secs(20)))
        .unwrap();
    signal(runner.pid(), rustix::process::Signal::TERM);
    let signalled = Instant::now();
    let (status, output) = runner.finish().await;
    let took = signalled.elapsed();
    eprintln!(
        "exit {:?} {took:?} after the signal; record {:?}",
        status.code(),
        record(&sb)
    );
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(
        took < Duration::from_millis(3000),
        "a 2 s stop budget, and the runner exited {took:?} after the signal"
    );
}

/// The same with a failed turn: the hook takes the budget, then the fatal
/// report (`turn_failed`, a required acknowledgement with retries) runs
/// on past it.
#[tokio::test]
async fn probe_stop_during_hook_then_turn_failed_runs_past_the_budget() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with(
        &sb,
        "exit 1",
        "sleep 1000 & wait",
        &[("HOSTED_BOOT_STOP_BUDGET", "40s")],
    );
    wait_for_file(&sb.out().join("on-stop-started")).await;
    sb.coordinator
        .add_fault(Fault::delay(Route::BootStatus, Duration::from_secs(20)).times(10))
        .unwrap();
    signal(runner.pid(), rustix::process::Signal::TERM);
    let signalled = Instant::now();
    let (status, output) = runner.finish().await;
    let took = signalled.elapsed();
    eprintln!(
        "exit {:?} {took:?} after the signal; record {:?}; statuses {:?}",
        status.code(),
        record(&sb),
        sb.coordinator
            .requests()
            .iter()
            .filter(|r| r.route == Route::BootStatus)
            .count()
    );
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(
        took < Duration::from_millis(3000),
        "a 2 s stop budget, and the runner exited {took:?} after the signal"
    );
}

/// A stop during a turn: the runner's own steps, then the hook in what is
/// left; the whole stop within the budget (3 s scaled), the hook started.
#[tokio::test]
async fn probe_stop_during_turn_whole_stop_within_budget() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with(
        &sb,
        r#"echo '{"type":"message","text":"working"}'
sleep 1000"#,
        "sleep 1000 & wait",
        &[("HOSTED_BOOT_STOP_BUDGET", "60s")],
    );
    sb.wait_text("run-1", "working").await;
    signal(runner.pid(), rustix::process::Signal::TERM);
    let signalled = Instant::now();
    let (status, output) = runner.finish().await;
    let took = signalled.elapsed();
    let rec = record(&sb);
    eprintln!("took {took:?}; record {rec:?}");
    assert_eq!(status.code(), Some(143), "{output}");
    assert!(
        took < Duration::from_millis(3800),
        "a 3 s budget; exited {took:?} after the signal"
    );
    let rec = rec.unwrap();
    assert!(rec.timed_out, "{rec:?}");
}

/// A script path that does not exist: recorded, nothing else changes.
#[tokio::test]
async fn probe_missing_script() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let mut cmd = sb.runner(&sb.script(QUICK));
    cmd.env("HOSTED_BOOT_ON_STOP_SCRIPT", "/nonexistent/on-stop.sh");
    let runner = Runner::reading(cmd.spawn().unwrap());
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let rec = record(&sb).unwrap();
    eprintln!("{rec:?}");
    assert_eq!(rec.exit_code, Some(127), "{rec:?}");
    assert_eq!(
        sb.coordinator.snapshot().status_names(),
        ["turn_started", "turn_completed", "complete"]
    );
}

/// A failed boot (no session branch): the hook runs before `failed`.
#[tokio::test]
async fn probe_failed_boot_hook_runs_before_failed() {
    let sb = Sandbox::start(CoordinatorOptions {
        create_branch: false,
        ..CoordinatorOptions::default()
    })
    .await;
    let runner = runner_with(
        &sb,
        QUICK,
        r#"pwd > "$AGENT_OUT/cwd"; echo "$ORIZU_BOOT_ENDING" > "$AGENT_OUT/ending"; sleep 1"#,
        &[],
    );
    wait_for_file(&sb.out().join("on-stop-started")).await;
    let at_start = sb.coordinator.snapshot().status_names();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(1), "{output}");
    assert!(!at_start.contains(&"failed"), "{at_start:?}");
    assert_eq!(sb.read_out("ending").trim(), "failed");
    eprintln!("cwd {}", sb.read_out("cwd"));
    assert_eq!(sb.coordinator.snapshot().status_names(), ["failed"]);
}

/// Text logs: the hook's output (which may carry a repository's text) must
/// not write raw control characters to the operator's terminal.
#[tokio::test]
async fn probe_text_log_escapes_control_characters() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with(
        &sb,
        QUICK,
        r#"printf 'before\033[2J\033]0;pwned\007\rafter\n'"#,
        &[("HOSTED_BOOT_LOG_FORMAT", "text")],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let line = output
        .lines()
        .find(|l| l.contains("on-stop hook output"))
        .unwrap_or("")
        .to_string();
    eprintln!("{line:?}");
    assert!(
        !line.contains('\u{1b}') && !line.contains('\r') && !line.contains('\u{7}'),
        "raw control characters in the text log: {line:?}"
    );
}

/// Same uid, no cgroup: a hook that leaves a loop which re-forks and calls
/// setsid every generation. The runner must exit promptly and leave
/// nothing behind. (The loop ends itself after 20 s, and the test kills
/// what it finds, so that a failure leaves nothing running.)
#[tokio::test]
async fn probe_same_uid_setsid_refork_loop_with_cgroup() {
    refork_loop("auto").await;
}

/// The same with `--turn-cgroup off`: the `/proc` sweep alone.
#[tokio::test]
async fn probe_same_uid_setsid_refork_loop_without_cgroup() {
    refork_loop("off").await;
}

async fn refork_loop(cgroup: &str) {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let marker = format!("PROBE_LOOP_{}", std::process::id());
    let runner = runner_with(
        &sb,
        QUICK,
        &format!(
            r#"end=$(( $(date +%s) + 20 ))
cat > "$AGENT_OUT/loop.sh" <<'EOF'
[ "$(date +%s)" -lt "$1" ] || exit 0
echo x >> "$AGENT_OUT/gens"
setsid sh "$0" "$1" &
exit 0
EOF
{marker}=1 sh "$AGENT_OUT/loop.sh" "$end" &
sleep 0.5
exit 0"#
        ),
        &[("HOSTED_BOOT_TURN_CGROUP", cgroup)],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    wait_for_file(&sb.out().join("on-stop-started")).await;
    let started = Instant::now();
    let (status, output) = runner.finish().await;
    let took = started.elapsed();
    // Processes whose environment holds the marker (the loop's).
    let survivors = || -> Vec<i32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
                    env.windows(marker.len() + 2)
                        .any(|w| w == format!("{marker}=1").as_bytes())
                })
            })
            .collect()
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let left = survivors();
    // Clean up whatever is left, for 25 s at most.
    let deadline = Instant::now() + Duration::from_secs(25);
    while Instant::now() < deadline {
        let now = survivors();
        if now.is_empty() {
            break;
        }
        for pid in now {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(pid).unwrap(),
                rustix::process::Signal::KILL,
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let gens = sb.read_out("gens").lines().count();
    tokio::time::sleep(Duration::from_millis(500)).await;
    eprintln!(
        "generations {gens}, then {}",
        sb.read_out("gens").lines().count()
    );
    eprintln!(
        "took {took:?}; survivors {left:?}; record {:?}; swept lines: {}",
        record(&sb),
        output
            .lines()
            .filter(|l| l.contains("sweep") || l.contains("left behind"))
            .map(|l| hosted_boot::text::clip(l, 300))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(
        left.is_empty(),
        "the hook's loop outlived the runner: {left:?}"
    );
}

const SETUP_KEY: &str = "probe-setup-only-secret-51d2e8";

/// A setup-only connector (`"scope": "setup"`) is not in the hook's
/// environment; a checkpoint notice the hook sends (same uid) during it
/// pushes nothing and changes nothing.
#[tokio::test]
async fn probe_setup_connector_and_checkpoint_notice_during_hook() {
    let sb = Sandbox::start(CoordinatorOptions {
        connectors: vec![("HOOK_KEY".into(), KEY.into())],
        setup_connectors: vec![("SETUP_KEY".into(), SETUP_KEY.into())],
        ..CoordinatorOptions::default()
    })
    .await;
    let runner = runner_with(
        &sb,
        QUICK,
        r#"env > "$AGENT_OUT/hook-env"
echo "uncommitted by the hook" > hook-file.txt
kill -USR1 $PPID; sleep 0.3; kill -USR2 $PPID; sleep 0.5"#,
        &[],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");
    let env = sb.read_out("hook-env");
    assert!(env.contains(KEY), "no agent connector in the hook's env");
    assert!(
        !env.contains(SETUP_KEY),
        "a setup-only connector in the hook's env"
    );
    let branches = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(sb.coordinator.bare_repo())
        .args(["for-each-ref", "--format=%(refname)"])
        .output()
        .unwrap();
    let branches = String::from_utf8_lossy(&branches.stdout).into_owned();
    eprintln!("branches: {branches}");
    assert!(
        !branches.contains("recovered-checkpoint"),
        "a checkpoint was pushed during the hook: {branches}"
    );
    assert_eq!(
        sb.coordinator.snapshot().status_names(),
        ["turn_started", "turn_completed", "complete"]
    );
}

/// As the agent user: the agent makes `repo/` unreadable to itself at the
/// end of its turn (it owns it). Does the operator's hook still run?
#[tokio::test]
async fn probe_agent_user_agent_locks_repo_so_the_hook_cannot_start() {
    let user = match super::agent_user::TestUser::create() {
        Ok(u) => u,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = super::agent_user::sandbox_for(&user).await;
    let agent = r#"echo '{"type":"message","text":"done"}'
chmod 000 ."#;
    let child = sb
        .wrapped_command(&["env"], "run", &sb.script(agent))
        .env("HOSTED_BOOT_AGENT_USER", &user.name)
        .env(
            "HOSTED_BOOT_ON_STOP_SCRIPT",
            hook("pwd > \"$AGENT_OUT/cwd\""),
        )
        .env("HOSTED_BOOT_ON_STOP_TIMEOUT", "10m")
        .spawn()
        .unwrap();
    let runner = Runner::reading(child);
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    let rec = record(&sb);
    eprintln!(
        "exit {:?}; record {rec:?}; statuses {:?}; run {:?}",
        status.code(),
        sb.coordinator.snapshot().status_names(),
        sb.coordinator
            .snapshot()
            .run("run-1")
            .map(|r| r.status.clone())
    );
    assert_eq!(status.code(), Some(0), "{output}");
    assert!(
        sb.out().join("on-stop-started").exists(),
        "the agent kept the operator's hook from running: {rec:?}"
    );
}

/// The runner is SIGKILLed (the orchestrator's grace period ran out)
/// while the hook runs: nothing of the hook outlives it, not even a child
/// that left its session. With and without a cgroup.
async fn killed_runner(cgroup: &str) {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with(
        &sb,
        QUICK,
        r#"sleep 1000 &
record_process $! > "$AGENT_OUT/child.tmp"; mv "$AGENT_OUT/child.tmp" "$AGENT_OUT/child"
setsid sleep 1000 &
record_process $! > "$AGENT_OUT/daemon.tmp"; mv "$AGENT_OUT/daemon.tmp" "$AGENT_OUT/daemon"
touch "$AGENT_OUT/ready"
wait"#,
        &[("HOSTED_BOOT_TURN_CGROUP", cgroup)],
    );
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    wait_for_file(&sb.out().join("ready")).await;
    signal(runner.pid(), rustix::process::Signal::KILL);
    let _ = runner.finish().await;
    let deadline = Instant::now() + Duration::from_secs(3);
    let procs = ["child", "daemon"].map(|n| (n, Process::recorded(&sb.read_out(n))));
    loop {
        let alive: Vec<&str> = procs
            .iter()
            .filter(|(_, p)| p.alive())
            .map(|(n, _)| *n)
            .collect();
        if alive.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            for (_, p) in &procs {
                if p.alive() {
                    let _ = rustix::process::kill_process(
                        rustix::process::Pid::from_raw(p.pid).unwrap(),
                        rustix::process::Signal::KILL,
                    );
                }
            }
            panic!("the hook's {alive:?} outlived the SIGKILLed runner (cgroup {cgroup})");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn probe_runner_killed_during_hook_with_cgroup() {
    killed_runner("auto").await;
}

/// A stop budget already spent by the runner's own steps: the hook does
/// not start, and that is recorded; the runner still exits near the
/// budget.
#[tokio::test]
async fn probe_budget_spent_before_the_hook() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with(
        &sb,
        r#"trap '' INT TERM
echo '{"type":"message","text":"working"}'
while :; do sleep 0.05; done"#,
        "touch \"$AGENT_OUT/hook-ran\"",
        // Scaled by 0.05: a 250 ms budget, shorter than the agent's
        // 250 ms stop grace plus the harvest.
        &[("HOSTED_BOOT_STOP_BUDGET", "5s")],
    );
    sb.wait_text("run-1", "working").await;
    signal(runner.pid(), rustix::process::Signal::TERM);
    let signalled = Instant::now();
    let (status, output) = runner.finish().await;
    let took = signalled.elapsed();
    let rec = record(&sb);
    eprintln!("took {took:?}; record {rec:?}");
    assert_eq!(status.code(), Some(143), "{output}");
    let rec = rec.expect("no onStop recorded");
    assert!(rec.result.starts_with("skipped"), "{rec:?}");
    assert!(!sb.out().join("hook-ran").exists());
}

/// A huge `--stop-budget` (accepted) and a stop between turns: with a hook
/// set, `budget_deadline` adds it to an Instant.
#[tokio::test]
async fn probe_huge_stop_budget_stop_between_turns() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = runner_with(
        &sb,
        QUICK,
        "true",
        &[
            ("HOSTED_BOOT_STOP_BUDGET", "18446744073709551615s"),
            ("HOSTED_BOOT_TEST_TIME_SCALE", "1"),
        ],
    );
    sb.wait_sealed("run-1").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(runner.pid(), rustix::process::Signal::TERM);
    let (status, output) = runner.finish().await;
    let panic: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("panicked") || l.contains("overflow"))
        .collect();
    eprintln!(
        "exit {:?}; {panic:?}; record {:?}",
        status.code(),
        record(&sb)
    );
    assert_eq!(status.code(), Some(143), "{panic:?}");
}

/// Baseline: the same without a hook.
#[tokio::test]
async fn baseline_huge_stop_budget_stop_between_turns_without_hook() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let mut cmd = sb.runner(&sb.script(QUICK));
    cmd.env("HOSTED_BOOT_STOP_BUDGET", "18446744073709551615s")
        .env("HOSTED_BOOT_TEST_TIME_SCALE", "1");
    let runner = Runner::reading(cmd.spawn().unwrap());
    sb.wait_sealed("run-1").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal(runner.pid(), rustix::process::Signal::TERM);
    let (status, output) = runner.finish().await;
    let panic: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("panicked") || l.contains("overflow"))
        .collect();
    eprintln!("exit {:?}; {panic:?}", status.code());
    assert_eq!(status.code(), Some(143), "{panic:?}");
}
