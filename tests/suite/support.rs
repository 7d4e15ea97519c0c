//! Test support: a sandbox (root directory) booted by the real binary
//! against the in-process reference coordinator on loopback.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use hosted_boot::wire::Event;
use hosted_boot_coordinator::{Coordinator, CoordinatorOptions, Snapshot};
use tempfile::TempDir;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

/// Durations scaled by this in every runner the tests start (5 s polls →
/// 250 ms, 10 s grace → 500 ms).
pub const TIME_SCALE: &str = "0.05";
/// Bound on any wait in a test.
pub const WAIT: Duration = Duration::from_secs(30);

/// A coordinator, a root for the sandbox and a directory the agent scripts
/// write what they observed to (`$AGENT_OUT`).
pub struct Sandbox {
    pub coordinator: Coordinator,
    pub dir: TempDir,
}

impl Sandbox {
    pub async fn start(opts: CoordinatorOptions) -> Sandbox {
        hosted_boot::tls::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("root")).unwrap();
        std::fs::create_dir_all(dir.path().join("out")).unwrap();
        let opts = CoordinatorOptions {
            workdir: Some(dir.path().join("coordinator")),
            ..opts
        };
        let coordinator = Coordinator::start(opts).await.unwrap();
        Sandbox { coordinator, dir }
    }

    /// [`Sandbox::start`] with the default coordinator whose env bundle sets
    /// `connectors` (name, value).
    pub async fn with_connectors(connectors: &[(&str, &str)]) -> Sandbox {
        Sandbox::start(CoordinatorOptions {
            connectors: connectors
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            ..CoordinatorOptions::default()
        })
        .await
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    /// Writes an agent script (run with `sh`) and returns its path. The
    /// script first records its process group (its own pid, as the runner
    /// makes it a group leader, with its start time: [`RECORD_GROUP`]) for
    /// the check that runs when the sandbox is dropped, unless it runs in
    /// another PID namespace. `body` can record it elsewhere too with the
    /// shell function `record_group` (read back with
    /// [`Sandbox::read_group`]), and any process with `record_process PID`
    /// ([`RECORD_PROCESS`]).
    pub fn script(&self, body: &str) -> PathBuf {
        let path = self.dir.path().join("agent.sh");
        std::fs::write(
            &path,
            format!(
                "set -u\nrecord_group() {{ {RECORD_GROUP}; }}\n{RECORD_PROCESS}\n[ -n \"${{{IN_PID_NAMESPACE}:-}}\" ] || record_group >> \"$AGENT_OUT/{PGIDS_FILE}\"\n{body}\n"
            ),
        )
        .unwrap();
        path
    }

    /// The runner command for an agent script, with the sandbox's
    /// environment, trace-level JSON logs and the test time scale.
    pub fn runner(&self, script: &Path) -> Command {
        self.command("run", script)
    }

    /// `hosted-boot <subcommand>` with the environment of [`Sandbox::runner`].
    pub fn command(&self, subcommand: &str, script: &Path) -> Command {
        self.wrapped_command(&[], subcommand, script)
    }

    /// [`Sandbox::command`] run through `wrapper` (for example `unshare …`
    /// or `setpriv …`), which execs the binary with the same environment.
    pub fn wrapped_command(&self, wrapper: &[&str], subcommand: &str, script: &Path) -> Command {
        let mut cmd = self.program_command(
            wrapper,
            Path::new(env!("CARGO_BIN_EXE_hosted-boot")),
            script,
        );
        cmd.arg(subcommand);
        cmd
    }

    /// `program` (the runner or another binary of the workspace) with the
    /// sandbox's environment, as [`Sandbox::wrapped_command`] runs the
    /// runner; its arguments are the caller's.
    pub fn program_command(&self, wrapper: &[&str], program: &Path, script: &Path) -> Command {
        let mut bin = program.to_path_buf();
        if !wrapper.is_empty() {
            // A wrapper may drop privileges, and the build directory may be
            // private (CI clones into a 0700 temporary directory): run a
            // world-executable copy from the sandbox's directory.
            use std::os::unix::fs::PermissionsExt;
            let copy = self.dir.path().join(program.file_name().unwrap());
            if !copy.exists() {
                std::fs::copy(&bin, &copy).unwrap();
                std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            bin = copy;
        }
        let bin = bin.as_path();
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .envs(self.coordinator.sandbox_env())
            .env("HOSTED_BOOT_AGENT", "command")
            .env(
                "HOSTED_BOOT_AGENT_COMMAND",
                format!("sh {}", script.display()),
            )
            .env("HOSTED_BOOT_ROOT", self.root())
            .env("HOSTED_BOOT_TEST_TIME_SCALE", TIME_SCALE)
            .env("HOSTED_BOOT_LOG", "trace")
            .env("HOSTED_BOOT_LOG_FORMAT", "json")
            .env("AGENT_OUT", self.out())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    pub fn spawn(&self, script: &Path) -> Child {
        self.runner(script).spawn().unwrap()
    }

    /// Every secret the coordinator issued (boot secret, bearers, repo
    /// tokens) plus the given extra values.
    pub fn secrets(&self, extra: &[&str]) -> Vec<String> {
        let mut s = self.coordinator.issued_secrets();
        s.extend(extra.iter().map(|e| e.to_string()));
        s
    }

    pub fn session_dir(&self) -> PathBuf {
        self.root()
            .join(".orizu-session")
            .join(self.coordinator.session_id())
    }

    /// Waits until run `run_id` is sealed and returns the state then.
    pub async fn wait_sealed(&self, run_id: &str) -> Snapshot {
        self.coordinator
            .wait_for(WAIT, |s| s.run(run_id).is_some_and(|r| r.finish.is_some()))
            .await
            .unwrap()
    }

    /// Waits until run `run_id` has an event `matches` accepts (`what`
    /// names it in the failure).
    pub async fn wait_event(&self, run_id: &str, what: &str, matches: impl Fn(&Event) -> bool) {
        self.coordinator
            .wait_for(WAIT, |s| {
                s.run(run_id).is_some_and(|r| r.events.iter().any(&matches))
            })
            .await
            .unwrap_or_else(|e| panic!("no {what} event in {run_id}: {e}"));
    }

    /// Waits until run `run_id` has an event whose `data.text` is `text`.
    pub async fn wait_text(&self, run_id: &str, text: &str) {
        self.wait_event(run_id, &format!("{text:?}"), |e| e.data["text"] == text)
            .await;
    }

    /// The usual end of a test: waits until run `run_id` is sealed, ends the
    /// session and waits for the runner to exit, which must be with 0 (the
    /// session ended, PROTOCOL.md 4.2). Returns the state at the seal and
    /// the runner's output.
    pub async fn end_after_seal(&self, run_id: &str, runner: impl Exits) -> (Snapshot, String) {
        let snap = self.wait_sealed(run_id).await;
        self.coordinator.end_session();
        let (status, output) = runner.exit().await;
        assert_eq!(status.code(), Some(0), "{output}");
        (snap, output)
    }

    pub fn read_out(&self, name: &str) -> String {
        std::fs::read_to_string(self.out().join(name)).unwrap_or_default()
    }

    /// The content of `path` at the tip of the session branch in the
    /// coordinator's repository, `None` when it is not there.
    pub fn remote_file(&self, path: &str) -> Option<String> {
        let out = std::process::Command::new("git")
            .arg("--git-dir")
            .arg(self.coordinator.bare_repo())
            .arg("show")
            .arg(format!("refs/heads/{}:{path}", self.coordinator.branch()))
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The process group an agent recorded in `name` with [`RECORD_GROUP`].
    pub fn read_group(&self, name: &str) -> Group {
        Group::recorded(&self.read_out(name))
    }

    /// The process groups of every agent the sandbox ran, as its scripts
    /// recorded them ([`Sandbox::script`]).
    pub fn agent_groups(&self) -> Vec<Group> {
        Group::all_recorded(&self.read_out(PGIDS_FILE))
    }
}

/// Waits for the runner to exit (bounded) and returns its status and its
/// whole output (stdout and stderr).
pub async fn finish(mut child: Child) -> (ExitStatus, String) {
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let read = async {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let _ = tokio::join!(stdout.read_to_end(&mut a), stderr.read_to_end(&mut b));
        a.extend(b);
        String::from_utf8_lossy(&a).into_owned()
    };
    let (status, output) = tokio::time::timeout(WAIT, async { tokio::join!(child.wait(), read) })
        .await
        .expect("the runner did not exit in time");
    assert_no_zombie_children().await;
    (status.unwrap(), output)
}

/// A started runner whose exit a test waits for.
pub trait Exits {
    /// Waits (bounded) for the exit; returns the status and the whole output.
    async fn exit(self) -> (ExitStatus, String);
}

impl Exits for Child {
    /// [`finish`].
    async fn exit(self) -> (ExitStatus, String) {
        finish(self).await
    }
}

/// The runner, its output read as it comes: its trace-level log fills a
/// pipe's 64 KiB within a few dozen requests, and a runner blocked writing
/// its own log would stall (unlike [`finish`], which reads only once it is
/// called: for short runs, or runs a test does not wait on before).
pub struct Runner {
    child: Child,
    output: tokio::task::JoinHandle<String>,
}

impl Runner {
    /// Starts the runner on the agent script `script`.
    pub fn spawn(sb: &Sandbox, script: &Path) -> Runner {
        Runner::reading(sb.spawn(script))
    }

    /// Reads the output of a runner started with a command of its own
    /// (piped stdout and stderr, as [`Sandbox::runner`] makes them).
    pub fn reading(mut child: Child) -> Runner {
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let output = tokio::spawn(async move {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let _ = tokio::join!(stdout.read_to_end(&mut a), stderr.read_to_end(&mut b));
            a.extend(b);
            String::from_utf8_lossy(&a).into_owned()
        });
        Runner { child, output }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    pub fn exited(&mut self) -> bool {
        self.child.try_wait().unwrap().is_some()
    }

    /// Waits (bounded) for the exit; returns the status and the whole output.
    pub async fn finish(mut self) -> (ExitStatus, String) {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the runner did not exit in time")
            .unwrap();
        (status, self.output.await.unwrap())
    }

    /// Kills the runner and returns its output (for a failure message).
    pub async fn kill(mut self) -> String {
        let _ = self.child.start_kill();
        self.finish().await.1
    }
}

impl Exits for Runner {
    /// [`Runner::finish`].
    async fn exit(self) -> (ExitStatus, String) {
        self.finish().await
    }
}

/// Runs `git args` in `dir` with no system or global configuration and a
/// fixed identity (`t <t@example.invalid>`, unsigned commits); its stdout,
/// trimmed. Panics, naming the arguments and git's stderr, when git fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "commit.gpgsign=false"])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Pulls a bearer from `c`'s agent-token route with its boot secret, as a
/// runner does (PROTOCOL.md 2.1); panics unless the answer is `200`.
pub async fn pull_bearer(http: &reqwest::Client, c: &Coordinator) -> String {
    let resp = http
        .get(c.agent_token_url())
        .bearer_auth(c.boot_secret())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    body["token"].as_str().unwrap().to_string()
}

/// Sends `signal` to process `pid`.
pub fn signal(pid: u32, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(pid, signal).unwrap();
}

/// SIGKILLs every process of group `pgid` (a test's clean-up: errors, such
/// as an empty group, are ignored).
/// SIGKILLs `group` whole (a test's cleanup; one kill of the group is
/// atomic with fork, so it ends a process that forks its successor in a
/// loop), when it still has members: never a group that reuses its id (the
/// id stays reserved while the group has a member).
pub fn kill_group(group: &Group) {
    if !group.live_members().is_empty() {
        let _ = rustix::process::kill_process_group(
            rustix::process::Pid::from_raw(group.pgid).unwrap(),
            rustix::process::Signal::KILL,
        );
    }
}

/// Waits (bounded) until `path` exists. It says nothing of the file's
/// content: a shell's `echo x > f` creates `f` empty before it writes, so a
/// file the test reads after this wait must be written whole under another
/// name and renamed (`echo x > f.tmp; mv f.tmp f`), or be an empty marker
/// written after the files the test reads.
pub async fn wait_for_file(path: &Path) {
    tokio::time::timeout(WAIT, async {
        while !path.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} did not appear", path.display()));
}

/// Set (to anything) in the environment of a runner started in another PID
/// namespace: its agents' pids mean nothing in the test's namespace.
pub const IN_PID_NAMESPACE: &str = "HOSTED_BOOT_TEST_IN_PID_NAMESPACE";
/// Where agent scripts record their process group, under `$AGENT_OUT`.
const PGIDS_FILE: &str = ".agent-pgids";

impl Drop for Sandbox {
    /// After every test: no live process remains in the process group of
    /// any agent the sandbox ran (bounded wait: a runner killed on drop
    /// takes its turn down through the turn's guard).
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        assert_groups_empty(&self.agent_groups());
    }
}

/// Shell that prints the shell's pid and its start time (clock ticks since
/// boot, field 22 of `/proc/$$/stat`, counted after the name, which may
/// hold spaces and parentheses): an agent records its process group with
/// it while it leads the group.
pub const RECORD_GROUP: &str = r#"echo "$$ $(sed 's/.*) //' /proc/$$/stat | cut -d' ' -f20)""#;

/// Shell that defines `record_process PID`, which prints `PID START` for a
/// live process (read back with [`Process::recorded`]); prepend it to a
/// script that records a child (`sleep 1000 & record_process $!`).
pub const RECORD_PROCESS: &str =
    r#"record_process() { echo "$1 $(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f20)"; }"#;

/// One process as a script recorded it, by pid and start time (issue 30): a
/// pid alone names whichever process holds it when the check runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Process {
    /// Its pid.
    pub pid: i32,
    /// Its start time, clock ticks since boot.
    pub start: u64,
}

impl Process {
    /// A process from a line `PID START …` (what [`RECORD_PROCESS`] and
    /// [`RECORD_GROUP`] print; later words are the test's own).
    pub fn recorded(line: &str) -> Process {
        let mut words = line.split_whitespace();
        let (Some(pid), Some(start)) = (words.next(), words.next()) else {
            panic!("not a process recorded as `PID START`: {line:?}");
        };
        let process = Process {
            pid: pid.parse().unwrap(),
            start: start.parse().unwrap(),
        };
        // No process starts at boot's first tick: a 0 is a misread field,
        // and would make every check on this process pass.
        assert!(process.start > 0, "a start time of 0 recorded: {line:?}");
        process
    }

    /// Whether this very process is alive (not a zombie): not another that
    /// reuses its pid.
    pub fn alive(&self) -> bool {
        hosted_boot::process::tree::read_proc(self.pid)
            .is_some_and(|p| !p.zombie && p.start_time == self.start)
    }
}

/// An agent's process group as the suite knows it (issue 30): its id, and
/// its leader's start time when the leader was seen alive. An id alone
/// names whichever group holds that number when the check runs: after pids
/// wrap (`pid_max` is 32,768 on the CI machine, and the load row starts
/// thousands of agents), an unrelated session leader that reuses the id is
/// not an orphan of this group.
///
/// Linux keeps a number reserved while any process uses it as its pid,
/// process group or session: so a live process holding the number that is
/// not the recorded leader proves the recorded group emptied before it.
/// What this cannot tell apart: a group whose leader is gone, holding
/// members, from a group that reused the number after this one emptied and
/// whose own leader is gone too; such members count as survivors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    /// The process group id (its leader's pid).
    pub pgid: i32,
    /// The leader's start time; `None`: the leader is known to have exited
    /// (and been reaped) before any check.
    leader_start: Option<u64>,
}

impl Group {
    /// A group as [`RECORD_GROUP`] printed it (`PGID START`): its leader,
    /// recorded while it led the group.
    pub fn recorded(line: &str) -> Group {
        Group::led_by(Process::recorded(line))
    }

    /// The group `leader` led when it was recorded.
    pub fn led_by(leader: Process) -> Group {
        Group {
            pgid: leader.pid,
            leader_start: Some(leader.start),
        }
    }

    /// Every group of a file that each agent appended a [`RECORD_GROUP`]
    /// line to.
    pub fn all_recorded(text: &str) -> Vec<Group> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(Group::recorded)
            .collect()
    }

    /// The group led by `pid`, which must be alive now and lead it.
    pub fn of_live_leader(pid: i32) -> Group {
        let leader = hosted_boot::process::tree::read_proc(pid)
            .unwrap_or_else(|| panic!("the group leader {pid} is not alive"));
        assert!(!leader.zombie, "the group leader {pid} has exited");
        assert_eq!(leader.pgid, pid, "{pid} leads no process group");
        Group::led_by(Process {
            pid,
            start: leader.start_time,
        })
    }

    /// The group led by `pgid`, whose leader has exited and been reaped
    /// (as `supervise` reports it): a live process with that pid reuses
    /// the number.
    pub fn of_exited_leader(pgid: i32) -> Group {
        Group {
            pgid,
            leader_start: None,
        }
    }

    /// The live (non-zombie) processes of this group.
    pub fn live_members(&self) -> Vec<i32> {
        self.members_in(&hosted_boot::process::tree::scan())
    }

    /// [`Group::live_members`] among `procs` (one scan of `/proc`).
    pub fn members_in(&self, procs: &[hosted_boot::process::tree::ProcInfo]) -> Vec<i32> {
        if let Some(holder) = procs.iter().find(|p| p.pid == self.pgid)
            && self.leader_start != Some(holder.start_time)
        {
            return Vec::new();
        }
        procs
            .iter()
            .filter(|p| !p.zombie && p.pgid == self.pgid)
            // Nothing older than the leader joins its group: it leads its
            // own session, which only its descendants can be in.
            .filter(|p| self.leader_start.is_none_or(|s| p.start_time >= s))
            .map(|p| p.pid)
            .collect()
    }
}

/// Asserts that no live process is in any of `groups`, waiting up to 5 s.
pub fn assert_groups_empty(groups: &[Group]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let procs = hosted_boot::process::tree::scan();
        let left: Vec<(i32, Vec<i32>)> = groups
            .iter()
            .map(|g| (g.pgid, g.members_in(&procs)))
            .filter(|(_, m)| !m.is_empty())
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "processes of an agent's group outlived the test: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Zombie children of this test process.
pub fn zombie_children() -> Vec<i32> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 1 && fields[0] == "Z" && fields[1] == me {
            out.push(pid);
        }
    }
    out
}

