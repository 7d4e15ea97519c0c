//! The status file (PROTOCOL.md section 3): `.hosted-boot/status.json` under
//! the root, 0644, no secret: phase, session and run ids, turn ordinal, since
//! when, last coordinator attempt and last success, runner version, pid.
//! Rewritten atomically at every phase change and, at most once a second, at
//! coordinator contacts; a heartbeat rewrites it at least every 30 s, so a
//! stale file means a stuck or dead runner, never a coordinator outage.
//! `hosted-boot status` prints it; `--check` is the container HEALTHCHECK.
//! On every exit path the runner writes a final phase `exited` with its exit
//! code and the reason; `status --check` reports that as unhealthy.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

/// The status file's path under `root`.
pub fn path(root: &Path) -> PathBuf {
    root.join(".hosted-boot").join("status.json")
}

/// A file older than this makes `status --check` unhealthy (2 min).
pub const STALE_AFTER: Duration = Duration::from_secs(120);
/// The heartbeat's period (30 s).
pub const HEARTBEAT: Duration = Duration::from_secs(30);
/// How often the heartbeat looks for a change not yet written (1 s).
pub const TICK: Duration = Duration::from_secs(1);
const CONTACT_WRITE_INTERVAL: Duration = Duration::from_secs(1);

/// What the runner is doing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Steps 1–4 of the boot.
    Booting,
    /// Step 5: the clone.
    Cloning,
    /// Waiting for a turn (4.2).
    Idle,
    /// A turn runs.
    Turn,
    /// Exiting (reporting, removing files).
    Stopping,
    /// The runner exited: `exitCode` and `reason` say how (the last write).
    Exited,
}

impl Phase {
    /// The phase as the file spells it (`booting`, `turn`, `exited`, …).
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Booting => "booting",
            Phase::Cloning => "cloning",
            Phase::Idle => "idle",
            Phase::Turn => "turn",
            Phase::Stopping => "stopping",
            Phase::Exited => "exited",
        }
    }
}

/// The step of the running turn (PROTOCOL.md 4.1), for people.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnStep {
    /// Step 4: the agent runs.
    Agent,
    /// Step 6: the harvest commits and pushes the agent's work.
    Harvest,
    /// Step 6: the run's events are flushed, the run sealed.
    Flush,
}

impl TurnStep {
    /// `agent`, `harvest`, `flush`.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnStep::Agent => "agent",
            TurnStep::Harvest => "harvest",
            TurnStep::Flush => "flush",
        }
    }
}

/// The file's content (JSON, camelCase).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The phase.
    pub phase: Phase,
    /// The session.
    pub session_id: String,
    /// The run of the current turn.
    pub run_id: Option<String>,
    /// The current turn's ordinal, when known.
    pub turn_ordinal: Option<u64>,
    /// When the phase began (RFC 3339).
    pub since: String,
    /// Last request to the coordinator (RFC 3339).
    pub last_coordinator_attempt: Option<String>,
    /// Last successful request to the coordinator (RFC 3339).
    pub last_coordinator_success: Option<String>,
    /// When the file was written (RFC 3339).
    pub updated_at: String,
    /// The runner's version.
    pub runner_version: String,
    /// The runner's process id.
    pub pid: u32,
    /// The step of the running turn (phase `turn` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_step: Option<TurnStep>,
    /// The agent's process id (its process group's id) while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_pid: Option<u32>,
    /// The type of the last event spooled for the coordinator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_event: Option<String>,
    /// When the last event was spooled (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_event_at: Option<String>,
    /// The last checkpoint on notice (PROTOCOL.md 4.5, "Checkpoint"):
    /// running, or how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<CheckpointStatus>,
    /// Phase `exited`: the runner's exit code (0, 1, 128+N).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Phase `exited`: why, in one line (the failure's reason, the signal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How the on-stop hook ran, once it did (`--on-stop-script`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_stop: Option<OnStop>,
}

/// How the on-stop hook ran (`--on-stop-script`, PROTOCOL.md 4.7): the
/// status file's `onStop`, written when it ended and kept by the final
/// write.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OnStop {
    /// The ending it ran for (its `ORIZU_BOOT_ENDING`): `complete`, `idle`,
    /// `retired`, `stopped` or `failed`.
    pub ending: String,
    /// How it ended, for people (`exited with code 0`, `was killed at
    /// --on-stop-timeout (30s) with every process it started`, `skipped:
    /// …`).
    pub result: String,
    /// Its exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it, when one did (`SIGKILL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Whether the runner killed it at its bound: `--on-stop-timeout`, or
    /// the end of the stop budget.
    pub timed_out: bool,
    /// From its start to the end of its last process, in milliseconds (0
    /// when it did not start).
    pub duration_ms: u64,
}

