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
        "{BOOT_SECRET_FILE_VAR} ({path}) needs the agent to run as another user than the runner (--agent-user, HOSTED_BOOT_AGENT_USER, with the runner as root): the agent runs as the runner's uid and could read the file all session. Give the secret as {BOOT_SECRET_VAR} in this mode (SECURITY.md, \"How the boot secret arrives\"), or run the runner as root with an agent user"
    )]
    SameUser {
        /// The file.
        path: PathBuf,
    },
    /// The file cannot be opened or read.
    #[error("{BOOT_SECRET_FILE_VAR} {path}: cannot read it: {error}")]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// Not a regular file.
    #[error("{BOOT_SECRET_FILE_VAR} {path} is not a regular file")]
    NotAFile {
        /// The file.
        path: PathBuf,
    },
    /// The agent user could read it.
    #[error(
        "{BOOT_SECRET_FILE_VAR} {path} (owner {uid}:{gid}, mode {mode:04o}) can be read by the agent user {user} (uid {agent_uid}): the agent would read the boot secret. Make it the runner's alone: owned by root, mode 0400 (a Secret volume's defaultMode: 0400, without an fsGroup that is the agent's)"
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
    },
    /// Too large to be a boot secret.
    #[error(
        "{BOOT_SECRET_FILE_VAR} {path} is larger than {MAX_BYTES} bytes: not a boot secret (the coordinator issues 64 hex characters)"
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// Not UTF-8.
    #[error("{BOOT_SECRET_FILE_VAR} {path} is not UTF-8 text: not a boot secret")]
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
    if from_env.is_some() {
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
    let mode = meta.mode() & 0o7777;
    if readable_by(user, meta.uid(), meta.gid(), mode) {
        return Err(SecretFileError::AgentCanRead {
            path: path.into(),
            uid: meta.uid(),
            gid: meta.gid(),
            mode,
            user: user.name.clone(),
            agent_uid: user.uid,
        });
    }
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
    // `echo secret > file` and editors end the file with a line break,
    // which is not the secret's.
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok(Some(Secret::new(text))),
        Err(e) => {
            zeroize::Zeroize::zeroize(&mut e.into_bytes());
            Err(SecretFileError::NotUtf8 { path: path.into() })
        }
    }
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
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("boot-secret");
        std::fs::write(&path, "0123456789abcdef0123\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
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
    }
}
