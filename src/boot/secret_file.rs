//! `ORIZU_BOOT_SECRET_FILE` (PROTOCOL.md section 1): the boot secret from a
//! file, such as a Kubernetes Secret volume, instead of a variable that
//! every exec probe of the container inherits (SECURITY.md, "How the boot
//! secret arrives"). Read once, at boot, and only when the agent cannot
//! read the file: the runner is root and the agent another user
//! (`--agent-user`), and the file's owner and mode keep that user out.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::agent_user::AgentUser;
use crate::secret::Secret;

use super::config::BOOT_SECRET_VAR;

/// The variable naming the file.
pub const BOOT_SECRET_FILE_VAR: &str = "ORIZU_BOOT_SECRET_FILE";

/// A boot secret longer than this is not one (the coordinator issues 64 hex
/// characters): the file is the wrong one.
const MAX_BYTES: u64 = 64 * 1024;

/// Why the boot secret cannot be taken from the file (never its bytes).
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    /// Both ways are set.
    #[error(
        "both {BOOT_SECRET_VAR} and {BOOT_SECRET_FILE_VAR} are set; set one (the file keeps the secret out of the environment of every process the container's engine starts, such as an exec probe)"
    )]
    Both,
    /// The agent runs as the runner's uid.
    #[error(
        "{BOOT_SECRET_FILE_VAR} ({path:?}) needs the agent to run as another user than the runner (--agent-user, HOSTED_BOOT_AGENT_USER, with the runner as root): the agent runs as the runner's uid and could read the file all session. Give the secret as {BOOT_SECRET_VAR} in this mode (SECURITY.md, \"How the boot secret arrives\"), or run the runner as root with an agent user"
    )]
    SameUser {
        /// The file.
        path: PathBuf,
    },
    /// The file cannot be opened or read.
    #[error("{BOOT_SECRET_FILE_VAR} {path:?}: cannot read it: {error}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// Not a regular file.
    #[error("{BOOT_SECRET_FILE_VAR} {path:?} is not a regular file")]
    NotAFile {
        /// The file.
        path: PathBuf,
    },
    /// The agent user could read it.
    #[error(
        "{BOOT_SECRET_FILE_VAR} {path:?} (owner {uid}:{gid}, mode {mode:04o}) {how} the agent user {user} (uid {agent_uid}): the agent would read the boot secret. Make it the runner's alone: owned by root, mode 0400, no ACL (a Secret volume's defaultMode: 0400, without an fsGroup that is the agent's)"
    )]
    AgentCanRead {
        /// The file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its group.
        gid: u32,
        /// Its permission bits.
        mode: u32,
        /// The agent user's name.
        user: String,
        /// The agent user's uid.
        agent_uid: u32,
        /// How: "can be read by" (its mode), "is owned by" (whose owner
        /// may change the mode), "has an ACL or a group that lets in".
        how: &'static str,
    },
    /// Too large to be a boot secret.
    #[error(
        "{BOOT_SECRET_FILE_VAR} {path:?} is larger than {MAX_BYTES} bytes: not a boot secret (the coordinator issues 64 hex characters)"
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// Empty, or too short to be redacted safely, or not sendable.
    #[error(
        "{BOOT_SECRET_FILE_VAR} {path:?} {what}; give the runner the secret the coordinator issued (64 hex characters in production)"
    )]
    NotASecret {
        /// The file.
        path: PathBuf,
        /// What is wrong with its content (never the content).
        what: String,
    },
    /// The check as the agent user could not be made.
    #[error(
        "{BOOT_SECRET_FILE_VAR} {path:?}: cannot check whether the agent user {user} can read it ({error}); the runner must be root to run the agent as another user"
    )]
    Unchecked {
        /// The file.
        path: PathBuf,
        /// The agent user's name.
        user: String,
        /// Why.
        error: std::io::Error,
    },
    /// Not UTF-8.
    #[error("{BOOT_SECRET_FILE_VAR} {path:?} is not UTF-8 text: not a boot secret")]
    NotUtf8 {
        /// The file.
        path: PathBuf,
    },
}

