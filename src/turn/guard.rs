//! The turn's guard: `hosted-boot turn-guard`, a tiny process in the
//! agent's process group whose stdin is a pipe from the runner. If the
//! runner dies, even by SIGKILL, the pipe's write end closes, the guard
//! reads EOF and kills the turn: `cgroup.kill` of the turn's cgroup (then
//! removes it), then SIGKILL to its own process group, itself included.
//!
//! `PR_SET_PDEATHSIG` on the leader kills only the leader; the guard is its
//! equivalent for the whole group. While the guard lives, the group id is
//! also reserved. At a turn's normal end the runner kills the group, guard
//! included, and the guard does nothing.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::Command;

/// The signals a guard ignores: the group's SIGINT (an interrupt) and
/// terminal signals. Only SIGKILL, or its pipe's EOF, ends a guard.
const IGNORED: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The command that starts a guard in process group `pgid`, for the turn's
/// cgroup at `cgroup` if it has one. `exe` is the `hosted-boot` binary.
pub fn command(exe: &Path, pgid: i32, cgroup: Option<&Path>) -> Command {
    let mut command = Command::new(exe);
    command.arg("turn-guard");
    if let Some(dir) = cgroup {
        command.arg("--cgroup").arg(dir);
    }
    command
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .process_group(pgid);
    // No kill_on_drop: a supervisor dropped mid-turn drops the guard's pipe
    // too, and the guard must live to act on that EOF.
    let no_signals = crate::reaper::signal_set(&[]);
    // SAFETY: `sigprocmask` and `sigaction` (through `libc::signal`) are
    // async-signal-safe. An ignored disposition survives the exec, so the
    // guard ignores SIGINT from its first instruction on.
    unsafe {
        command.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_SETMASK, &no_signals, std::ptr::null_mut());
            for signal in IGNORED {
                libc::signal(signal, libc::SIG_IGN);
            }
            Ok(())
        });
    }
    command
}

/// The guard's `main`: waits for EOF on stdin, then kills the turn. Returns
/// the exit code (it is normally killed with its group first).
pub fn main(cgroup: Option<PathBuf>) -> i32 {
    for signal in IGNORED {
        // SAFETY: setting a disposition to SIG_IGN; no handler runs.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let pgid = rustix::process::getpgrp();
    eprintln!(
        "hosted-boot turn-guard: the runner is gone; killing the turn's processes (group {})",
        pgid.as_raw_nonzero()
    );
    if let Some(dir) = cgroup {
        let _ = super::cgroup::kill_dir(&dir);
        let deadline = Instant::now() + Duration::from_secs(2);
        while super::cgroup::populated(&dir) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = std::fs::remove_dir(&dir);
    }
    let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    0
}
