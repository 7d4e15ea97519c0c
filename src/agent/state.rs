//! The agent CLI's own session state (PROTOCOL.md 2.7): where each pinned
//! CLI keeps the conversation of one agent session, read after a turn to be
//! saved to the coordinator, and written back in a new sandbox so that the
//! CLI's resume continues the conversation instead of refusing it.
//!
//! - Claude Code: `<config>/projects/<cwd>/<id>.jsonl` and `<id>/…`
//!   (sub-agents, large tool results), where `<config>` is
//!   `CLAUDE_CONFIG_DIR` or `~/.claude` and `<cwd>` the working directory's
//!   real path with every character but ASCII letters and digits made `-`
//!   (Claude Code's own naming, long paths cut and hashed as it does). Paths
//!   are relative to that project directory, so a sandbox with another
//!   `repo/` path restores under its own.
//! - Codex: the rollout `<home>/sessions/YYYY/MM/DD/rollout-<time>-<id>.jsonl`,
//!   `<home>` being `CODEX_HOME` or `~/.codex`; its path is relative to
//!   `<home>` (Codex finds a thread's rollout by its id).
//! - opencode: its sessions live in a SQLite database
//!   (`<data>/opencode/opencode.db`, `<data>` being `XDG_DATA_HOME` or
//!   `~/.local/share`), which the runner does not open: the state is one
//!   file, `<id>.json`, what `opencode export <id>` prints, restored with
//!   `opencode import` run in `repo/` (which makes `repo/` the session's
//!   directory: a session left with another sandbox's path runs its tools
//!   there, or hangs). Both run as the agent CLI runs (user, environment),
//!   bounded in time, their process group killed when they end or are
//!   dropped; the export runs in `/`, so that no project's opencode
//!   configuration or plugin (`repo/.opencode/`) is loaded by it.
//!
//! Both directions run as the agent user when there is one (the files are
//! the agent's, and so are the directories: the kernel then allows only
//! what the agent could do), and never follow a link below the CLI's own
//! directory: every component is opened with `O_NOFOLLOW`, a file that is
//! not a regular file is left out (saving) or refused (restoring), and a
//! restored file never replaces one that is there. A state is untrusted
//! input: its paths are checked against the CLI's own layout (no absolute
//! path, no `.` or `..`, nothing but the session's files) before anything
//! is written, and a failed restore removes what it wrote.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use rustix::fs::{Mode, OFlags};

use super::{AgentConfig, AgentKind};
use crate::agent_user::AgentUser;
use crate::redact::Redactor;
use crate::wire::{AGENT_STATE_FORMAT, AgentState, AgentStateFile};

/// How deep a saved file may lie below the CLI's directory for the session.
const MAX_DEPTH: usize = 6;
/// How many files a state may hold.
const MAX_FILES: usize = 4096;
/// How many directory entries a save looks at below the session's
/// directory (an agent can plant millions of empty directories).
const MAX_ENTRIES: usize = 20_000;
/// Bound on one `opencode export` or `opencode import` (a cold opencode
/// start takes seconds on a loaded machine).
const OPENCODE_BOUND: std::time::Duration = std::time::Duration::from_secs(60);

/// A CLI whose state the runner saves (both adapters of a CLI share it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cli {
    /// Claude Code.
    Claude,
    /// Codex (app-server and exec).
    Codex,
    /// opencode (serve and run).
    OpenCode,
}

impl Cli {
    /// The CLI of `kind`, if the runner saves its state.
    pub fn of(kind: AgentKind) -> Option<Cli> {
        match kind {
            AgentKind::Claude => Some(Cli::Claude),
            AgentKind::Codex | AgentKind::CodexExec => Some(Cli::Codex),
            AgentKind::OpenCode | AgentKind::OpenCodeRun => Some(Cli::OpenCode),
            AgentKind::Command | AgentKind::Acp => None,
        }
    }

    /// `AgentState.cli`.
    pub fn name(self) -> &'static str {
        match self {
            Cli::Claude => "claude",
            Cli::Codex => "codex",
            Cli::OpenCode => "opencode",
        }
    }
}

/// Where one agent session's state lives for one CLI in this sandbox, and
/// who reads and writes it.
#[derive(Clone, Debug)]
pub struct Place {
    cli: Cli,
    /// The CLI's own directory (`CLAUDE_CONFIG_DIR`, `CODEX_HOME`,
    /// opencode's data directory, or their default under `HOME`), followed
    /// as the environment names it.
    base: PathBuf,
    /// Below `base`: the directory the state's paths are relative to.
    below: Vec<String>,
    /// The agent session id.
    session: String,
    /// The user the files are read and written as (`None`: the runner's).
    user: Option<AgentUser>,
    /// The CLI's program, environment and working directory (`repo/`), for
    /// opencode's export and import.
    program: String,
    env: Vec<(OsString, OsString)>,
    cwd: PathBuf,
}

/// Why a state cannot be saved or restored. The message names what and,
/// for a path, which (never a file's content).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StateError(pub String);

fn fail(message: impl Into<String>) -> StateError {
    StateError(message.into())
}

/// One file of a state: its path relative to the session's directory, and
/// its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateFile {
    /// Relative, `/`-separated.
    pub path: String,
    /// The content.
    pub bytes: Vec<u8>,
}

impl Place {
    /// Where the CLI of `config` keeps agent session `session` for an agent
    /// working in `cwd` with the CLI's environment `env`
    /// ([`super::drive::cli_env`]); `None` for an agent whose state is not
    /// saved, an environment that names no directory for it (no `HOME`),
    /// or an id that is not one a CLI makes.
    pub fn new(
        config: &AgentConfig,
        env: Vec<(OsString, OsString)>,
        cwd: &Path,
        session: &str,
    ) -> Option<Place> {
        let cli = Cli::of(config.kind)?;
        let mut place = Place::at(cli, &env, cwd, session)?;
        place.user.clone_from(&config.user);
        place.program.clone_from(&config.program);
        place.env = env;
        Some(place)
    }