/// The boot secret: `from_env` (the variable, already taken out of the
/// environment) or, when `file` is set, the file's content without a
/// trailing line break, read once. `None` when neither is given (the
/// caller says the secret is missing).
///
/// Errors: both are set; the file is named without an agent user; the
/// agent user could read it; it cannot be read or is not a secret.
pub fn boot_secret(
    from_env: Option<Secret>,
    file: Option<&Path>,
    agent_user: Option<&AgentUser>,
) -> Result<Option<Secret>, SecretFileError> {
    let Some(path) = file else {
        return Ok(from_env);
    };
    // An empty variable is an unset one (as every variable of the runner).
    if from_env.is_some_and(|s| !s.expose().is_empty()) {
        return Err(SecretFileError::Both);
    }
    let Some(user) = agent_user else {
        return Err(SecretFileError::SameUser { path: path.into() });
    };
    let unreadable = |error| SecretFileError::Unreadable {
        path: path.into(),
        error,
    };
    // Opened first, then judged by what was opened: a Secret volume's file
    // is a link into the volume's current data, which the open follows.
    // Non-blocking, so that a FIFO named by mistake is refused, not waited on.
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(unreadable)?;
    let meta = file.metadata().map_err(unreadable)?;
    if !meta.is_file() {
        return Err(SecretFileError::NotAFile { path: path.into() });
    }
    refuse_readers(user, path, &meta)?;
    let mut bytes = Vec::new();
    let read = (&mut file).take(MAX_BYTES + 1).read_to_end(&mut bytes);
    if let Err(error) = read {
        zeroize::Zeroize::zeroize(&mut bytes);
        return Err(unreadable(error));
    }
    if bytes.len() as u64 > MAX_BYTES {
        zeroize::Zeroize::zeroize(&mut bytes);
        return Err(SecretFileError::TooLarge { path: path.into() });
    }
    secret_of(path, bytes).map(Some)
}

/// The file's content as the boot secret, without its trailing line break.
///
/// Errors: empty, shorter than a boot secret, a byte a header cannot carry,
/// not UTF-8; the bytes are zeroized on every error.
fn secret_of(path: &Path, mut bytes: Vec<u8>) -> Result<Secret, SecretFileError> {
    // `echo secret > file` and editors end the file with a line break,
    // which is not the secret's.
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    let not_a_secret = |what: String| SecretFileError::NotASecret {
        path: path.into(),
        what,
    };
    if bytes.is_empty() {
        return Err(not_a_secret("is empty".into()));
    }
    if bytes.len() < super::config::BOOT_SECRET_MIN_LEN {
        let what = format!(
            "holds {} bytes, fewer than the {} a boot secret must have (a shorter value would be redacted throughout the agent's output)",
            bytes.len(),
            super::config::BOOT_SECRET_MIN_LEN
        );
        zeroize::Zeroize::zeroize(&mut bytes);
        return Err(not_a_secret(what));
    }
    if let Some(at) = unsendable_at(&bytes) {
        zeroize::Zeroize::zeroize(&mut bytes);
        return Err(not_a_secret(format!(
            "holds a byte at offset {at} that an HTTP header cannot carry (a control character or non-ASCII)"
        )));
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Secret::new(text)),
        Err(e) => {
            zeroize::Zeroize::zeroize(&mut e.into_bytes());
            Err(SecretFileError::NotUtf8 { path: path.into() })
        }
    }
}

