//! The agent user (`--agent-user`, PROTOCOL.md section 3, "The agent as
//! another user"): who every process of the agent runs as when the runner
//! is root, resolved once from the user database; how a child becomes that
//! user between fork and exec; and how what the runner wrote in `repo/` is
//! given back to it (`lchown`, never following a symbolic link).

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::process::{Gid, Uid};

/// The user the agent runs as: its uid, primary gid, supplementary groups
/// (`getgrouplist`, the primary one included) and home, as the user
/// database (`/etc/passwd`, NSS) gave them when the runner started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentUser {
    /// The login name.
    pub name: String,
    /// The uid every process of the agent runs as.
    pub uid: u32,
    /// The primary gid.
    pub gid: u32,
    /// The supplementary groups (the primary gid among them).
    pub groups: Vec<u32>,
    /// The home directory (the agent's `HOME` unless set explicitly).
    pub home: PathBuf,
}

/// Why `--agent-user` cannot be used. The message names the value and what
/// to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct AgentUserError(pub String);

impl AgentUser {
    /// Resolves `spec`, a login name or a numeric uid, for a runner running
    /// as `runner_uid` (only root can run processes as another user).
    ///
    /// Errors: the runner is not root (naming its uid and what to do), the
    /// user does not exist, or the user database cannot be read.
    pub fn resolve(spec: &str, runner_uid: u32) -> Result<AgentUser, AgentUserError> {
        let spec = spec.trim();
        if runner_uid != 0 {
            return Err(AgentUserError(format!(
                "HOSTED_BOOT_AGENT_USER {spec:?} needs a runner running as root, and this one runs as uid {runner_uid}; run it as root (the image's default), or unset HOSTED_BOOT_AGENT_USER (or set it empty) to run the agent as uid {runner_uid} itself"
            )));
        }
        let lookup = match spec.parse::<u32>() {
            Ok(uid) if spec.bytes().all(|b| b.is_ascii_digit()) => {
                nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            }
            _ => nix::unistd::User::from_name(spec),
        };
        let user = lookup
            .map_err(|e| {
                AgentUserError(format!(
                    "cannot look up the agent user {spec:?} in the user database: {e}"
                ))
            })?
            .ok_or_else(|| {
                AgentUserError(format!(
                    "the agent user {spec:?} does not exist (no such name or uid in /etc/passwd); create it (useradd --create-home {spec}) or name an existing one"
                ))
            })?;
        if user.uid.is_root() {
            return Err(AgentUserError(format!(
                "the agent user {spec:?} is root (uid 0); name an unprivileged user, or unset HOSTED_BOOT_AGENT_USER"
            )));
        }
        let groups = CString::new(user.name.as_bytes())
            .ok()
            .and_then(|name| nix::unistd::getgrouplist(&name, user.gid).ok())
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_else(|| vec![user.gid.as_raw()]);
        Ok(AgentUser {
            name: user.name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            groups,
            home: user.dir,
        })
    }

    /// Makes the calling thread act as this user for file access (its groups,
    /// effective gid and effective uid; the real and saved ids stay root's,
    /// so [`ActingAs`]'s drop can come back) until the returned guard is
    /// dropped. For the runner's own git work in `repo/`, which the agent
    /// owns and can fill with anything (a `core.worktree` pointing at a
    /// root-only directory, a reflog symlinked to a root-only file): as the
    /// agent user, libgit2 can read and write only what the agent could.
    /// Raw per-thread system calls (libc's would change every thread); use
    /// it on the thread that runs the git work, and keep that work on it.
    ///
    /// Errors: the OS refused a call; the thread is then as it was.
    pub fn act_as(&self) -> io::Result<ActingAs> {
        let before = ActingAs {
            groups: rustix::process::getgroups()?,
            gid: rustix::process::getegid(),
        };
        let target = self.become_in_child();
        rustix::thread::set_thread_groups(&target.groups)?;
        // From here on, dropping `before` restores what was changed.
        rustix::thread::set_thread_res_gid(None, Some(target.gid), None)?;
        rustix::thread::set_thread_res_uid(None, Some(target.uid), None)?;
        Ok(before)
    }