    /// [`Place::new`] without a program or user (the tests').
    fn at(cli: Cli, env: &[(OsString, OsString)], cwd: &Path, session: &str) -> Option<Place> {
        if !safe_name(session) {
            return None;
        }
        let get = |name: &str| {
            env.iter()
                .rev()
                .find(|(k, _)| k == name)
                .map(|(_, v)| PathBuf::from(v))
                .filter(|p| p.is_absolute())
        };
        let home = get("HOME");
        let (base, below) = match cli {
            Cli::Claude => {
                let base = get("CLAUDE_CONFIG_DIR").or_else(|| home.map(|h| h.join(".claude")))?;
                let real = std::fs::canonicalize(cwd).unwrap_or_else(|_| cwd.to_path_buf());
                let project = claude_project_name(&real.to_string_lossy());
                (base, vec!["projects".to_string(), project])
            }
            Cli::Codex => {
                let base = get("CODEX_HOME").or_else(|| home.map(|h| h.join(".codex")))?;
                (base, Vec::new())
            }
            Cli::OpenCode => {
                let base = get("XDG_DATA_HOME").or_else(|| home.map(|h| h.join(".local/share")))?;
                (base, vec!["opencode".to_string()])
            }
        };
        Some(Place {
            cli,
            base,
            below,
            session: session.to_string(),
            user: None,
            program: String::new(),
            env: Vec::new(),
            cwd: cwd.to_path_buf(),
        })
    }

    /// The CLI.
    pub fn cli(&self) -> Cli {
        self.cli
    }

    /// The agent session id.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The directory the state's paths are relative to.
    pub fn dir(&self) -> PathBuf {
        self.below.iter().fold(self.base.clone(), |p, c| p.join(c))
    }

    /// Whether the CLI has a state for the session here: its transcript or
    /// rollout; for opencode, a database from which `opencode export`
    /// gets the session.
    pub async fn exists(&self) -> bool {
        if self.cli == Cli::OpenCode {
            return self.exists_now()
                && self
                    .opencode_export(crate::wire::routes::caps::AGENT_STATE as u64)
                    .await
                    .is_ok();
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.exists_now())
            .await
            .unwrap_or(false)
    }

    /// The file without which the CLI does not know the session is there
    /// (opencode: its database).
    fn exists_now(&self) -> bool {
        as_user(self.user.as_ref(), || Ok(self.main_file()?.is_some())).unwrap_or(false)
    }

    /// Reads the session's state, at most `limit` bytes in all.
    /// `Ok(None)`: the CLI has no state for the session.
    ///
    /// Errors: a file cannot be read or passes `limit`, or `opencode
    /// export` failed (the message says which and how).
    pub async fn collect(&self, limit: u64) -> Result<Option<Vec<StateFile>>, StateError> {
        if self.cli == Cli::OpenCode {
            if !self.exists_now() {
                return Ok(None);
            }
            let bytes = self.opencode_export(limit).await?;
            return Ok(Some(vec![StateFile {
                path: format!("{}.json", self.session),
                bytes,
            }]));
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.collect_now(limit))
            .await
            .unwrap_or_else(|e| Err(fail(format!("the read failed: {e}"))))
    }

    /// Checks `files` against the CLI's layout, then writes them where the
    /// CLI looks (opencode: imports its one file). Returns the bytes.
    ///
    /// Errors: as [`Place::restore_now`]; for opencode, a file that is not
    /// the session's export, or `opencode import` failed.
    pub async fn restore(&self, files: Vec<StateFile>) -> Result<u64, StateError> {
        if self.cli == Cli::OpenCode {
            return self.opencode_import(&files).await;
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.restore_now(&files))
            .await
            .unwrap_or_else(|e| Err(fail(format!("the restore failed: {e}"))))
    }

    /// The path (relative to [`Place::dir`]) of the file without which the
    /// CLI does not know the session, if it is there.
    fn main_file(&self) -> Result<Option<String>, StateError> {
        let Some(dir) = open_below(&self.base, &self.below, false)? else {
            return Ok(None);
        };
        Ok(self.main_file_in(&dir))
    }

    /// [`Place::main_file`] in the session's directory, opened already.
    fn main_file_in(&self, dir: &OwnedFd) -> Option<String> {
        match self.cli {
            Cli::Claude => {
                let name = format!("{}.jsonl", self.session);
                is_regular_at(dir, &name).then_some(name)
            }
            Cli::Codex => find_rollout(dir, &self.session),
            Cli::OpenCode => is_regular_at(dir, "opencode.db").then(|| "opencode.db".into()),
        }
    }

    /// Reads the session's files as the agent user (where there is one),
    /// at most `limit` bytes in all. `Ok(None)`: the CLI has no state for
    /// the session.
    ///
    /// Errors: a file cannot be read, or the files pass `limit` (the
    /// message says how far).
    fn collect_now(&self, limit: u64) -> Result<Option<Vec<StateFile>>, StateError> {
        as_user(self.user.as_ref(), || {
            let Some(dir) = open_below(&self.base, &self.below, false)? else {
                return Ok(None);
            };
            let Some(main) = self.main_file_in(&dir) else {
                return Ok(None);
            };
            let mut budget = Budget {
                left: limit,
                limit,
                entries: 0,
            };
            let mut files = vec![StateFile {
                bytes: read_file(&dir, &main, &mut budget)?,
                path: main,
            }];
            if self.cli == Cli::Claude
                && let Some(sub) = open_dir_at(&dir, &self.session)
            {
                let mut more = Vec::new();
                match walk(&sub, &self.session, 1, &mut more, &mut budget) {
                    Ok(()) => files.append(&mut more),
                    // The transcript alone resumes the conversation.
                    Err(e) => tracing::warn!(
                        error = %e,
                        "the agent session's other files are left out of its state; the transcript is saved alone"
                    ),
                }
            }
            Ok(Some(files))
        })
    }