/// A checkpoint on notice as the status file records it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointStatus {
    /// When it started, or when the notice was answered (RFC 3339): after
    /// every notice it answers.
    pub started_at: String,
    /// When it ended (RFC 3339); `None` while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// `running`; then `pushed` (the work is on the checkpoint branch),
    /// `on_remote` (a branch of the remote holds it all already), `partial`
    /// (the agent's commits pushed, its uncommitted work not: `error` says
    /// why), `failed`, `nothing` (an unborn `HEAD` and no change), `no_turn`
    /// (no agent ran: every turn's work is harvested at its end),
    /// `harvested` (the agent ended first, or cut the checkpoint: the
    /// turn's harvest pushed the work) or `turn_ended` (the turn ended
    /// before a harvest could run).
    pub outcome: String,
    /// The running turn's run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The branch the work went to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The commit on the remote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// What went wrong (`failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl CheckpointStatus {
    /// A checkpoint (or an answer to a notice) starting now.
    pub fn starting(outcome: &str, run_id: Option<&str>) -> CheckpointStatus {
        CheckpointStatus {
            started_at: now(),
            outcome: outcome.to_string(),
            run_id: run_id.map(str::to_string),
            ..CheckpointStatus::default()
        }
    }

    /// In one line, for people.
    pub fn describe(&self) -> String {
        let at = self.finished_at.as_deref().unwrap_or(&self.started_at);
        let what = match self.outcome.as_str() {
            "running" => "running".to_string(),
            "pushed" => format!(
                "pushed {} to {}",
                self.commit.as_deref().unwrap_or("?"),
                self.branch.as_deref().unwrap_or("?")
            ),
            "on_remote" => format!(
                "nothing new: the remote holds {} already",
                self.commit.as_deref().unwrap_or("the work")
            ),
            "nothing" => "nothing to save (no commit and no change)".to_string(),
            "no_turn" => {
                "no agent was running: nothing to save (every turn's work is harvested at its end)"
                    .to_string()
            }
            "partial" => format!(
                "NOT all of the work is saved: {}; {}",
                self.error.as_deref().unwrap_or("no reason recorded"),
                match &self.branch {
                    Some(branch) => format!(
                        "the rest is on {branch} at {}",
                        self.commit.as_deref().unwrap_or("?")
                    ),
                    None => "the agent's commits are on the remote".to_string(),
                }
            ),
            "harvested" => format!(
                "the agent ended first; the turn's harvest pushed {} to {}",
                self.commit.as_deref().unwrap_or("?"),
                self.branch.as_deref().unwrap_or("?")
            ),
            "turn_ended" => "the turn ended before its harvest; nothing was saved".to_string(),
            "failed" => format!(
                "FAILED: {}",
                self.error.as_deref().unwrap_or("no reason recorded")
            ),
            other => other.to_string(),
        };
        match &self.run_id {
            Some(run) => format!("{what} (run {run}, {at})"),
            None => format!("{what} ({at})"),
        }
    }

    /// This one, ended now.
    pub fn finished(mut self) -> CheckpointStatus {
        self.finished_at = Some(now());
        self
    }
}

/// Records the last checkpoint on notice. Written at once.
pub fn checkpoint(c: CheckpointStatus) {
    if let Some(f) = CURRENT.get() {
        f.update(true, |s| s.last_checkpoint = Some(c));
    }
}

/// The runner's status file, once [`StatusFile::create`] ran: the turn's
/// steps below the boot (the supervisor, the event spool) report to it
/// without carrying a handle.
static CURRENT: std::sync::OnceLock<StatusFile> = std::sync::OnceLock::new();

/// Records the agent's pid (`None`: it exited). Written at once.
pub fn agent_pid(pid: Option<u32>) {
    if let Some(f) = CURRENT.get() {
        f.update(true, |s| s.agent_pid = pid);
    }
}

/// Records the step of the running turn; also shown on the status line.
pub fn turn_step(step: TurnStep) {
    crate::status_line::step(step.as_str());
    if let Some(f) = CURRENT.get() {
        f.update(true, |s| s.turn_step = Some(step));
    }
}

/// Records that events were spooled, the last of type `kind`; `line` is
/// the agent's last output line (redacted) for the status line.
pub fn event(kind: &str, line: Option<&str>) {
    crate::status_line::event(line);
    if let Some(f) = CURRENT.get() {
        f.update(false, |s| {
            s.last_event = Some(kind.to_string());
            s.last_event_at = Some(now());
        });
    }
}

