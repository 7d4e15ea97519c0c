//! The root's lock (PROTOCOL.md section 3 and 4 step 1):
//! `{root}/.hosted-boot/lock`, an exclusive `flock` held by the one runner
//! that boots on the root, from before it removes or writes anything until
//! it exits. Two runners on one root would remove each other's session
//! directory and run the same turn twice; the second one is refused.
//!
//! The kernel releases an `flock` when the last descriptor of its open file
//! goes, so a runner that dies in any way (SIGKILL included) frees the root
//! for its restart, and the lock file itself is never removed (removing it
//! would let two runners lock two different files of the same name). The
//! descriptor is close-on-exec: no program the runner starts (the agent, git,
//! the credential helper, the turn guard) holds the lock after the runner is
//! gone.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::FlockOperation;

/// The lock file under the root.
pub const LOCK_FILE: &str = ".hosted-boot/lock";

/// How long a refused runner waits for the holder's pid to appear (the
/// holder writes it just after taking the lock).
const PID_WAIT: Duration = Duration::from_millis(200);

/// Why the root could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another runner holds the lock.
    #[error(
        "the root {} is in use by another hosted-boot runner (pid {}, as its PID namespace numbers it; it holds {}): two runners on one root destroy each other's session; stop that runner or give this one another HOSTED_BOOT_ROOT",
        root.display(),
        pid.map_or_else(|| "unknown".to_string(), |p| p.to_string()),
        path.display()
    )]
    Held {
        /// The root.
        root: PathBuf,
        /// The lock file.
        path: PathBuf,
        /// The holder's pid, as it wrote it (`None` when unreadable).
        pid: Option<u32>,
    },
    /// The lock file could not be created, opened, locked or written.
    #[error("cannot {action} the root's lock file {}: {source}; check that the root exists and this user can write to it", path.display())]
    Io {
        /// What was attempted.
        action: &'static str,
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// The held lock of a root: dropping it (or any death of the process)
/// releases it. The file keeps the holder's pid (`<pid>\n`).
#[derive(Debug)]
pub struct RootLock {
    _file: File,
    path: PathBuf,
}

impl RootLock {
    /// Takes the lock of `root` without waiting, creating
    /// `{root}/.hosted-boot/` and the lock file when missing, and writes this
    /// process's pid into it. A runner that is refused changes nothing: the
    /// directory and the file already exist, and it neither truncates nor
    /// writes the file.
    ///
    /// Errors: [`LockError::Held`] naming the holder's pid when another
    /// process holds the lock; [`LockError::Io`] naming the path otherwise.
    pub fn acquire(root: &Path) -> Result<RootLock, LockError> {
        let path = root.join(LOCK_FILE);
        let io = |action: &'static str| {
            let path = path.clone();
            move |source| LockError::Io {
                action,
                path,
                source,
            }
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io("create the directory of"))?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&path)
            .map_err(io("open"))?;
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(LockError::Held {
                    root: root.to_path_buf(),
                    pid: holder_pid(&mut file),
                    path,
                });
            }
            Err(e) => return Err(io("lock")(e.into())),
        }
        let pid = format!("{}\n", std::process::id());
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(pid.as_bytes()))
            .map_err(io("write the pid into"))?;
        Ok(RootLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The pid the holder wrote, waiting briefly for a holder that has taken
/// the lock but not yet written it.
fn holder_pid(file: &mut File) -> Option<u32> {
    let deadline = std::time::Instant::now() + PID_WAIT;
    loop {
        let mut text = String::new();
        let read = file.rewind().and_then(|()| file.read_to_string(&mut text));
        if read.is_ok()
            && let Some(pid) = text.strip_suffix('\n').and_then(|t| t.parse().ok())
        {
            return Some(pid);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_of_the_same_root_is_refused_with_the_holders_pid() {
        let root = tempfile::tempdir().unwrap();
        let held = RootLock::acquire(root.path()).unwrap();
        assert_eq!(held.path(), root.path().join(LOCK_FILE));
        assert_eq!(
            std::fs::read_to_string(held.path()).unwrap(),
            format!("{}\n", std::process::id())
        );
        // flock locks belong to the open file: a second open in the same
        // process conflicts as another process's would.
        match RootLock::acquire(root.path()) {
            Err(LockError::Held { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
        drop(held);
        let again = RootLock::acquire(root.path()).unwrap();
        // The file stays (never removed) and is rewritten by the new holder.
        assert_eq!(
            std::fs::read_to_string(again.path()).unwrap(),
            format!("{}\n", std::process::id())
        );
    }

    #[test]
    fn the_message_names_the_root_and_the_pid() {
        let e = LockError::Held {
            root: "/workspace".into(),
            path: "/workspace/.hosted-boot/lock".into(),
            pid: Some(42),
        };
        let text = e.to_string();
        assert!(text.contains("/workspace is in use"), "{text}");
        assert!(text.contains("pid 42"), "{text}");
    }
}