    /// Checks `files` against the CLI's layout, then writes them as the
    /// agent user (where there is one), creating the directories on the
    /// way; a file that exists is never replaced. On an error, what was
    /// written is removed. Returns the bytes written.
    ///
    /// Errors: a path outside the layout (named), a file that exists, or a
    /// write the OS refused.
    fn restore_now(&self, files: &[StateFile]) -> Result<u64, StateError> {
        self.check_files(files)?;
        as_user(self.user.as_ref(), || {
            let dir = open_below(&self.base, &self.below, true)?
                .ok_or_else(|| fail(format!("cannot create {}", self.dir().display())))?;
            let mut written: Vec<String> = Vec::new();
            let mut made_dirs: Vec<String> = Vec::new();
            let mut bytes = 0;
            for f in files {
                if let Err(e) = write_new(&dir, &f.path, &f.bytes, &mut made_dirs) {
                    undo(&dir, &written, &made_dirs);
                    return Err(e);
                }
                written.push(f.path.clone());
                bytes += f.bytes.len() as u64;
            }
            Ok(bytes)
        })
    }

    /// Every path is in the CLI's layout, and the file without which the
    /// CLI does not know the session is there.
    fn check_files(&self, files: &[StateFile]) -> Result<(), StateError> {
        for f in files {
            self.check_path(&f.path)?;
        }
        if files.iter().any(|f| self.is_main(&f.path)) {
            return Ok(());
        }
        Err(fail(format!(
            "the state has no {} for agent session {}",
            match self.cli {
                Cli::Claude => "transcript",
                Cli::Codex => "rollout",
                Cli::OpenCode => "export",
            },
            self.session
        )))
    }

    /// Whether `path` is the file without which the CLI does not know the
    /// session.
    fn is_main(&self, path: &str) -> bool {
        match self.cli {
            Cli::Claude => path == format!("{}.jsonl", self.session),
            Cli::Codex => path.ends_with(&format!("-{}.jsonl", self.session)),
            Cli::OpenCode => path == format!("{}.json", self.session),
        }
    }

    /// A path of a state is one the CLI itself would write for this
    /// session: relative, plain names, within the CLI's layout.
    fn check_path(&self, path: &str) -> Result<(), StateError> {
        let whole = shown(path, 64);
        let refuse = |why: &str| fail(format!("the state's path {whole} is refused: {why}"));
        let parts: Vec<&str> = path.split('/').collect();
        if path.is_empty() || path.len() > 1024 || parts.len() > MAX_DEPTH {
            return Err(refuse("empty, too long or too deep"));
        }
        if let Some(bad) = parts.iter().find(|p| !safe_name(p)) {
            return Err(refuse(&format!(
                "the name {} is not a plain file name (letters, digits, '.', '_', '-'; not '.' or '..')",
                shown(bad, 100)
            )));
        }
        let ok = match self.cli {
            Cli::Claude => {
                (parts.len() == 1 && self.is_main(path))
                    || (parts.len() > 1 && parts[0] == self.session)
            }
            Cli::Codex => {
                parts.len() == 5
                    && parts[0] == "sessions"
                    && digits(parts[1], 4)
                    && digits(parts[2], 2)
                    && digits(parts[3], 2)
                    && parts[4].starts_with("rollout-")
                    && self.is_main(parts[4])
            }
            Cli::OpenCode => parts.len() == 1 && self.is_main(path),
        };
        if ok {
            Ok(())
        } else {
            Err(refuse(&format!(
                "not a file {} keeps for agent session {}",
                self.cli.name(),
                self.session
            )))
        }
    }
}

impl Place {
    /// `opencode export <id>`: the session's export (what `opencode import`
    /// takes), at most `limit` bytes.
    ///
    /// Errors: opencode could not run, failed (its first words), or
    /// printed more than `limit` bytes or something that is not the
    /// session's export.
    async fn opencode_export(&self, limit: u64) -> Result<Vec<u8>, StateError> {
        let out = self
            .run_opencode(&["export", &self.session], Path::new("/"), limit)
            .await?;
        check_export(&out, &self.session)?;
        Ok(out)
    }

    /// `opencode import <file>` in `repo/` (which becomes the session's
    /// directory), the state's one file written beside opencode's database
    /// for it, as the agent user, and removed after.
    ///
    /// Errors: the state is not the session's export, the file cannot be
    /// written, or opencode failed.
    async fn opencode_import(&self, files: &[StateFile]) -> Result<u64, StateError> {
        self.check_files(files)?;
        let export = files
            .iter()
            .find(|f| self.is_main(&f.path))
            .ok_or_else(|| fail("the state has no export"))?;
        check_export(&export.bytes, &self.session)?;
        let name = format!("hosted-boot-import-{}.json", self.session);
        let this = self.clone();
        let (bytes, file) = (export.bytes.clone(), name.clone());
        tokio::task::spawn_blocking(move || {
            as_user(this.user.as_ref(), || {
                let dir = open_below(&this.base, &this.below, true)?
                    .ok_or_else(|| fail(format!("cannot create {}", this.dir().display())))?;
                // One left by a killed restore goes first.
                let _ = rustix::fs::unlinkat(&dir, file.as_str(), rustix::fs::AtFlags::empty());
                write_new(&dir, &file, &bytes, &mut Vec::new())
            })
        })
        .await
        .unwrap_or_else(|e| Err(fail(format!("the restore failed: {e}"))))?;
        let path = self.dir().join(&name);
        let imported = self
            .run_opencode(&["import", &path.to_string_lossy()], &self.cwd, 1 << 20)
            .await;
        let this = self.clone();
        let _ = tokio::task::spawn_blocking(move || {
            as_user(this.user.as_ref(), || {
                if let Some(dir) = open_below(&this.base, &this.below, false)? {
                    let _ = rustix::fs::unlinkat(&dir, name.as_str(), rustix::fs::AtFlags::empty());
                }
                Ok(())
            })
        })
        .await;
        imported.map(|_| export.bytes.len() as u64)
    }

