//! PID 1: the split into a tiny reaper and a worker (PROTOCOL.md 4.4 and
//! section 3).
//!
//! A container without an init starts `hosted-boot` as PID 1, which must
//! reap every orphan. A catch-all `waitpid(-1)` in the process whose children
//! tokio waits for would steal their exit statuses (an agent's clean exit
//! would become an unknown one), so PID 1 splits in two:
//!
//! ```text
//! PID 1  reaper ── re-executes /proc/self/exe (same arguments) ──▶ worker
//!        │  blocks TERM INT HUP CHLD, waits for them one at a time   │ own session (setsid)
//!        │  CHLD     → waitpid(-1, WNOHANG) until none is left       │ runs the subcommand
//!        │  TERM/INT → the same signal to the worker                 │ (the boot, with tokio)
//!        │  HUP      → ignored; PIPE is ignored by the Rust runtime   │
//!        └─ the worker exits with N / dies of signal S ─▶ exit N / 128+S
//! ```
//!
//! The reaper runs no thread and no runtime: it only reaps, forwards and
//! exits. The boot secret reaches the worker through an inherited pipe (its
//! descriptor number in [`SECRET_FD_VAR`]), never through the worker's
//! environment, so no process that lives during turns shows it in
//! `/proc/<pid>/environ`; the reaper scrubbed its own initial environment
//! block before the split (`main.rs`) and is non-dumpable like the worker.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use rustix::io::FdFlags;
use rustix::process::{Pid, Signal, WaitOptions, WaitStatus};

use crate::secret::Secret;

/// Names the descriptor from which a worker reads the boot secret (set by
/// the reaper; the value is a file descriptor number, not a secret).
pub const SECRET_FD_VAR: &str = "HOSTED_BOOT_SECRET_FD";

/// Longest boot secret accepted through the pipe (64 KiB).
const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// Whether this process is PID 1 of its PID namespace.
pub fn is_pid1() -> bool {
    rustix::process::getpid().is_init()
}

/// The worker's side of the hand-over: reads the boot secret from the
/// descriptor named by [`SECRET_FD_VAR`], closes it and removes the variable.
/// `Ok(None)` when this process is not a worker of a split.
///
/// Call before any other thread exists (it changes the environment).
///
/// Errors: the variable does not name a readable pipe, or the secret is
/// larger than 64 KiB or not UTF-8 (a message without the value).
pub fn take_handed_secret() -> Result<Option<Secret>, HandOverError> {
    let Some(value) = std::env::var_os(SECRET_FD_VAR) else {
        return Ok(None);
    };
    // SAFETY: single-threaded (called first thing in `main`).
    unsafe { std::env::remove_var(SECRET_FD_VAR) };
    let fd: i32 = value
        .to_str()
        .and_then(|v| v.parse().ok())
        .filter(|fd| *fd > 2)
        .ok_or(HandOverError::NotADescriptor { value })?;
    // Only a pipe is accepted: a stray variable must not make us read (and
    // close) an unrelated descriptor such as a terminal or a file.
    // SAFETY: `fd` is only borrowed for the `fstat`.
    let stat = rustix::fs::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
        .map_err(|error| HandOverError::Inspect { fd, error })?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Fifo {
        return Err(HandOverError::NotAPipe { fd });
    }
    // SAFETY: the reaper handed this descriptor to us and nothing else in
    // this process owns it; the `File` closes it when dropped.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut bytes = Vec::new();
    file.take(MAX_SECRET_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| HandOverError::Read { fd, error })?;
    if bytes.len() as u64 > MAX_SECRET_BYTES {
        return Err(HandOverError::TooLarge { fd });
    }
    let text = String::from_utf8(bytes).map_err(|_| HandOverError::NotUtf8 { fd })?;
    Ok(Some(Secret::new(text)))
}

/// Why the worker did not get the boot secret the reaper handed it (never
/// the secret's bytes).
#[derive(Debug, thiserror::Error)]
pub enum HandOverError {
    /// The variable is not a descriptor number above 2.
    #[error("{SECRET_FD_VAR}={value:?} is not a file descriptor number")]
    NotADescriptor {
        /// The variable's value.
        value: std::ffi::OsString,
    },
    /// `fstat` failed.
    #[error("{SECRET_FD_VAR}={fd}: cannot inspect the descriptor: {error}")]
    Inspect {
        /// The descriptor.
        fd: i32,
        /// The kernel's answer.
        error: rustix::io::Errno,
    },
    /// The descriptor is not a pipe (a stray variable).
    #[error("{SECRET_FD_VAR}={fd} is not a pipe")]
    NotAPipe {
        /// The descriptor.
        fd: i32,
    },
    /// Reading the pipe failed.
    #[error("cannot read the boot secret from descriptor {fd}: {error}")]
    Read {
        /// The descriptor.
        fd: i32,
        /// The read's error.
        error: std::io::Error,
    },
    /// More than [`MAX_SECRET_BYTES`].
    #[error("the boot secret handed on descriptor {fd} is larger than 64 KiB")]
    TooLarge {
        /// The descriptor.
        fd: i32,
    },
    /// Not UTF-8.
    #[error("the boot secret handed on descriptor {fd} is not UTF-8")]
    NotUtf8 {
        /// The descriptor.
        fd: i32,
    },
}

