//! The turn's guard: `hosted-boot turn-guard`, a tiny process in the
//! agent's session and process group whose stdin is a pipe from the runner.
//! If the runner dies, even by SIGKILL, the pipe's write end closes, the
//! guard reads EOF and kills the turn: `cgroup.kill` of the turn's cgroup
//! (then removes it), SIGKILL to the agent's process group, and SIGKILL to
//! every process still in the agent's session.
//!
//! The agent leads a session of its own (PROTOCOL.md 4.1: no controlling
//! terminal), and a process can join a process group of its own session
//! only. So the guard cannot be spawned by the runner: the agent's child
//! starts it between its `setsid` and its exec ([`Launch::start_in_child`]),
//! by a double fork whose middle process exits at once, so that the guard is
//! re-parented to the runner (a child subreaper), never a child of the
//! agent's program (which may wait for every child it has).
//!
//! `PR_SET_PDEATHSIG` on the leader kills only the leader; the guard is its
//! equivalent for the whole session. While the guard lives, the session id
//! (the leader's pid, which is also the group id) is reserved: the kernel
//! does not hand out a pid while a process has it as its session id, so
//! every process the guard finds with that session id, and every member of
//! that group, is one of the turn's, even after the leader was reaped. At a
//! turn's normal end the runner kills the group, guard included, and the
//! guard does nothing.

use std::ffi::{CString, c_char};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::pipe::PipeFlags;
use rustix::process::{Pid, Signal};

use super::tree;

/// The signals a guard ignores: the group's SIGINT (an interrupt) and
/// terminal signals. Only SIGKILL, or its pipe's EOF, ends a guard.
const IGNORED: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Bound on the guard's kill loop after the runner died.
const KILL_BOUND: Duration = Duration::from_secs(2);

/// Most arguments a guard's command line has
/// (`exe turn-guard --session ID --cgroup DIR`).
const MAX_ARGS: usize = 6;

/// The child side of a guard: everything the agent's child needs to start
/// the guard between fork and exec, allocated beforehand (nothing may
/// allocate there). Moved into the agent's `pre_exec`; its descriptors are
/// close-on-exec, so the agent's program inherits none of them.
#[derive(Debug)]
pub struct Launch {
    /// The `hosted-boot` binary.
    exe: CString,
    /// `argv` but the session id, which only the child knows: `exe
    /// turn-guard [--cgroup DIR] --session`, at most [`MAX_ARGS`] - 1.
    args: Vec<CString>,
    /// Read end of the runner's pipe: the guard's stdin.
    control: OwnedFd,
    /// Write end of the report pipe (guard pid, session id, errno).
    report: OwnedFd,
    /// `/dev/null`: the guard's stdout.
    devnull: OwnedFd,
    /// The runner's stderr (a duplicate): the guard's stderr, for its one
    /// log line. The agent's stderr pipe has no reader once the runner is
    /// dead.
    stderr: OwnedFd,
}

/// The runner side of a guard: the write end of its pipe (held until the
/// turn's processes are gone: closing it tells the guard the runner is
/// gone) and the report of its start.
#[derive(Debug)]
pub struct Watch {
    #[expect(dead_code, reason = "held, never read: its close is the message")]
    control: OwnedFd,
    report: OwnedFd,
}

/// A guard that was started, as its launch reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Started {
    /// The guard's pid.
    pub pid: i32,
    /// The agent's session id (the leader's pid).
    pub session: i32,
}

/// Prepares a guard for the turn's cgroup at `cgroup` (if it has one);
/// `exe` is the `hosted-boot` binary.
///
/// Errors: a pipe or `/dev/null` could not be opened, or a path holds a NUL
/// byte.
pub fn prepare(exe: &Path, cgroup: Option<&Path>) -> std::io::Result<(Launch, Watch)> {
    let c = |bytes: &[u8]| {
        CString::new(bytes).map_err(|_| std::io::Error::other("a path holds a NUL byte"))
    };
    let exe = c(exe.as_os_str().as_bytes())?;
    let mut args = vec![exe.clone(), c(b"turn-guard")?];
    if let Some(dir) = cgroup {
        args.push(c(b"--cgroup")?);
        args.push(c(dir.as_os_str().as_bytes())?);
    }
    args.push(c(b"--session")?);
    let (control_read, control_write) = rustix::pipe::pipe_with(PipeFlags::CLOEXEC)?;
    // Non-blocking: the runner reads the report once the agent's exec
    // returned, whether a guard was started or not.
    let (report_read, report_write) =
        rustix::pipe::pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
    let devnull = rustix::fs::open(
        "/dev/null",
        rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    let stderr = match rustix::io::fcntl_dupfd_cloexec(std::io::stderr().as_fd(), 3) {
        Ok(fd) => fd,
        Err(_) => rustix::io::fcntl_dupfd_cloexec(&devnull, 3)?,
    };
    Ok((
        Launch {
            exe,
            args,
            control: control_read,
            report: report_write,
            devnull,
            stderr,
        },
        Watch {
            control: control_write,
            report: report_read,
        },
    ))
}

/// fork(2) as a bare system call. Between fork and exec only
/// async-signal-safe calls are allowed, and libc's `fork` runs the atfork
/// handlers; the children below call nothing that needs libc's per-thread
/// state fixed up.
unsafe fn raw_fork() -> libc::pid_t {
    // clone(SIGCHLD) with no new stack, no tid pointers, no TLS. s390x
    // takes the stack before the flags.
    #[cfg(not(target_arch = "s390x"))]
    let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_long, 0, 0, 0, 0) };
    #[cfg(target_arch = "s390x")]
    let pid = unsafe { libc::syscall(libc::SYS_clone, 0, libc::SIGCHLD as libc::c_long, 0, 0, 0) };
    pid as libc::pid_t
}