/// Records how many events of the turn the coordinator accepted, for the
/// status line.
pub fn events_sent(accepted: u64) {
    crate::status_line::events_sent(accepted);
}

fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// The runner's writer of the status file. Failures to write are logged
/// once, never fatal: the file is for people and health checks.
#[derive(Clone)]
pub struct StatusFile {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    path: PathBuf,
    status: Status,
    last_write: Option<Instant>,
    /// A change not yet written (contacts and events are written at most
    /// once a second; the heartbeat writes what is left).
    dirty: bool,
    warned: bool,
}

impl StatusFile {
    /// Starts in phase `booting` and writes the file.
    pub fn create(root: &Path, session_id: &str) -> StatusFile {
        let stamp = now();
        let file = StatusFile {
            inner: Arc::new(Mutex::new(Inner {
                path: path(root),
                status: Status {
                    phase: Phase::Booting,
                    session_id: session_id.to_string(),
                    run_id: None,
                    turn_ordinal: None,
                    since: stamp.clone(),
                    last_coordinator_attempt: None,
                    last_coordinator_success: None,
                    updated_at: stamp,
                    runner_version: env!("CARGO_PKG_VERSION").to_string(),
                    pid: std::process::id(),
                    turn_step: None,
                    agent_pid: None,
                    last_event: None,
                    last_event_at: None,
                    last_checkpoint: None,
                    exit_code: None,
                    reason: None,
                    on_stop: None,
                },
                last_write: None,
                dirty: false,
                warned: false,
            })),
        };
        file.update(true, |_| {});
        let _ = CURRENT.set(file.clone());
        file
    }

    fn update(&self, force: bool, change: impl FnOnce(&mut Status)) {
        let mut inner = crate::concurrency::lock(&self.inner);
        change(&mut inner.status);
        let due = inner
            .last_write
            .is_none_or(|t| t.elapsed() >= CONTACT_WRITE_INTERVAL);
        if !(force || due) {
            inner.dirty = true;
            return;
        }
        inner.dirty = false;
        inner.status.updated_at = now();
        inner.last_write = Some(Instant::now());
        if let Err(e) = write(&inner.path, &inner.status)
            && !inner.warned
        {
            inner.warned = true;
            tracing::warn!(path = %inner.path.display(), error = %e, "cannot write the status file");
        }
    }

    /// Enters `phase` (with the turn's run and ordinal for `Turn`).
    pub fn phase(&self, phase: Phase, run_id: Option<&str>, ordinal: Option<u64>) {
        match (&phase, run_id) {
            (Phase::Booting, _) => crate::status_line::set("booting"),
            (Phase::Cloning, _) => crate::status_line::set("cloning the session branch"),
            (Phase::Idle, _) => crate::status_line::set("waiting for a turn"),
            (Phase::Turn, Some(run)) => crate::status_line::set(format!("turn {run} running")),
            (Phase::Turn, None) => crate::status_line::set("turn running"),
            (Phase::Stopping | Phase::Exited, _) => crate::status_line::clear(),
        }
        self.update(true, |s| {
            s.phase = phase;
            s.run_id = run_id.map(str::to_string);
            s.turn_ordinal = ordinal;
            s.turn_step = None;
            s.agent_pid = None;
            s.since = now();
        });
    }

    /// The final write: phase `exited` with the exit `code` and `reason`.
    pub fn exited(&self, code: i32, reason: &str) {
        self.update(true, |s| {
            s.phase = Phase::Exited;
            s.exit_code = Some(code);
            s.reason = Some(reason.to_string());
            s.turn_step = None;
            s.agent_pid = None;
            s.since = now();
        });
    }

    /// Records how the on-stop hook ran. Written at once.
    pub fn on_stop(&self, record: OnStop) {
        self.update(true, |s| s.on_stop = Some(record));
    }

    /// Whether the final phase was written.
    pub fn has_exited(&self) -> bool {
        crate::concurrency::lock(&self.inner).status.phase == Phase::Exited
    }

    /// Records a request to the coordinator and, if `ok`, its success.
    pub fn contact(&self, ok: bool) {
        self.update(false, |s| {
            let t = now();
            if ok {
                s.last_coordinator_success = Some(t.clone());
            }
            s.last_coordinator_attempt = Some(t);
        });
    }