/// Asserts that the test process keeps no zombie child: every zombie child
/// seen now must be reaped within 5 s (tests run in parallel threads, so
/// another test's child may be a zombie for an instant).
pub async fn assert_no_zombie_children() {
    let seen = zombie_children();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = zombie_children();
        let kept: Vec<i32> = seen.iter().copied().filter(|p| now.contains(p)).collect();
        if kept.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "zombie children of the test process were never reaped: {kept:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts that `output` contains none of `secrets`.
pub fn assert_no_secret(what: &str, output: &str, secrets: &[String]) {
    for s in secrets {
        assert!(!s.is_empty());
        assert!(
            !output.contains(s.as_str()),
            "{what} contains a secret ({}…)",
            &s[..4.min(s.len())]
        );
    }
}

/// `Err` naming what is missing unless this process is root and has
/// setpriv (util-linux), which `what` needs to drop to another uid.
pub fn root_and_setpriv(what: &str) -> Result<(), hosted_boot_test_support::Missing> {
    hosted_boot_test_support::root(what)?;
    hosted_boot_test_support::program("/usr/bin/setpriv", "util-linux")
}

/// `unshare --pid --fork --mount-proc` as this machine allows it, or the
/// reason to skip. `--kill-child`: when a failed test kills `unshare`, the
/// namespace's PID 1, and so everything in the namespace, dies with it.
pub fn pid_namespace_wrapper() -> Result<Vec<&'static str>, String> {
    let wrapper = vec!["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"];
    match std::process::Command::new(wrapper[0])
        .args(&wrapper[1..])
        .arg("true")
        .output()
    {
        Ok(o) if o.status.success() => Ok(wrapper),
        Ok(o) => Err(format!(
            "`unshare --pid --fork --mount-proc --kill-child` fails here ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!("unshare cannot run: {e}")),
    }
}

/// Prefix of the runner's own event types (PROTOCOL.md 4.6).
pub const RUNNER_PREFIX: &str = "hosted_boot.";

/// The agent-produced events of a run as `(type, data)`, the runner's own
/// (`hosted_boot.…`) left out; an `output` event whose `text` is JSON is
/// shown with that JSON as its data, decoded (so that what a consumer
/// parsing it would see is compared).
pub fn agent_events(events: &[hosted_boot::wire::Event]) -> Vec<(String, serde_json::Value)> {
    events
        .iter()
        .filter(|e| !e.kind.starts_with(RUNNER_PREFIX))
        .map(|e| {
            let decoded = (e.kind == "output")
                .then(|| e.data["text"].as_str())
                .flatten()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok());
            (e.kind.clone(), decoded.unwrap_or_else(|| e.data.clone()))
        })
        .collect()
}

/// The event contract of PROTOCOL.md 4.6 and section 5 on what the
/// coordinator stored for a run: no event's type or data holds a secret,
/// not even once an `output` text that is JSON is decoded; the
/// `hosted_boot.` events are exactly `runner_types`, in order, and none
/// carries the stand-ins' `"forged"` marker (an agent's event that claimed
/// the runner's namespace).
pub fn assert_events_clean(
    events: &[hosted_boot::wire::Event],
    secrets: &[String],
    runner_types: &[&str],
) {
    for e in events {
        assert_no_secret(&format!("the type of event {}", e.seq), &e.kind, secrets);
    }
    assert_no_secret("events", &serde_json::to_string(events).unwrap(), secrets);
    let decoded = serde_json::to_string(&agent_events(events)).unwrap();
    assert_no_secret("events, output texts decoded", &decoded, secrets);
    let runner: Vec<&hosted_boot::wire::Event> = events
        .iter()
        .filter(|e| e.kind.starts_with(RUNNER_PREFIX))
        .collect();
    // `hosted_boot.runner` follows the CLI's `--version` answer when that
    // comes after the agent started (PROTOCOL.md 4.6): its place is free.
    let mut kinds: Vec<&str> = runner.iter().map(|e| e.kind.as_str()).collect();
    let mut expected = runner_types.to_vec();
    for list in [&mut kinds, &mut expected] {
        if let Some(at) = list.iter().position(|k| *k == "hosted_boot.runner") {
            let runner_event = list.remove(at);
            list.insert(0, runner_event);
        }
    }
    assert_eq!(kinds, expected, "the runner's events");
    for e in runner {
        assert!(
            e.data.get("forged").is_none(),
            "an agent forged a runner event: {} {}",
            e.kind,
            e.data
        );
    }
}

/// A pseudo-terminal: a test makes it the controlling terminal of the
/// process it starts (as a shell, `docker run -t` or tini do for the
/// runner) and reads from its master side everything written to it.
pub struct Pty {
    slave: std::os::fd::OwnedFd,
    output: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    closed: std::sync::mpsc::Receiver<()>,
}

impl Pty {
    /// Opens a pseudo-terminal and starts reading its master side.
    pub fn open() -> Pty {
        use std::ffi::CStr;
        use std::io::Read;
        use std::os::fd::{FromRawFd, OwnedFd};
        // SAFETY: plain libc calls on descriptors this function owns; the
        // name buffer is large enough and NUL-terminated by `ptsname_r`.
        let (master, slave) = unsafe {
            let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
            assert!(
                master >= 0,
                "posix_openpt: {}",
                std::io::Error::last_os_error()
            );
            let master = OwnedFd::from_raw_fd(master);
            let raw = std::os::fd::AsRawFd::as_raw_fd(&master);
            assert_eq!(libc::grantpt(raw), 0);
            assert_eq!(libc::unlockpt(raw), 0);
            let mut name = [0 as libc::c_char; 128];
            assert_eq!(libc::ptsname_r(raw, name.as_mut_ptr(), name.len()), 0);
            let slave = libc::open(
                CStr::from_ptr(name.as_ptr()).as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            );
            assert!(
                slave >= 0,
                "open the pty slave: {}",
                std::io::Error::last_os_error()
            );
            (master, OwnedFd::from_raw_fd(slave))
        };
        let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, closed) = std::sync::mpsc::channel();
        let sink = output.clone();
        std::thread::spawn(move || {
            let mut master = std::fs::File::from(master);
            let mut buf = [0u8; 4096];
            // EIO once every holder of the slave has closed it.
            while let Ok(n @ 1..) = master.read(&mut buf) {
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            let _ = tx.send(());
        });
        Pty {
            slave,
            output,
            closed,
        }
    }

    /// Makes `cmd` start as the leader of a new session whose controlling
    /// terminal is this pty, with the pty as its stdin.
    pub fn control(&self, cmd: &mut Command) {
        let slave = std::os::fd::AsRawFd::as_raw_fd(&self.slave);
        cmd.stdin(Stdio::from(self.slave.try_clone().unwrap()));
        // SAFETY: setsid and ioctl are async-signal-safe; `slave` stays open
        // in the child until its exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 || libc::ioctl(slave, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Everything written to the terminal: waits (≤ 5 s) until no process
    /// holds it open any more.
    pub fn output(self) -> String {
        drop(self.slave);
        let _ = self.closed.recv_timeout(Duration::from_secs(5));
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }
}

/// The reference coordinator's binary (`serve`, `demo`), a package of its
/// own (issue 34), beside the runner's in cargo's target directory. Cargo
/// builds it with this suite when the suite is the workspace's
/// (`cargo nextest run`, the README's test command): its package has
/// integration tests of its own (crates/coordinator/tests/).
pub fn coordinator_bin() -> PathBuf {
    workspace_bin("hosted-boot-coordinator")
}

/// The binary `name` of another package of the workspace, beside the
/// runner's (the package has integration tests, so cargo builds its binary
/// with the workspace's tests).
fn workspace_bin(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_hosted-boot")).with_file_name(name);
    assert!(
        path.is_file(),
        "{} is missing: run the workspace's tests (`cargo nextest run`, not `-p hosted-boot` alone) or build it (`cargo build -p {name}`)",
        path.display()
    );
    path
}

/// The conformance checker's binary (`hosted-boot-conformance`), beside
/// the runner's, as [`coordinator_bin`] is.
pub fn conformance_bin() -> PathBuf {
    workspace_bin("hosted-boot-conformance")
}

/// Asserts that a stopped tool given `tmp` as its TMPDIR left nothing:
/// no process whose environment names `tmp`, nothing in it. `what` names
/// the case in the failure.
pub fn assert_nothing_left(tmp: &Path, what: &str) {
    let left = processes_with_env(tmp.to_str().unwrap());
    assert!(left.is_empty(), "{what}: processes left: {left:?}");
    let entries: Vec<_> = std::fs::read_dir(tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(entries.is_empty(), "{what}: left in TMPDIR: {entries:?}");
}

/// Pids of the processes whose environment holds `needle` (a unique
/// directory the test gave them as TMPDIR or HOME): what a stopped tool
/// left running.
fn processes_with_env(needle: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != std::process::id() as i32)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .collect()
}

/// Runs `hosted-boot-coordinator demo` with `args` (bounded, 120 s) and
/// returns its stdout, asserting that it exited 0 (its stderr in the
/// failure message).
pub async fn demo_stdout(args: &[&str]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(coordinator_bin())
            .arg("demo")
            .args(args)
            .env_remove("HOSTED_BOOT_LOG")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the demo did not finish")
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
