//! The repository's setup script (PROTOCOL.md 4.1 step 3, "Setup"): run once
//! per sandbox in `repo/`, as the agent's user, before the first agent of
//! the boot starts, within `--setup-timeout`, under the turn supervisor (a
//! session of its own, the turn guard, the sweep: nothing of it outlives
//! it). Its output lines are the first turn's `hosted_boot.setup_output`
//! events, redacted like the agent's; `hosted_boot.setup` events say it
//! started, ended, or was skipped by the setup cache.
//!
//! The setup cache: a fingerprint of the script, the files it depends on
//! (`--setup-inputs` or `session.setup.inputs`) and the machine's boot id,
//! kept in [`FINGERPRINT_FILE`] next to `repo/` once a setup succeeded. A
//! restarted runner on the same root whose fingerprint matches skips the
//! setup; any change (script, an input's content, the set of inputs, a new
//! machine boot, which loses what setup wrote outside the root) runs it
//! again.
//!
//! What setup changed in tracked files (or a commit it made) is not the
//! agent's work: it is undone before the agent starts
//! ([`crate::workspace::Harvester::undo_setup_changes`]), so the harvest never
//! commits it; the `hosted_boot.setup` event names the paths.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, watch};

use crate::agent::drive::RunRequest;
use crate::agent_user::AgentUser;
use crate::events::EventSender;
use crate::events::event::RunnerEvent;
use crate::process::lines::Line;
use crate::process::output::LineSink;
use crate::process::supervisor::{self, Control, Exit, SpawnSpec, Stream, Supervision};
use crate::redact::Redactor;
use crate::secret::Secret;
use crate::signals::Stop;
use crate::timings::Timings;
use crate::wire::SessionSetup;
use crate::workspace::Harvester;

/// The setup cache's fingerprint, under the root next to `repo/` (PROTOCOL.md
/// section 3): hex SHA-256, one line.
pub const FINGERPRINT_FILE: &str = ".orizu-setup-fingerprint";

/// The default of `--setup-timeout`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// Where the machine's boot id is (a new sandbox, a new boot id).
const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The end of setup's output kept for the `setup_failed` message.
const TAIL_CHARS: usize = 600;

/// The image's setup settings (`--setup-script`, `--setup-inputs`,
/// `--setup-timeout`, scaled by `HOSTED_BOOT_TEST_TIME_SCALE`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SetupConfig {
    /// A path to a program, or a shell command.
    pub script: Option<String>,
    /// Globs of setup's input files under `repo/`.
    pub inputs: Vec<String>,
    /// Bound on the whole setup.
    pub timeout: Duration,
}

/// Where the setup script came from; the log and the events say which ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `--setup-script`.
    Image,
    /// `session.setup.script`.
    Session,
}

impl Source {
    /// `image` or `session`.
    pub const fn name(self) -> &'static str {
        match self {
            Source::Image => "image",
            Source::Session => "session",
        }
    }
}

/// The setup of this boot, until it has succeeded (or the cache said it
/// had). `Debug` shows the names of the setup-only connectors, not their
/// values.
pub struct Setup {
    source: Source,
    script: String,
    inputs: Vec<String>,
    timeout: Duration,
    /// Connectors of `"scope": "setup"`: in setup's environment only.
    secrets: Vec<(String, Secret)>,
    fingerprint_path: PathBuf,
    /// Whether it still has to run before an agent may start.
    pending: AtomicBool,
}

impl std::fmt::Debug for Setup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.secrets.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Setup")
            .field("source", &self.source)
            .field("script", &self.script)
            .field("inputs", &self.inputs)
            .field("timeout", &self.timeout)
            .field("setup_only", &names)
            .finish()
    }
}

/// How the setup ended, for the turn.
#[derive(Debug, PartialEq)]
pub enum SetupEnd {
    /// It succeeded (or had, by the cache): the agent may start.
    Ready,
    /// It failed or timed out: the turn fails `setup_failed` with this
    /// message (the tail of its output included).
    Failed(String),
    /// An interrupt of the turn, or a stop signal, stopped it: the turn is
    /// `interrupted`, and setup runs again before the next agent.
    Interrupted,
}

