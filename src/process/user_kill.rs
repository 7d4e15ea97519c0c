//! `--agent-user`: every process of the agent user killed at once at the
//! turn's end, cgroup or not (PROTOCOL.md 4.4, SECURITY.md).
//!
//! A `/proc` scan is never atomic with fork: a loop whose every generation
//! forks its successor, calls `setsid` and exits can be between two reads
//! of every scan. `kill(-1, SIGKILL)` sent by a process that runs as the
//! agent user reaches every process that user may signal (real or saved
//! uid the agent's) in one pass under the kernel's task-list lock, and a
//! fork that races it fails (its parent has the fatal signal pending before
//! the child is linked in): no generation outlives it. The runner itself,
//! root, is not among them, nor the turn's guard (root too), which the
//! group kill and the sweep end.
//!
//! The same call would kill that user's processes outside the sandbox (a
//! user shared with the host). It is sent only when every live process of
//! the user descends from the runner (in a container of its own, all do);
//! otherwise the runner says so and the sweep alone applies.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Stdio;

use super::tree::{self, ProcInfo, Runner};
use crate::agent_user::AgentUser;

/// What [`kill_agent_user`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum UserKill {
    /// Every process of the user was sent SIGKILL.
    Sent,
    /// Not sent: `pid`, a process of the user, runs outside the runner's
    /// tree.
    Shared {
        /// That process.
        pid: i32,
    },
    /// Not sent: the killer could not be started (the OS error).
    Failed(String),
}

/// Sends SIGKILL to every process of `user` from a child that becomes it,
/// unless a process of `user` runs outside `runner`'s tree.
pub fn kill_agent_user(user: &AgentUser, runner: Runner) -> UserKill {
    let procs = tree::scan();
    if let Some(pid) = outside_the_runner(&procs, runner, |pid| signalled_by(pid, user.uid)) {
        return UserKill::Shared { pid };
    }
    match kill_all_as(user) {
        Ok(()) => UserKill::Sent,
        Err(e) => UserKill::Failed(e.to_string()),
    }
}

/// The first live process of `procs` that `is_target` picks and whose
/// ancestry does not lead to `runner`. A chain broken by an exit (its
/// parent gone between two reads) is read again once: the orphan has been
/// re-parented to its subreaper by then; one still broken is taken as the
/// runner's (an escape of the turn always descends from the runner, the
/// child subreaper, and must not be able to switch the kill off).
fn outside_the_runner(
    procs: &[ProcInfo],
    runner: Runner,
    is_target: impl Fn(i32) -> bool,
) -> Option<i32> {
    let parent: std::collections::BTreeMap<i32, i32> =
        procs.iter().map(|p| (p.pid, p.ppid)).collect();
    procs
        .iter()
        .filter(|p| !p.zombie && p.pid != runner.pid && is_target(p.pid))
        .find(|p| {
            let mut at = p.pid;
            let mut reread = false;
            // Bounded: a cycle cannot exist in a consistent tree, but the
            // scan is not one instant.
            for _ in 0..procs.len() + 2 {
                if at == runner.pid {
                    return false;
                }
                let up = match parent.get(&at) {
                    Some(up) => *up,
                    None if !reread => {
                        reread = true;
                        match tree::read_proc(p.pid) {
                            Some(now) => {
                                at = now.ppid;
                                continue;
                            }
                            None => return false,
                        }
                    }
                    None => return false,
                };
                if up == runner.pid {
                    return false;
                }
                if up <= 1 {
                    // Init, or a process entered from outside the
                    // namespace (`docker exec`): not the runner's.
                    return true;
                }
                at = up;
            }
            false
        })
        .map(|p| p.pid)
}

/// Whether a process running as `uid` may signal `pid`: its real or saved
/// uid is `uid` (`/proc/<pid>/status`). False if it cannot be read.
fn signalled_by(pid: i32, uid: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let Some(line) = text.lines().find_map(|l| l.strip_prefix("Uid:")) else {
        return false;
    };
    // Real, effective, saved, filesystem.
    let ids: Vec<u32> = line
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    matches!(ids.as_slice(), [real, _, saved, _] if *real == uid || *saved == uid)
}

/// Forks a child that becomes `user` and calls `kill(-1, SIGKILL)`, and
/// waits for it. The child never execs: it exits from `pre_exec`, which the
/// parent sees as a successful spawn (the exec-error pipe closes).
fn kill_all_as(user: &AgentUser) -> io::Result<()> {
    let become_user = user.become_in_child();
    let mut command = std::process::Command::new("/");
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: between fork and exit only raw system calls (setgroups,
    // setgid, setuid, kill, exit) run; nothing allocates or takes a lock.
    unsafe {
        command.pre_exec(move || {
            become_user.now()?;
            // ESRCH: no process of the user is left to signal.
            if libc::kill(-1, libc::SIGKILL) != 0
                && io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
            {
                return Err(io::Error::last_os_error());
            }
            libc::_exit(0)
        });
    }
    // An agent process can try to kill the killer between its change of
    // user and its kill (it is one of the user's pids for that instant):
    // one killed by a signal is started again.
    let mut status = command.status()?;
    for _ in 0..KILLER_ATTEMPTS {
        if std::os::unix::process::ExitStatusExt::signal(&status).is_none() {
            break;
        }
        status = command.status()?;
    }
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("the killer exited with {status}")))
    }
}

/// Restarts of a killer that a signal ended before its `kill(-1)`.
const KILLER_ATTEMPTS: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32) -> ProcInfo {
        ProcInfo {
            pid,
            ppid,
            pgid: pid,
            sid: pid,
            zombie: false,
            start_time: 1,
        }
    }

    const RUNNER: Runner = Runner { pid: 10, pgid: 10 };

    #[test]
    fn a_process_below_the_runner_is_inside() {
        let procs = [p(1, 0), p(10, 1), p(20, 10), p(30, 20)];
        assert_eq!(outside_the_runner(&procs, RUNNER, |pid| pid == 30), None);
    }

    #[test]
    fn a_process_beside_the_runner_or_entered_from_outside_is_outside() {
        let procs = [p(1, 0), p(10, 1), p(40, 1), p(50, 40), p(60, 0)];
        assert_eq!(
            outside_the_runner(&procs, RUNNER, |pid| pid == 50),
            Some(50)
        );
        assert_eq!(
            outside_the_runner(&procs, RUNNER, |pid| pid == 60),
            Some(60)
        );
    }

    #[test]
    fn a_broken_chain_is_the_runners() {
        // 70's parent exited between the reads (and 70 is gone too): an
        // escape must not switch the kill off.
        let procs = [p(1, 0), p(10, 1), p(i32::MAX - 1, i32::MAX - 2)];
        assert_eq!(
            outside_the_runner(&procs, RUNNER, |pid| pid == i32::MAX - 1),
            None
        );
    }
}
