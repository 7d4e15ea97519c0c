//! The turn supervisor: runs the agent as the leader of a session of its
//! own (its own process group, no controlling terminal: PROTOCOL.md 4.1
//! step 4), interrupts it (SIGINT to the group, SIGKILL after the grace
//! period), caps the turn's time, and ends the turn when the leader exits,
//! not when its pipes close (a grandchild may hold them open forever), with
//! every process of the turn gone, whatever its group or session.
//!
//! ```text
//! spawn (from the spawner thread)       leader L: env as built, PDEATHSIG=KILL
//!   │                                    + parent re-check, setsid (sid =
//!   │                                    pgid = L, no controlling terminal),
//!   │                                    forks the guard, joins the cgroup
//!   ├─ guard G in group L, adopted by the runner (stdin = pipe from the
//!   │   runner: EOF = runner died → cgroup.kill, SIGKILL to group L and
//!   │   to every process of session L)
//!   ├─ readers: stdout/stderr → output sinks (redact, frame, map)
//!   ├─ adopted orphans reaped on SIGCHLD (the runner is a subreaper)
//!   ├─ waitid(L, WEXITED|WNOWAIT)  ◀── Interrupt: SIGINT to -L, SIGKILL after grace
//!   │                               ◀── Kill: SIGKILL to -L
//!   │                               ◀── time cap: as Interrupt, Exit.timed_out
//!   │                               ◀── G's pidfd readable (G died, not by
//!   │                                   our SIGKILL): stop now, Exit.guard_died
//!   ├─ L exited (still a zombie: group id L stays reserved)
//!   ├─ SIGKILL to -L, cgroup.kill, sweep /proc until no turn process lives
//!   ├─ reap L (its status); G, adopted, is reaped with the orphans
//!   ├─ drain the pipes ≤ `drain`, then close them
//!   └─ wait until group L is empty (bounded, logged), close G's pipe,
//!      remove the cgroup
//! ```
//!
//! Waiting with `WNOWAIT` keeps the leader's pid (= the group and session
//! id) reserved until the group has been signalled, so a recycled group id
//! is never hit; once the runner is dead the guard, a member of the
//! session, keeps it reserved (see `guard.rs`).
//! The tree beyond the group is `tree.rs`; the cgroup `cgroup.rs`; the
//! guard `guard.rs`.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::Instrument as _;

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::cgroup::{self, CgroupMode, TurnCgroup};
use super::guard;
use super::output::{OutputSink, pump};
use super::tree::{self, Runner};
use super::user_kill::{self, UserKill};

/// Bound on the sweep after the leader exits, and on the wait for the group
/// to be empty (each logged when reached).
pub const SWEEP_BOUND: Duration = Duration::from_secs(5);

/// How a turn is supervised.
#[derive(Clone, Debug)]
pub struct Supervision {
    /// After the leader exits, read its pipes for at most this (2 s).
    pub drain: Duration,
    /// The turn's time cap (`clientInfo.durationMinutes`); none when absent.
    pub time_cap: Option<Duration>,
    /// SIGINT → SIGKILL when the time cap is reached (the interrupt grace).
    pub cap_grace: Duration,
    /// Whether the turn gets a cgroup.
    pub cgroup: CgroupMode,
    /// The `hosted-boot` binary that runs the turn's guard (`turn-guard`);
    /// none: no guard (the leader still has `PR_SET_PDEATHSIG`).
    pub guard_exe: Option<PathBuf>,
    /// The first stop signal to the group (an interrupt, the time cap):
    /// SIGINT, or SIGTERM for a CLI that does not stop on SIGINT (opencode;
    /// PROTOCOL.md sections 4.1 and 4.4). SIGKILL follows after the grace.
    pub stop_signal: Signal,
}

impl Supervision {
    /// The per-turn time cap of `clientInfo.durationMinutes`: none when
    /// absent, and none (logged) when not a positive finite number.
    pub fn time_cap_from_minutes(minutes: Option<f64>) -> Option<Duration> {
        let m = minutes?;
        let cap = (m.is_finite() && m > 0.0)
            .then(|| Duration::try_from_secs_f64(m * 60.0).ok())
            .flatten();
        if cap.is_none() {
            tracing::warn!(
                duration_minutes = m,
                "clientInfo.durationMinutes is not a positive number of minutes; turns have no time cap"
            );
        }
        cap
    }

    /// The `agent_timeout` message of a turn stopped by the time cap.
    pub fn timeout_message(&self) -> String {
        match self.time_cap {
            Some(cap) => format!(
                "the agent was stopped at the turn's time cap ({}, clientInfo.durationMinutes)",
                humantime::format_duration(Duration::from_millis(cap.as_millis() as u64))
            ),
            None => "the agent was stopped at the turn's time cap".to_string(),
        }
    }
}

