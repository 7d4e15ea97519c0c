//! The turn supervisor on real processes, through `hosted-boot supervise`
//! (the supervisor exactly as a turn runs it, without a coordinator, so
//! that many runs stay fast): the drain bound, the sweep of processes that
//! left the group (with and without a cgroup), the grace period, the time
//! cap, spawn failures, and exact statuses under the PID 1 reaper.
//! After every test: no process of an agent's group remains and the test
//! process keeps no zombie child.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

use super::processes::{TTY_AGENT, assert_no_terminal};
use super::support::{
    Group, Process, Pty, RECORD_PROCESS, WAIT, assert_groups_empty, assert_no_zombie_children,
    pid_namespace_wrapper,
};

/// What one `hosted-boot supervise` invocation printed.
struct Supervised {
    /// The pid of `hosted-boot supervise` (or of its wrapper).
    pid: u32,
    status: ExitStatus,
    lines: Vec<Value>,
    stderr: String,
    elapsed: Duration,
}

impl Supervised {
    fn exits(&self) -> Vec<&Value> {
        self.lines
            .iter()
            .filter(|l| l["type"] == "exit" || l["type"] == "spawn_failed")
            .collect()
    }

    fn exit(&self) -> &Value {
        let exits = self.exits();
        assert_eq!(exits.len(), 1, "{:?}\n{}", self.lines, self.stderr);
        exits[0]
    }

    fn pgids(&self) -> Vec<i32> {
        self.exits()
            .iter()
            .filter_map(|e| e["pgid"].as_i64())
            .map(|p| p as i32)
            .collect()
    }
}

/// Runs `hosted-boot supervise ARGS` (prefixed by `wrapper`, e.g. unshare)
/// with `$OUT` set to `out`, and checks afterwards that no process of the
/// runs' groups is left (unless they ran in another PID namespace) and that
/// no zombie child of the test process remains.
async fn supervise(wrapper: &[&str], args: &[&str], out: &Path) -> Supervised {
    supervise_with(wrapper, args, out, |_| {}).await
}