    /// Runs the CLI's program with `args` in `cwd` as the agent runs it
    /// (user, environment), in a process group of its own that is killed
    /// when it is done, past [`OPENCODE_BOUND`], or when this future is
    /// dropped (a stop); returns its standard output, at most `limit` bytes.
    ///
    /// Errors: it could not start, printed more than `limit`, did not end
    /// in time, or exited non-zero (with the start of its error output).
    async fn run_opencode(
        &self,
        args: &[&str],
        cwd: &Path,
        limit: u64,
    ) -> Result<Vec<u8>, StateError> {
        use tokio::io::AsyncReadExt;
        let what = format!("{} {}", self.program, args.first().copied().unwrap_or(""));
        let mut cmd = tokio::process::Command::new(&self.program);
        if let Some(user) = &self.user {
            user.apply(&mut cmd);
        }
        cmd.args(args)
            .current_dir(cwd)
            .env_clear()
            .envs(self.env.iter().cloned())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| fail(format!("cannot run {what}: {e}")))?;
        let group = GroupKill(
            child
                .id()
                .and_then(|pid| i32::try_from(pid).ok())
                .and_then(rustix::process::Pid::from_raw),
        );
        let kill_group = || group.kill();
        let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take())
        else {
            kill_group();
            return Err(fail(format!("cannot read {what}'s output")));
        };
        let run = async {
            let mut out = Vec::new();
            let mut err = Vec::new();
            let mut rest = [0u8; 8192];
            let mut bounded = (&mut stdout).take(limit.saturating_add(1));
            let read_out = bounded.read_to_end(&mut out);
            // Keeps the first 4 KiB of the error output, drains the rest.
            let read_err = async {
                loop {
                    match stderr.read(&mut rest).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let keep = n.min(4096usize.saturating_sub(err.len()));
                            err.extend_from_slice(&rest[..keep]);
                        }
                    }
                }
            };
            let (read, ()) = tokio::join!(read_out, read_err);
            (read, out, err)
        };
        let (read, out, err) = match tokio::time::timeout(OPENCODE_BOUND, run).await {
            Ok(done) => done,
            Err(_) => {
                kill_group();
                return Err(fail(format!(
                    "{what} did not end within {}",
                    humantime::format_duration(OPENCODE_BOUND)
                )));
            }
        };
        if read.is_err() || out.len() as u64 > limit {
            kill_group();
            return Err(fail(format!("{what} printed more than {limit} bytes")));
        }
        let status = tokio::time::timeout(OPENCODE_BOUND, child.wait()).await;
        kill_group();
        match status {
            Ok(Ok(status)) if status.success() => Ok(out),
            Ok(Ok(status)) => Err(fail(format!(
                "{what} failed ({status}): {}",
                crate::text::head(String::from_utf8_lossy(&err).trim(), 400)
            ))),
            _ => Err(fail(format!("{what} did not end"))),
        }
    }
}

/// Kills a process group when dropped (and on [`GroupKill::kill`]): what
/// opencode started is gone whether its call ended, failed, or was
/// dropped by a stop.
struct GroupKill(Option<rustix::process::Pid>);

impl GroupKill {
    fn kill(&self) {
        if let Some(pid) = self.0 {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `bytes` is an opencode export of `session`: a JSON object whose
/// `info.id` is the session and whose `messages` is an array.
fn check_export(bytes: &[u8], session: &str) -> Result<(), StateError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        fail(format!(
            "the opencode export is not JSON: {}",
            crate::text::json_error(&e)
        ))
    })?;
    let id = value
        .pointer("/info/id")
        .and_then(serde_json::Value::as_str);
    if id != Some(session) || !value["messages"].is_array() {
        let id = id.map_or_else(|| "absent".to_string(), |id| shown(id, 100));
        return Err(fail(format!(
            "the opencode export is not agent session {session}'s (info.id {id}, messages {})",
            if value["messages"].is_array() {
                "an array"
            } else {
                "not an array"
            }
        )));
    }
    Ok(())
}

/// `text` is `n` ASCII digits.
fn digits(text: &str, n: usize) -> bool {
    text.len() == n && text.bytes().all(|b| b.is_ascii_digit())
}

/// A name or path from a stored state as a refusal shows it: quoted when
/// it is made of path characters (letters, digits, `.`, `_`, `-`, `/`) and
/// at most `max` long, else by its length only: a state whose members are
/// swapped or corrupt holds a transcript where a name goes, and the
/// refusal is an event.
fn shown(text: &str, max: usize) -> String {
    let plain = text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'));
    if plain && !text.is_empty() && text.len() <= max {
        format!("{text:?}")
    } else {
        format!("(a text of {} characters, not shown)", text.chars().count())
    }
}

/// A name the CLIs give their files and sessions: ASCII letters, digits,
/// `.`, `_`, `-`, at most 255 bytes, not `.` or `..`.
fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Claude Code's directory name for a working directory (`projects/<name>`):
/// every UTF-16 unit that is not an ASCII letter or digit becomes `-`; a
/// name over 200 characters is cut to 200 and followed by `-` and the
/// base-36 absolute value of the path's 32-bit string hash (Java's
/// `hashCode`), as Claude Code 2.1 names them.
pub fn claude_project_name(path: &str) -> String {
    let munged: String = path
        .encode_utf16()
        .map(|u| match u8::try_from(u) {
            Ok(b) if b.is_ascii_alphanumeric() => char::from(b),
            _ => '-',
        })
        .collect();
    if munged.len() <= 200 {
        return munged;
    }
    let hash = path
        .encode_utf16()
        .fold(0i32, |h, u| h.wrapping_mul(31).wrapping_add(i32::from(u)));
    // ASCII only: 200 characters are 200 bytes.
    let cut: String = munged.chars().take(200).collect();
    format!("{cut}-{}", base36(i64::from(hash).unsigned_abs()))
}

