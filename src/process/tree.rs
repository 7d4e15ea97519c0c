//! A turn's process tree beyond its process group: every descendant of the
//! agent, whatever its group or session (agents' tool shells call `setsid`).
//!
//! - The runner is a child subreaper ([`become_subreaper`]): an orphan of the
//!   agent's tree is re-parented to the runner, not to PID 1, so the tree
//!   stays linked through `/proc/<pid>/stat` parent ids.
//! - The runner must then reap those orphans itself, without a catch-all
//!   `waitpid(-1)` (it would steal the exit status of a child tokio waits
//!   for). [`reap_adopted`] reaps only zombie children that the runner did
//!   not spawn itself: a child spawned through [`spawn`] is registered under
//!   the same lock as the reap decision, and a child the runner spawns
//!   elsewhere (git, the credential helper) stays in the runner's own
//!   process group, which is never reaped here. Code that spawns a child in
//!   another group must spawn it through [`spawn`]. The turn's guard is
//!   adopted, not spawned (the agent's child forks it), and reaped here.
//! - [`sweep`] kills every live process of the turn (descendants of the
//!   leader and its guard, processes of the turn's cgroup, and the runner's
//!   adopted children), and repeats until a scan finds none, so that what
//!   forks during the sweep is caught too. Each round also kills whole
//!   every process group of the turn that holds no process outside it: a
//!   process that forks its successor and exits in a tight loop is gone
//!   before a kill by pid, its group is not.
//! - Signals go through a pidfd opened after checking the process's start
//!   time, so a recycled pid is never hit.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::mpsc as std_mpsc;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use rustix::process::{Pid, PidfdFlags, Signal, WaitOptions};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// One process as `/proc/<pid>/stat` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    /// Process id.
    pub pid: i32,
    /// Parent process id.
    pub ppid: i32,
    /// Process group id.
    pub pgid: i32,
    /// Session id.
    pub sid: i32,
    /// Exited but not yet reaped (state `Z`).
    pub zombie: bool,
    /// Start time in clock ticks since boot: with the pid, the identity of a
    /// process (a recycled pid has a later start time).
    pub start_time: u64,
}

/// Parses the text of `/proc/<pid>/stat`. `None` if it is malformed.
pub fn parse_stat(pid: i32, text: &str) -> Option<ProcInfo> {
    // The command name may contain spaces and parentheses: fields start
    // after the last ')'.
    let (_, rest) = text.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
    // cmajflt utime stime cutime cstime priority nice num_threads
    // itrealvalue starttime
    Some(ProcInfo {
        pid,
        zombie: *fields.first()? == "Z",
        ppid: fields.get(1)?.parse().ok()?,
        pgid: fields.get(2)?.parse().ok()?,
        sid: fields.get(3)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Reads one process. `None` if it does not exist (any more).
pub fn read_proc(pid: i32) -> Option<ProcInfo> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

/// Every process visible in `/proc`.
pub fn scan() -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read_proc)
        .collect()
}

/// The runner's own pid and process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Runner {
    /// Its pid.
    pub pid: i32,
    /// Its process group (never a turn's).
    pub pgid: i32,
}

impl Runner {
    /// This process.
    pub fn current() -> Runner {
        Runner {
            pid: rustix::process::getpid().as_raw_nonzero().get(),
            pgid: rustix::process::getpgrp().as_raw_nonzero().get(),
        }
    }

    /// Whether `p` is a child the runner adopted or spawned in another
    /// process group (a turn's process, never one of the runner's own
    /// helpers, which stay in its group).
    fn foreign_child(&self, p: &ProcInfo) -> bool {
        p.ppid == self.pid && p.pgid != self.pgid
    }
}