/// [`supervise`], with `configure` applied to the command before it starts.
async fn supervise_with(
    wrapper: &[&str],
    args: &[&str],
    out: &Path,
    configure: impl FnOnce(&mut Command),
) -> Supervised {
    let bin = env!("CARGO_BIN_EXE_hosted-boot");
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.arg("supervise")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("OUT", out)
        .env("HOSTED_BOOT_LOG", "hosted_boot=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    configure(&mut cmd);
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (status, out_text, err_text) = tokio::time::timeout(WAIT * 4, async {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let (status, _, _) = tokio::join!(
            child.wait(),
            stdout.read_to_end(&mut a),
            stderr.read_to_end(&mut b)
        );
        (status.unwrap(), a, b)
    })
    .await
    .expect("hosted-boot supervise did not finish in time");
    let elapsed = started.elapsed();
    let lines = String::from_utf8_lossy(&out_text)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let result = Supervised {
        pid,
        status,
        lines,
        stderr: String::from_utf8_lossy(&err_text).into_owned(),
        elapsed,
    };
    if wrapper.is_empty() {
        // Each exit record comes after its leader was reaped.
        let groups: Vec<Group> = result
            .pgids()
            .into_iter()
            .map(Group::of_exited_leader)
            .collect();
        assert_groups_empty(&groups);
    }
    assert_no_zombie_children().await;
    result
}

/// Whether the process recorded in the file `name` in `out` (`PID START`,
/// [`Process::recorded`]) is alive, not a zombie, and not another that
/// reuses its pid.
fn recorded_alive(out: &Path, name: &str) -> bool {
    Process::recorded(&std::fs::read_to_string(out.join(name)).unwrap()).alive()
}

#[tokio::test]
async fn a_grandchild_holding_stdout_neither_holds_the_turn_nor_survives_it() {
    let script = format!(
        r#"{RECORD_PROCESS}; sleep 1000 & record_process $! > "$OUT/holder"; echo started; exit 0"#
    );
    for cgroup in ["auto", "off"] {
        let out = tempfile::tempdir().unwrap();
        // The drain bound is long: the turn must end because the sweep
        // closed the pipe, not because the bound was reached.
        let run = supervise(
            &[],
            &[
                "--drain",
                "20s",
                "--turn-cgroup",
                cgroup,
                "--",
                "sh",
                "-c",
                &script,
            ],
            out.path(),
        )
        .await;
        let exit = run.exit();
        assert_eq!(exit["status"], "succeeded", "{}", run.stderr);
        assert_eq!(exit["code"], 0);
        assert!(
            run.elapsed < Duration::from_secs(10),
            "the turn took {:?} ({cgroup})",
            run.elapsed
        );
        assert!(!run.stderr.contains("still open after the drain bound"));
        assert!(run.lines.iter().any(|l| l["text"] == "started"));
        assert!(!recorded_alive(out.path(), "holder"), "{cgroup}");
    }
}

#[tokio::test]
async fn a_setsid_daemon_does_not_survive_the_turn() {
    for cgroup in ["off", "auto"] {
        let out = tempfile::tempdir().unwrap();
        // A double fork into a new session, as a tool shell's daemon does;
        // the agent exits once the daemon is in its own session.
        let script = r#"
(setsid sh -c 'echo "$$ $(sed "s/.*) //" /proc/$$/stat | cut -d" " -f20) $(cut -d" " -f6 /proc/$$/stat)" > "$OUT/daemon.tmp"; mv "$OUT/daemon.tmp" "$OUT/daemon"; exec sleep 1000' &)
while [ ! -s "$OUT/daemon" ]; do sleep 0.01; done
echo $$ > "$OUT/agent"
exit 0
"#;
        let run = supervise(
            &[],
            &["--turn-cgroup", cgroup, "--", "sh", "-c", script],
            out.path(),
        )
        .await;
        let exit = run.exit();
        assert_eq!(exit["status"], "succeeded", "{}", run.stderr);
        let daemon = std::fs::read_to_string(out.path().join("daemon")).unwrap();
        // pid, start time, session id.
        let fields: Vec<i64> = daemon
            .split_whitespace()
            .map(|f| f.parse().unwrap())
            .collect();
        assert_eq!(fields[0], fields[2], "the daemon leads its own session");
        assert_ne!(Some(fields[2]), exit["pgid"].as_i64());
        assert!(!recorded_alive(out.path(), "daemon"), "{cgroup}");
        if cgroup == "off" {
            // The subreaper path: the /proc sweep found and killed it.
            assert!(exit["swept"].as_u64().unwrap() >= 1, "{exit}");
        }
    }
}

/// An agent that leaves two daemons (each in a session of its own, named
/// `daemon-one` and `daemon-two`) and a background child in its group:
/// `supervise` names all three and what killed each, under the default
/// cgroup (`cgroup.kill`, which leaves the `/proc` sweep only zombies, so
/// `swept` once said 0) and without one (the sweep). Issue 17.
#[tokio::test]
async fn supervise_names_the_daemons_the_cgroup_or_the_sweep_killed() {
    for cgroup in ["auto", "off"] {
        let out = tempfile::tempdir().unwrap();
        let sleep = String::from_utf8(
            std::process::Command::new("sh")
                .args(["-c", "command -v sleep"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        for name in ["daemon-one", "daemon-two", "helper-child"] {
            std::os::unix::fs::symlink(sleep.trim(), out.path().join(name)).unwrap();
        }
        // Each daemon writes its pid, then renames, then becomes the named
        // program (the name is the symlink's: `/proc/<pid>/comm`).
        let script = r#"
for d in daemon-one daemon-two; do
  (setsid sh -c 'echo "$$ $(sed "s/.*) //" /proc/$$/stat | cut -d" " -f20)" > "$OUT/$1.tmp"; mv "$OUT/$1.tmp" "$OUT/$1.pid"; exec "$OUT/$1" 1000' sh "$d" > /dev/null 2>&1 &)
done
"$OUT/helper-child" 1000 > /dev/null 2>&1 &
while [ ! -s "$OUT/daemon-one.pid" ] || [ ! -s "$OUT/daemon-two.pid" ]; do sleep 0.01; done
sleep 0.2
exit 0
"#;
        let run = supervise(
            &[],
            &["--turn-cgroup", cgroup, "--", "sh", "-c", script],
            out.path(),
        )
        .await;
        let exit = run.exit();
        assert_eq!(exit["status"], "succeeded", "{}", run.stderr);
        let cgroup_used = !run.stderr.contains("no per-turn cgroup");
        if cgroup == "auto" && !cgroup_used {
            println!(
                "skipped the cgroup half: this sandbox gives the runner no per-turn cgroup (see its log: no per-turn cgroup)"
            );
            continue;
        }
        let killed = exit["killed"].as_array().unwrap();
        let by = |name: &str| -> Vec<&str> {
            killed
                .iter()
                .filter(|k| k["name"] == name)
                .map(|k| k["by"].as_str().unwrap())
                .collect()
        };
        let daemon_by = if cgroup == "auto" { "cgroup" } else { "sweep" };
        for d in ["daemon-one", "daemon-two"] {
            assert_eq!(by(d), vec![daemon_by], "{d} ({cgroup}): {exit}");
            let daemon = Process::recorded(
                &std::fs::read_to_string(out.path().join(format!("{d}.pid"))).unwrap(),
            );
            assert!(
                killed
                    .iter()
                    .any(|k| k["name"] == d && k["pid"].as_i64() == Some(i64::from(daemon.pid))),
                "{d} ({cgroup}): {exit}"
            );
            assert!(!daemon.alive(), "{d} survived ({cgroup})");
        }
        assert_eq!(
            by("helper-child"),
            vec!["process group"],
            "{cgroup}: {exit}"
        );
        assert_eq!(exit["swept"], 2, "{cgroup}: {exit}");
        assert!(
            run.stderr
                .contains("killed processes the agent left behind")
                && run.stderr.contains("daemon-one (pid ")
                && run.stderr.contains(&format!(", {daemon_by})")),
            "{cgroup}: {}",
            run.stderr
        );
    }
}

#[tokio::test]
async fn an_agent_ignoring_sigint_is_killed_after_the_grace_period() {
    let out = tempfile::tempdir().unwrap();
    let run = supervise(
        &[],
        &[
            "--interrupt-after",
            "200ms",
            "--grace",
            "600ms",
            "--",
            "sh",
            "-c",
            "trap '' INT; echo $$ > \"$OUT/agent\"; sleep 1000",
        ],
        out.path(),
    )
    .await;
    let exit = run.exit();
    assert_eq!(exit["status"], "interrupted", "{}", run.stderr);
    assert_eq!(exit["signal"], 9, "only SIGKILL ends it: {exit}");
    assert!(
        run.elapsed >= Duration::from_millis(800),
        "{:?}",
        run.elapsed
    );
    assert!(
        run.stderr.contains("after the grace period"),
        "{}",
        run.stderr
    );
    // The warning names what was still running, and how: the shell and its
    // sleep, both asleep in the kernel.
    let warning = run
        .stderr
        .lines()
        .find(|l| l.contains("after the grace period"))
        .unwrap();
    assert!(
        warning.contains(":sleep:S:") && warning.contains(":sh:S:"),
        "{warning}"
    );
}

#[tokio::test]
async fn the_time_cap_interrupts_and_fails_with_agent_timeout() {
    let out = tempfile::tempdir().unwrap();
    let run = supervise(
        &[],
        &[
            "--time-cap",
            "300ms",
            "--grace",
            "300ms",
            "--",
            "sh",
            "-c",
            "trap '' INT; sleep 1000",
        ],
        out.path(),
    )
    .await;
    let exit = run.exit();
    assert_eq!(exit["status"], "failed", "{}", run.stderr);
    assert_eq!(exit["error"], "agent_timeout");
    assert_eq!(exit["timedOut"], true);
    assert!(
        run.elapsed >= Duration::from_millis(600),
        "{:?}",
        run.elapsed
    );
    // A run that ends before the cap is not touched by it.
    let run = supervise(
        &[],
        &["--time-cap", "30s", "--", "sh", "-c", "exit 0"],
        out.path(),
    )
    .await;
    assert_eq!(run.exit()["status"], "succeeded");
    assert_eq!(run.exit()["timedOut"], false);
}

#[tokio::test]
async fn spawn_failures_name_the_program_or_the_directory() {
    let out = tempfile::tempdir().unwrap();
    let not_executable = out.path().join("agent.sh");
    std::fs::write(&not_executable, "#!/bin/sh\nexit 0\n").unwrap();
    let cases: Vec<(Vec<String>, &str, &str)> = vec![
        (
            vec!["/nonexistent/agent".into(), "--flag".into()],
            "/nonexistent/agent",
            "No such file",
        ),
        (
            vec![not_executable.display().to_string()],
            "agent.sh",
            "Permission denied",
        ),
        (
            vec![
                "--cwd".into(),
                "/nonexistent/dir".into(),
                "--".into(),
                "sh".into(),
            ],
            "/nonexistent/dir",
            "working directory",
        ),
    ];
    for (args, names, reason) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = supervise(&[], &args, out.path()).await;
        let exit = run.exit();
        assert_eq!(exit["type"], "spawn_failed", "{exit}");
        let error = exit["error"].as_str().unwrap();
        assert!(error.contains(names) && error.contains(reason), "{error}");
        assert_eq!(run.status.code(), Some(127));
        // A guard the failed child started was killed, not left to act on
        // its pipe's EOF when `supervise` exited.
        assert!(!run.stderr.contains("turn-guard"), "{}", run.stderr);
    }
}

#[tokio::test]
async fn as_pid1_statuses_stay_exact_over_1000_runs_while_orphans_are_reaped() {
    let wrapper = match pid_namespace_wrapper() {
        Ok(w) => w,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let out = tempfile::tempdir().unwrap();
    // Run n exits 0 when n is even, 3 when odd, and leaves an orphan that
    // exits while the next runs go on (the worker, a subreaper, reaps it
    // in the process where tokio waits for the agents).
    let script = r#"
n=$(cat "$OUT/n" 2>/dev/null || echo 0)
echo $((n + 1)) > "$OUT/n"
(sleep 0.003 &)
[ $((n % 2)) -eq 0 ] && exit 0
exit 3
"#;
    let run = supervise(
        &wrapper,
        &[
            "--times",
            "1000",
            "--turn-cgroup",
            "off",
            "--",
            "sh",
            "-c",
            script,
        ],
        out.path(),
    )
    .await;
    let exits = run.exits();
    assert_eq!(exits.len(), 1000, "{}", run.stderr);
    for (i, exit) in exits.iter().enumerate() {
        let (code, status) = if i % 2 == 0 {
            (0, "succeeded")
        } else {
            (3, "failed")
        };
        assert_eq!(exit["code"], code, "run {}: {exit}", i + 1);
        assert_eq!(exit["status"], status, "run {}: {exit}", i + 1);
    }
    // The reaper exits with the worker's code: the last run's (3).
    assert_eq!(run.status.code(), Some(3), "{}", run.stderr);
}

#[tokio::test]
async fn the_sweep_catches_what_forks_while_it_runs() {
    let out = tempfile::tempdir().unwrap();
    // A daemon in its own session that keeps forking (100 a second), so
    // that some of its children are born between a scan and a kill.
    let script = r#"
setsid sh -c 'echo "$$ $(sed "s/.*) //" /proc/$$/stat | cut -d" " -f20)" > "$OUT/forker.tmp"; mv "$OUT/forker.tmp" "$OUT/forker"; while :; do sleep 1000 & sleep 0.01; done' > /dev/null 2>&1 &
while [ ! -s "$OUT/forker" ]; do sleep 0.01; done
sleep 0.2
exit 0
"#;
    let run = supervise(
        &[],
        &["--turn-cgroup", "off", "--", "sh", "-c", script],
        out.path(),
    )
    .await;
    let exit = run.exit();
    assert_eq!(exit["status"], "succeeded", "{}", run.stderr);
    assert!(exit["swept"].as_u64().unwrap() >= 2, "{exit}");
    let forker = Group::recorded(&std::fs::read_to_string(out.path().join("forker")).unwrap());
    // The forker leads its own session and group; nothing of it is left.
    assert_groups_empty(&[forker]);
}

/// The live processes whose environment holds `HOP_MARK=<marker>`.
fn marked_alive(marker: &str) -> Vec<i32> {
    let needle = format!("HOP_MARK={marker}\0");
    hosted_boot::process::tree::scan()
        .into_iter()
        .filter(|p| !p.zombie)
        .filter(|p| {
            std::fs::read(format!("/proc/{}/environ", p.pid))
                .is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .map(|p| p.pid)
        .collect()
}

/// How the generations of [`re_forking_loop`] leave their parent.
#[derive(Clone, Copy, PartialEq)]
enum Hop {
    /// The first calls `setsid` once; each generation stays in its group.
    Once,
    /// Every generation calls `setsid` (a new session and group each): no
    /// group kill catches two of them (issue 32).
    EveryGeneration,
}

/// Issues 15 and 32: a daemon that forks its successor and exits, in a
/// tight loop (each generation, `sh hop.sh`, starts the next and exits: it
/// lives about one fork and exec; a shell function calling itself would
/// stop at dash's recursion depth of 1000); its child is re-parented to the
/// runner, the child subreaper. Beside it, a double-fork + setsid daemon.
/// Without a cgroup the sweep once found each generation by pid and
/// signalled it after it had already forked and gone: the loop outlived
/// the turn (3 of 8 boots with `setsid` every generation) and used the next
/// turn's token. Nothing of the turn may remain, run after run: `runs`
/// turns in a row under one `hosted-boot supervise`, as `user` (the
/// runner's `--agent-user`) or as the runner's own user.
async fn re_forking_loop(user: Option<&super::agent_user::TestUser>, hop: Hop, runs: u32) {
    let out = tempfile::tempdir().unwrap();
    if let Some(u) = user {
        std::os::unix::fs::chown(out.path(), Some(u.uid), None).unwrap();
    }
    let marker = format!("{}-{}-{}", std::process::id(), line!(), fastrand::u64(..));
    let hop_line = match hop {
        Hop::Once => r#"sh "$0" &"#,
        Hop::EveryGeneration => r#"setsid sh "$0" &"#,
    };
    // Each run writes its own files (`$OUT/<n>.…`): the loop of an earlier
    // run, were it alive, would not be mistaken for this one's.
    let script = format!(
        r#"
n=$(ls "$OUT" | grep -c '\.started$'); touch "$OUT/$n.started"
printf '%s\n' '{hop_line}' > "$OUT/hop.sh"
setsid sh -c 'echo "$$ $(sed "s/.*) //" /proc/$$/stat | cut -d" " -f20)" > "$OUT/$0.hopper.tmp"; mv "$OUT/$0.hopper.tmp" "$OUT/$0.hopper"; sh "$OUT/hop.sh" &' "$n" > /dev/null 2>&1 &
(setsid sh -c 'echo $$ > "$OUT/$0.daemon.tmp"; mv "$OUT/$0.daemon.tmp" "$OUT/$0.daemon"; exec sleep 1000' "$n" > /dev/null 2>&1 &)
while [ ! -s "$OUT/$n.hopper" ] || [ ! -s "$OUT/$n.daemon" ]; do sleep 0.01; done
sleep 0.2
exit 0
"#
    );
    let times = runs.to_string();
    let cwd = out.path().to_str().unwrap().to_string();
    let mut args = vec!["--turn-cgroup", "off", "--times", &times, "--cwd", &cwd];
    if let Some(u) = user {
        args.extend(["--agent-user", &u.name]);
    }
    args.extend(["--", "sh", "-c", &script]);
    let run = supervise_with(&[], &args, out.path(), |cmd| {
        cmd.env("HOP_MARK", &marker);
    })
    .await;
    // Several looks: a generation born between two reads of /proc is seen
    // by the next.
    let left: Vec<i32> = (0..20).flat_map(|_| marked_alive(&marker)).collect();
    if !left.is_empty() {
        // A group kill is atomic with fork: it ends a loop that kept its
        // group; a loop that changes group every generation is chased.
        for _ in 0..200 {
            for pid in marked_alive(&marker) {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(pid).unwrap(),
                    rustix::process::Signal::KILL,
                );
                let _ = rustix::process::kill_process_group(
                    rustix::process::Pid::from_raw(pid).unwrap(),
                    rustix::process::Signal::KILL,
                );
            }
        }
    }
    assert!(
        left.is_empty(),
        "processes of the turn outlived it: {left:?}; exits {:?}\n{}",
        run.exits(),
        run.stderr
    );
    let exits = run.exits();
    assert_eq!(exits.len(), runs as usize, "{}", run.stderr);
    for exit in exits {
        assert_eq!(exit["status"], "succeeded", "{exit}\n{}", run.stderr);
    }
    assert!(
        !run.stderr.contains("still alive after the sweep"),
        "{}",
        run.stderr
    );
}

/// The agent user for a test that needs one: created, or the test fails
/// (unless the run allows skipping: then `None`, the skip recorded).
fn agent_user_or_fail() -> Option<super::agent_user::TestUser> {
    match super::agent_user::TestUser::create() {
        Ok(u) => Some(u),
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            None
        }
    }
}

#[tokio::test]
async fn a_re_forking_daemon_of_the_agent_user_does_not_outlive_its_turn_without_a_cgroup() {
    if let Some(user) = agent_user_or_fail() {
        re_forking_loop(Some(&user), Hop::Once, 3).await;
    }
}

#[tokio::test]
async fn a_loop_that_calls_setsid_every_generation_as_the_agent_user_does_not_outlive_its_turn() {
    if let Some(user) = agent_user_or_fail() {
        re_forking_loop(Some(&user), Hop::EveryGeneration, 3).await;
    }
}

#[tokio::test]
async fn a_re_forking_daemon_does_not_escape_the_sweep_without_a_cgroup() {
    re_forking_loop(None, Hop::Once, 3).await;
}

#[tokio::test]
async fn a_loop_that_calls_setsid_every_generation_does_not_escape_the_sweep_without_a_cgroup() {
    re_forking_loop(None, Hop::EveryGeneration, 3).await;
}

/// Issue 32 (found by a reviewer): a process whose main thread exits while
/// another thread runs on shows as a zombie in `/proc`; a sweep that
/// skipped zombies left it alive, reported nothing, and it read the next
/// turn's token. Same uid, no cgroup: it is killed like any other.
#[tokio::test]
async fn a_process_whose_main_thread_exited_does_not_outlive_its_turn() {
    let out = tempfile::tempdir().unwrap();
    let program = out.path().join("zleader.py");
    std::fs::write(
        &program,
        r#"
import ctypes, os, platform, threading, time
out = os.environ["OUT"]
def run_on():
    while True:
        time.sleep(0.05)
threading.Thread(target=run_on).start()
with open(os.path.join(out, "zleader.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(out, "zleader.tmp"), os.path.join(out, "zleader"))
# SYS_exit: this thread alone ends; the process lives on in the other.
ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)
"#,
    )
    .unwrap();
    let script = format!(
        r#"(setsid python3 {} > /dev/null 2>&1 &); while [ ! -s "$OUT/zleader" ]; do sleep 0.01; done; sleep 0.2; exit 0"#,
        program.display()
    );
    let run = supervise(
        &[],
        &["--turn-cgroup", "off", "--", "sh", "-c", &script],
        out.path(),
    )
    .await;
    let pid: i32 = std::fs::read_to_string(out.path().join("zleader"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let running = |pid: i32| {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|tasks| {
                tasks.flatten().any(|t| {
                    std::fs::read_to_string(t.path().join("stat")).is_ok_and(|text| {
                        text.rsplit_once(')').is_some_and(|(_, rest)| {
                            !rest.trim_start().starts_with('Z')
                                && !rest.trim_start().starts_with('X')
                        })
                    })
                })
            })
            .unwrap_or(false)
    };
    let alive = running(pid);
    if alive {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid).unwrap(),
            rustix::process::Signal::KILL,
        );
    }
    assert!(!alive, "pid {pid} outlived its turn\n{}", run.stderr);
    assert_eq!(run.exit()["status"], "succeeded", "{}", run.stderr);
}

/// Issue 32: the agent user's processes are killed at once only when all of
/// them are the runner's: one outside its tree (the user is shared with
/// the host) is left alone, and the runner says why.
#[tokio::test]
async fn a_process_of_the_agent_user_outside_the_runner_is_not_killed() {
    let Some(user) = agent_user_or_fail() else {
        return;
    };
    let out = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(out.path(), Some(user.uid), None).unwrap();
    let mut outside = std::process::Command::new("sleep");
    std::os::unix::process::CommandExt::uid(&mut outside, user.uid);
    let mut outside = outside.arg("1000").spawn().unwrap();
    let cwd = out.path().to_str().unwrap().to_string();
    let args = [
        "--turn-cgroup",
        "off",
        "--cwd",
        &cwd,
        "--agent-user",
        &user.name,
        "--",
        "sh",
        "-c",
        "(setsid sleep 1000 &) ; exit 0",
    ];
    let run = supervise(&[], &args, out.path()).await;
    let still = outside.try_wait().unwrap();
    let _ = outside.kill();
    let _ = outside.wait();
    assert_eq!(still, None, "the process outside the runner was killed");
    assert_eq!(run.exit()["status"], "succeeded", "{}", run.stderr);
    assert!(
        run.stderr
            .contains("a process of the agent user runs outside this runner's tree"),
        "{}",
        run.stderr
    );
    // The turn's own daemon still went, by the sweep.
    assert_eq!(
        run.exit()["killed"].as_array().map(Vec::len),
        Some(1),
        "{}",
        run.exit()
    );
}

#[tokio::test]
async fn the_drain_bound_closes_a_pipe_the_sweep_cannot_empty() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_path_buf();
    // The test process itself opens the agent's stdout pipe: a holder no
    // sweep of the agent's tree can kill, so only the drain bound ends the
    // turn.
    let holder = async {
        let deadline = Instant::now() + WAIT;
        while !dir.join("agent").exists() {
            assert!(Instant::now() < deadline, "the agent did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let pid = std::fs::read_to_string(dir.join("agent")).unwrap();
        let held = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{}/fd/1", pid.trim()))
            .unwrap();
        std::fs::write(dir.join("go"), "").unwrap();
        (held, Instant::now())
    };
    let script = r#"
echo $$ > "$OUT/agent.tmp"; mv "$OUT/agent.tmp" "$OUT/agent"
while [ ! -e "$OUT/go" ]; do sleep 0.01; done
echo bye
exit 0
"#;
    let args = ["--drain", "700ms", "--", "sh", "-c", script];
    let run = supervise(&[], &args, out.path());
    let (run, (held, released)) = tokio::join!(run, holder);
    let after_go = released.elapsed();
    drop(held);
    assert_eq!(run.exit()["status"], "succeeded", "{}", run.stderr);
    assert!(
        run.stderr.contains("still open after the drain bound"),
        "{}",
        run.stderr
    );
    assert!(after_go >= Duration::from_millis(700), "{after_go:?}");
    assert!(after_go < Duration::from_secs(10), "{after_go:?}");
    // What the pipe held when the agent exited was read.
    assert!(
        run.lines.iter().any(|l| l["text"] == "bye"),
        "{:?}",
        run.lines
    );
}

#[tokio::test]
async fn a_supervised_program_opening_dev_tty_finds_no_controlling_terminal() {
    let out = tempfile::tempdir().unwrap();
    let pty = Pty::open();
    // Stopped by SIGTTIN, the program would run into the 3 s time cap.
    let args = [
        "--time-cap",
        "3s",
        "--grace",
        "300ms",
        "--",
        "sh",
        "-c",
        TTY_AGENT,
    ];
    let run = supervise_with(&[], &args, out.path(), |cmd| pty.control(cmd)).await;
    let terminal = pty.output();
    let exit = run.exit();
    assert_eq!(exit["status"], "succeeded", "{exit}\n{}", run.stderr);
    assert_eq!(exit["timedOut"], false);
    assert!(
        run.lines
            .iter()
            .any(|l| l["text"].as_str().is_some_and(|t| t.contains("done")))
    );
    assert!(run.elapsed < Duration::from_secs(3), "{:?}", run.elapsed);
    // `supervise` led the pty's session: its pid is that session's id.
    assert_no_terminal(out.path(), run.pid as i32, &terminal);
}

#[tokio::test]
async fn sigkill_to_the_runner_kills_the_agents_whole_session_without_a_cgroup() {
    let out = tempfile::tempdir().unwrap();
    // With job control the background job gets a process group of its own,
    // in the agent's session: only the guard's session sweep finds it once
    // the runner is dead (no cgroup, no subreaper left).
    let script = format!(
        r#"{RECORD_PROCESS}
set -m
echo $$ > "$OUT/agent"
sleep 1000 &
record_process $! > "$OUT/job.tmp"; mv "$OUT/job.tmp" "$OUT/job"
wait
"#
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_hosted-boot"))
        .args([
            "supervise",
            "--turn-cgroup",
            "off",
            "--",
            "bash",
            "-c",
            &script,
        ])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("OUT", out.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let job = out.path().join("job");
    let deadline = Instant::now() + WAIT;
    while !job.exists() {
        assert!(Instant::now() < deadline, "the agent did not start its job");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let read = |name: &str| std::fs::read_to_string(out.path().join(name)).unwrap();
    let job = Process::recorded(&read("job"));
    let agent: i32 = read("agent").trim().parse().unwrap();
    let info = hosted_boot::process::tree::read_proc(job.pid).unwrap();
    assert_eq!(info.start_time, job.start, "the job exited early");
    assert_eq!(info.sid, agent, "the job is in the agent's session");
    assert_ne!(info.pgid, agent, "the job left the agent's process group");
    // Both leaders wait (the agent for its job), so both are alive here.
    let groups = [
        Group::of_live_leader(agent),
        Group::of_live_leader(info.pgid),
    ];
    let pid = rustix::process::Pid::from_raw(child.id().unwrap() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    child.wait().await.unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while recorded_alive(out.path(), "job") {
        assert!(
            Instant::now() < deadline,
            "the job outlived the runner: {stderr}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        stderr.contains("turn-guard: the runner is gone"),
        "{stderr}"
    );
    assert_groups_empty(&groups);
    assert_no_zombie_children().await;
}