    /// The heartbeat's tick, every [`TICK`]: writes a change not yet
    /// written, and rewrites the file at least every [`HEARTBEAT`].
    pub fn tick(&self) {
        let due = {
            let inner = crate::concurrency::lock(&self.inner);
            inner.dirty || inner.last_write.is_none_or(|t| t.elapsed() >= HEARTBEAT)
        };
        if due {
            self.update(true, |_| {});
        }
    }
}

fn write(path: &Path, status: &Status) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    // `.hosted-boot`, never through a link (issue 31).
    crate::session_dir::runner_dir::runner_dir(dir, 0o755)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    let mut json = serde_json::to_vec_pretty(status).map_err(std::io::Error::other)?;
    json.push(b'\n');
    tmp.write_all(&json)?;
    use std::os::unix::fs::PermissionsExt;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// The status file of the runner of `root`, or why it cannot be read.
///
/// Errors: the file is missing, unreadable, or not a status.
pub fn read(root: &Path) -> Result<Status, String> {
    std::fs::read(path(root))
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
}

/// Whether process `pid` exists (`kill(pid, 0)`: allowed, or refused
/// because another user owns it). A pid over `i32::MAX` is no process: as
/// an i32 it would be negative, and kill(-1, 0) reaches every process.
pub fn process_exists(pid: u32) -> bool {
    i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|p| {
            !matches!(
                rustix::process::test_kill_process(p),
                Err(rustix::io::Errno::SRCH)
            )
        })
}

/// `hosted-boot status [--check]`: prints the status of the runner whose
/// root is `root`; returns the exit code. With `check`: 0 when the runner
/// is alive and the file was rewritten within [`STALE_AFTER`], else 1
/// (never 2, which Docker reserves).
pub fn command(root: &Path, check: bool) -> i32 {
    let path = path(root);
    let status: Status = match read(root) {
        Ok(s) => s,
        Err(e) => {
            println!(
                "unhealthy: cannot read {} ({e}); is the runner started with this root?",
                path.display()
            );
            return 1;
        }
    };
    let age = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|m| SystemTime::now().duration_since(m).ok())
        .unwrap_or(Duration::MAX);
    // A runner of another uid (a probe of the non-root user beside a root
    // runner) answers EPERM, alive all the same.
    let alive = process_exists(status.pid) || status.pid == std::process::id();
    for line in describe(&status, age, alive) {
        println!("{line}");
    }
    if !check {
        return 0;
    }
    if status.phase == Phase::Exited {
        println!(
            "unhealthy: the runner exited with code {}: {}",
            status
                .exit_code
                .map_or_else(|| "unknown".to_string(), |c| c.to_string()),
            status.reason.as_deref().unwrap_or("no reason recorded")
        );
        return 1;
    }
    if !alive {
        println!(
            "unhealthy: the runner (pid {}) is gone without writing its exit",
            status.pid
        );
        return 1;
    }
    if age > STALE_AFTER {
        println!(
            "unhealthy: the status file was not rewritten for {}",
            format_age(age)
        );
        return 1;
    }
    println!("healthy");
    0
}

/// `12 s`, `3 min 05 s`, `2 h 03 min`: an age for people.
pub fn format_age(d: Duration) -> String {
    let s = d.as_secs();
    if d == Duration::MAX {
        "an unknown time".to_string()
    } else if s < 60 {
        format!("{s} s")
    } else if s < 3600 {
        format!("{} min {:02} s", s / 60, s % 60)
    } else {
        format!("{} h {:02} min", s / 3600, (s % 3600) / 60)
    }
}

/// `T (12 s ago)`: an RFC 3339 stamp of the file with its age.
fn stamp_with_age(stamp: &str) -> String {
    match humantime::parse_rfc3339(stamp)
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
    {
        Some(age) => format!("{} ago ({stamp})", format_age(age)),
        None => stamp.to_string(),
    }
}

fn since_age(stamp: &str) -> String {
    match humantime::parse_rfc3339(stamp)
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
    {
        Some(age) => format!("for {} (since {stamp})", format_age(age)),
        None => format!("since {stamp}"),
    }
}