fn base36(mut n: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// Runs `f` on this thread as `user` (when given), then as before.
fn as_user<T>(
    user: Option<&AgentUser>,
    f: impl FnOnce() -> Result<T, StateError>,
) -> Result<T, StateError> {
    let _acting = match user {
        Some(u) => Some(
            u.act_as()
                .map_err(|e| fail(format!("cannot act as the agent user {}: {e}", u.name)))?,
        ),
        None => None,
    };
    f()
}

/// Opens `base` (following links: the environment names it) and then each
/// of `below` without following one; `create` makes what is missing (mode
/// 0700). `Ok(None)`: something is missing and `create` is off.
fn open_below(base: &Path, below: &[String], create: bool) -> Result<Option<OwnedFd>, StateError> {
    if create {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(base)
            .map_err(|e| fail(format!("cannot create {}: {e}", base.display())))?;
    }
    let mut dir = match rustix::fs::open(
        base,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) if !create => return Ok(None),
        Err(e) => return Err(fail(format!("cannot open {}: {e}", base.display()))),
    };
    for name in below {
        dir = match child_dir(&dir, name, create) {
            Ok(Some(fd)) => fd,
            Ok(None) => return Ok(None),
            Err(e) => {
                return Err(fail(format!(
                    "cannot open {}: {e}",
                    base.join(below.join("/")).display()
                )));
            }
        };
    }
    Ok(Some(dir))
}

/// The directory `name` in `dir`, never through a link; made (0700) when
/// missing and `create`.
fn child_dir(dir: &OwnedFd, name: &str, create: bool) -> std::io::Result<Option<OwnedFd>> {
    if create {
        match rustix::fs::mkdirat(dir, name, Mode::RWXU) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    match rustix::fs::openat(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(rustix::io::Errno::NOENT) if !create => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The directory `name` in `dir` if it is one (not a link).
fn open_dir_at(dir: &OwnedFd, name: &str) -> Option<OwnedFd> {
    child_dir(dir, name, false).ok().flatten()
}

/// `name` in `dir` is a regular file (not a link).
fn is_regular_at(dir: &OwnedFd, name: &str) -> bool {
    rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_file())
}

/// Codex's rollout of `session` under `sessions/YYYY/MM/DD/` in `home`,
/// as a path relative to `home`; the newest if there are several.
fn find_rollout(home: &OwnedFd, session: &str) -> Option<String> {
    let suffix = format!("-{session}.jsonl");
    let sessions = open_dir_at(home, "sessions")?;
    let mut found = Vec::new();
    for year in names_in(&sessions).into_iter().filter(|n| digits(n, 4)) {
        let Some(y) = open_dir_at(&sessions, &year) else {
            continue;
        };
        for month in names_in(&y).into_iter().filter(|n| digits(n, 2)) {
            let Some(m) = open_dir_at(&y, &month) else {
                continue;
            };
            for day in names_in(&m).into_iter().filter(|n| digits(n, 2)) {
                let Some(d) = open_dir_at(&m, &day) else {
                    continue;
                };
                for name in names_in(&d) {
                    if name.starts_with("rollout-")
                        && name.ends_with(&suffix)
                        && is_regular_at(&d, &name)
                    {
                        found.push(format!("sessions/{year}/{month}/{day}/{name}"));
                    }
                }
            }
        }
    }
    found.sort();
    found.pop()
}

/// The entries of `dir` (not `.` and `..`), names that are UTF-8 only.
fn names_in(dir: &OwnedFd) -> Vec<String> {
    // `read_from` reads through a descriptor of its own (`openat(".")`).
    let Ok(mut entries) = rustix::fs::Dir::read_from(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    while let Some(Ok(entry)) = entries.next() {
        if out.len() > MAX_ENTRIES {
            break;
        }
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name != "." && name != ".." {
            out.push(name.to_string());
        }
    }
    out.sort();
    out
}

/// What is left of the bytes a save may read, and the directory entries
/// it looked at.
struct Budget {
    left: u64,
    limit: u64,
    entries: usize,
}

/// Reads `name` in `dir` (a regular file, not through a link; a FIFO is not
/// waited on) within the budget.
fn read_file(dir: &OwnedFd, name: &str, budget: &mut Budget) -> Result<Vec<u8>, StateError> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| fail(format!("cannot open {name}: {e}")))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| fail(format!("cannot stat {name}: {e}")))?;
    if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() {
        return Err(fail(format!("{name} is not a regular file")));
    }
    let mut file = std::fs::File::from(fd);
    let mut bytes = Vec::new();
    (&mut file)
        .take(budget.left.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| fail(format!("cannot read {name}: {e}")))?;
    if bytes.len() as u64 > budget.left {
        return Err(fail(format!(
            "the agent state is over {} bytes (at {name})",
            budget.limit
        )));
    }
    budget.left -= bytes.len() as u64;
    Ok(bytes)
}

/// Adds the regular files below `dir` (named `prefix`), depth first, to
/// `files`; links, special files and names that are not plain are left out.
fn walk(
    dir: &OwnedFd,
    prefix: &str,
    depth: usize,
    files: &mut Vec<StateFile>,
    budget: &mut Budget,
) -> Result<(), StateError> {
    if depth >= MAX_DEPTH {
        return Ok(());
    }
    for name in names_in(dir) {
        budget.entries += 1;
        if budget.entries > MAX_ENTRIES {
            return Err(fail(format!(
                "the agent session's directory has over {MAX_ENTRIES} entries"
            )));
        }
        if !safe_name(&name) {
            continue;
        }
        let path = format!("{prefix}/{name}");
        if let Some(sub) = open_dir_at(dir, &name) {
            walk(&sub, &path, depth + 1, files, budget)?;
        } else if is_regular_at(dir, &name) {
            if files.len() >= MAX_FILES {
                return Err(fail(format!("the agent state has over {MAX_FILES} files")));
            }
            let bytes = read_file(dir, &name, budget)?;
            files.push(StateFile { path, bytes });
        }
    }
    Ok(())
}

