//! The backstop for a FIFO the runner's git opens (issue 31): libgit2 opens
//! files without `O_NONBLOCK`, and the agent can put a FIFO wherever the
//! repository leads (a `.git/commondir`, `objects/info/alternates`, a
//! submodule's git directory, an include the check misread), where the
//! open blocks until a writer comes, for good, with `repo/` held. The
//! removal before each hold ([`super::special_files`]) covers the places
//! the runner knows; this covers the rest.
//!
//! While a thread holds `repo/` ([`Holder`]), a watcher thread looks at it
//! every 100 ms: when it is blocked in `open(2)` on a FIFO (its pending
//! system call, `/proc/self/task/<tid>/syscall`, and the path it passed,
//! read from this process's memory), the watcher opens the other end
//! (without blocking) and closes it at once: the open returns, and the
//! read that follows sees the end of the file. The git work then fails or
//! goes on with an empty file, within its bound. An open never blocks on a
//! FIFO in legitimate git work, so no other case is touched.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

/// The thread that holds `repo/` (its tid); 0: none.
static HOLDER: AtomicI32 = AtomicI32::new(0);

/// How often the watcher looks.
const TICK: Duration = Duration::from_millis(100);

/// The calling thread holds `repo/` until this is dropped.
pub struct Holder(());

impl Holder {
    /// Registers the calling thread (one at a time: the repository lock
    /// serialises the holds) and starts the watcher once.
    pub fn enter() -> Holder {
        static WATCHER: OnceLock<()> = OnceLock::new();
        WATCHER.get_or_init(|| {
            let spawned = std::thread::Builder::new()
                .name("repo-unblock".into())
                .spawn(|| {
                    // Born from a thread that may act as the agent user.
                    crate::agent_user::reset_thread_identity();
                    loop {
                        std::thread::sleep(TICK);
                        let tid = HOLDER.load(Ordering::Acquire);
                        if tid != 0 {
                            unblock(tid);
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start the watcher of the runner's git opens; a FIFO the agent planted may block it");
            }
        });
        HOLDER.store(
            rustix::thread::gettid().as_raw_nonzero().get(),
            Ordering::Release,
        );
        Holder(())
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        HOLDER.store(0, Ordering::Release);
    }
}

/// When thread `tid` is blocked opening a FIFO, opens its other end and
/// closes it.
fn unblock(tid: i32) {
    let Some((path, flags)) = pending_open(tid) else {
        return;
    };
    let Ok(meta) = std::fs::metadata(&path) else {
        return;
    };
    if !meta.file_type().is_fifo() {
        return;
    }
    // The other end: a writer for a reader (and the reverse), never
    // blocking; closed at once.
    let reading = flags & libc::O_ACCMODE as u64 == libc::O_RDONLY as u64;
    let opened = std::fs::OpenOptions::new()
        .read(!reading)
        .write(reading)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&path);
    match opened {
        Ok(_) => {
            tracing::warn!(path = %path.display(), "the runner's git was blocked opening a FIFO (planted by the agent?): unblocked, it reads an empty file")
        }
        // No reader yet in that instant: the next tick.
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "cannot open the other end of a FIFO yet")
        }
    }
}

/// The path and flags of the `open`/`openat` thread `tid` is in, if any.
fn pending_open(tid: i32) -> Option<(PathBuf, u64)> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok()?;
    let fields: Vec<u64> = text
        .split_whitespace()
        .map(|f| {
            u64::from_str_radix(
                f.trim_start_matches("0x"),
                if f.starts_with("0x") { 16 } else { 10 },
            )
        })
        .collect::<Result<_, _>>()
        .ok()?;
    let (nr, args) = fields.split_first()?;
    let (dirfd, address, flags) = match i64::try_from(*nr).ok()? {
        libc::SYS_openat => (*args.first()?, *args.get(1)?, *args.get(2)?),
        #[cfg(target_arch = "x86_64")]
        libc::SYS_open => (libc::AT_FDCWD as u32 as u64, *args.first()?, *args.get(1)?),
        _ => return None,
    };
    let path = read_c_string(address)?;
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(&path));
    if path.is_absolute() || dirfd as i32 == libc::AT_FDCWD {
        return Some((path, flags));
    }
    let dir = std::fs::read_link(format!("/proc/self/fd/{}", dirfd as i32)).ok()?;
    Some((dir.join(path), flags))
}

/// The NUL-terminated string at `address` of this process's memory.
fn read_c_string(address: u64) -> Option<Vec<u8>> {
    let mem = std::fs::File::open("/proc/self/mem").ok()?;
    let mut buf = vec![0u8; 4096];
    let n = mem.read_at(&mut buf, address).ok()?;
    buf.truncate(n);
    let end = buf.iter().position(|b| *b == 0)?;
    buf.truncate(end);
    Some(buf)
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    #[test]
    fn a_holder_blocked_opening_a_fifo_is_unblocked_and_reads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("config");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
        )
        .unwrap();
        let path = fifo.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _holder = Holder::enter();
            let mut text = String::new();
            let read = std::fs::File::open(&path).and_then(|mut f| f.read_to_string(&mut text));
            let _ = tx.send((read.is_ok(), text));
        });
        let (opened, text) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(opened);
        assert_eq!(text, "");
    }
}