/// What to start. `Debug` names the environment's variables without their
/// values (connector secrets are among them) and gives stdin's length only.
pub struct SpawnSpec {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Working directory (`repo/`).
    pub cwd: PathBuf,
    /// The whole environment (nothing is inherited).
    pub env: Vec<(OsString, OsString)>,
    /// Written to stdin, then stdin is closed (unless `stdin_feed` is set).
    pub stdin: Vec<u8>,
    /// After `stdin`, every message of this channel is written in order;
    /// stdin is closed when the channel closes (an agent protocol on stdin).
    pub stdin_feed: Option<mpsc::UnboundedReceiver<Vec<u8>>>,
    /// `--agent-user`: the user the agent's leader becomes just before its
    /// exec (after its guard was forked, which stays the runner's), so every
    /// process of the turn runs as it; `None`: the runner's own user.
    pub user: Option<crate::agent_user::AgentUser>,
}

impl std::fmt::Debug for SpawnSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env_names: Vec<_> = self.env.iter().map(|(name, _)| name).collect();
        f.debug_struct("SpawnSpec")
            .field("program", &self.program)
            .field("args", &self.args)
            .field("cwd", &self.cwd)
            .field("env_names", &env_names)
            .field("stdin_bytes", &self.stdin.len())
            .field("stdin_feed", &self.stdin_feed.is_some())
            .field("user", &self.user.as_ref().map(|u| u.uid))
            .finish()
    }
}

/// Why the agent could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the agent program {program:?}: {reason}")]
pub struct SpawnError {
    /// The program name as configured.
    pub program: String,
    /// The OS error, e.g. "No such file or directory (os error 2)".
    pub reason: String,
}

/// A request to the running supervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// The stop signal ([`Supervision::stop_signal`]) to the group now,
    /// SIGKILL after `grace`.
    Interrupt {
        /// Stop signal → SIGKILL.
        grace: Duration,
    },
    /// SIGKILL to the group now.
    Kill,
}

/// Which stream a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The agent's stdout.
    Stdout,
    /// The agent's stderr.
    Stderr,
}

/// What the agent's processes used (PROTOCOL.md 2.6, `finish.resources`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// CPU time, user and system.
    pub cpu: Duration,
    /// The peak resident memory: of the turn's cgroup as a whole, or (from
    /// `rusage`) of the largest single process.
    pub peak_rss_bytes: u64,
    /// Where the figures come from.
    pub source: UsageSource,
}

/// Where a [`Usage`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UsageSource {
    /// The turn's cgroup: every process of the turn.
    Cgroup,
    /// The leader's `rusage` as it exited: itself and the descendants it
    /// (and they) waited for; a process that left the tree is not counted.
    Rusage,
}

/// How the agent process ended.
#[derive(Clone, Debug)]
pub struct Exit {
    /// The leader's status (`None` if it could not be collected).
    pub status: Option<ExitStatus>,
    /// Whether the runner signalled the group (an interrupt or a kill).
    pub signalled: bool,
    /// Whether the runner sent SIGKILL to the group before the leader
    /// exited (the grace period ran out, or a second stop signal).
    pub killed: bool,
    /// The process group id the turn used (also its session id: the
    /// leader's pid).
    pub pgid: i32,
    /// Whether the time cap was reached (and the runner interrupted the
    /// agent for it, before any other interrupt).
    pub timed_out: bool,
    /// Processes outside the agent's process group killed after the leader
    /// exited (they had called `setsid` or `setpgid`), by the turn's cgroup
    /// or the `/proc` sweep: the entries of `left_behind` not killed by
    /// [`KilledBy::ProcessGroup`].
    pub swept: usize,
    /// Every process of the turn still alive when the leader's exit was
    /// seen (its guard aside), and what killed it, in the order found.
    pub left_behind: Vec<LeftBehind>,
    /// The pid of the turn's guard, when it died before the turn ended
    /// (killed by the agent, say) and the runner therefore killed the
    /// turn's whole tree at once (PROTOCOL.md 4.1 step 4): the turn fails
    /// with `runner_error`.
    pub guard_died: Option<i32>,
    /// What the turn's processes used: from its cgroup where it has one
    /// with the CPU and memory figures, else the leader's `rusage`; `None`
    /// when neither was read (the guard died first).
    pub usage: Option<Usage>,
}