impl Launch {
    /// Starts the guard from the agent's child, after its `setsid` and
    /// before its exec: forks a middle process that forks the guard,
    /// reports (guard pid, session id, errno) on the report pipe and exits,
    /// and reaps the middle process. Failures are reported, never returned:
    /// the agent starts without a guard then (the runner logs it).
    ///
    /// # Safety
    /// Call only between fork and exec of a child of a multi-threaded
    /// process (it calls async-signal-safe functions only and allocates
    /// nothing).
    pub unsafe fn start_in_child(&self) {
        // SAFETY: every call below is async-signal-safe; the pointers
        // passed point into `self`, which outlives the calls.
        unsafe {
            let session = libc::getpid();
            let middle = raw_fork();
            if middle < 0 {
                return;
            }
            if middle == 0 {
                let (guard, errno) = self.fork_guard(session);
                let report: [i32; 3] = [guard, session, errno];
                libc::write(
                    self.report.as_raw_fd(),
                    report.as_ptr().cast(),
                    std::mem::size_of_val(&report),
                );
                libc::_exit(0);
            }
            let mut status = 0;
            while libc::waitpid(middle, &mut status, 0) < 0
                && *libc::__errno_location() == libc::EINTR
            {}
        }
    }

    /// In the middle process: forks the guard and waits until it has
    /// exec'd. Returns (the guard's pid or 0, errno or 0).
    unsafe fn fork_guard(&self, session: i32) -> (i32, i32) {
        // SAFETY: as in `start_in_child`.
        unsafe {
            let mut exec_error = [0i32; 2];
            if libc::pipe2(exec_error.as_mut_ptr(), libc::O_CLOEXEC) < 0 {
                return (0, *libc::__errno_location());
            }
            let [error_read, error_write] = exec_error;
            let guard = raw_fork();
            if guard < 0 {
                return (0, *libc::__errno_location());
            }
            if guard == 0 {
                libc::close(error_read);
                let errno = self.exec_guard(session);
                libc::write(
                    error_write,
                    (&raw const errno).cast(),
                    std::mem::size_of::<i32>(),
                );
                libc::_exit(127);
            }
            libc::close(error_write);
            // EOF: the exec closed the pipe; four bytes: its errno.
            let mut errno = 0i32;
            let n = loop {
                let n = libc::read(error_read, (&raw mut errno).cast(), 4);
                if n >= 0 || *libc::__errno_location() != libc::EINTR {
                    break n;
                }
            };
            if n == 4 {
                let mut status = 0;
                libc::waitpid(guard, &mut status, 0);
                return (0, errno);
            }
            (guard, 0)
        }
    }

