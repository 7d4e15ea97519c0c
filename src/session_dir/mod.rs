//! Session and run files (PROTOCOL.md section 3): every secret file is
//! written whole or not at all, mode 0600 from creation, ending with a
//! newline; the session directory is 0700 and removed on every exit path.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub mod context;
pub mod runner_dir;

pub use context::{BootContext, CredentialMode};

use crate::secret::Secret;

/// `turn.json` (PROTOCOL.md section 3): what only the turn knows, at a path
/// fixed for the whole boot (`ORIZU_TURN_FILE`), so that an agent whose
/// environment was fixed before its turn (a pre-started one) reads it when
/// its prompt comes. No secret: the token stays in the bearer file.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnFile {
    /// The run the turn seals (`ORIZU_RUN_ID`).
    pub run_id: String,
    /// 1 for the initial task, then +1 per turn; null when not known.
    pub ordinal: Option<u64>,
    /// The turn's prompt (`ORIZU_TASK_FILE`).
    pub task_file: PathBuf,
    /// The platform's instructions (`ORIZU_INSTRUCTIONS_FILE`), if any.
    pub instructions_file: Option<PathBuf>,
    /// When the turn's time cap (`clientInfo.durationMinutes`) stops the
    /// agent, RFC 3339 UTC (`ORIZU_TURN_DEADLINE`); null without a cap.
    pub deadline: Option<String>,
    /// The agent's W3C trace context when the runner exports traces
    /// (`TRACEPARENT`, `TRACESTATE`: issue 40), by variable name; absent
    /// otherwise.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub trace_context: std::collections::BTreeMap<String, String>,
}

/// Why a file of the session or run directory could not be read or written.
/// Messages name the path and what to do; never a file's contents.
#[derive(Debug, thiserror::Error)]
pub enum SessionDirError {
    /// A file system operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was attempted, e.g. `write` or `create directory`.
        action: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `boot-context.json` could not be read or written as JSON.
    #[error("boot context {}: {reason}", path.display())]
    Context {
        /// The context file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A value failed its check (PROTOCOL.md section 5).
    #[error(transparent)]
    Invalid(#[from] crate::validate::CheckError),
}

// Its PROTOCOL.md 2.2 code is `WorkspaceError::code`'s: this layer is
// below `wire`.
impl SessionDirError {
    pub(crate) fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        SessionDirError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Directory (under the root) holding one directory per session.
pub const SESSION_PARENT: &str = ".orizu-session";
/// Directory (under the root) holding one directory per run.
pub const RUN_PARENT: &str = ".orizu-run";
/// The boot secret file in the session directory.
pub const BOOT_SECRET_FILE: &str = "boot-secret";
/// The bearer file in the session directory (exists only during a turn).
pub const BEARER_FILE: &str = "bearer";
/// What only the turn knows, for the agent (exists only during a turn;
/// PROTOCOL.md section 3): [`TurnFile`].
pub const TURN_FILE: &str = "turn.json";
/// The credential helper's context in the session directory.
pub const CONTEXT_FILE: &str = "boot-context.json";
/// The credential helper's repo-token cache in the session directory.
pub const CREDENTIAL_CACHE_FILE: &str = "repo-credential-cache";
/// Every repo token the credential helper handed out, one a line, append
/// only (PROTOCOL.md section 3): what the runner's redactor reads.
pub const ISSUED_TOKENS_FILE: &str = "repo-tokens-issued";
/// The file credential helpers `flock` around reading, minting and
/// writing the cache (PROTOCOL.md section 3).
pub const CREDENTIAL_LOCK_FILE: &str = "repo-credential-lock";
/// The credential broker's Unix socket in the session directory (broker
/// mode, PROTOCOL.md section 3).
pub const CREDENTIAL_SOCKET_FILE: &str = "credential.sock";
/// The turn's prompt in the run directory.
pub const TASK_FILE: &str = "task.txt";
/// The platform's instructions for the agent, in the run directory
/// (PROTOCOL.md 3, "The platform's instructions").
pub const INSTRUCTIONS_FILE: &str = "instructions.md";

/// Writes `contents` to `path` atomically (PROTOCOL.md 3): a temporary file
/// in the same directory, mode 0600 from creation, the contents plus a
/// trailing newline when missing, rename over the target. Readers (the
/// credential helper, the agent) see the old file or the new one, never a
/// part: the rename is what they need.
///
/// No `fsync`: what it writes is needed only while this boot runs (the
/// session directory's files are removed at exit, and a boot after a crash
/// or a power loss removes the session directory before anything else; a
/// run's `task.txt` and `instructions.md` are the agent's during its turn;
/// a setup fingerprint lost to a power loss runs setup once more), so
/// durability across a power loss buys nothing, and the two `fsync`s per
/// file were on the boot's critical path and each turn's (BENCHMARKS.md,
/// "Time to first turn").
///
/// Errors: [`SessionDirError::Io`] naming the path (the contents are never in
/// an error).
///
/// A file it replaces that belongs to another user (the agent user's,
/// PROTOCOL.md 3 "The agent as another user") keeps that owner when the
/// writer may give it (root): the new file is that user's before it is
/// renamed into place.
pub fn write_secret_file(path: &Path, contents: &[u8]) -> Result<(), SessionDirError> {
    let replaced = fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_file())
        .map(|m| (m.uid(), m.gid()))
        .filter(|(uid, _)| *uid != rustix::process::geteuid().as_raw());
    write_file_owned(path, contents, replaced)
}

/// [`write_secret_file`], the new file given to `owner` (uid, gid) before
/// it is renamed into place, so that it is never seen with another owner.
///
/// Errors: as [`write_secret_file`]; the owner cannot be given.
pub fn write_file_owned(
    path: &Path,
    contents: &[u8],
    owner: Option<(u32, u32)>,
) -> Result<(), SessionDirError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(|e| SessionDirError::io("create a temporary file for", path, e))?;
    // tempfile creates 0600; make sure whatever the platform did.
    let write = |file: &mut File| -> io::Result<()> {
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&*file, Some(uid), Some(gid))?;
        }
        file.write_all(contents)?;
        if !contents.ends_with(b"\n") {
            file.write_all(b"\n")?;
        }
        Ok(())
    };
    write(tmp.as_file_mut()).map_err(|e| SessionDirError::io("write", path, e))?;
    tmp.persist(path)
        .map(drop)
        .map_err(|e| SessionDirError::io("rename into place", path, e.error))
}