/// How the agent's process ended, on its span (issue 40).
fn record_exit(span: &tracing::Span, exit: &Exit) {
    use std::os::unix::process::ExitStatusExt as _;
    if let Some(status) = exit.status {
        if let Some(code) = status.code() {
            span.record("exit_code", code);
        }
        if let Some(signal) = status.signal() {
            span.record("signal", signal);
        }
    }
    span.record("signalled", exit.signalled);
    span.record("killed", exit.killed);
    span.record("timed_out", exit.timed_out);
    span.record("swept", exit.swept);
}

/// A process the agent left behind when its leader exited, killed by the
/// runner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftBehind {
    /// Its pid.
    pub pid: i32,
    /// Its command name (`/proc/<pid>/comm`), empty if it could not be read.
    pub name: String,
    /// What killed it.
    pub by: KilledBy,
}

/// What killed a process the agent left behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KilledBy {
    /// SIGKILL to the agent's process group (it stayed in it).
    ProcessGroup,
    /// `cgroup.kill` of the turn's cgroup (it had left the group).
    Cgroup,
    /// The `/proc` sweep (it had left the group, and no cgroup held it).
    Sweep,
}

impl KilledBy {
    /// `process group`, `cgroup` or `sweep`, as `supervise` prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            KilledBy::ProcessGroup => "process group",
            KilledBy::Cgroup => "cgroup",
            KilledBy::Sweep => "sweep",
        }
    }
}