    /// Makes `root` the runner's (root's, not writable by group or others:
    /// mode 0755 at most) when this user could write it, as an
    /// `emptyDir` mounted at `/workspace` (0777) lets everyone: an agent
    /// that can write the root can put links where the runner keeps its
    /// own directories (issue 31, SECURITY.md). Returns whether it changed
    /// anything. Call it before the runner writes under the root.
    ///
    /// Errors: the root cannot be opened or changed; the message names it,
    /// its owner and mode, and what to do.
    pub fn secure_root(&self, root: &Path) -> Result<bool, AgentUserError> {
        let fail = |what: String| {
            AgentUserError(format!(
                "the root {} {what}; the agent user {} must not be able to write it (it could put links where the runner keeps its files): make it root's and 0755, or let the runner (root) change it",
                root.display(),
                self.name
            ))
        };
        let dir = rustix::fs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| fail(format!("cannot be opened ({e})")))?;
        let stat = rustix::fs::fstat(&dir).map_err(|e| fail(format!("cannot be read ({e})")))?;
        let mode = stat.st_mode & 0o7777;
        let writable_by_others = mode & 0o022 != 0;
        if stat.st_uid == 0 && stat.st_gid == 0 && !writable_by_others {
            return Ok(false);
        }
        let described = format!(
            "(owner uid {}, gid {}, mode {mode:04o})",
            stat.st_uid, stat.st_gid
        );
        rustix::fs::fchown(&dir, Some(Uid::ROOT), Some(Gid::ROOT))
            .map_err(|e| fail(format!("{described} cannot be made root's ({e})")))?;
        rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode & !0o7022))
            .map_err(|e| fail(format!("{described} cannot be made 0755 ({e})")))?;
        Ok(true)
    }

    /// What a child needs to become this user between fork and exec,
    /// allocated beforehand ([`Become::now`] allocates nothing).
    pub fn become_in_child(&self) -> Become {
        Become {
            uid: Uid::from_raw(self.uid),
            gid: Gid::from_raw(self.gid),
            groups: self.groups.iter().map(|g| Gid::from_raw(*g)).collect(),
        }
    }

    /// Sets `command` to start as this user (its groups, gid, uid, in that
    /// order, just before exec). For the helpers the runner starts for the
    /// agent (the CLI's `--version`); the agent itself drops in the
    /// supervisor's own `pre_exec`, after its guard was forked.
    pub fn apply(&self, command: &mut tokio::process::Command) {
        let become_user = self.become_in_child();
        // SAFETY: `Become::now` makes three raw system calls and allocates
        // nothing.
        unsafe {
            command.pre_exec(move || become_user.now());
        }
    }

    /// `lchown`s `path` to this user (not following a symbolic link).
    ///
    /// Errors: the OS error.
    pub fn chown(&self, path: &Path) -> io::Result<()> {
        std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid))
    }

    /// Gives every entry under the directory `dir` (and `dir` itself) that
    /// this user does not own to it: each directory is opened with
    /// `O_NOFOLLOW` relative to its parent's descriptor and each entry
    /// `fchownat`ed with `AT_SYMLINK_NOFOLLOW`, so a symbolic link (or a
    /// directory swapped for one meanwhile) never leads the walk out of
    /// `dir`. A regular file with more than one link is left alone (a hard
    /// link to a file elsewhere must not change that file's owner).
    /// Returns how many entries changed owner.
    ///
    /// Errors: `dir` cannot be opened; errors below it are counted in the
    /// log, not returned (the walk goes on).
    pub fn give_tree(&self, dir: &Path) -> io::Result<usize> {
        let top = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut walk = Walk {
            uid: Uid::from_raw(self.uid),
            gid: Gid::from_raw(self.gid),
            changed: 0,
            failed: 0,
        };
        let st = rustix::fs::fstat(&top)?;
        if st.st_uid != self.uid || st.st_gid != self.gid {
            rustix::fs::fchown(&top, Some(walk.uid), Some(walk.gid))?;
            walk.changed += 1;
        }
        walk.dir(top, 0);
        if walk.failed > 0 {
            tracing::warn!(path = %dir.display(), failed = walk.failed, user = %self.name, "some entries could not be given to the agent user");
        }
        Ok(walk.changed)
    }
}

/// Deepest directory level [`AgentUser::give_tree`] descends to (one open
/// descriptor per level).
const MAX_DEPTH: usize = 256;

struct Walk {
    uid: Uid,
    gid: Gid,
    changed: usize,
    failed: usize,
}