/// Creates `path` with mode 0700 and forces the mode, never through a
/// link (see [`runner_dir`]); its parent must exist.
fn create_private_dir(path: &Path) -> Result<(), SessionDirError> {
    runner_dir::runner_dir(path, 0o700)
        .map_err(|e| SessionDirError::io("create directory", path, e))
}

/// Removes whatever is at `path` (a directory tree, a file or a symbolic
/// link, which is not followed). Absent is fine.
fn remove_any(path: &Path) -> Result<(), SessionDirError> {
    let result = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(SessionDirError::io("remove", path, e)),
    }
}

/// Removes the directory `path` if it is empty; absent or not empty is fine.
fn remove_if_empty(path: &Path) {
    if let Err(e) = fs::remove_dir(path) {
        match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::DirectoryNotEmpty => {}
            _ => tracing::debug!(path = %path.display(), error = %e, "cannot remove directory"),
        }
    }
}

/// Makes `root` absolute (the credential helper is configured with absolute
/// paths, and the agent runs in another working directory).
fn absolute(root: &Path) -> Result<PathBuf, SessionDirError> {
    std::path::absolute(root).map_err(|e| SessionDirError::io("resolve", root, e))
}

/// `{root}/.orizu-session/{sessionId}/` (0700) and its files (PROTOCOL.md
/// 3). Paths are absolute. The owner (the boot) removes it on every exit
/// path with [`SessionDir::remove`].
#[derive(Clone, Debug)]
pub struct SessionDir {
    parent: PathBuf,
    path: PathBuf,
    /// `--agent-user`: the files the agent reads during a turn are its.
    agent: Option<AgentFiles>,
    /// `boot-context.json` as the runner last wrote it: the runner rewrites
    /// the file from this copy and never reads it back, since the agent
    /// user may own it (issue 31: no root process reads a file the agent
    /// can write).
    context: Arc<Mutex<Option<BootContext>>>,
}

