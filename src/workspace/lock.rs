//! The root's lock (PROTOCOL.md section 3 and 4 step 1): an exclusive
//! `flock` on the root directory itself, held by the one runner that boots
//! on the root, from before it removes or writes anything until it exits.
//! Two runners on one root would remove each other's session directory and
//! run the same turn twice; the second one is refused.
//!
//! The lock is taken on a descriptor of the root directory, not on a file
//! under it: the agent runs as the runner's user inside the root and can
//! remove or replace any file there, and a second runner would then lock a
//! new file of the same name. A directory that holds the agent's whole
//! workspace cannot be unlinked. `{root}/.hosted-boot/lock` is only the pid
//! file that names the holder (`<pid>\n`), kept open by it; when the agent
//! removed it, a refused runner names the holder from `/proc/locks`.
//!
//! The kernel releases an `flock` when the last descriptor of its open file
//! goes, so a runner that dies in any way (SIGKILL included) frees the root
//! for its restart. The descriptors are close-on-exec: no program the runner
//! starts (the agent, git, the credential helper, the turn guard) holds the
//! lock after the runner is gone.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{FlockOperation, Mode, OFlags, RenameFlags};

/// The pid file under the root.
pub const LOCK_FILE: &str = ".hosted-boot/lock";

/// The pid file's directory and name under the root.
pub(super) const LOCK_DIR: &str = ".hosted-boot";
const LOCK_NAME: &str = "lock";

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
    /// The root is a file (or something else that is not a directory).
    #[error(
        "the root {} is a file, not a directory: set HOSTED_BOOT_ROOT (--root) to a directory this user can write",
        root.display()
    )]
    NotADirectory {
        /// The root.
        root: PathBuf,
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
/// releases it. `{root}/.hosted-boot/lock` names the holder's pid
/// (`<pid>\n`).
#[derive(Debug)]
pub struct RootLock {
    _root: OwnedFd,
    // Kept open while held: `/proc/<pid>/fd` shows the holder.
    _pid_file: File,
}

impl RootLock {
    /// Takes the lock of `root` without waiting (an exclusive `flock` on a
    /// descriptor of the root directory), then writes this process's pid
    /// into `{root}/.hosted-boot/lock`, creating the directory when missing.
    /// A runner that is refused changes nothing: it only opens the root and
    /// reads the pid file (or `/proc/locks`, when the file is gone).
    ///
    /// Errors: [`LockError::Held`] naming the holder's pid when another
    /// process holds the lock; [`LockError::Io`] naming the path otherwise.
    pub fn acquire(root: &Path) -> Result<RootLock, LockError> {
        let path = root.join(LOCK_FILE);
        let dir = lock_root(root)?;
        // `.hosted-boot` is the runner's own: a link or another uid's
        // directory there is replaced, never followed (issue 31).
        let lock_dir = root.join(LOCK_DIR);
        crate::session_dir::runner_dir::runner_dir(&lock_dir, 0o755)
            .map_err(io_error("make the runner's directory", &lock_dir))?;
        let pid = std::process::id();
        let file = write_pid_file(&dir, pid).map_err(io_error("write the pid into", &path))?;
        Ok(RootLock {
            _root: dir,
            _pid_file: file,
        })
    }
}

/// A [`LockError::Io`] of `action` on `path`.
fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> LockError {
    let path = path.to_path_buf();
    move |source: io::Error| LockError::Io {
        action,
        path,
        source,
    }
}

/// The root's directory descriptor with the exclusive `flock` held
/// (released when it is closed).
fn lock_root(root: &Path) -> Result<OwnedFd, LockError> {
    let path = root.join(LOCK_FILE);
    if std::fs::metadata(root).is_ok_and(|m| !m.is_dir()) {
        return Err(LockError::NotADirectory {
            root: root.to_path_buf(),
        });
    }
    let dir = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_error("open the root for", &path)(e.into()))?;
    match rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let pid = holder_pid(&path).or_else(|| lock_owner(&dir));
            return Err(LockError::Held {
                root: root.to_path_buf(),
                pid,
                path,
            });
        }
        Err(e) => return Err(io_error("lock the root for", &path)(e.into())),
    }
    Ok(dir)
}

/// Whether `root` is free: takes its lock and releases it at once, writing
/// nothing (`hosted-boot check`). A runner that starts in that instant is
/// refused as by any holder.
///
/// Errors: as [`RootLock::acquire`] ([`LockError::Held`] naming the holder).
pub fn probe(root: &Path) -> Result<(), LockError> {
    lock_root(root)?;
    // What makes `write_pid_file` fail without writing: a directory where
    // the pid file goes (its rename cannot replace one). A link there is
    // fine: the rename replaces it; so is anything but the runner's own
    // directory at `.hosted-boot`: acquire replaces it (issue 31).
    let path = root.join(LOCK_FILE);
    let kind = |p: &Path| std::fs::symlink_metadata(p).ok().map(|m| m.file_type());
    let refused = match kind(&path) {
        Some(file) if file.is_dir() => Some(io::ErrorKind::IsADirectory),
        _ => None,
    };
    match refused {
        Some(kind) => Err(io_error("write the pid into", &path)(kind.into())),
        None => Ok(()),
    }
}