impl Walk {
    fn dir(&mut self, dir: OwnedFd, depth: usize) {
        let Ok(entries) = rustix::fs::Dir::read_from(&dir) else {
            self.failed += 1;
            return;
        };
        for entry in entries {
            let Ok(entry) = entry else {
                self.failed += 1;
                break;
            };
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            self.entry(&dir, name, depth);
        }
    }

    fn entry(&mut self, dir: &OwnedFd, name: &CStr, depth: usize) {
        let Ok(st) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            self.failed += 1;
            return;
        };
        let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
        let linked = kind == rustix::fs::FileType::RegularFile && st.st_nlink > 1;
        if (st.st_uid != self.uid.as_raw() || st.st_gid != self.gid.as_raw()) && !linked {
            match rustix::fs::chownat(
                dir,
                name,
                Some(self.uid),
                Some(self.gid),
                AtFlags::SYMLINK_NOFOLLOW,
            ) {
                Ok(()) => self.changed += 1,
                Err(_) => self.failed += 1,
            }
        } else if linked && st.st_uid != self.uid.as_raw() {
            tracing::warn!(name = %OsStr::from_bytes(name.to_bytes()).to_string_lossy(), "a file with several hard links in repo/ is not the agent user's; left as it is");
        }
        if kind == rustix::fs::FileType::Directory && depth < MAX_DEPTH {
            match rustix::fs::openat(
                dir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(sub) => self.dir(sub, depth + 1),
                Err(_) => self.failed += 1,
            }
        }
    }
}

/// The credentials a child takes on just before exec (see
/// [`AgentUser::become_in_child`]).
#[derive(Clone, Debug)]
pub struct Become {
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
}

impl Become {
    /// Sets the calling thread's supplementary groups, gid and uid (real,
    /// effective and saved: the child of a root runner keeps no way back).
    /// Raw system calls, not libc's process-wide `setuid` (which signals
    /// every thread): only for a child between fork and exec, which has one
    /// thread. Async-signal-safe; allocates nothing.
    ///
    /// Errors: the OS refused a call (the exec must then not happen).
    pub fn now(&self) -> io::Result<()> {
        regain_root_effective()?;
        rustix::thread::set_thread_groups(&self.groups)?;
        rustix::thread::set_thread_gid(self.gid)?;
        rustix::thread::set_thread_uid(self.uid)?;
        Ok(())
    }
}

/// In a child forked by a thread that acts as another user
/// ([`AgentUser::act_as`]: root only as the real and saved uid), takes root
/// back as the effective uid: `setuid` by a non-root effective uid changes
/// that one id alone, and would leave the child a way back to root.
/// Nothing for a thread whose effective uid is its real one.
fn regain_root_effective() -> io::Result<()> {
    if rustix::process::getuid().is_root() && !rustix::process::geteuid().is_root() {
        rustix::thread::set_thread_res_uid(None, Some(Uid::ROOT), None)?;
    }
    Ok(())
}

/// In a child forked by a thread that acts as another user
/// ([`AgentUser::act_as`]), between fork and exec: makes that user's ids
/// (effective uid and gid, the groups the thread set) the child's real,
/// effective and saved ids, so that nothing it runs can switch back to root
/// (a shell does when its effective uid is not its real one: issue 31).
/// Nothing for a child of a thread that acts as nobody else.
/// Async-signal-safe; allocates nothing.
///
/// Errors: the OS refused a call (the exec must then not happen).
pub fn settle_acting_user_in_child() -> io::Result<()> {
    let (uid, euid) = (rustix::process::getuid(), rustix::process::geteuid());
    let (gid, egid) = (rustix::process::getgid(), rustix::process::getegid());
    if uid == euid && gid == egid {
        return Ok(());
    }
    regain_root_effective()?;
    rustix::thread::set_thread_res_gid(Some(egid), Some(egid), Some(egid))?;
    rustix::thread::set_thread_res_uid(Some(euid), Some(euid), Some(euid))?;
    Ok(())
}

/// The groups and gid the process started with, for [`reset_thread_identity`].
static STARTING_IDENTITY: std::sync::OnceLock<(Vec<Gid>, Gid)> = std::sync::OnceLock::new();

/// Records the calling thread's groups and effective gid as the ones every
/// runtime thread must start with. Call it once, before the async runtime
/// starts (`main`).
pub fn remember_starting_identity() {
    let groups = rustix::process::getgroups().unwrap_or_default();
    let _ = STARTING_IDENTITY.set((groups, rustix::process::getegid()));
}