/// What one run of the setup needs from the turn.
pub struct SetupRun<'a> {
    /// `repo/`, the working directory.
    pub repo_dir: &'a Path,
    /// `--agent-user`.
    pub user: Option<&'a AgentUser>,
    /// The agent's environment without the per-turn variables.
    pub env: &'a [(OsString, OsString)],
    /// The first turn's events.
    pub events: &'a EventSender,
    /// The boot's redactor.
    pub redactor: &'a Redactor,
    /// The turn's supervision (drain, cgroup, guard).
    pub supervision: &'a Supervision,
    /// Interrupt and stop graces.
    pub timings: &'a Timings,
    /// For the undo of setup's changes to tracked files.
    pub harvester: &'a Harvester,
}

impl Setup {
    /// The setup of this boot: the session's script wins over the image's,
    /// the session's inputs over the image's; `None` when neither names a
    /// script. `root` is where the fingerprint lives.
    pub fn plan(
        config: &SetupConfig,
        session: Option<&SessionSetup>,
        secrets: Vec<(String, Secret)>,
        root: &Path,
    ) -> Option<Setup> {
        let from_session = session
            .and_then(|s| s.script.as_deref())
            .map(str::trim)
            .filter(|s| !s.is_empty());
        let (source, script) = match (from_session, &config.script) {
            (Some(s), Some(_)) => {
                tracing::info!(
                    "the session's setup.script wins over --setup-script; the session's runs"
                );
                (Source::Session, s.to_string())
            }
            (Some(s), None) => (Source::Session, s.to_string()),
            (None, Some(s)) => (Source::Image, s.clone()),
            (None, None) => {
                if !secrets.is_empty() {
                    tracing::warn!(
                        "the env bundle has setup-only connectors but no setup script is set; they go to no process"
                    );
                }
                return None;
            }
        };
        let inputs = match session.and_then(|s| s.inputs.clone()) {
            Some(inputs) => inputs,
            None => config.inputs.clone(),
        };
        Some(Setup {
            source,
            script,
            inputs,
            timeout: config.timeout,
            secrets,
            fingerprint_path: root.join(FINGERPRINT_FILE),
            pending: AtomicBool::new(true),
        })
    }