/// Writes `bytes` to the new file `path` (relative) below `dir`, making
/// its directories (recorded in `made_dirs`, deepest last).
fn write_new(
    dir: &OwnedFd,
    path: &str,
    bytes: &[u8],
    made_dirs: &mut Vec<String>,
) -> Result<(), StateError> {
    let parts: Vec<&str> = path.split('/').collect();
    let (name, parents) = parts.split_last().ok_or_else(|| fail("an empty path"))?;
    let mut current: Option<OwnedFd> = None;
    for (i, p) in parents.iter().enumerate() {
        let at = current.as_ref().unwrap_or(dir);
        let existed = open_dir_at(at, p).is_some();
        let next = child_dir(at, p, true)
            .map_err(|e| fail(format!("cannot create the directory of {path}: {e}")))?
            .ok_or_else(|| fail(format!("cannot create the directory of {path}")))?;
        if !existed {
            made_dirs.push(parts[..=i].join("/"));
        }
        current = Some(next);
    }
    let at = current.as_ref().unwrap_or(dir);
    let fd = rustix::fs::openat(
        at,
        *name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )
    .map_err(|e| match e {
        rustix::io::Errno::EXIST => fail(format!("{path} exists; a restore never replaces a file")),
        e => fail(format!("cannot create {path}: {e}")),
    })?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| fail(format!("cannot write {path}: {e}")))
}

/// Removes the files a failed restore wrote, then the directories it made
/// (deepest first).
fn undo(dir: &OwnedFd, written: &[String], made_dirs: &[String]) {
    for path in written {
        let _ = rustix::fs::unlinkat(dir, path.as_str(), rustix::fs::AtFlags::empty());
    }
    for path in made_dirs.iter().rev() {
        let _ = rustix::fs::unlinkat(dir, path.as_str(), rustix::fs::AtFlags::REMOVEDIR);
    }
}

/// The JSON body of a save (2.7): every file's bytes with the registered
/// secrets redacted, in base64.
pub fn pack(place: &Place, run_id: &str, files: &[StateFile], redactor: &Redactor) -> Vec<u8> {
    redactor.refresh();
    let state = AgentState {
        format: AGENT_STATE_FORMAT,
        cli: place.cli.name().to_string(),
        agent_session_id: place.session.clone(),
        run_id: run_id.to_string(),
        files: files
            .iter()
            .map(|f| AgentStateFile {
                path: f.path.clone(),
                content: base64::engine::general_purpose::STANDARD
                    .encode(redactor.redact_bytes(&f.bytes)),
            })
            .collect(),
    };
    serde_json::to_vec(&state).unwrap_or_default()
}