/// Which session files belong to the agent user (PROTOCOL.md 3, "The agent
/// as another user"), and to whom.
#[derive(Clone, Copy, Debug)]
struct AgentFiles {
    uid: u32,
    gid: u32,
    /// The file credential helper's files too (`boot-secret` among them):
    /// the agent's git runs that helper as the agent user.
    credential_files: bool,
}

/// Mode of the session and run directories (and their parents) when the
/// agent is another user: it may reach a file it is given by its path, and
/// list nothing.
pub const TRAVERSE_ONLY: u32 = 0o711;

/// Sets `mode` on the directory `path`, never through a link.
fn set_dir_mode(path: &Path, mode: u32) -> Result<(), SessionDirError> {
    runner_dir::set_mode(path, mode).map_err(|e| SessionDirError::io("set the mode of", path, e))
}

impl SessionDir {
    /// Creates the session directory, first removing one left by an earlier
    /// boot (after a SIGKILL), so nothing stale survives (PROTOCOL.md 3).
    ///
    /// Errors: a session id that is not path-safe (section 5), or a file
    /// system error naming the path.
    pub fn create(root: &Path, session_id: &str) -> Result<SessionDir, SessionDirError> {
        let path = SessionDir::path_for(root, session_id)?;
        let parent = absolute(root)?.join(SESSION_PARENT);
        remove_any(&path)?;
        create_private_dir(&parent)?;
        create_private_dir(&path)?;
        Ok(SessionDir {
            parent,
            path,
            agent: None,
            context: Arc::default(),
        })
    }

    /// Where the session directory of `session_id` under `root` is
    /// (absolute), without making it.
    ///
    /// Errors: a session id that is not path-safe (section 5), or a root
    /// that cannot be resolved.
    pub fn path_for(root: &Path, session_id: &str) -> Result<PathBuf, SessionDirError> {
        crate::validate::path_safe_id("session id", session_id)?;
        Ok(absolute(root)?.join(SESSION_PARENT).join(session_id))
    }

    /// For an agent that runs as another user (`--agent-user`, PROTOCOL.md
    /// 3): the directory and its parent become [`TRAVERSE_ONLY`] (0711: the
    /// agent reaches what it is given by path, lists nothing); the bearer
    /// file and `boot-context.json` are the agent user's (0600) when
    /// written, and so, with `credential_files` (the file credential mode,
    /// whose helper the agent's git runs as the agent user), are
    /// `boot-secret`, `repo-credential-cache`, `repo-tokens-issued` and
    /// `repo-credential-lock`. Every other file stays the runner's, 0600.
    /// Call it before the files are written.
    ///
    /// Errors: a mode cannot be set.
    pub fn for_agent_user(
        mut self,
        user: &crate::agent_user::AgentUser,
        credential_files: bool,
    ) -> Result<SessionDir, SessionDirError> {
        set_dir_mode(&self.parent, TRAVERSE_ONLY)?;
        set_dir_mode(&self.path, TRAVERSE_ONLY)?;
        self.agent = Some(AgentFiles {
            uid: user.uid,
            gid: user.gid,
            credential_files,
        });
        Ok(self)
    }

    /// The owner the file `name` is written with: the agent user's for the
    /// files [`SessionDir::for_agent_user`] names, else the runner's.
    fn owner_of(&self, name: &str) -> Option<(u32, u32)> {
        let agent = self.agent?;
        let credential = [
            BOOT_SECRET_FILE,
            CREDENTIAL_CACHE_FILE,
            ISSUED_TOKENS_FILE,
            CREDENTIAL_LOCK_FILE,
        ];
        let shared = name == BEARER_FILE
            || name == TURN_FILE
            || name == INSTRUCTIONS_FILE
            || name == CONTEXT_FILE
            || (agent.credential_files && credential.contains(&name));
        shared.then_some((agent.uid, agent.gid))
    }

    fn write(&self, name: &str, contents: &[u8]) -> Result<(), SessionDirError> {
        write_file_owned(&self.path.join(name), contents, self.owner_of(name))
    }

    /// `…/boot-secret`.
    pub fn boot_secret_path(&self) -> PathBuf {
        self.path.join(BOOT_SECRET_FILE)
    }

