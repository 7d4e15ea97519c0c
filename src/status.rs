//! The status file (PROTOCOL.md section 3): `.hosted-boot/status.json` under
//! the root, 0644, no secret: phase, session and run ids, turn ordinal, since
//! when, last coordinator attempt and last success, runner version, pid.
//! Rewritten atomically at every phase change and, at most once a second, at
//! coordinator contacts; a heartbeat rewrites it at least every 30 s, so a
//! stale file means a stuck or dead runner, never a coordinator outage.
//! `hosted-boot status` prints it; `--check` is the container HEALTHCHECK.

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
                },
                last_write: None,
                warned: false,
            })),
        };
        file.update(true, |_| {});
        file
    }

    fn update(&self, force: bool, change: impl FnOnce(&mut Status)) {
        let mut inner = crate::sync::lock(&self.inner);
        change(&mut inner.status);
        let due = inner
            .last_write
            .is_none_or(|t| t.elapsed() >= CONTACT_WRITE_INTERVAL);
        if !(force || due) {
            return;
        }
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
            (Phase::Stopping, _) => crate::status_line::clear(),
        }
        self.update(true, |s| {
            s.phase = phase;
            s.run_id = run_id.map(str::to_string);
            s.turn_ordinal = ordinal;
            s.since = now();
        });
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

    /// Rewrites the file (the heartbeat).
    pub fn touch(&self) {
        self.update(true, |_| {});
    }
}

fn write(path: &Path, status: &Status) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
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

/// `hosted-boot status [--check]`: prints the status of the runner whose
/// root is `root`; returns the exit code. With `check`: 0 when the runner
/// is alive and the file was rewritten within [`STALE_AFTER`], else 1
/// (never 2, which Docker reserves).
pub fn command(root: &Path, check: bool) -> i32 {
    let path = path(root);
    let status: Status = match std::fs::read(&path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
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
    // A pid over i32::MAX is no process: as an i32 it would be negative,
    // and kill(-1, 0) reaches every process the caller may signal.
    let pid = i32::try_from(status.pid).ok();
    let alive = pid
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|p| {
            rustix::process::test_kill_process(p).is_ok() || status.pid == std::process::id()
        });
    let run = match (&status.run_id, status.turn_ordinal) {
        (Some(r), Some(o)) => format!(" {r} (turn {o})"),
        (Some(r), None) => format!(" {r}"),
        _ => String::new(),
    };
    println!(
        "{:?}{run} since {}; session {}; runner {} pid {}",
        status.phase, status.since, status.session_id, status.runner_version, status.pid
    );
    println!(
        "coordinator: last attempt {}, last success {}",
        status
            .last_coordinator_attempt
            .as_deref()
            .unwrap_or("never"),
        status
            .last_coordinator_success
            .as_deref()
            .unwrap_or("never")
    );
    println!("file written {} s ago", age.as_secs());
    if !check {
        return 0;
    }
    if !alive {
        println!("unhealthy: the runner (pid {}) is gone", status.pid);
        return 1;
    }
    if age > STALE_AFTER {
        println!(
            "unhealthy: the status file was not rewritten for {} s",
            age.as_secs()
        );
        return 1;
    }
    println!("healthy");
    0
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
}