/// The reaper: starts the worker and then only reaps, forwards SIGTERM,
/// SIGINT and the checkpoint notices (SIGUSR1, SIGUSR2) to it, and returns the worker's status as an exit code (128+N when
/// it died of signal N). `secret` goes to the worker through a pipe and is
/// dropped here once written.
///
/// Call from a single-threaded process (before any runtime or thread).
///
/// Errors are returned as exit code 1 after a message on stderr (the worker
/// could not be started).
pub fn run(secret: Option<Secret>) -> i32 {
    let forwarded = [libc::SIGTERM, libc::SIGINT, libc::SIGUSR1, libc::SIGUSR2];
    let waited = [
        libc::SIGTERM,
        libc::SIGINT,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGHUP,
        libc::SIGCHLD,
    ];
    // Blocked signals are queued even for a namespace's init (the kernel
    // drops only *unblocked* default-action signals sent to it), and none is
    // lost between the spawn and the first wait.
    let set = signal_set(&waited);
    // SAFETY: plain libc call on a valid set; single-threaded.
    if unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) } != 0 {
        eprintln!("hosted-boot: cannot block signals in the PID 1 reaper");
        return 1;
    }
    let worker = match spawn_worker(secret) {
        Ok(pid) => pid,
        Err(e) => {
            eprintln!("hosted-boot: PID 1 cannot start its worker process: {e}");
            return 1;
        }
    };
    loop {
        // SAFETY: `set` is a valid signal set; a null info pointer is allowed.
        let signal = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        if signal == libc::SIGCHLD {
            if let Some(status) = reap_all(worker) {
                return exit_code(status.exit_status(), status.terminating_signal());
            }
        } else if forwarded.contains(&signal)
            && let Some(sig) = Signal::from_named_raw(signal)
        {
            let _ = rustix::process::kill_process(worker, sig);
        }
        // SIGHUP, EINTR: nothing to do.
    }
}

/// Reaps every zombie child; returns the worker's status if it was one.
fn reap_all(worker: Pid) -> Option<WaitStatus> {
    let mut worker_status = None;
    loop {
        // `wait` is waitpid(-1): any child (rustix's `waitpid(None)` would be
        // waitpid(0), the reaper's own process group only).
        match rustix::process::wait(WaitOptions::NOHANG) {
            Ok(Some((pid, status))) => {
                if pid == worker {
                    worker_status = Some(status);
                }
            }
            Err(rustix::io::Errno::INTR) => continue,
            // None: children left but none exited; ECHILD: no child at all.
            Ok(None) | Err(_) => return worker_status,
        }
    }
}

/// The shell's convention: the exit code, or 128+N for death by signal N.
fn exit_code(code: Option<i32>, signal: Option<i32>) -> i32 {
    match (code, signal) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    }
}

/// A signal set holding `signals`.
pub fn signal_set(signals: &[i32]) -> libc::sigset_t {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: `sigemptyset` initialises the set before `sigaddset` and
    // `assume_init` read it; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for s in signals {
            libc::sigaddset(set.as_mut_ptr(), *s);
        }
        set.assume_init()
    }
}

fn spawn_worker(secret: Option<Secret>) -> std::io::Result<Pid> {
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| OsString::from("hosted-boot"));
    let mut command = Command::new("/proc/self/exe");
    command.arg0(arg0).args(args);
    let pipe = match &secret {
        Some(_) => {
            let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
            // The read end alone crosses the exec; the reaper starts no
            // other child that could inherit it.
            rustix::io::fcntl_setfd(&read, FdFlags::empty())?;
            command.env(SECRET_FD_VAR, read.as_raw_fd().to_string());
            Some((read, write))
        }
        None => None,
    };
    let empty = signal_set(&[]);
    // SAFETY: `setsid` and `pthread_sigmask` are async-signal-safe. The
    // worker must not inherit the reaper's blocked signals (its tokio
    // handlers would never run); std resets SIGPIPE's disposition itself.
    unsafe {
        command.pre_exec(move || {
            rustix::process::setsid()?;
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            // A checkpoint notice forwarded before the worker's handler is
            // installed must not end it (the default action): ignored
            // until then (the handler replaces this; an agent started
            // after it gets the default again at its exec).
            libc::signal(libc::SIGUSR1, libc::SIG_IGN);
            libc::signal(libc::SIGUSR2, libc::SIG_IGN);
            Ok(())
        });
    }
    let child = command.spawn()?;
    let pid = Pid::from_child(&child);
    if let (Some((read, write)), Some(secret)) = (pipe, secret) {
        // Close our read end first: a worker that dies before reading makes
        // the write fail (EPIPE) instead of blocking forever.
        drop(read);
        let mut file = std::fs::File::from(write);
        if let Err(e) = file.write_all(secret.expose().as_bytes()) {
            eprintln!("hosted-boot: cannot hand the boot secret to the worker: {e}");
        }
    }
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_shell_convention() {
        assert_eq!(exit_code(Some(3), None), 3);
        assert_eq!(exit_code(Some(0), None), 0);
        assert_eq!(exit_code(None, Some(9)), 137);
        assert_eq!(exit_code(None, Some(15)), 143);
    }
}