/// The processes of the turn in `procs` (zombies included): `seeds` (the
/// leader, its guard, the members of the turn's cgroup), the runner's
/// children outside its own process group, and all their descendants.
pub fn turn_members(procs: &[ProcInfo], runner: Runner, seeds: &[i32]) -> Vec<ProcInfo> {
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    let by_pid: BTreeMap<i32, ProcInfo> = procs.iter().map(|p| (p.pid, *p)).collect();
    for p in procs {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut stack: Vec<i32> = seeds.to_vec();
    stack.extend(
        procs
            .iter()
            .filter(|p| runner.foreign_child(p))
            .map(|p| p.pid),
    );
    let mut seen = BTreeSet::new();
    while let Some(pid) = stack.pop() {
        if pid == runner.pid || !seen.insert(pid) {
            continue;
        }
        if let Some(kids) = children.get(&pid) {
            stack.extend(kids);
        }
    }
    seen.iter()
        .filter_map(|pid| by_pid.get(pid).copied())
        .collect()
}

/// Makes this process a child subreaper (`PR_SET_CHILD_SUBREAPER`), once.
/// Returns whether it is one.
pub fn become_subreaper() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    // The argument is a flag (non-zero sets it); rustix takes it as a pid.
    let on = Some(rustix::process::getpid());
    *DONE.get_or_init(|| match rustix::process::set_child_subreaper(on) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(error = %e, "cannot become a child subreaper; processes that leave the agent's process group may outlive its turn");
            false
        }
    })
}

/// Pids of children spawned through [`spawn`] and not yet reaped by tokio.
static SPAWNED: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn spawned() -> MutexGuard<'static, BTreeSet<i32>> {
    crate::concurrency::lock(&SPAWNED)
}

type Job = Box<dyn FnOnce() + Send>;

/// The one thread that forks the turn's processes. `PR_SET_PDEATHSIG` fires
/// when the *thread* that forked a child exits, and a runtime may retire
/// its threads; this one lives as long as the process.
fn spawner() -> io::Result<std_mpsc::Sender<Job>> {
    static SPAWNER: OnceLock<Option<Mutex<std_mpsc::Sender<Job>>>> = OnceLock::new();
    let slot = SPAWNER.get_or_init(|| {
        let (tx, rx) = std_mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("hosted-boot-spawner".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    match slot {
        Some(tx) => Ok(crate::concurrency::lock(tx).clone()),
        None => Err(io::Error::other("cannot start the spawner thread")),
    }
}

/// Spawns `command` from the long-lived spawner thread and registers its
/// pid (under the lock [`reap_adopted`] takes) until [`forget`] is called
/// after tokio reaped it.
///
/// Errors: the spawn failed (program not found, not executable, bad working
/// directory, a `pre_exec` step failed), or the spawner thread is gone.
pub async fn spawn(mut command: Command) -> io::Result<Child> {
    let handle = tokio::runtime::Handle::current();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        // tokio registers the child with this runtime's process driver.
        let _runtime = handle.enter();
        let mut registry = spawned();
        let result = command.spawn();
        if let Ok(child) = &result
            && let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok())
        {
            registry.insert(pid);
        }
        drop(registry);
        let _ = tx.send(result);
    });
    spawner()?
        .send(job)
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    rx.await
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}

/// Unregisters `pid` once tokio has reaped it.
pub fn forget(pid: i32) {
    spawned().remove(&pid);
}

/// The runner's children as `/proc/self/task/*/children` lists them (an
/// adopted orphan may hang under any of the runner's threads).
pub fn children() -> Vec<ProcInfo> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut pids = BTreeSet::new();
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            pids.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    pids.into_iter().filter_map(read_proc).collect()
}

/// Reaps the zombies among `procs` that the runner adopted: its zombie
/// children outside its own process group that it did not spawn through
/// [`spawn`]. Returns how many were reaped.
pub fn reap_adopted(procs: &[ProcInfo], runner: Runner) -> usize {
    let registry = spawned();
    let mut reaped = 0;
    for p in procs {
        if !(p.zombie && runner.foreign_child(p)) || registry.contains(&p.pid) {
            continue;
        }
        let Some(pid) = Pid::from_raw(p.pid) else {
            continue;
        };
        if let Ok(Some(_)) = rustix::process::waitpid(Some(pid), WaitOptions::NOHANG) {
            reaped += 1;
        }
    }
    reaped
}