    /// Runs the setup unless it already succeeded in this boot, or the
    /// cache says it did in an earlier one on this root and machine boot.
    /// An interrupt (`requests`) or a stop signal stops it as they stop an
    /// agent without a protocol interrupt: the stop signal to its tree at
    /// once, SIGKILL after the grace (PROTOCOL.md 4.1 step 4, 4.4).
    pub async fn before_first_agent(
        &self,
        run: SetupRun<'_>,
        requests: &mut mpsc::UnboundedReceiver<RunRequest>,
        stop: &mut watch::Receiver<Stop>,
    ) -> SetupEnd {
        if !self.pending.load(Ordering::SeqCst) {
            return SetupEnd::Ready;
        }
        if *stop.borrow() != Stop::Running {
            return SetupEnd::Interrupted;
        }
        let source = self.source.name();
        let fingerprint = self.fingerprint(run.repo_dir).await;
        if let Ok(f) = &fingerprint
            && std::fs::read_to_string(&self.fingerprint_path).is_ok_and(|kept| kept.trim() == f)
        {
            tracing::info!(
                source,
                "setup skipped: the setup cache's fingerprint matches (same script, inputs and machine boot)"
            );
            run.events.emit(
                RunnerEvent::Setup,
                json!({"phase": "skipped", "source": source, "reason": "the fingerprint matches: same script, inputs and machine boot"}),
            );
            self.pending.store(false, Ordering::SeqCst);
            return SetupEnd::Ready;
        }
        if let Err(e) = &fingerprint {
            tracing::warn!(error = %e, "cannot compute the setup cache's fingerprint; setup runs and is not cached");
        }
        // A setup that fails or is stopped from here on leaves no fingerprint
        // to match.
        if let Err(e) = std::fs::remove_file(&self.fingerprint_path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.fingerprint_path.display(), error = %e, "cannot remove the setup cache's fingerprint");
        }
        tracing::info!(source, script = %self.script, "running the setup script");
        run.events.emit(
            RunnerEvent::Setup,
            json!({"phase": "started", "source": source, "script": self.script}),
        );
        let before = run.harvester.head_commit().await;
        let end = match self.execute(&run, requests, stop).await {
            SetupEnd::Ready => self.undo_tracked_changes(&run, before).await,
            other => other,
        };
        match &end {
            SetupEnd::Ready => {
                if let Ok(f) = &fingerprint
                    && let Err(e) = crate::session_dir::write_secret_file(
                        &self.fingerprint_path,
                        format!("{f}\n").as_bytes(),
                    )
                {
                    tracing::warn!(error = %e, "cannot write the setup cache's fingerprint; a restarted runner runs setup again");
                }
                self.pending.store(false, Ordering::SeqCst);
                tracing::info!(source, "setup succeeded");
            }
            SetupEnd::Failed(message) => {
                tracing::error!(source, message = %message, "setup failed");
                run.events.emit(
                    RunnerEvent::Setup,
                    json!({"phase": "failed", "source": source, "message": message}),
                );
            }
            SetupEnd::Interrupted => {
                tracing::info!(source, "setup stopped by an interrupt or a stop signal");
                run.events.emit(
                    RunnerEvent::Setup,
                    json!({"phase": "interrupted", "source": source}),
                );
            }
        }
        end
    }

    /// After a setup that succeeded: its changes to tracked files undone,
    /// and the `succeeded` event naming them.
    async fn undo_tracked_changes(&self, run: &SetupRun<'_>, before: Option<String>) -> SetupEnd {
        let source = self.source.name();
        match run.harvester.undo_setup_changes(before).await {
            Ok(changes) => {
                if !changes.is_empty() {
                    tracing::warn!(
                        paths = ?changes.paths,
                        head_moved = changes.head_moved,
                        "setup changed tracked files; they are put back (the harvest never commits setup's changes)"
                    );
                }
                run.events.emit(
                    RunnerEvent::Setup,
                    json!({"phase": "succeeded", "source": source, "restoredPaths": changes.paths, "headRestored": changes.head_moved}),
                );
                SetupEnd::Ready
            }
            Err(e) => SetupEnd::Failed(format!(
                "setup succeeded but its changes to tracked files could not be undone: {e}"
            )),
        }
    }

    /// The script as a program and its arguments: an existing file runs
    /// itself when executable, through `sh` otherwise; anything else is a
    /// shell command.
    fn command(&self) -> (String, Vec<String>) {
        use std::os::unix::fs::PermissionsExt;
        let sh = "/bin/sh".to_string();
        if self.source == Source::Image {
            let path = Path::new(&self.script);
            if let Ok(m) = std::fs::metadata(path)
                && m.is_file()
            {
                return if m.permissions().mode() & 0o111 != 0 {
                    (self.script.clone(), Vec::new())
                } else {
                    (sh, vec![self.script.clone()])
                };
            }
        }
        (sh, vec!["-c".to_string(), self.script.clone()])
    }

    async fn execute(
        &self,
        run: &SetupRun<'_>,
        requests: &mut mpsc::UnboundedReceiver<RunRequest>,
        stop: &mut watch::Receiver<Stop>,
    ) -> SetupEnd {
        let (program, args) = self.command();
        let spec = SpawnSpec {
            program,
            args,
            cwd: run.repo_dir.to_path_buf(),
            env: self.env(run),
            stdin: Vec::new(),
            stdin_feed: None,
            user: run.user.cloned(),
        };
        let supervision = Supervision {
            time_cap: Some(self.timeout),
            cap_grace: run.timings.interrupt_grace,
            stop_signal: rustix::process::Signal::INT,
            ..run.supervision.clone()
        };
        let tail = Arc::new(Mutex::new(String::new()));
        let (events, redactor, kept) = (run.events.clone(), run.redactor.clone(), tail.clone());
        let output = move |stream: Stream| {
            let (events, kept) = (events.clone(), kept.clone());
            LineSink::new(stream, &redactor, move |stream, line: Line| {
                let text = line.text();
                remember(&kept, &text);
                let stream = match stream {
                    Stream::Stdout => "stdout",
                    Stream::Stderr => "stderr",
                };
                events.emit(
                    RunnerEvent::SetupOutput,
                    json!({"stream": stream, "text": text, "continued": line.continued}),
                );
            })
        };
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let supervised = supervisor::run(spec, control_rx, &supervision, output);
        tokio::pin!(supervised);
        let (mut interrupted, mut requests_open, mut stop_open) = (false, true, true);
        let result = loop {
            tokio::select! {
                r = &mut supervised => break r,
                request = requests.recv(), if requests_open => match request {
                    Some(RunRequest::Interrupt) => {
                        interrupted = true;
                        tracing::info!("interrupt requested during setup; stopping it");
                        let _ = control_tx.send(Control::Interrupt { grace: run.timings.interrupt_grace });
                    }
                    None => requests_open = false,
                },
                changed = stop.changed(), if stop_open => {
                    if changed.is_err() {
                        stop_open = false;
                        continue;
                    }
                    match *stop.borrow_and_update() {
                        Stop::Graceful(_) => {
                            interrupted = true;
                            let _ = control_tx.send(Control::Interrupt { grace: run.timings.stop_grace });
                        }
                        Stop::Immediate(_) => {
                            interrupted = true;
                            let _ = control_tx.send(Control::Kill);
                        }
                        Stop::Running => {}
                    }
                }
            }
        };
        let tail = crate::concurrency::lock(&tail).clone();
        let exit = match result {
            Ok(exit) => exit,
            Err(e) => {
                return SetupEnd::Failed(with_tail(
                    format!(
                        "the setup script ({}) could not be started: {}",
                        self.source.name(),
                        e.reason
                    ),
                    &tail,
                ));
            }
        };
        if interrupted {
            return SetupEnd::Interrupted;
        }
        match failure(&exit, self.timeout) {
            None => SetupEnd::Ready,
            Some(what) => SetupEnd::Failed(with_tail(
                format!("the setup script ({}) {what}", self.source.name()),
                &tail,
            )),
        }
    }

    /// The agent's environment (the agent user's `HOME`, `USER`, `LOGNAME`
    /// set as for the agent) with the setup-only connectors.
    fn env(&self, run: &SetupRun<'_>) -> Vec<(OsString, OsString)> {
        let mut env: std::collections::BTreeMap<OsString, OsString> =
            run.env.iter().cloned().collect();
        if let Some(user) = run.user {
            env.insert("HOME".into(), user.home.clone().into_os_string());
            env.insert("USER".into(), user.name.clone().into());
            env.insert("LOGNAME".into(), user.name.clone().into());
        }
        for (name, value) in &self.secrets {
            env.insert(name.into(), value.expose().into());
        }
        env.into_iter().collect()
    }

    /// The setup cache's fingerprint of this setup over `repo_dir` now.
    async fn fingerprint(&self, repo_dir: &Path) -> std::io::Result<String> {
        let script = self.script.clone();
        let file = (self.source == Source::Image).then(|| PathBuf::from(&self.script));
        let inputs = self.inputs.clone();
        let repo = repo_dir.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let boot_id = std::fs::read_to_string(BOOT_ID_PATH)?;
            fingerprint(&script, file.as_deref(), &inputs, &repo, boot_id.trim())
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

/// What went wrong with a setup that exited, if anything did.
fn failure(exit: &Exit, timeout: Duration) -> Option<String> {
    use std::os::unix::process::ExitStatusExt;
    if exit.timed_out {
        let timeout = Duration::from_millis(timeout.as_millis() as u64);
        return Some(format!(
            "did not end within --setup-timeout ({}); it was stopped with every process it started",
            humantime::format_duration(timeout)
        ));
    }
    if let Some(pid) = exit.guard_died {
        return Some(format!(
            "lost its turn guard (pid {pid}) and was killed with every process it started"
        ));
    }
    match exit.status {
        Some(s) if s.success() => None,
        Some(s) => Some(match (s.code(), s.signal()) {
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(signal)) => {
                format!("was killed by {}", crate::signals::signal_name(signal))
            }
            (None, None) => "ended abnormally".to_string(),
        }),
        None => Some("ended, but its exit status could not be read".to_string()),
    }
}