/// `sleep (pid 12, cgroup), daemon (pid 13, sweep)`, for a log line.
pub fn left_behind_text(left: &[LeftBehind]) -> String {
    left.iter()
        .map(|l| {
            let name = if l.name.is_empty() { "?" } else { &l.name };
            format!("{name} (pid {}, {})", l.pid, l.by.as_str())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Starts the agent, pumps each output stream into the sink `output` makes
/// for it (see [`super::output`]), obeys `control`
/// and the time cap until the leader exits, kills every remaining process
/// of the turn, drains the pipes for at most `supervision.drain`, and
/// returns how it ended.
///
/// Errors: the program could not be started (not found, not executable,
/// bad working directory): nothing was started.
pub async fn run<F, S>(
    spec: SpawnSpec,
    control: mpsc::UnboundedReceiver<Control>,
    supervision: &Supervision,
    output: F,
) -> Result<Exit, SpawnError>
where
    F: Fn(Stream) -> S,
    S: OutputSink,
{
    let started = start(spec, supervision, output).await?;
    Ok(started.supervise(control, supervision).await)
}

/// Starts the agent as [`run`] does (session, group, guard, cgroup, pipes
/// pumping into `output`'s sinks) and returns it before anything watches
/// it: its time cap, its control and the wait for its exit start with
/// [`Started::supervise`]. A pre-started agent waits here for its turn.
///
/// Errors: as [`run`].
pub async fn start<F, S>(
    spec: SpawnSpec,
    supervision: &Supervision,
    output: F,
) -> Result<Started, SpawnError>
where
    F: Fn(Stream) -> S,
    S: OutputSink,
{
    check_cwd(&spec)?;
    let runner = Runner::current();
    tree::become_subreaper();
    let turn = TurnProcesses::spawn(spec, supervision, output, runner).await?;
    Ok(Started { turn })
}

/// An agent process started and not yet supervised ([`start`]). Dropped,
/// its leader is killed (`kill_on_drop`); [`Started::supervise`] or
/// [`Started::discard`] also end the rest of its tree.
pub struct Started {
    turn: TurnProcesses,
}

impl Started {
    /// The leader's pid: the process group and session of the agent.
    pub fn pid(&self) -> i32 {
        self.turn.pid
    }

    /// Whether the leader is still running (not exited, not a zombie).
    pub fn running(&self) -> bool {
        let Some(pid) = Pid::from_raw(self.turn.pid) else {
            return false;
        };
        let options = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
        matches!(rustix::process::waitid(WaitId::Pid(pid), options), Ok(None))
    }

    /// Obeys `control` and the time cap (from now) until the leader exits,
    /// then tears the turn's processes down, as [`run`] does.
    pub async fn supervise(
        self,
        mut control: mpsc::UnboundedReceiver<Control>,
        supervision: &Supervision,
    ) -> Exit {
        // The turn's agent from now (a process started ahead of its turn is
        // not shown between turns).
        crate::status::agent_pid(u32::try_from(self.turn.pid).ok());
        let span = tracing::info_span!(
            "agent process",
            pid = self.turn.pid,
            exit_code = tracing::field::Empty,
            signal = tracing::field::Empty,
            signalled = tracing::field::Empty,
            killed = tracing::field::Empty,
            timed_out = tracing::field::Empty,
            swept = tracing::field::Empty,
        );
        // `control` stays open until the turn is torn down: a request sent
        // meanwhile is not refused.
        let exit = async {
            let waited = self.turn.wait(&mut control, supervision).await;
            self.turn.end(waited, supervision.drain).await
        }
        .instrument(span.clone())
        .await;
        record_exit(&span, &exit);
        exit
    }

    /// Kills the agent and every process of its tree, as a turn's end does.
    pub async fn discard(self, supervision: &Supervision) -> Exit {
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(Control::Kill);
        self.supervise(rx, supervision).await
    }
}

/// A failed chdir in the child reports only "No such file or directory", as
/// if the program were missing: this names the directory instead.
fn check_cwd(spec: &SpawnSpec) -> Result<(), SpawnError> {
    let reason = match std::fs::metadata(&spec.cwd) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => format!(
            "its working directory {} is not a directory",
            spec.cwd.display()
        ),
        Err(e) => format!(
            "its working directory {} cannot be used: {e}",
            spec.cwd.display()
        ),
    };
    Err(SpawnError {
        program: spec.program.clone(),
        reason,
    })
}

/// The turn's cgroup, when `mode` asks for one and one can be made (why not
/// is logged once per runner).
fn turn_cgroup(mode: CgroupMode) -> Option<TurnCgroup> {
    match mode {
        CgroupMode::Off => None,
        CgroupMode::Auto => match TurnCgroup::create() {
            Ok(c) => Some(c),
            Err(reason) => {
                static LOGGED: AtomicBool = AtomicBool::new(false);
                if !LOGGED.swap(true, Ordering::Relaxed) {
                    tracing::info!(%reason, "no per-turn cgroup; the /proc sweep alone finds processes that leave the agent's group");
                }
                None
            }
        },
    }
}

/// The two sides of the turn's guard, when the supervision names one and
/// its pipes can be made (logged when not).
fn prepare_guard(
    supervision: &Supervision,
    cgroup: Option<&TurnCgroup>,
) -> (Option<guard::Launch>, Option<guard::Watch>) {
    let Some(exe) = &supervision.guard_exe else {
        return (None, None);
    };
    match guard::prepare(exe, cgroup.map(|c| c.path())) {
        Ok((l, w)) => (Some(l), Some(w)),
        Err(e) => {
            tracing::warn!(error = %e, "cannot prepare the turn's guard; if the runner dies, only the agent's leader dies with it");
            (None, None)
        }
    }
}

/// The agent's command: the whole environment as given, three pipes, and a
/// child that starts with no blocked signal, dies with the runner, leads a
/// session of its own, forks the guard and joins the cgroup before exec.
/// `cgroup` must stay alive until the command was spawned (the child uses
/// its descriptor).
fn command(
    spec: &SpawnSpec,
    cgroup: Option<&TurnCgroup>,
    launch: Option<guard::Launch>,
) -> Command {
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let parent = rustix::process::getpid();
    let procs_fd = cgroup.map(|c| c.procs_fd().as_raw_fd());
    let no_signals = crate::process::reaper::signal_set(&[]);
    let become_user = spec.user.as_ref().map(|u| u.become_in_child());
    // SAFETY: only async-signal-safe calls (sigprocmask, prctl, getppid,
    // setsid, fork, waitpid, open, write, close, setgroups, setgid, setuid as raw
    // system calls) run between fork and exec; nothing allocates or takes
    // a lock. `procs_fd` stays open (owned by the caller's cgroup) until
    // the spawn returned; `launch` and `become_user` are owned by the
    // closure.
    unsafe {
        command.pre_exec(move || {
            // The agent starts with no blocked signal, whatever the
            // spawning thread had blocked.
            libc::pthread_sigmask(libc::SIG_SETMASK, &no_signals, std::ptr::null_mut());
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // The runner may have died before the prctl: then nobody would
            // ever send the signal.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            // A session of its own, with no controlling terminal: opening
            // /dev/tty fails (ENXIO) instead of reaching the runner's
            // terminal, and no read of it stops the agent (SIGTTIN).
            rustix::process::setsid()?;
            // The guard must be forked inside the new session (before the
            // cgroup join: it kills the cgroup and must not be in it).
            if let Some(launch) = &launch {
                launch.start_in_child();
            }
            // After the guard's fork (it keeps the runner's low score):
            // when memory runs out, the kernel kills the agent first.
            crate::process::oom::raise_in_child();
            if let Some(fd) = procs_fd {
                cgroup::join_from_child(BorrowedFd::borrow_raw(fd));
            }
            // Last, so that the guard (forked above) stays the runner's:
            // it can write `cgroup.kill` and the agent cannot kill it.
            if let Some(user) = &become_user {
                user.now()?;
                // A change of uid clears the parent-death signal: set it
                // again as the agent user, and check the parent again.
                rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
                if rustix::process::getppid() != Some(parent) {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
            }
            Ok(())
        });
    }
    command
}

/// Starts a reader per output stream and a writer for stdin (a task of its
/// own: an agent that never reads stdin must not block the turn); returns
/// the readers.
fn start_pipes<F, S>(
    child: &mut Child,
    stdin: Vec<u8>,
    mut feed: Option<mpsc::UnboundedReceiver<Vec<u8>>>,
    output: F,
) -> Vec<JoinHandle<()>>
where
    F: Fn(Stream) -> S,
    S: OutputSink,
{
    let mut readers = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        readers.push(tokio::spawn(pump(stdout, output(Stream::Stdout))));
    }
    if let Some(stderr) = child.stderr.take() {
        readers.push(tokio::spawn(pump(stderr, output(Stream::Stderr))));
    }
    if let Some(mut pipe) = child.stdin.take() {
        tokio::spawn(async move {
            let mut ok = pipe.write_all(&stdin).await.is_ok();
            if let Some(feed) = feed.as_mut() {
                while ok && let Some(bytes) = feed.recv().await {
                    ok = pipe.write_all(&bytes).await.is_ok() && pipe.flush().await.is_ok();
                }
            }
            let _ = pipe.shutdown().await;
        });
    }
    readers
}

/// One started turn and what must go with it: the leader (still the
/// runner's child), its guard and the runner's end of the guard's pipe, the
/// cgroup, the pipe readers and the reaper of adopted orphans.
/// [`TurnProcesses::end`] tears them all down in the order the module doc shows;
/// until then a dropped `TurnProcesses` still kills the leader (`kill_on_drop`).
struct TurnProcesses {
    /// The leader's pid: the turn's process group and session id.
    pid: i32,
    runner: Runner,
    child: Child,
    cgroup: Option<TurnCgroup>,
    /// Held until the group is empty: its close tells the guard the runner
    /// is gone.
    guard_watch: Option<guard::Watch>,
    /// The guard's pid, when it started.
    guard_pid: Option<i32>,
    /// `--agent-user`: every process of it is killed at the sweep.
    user: Option<crate::agent_user::AgentUser>,
    readers: Vec<JoinHandle<()>>,
    collector: JoinHandle<()>,
}

/// How the wait for the leader ended.
struct Waited {
    /// When the first stop signal (or SIGKILL) went to the group: set
    /// once the runner signalled it.
    signalled_at: Option<Instant>,
    killed: bool,
    timed_out: bool,
    guard_died: Option<i32>,
    /// The leader's `rusage` as it exited.
    usage: Option<Usage>,
}

impl TurnProcesses {
    /// Starts the agent with its guard, cgroup, pipes and orphan reaper.
    ///
    /// Errors: the spawn failed; the guard its child may have started and
    /// the cgroup are gone again.
    async fn spawn<F, S>(
        spec: SpawnSpec,
        supervision: &Supervision,
        output: F,
        runner: Runner,
    ) -> Result<TurnProcesses, SpawnError>
    where
        F: Fn(Stream) -> S,
        S: OutputSink,
    {
        let cgroup = turn_cgroup(supervision.cgroup);
        let (launch, guard_watch) = prepare_guard(supervision, cgroup.as_ref());
        let user = spec.user.clone();
        let spawned = tree::spawn(command(&spec, cgroup.as_ref(), launch)).await;
        let guard = guard_watch.as_ref().map(guard::Watch::started);
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                // The child may have started a guard before its exec failed.
                if let Some(Ok(started)) = guard {
                    guard::stand_down(started).await;
                }
                if let Some(c) = cgroup {
                    c.remove(Duration::ZERO).await;
                }
                return Err(SpawnError {
                    program: spec.program,
                    reason: e.to_string(),
                });
            }
        };
        let pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
        tracing::info!(pgid = pid, program = %spec.program, cgroup = cgroup.is_some(), "agent started in a session of its own (no controlling terminal)");
        let guard_pid = match guard {
            Some(Ok(started)) => Some(started.pid),
            Some(Err(reason)) => {
                tracing::warn!(pgid = pid, %reason, "cannot start the turn's guard; if the runner dies, only the agent's leader dies with it");
                None
            }
            None => None,
        };
        let readers = start_pipes(&mut child, spec.stdin, spec.stdin_feed, output);
        let collector = tokio::spawn(tree::reap_adopted_continuously(runner));
        Ok(TurnProcesses {
            pid,
            runner,
            child,
            cgroup,
            guard_watch,
            guard_pid,
            user,
            readers,
            collector,
        })
    }

    /// Waits for the leader's exit without reaping it, obeying `control`
    /// (SIGINT, SIGKILL after the grace period; SIGKILL) and the time cap,
    /// and watching the guard.
    async fn wait(
        &self,
        control: &mut mpsc::UnboundedReceiver<Control>,
        supervision: &Supervision,
    ) -> Waited {
        let pid = self.pid;
        let exited = tokio::task::spawn_blocking(move || wait_without_reaping(pid));
        tokio::pin!(exited);
        let mut waited = Waited {
            signalled_at: None,
            killed: false,
            timed_out: false,
            guard_died: None,
            usage: None,
        };
        let mut control_open = true;
        let mut kill_at: Option<Instant> = None;
        let mut cap_at = supervision
            .time_cap
            .and_then(|cap| Instant::now().checked_add(cap));
        // Fail closed: a turn whose guard is gone would not die with the
        // runner. Disarmed once the runner itself sends SIGKILL to the group
        // (which kills the guard too).
        let guard_gone = guard_gone(self.guard_pid, pid);
        tokio::pin!(guard_gone);
        let mut guard_armed = self.guard_pid.is_some();
        loop {
            let kill_sleep = crate::concurrency::sleep_until(kill_at);
            let cap_sleep = crate::concurrency::sleep_until(cap_at);
            tokio::select! {
                usage = &mut exited => {
                    waited.usage = usage.ok().flatten();
                    if let Some(at) = waited.signalled_at {
                        // How long the CLI takes to stop: what its grace
                        // period must cover.
                        tracing::info!(
                            pgid = pid,
                            after_ms = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX),
                            "agent exited after its stop signal"
                        );
                    }
                    return waited;
                }
                () = &mut guard_gone, if guard_armed => {
                    tracing::warn!(pgid = pid, guard_pid = self.guard_pid, "the turn's guard died before the turn ended; killing every process of the turn, which would not die with the runner");
                    waited.guard_died = self.guard_pid;
                    return waited;
                }
                msg = control.recv(), if control_open => match msg {
                    Some(Control::Interrupt { grace }) => {
                        waited.signalled_at.get_or_insert_with(Instant::now);
                        signal_group(pid, supervision.stop_signal);
                        let at = Instant::now() + grace;
                        kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                    }
                    Some(Control::Kill) => {
                        waited.signalled_at.get_or_insert_with(Instant::now);
                        waited.killed = true;
                        guard_armed = false;
                        signal_group(pid, Signal::KILL);
                    }
                    // The turn is gone: nobody can interrupt any more.
                    None => control_open = false,
                },
                _ = kill_sleep => {
                    let members = super::tree::describe_group(pid).join(" ");
                    tracing::warn!(pgid = pid, members, "agent still running after the grace period; SIGKILL to its process group");
                    waited.killed = true;
                    guard_armed = false;
                    signal_group(pid, Signal::KILL);
                    kill_at = None;
                }
                _ = cap_sleep => {
                    cap_at = None;
                    if waited.signalled_at.is_none() {
                        tracing::warn!(pgid = pid, "the turn's time cap is reached; interrupting the agent");
                        waited.signalled_at.get_or_insert_with(Instant::now);
                        waited.timed_out = true;
                        signal_group(pid, supervision.stop_signal);
                        kill_at = Some(Instant::now() + supervision.cap_grace);
                    }
                }
            }
        }
    }

    /// After the leader exited: kills the rest of the turn, reaps the
    /// leader, drains the pipes for at most `drain`, waits for the group to
    /// be empty, then closes the guard's pipe and removes the cgroup.
    async fn end(mut self, waited: Waited, drain: Duration) -> Exit {
        let pid = self.pid;
        tracing::debug!(pgid = pid, "agent leader exited");
        let left_behind = self.sweep().await;
        let status = self.child.wait().await.ok();
        tree::forget(pid);
        self.drain(drain).await;
        // The guard is in the group: an empty group is a dead (and reaped)
        // guard, which must not act on its pipe's EOF.
        wait_group_gone(pid, self.runner, SWEEP_BOUND).await;
        tracing::debug!(pgid = pid, "process group empty");
        drop(self.guard_watch);
        self.collector.abort();
        let cgroup_usage = self.cgroup.as_ref().and_then(TurnCgroup::usage);
        if let Some(c) = self.cgroup {
            c.remove(SWEEP_BOUND).await;
        }
        Exit {
            status,
            signalled: waited.signalled_at.is_some(),
            killed: waited.killed,
            pgid: pid,
            timed_out: waited.timed_out,
            swept: left_behind
                .iter()
                .filter(|l| l.by != KilledBy::ProcessGroup)
                .count(),
            left_behind,
            guard_died: waited.guard_died,
            usage: cgroup_usage.or(waited.usage),
        }
    }

    /// The live processes of the turn but its leader (a zombie now) and
    /// its guard, before anything is killed: what the agent left behind,
    /// each with what is about to kill it.
    fn left_behind(&self) -> Vec<(tree::Victim, KilledBy)> {
        let in_cgroup: Vec<i32> = self.cgroup.as_ref().map(|c| c.pids()).unwrap_or_default();
        let mut seeds = vec![self.pid];
        seeds.extend(self.guard_pid);
        seeds.extend(&in_cgroup);
        tree::turn_members(&tree::scan(), self.runner, &seeds)
            .into_iter()
            .filter(|p| !p.zombie && p.pid != self.pid && Some(p.pid) != self.guard_pid)
            .map(|p| {
                let by = if p.pgid == self.pid {
                    KilledBy::ProcessGroup
                } else if in_cgroup.contains(&p.pid) {
                    KilledBy::Cgroup
                } else {
                    KilledBy::Sweep
                };
                (tree::Victim::of(&p), by)
            })
            .collect()
    }

    /// The leader is a zombie: its group id is still ours. Kills the rest of
    /// the group (the guard included), the cgroup, then whatever left both;
    /// returns what was killed (the guard aside).
    async fn sweep(&self) -> Vec<LeftBehind> {
        let pid = self.pid;
        // Looked at first: `cgroup.kill` leaves the sweep only zombies to
        // find, and the kill must still be reported (issue 17).
        let before = self.left_behind();
        signal_group(pid, Signal::KILL);
        if let Some(c) = &self.cgroup
            && let Err(e) = c.kill()
        {
            tracing::warn!(cgroup = %c.path().display(), error = %e, "cannot kill the turn's cgroup");
        }
        if let Some(user) = &self.user {
            match user_kill::kill_agent_user(user, self.runner) {
                UserKill::Sent => {
                    tracing::debug!(uid = user.uid, "SIGKILL to every process of the agent user");
                }
                UserKill::Shared { pid: other } => {
                    tracing::warn!(
                        uid = user.uid,
                        pid = other,
                        "a process of the agent user runs outside this runner's tree, so the runner does not kill every process of that user at the turn's end: the cgroup and the sweep alone end the turn's processes; give the agent a user of its own (--agent-user)"
                    );
                }
                UserKill::Failed(e) => {
                    tracing::warn!(uid = user.uid, error = %e, "cannot kill every process of the agent user at the turn's end; the cgroup and the sweep alone end the turn's processes");
                }
            }
        }
        let seeds = || {
            let mut s = vec![pid];
            s.extend(self.guard_pid);
            if let Some(c) = &self.cgroup {
                s.extend(c.pids());
            }
            s
        };
        let report = tree::sweep(self.runner, pid, seeds, SWEEP_BOUND).await;
        let mut left: Vec<LeftBehind> = before
            .iter()
            .map(|(v, by)| LeftBehind {
                pid: v.pid,
                name: v.name.clone(),
                by: *by,
            })
            .collect();
        // What forked after the first look and the sweep found alive.
        for v in &report.killed {
            let known = before
                .iter()
                .any(|(b, _)| b.pid == v.pid && b.start_time == v.start_time);
            if !known && Some(v.pid) != self.guard_pid {
                left.push(LeftBehind {
                    pid: v.pid,
                    name: v.name.clone(),
                    by: KilledBy::Sweep,
                });
            }
        }
        if !report.left.is_empty() {
            let left_pids = report
                .left
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(", ");
            tracing::error!(pgid = pid, pids = %left_pids, "processes of the turn are still alive after the sweep");
        } else if !left.is_empty() {
            tracing::info!(
                pgid = pid,
                killed = left.len(),
                processes = %left_behind_text(&left),
                "killed processes the agent left behind"
            );
        }
        tracing::debug!(pgid = pid, killed = left.len(), "sweep done");
        left
    }

    /// Reads what the pipes hold for at most `bound`, then closes them: a
    /// process that escaped the sweep may keep them open.
    async fn drain(&mut self, bound: Duration) {
        let deadline = Instant::now() + bound;
        for reader in self.readers.iter_mut() {
            if tokio::time::timeout_at(deadline, &mut *reader)
                .await
                .is_err()
            {
                reader.abort();
                tracing::warn!(
                    pgid = self.pid,
                    "agent output still open after the drain bound; closed"
                );
            }
        }
        tracing::debug!(pgid = self.pid, "pipes drained");
    }
}