/// The files of a loaded state (2.7), checked as far as they can be without
/// the file system: its shape, its format, that it is `place`'s CLI and
/// session, and at most `limit` bytes decoded. Returns them and the run
/// after which the state was saved.
///
/// Errors: what is wrong, naming the field (never a file's content).
pub fn unpack(
    place: &Place,
    value: serde_json::Value,
    limit: u64,
) -> Result<(Vec<StateFile>, String), StateError> {
    let state: AgentState = crate::wire::decode::from_value(value)
        .map_err(|e| fail(format!("the agent state is not one (2.7): {e}")))?;
    if state.format != AGENT_STATE_FORMAT {
        return Err(fail(format!(
            "the agent state has format {}, and this runner reads {AGENT_STATE_FORMAT}",
            state.format
        )));
    }
    if state.cli != place.cli.name() {
        return Err(fail(format!(
            "the agent state is {}'s, and the agent is {}",
            shown(&state.cli, 100),
            place.cli.name()
        )));
    }
    if state.agent_session_id != place.session {
        return Err(fail(format!(
            "the agent state holds agent session {}, and the turn resumes {}",
            shown(&state.agent_session_id, 100),
            place.session
        )));
    }
    if state.files.len() > MAX_FILES {
        return Err(fail(format!(
            "the agent state has {} files, over {MAX_FILES}",
            state.files.len()
        )));
    }
    let mut left = limit;
    let mut files = Vec::with_capacity(state.files.len());
    for (i, f) in state.files.into_iter().enumerate() {
        // Named by its place: its path is not checked yet, and base64's
        // error is not quoted (it shows a byte of the content).
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(f.content.as_bytes())
            .map_err(|_| fail(format!("the content of files[{i}] is not base64")))?;
        left = left
            .checked_sub(bytes.len() as u64)
            .ok_or_else(|| fail(format!("the agent state is over {limit} bytes decoded")))?;
        files.push(StateFile {
            path: f.path,
            bytes,
        });
    }
    Ok((files, state.run_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &Path)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), v.as_os_str().to_owned()))
            .collect()
    }

    #[test]
    fn claude_names_a_project_as_claude_code_does() {
        assert_eq!(claude_project_name("/work/repo"), "-work-repo");
        assert_eq!(claude_project_name("/a/b.c_d é"), "-a-b-c-d--");
        // A character outside the BMP is two UTF-16 units, two dashes.
        assert_eq!(claude_project_name("/x/😀"), "-x---");
        let long = format!("/{}", "a".repeat(300));
        let name = claude_project_name(&long);
        assert!(name.starts_with(&format!("-{}", "a".repeat(199))));
        assert_eq!(name.as_bytes()[200], b'-');
        assert!(name[201..].bytes().all(|b| b.is_ascii_alphanumeric()));
    }

    #[test]
    fn base36_is_javascripts() {
        assert_eq!(base36(0), "0");
        assert_eq!(base36(35), "z");
        assert_eq!(base36(36), "10");
        assert_eq!(base36(2_147_483_648), "zik0zk");
    }

    fn claude_place(dir: &Path, repo: &Path) -> Place {
        Place::at(Cli::Claude, &env(&[("HOME", dir)]), repo, "abc-123").unwrap()
    }

    #[test]
    fn a_claude_state_round_trips_into_another_repo_path() {
        let a = tempfile::tempdir().unwrap();
        let repo_a = a.path().join("repo-a");
        std::fs::create_dir(&repo_a).unwrap();
        let place = claude_place(a.path(), &repo_a);
        assert!(!place.exists_now());
        let dir = place.dir();
        std::fs::create_dir_all(dir.join("abc-123/subagents")).unwrap();
        std::fs::write(dir.join("abc-123.jsonl"), b"{\"a\":1}\n").unwrap();
        std::fs::write(dir.join("abc-123/subagents/agent-1.jsonl"), b"sub").unwrap();
        std::fs::write(dir.join("other.jsonl"), b"another session").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("abc-123/link")).unwrap();
        assert!(place.exists_now());
        let files = place.collect_now(1 << 20).unwrap().unwrap();
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["abc-123.jsonl", "abc-123/subagents/agent-1.jsonl"]);

        let b = tempfile::tempdir().unwrap();
        let repo_b = b.path().join("elsewhere/repo");
        std::fs::create_dir_all(&repo_b).unwrap();
        let place_b = claude_place(b.path(), &repo_b);
        assert_eq!(place_b.restore_now(&files).unwrap(), 11);
        assert!(place_b.exists_now());
        assert_eq!(
            std::fs::read(place_b.dir().join("abc-123/subagents/agent-1.jsonl")).unwrap(),
            b"sub"
        );
        // A second restore never replaces, and removes what it wrote.
        let err = place_b.restore_now(&files).unwrap_err();
        assert!(err.0.contains("exists"), "{err}");
        assert!(place_b.exists_now());
    }

    #[test]
    fn too_many_files_beside_the_transcript_leave_it_saved_alone() {
        let a = tempfile::tempdir().unwrap();
        let place = claude_place(a.path(), a.path());
        let sub = place.dir().join("abc-123/tool-results");
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(place.dir().join("abc-123.jsonl"), b"t").unwrap();
        for i in 0..=MAX_FILES {
            std::fs::write(sub.join(format!("{i}.txt")), b"").unwrap();
        }
        let files = place.collect_now(1 << 20).unwrap().unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].path, "abc-123.jsonl");
        // Over the byte limit with them: the transcript alone too.
        std::fs::remove_dir_all(&sub).unwrap();
        std::fs::write(place.dir().join("abc-123/big"), vec![0u8; 100]).unwrap();
        let files = place.collect_now(50).unwrap().unwrap();
        assert_eq!(files.len(), 1);
    }

    #[test]
    fn a_state_over_the_limit_is_not_collected() {
        let a = tempfile::tempdir().unwrap();
        let place = claude_place(a.path(), a.path());
        std::fs::create_dir_all(place.dir()).unwrap();
        std::fs::write(place.dir().join("abc-123.jsonl"), vec![b'x'; 100]).unwrap();
        let err = place.collect_now(99).unwrap_err();
        assert!(err.0.contains("over 99 bytes"), "{err}");
        assert_eq!(place.collect_now(100).unwrap().unwrap().len(), 1);
    }

    #[test]
    fn a_transcript_that_is_a_link_or_a_fifo_is_not_the_sessions() {
        let a = tempfile::tempdir().unwrap();
        let place = claude_place(a.path(), a.path());
        std::fs::create_dir_all(place.dir()).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", place.dir().join("abc-123.jsonl")).unwrap();
        assert!(place.collect_now(1 << 20).unwrap().is_none());
        std::fs::remove_file(place.dir().join("abc-123.jsonl")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            place.dir().join("abc-123.jsonl"),
            rustix::fs::FileType::Fifo,
            Mode::RUSR | Mode::WUSR,
            0,
        )
        .unwrap();
        assert!(place.collect_now(1 << 20).unwrap().is_none());
    }

    #[test]
    fn a_link_on_the_way_is_never_followed() {
        let a = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let place = claude_place(a.path(), a.path());
        std::fs::create_dir_all(a.path().join(".claude/projects")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), place.dir()).unwrap();
        std::fs::write(elsewhere.path().join("abc-123.jsonl"), b"x").unwrap();
        assert!(!place.exists_now());
        let files = [StateFile {
            path: "abc-123.jsonl".into(),
            bytes: b"y".to_vec(),
        }];
        assert!(place.restore_now(&files).is_err());
        assert_eq!(
            std::fs::read(elsewhere.path().join("abc-123.jsonl")).unwrap(),
            b"x"
        );
    }

    #[test]
    fn paths_outside_the_layout_are_refused_before_anything_is_written() {
        let a = tempfile::tempdir().unwrap();
        let place = claude_place(a.path(), a.path());
        let main = StateFile {
            path: "abc-123.jsonl".into(),
            bytes: b"x".to_vec(),
        };
        for bad in [
            "../abc-123.jsonl",
            "/etc/abc-123.jsonl",
            "abc-123/../../x",
            "abc-123/./x",
            "other.jsonl",
            "other/x",
            "abc-123//x",
            "abc-123/x y",
            "",
            "abc-123/a/b/c/d/e/f",
        ] {
            let files = [
                main.clone(),
                StateFile {
                    path: bad.into(),
                    bytes: b"x".to_vec(),
                },
            ];
            let err = place.restore_now(&files).unwrap_err();
            assert!(err.0.contains("refused"), "{bad:?}: {err}");
        }
        assert!(!a.path().join(".claude").exists());
        let err = place
            .restore_now(&[StateFile {
                path: "abc-123/x".into(),
                bytes: vec![],
            }])
            .unwrap_err();
        assert!(err.0.contains("no transcript"), "{err}");
    }

    #[test]
    fn a_codex_rollout_is_found_by_its_id_and_restored_where_it_was() {
        let a = tempfile::tempdir().unwrap();
        let e = env(&[("CODEX_HOME", a.path())]);
        let id = "0199a0b1-c2d3-7e4f-8a9b-0c1d2e3f4a5b";
        let place = Place::at(Cli::Codex, &e, a.path(), id).unwrap();
        let day = a.path().join("sessions/2026/12/06");
        std::fs::create_dir_all(&day).unwrap();
        let name = format!("rollout-2026-12-06T10-00-00-{id}.jsonl");
        std::fs::write(day.join(&name), b"{}\n").unwrap();
        std::fs::write(day.join("rollout-2026-12-06T10-00-00-other.jsonl"), b"").unwrap();
        let files = place.collect_now(1 << 20).unwrap().unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].path, format!("sessions/2026/12/06/{name}"));

        let b = tempfile::tempdir().unwrap();
        let e = env(&[("HOME", b.path())]);
        let place_b = Place::at(Cli::Codex, &e, b.path(), id).unwrap();
        place_b.restore_now(&files).unwrap();
        assert!(b.path().join(".codex").join(&files[0].path).is_file());
        for bad in [
            "sessions/2026/12/06/rollout-x-other.jsonl".to_string(),
            format!("sessions/2026/12/rollout-x-{id}.jsonl"),
            "config.toml".to_string(),
            format!("sessions/2026/12/06/x-{id}.jsonl"),
        ] {
            let f = [StateFile {
                path: bad.clone(),
                bytes: vec![],
            }];
            assert!(place_b.restore_now(&f).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_opencode_state_is_the_sessions_export_only() {
        let a = tempfile::tempdir().unwrap();
        let e = env(&[("XDG_DATA_HOME", a.path())]);
        let place = Place::at(Cli::OpenCode, &e, a.path(), "ses_abc").unwrap();
        assert_eq!(place.dir(), a.path().join("opencode"));
        let export = br#"{"info": {"id": "ses_abc"}, "messages": []}"#;
        assert!(check_export(export, "ses_abc").is_ok());
        for bad in [
            &br#"{"info": {"id": "ses_other"}, "messages": []}"#[..],
            br#"{"info": {"id": "ses_abc"}}"#,
            b"Exporting session: ses_abc",
            b"[]",
        ] {
            assert!(check_export(bad, "ses_abc").is_err());
        }
        let file = |path: &str| StateFile {
            path: path.into(),
            bytes: export.to_vec(),
        };
        assert!(place.check_files(&[file("ses_abc.json")]).is_ok());
        for bad in [
            "opencode.db",
            "ses_abc.jsonl",
            "x/ses_abc.json",
            "../ses_abc.json",
        ] {
            assert!(place.check_files(&[file(bad)]).is_err(), "{bad}");
        }
        // No database: the CLI has no state here, nothing to export.
        assert!(!place.exists_now());
    }

    #[test]
    fn pack_redacts_and_unpack_checks_the_state() {
        let a = tempfile::tempdir().unwrap();
        let place = claude_place(a.path(), a.path());
        let redactor = Redactor::new();
        let secret = crate::secret::Secret::new("sk-live-0123456789abcdef".to_string());
        redactor.add(&secret, crate::redact::SecretKind::Configured);
        let files = vec![StateFile {
            path: "abc-123.jsonl".into(),
            bytes: b"{\"key\":\"sk-live-0123456789abcdef\"}\n".to_vec(),
        }];
        let body = pack(&place, "run-1", &files, &redactor);
        assert!(!String::from_utf8_lossy(&body).contains("0123456789abcdef"));
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        let (back, run) = unpack(&place, value.clone(), 1 << 20).unwrap();
        assert_eq!(run, "run-1");
        assert!(String::from_utf8_lossy(&back[0].bytes).contains("[REDACTED]"));
        assert!(unpack(&place, value.clone(), 5).is_err());
        let mut other = value.clone();
        other["agentSessionId"] = "else".into();
        assert!(
            unpack(&place, other, 1 << 20)
                .unwrap_err()
                .0
                .contains("else")
        );
        let mut other = value.clone();
        other["format"] = 2.into();
        assert!(unpack(&place, other, 1 << 20).is_err());
        let mut other = value.clone();
        other["files"][0]["content"] = "***".into();
        assert!(unpack(&place, other, 1 << 20).is_err());
        assert!(unpack(&place, serde_json::json!([1]), 1 << 20).is_err());
        // A field of the wrong kind is named by its kind, never its value
        // (the reason is an event, and the value may be a transcript).
        let mut other = value.clone();
        other["files"] = "TRANSCRIPT".into();
        let why = unpack(&place, other, 1 << 20).unwrap_err().0;
        assert!(why.contains("files: invalid type: string"), "{why}");
        assert!(!why.contains("TRANSCRIPT"), "{why}");
        // Members swapped or corrupt: a file is named by its place, a
        // transcript where a name goes by its length, a plain name quoted.
        let mut other = value.clone();
        other["files"][0]["path"] = "TRANSCRIPT of the user's work".into();
        other["files"][0]["content"] = "!!".into();
        let why = unpack(&place, other, 1 << 20).unwrap_err().0;
        assert!(
            why.contains("the content of files[0] is not base64"),
            "{why}"
        );
        assert!(!why.contains("TRANSCRIPT"), "{why}");
        let mut other = value.clone();
        other["cli"] = "TRANSCRIPT text".into();
        let why = unpack(&place, other, 1 << 20).unwrap_err().0;
        assert!(!why.contains("TRANSCRIPT"), "{why}");
        assert_eq!(
            shown("TRANSCRIPT of the user's work", 64),
            "(a text of 29 characters, not shown)"
        );
        assert_eq!(
            shown(&"a".repeat(65), 64),
            "(a text of 65 characters, not shown)"
        );
        assert_eq!(shown("../x/y.jsonl", 64), "\"../x/y.jsonl\"");
        let mut other = value.clone();
        other["cli"] = "codex".into();
        let why = unpack(&place, other, 1 << 20).unwrap_err().0;
        assert!(why.contains("\"codex\"'s"), "{why}");
    }
}