/// Makes a new thread root again if it was born acting as the agent user:
/// a thread inherits its creator's credentials, and a thread that acts as
/// the agent user ([`AgentUser::act_as`]) may make tokio start one (a DNS
/// lookup of the git transport calls `spawn_blocking`), which would then
/// serve later blocking work with the agent's identity. For the runtime's
/// `on_thread_start`. Does nothing for a runner that is not root, or a
/// thread that already is.
pub fn reset_thread_identity() {
    if !rustix::process::getuid().is_root() || rustix::process::geteuid().is_root() {
        return;
    }
    let restored = rustix::thread::set_thread_res_uid(None, Some(Uid::ROOT), None).and_then(|()| {
        match STARTING_IDENTITY.get() {
            Some((groups, gid)) => rustix::thread::set_thread_res_gid(None, Some(*gid), None)
                .and_then(|()| rustix::thread::set_thread_groups(groups)),
            None => Ok(()),
        }
    });
    if let Err(e) = restored {
        tracing::error!(error = %e, "cannot make a new runtime thread root again");
    }
}

/// The calling thread acting as the agent user ([`AgentUser::act_as`]);
/// dropping it makes the thread root again (effective uid first, which the
/// gid and group changes need), with the groups and gid it had.
#[must_use = "the thread acts as the agent user only while this lives"]
pub struct ActingAs {
    groups: Vec<Gid>,
    gid: Gid,
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        let restored = rustix::thread::set_thread_res_uid(None, Some(Uid::ROOT), None)
            .and_then(|()| rustix::thread::set_thread_res_gid(None, Some(self.gid), None))
            .and_then(|()| rustix::thread::set_thread_groups(&self.groups));
        if let Err(e) = restored {
            // The thread keeps less privilege than it should: later work on
            // it may be refused, never granted more.
            tracing::error!(error = %e, "cannot make the git thread root again after acting as the agent user");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runner_that_is_not_root_is_refused_with_its_uid() {
        let e = AgentUser::resolve("agent", 1000).unwrap_err().to_string();
        assert!(
            e.contains("uid 1000") && e.contains("root") && e.contains("HOSTED_BOOT_AGENT_USER"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_user_is_named() {
        let e = AgentUser::resolve("no-such-user-hb", 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"no-such-user-hb\" does not exist"), "{e}");
        let e = AgentUser::resolve("root", 0).unwrap_err().to_string();
        assert!(e.contains("is root"), "{e}");
    }

    #[test]
    fn a_name_and_its_uid_resolve_alike() {
        // `nobody` (65534) exists on Debian and in the CI image.
        let Ok(by_name) = AgentUser::resolve("nobody", 0) else {
            hosted_boot_test_support::skip("no `nobody` user here (65534, as Debian has)");
            return;
        };
        let by_uid = AgentUser::resolve(&by_name.uid.to_string(), 0).unwrap();
        assert_eq!(by_name, by_uid);
        assert!(by_name.groups.contains(&by_name.gid));
    }

    #[test]
    fn the_walk_gives_entries_without_following_links() {
        if let Err(reason) = hosted_boot_test_support::root("chown") {
            hosted_boot_test_support::skip(reason);
            return;
        }
        let Ok(user) = AgentUser::resolve("nobody", 0) else {
            hosted_boot_test_support::skip("no `nobody` user here (65534, as Debian has)");
            return;
        };
        use std::os::unix::fs::MetadataExt;
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("kept");
        std::fs::write(&secret, "x").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).unwrap();
        std::fs::hard_link(&secret, dir.path().join("hard")).unwrap();
        let changed = user.give_tree(dir.path()).unwrap();
        assert_eq!(changed, 5, "the dir, a, a/b, a/b/f, the link itself");
        for p in ["", "a", "a/b", "a/b/f"] {
            assert_eq!(
                std::fs::metadata(dir.path().join(p)).unwrap().uid(),
                user.uid,
                "{p}"
            );
        }
        let link = std::fs::symlink_metadata(dir.path().join("link")).unwrap();
        assert_eq!(link.uid(), user.uid);
        assert_eq!(std::fs::metadata(outside.path()).unwrap().uid(), 0);
        assert_eq!(std::fs::metadata(&secret).unwrap().uid(), 0, "hard link");
        assert_eq!(user.give_tree(dir.path()).unwrap(), 0, "idempotent");
    }
}