    /// In the guard: sets up its descriptors and signals and execs
    /// `hosted-boot turn-guard`. Returns the errno if a step failed.
    unsafe fn exec_guard(&self, session: i32) -> i32 {
        // SAFETY: as in `start_in_child`; `argv` and `envp` are
        // NULL-terminated arrays of pointers into `self`.
        unsafe {
            let fds = [
                (self.control.as_raw_fd(), 0),
                (self.devnull.as_raw_fd(), 1),
                (self.stderr.as_raw_fd(), 2),
            ];
            for (from, to) in fds {
                if libc::dup2(from, to) < 0 {
                    return *libc::__errno_location();
                }
            }
            // An ignored disposition survives the exec, so the guard ignores
            // the group's SIGINT from its first instruction on. The signal
            // mask is already empty (the agent's child cleared it).
            for signal in IGNORED {
                libc::signal(signal, libc::SIG_IGN);
            }
            let mut id = [0u8; 12];
            decimal(session, &mut id);
            let mut argv: [*const c_char; MAX_ARGS + 1] = [std::ptr::null(); MAX_ARGS + 1];
            let fixed = self.args.len().min(MAX_ARGS - 1);
            for (slot, arg) in argv.iter_mut().zip(&self.args[..fixed]) {
                *slot = arg.as_ptr();
            }
            argv[fixed] = id.as_ptr().cast();
            let envp: [*const c_char; 1] = [std::ptr::null()];
            libc::execve(self.exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
            *libc::__errno_location()
        }
    }
}

/// Writes `n` (non-negative) in decimal and a NUL into `out`, without
/// allocating (between fork and exec).
fn decimal(n: i32, out: &mut [u8; 12]) {
    let mut digits = [0u8; 10];
    let mut len = 0;
    let mut v = n.max(0) as u32;
    loop {
        digits[len] = b'0' + (v % 10) as u8;
        len += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..len {
        out[i] = digits[len - 1 - i];
    }
    out[len] = 0;
}

impl Watch {
    /// After the agent's spawn returned (its child exec'd or failed): the
    /// guard that was started, or why there is none.
    pub fn started(&self) -> Result<Started, NoGuard> {
        let mut bytes = [0u8; 12];
        match rustix::io::read(&self.report, &mut bytes) {
            Ok(12) => {}
            _ => return Err(NoGuard::NotStarted),
        }
        let word =
            |i: usize| i32::from_ne_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let (pid, session, errno) = (word(0), word(4), word(8));
        if pid <= 0 {
            return Err(NoGuard::Spawn(std::io::Error::from_raw_os_error(errno)));
        }
        Ok(Started { pid, session })
    }
}

/// Why a turn has no guard.
#[derive(Debug, thiserror::Error)]
pub enum NoGuard {
    /// The agent's child reported nothing (it failed before the guard).
    #[error("the agent's child could not start it")]
    NotStarted,
    /// The guard's spawn failed.
    #[error("{0}")]
    Spawn(std::io::Error),
}

/// Kills and reaps a guard whose agent never ran (its exec failed): the
/// guard is then the only process of the failed child's session.
pub async fn stand_down(started: Started) {
    let Some(pid) = Pid::from_raw(started.pid) else {
        return;
    };
    let Ok(pidfd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        return;
    };
    // The session id is reserved while its last member lives: a process
    // with this pid in that session is the guard.
    let Some(info) = tree::read_proc(started.pid) else {
        return;
    };
    if info.sid != started.session
        || rustix::process::pidfd_send_signal(&pidfd, Signal::KILL).is_err()
    {
        return;
    }
    if info.ppid == rustix::process::getpid().as_raw_nonzero().get() {
        let _ = tokio::task::spawn_blocking(move || {
            rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
        })
        .await;
    }
}

/// The guard's `main`: waits for EOF on stdin, then kills the turn of
/// `session` (the agent's session id, which must be the guard's own).
/// Returns the exit code: 0 after killing, 2 when this process is not in
/// `session` (it then kills nothing), 1 when its session is unknown. A
/// guard is normally killed with the agent's group first.
pub fn main(session: i32, cgroup: Option<PathBuf>) -> i32 {
    for signal in IGNORED {
        // SAFETY: setting a disposition to SIG_IGN; no handler runs.
        unsafe { libc::signal(signal, libc::SIG_IGN) };
    }
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let group = rustix::process::getpgrp();
    let own = match rustix::process::getsid(None) {
        Ok(sid) => sid.as_raw_nonzero().get(),
        Err(_) => return 1,
    };
    if own != session {
        let _ = writeln!(
            std::io::stderr(),
            "hosted-boot turn-guard: this process is in session {own}, not the turn's session {session}; doing nothing"
        );
        return 2;
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
    // Leave the agent's group for a group of its own in the same session:
    // the guard survives its SIGKILLs to the group, and the session id
    // stays reserved as long as the guard lives.
    let own_group = rustix::process::setpgid(None, None).is_ok();
    // A failed write (the runner's stderr closed) must not stop the guard.
    let _ = writeln!(
        std::io::stderr(),
        "hosted-boot turn-guard: the runner is gone; killing the turn's processes (session {session})"
    );
    if let Some(dir) = &cgroup {
        let _ = super::cgroup::kill_dir(dir);
    }
    let deadline = Instant::now() + KILL_BOUND;
    loop {
        if own_group {
            let _ = rustix::process::kill_process_group(group, Signal::KILL);
        }
        let live: Vec<tree::ProcInfo> = tree::scan()
            .into_iter()
            .filter(|p| p.sid == session && p.pid != me && !p.zombie)
            .collect();
        if live.is_empty() || Instant::now() >= deadline {
            break;
        }
        for p in &live {
            tree::signal_exact(p, Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    if let Some(dir) = cgroup {
        while super::cgroup::populated(&dir) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = std::fs::remove_dir(&dir);
    }
    if !own_group {
        // Still in the group: this kills the guard too, so it comes last.
        let _ = rustix::process::kill_process_group(group, Signal::KILL);
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_written_in_decimal_without_allocating() {
        for (n, text) in [
            (0, "0"),
            (7, "7"),
            (4194304, "4194304"),
            (i32::MAX, "2147483647"),
        ] {
            let mut out = [0xffu8; 12];
            decimal(n, &mut out);
            let end = out.iter().position(|b| *b == 0).unwrap();
            assert_eq!(std::str::from_utf8(&out[..end]).unwrap(), text);
        }
    }
}