/// The lines `hosted-boot status` prints, `kubectl describe` style: the
/// phase with its age first, then one `name: value` line per fact.
fn describe(status: &Status, file_age: Duration, alive: bool) -> Vec<String> {
    let mut phase = status.phase.as_str().to_string();
    match (&status.run_id, status.turn_ordinal) {
        (Some(r), Some(o)) => phase.push_str(&format!(" {r} (turn {o})")),
        (Some(r), None) => phase.push_str(&format!(" {r}")),
        _ => {}
    }
    if let Some(step) = status.turn_step {
        phase.push_str(&format!(", step {}", step.as_str()));
    }
    if status.phase == Phase::Exited {
        if let Some(code) = status.exit_code {
            phase.push_str(&format!(" with code {code}"));
        }
        if let Some(reason) = &status.reason {
            phase.push_str(&format!(": {reason}"));
        }
    }
    let never = || "never".to_string();
    let mut lines = vec![
        format!("phase        {phase}, {}", since_age(&status.since)),
        format!("session      {}", status.session_id),
        format!(
            "runner       hosted-boot {}, pid {} ({})",
            status.runner_version,
            status.pid,
            if alive { "running" } else { "not running" }
        ),
    ];
    if let Some(pid) = status.agent_pid {
        lines.push(format!("agent        pid {pid} (its process group)"));
    }
    if let Some(c) = &status.last_checkpoint {
        lines.push(format!("checkpoint   {}", c.describe()));
    }
    if let Some(kind) = &status.last_event {
        let at = status
            .last_event_at
            .as_deref()
            .map(|t| format!(", {}", stamp_with_age(t)))
            .unwrap_or_default();
        lines.push(format!("last event   {kind}{at}"));
    }
    lines.push(format!(
        "coordinator  last attempt {}; last success {}",
        status
            .last_coordinator_attempt
            .as_deref()
            .map_or_else(never, stamp_with_age),
        status
            .last_coordinator_success
            .as_deref()
            .map_or_else(never, stamp_with_age)
    ));
    if let Some(hook) = &status.on_stop {
        lines.push(format!(
            "on-stop      ran for {}: {} ({} ms)",
            hook.ending, hook.result, hook.duration_ms
        ));
    }
    lines.push(format!(
        "file         written {} ago ({})",
        format_age(file_age),
        status.updated_at
    ));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_beyond_the_kernels_range_is_no_live_runner() {
        // u32::MAX as i32 is -1, and kill(-1, 0) reaches every process the
        // caller may signal: the check would call a broken file healthy.
        let root = tempfile::tempdir().unwrap();
        let file = StatusFile::create(root.path(), "s1");
        let mut status = file.inner.lock().unwrap().status.clone();
        status.pid = u32::MAX;
        write(&path(root.path()), &status).unwrap();
        assert_eq!(command(root.path(), true), 1);
    }

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(format_age(Duration::from_millis(12_400)), "12 s");
        assert_eq!(format_age(Duration::from_secs(185)), "3 min 05 s");
        assert_eq!(format_age(Duration::from_secs(7380)), "2 h 03 min");
    }

    #[test]
    fn the_on_stop_hooks_result_is_kept_by_the_final_write_and_shown() {
        let root = tempfile::tempdir().unwrap();
        let file = StatusFile::create(root.path(), "s1");
        file.on_stop(OnStop {
            ending: "complete".into(),
            result: "exited with code 3".into(),
            exit_code: Some(3),
            signal: None,
            timed_out: false,
            duration_ms: 1200,
        });
        file.exited(0, "the session ended; complete was posted");
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path(root.path())).unwrap()).unwrap();
        assert_eq!(
            json["onStop"],
            serde_json::json!({
                "ending": "complete",
                "result": "exited with code 3",
                "exitCode": 3,
                "timedOut": false,
                "durationMs": 1200
            })
        );
        let status: Status = serde_json::from_value(json).unwrap();
        let lines = describe(&status, Duration::from_secs(2), false);
        assert!(
            lines.contains(
                &"on-stop      ran for complete: exited with code 3 (1200 ms)".to_string()
            ),
            "{lines:?}"
        );
    }

    #[test]
    fn the_exited_phase_is_unhealthy_with_its_code_and_reason() {
        let root = tempfile::tempdir().unwrap();
        let file = StatusFile::create(root.path(), "s1");
        assert_eq!(command(root.path(), true), 0, "a live runner is healthy");
        file.exited(1, "turn_failed run-1: agent_crashed");
        let status: Status =
            serde_json::from_slice(&std::fs::read(path(root.path())).unwrap()).unwrap();
        assert_eq!(status.phase, Phase::Exited);
        assert_eq!(status.exit_code, Some(1));
        let lines = describe(&status, Duration::from_secs(2), true);
        assert!(
            lines[0].starts_with(
                "phase        exited with code 1: turn_failed run-1: agent_crashed, for 0 s (since "
            ),
            "{lines:?}"
        );
        assert_eq!(command(root.path(), true), 1);
    }
}