    /// `…/bearer`: the agent's `ORIZU_TOKEN_FILE`.
    pub fn bearer_path(&self) -> PathBuf {
        self.path.join(BEARER_FILE)
    }

    /// `…/turn.json`.
    pub fn turn_path(&self) -> PathBuf {
        self.path.join(TURN_FILE)
    }

    /// Writes `turn.json` (0600, the agent user's with `--agent-user`,
    /// replaced whole: an agent never reads half of it).
    ///
    /// Errors: [`SessionDirError::Io`].
    pub fn write_turn(&self, turn: &TurnFile) -> Result<(), SessionDirError> {
        let mut bytes = serde_json::to_vec(turn).map_err(|e| SessionDirError::Context {
            path: self.turn_path(),
            reason: e.to_string(),
        })?;
        bytes.push(b'\n');
        self.write(TURN_FILE, &bytes)
    }

    /// Writes `instructions.md` (0600, the agent user's with
    /// `--agent-user`): the boot's instructions at one path for the whole
    /// boot, which the agent CLIs are started with (a CLI started ahead of
    /// its turn reads them before that turn's run directory exists).
    ///
    /// Errors: [`SessionDirError::Io`].
    pub fn write_instructions(&self, text: &str) -> Result<PathBuf, SessionDirError> {
        self.write(INSTRUCTIONS_FILE, text.as_bytes())?;
        Ok(self.path.join(INSTRUCTIONS_FILE))
    }

    /// Removes `turn.json`; absent is fine (idempotent).
    ///
    /// Errors: [`SessionDirError::Io`] when it exists and cannot be removed.
    pub fn remove_turn(&self) -> Result<(), SessionDirError> {
        match fs::remove_file(self.turn_path()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(SessionDirError::io("remove", &self.turn_path(), e)),
        }
    }

    /// `…/boot-context.json`.
    pub fn context_path(&self) -> PathBuf {
        self.path.join(CONTEXT_FILE)
    }

    /// `…/repo-credential-cache`.
    pub fn credential_cache_path(&self) -> PathBuf {
        self.path.join(CREDENTIAL_CACHE_FILE)
    }

    /// `…/repo-tokens-issued`.
    pub fn issued_tokens_path(&self) -> PathBuf {
        self.path.join(ISSUED_TOKENS_FILE)
    }

    /// `…/repo-credential-lock`.
    pub fn credential_lock_path(&self) -> PathBuf {
        self.path.join(CREDENTIAL_LOCK_FILE)
    }

    /// `…/credential.sock`: the credential broker's socket.
    pub fn credential_socket_path(&self) -> PathBuf {
        self.path.join(CREDENTIAL_SOCKET_FILE)
    }

    /// Writes the boot secret (0600, atomic) for the credential helper of
    /// file mode; never called in broker mode.
    ///
    /// Errors: [`SessionDirError::Io`].
    pub fn write_boot_secret(&self, secret: &Secret) -> Result<(), SessionDirError> {
        self.write(BOOT_SECRET_FILE, secret.expose().as_bytes())
    }

    /// Writes (or rotates in place, atomically) the bearer file (0600).
    ///
    /// Errors: [`SessionDirError::Io`].
    pub fn write_bearer(&self, bearer: &Secret) -> Result<(), SessionDirError> {
        self.write(BEARER_FILE, bearer.expose().as_bytes())
    }

    /// Removes the bearer file; absent is fine (idempotent).
    ///
    /// Errors: [`SessionDirError::Io`] when it exists and cannot be removed.
    pub fn remove_bearer(&self) -> Result<(), SessionDirError> {
        match fs::remove_file(self.bearer_path()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(SessionDirError::io("remove", &self.bearer_path(), e)),
        }
    }

    /// Writes `boot-context.json` (0600, atomic; it holds no secret value).
    ///
    /// Errors: [`SessionDirError::Io`], or [`SessionDirError::Context`] if it
    /// cannot be serialized.
    pub fn write_context(&self, context: &BootContext) -> Result<(), SessionDirError> {
        let mut kept = self.context.lock().unwrap_or_else(|e| e.into_inner());
        context.write(&self.context_path())?;
        *kept = Some(context.clone());
        match self.owner_of(CONTEXT_FILE) {
            // Written before the agent ever runs: the change of owner
            // after the rename is not seen.
            Some((uid, gid)) => {
                std::os::unix::fs::lchown(self.context_path(), Some(uid), Some(gid)).map_err(|e| {
                    SessionDirError::io("give to the agent user", &self.context_path(), e)
                })
            }
            None => Ok(()),
        }
    }