/// Refuses a file the agent user owns (it could change the mode) or could
/// read: by the mode bits, the message a person can act on, then by the
/// kernel's own check as that user, which counts what the bits do not show
/// (an ACL, a group the user database gives).
fn refuse_readers(
    user: &AgentUser,
    path: &Path,
    meta: &std::fs::Metadata,
) -> Result<(), SecretFileError> {
    let mode = meta.mode() & 0o7777;
    let how = if meta.uid() == user.uid {
        Some("is owned by")
    } else if readable_by(user, meta.uid(), meta.gid(), mode) {
        Some("can be read by")
    } else if kernel_lets_read(user, path).map_err(|error| SecretFileError::Unchecked {
        path: path.into(),
        user: user.name.clone(),
        error,
    })? {
        Some("has an ACL or a group that lets in")
    } else {
        None
    };
    match how {
        Some(how) => Err(SecretFileError::AgentCanRead {
            path: path.into(),
            uid: meta.uid(),
            gid: meta.gid(),
            mode,
            user: user.name.clone(),
            agent_uid: user.uid,
            how,
        }),
        None => Ok(()),
    }
}

/// The offset of the first byte of `secret` an HTTP header value cannot
/// carry (the secret is sent as `Authorization: Bearer …`): anything but
/// visible ASCII, space and tab. `None` when every byte can be sent.
pub fn unsendable_at(secret: &[u8]) -> Option<usize> {
    secret
        .iter()
        .position(|b| !(*b == b'\t' || (0x20..0x7f).contains(b)))
}

/// Whether the kernel lets `user` read `path`, asked as that user on this
/// thread (`faccessat` with the effective ids: mode, ACL, groups, and the
/// directories on the way). Before any agent runs, so nothing changes the
/// file between this and the read.
fn kernel_lets_read(user: &AgentUser, path: &Path) -> std::io::Result<bool> {
    let _acting = user.act_as()?;
    Ok(rustix::fs::accessat(
        rustix::fs::CWD,
        path,
        rustix::fs::Access::READ_OK,
        rustix::fs::AtFlags::EACCESS,
    )
    .is_ok())
}