/// Writes `<pid>\n` to `.hosted-boot/lock` under the root descriptor
/// `root`: into a new file, renamed over the old name, so a reader never
/// sees a partial pid; no symbolic link is followed (the agent may have
/// put one there). `.hosted-boot` is made first ([`RootLock::acquire`]).
/// Returns the new file, kept open by the holder.
fn write_pid_file(root: &OwnedFd, pid: u32) -> io::Result<File> {
    let dir = rustix::fs::openat(
        root,
        LOCK_DIR,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let temp = format!("{LOCK_NAME}.{pid}.new");
    let _ = rustix::fs::unlinkat(&dir, temp.as_str(), rustix::fs::AtFlags::empty());
    let fd = rustix::fs::openat(
        &dir,
        temp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )?;
    let mut file = File::from(fd);
    file.write_all(format!("{pid}\n").as_bytes())?;
    rustix::fs::renameat_with(&dir, temp.as_str(), &dir, LOCK_NAME, RenameFlags::empty())?;
    Ok(file)
}

/// The pid `/proc/locks` names for the `flock` on the root directory
/// `root` (`None` when it is not locked, or either cannot be read): what
/// `check` compares with the pid file, which anyone who can write the root
/// can write.
pub fn owner(root: &Path) -> Option<u32> {
    let dir = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    lock_owner(&dir)
}

/// The pid `/proc/locks` names for the `flock` on the directory `dir`, as
/// this process's PID namespace numbers it: the holder when its pid file is
/// gone (the agent can remove it). `None` when it cannot be read.
fn lock_owner(dir: &OwnedFd) -> Option<u32> {
    let stat = rustix::fs::fstat(dir).ok()?;
    let device = format!(
        "{:02x}:{:02x}:{}",
        rustix::fs::major(stat.st_dev),
        rustix::fs::minor(stat.st_dev),
        stat.st_ino
    );
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // `<id>: FLOCK ADVISORY WRITE <pid> <maj>:<min>:<inode> 0 EOF`; a
        // waiter's line has `->` after the id.
        match fields.as_slice() {
            [_, "FLOCK", _, _, pid, dev, ..] if *dev == device => pid.parse().ok(),
            _ => None,
        }
    })
}

/// The pid the holder wrote, waiting briefly for a holder that has taken
/// the lock but not yet written it (or not yet written it again).
fn holder_pid(path: &Path) -> Option<u32> {
    let deadline = std::time::Instant::now() + PID_WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
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
        let pid_file = root.path().join(LOCK_FILE);
        let held = RootLock::acquire(root.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(&pid_file).unwrap(),
            format!("{}\n", std::process::id())
        );
        // flock locks belong to the open file: a second open in the same
        // process conflicts as another process's would.
        match RootLock::acquire(root.path()) {
            Err(LockError::Held { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
        drop(held);
        let _again = RootLock::acquire(root.path()).unwrap();
        // The new holder writes its pid again.
        assert_eq!(
            std::fs::read_to_string(&pid_file).unwrap(),
            format!("{}\n", std::process::id())
        );
    }

    #[test]
    fn a_removed_pid_file_does_not_free_the_root_and_the_holder_is_still_named() {
        let root = tempfile::tempdir().unwrap();
        let held = RootLock::acquire(root.path()).unwrap();
        std::fs::remove_dir_all(root.path().join(".hosted-boot")).unwrap();
        match RootLock::acquire(root.path()) {
            Err(LockError::Held { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
        // A link put in its place is replaced by the next holder, not followed.
        drop(held);
        let target = root.path().join("elsewhere");
        std::fs::write(&target, "x").unwrap();
        std::fs::create_dir(root.path().join(".hosted-boot")).unwrap();
        std::os::unix::fs::symlink(&target, root.path().join(LOCK_FILE)).unwrap();
        let _again = RootLock::acquire(root.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "x");
        let pid_file = root.path().join(LOCK_FILE);
        assert!(!pid_file.is_symlink());
        assert_eq!(
            std::fs::read_to_string(&pid_file).unwrap(),
            format!("{}\n", std::process::id())
        );
    }

    #[test]
    fn the_probe_refuses_what_acquire_would_fail_on() {
        let root = tempfile::tempdir().unwrap();
        probe(root.path()).unwrap();
        std::fs::create_dir_all(root.path().join(LOCK_FILE)).unwrap();
        assert!(matches!(
            RootLock::acquire(root.path()),
            Err(LockError::Io { .. })
        ));
        match probe(root.path()) {
            Err(LockError::Io { path, .. }) => assert_eq!(path, root.path().join(LOCK_FILE)),
            other => panic!("the probe passed a root acquire refuses: {other:?}"),
        }
        std::fs::remove_dir_all(root.path().join(LOCK_DIR)).unwrap();
        // A file or a link at `.hosted-boot` is replaced, never followed.
        std::fs::write(root.path().join(LOCK_DIR), "x").unwrap();
        probe(root.path()).unwrap();
        drop(RootLock::acquire(root.path()).unwrap());
        assert!(root.path().join(LOCK_DIR).is_dir());
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::remove_dir_all(root.path().join(LOCK_DIR)).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join(LOCK_DIR)).unwrap();
        drop(RootLock::acquire(root.path()).unwrap());
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
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