/// Keeps the last [`TAIL_CHARS`] characters of setup's (redacted) output.
fn remember(tail: &Mutex<String>, text: &str) {
    let mut tail = crate::concurrency::lock(tail);
    tail.push_str(text);
    tail.push('\n');
    if tail.len() > 4 * TAIL_CHARS {
        *tail = crate::text::last(&tail, TAIL_CHARS).to_string();
    }
}

/// `what`, then the end of setup's output, within the 800 characters of a
/// `finish` message.
fn with_tail(what: String, tail: &str) -> String {
    let tail = tail.trim_end();
    if tail.is_empty() {
        return format!("{what}; it printed nothing");
    }
    let room = 780usize
        .saturating_sub(what.chars().count())
        .min(TAIL_CHARS);
    format!(
        "{what}; the end of its output: {}",
        crate::text::last(tail, room)
    )
}

/// The fingerprint (hex SHA-256) of a setup: its script (and the content of
/// the file it names, for a path), the inputs' globs and the path and
/// content of every regular file under `repo` they match (`.git` and
/// symbolic links never followed), and the machine's `boot_id`.
///
/// Errors: a matched file that cannot be read.
pub fn fingerprint(
    script: &str,
    file: Option<&Path>,
    inputs: &[String],
    repo: &Path,
    boot_id: &str,
) -> std::io::Result<String> {
    use ring::digest::{Context, SHA256};
    let mut ctx = Context::new(&SHA256);
    let mut field = |bytes: &[u8]| {
        ctx.update(&(bytes.len() as u64).to_le_bytes());
        ctx.update(bytes);
    };
    field(b"hosted-boot setup fingerprint 1");
    field(script.as_bytes());
    match file.map(std::fs::symlink_metadata) {
        Some(Ok(m)) if m.is_file() => field(&hash_file(file.unwrap_or(Path::new("")))?),
        _ => field(b""),
    }
    field(boot_id.as_bytes());
    let mut patterns: Vec<&String> = inputs.iter().collect();
    patterns.sort();
    for p in patterns {
        field(p.as_bytes());
    }
    for path in matched_inputs(repo, inputs) {
        field(path.as_bytes());
        field(&hash_file(&repo.join(&path))?);
    }
    Ok(hex(ctx.finish().as_ref()))
}