/// Resolves when the guard `guard` (a member of session `session`) is gone:
/// its pidfd reads as exited, or it is already gone (reaped, its pid maybe
/// reused). Never resolves without a guard, or when the kernel offers no
/// pidfd (logged): then only its pipe watches the runner.
async fn guard_gone(guard: Option<i32>, session: i32) {
    let Some(pid) = guard.and_then(Pid::from_raw) else {
        return std::future::pending().await;
    };
    let fd = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::NONBLOCK) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return,
        Err(e) => {
            tracing::warn!(guard_pid = guard, error = %e, "cannot watch the turn's guard (pidfd_open); a guard the agent kills goes unnoticed");
            return std::future::pending().await;
        }
    };
    // The pidfd names whatever process has the pid now: if the guard died
    // and was reaped before it was opened, that is not a member of the
    // turn's session (whose id stays reserved while one lives).
    if !rustix::process::getsid(Some(pid)).is_ok_and(|s| s.as_raw_nonzero().get() == session) {
        return;
    }
    // SAFETY: the AsyncFd owns the OwnedFd, which stays open, the same
    // descriptor, until the AsyncFd is dropped.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    };
    match registered {
        Ok(fd) => {
            let _ = fd.readable().await;
        }
        Err(e) => {
            tracing::warn!(guard_pid = guard, error = %e, "cannot watch the turn's guard (pidfd); a guard the agent kills goes unnoticed");
            std::future::pending::<()>().await;
        }
    }
}