/// Reaps adopted orphans as they exit: on every SIGCHLD (at most every
/// 10 ms) and every second. Runs until aborted.
pub async fn reap_adopted_continuously(runner: Runner) {
    let mut sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).ok();
    loop {
        match &mut sigchld {
            Some(s) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), s.recv()).await;
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
        reap_adopted(&children(), runner);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sends `signal` to `p` if the process with that pid is still the one
/// scanned (same start time). Returns whether the signal was sent.
pub fn signal_exact(p: &ProcInfo, signal: Signal) -> bool {
    let Some(pid) = Pid::from_raw(p.pid) else {
        return false;
    };
    let Ok(pidfd) = rustix::process::pidfd_open(pid, PidfdFlags::empty()) else {
        return false;
    };
    // The pidfd pins whichever process has this pid now: it is the scanned
    // one only if its start time is unchanged.
    match read_proc(p.pid) {
        Some(now) if now.start_time == p.start_time => {
            rustix::process::pidfd_send_signal(&pidfd, signal).is_ok()
        }
        _ => false,
    }
}

/// What a sweep did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Processes outside the turn's process group it sent SIGKILL to, in
    /// the order it found them.
    pub killed: Vec<Victim>,
    /// Processes still alive when the bound was reached (empty normally).
    pub left: Vec<i32>,
}

/// A process of the turn that was killed after its leader exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Victim {
    /// Its pid.
    pub pid: i32,
    /// Its start time (with the pid, its identity; see [`ProcInfo`]).
    pub start_time: u64,
    /// Its command name (`/proc/<pid>/comm`: the program's file name, at
    /// most 15 bytes), empty if it could not be read.
    pub name: String,
}

impl Victim {
    /// `p`, named from `/proc/<pid>/comm` now.
    pub fn of(p: &ProcInfo) -> Victim {
        Victim {
            pid: p.pid,
            start_time: p.start_time,
            name: command_name(p.pid),
        }
    }
}

/// The command name of `pid` (`/proc/<pid>/comm`), empty if it is gone.
pub fn command_name(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|t| t.trim_end_matches('\n').to_string())
        .unwrap_or_default()
}

/// The live members of process group `pgid`, one `pid:name:state:wchan`
/// each (the state letter of `/proc/<pid>/stat`, the kernel function the
/// process waits in), for the log line that says an agent outlived its
/// grace: whether it was stuck in the kernel or busy tells a CLI that
/// ignores its stop signal from a slow one.
pub fn describe_group(pgid: i32) -> Vec<String> {
    let mut members: Vec<ProcInfo> = scan()
        .into_iter()
        .filter(|p| p.pgid == pgid && !p.zombie)
        .collect();
    members.sort_by_key(|p| p.pid);
    members
        .iter()
        .map(|p| {
            let state = std::fs::read_to_string(format!("/proc/{}/stat", p.pid))
                .ok()
                .and_then(|t| Some(t.rsplit_once(')')?.1.split_whitespace().next()?.to_string()))
                .unwrap_or_default();
            let wchan =
                std::fs::read_to_string(format!("/proc/{}/wchan", p.pid)).unwrap_or_default();
            format!("{}:{}:{state}:{wchan}", p.pid, command_name(p.pid))
        })
        .collect()
}

/// Kills every live process of the turn, repeating until a scan finds none
/// or `bound` passes. `seeds` gives the turn's known processes each round
/// (the leader, its guard, the cgroup's members). `group` is the turn's
/// process group, already sent SIGKILL: its members are killed again if
/// still alive but not listed in [`SweepReport::killed`].
///
/// Why a scan that finds nothing proves the turn empty: no reaper of the
/// runner runs while a round scans (the spawn registry's lock is held), so
/// a process of the turn alive when `/proc` was listed is still there when
/// its line is read, alive or a zombie, and so is its oldest ancestor in
/// the turn (a child of the runner, the child subreaper, which only the
/// runner reaps). A round that finds a zombie of the turn (the leader
/// aside, which tokio reaps) is not the last: what it forked before it
/// died may have been born after the listing. Without a cgroup a loop that
/// forks its successor and exits is chased a generation a round; between
/// rounds the runner's children (every orphaned generation) are killed in
/// a tight loop, which catches one alive within a few passes.
pub async fn sweep<F>(runner: Runner, group: i32, seeds: F, bound: Duration) -> SweepReport
where
    F: Fn() -> Vec<i32>,
{
    sweep_sparing(runner, group, seeds, None, bound).await
}