    /// Adds `url` to the context's `submoduleRemotes` (the file credential
    /// helper then answers for it), rewriting `boot-context.json` from the
    /// runner's own copy.
    ///
    /// Errors: no context was written yet, or [`SessionDir::write_context`]'s.
    pub fn allow_submodule_remote(&self, url: &str) -> Result<(), SessionDirError> {
        let kept = self
            .context
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(mut context) = kept else {
            return Err(SessionDirError::Context {
                path: self.context_path(),
                reason: "not written yet".to_string(),
            });
        };
        if context.submodule_remotes.iter().any(|u| u == url) {
            return Ok(());
        }
        context.submodule_remotes.push(url.to_string());
        self.write_context(&context)
    }

    /// Creates the credential helper's files empty (0600, atomic; each holds
    /// only a newline): `repo-credential-cache` ("no cached token"),
    /// `repo-tokens-issued` (no token handed out yet) and
    /// `repo-credential-lock`.
    ///
    /// Errors: [`SessionDirError::Io`].
    pub fn create_credential_cache(&self) -> Result<(), SessionDirError> {
        self.write(CREDENTIAL_CACHE_FILE, b"")?;
        self.write(ISSUED_TOKENS_FILE, b"")?;
        self.write(CREDENTIAL_LOCK_FILE, b"")
    }

    /// Removes the session directory and everything in it, then the
    /// `.orizu-session` parent if that is now empty. Idempotent.
    ///
    /// Errors: [`SessionDirError::Io`] when something exists and cannot be
    /// removed.
    pub fn remove(&self) -> Result<(), SessionDirError> {
        remove_any(&self.path)?;
        remove_if_empty(&self.parent);
        Ok(())
    }
}

/// `{root}/.orizu-run/{runId}/` (0700) with the turn's `task.txt` (0600,
/// PROTOCOL.md 3). Removed once the run is sealed and its events delivered.
#[derive(Clone, Debug)]
pub struct RunDir {
    parent: PathBuf,
    path: PathBuf,
}

impl RunDir {
    /// Creates (or reuses) the run directory.
    ///
    /// Errors: a run id that is not path-safe (section 5), or a file system
    /// error naming the path.
    pub fn create(root: &Path, run_id: &str) -> Result<RunDir, SessionDirError> {
        crate::validate::path_safe_id("run id", run_id)?;
        let parent = absolute(root)?.join(RUN_PARENT);
        let path = parent.join(run_id);
        create_private_dir(&parent)?;
        create_private_dir(&path)?;
        Ok(RunDir { parent, path })
    }

    /// The run directory (absolute).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `…/task.txt`: the agent's `ORIZU_TASK_FILE`.
    pub fn task_path(&self) -> PathBuf {
        self.path.join(TASK_FILE)
    }

    /// Writes the turn's prompt to `task.txt` (0600, atomic, trailing
    /// newline) and returns its path. With `agent` (`--agent-user`,
    /// PROTOCOL.md 3) the file is that user's, and the run directory and
    /// its parent [`TRAVERSE_ONLY`] (the spool beside it stays the
    /// runner's).
    ///
    /// Errors: [`SessionDirError::Io`].
    pub fn write_task(
        &self,
        prompt: &str,
        agent: Option<&crate::agent_user::AgentUser>,
    ) -> Result<PathBuf, SessionDirError> {
        let path = self.task_path();
        if agent.is_some() {
            set_dir_mode(&self.parent, TRAVERSE_ONLY)?;
            set_dir_mode(&self.path, TRAVERSE_ONLY)?;
        }
        write_file_owned(&path, prompt.as_bytes(), agent.map(|a| (a.uid, a.gid)))?;
        Ok(path)
    }