/// Whether `user` may read a file of `uid`:`gid` with permission bits
/// `mode`, as the kernel decides without capabilities (ACLs aside).
fn readable_by(user: &AgentUser, uid: u32, gid: u32, mode: u32) -> bool {
    if uid == user.uid {
        return mode & 0o400 != 0;
    }
    if gid == user.gid || user.groups.contains(&gid) {
        return mode & 0o040 != 0;
    }
    mode & 0o004 != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> AgentUser {
        AgentUser {
            name: "agent".into(),
            uid: 1000,
            gid: 1000,
            groups: vec![1000, 27],
            home: "/home/agent".into(),
        }
    }

    /// `content` in a root file of mode 0400, in a directory everyone may
    /// enter; `None` when the test skips: the check as the agent user needs
    /// a root runner, as the runner with an agent user is.
    fn secret_file(content: &str) -> Option<(tempfile::TempDir, std::path::PathBuf)> {
        use std::os::unix::fs::PermissionsExt;
        if let Err(reason) = hosted_boot_test_support::root("acting as another user") {
            hosted_boot_test_support::skip(reason);
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("boot-secret");
        std::fs::write(&path, content).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        Some((dir, path))
    }

    #[test]
    fn the_agent_reads_by_owner_group_or_others_as_the_kernel_decides() {
        let u = user();
        assert!(!readable_by(&u, 0, 0, 0o400));
        assert!(!readable_by(&u, 0, 0, 0o440));
        assert!(readable_by(&u, 0, 0, 0o444));
        assert!(readable_by(&u, 0, 1000, 0o440));
        assert!(readable_by(&u, 0, 27, 0o040));
        assert!(readable_by(&u, 1000, 0, 0o400));
        // The owner's bits decide for the owner, even when others may read.
        assert!(!readable_by(&u, 1000, 0, 0o004));
        assert!(!readable_by(&u, 0, 1000, 0o404));
    }

    #[test]
    fn the_file_gives_the_secret_without_its_line_break_and_refuses_what_is_unsafe() {
        use std::os::unix::fs::PermissionsExt;
        let Some((dir, path)) = secret_file("0123456789abcdef0123\n") else {
            return;
        };
        let me = rustix::process::geteuid().as_raw();
        // An agent user that is not the file's owner (the test's uid).
        let mut other = user();
        other.uid = me.wrapping_add(1);
        other.gid = u32::MAX - 1;
        other.groups = vec![];
        let secret = boot_secret(None, Some(&path), Some(&other))
            .unwrap()
            .unwrap();
        assert_eq!(secret.expose(), "0123456789abcdef0123");
        let both = boot_secret(Some(Secret::new("x".repeat(20))), Some(&path), Some(&other));
        assert!(matches!(both, Err(SecretFileError::Both)));
        let same = boot_secret(None, Some(&path), None)
            .unwrap_err()
            .to_string();
        assert!(same.contains("runs as the runner's uid"), "{same}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let open = boot_secret(None, Some(&path), Some(&other))
            .unwrap_err()
            .to_string();
        assert!(
            open.contains("mode 0644") && open.contains("agent user agent"),
            "{open}"
        );
        assert!(!open.contains("0123456789abcdef"), "{open}");
        let missing = boot_secret(None, Some(&dir.path().join("nope")), Some(&other))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("cannot read it"), "{missing}");
        assert!(matches!(
            boot_secret(None, Some(dir.path()), Some(&other)),
            Err(SecretFileError::NotAFile { .. })
        ));
        assert!(boot_secret(None, None, None).unwrap().is_none());
        // An empty variable is unset: the file is the one way given.
        let empty = Some(Secret::new(String::new()));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(boot_secret(empty, Some(&path), Some(&other)).is_ok());

        // The agent owns it: it could change the mode, whatever it is.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o000)).unwrap();
        std::os::unix::fs::chown(&path, Some(other.uid), None).unwrap();
        let owned = boot_secret(None, Some(&path), Some(&other))
            .unwrap_err()
            .to_string();
        assert!(owned.contains("is owned by the agent user"), "{owned}");
        std::os::unix::fs::chown(&path, Some(me), None).unwrap();

        // What the content must be, named without it.
        for (content, expected) in [
            (&b""[..], "is empty"),
            (b"abc\n", "holds 3 bytes"),
            (b"0123456789abcdef\x000123", "offset 16"),
            ("0123456789abcdef\u{e9}".as_bytes(), "offset 16"),
        ] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            std::fs::write(&path, content).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
            let e = boot_secret(None, Some(&path), Some(&other))
                .unwrap_err()
                .to_string();
            assert!(e.contains(expected), "{content:?}: {e}");
            assert!(!e.contains("0123456789abcdef"), "{e}");
        }
    }

    /// An access ACL that lets the agent user in, on a 0400 root file: the
    /// mode bits alone would pass it; the kernel's check as that user does
    /// not.
    #[test]
    fn a_file_whose_acl_lets_the_agent_in_is_refused() {
        let Some((_dir, path)) = secret_file("0123456789abcdef0123") else {
            return;
        };
        let mut other = user();
        other.uid = 4242;
        other.gid = 4242;
        other.groups = vec![4242];
        // The kernel's posix_acl_xattr: version 2, then (tag, perm, id)
        // entries: user::r, user:4242:r, group::-, mask::r, other::-.
        let mut acl = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in [
            (0x01u16, 4u16, u32::MAX),
            (0x02, 4, 4242),
            (0x04, 0, u32::MAX),
            (0x10, 4, u32::MAX),
            (0x20, 0, u32::MAX),
        ] {
            acl.extend(tag.to_le_bytes());
            acl.extend(perm.to_le_bytes());
            acl.extend(id.to_le_bytes());
        }
        if let Err(e) = rustix::fs::setxattr(
            &path,
            "system.posix_acl_access",
            &acl,
            rustix::fs::XattrFlags::empty(),
        ) {
            hosted_boot_test_support::skip(format!(
                "the temporary directory's file system takes no ACL ({e})"
            ));
            return;
        }
        let e = boot_secret(None, Some(&path), Some(&other))
            .unwrap_err()
            .to_string();
        assert!(e.contains("has an ACL or a group that lets in"), "{e}");
    }
}