/// [`sweep`], leaving alone every process of session `spare`: an agent
/// started ahead of its turn (issue 38), which belongs to the turn about
/// to start. No process of an earlier turn can be in it: a session is
/// joined only by being born in it, and that one was made after the
/// earlier turn's own sweep proved it empty.
pub async fn sweep_sparing<F>(
    runner: Runner,
    group: i32,
    seeds: F,
    spare: Option<i32>,
    bound: Duration,
) -> SweepReport
where
    F: Fn() -> Vec<i32>,
{
    let deadline = Instant::now() + bound;
    let mut killed: Vec<Victim> = Vec::new();
    let mut seen = BTreeSet::new();
    let spared = |p: &ProcInfo| spare.is_some_and(|sid| p.sid == sid);
    loop {
        let (procs, live, unsettled) = {
            let registry = spawned();
            kill_orphans(&registry, runner, spare);
            let procs = scan();
            let mut members = turn_members(&procs, runner, &seeds());
            members.retain(|p| !spared(p));
            let unsettled: Vec<i32> = members
                .iter()
                .filter(|p| p.zombie && !registry.contains(&p.pid) && !threads_alive(p.pid))
                .map(|p| p.pid)
                .collect();
            let live: Vec<ProcInfo> = members
                .into_iter()
                .filter(|p| !p.zombie || threads_alive(p.pid))
                .collect();
            (procs, live, unsettled)
        };
        if live.is_empty() && unsettled.is_empty() {
            return SweepReport {
                killed,
                left: Vec::new(),
            };
        }
        // A process that forks its successor and exits in a tight loop
        // lives about one fork: found by pid, it is gone before the kill
        // and its child goes on. Its group outlives each generation, and a
        // group kill is atomic with fork (a child forked while it is sent
        // gets it too): each group of the turn is killed whole.
        for pgid in turn_groups(&procs, &live, runner, group) {
            if let Some(pgid) = Pid::from_raw(pgid) {
                let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
            }
        }
        for p in &live {
            // Named before the kill: a dead process has no `comm`.
            let victim =
                (p.pgid != group && !seen.contains(&(p.pid, p.start_time))).then(|| Victim::of(p));
            if signal_exact(p, Signal::KILL)
                && let Some(v) = victim
            {
                seen.insert((v.pid, v.start_time));
                killed.push(v);
            }
        }
        // The zombies of this round go now: the next round's scan must
        // find only what is new.
        reap_adopted(&procs, runner);
        if Instant::now() >= deadline {
            // A zombie nobody could reap is reported too: the turn is not
            // proven empty.
            let mut left: Vec<i32> = live.iter().map(|p| p.pid).collect();
            left.extend(unsettled);
            return SweepReport { killed, left };
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether a process `/proc` shows as a zombie still has a live thread: its
/// main thread exited (`SYS_exit`) while another runs on, a classic way to
/// hide from a scanner that skips zombies (issue 32). SIGKILL to its pid
/// ends the whole group.
fn threads_alive(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|task| {
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|text| {
                let (_, rest) = text.rsplit_once(')')?;
                rest.split_whitespace()
                    .next()
                    .map(|state| state != "Z" && state != "X")
            })
            .unwrap_or(false)
    })
}

/// Passes of [`kill_orphans`] per round of the sweep.
const ORPHAN_PASSES: usize = 64;

/// SIGKILL to the runner's live children outside its process group that it
/// did not spawn through [`spawn`] (the turn's orphans), pass after pass
/// until one finds none or [`ORPHAN_PASSES`] are done. A pass reads a few
/// small files (`/proc/self/task/*/children`): fast enough to catch a
/// generation of a re-forking loop alive between its parent's exit and its
/// own. `registry` is held: no pid read here can be reaped and reused
/// before its signal.
fn kill_orphans(registry: &BTreeSet<i32>, runner: Runner, spare: Option<i32>) {
    for _ in 0..ORPHAN_PASSES {
        let mut found = false;
        for p in children() {
            if (p.zombie && !threads_alive(p.pid))
                || !runner.foreign_child(&p)
                || registry.contains(&p.pid)
                || spare.is_some_and(|sid| p.sid == sid)
            {
                continue;
            }
            found = true;
            signal_exact(&p, Signal::KILL);
        }
        if !found {
            return;
        }
    }
}

/// The process groups of `live` (turn members) that hold no process of
/// `procs` outside the turn: safe to kill whole. Never the runner's group,
/// nor `group` (the turn's, already killed).
fn turn_groups(procs: &[ProcInfo], live: &[ProcInfo], runner: Runner, group: i32) -> BTreeSet<i32> {
    let members: BTreeSet<i32> = live.iter().map(|p| p.pid).collect();
    let mut groups: BTreeSet<i32> = live
        .iter()
        .map(|p| p.pgid)
        .filter(|g| *g != runner.pgid && *g != group && *g > 1)
        .collect();
    // A group a process outside the turn is in (an agent's process may
    // join a group of its session with setpgid) is left to the pid kills.
    for p in procs {
        if !p.zombie && !members.contains(&p.pid) {
            groups.remove(&p.pgid);
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, pgid: i32) -> ProcInfo {
        ProcInfo {
            pid,
            ppid,
            pgid,
            sid: 1,
            zombie: false,
            start_time: 1,
        }
    }

    #[test]
    fn stat_lines_parse_with_odd_command_names() {
        let text = "42 (a) b (c)) S 7 42 1 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 12345 0 0";
        let info = parse_stat(42, text).unwrap();
        assert_eq!(
            info,
            ProcInfo {
                pid: 42,
                ppid: 7,
                pgid: 42,
                sid: 1,
                zombie: false,
                start_time: 12345
            }
        );
        assert!(parse_stat(1, "1 (x) Z 0").is_none());
        let me = read_proc(std::process::id() as i32).unwrap();
        assert_eq!(me.pid, std::process::id() as i32);
        assert!(!me.zombie);
    }

    #[test]
    fn only_groups_wholly_of_the_turn_are_killed_whole() {
        let runner = Runner { pid: 10, pgid: 10 };
        let procs = vec![
            p(10, 1, 10),  // the runner
            p(20, 10, 20), // the leader (its group: the turn's)
            p(30, 10, 30), // a daemon's group, all of the turn
            p(31, 30, 30),
            p(40, 10, 40), // a member in a group an outsider is in too
            p(41, 1, 40),  // the outsider
            p(50, 10, 10), // a member in the runner's group
        ];
        let live: Vec<ProcInfo> = [20, 30, 31, 40, 50]
            .iter()
            .map(|pid| *procs.iter().find(|p| p.pid == *pid).unwrap())
            .collect();
        assert_eq!(turn_groups(&procs, &live, runner, 20), BTreeSet::from([30]));
    }

    #[test]
    fn members_are_descendants_of_seeds_and_adopted_children() {
        let runner = Runner { pid: 10, pgid: 10 };
        let procs = vec![
            p(10, 1, 10),  // the runner
            p(11, 10, 10), // a helper of the runner (its own group): not a member
            p(12, 11, 10), // the helper's child: not a member
            p(20, 10, 20), // the leader
            p(21, 20, 20), // its child
            p(22, 21, 99), // a grandchild in a new session
            p(30, 10, 30), // an orphan the runner adopted (left the group)
            p(31, 30, 30), // its child
            p(40, 1, 40),  // unrelated
        ];
        let pids = |m: Vec<ProcInfo>| m.iter().map(|p| p.pid).collect::<Vec<_>>();
        assert_eq!(
            pids(turn_members(&procs, runner, &[20])),
            vec![20, 21, 22, 30, 31]
        );
        // A seed found only through the cgroup counts with its descendants.
        assert_eq!(
            pids(turn_members(&procs, runner, &[40])),
            vec![20, 21, 22, 30, 31, 40]
        );
        // The runner itself never is a member, even as a seed.
        assert_eq!(
            pids(turn_members(&procs, runner, &[10])),
            vec![20, 21, 22, 30, 31]
        );
    }
}