fn hash_file(path: &Path) -> std::io::Result<Vec<u8>> {
    use ring::digest::{Context, SHA256};
    let mut ctx = Context::new(&SHA256);
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut buf)? {
            0 => break,
            n => ctx.update(buf.get(..n).unwrap_or_default()),
        }
    }
    Ok(ctx.finish().as_ref().to_vec())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The regular files under `repo` (paths relative to it, `/`-separated)
/// that any of `patterns` matches: `*` and `?` within a path component,
/// `**` for any number of directories. `.git` and symbolic links are never
/// entered or matched, so the runner reads nothing the agent could point
/// elsewhere.
pub fn matched_inputs(repo: &Path, patterns: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for p in patterns {
        let parts: Vec<&str> = p
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        walk(repo, "", &parts, &mut out);
    }
    out
}

fn walk(dir: &Path, rel: &str, parts: &[&str], out: &mut BTreeSet<String>) {
    let Some((first, rest)) = parts.split_first() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    if *first == "**" {
        walk(dir, rel, rest, out);
    }
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if name == ".git" || kind.is_symlink() {
            continue;
        }
        let path = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        if *first == "**" {
            if kind.is_dir() {
                walk(&entry.path(), &path, parts, out);
            }
            continue;
        }
        if !component_matches(first.as_bytes(), name.as_bytes()) {
            continue;
        }
        if rest.is_empty() {
            if kind.is_file() {
                out.insert(path);
            }
        } else if kind.is_dir() {
            walk(&entry.path(), &path, rest, out);
        }
    }
}