/// Waits until the leader `pid` exited, leaving it a zombie (tokio's
/// `Child` reaps it), and returns its `rusage` then: Linux's `waitid`
/// takes a fifth argument that the C library's wrapper leaves out, filled
/// as for `getrusage(RUSAGE_BOTH)` even with `WNOWAIT`.
fn wait_without_reaping(pid: i32) -> Option<Usage> {
    if pid <= 0 {
        return None;
    }
    loop {
        // SAFETY: zeroed siginfo_t and rusage are valid values of these
        // plain C structs, and both outlive the call, which only writes them.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: the raw waitid system call with valid pointers to the two
        // structs above; it does not keep them.
        let r = unsafe {
            libc::syscall(
                libc::SYS_waitid,
                libc::P_PID,
                pid,
                &raw mut info,
                libc::WEXITED | libc::WNOWAIT,
                &raw mut usage,
            )
        };
        if r == 0 {
            let time = |t: libc::timeval| {
                Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
                    + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
            };
            return Some(Usage {
                cpu: time(usage.ru_utime) + time(usage.ru_stime),
                // Kibibytes on Linux.
                peak_rss_bytes: u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024,
                source: UsageSource::Rusage,
            });
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

fn signal_group(pgid: i32, signal: Signal) {
    if let Some(pid) = Pid::from_raw(pgid) {
        match rustix::process::kill_process_group(pid, signal) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => {}
            Err(e) => tracing::warn!(pgid, error = %e, "cannot signal the agent's process group"),
        }
    }
}

/// Whether any process of group `pgid` exists (zombies included).
pub fn group_alive(pgid: i32) -> bool {
    Pid::from_raw(pgid).is_some_and(|p| rustix::process::test_kill_process_group(p).is_ok())
}

/// Waits until no process of group `pgid` exists, reaping the runner's
/// adopted zombies meanwhile (an orphan of the group is one).
async fn wait_group_gone(pgid: i32, runner: Runner, bound: Duration) {
    let deadline = Instant::now() + bound;
    loop {
        tree::reap_adopted(&tree::children(), runner);
        if !group_alive(pgid) {
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                pgid,
                "the agent's process group is not empty after SIGKILL and the sweep"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_names_the_environment_without_its_values() {
        let spec = SpawnSpec {
            program: "agent".into(),
            args: vec!["--flag".into()],
            cwd: PathBuf::from("/repo"),
            env: vec![("ACME_API_KEY".into(), "connector-secret-value".into())],
            stdin: b"the prompt".to_vec(),
            stdin_feed: None,
            user: None,
        };
        let shown = format!("{spec:?} {spec:#?}");
        assert!(shown.contains("ACME_API_KEY"), "{shown}");
        assert!(!shown.contains("connector-secret-value"), "{shown}");
        assert!(!shown.contains("the prompt"), "{shown}");
    }
}