    /// Writes the platform's instructions to `instructions.md`, as
    /// [`RunDir::write_task`] writes the task; returns its path.
    ///
    /// Errors: [`SessionDirError::Io`].
    pub fn write_instructions(
        &self,
        text: &str,
        agent: Option<&crate::agent_user::AgentUser>,
    ) -> Result<PathBuf, SessionDirError> {
        let path = self.path.join(INSTRUCTIONS_FILE);
        if agent.is_some() {
            set_dir_mode(&self.parent, TRAVERSE_ONLY)?;
            set_dir_mode(&self.path, TRAVERSE_ONLY)?;
        }
        write_file_owned(&path, text.as_bytes(), agent.map(|a| (a.uid, a.gid)))?;
        Ok(path)
    }

    /// Removes the run directory, then `.orizu-run` if it is now empty.
    /// Idempotent.
    ///
    /// Errors: [`SessionDirError::Io`] when something exists and cannot be
    /// removed.
    pub fn remove(&self) -> Result<(), SessionDirError> {
        remove_any(&self.path)?;
        remove_if_empty(&self.parent);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn secret_files_are_0600_with_a_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        write_secret_file(&path, b"abc").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"abc\n");
        assert_eq!(mode(&path), 0o600);
        write_secret_file(&path, b"def\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"def\n");
    }

    #[test]
    fn replace_is_atomic_and_resets_the_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        fs::write(&path, "old\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let ino_before = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&path).unwrap());
        write_secret_file(&path, b"new").unwrap();
        let ino_after = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&path).unwrap());
        // A rename, not an in-place write: a reader holding the old file keeps it whole.
        assert_ne!(ino_before, ino_after);
        assert_eq!(mode(&path), 0o600);
        assert_eq!(fs::read_to_string(&path).unwrap(), "new\n");
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("s")]);
    }

    #[test]
    fn session_dir_files_and_modes() {
        let root = tempfile::tempdir().unwrap();
        let s = SessionDir::create(root.path(), "s1").unwrap();
        assert!(s.path.is_absolute());
        assert_eq!(s.path, root.path().join(".orizu-session/s1"));
        assert_eq!(mode(&s.path), 0o700);
        s.write_boot_secret(&Secret::new("boot".into())).unwrap();
        s.write_bearer(&Secret::new("bearer".into())).unwrap();
        s.create_credential_cache().unwrap();
        for p in [
            s.boot_secret_path(),
            s.bearer_path(),
            s.credential_cache_path(),
            s.issued_tokens_path(),
            s.credential_lock_path(),
        ] {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
        assert_eq!(fs::read_to_string(s.credential_cache_path()).unwrap(), "\n");
        s.remove_bearer().unwrap();
        s.remove_bearer().unwrap();
        assert!(!s.bearer_path().exists());
        s.remove().unwrap();
        s.remove().unwrap();
        assert!(!root.path().join(".orizu-session").exists());
    }

    #[test]
    fn stale_session_dir_is_removed_and_parent_kept_when_shared() {
        let root = tempfile::tempdir().unwrap();
        let stale = root.path().join(".orizu-session/s1");
        fs::create_dir_all(stale.join("sub")).unwrap();
        fs::write(stale.join("bearer"), "old").unwrap();
        fs::set_permissions(&stale, fs::Permissions::from_mode(0o755)).unwrap();
        let other = root.path().join(".orizu-session/s2");
        fs::create_dir_all(&other).unwrap();
        let s = SessionDir::create(root.path(), "s1").unwrap();
        assert!(!s.bearer_path().exists());
        assert!(!stale.join("sub").exists());
        assert_eq!(mode(&s.path), 0o700);
        s.remove().unwrap();
        // Another session's directory keeps the parent alive.
        assert!(other.exists());
    }

    #[test]
    fn session_id_must_be_path_safe() {
        let root = tempfile::tempdir().unwrap();
        for bad in ["..", "a/b", "-x", ""] {
            assert!(SessionDir::create(root.path(), bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn run_dir_task() {
        let root = tempfile::tempdir().unwrap();
        let r = RunDir::create(root.path(), "run-1").unwrap();
        let task = r.write_task("do it", None).unwrap();
        assert_eq!(task, root.path().join(".orizu-run/run-1/task.txt"));
        assert_eq!(fs::read_to_string(&task).unwrap(), "do it\n");
        assert_eq!(mode(&task), 0o600);
        r.remove().unwrap();
        r.remove().unwrap();
        assert!(!root.path().join(".orizu-run").exists());
    }
}