/// `*` (any run of bytes) and `?` (one byte) over one path component.
fn component_matches(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.split_first(), name.split_first()) {
        (None, None) => true,
        (Some((b'*', p)), _) => {
            component_matches(p, name)
                || name
                    .split_first()
                    .is_some_and(|(_, n)| component_matches(pattern, n))
        }
        (Some((b'?', p)), Some((_, n))) => component_matches(p, n),
        (Some((c, p)), Some((d, n))) if c == d => component_matches(p, n),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_match_stars_and_question_marks() {
        let m = |p: &str, n: &str| component_matches(p.as_bytes(), n.as_bytes());
        assert!(m("*.lock", "Cargo.lock"));
        assert!(m("package-lock.json", "package-lock.json"));
        assert!(m("?.txt", "a.txt"));
        assert!(m("*", ".hidden"));
        assert!(!m("*.lock", "Cargo.toml"));
        assert!(!m("?.txt", "ab.txt"));
    }

    #[test]
    fn inputs_are_regular_files_matched_under_the_repo_never_in_git_or_through_links() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        std::fs::create_dir_all(repo.join("a/b")).unwrap();
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::write(repo.join("Cargo.lock"), "1").unwrap();
        std::fs::write(repo.join("a/b/Cargo.lock"), "2").unwrap();
        std::fs::write(repo.join(".git/Cargo.lock"), "3").unwrap();
        std::fs::write(dir.path().join("a/x.lock"), "4").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", repo.join("a/link.lock")).unwrap();
        let found = matched_inputs(repo, &["**/*.lock".into()]);
        let found: Vec<&str> = found.iter().map(String::as_str).collect();
        assert_eq!(found, ["Cargo.lock", "a/b/Cargo.lock", "a/x.lock"]);
        let found = matched_inputs(repo, &["Cargo.lock".into(), "../*".into()]);
        assert_eq!(found.into_iter().collect::<Vec<_>>(), ["Cargo.lock"]);
    }

    #[test]
    fn the_fingerprint_changes_with_the_script_an_input_the_inputs_and_the_boot_id() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        std::fs::write(repo.join("deps.lock"), "v1").unwrap();
        let inputs = vec!["*.lock".to_string()];
        let f = |script: &str, inputs: &[String], boot: &str| {
            fingerprint(script, None, inputs, repo, boot).unwrap()
        };
        let base = f("make deps", &inputs, "boot-1");
        assert_eq!(base, f("make deps", &inputs, "boot-1"));
        assert_eq!(base.len(), 64);
        assert_ne!(base, f("make deps2", &inputs, "boot-1"));
        assert_ne!(base, f("make deps", &inputs, "boot-2"));
        assert_ne!(base, f("make deps", &[], "boot-1"));
        std::fs::write(repo.join("deps.lock"), "v2").unwrap();
        assert_ne!(base, f("make deps", &inputs, "boot-1"));
    }

    #[test]
    fn the_session_script_and_inputs_win_over_the_image() {
        let config = SetupConfig {
            script: Some("./image-setup".into()),
            inputs: vec!["a.lock".into()],
            timeout: DEFAULT_TIMEOUT,
        };
        let root = Path::new("/r");
        let image = Setup::plan(&config, None, Vec::new(), root).unwrap();
        assert_eq!(
            (image.source, image.script.as_str(), image.inputs.clone()),
            (Source::Image, "./image-setup", vec!["a.lock".to_string()])
        );
        let session = SessionSetup {
            script: Some("make setup".into()),
            inputs: Some(vec!["b.lock".into()]),
        };
        let s = Setup::plan(&config, Some(&session), Vec::new(), root).unwrap();
        assert_eq!(
            (s.source, s.script.as_str(), s.inputs.clone()),
            (Source::Session, "make setup", vec!["b.lock".to_string()])
        );
        assert_eq!(s.fingerprint_path, root.join(FINGERPRINT_FILE));
        assert!(Setup::plan(&SetupConfig::default(), None, Vec::new(), root).is_none());
        let tail = with_tail("the setup script (image) exited with code 3".into(), "x\n");
        assert_eq!(
            tail,
            "the setup script (image) exited with code 3; the end of its output: x"
        );
    }
}
