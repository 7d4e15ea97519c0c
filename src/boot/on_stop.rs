//! The on-stop hook (`--on-stop-script`, PROTOCOL.md 4.7): a shell
//! command run once as the boot ends, after the last harvest and before the
//! final report (`complete`, `released`, `failed`, a fatal run's seal and
//! `turn_failed`), with the session directory already removed, as the agent
//! user, in `repo/` (the root when there is none), under the turn
//! supervisor (a session and process group of its own, the turn guard, the
//! cgroup where allowed, the sweep: nothing it started outlives it).
//!
//! It runs for every ending but an immediate stop (a second signal): the
//! session ended, the runner left its sandbox (idle or retired), a graceful
//! stop, and a failure, as a CI runner's job-completed hook runs after a
//! failed job. Bounded by `--on-stop-timeout`, and on a graceful stop by
//! what the stop budget leaves (counted from the signal, 4.4): at its bound
//! its whole tree is killed (SIGKILL). A second signal kills it at once.
//!
//! Its output goes to the runner's log, redacted, its first
//! [`MAX_LOGGED_LINES`] lines each cut at [`MAX_LINE_CHARS`] characters; how
//! it ended is logged and recorded in the status file's `onStop`. It never
//! changes the runner's exit code or what is reported.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::agent_user::AgentUser;
use crate::process::lines::Line;
use crate::process::output::LineSink;
use crate::process::supervisor::{self, Control, Exit, SpawnSpec, Stream, Supervision};
use crate::redact::Redactor;
use crate::signals::Stop;
use crate::status::OnStop;

use super::environment::AppliedBundle;

/// The default of `--on-stop-timeout`: a hook's cleanup (a cache flushed, a
/// log uploaded, the sandbox deregistered) takes seconds; the report waits
/// for it, and Kubernetes gives a stopping container 30 s by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Lines of the hook's output logged; the rest are counted.
pub const MAX_LOGGED_LINES: usize = 200;

/// Characters of one line of the hook's output logged.
pub const MAX_LINE_CHARS: usize = 1000;

/// The variable that tells the hook why the boot ended.
pub const ENDING_VAR: &str = "ORIZU_BOOT_ENDING";

/// `--on-stop-script` and `--on-stop-timeout` (scaled by
/// `HOSTED_BOOT_TEST_TIME_SCALE`).
#[derive(Clone, Debug, PartialEq)]
pub struct OnStopConfig {
    /// The shell command (`sh -c`).
    pub script: String,
    /// The hook's bound.
    pub timeout: Duration,
}

/// Why the boot ended, as the hook is told (`ORIZU_BOOT_ENDING`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BootEnding {
    /// The session ended (`complete`).
    Complete,
    /// The runner left its sandbox idle (`released`, reason `idle`).
    Idle,
    /// The runner retired (`released`, reason `retired`, or nothing posted).
    Retired,
    /// A graceful stop (SIGTERM, SIGINT).
    Stopped,
    /// A failure (`failed`, or `turn_failed`).
    Failed,
}

impl BootEnding {
    /// `complete`, `idle`, `retired`, `stopped` or `failed`.
    pub const fn as_str(self) -> &'static str {
        match self {
            BootEnding::Complete => "complete",
            BootEnding::Idle => "idle",
            BootEnding::Retired => "retired",
            BootEnding::Stopped => "stopped",
            BootEnding::Failed => "failed",
        }
    }
}

/// The hook of this boot, with what its environment needs.
pub struct Hook {
    config: OnStopConfig,
    root: PathBuf,
    user: Option<AgentUser>,
    /// The runner's environment as it was started, minus the boot secret.
    base_env: Vec<(OsString, OsString)>,
    session_id: String,
    /// The env bundle once applied (boot step 3): its connectors are the
    /// agent's, so the hook's too.
    bundle: Option<AppliedBundle>,
    /// As a turn's agent is supervised, without a time cap.
    supervision: Supervision,
    stop_budget: Duration,
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hook")
            .field("config", &self.config)
            .field("root", &self.root)
            .field("user", &self.user.as_ref().map(|u| u.uid))
            .finish_non_exhaustive()
    }
}

/// Where the hook's bound comes from, for its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bound {
    /// `--on-stop-timeout`.
    Timeout,
    /// The end of the graceful stop's budget.
    StopBudget,
}

/// When the hook must be gone, and why then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Deadline {
    at: Instant,
    by: Bound,
}

impl Deadline {
    /// `--on-stop-timeout` from `now`, or the stop budget's end when that
    /// comes first.
    fn new(now: Instant, timeout: Duration, stop_end: Option<Instant>) -> Deadline {
        let own = Deadline {
            // The configuration bounds the timeout (24 h); a clock that
            // cannot add it anyway ends the hook in a day.
            at: now
                .checked_add(timeout)
                .unwrap_or_else(|| now + Duration::from_secs(86_400)),
            by: Bound::Timeout,
        };
        own.cut_at(stop_end)
    }

    /// This deadline, or the stop budget's end when that comes first.
    fn cut_at(self, stop_end: Option<Instant>) -> Deadline {
        match stop_end {
            Some(end) if end < self.at => Deadline {
                at: end,
                by: Bound::StopBudget,
            },
            _ => self,
        }
    }
}

impl Hook {
    /// The hook of a boot: `config`'s command, as the agent user, supervised
    /// as a turn's agent is (`supervision`, without a time cap: the hook's
    /// bound is its own).
    pub fn new(
        config: OnStopConfig,
        boot: &super::config::BootConfig,
        supervision: Supervision,
    ) -> Hook {
        Hook {
            config,
            root: boot.root.clone(),
            user: boot.agent_user.clone(),
            base_env: boot.base_env.clone(),
            session_id: boot.api.session_id.clone(),
            bundle: None,
            supervision,
            stop_budget: boot.timings.stop_budget,
        }
    }

    /// The env bundle is applied: its connectors go to the hook too.
    pub fn with_bundle(&mut self, bundle: &AppliedBundle) {
        self.bundle = Some(bundle.clone());
    }

    /// Runs the hook for `ending`, unless a second stop signal came or the
    /// stop budget is spent; returns how it ran, as the status file records
    /// it. A graceful stop (before or during it) bounds it by what the stop
    /// budget leaves; a second one kills its tree at once.
    pub async fn run(
        &self,
        ending: BootEnding,
        stop: &mut watch::Receiver<Stop>,
        redactor: &Redactor,
    ) -> OnStop {
        let skipped = |why: &str| {
            tracing::warn!(
                ending = ending.as_str(),
                "the on-stop hook is skipped: {why}"
            );
            OnStop {
                ending: ending.as_str().to_string(),
                result: format!("skipped: {why}"),
                exit_code: None,
                signal: None,
                timed_out: false,
                duration_ms: 0,
            }
        };
        if matches!(*stop.borrow_and_update(), Stop::Immediate(_)) {
            return skipped("a second stop signal came before it started");
        }
        let stop_end = crate::signals::budget_deadline(self.stop_budget);
        let now = Instant::now();
        let deadline = Deadline::new(now, self.config.timeout, stop_end);
        if deadline.at <= now {
            return skipped("the stop budget was spent before it could start");
        }
        let cwd = self.cwd();
        tracing::info!(
            ending = ending.as_str(),
            cwd = %cwd.display(),
            bound_ms = millis(deadline.at - now),
            "the on-stop hook starts"
        );
        let started = std::time::Instant::now();
        let ran = self.supervise(ending, cwd, deadline, stop, redactor).await;
        let record = record(ending, &ran, started.elapsed(), self.config.timeout);
        if record.exit_code == Some(0) {
            tracing::info!(
                ending = ending.as_str(),
                duration_ms = record.duration_ms,
                "the on-stop hook {}",
                record.result
            );
        } else {
            tracing::warn!(
                ending = ending.as_str(),
                duration_ms = record.duration_ms,
                exit_code = record.exit_code,
                signal = record.signal.as_deref(),
                timed_out = record.timed_out,
                "the on-stop hook {}",
                record.result
            );
        }
        record
    }

    /// `repo/` when it exists, else the root.
    fn cwd(&self) -> PathBuf {
        cwd_for(&self.root)
    }

    /// Starts the hook and supervises it to the end of its tree: killed at
    /// `deadline` (brought forward by a graceful stop that comes meanwhile)
    /// or at once on a second stop signal.
    async fn supervise(
        &self,
        ending: BootEnding,
        cwd: PathBuf,
        mut deadline: Deadline,
        stop: &mut watch::Receiver<Stop>,
        redactor: &Redactor,
    ) -> Ran {
        let spec = SpawnSpec {
            program: "/bin/sh".to_string(),
            args: vec!["-c".to_string(), self.config.script.clone()],
            cwd,
            env: self.env(ending),
            stdin: Vec::new(),
            stdin_feed: None,
            user: self.user.clone(),
        };
        let logged = Arc::new(AtomicUsize::new(0));
        let (redactor, count) = (redactor.clone(), logged.clone());
        let output = move |stream: Stream| {
            let count = count.clone();
            LineSink::new(stream, &redactor, move |stream, line: Line| {
                log_line(&count, stream, &line);
            })
        };
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let supervised = supervisor::run(spec, control_rx, &self.supervision, output);
        tokio::pin!(supervised);
        let mut killed_by: Option<Killer> = None;
        let mut stop_open = true;
        let result = loop {
            let bound = tokio::time::sleep_until(deadline.at);
            tokio::select! {
                r = &mut supervised => break r,
                () = bound, if killed_by.is_none() => {
                    killed_by = Some(Killer::Bound(deadline.by));
                    let _ = control_tx.send(Control::Kill);
                }
                changed = stop.changed(), if stop_open && killed_by.is_none() => {
                    if changed.is_err() {
                        stop_open = false;
                        continue;
                    }
                    match *stop.borrow_and_update() {
                        Stop::Graceful(_) => {
                            deadline = deadline.cut_at(crate::signals::budget_deadline(self.stop_budget));
                        }
                        Stop::Immediate(_) => {
                            killed_by = Some(Killer::SecondSignal);
                            let _ = control_tx.send(Control::Kill);
                        }
                        Stop::Running => {}
                    }
                }
            }
        };
        let lines = logged.load(Ordering::Relaxed);
        if lines > MAX_LOGGED_LINES {
            tracing::warn!(
                "the on-stop hook printed {} more lines than the {MAX_LOGGED_LINES} logged",
                lines - MAX_LOGGED_LINES
            );
        }
        Ran {
            result: result.map_err(|e| e.reason),
            killed_by,
        }
    }

    /// The hook's environment: the agent's without anything of a turn or
    /// of the coordinator's routes (PROTOCOL.md 4.7), with the agent
    /// user's `HOME`, `USER` and `LOGNAME` and [`ENDING_VAR`].
    fn env(&self, ending: BootEnding) -> Vec<(OsString, OsString)> {
        let mut env: std::collections::BTreeMap<OsString, OsString> =
            super::environment::on_stop_env(&self.base_env, self.bundle.as_ref(), &self.session_id)
                .into_iter()
                .collect();
        if let Some(user) = &self.user {
            env.insert("HOME".into(), user.home.clone().into_os_string());
            env.insert("USER".into(), user.name.clone().into());
            env.insert("LOGNAME".into(), user.name.clone().into());
        }
        env.insert(ENDING_VAR.into(), ending.as_str().into());
        env.into_iter().collect()
    }
}

/// Who killed the hook, when the runner did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Killer {
    /// Its bound.
    Bound(Bound),
    /// A second stop signal.
    SecondSignal,
}

/// How the supervised hook ended.
#[derive(Debug)]
struct Ran {
    /// Its exit, or why it could not be started.
    result: Result<Exit, String>,
    killed_by: Option<Killer>,
}

/// Logs one line of the hook's output (already redacted by the stream's
/// redactor; the log redacts it again), cut at [`MAX_LINE_CHARS`], while
/// `count` (the lines of both streams so far) is under [`MAX_LOGGED_LINES`].
fn log_line(count: &AtomicUsize, stream: Stream, line: &Line) {
    if count.fetch_add(1, Ordering::Relaxed) >= MAX_LOGGED_LINES {
        return;
    }
    let stream = match stream {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    };
    let text = crate::text::clip(&line.text(), MAX_LINE_CHARS);
    tracing::info!(stream, line = %text, "on-stop hook output");
}

/// The status file's record of a hook that ran.
fn record(ending: BootEnding, ran: &Ran, took: Duration, timeout: Duration) -> OnStop {
    use std::os::unix::process::ExitStatusExt;
    let mut record = OnStop {
        ending: ending.as_str().to_string(),
        result: String::new(),
        exit_code: None,
        signal: None,
        timed_out: false,
        duration_ms: millis(took),
    };
    let exit = match &ran.result {
        Ok(exit) => exit,
        Err(reason) => {
            record.result = format!("could not be started: {reason}");
            return record;
        }
    };
    let status = exit.status;
    record.exit_code = status.and_then(|s| s.code());
    record.signal = status
        .and_then(|s| s.signal())
        .map(crate::signals::signal_name);
    record.result = match ran.killed_by {
        Some(Killer::Bound(Bound::Timeout)) => {
            record.timed_out = true;
            format!(
                "was killed at --on-stop-timeout ({}) with every process it started",
                humantime::format_duration(Duration::from_millis(millis(timeout)))
            )
        }
        Some(Killer::Bound(Bound::StopBudget)) => {
            record.timed_out = true;
            "was killed at the end of the stop budget with every process it started".to_string()
        }
        Some(Killer::SecondSignal) => {
            "was killed by a second stop signal with every process it started".to_string()
        }
        None => match (record.exit_code, record.signal.as_deref()) {
            _ if exit.guard_died.is_some() => {
                "lost its turn guard and was killed with every process it started".to_string()
            }
            (Some(code), _) => format!("exited with code {code}"),
            (None, Some(signal)) => format!("was killed by {signal}"),
            (None, None) => "ended, but its exit status could not be read".to_string(),
        },
    };
    record
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Where the hook runs for `root`: `repo/` when it exists, else the root
/// (the boot ended before the clone).
fn cwd_for(root: &Path) -> PathBuf {
    let repo = root.join("repo");
    if repo.is_dir() {
        repo
    } else {
        root.to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_is_the_timeout_or_the_stop_budgets_end_whichever_comes_first() {
        let now = Instant::now();
        let timeout = Duration::from_secs(30);
        let own = Deadline::new(now, timeout, None);
        assert_eq!((own.at, own.by), (now + timeout, Bound::Timeout));
        let later = Deadline::new(now, timeout, Some(now + Duration::from_secs(60)));
        assert_eq!(later, own);
        let budget = Deadline::new(now, timeout, Some(now + Duration::from_secs(4)));
        assert_eq!(
            (budget.at, budget.by),
            (now + Duration::from_secs(4), Bound::StopBudget)
        );
        // A stop that comes while it runs brings the bound forward, never
        // back.
        assert_eq!(budget.cut_at(Some(now + Duration::from_secs(9))), budget);
        assert_eq!(
            own.cut_at(Some(now + Duration::from_secs(2))).by,
            Bound::StopBudget
        );
    }

    #[test]
    fn the_record_says_how_it_ended() {
        use std::os::unix::process::ExitStatusExt;
        let exit = |raw: i32| Exit {
            status: Some(std::process::ExitStatus::from_raw(raw)),
            signalled: false,
            killed: false,
            pgid: 1,
            timed_out: false,
            swept: 0,
            left_behind: Vec::new(),
            guard_died: None,
            usage: None,
        };
        let ran = |raw: i32, killed_by| Ran {
            result: Ok(exit(raw)),
            killed_by,
        };
        let took = Duration::from_millis(1500);
        let timeout = Duration::from_secs(30);
        let r = record(BootEnding::Complete, &ran(3 << 8, None), took, timeout);
        assert_eq!(
            (
                r.ending.as_str(),
                r.result.as_str(),
                r.exit_code,
                r.timed_out,
                r.duration_ms
            ),
            ("complete", "exited with code 3", Some(3), false, 1500)
        );
        let r = record(
            BootEnding::Idle,
            &ran(9, Some(Killer::Bound(Bound::Timeout))),
            took,
            timeout,
        );
        assert_eq!(r.signal.as_deref(), Some("SIGKILL"));
        assert!(r.timed_out);
        assert_eq!(
            r.result,
            "was killed at --on-stop-timeout (30s) with every process it started"
        );
        let r = record(
            BootEnding::Stopped,
            &ran(9, Some(Killer::Bound(Bound::StopBudget))),
            took,
            timeout,
        );
        assert!(r.timed_out && r.result.contains("stop budget"), "{r:?}");
        let r = record(
            BootEnding::Stopped,
            &ran(9, Some(Killer::SecondSignal)),
            took,
            timeout,
        );
        assert!(
            !r.timed_out && r.result.contains("second stop signal"),
            "{r:?}"
        );
        let r = record(BootEnding::Failed, &ran(15, None), took, timeout);
        assert_eq!(r.result, "was killed by SIGTERM");
        let failed = Ran {
            result: Err("No such file or directory (os error 2)".into()),
            killed_by: None,
        };
        let r = record(BootEnding::Retired, &failed, Duration::ZERO, timeout);
        assert_eq!(
            r.result,
            "could not be started: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn it_runs_in_repo_when_there_is_one_else_in_the_root() {
        let root = tempfile::tempdir().unwrap();
        assert_eq!(cwd_for(root.path()), root.path());
        std::fs::create_dir(root.path().join("repo")).unwrap();
        assert_eq!(cwd_for(root.path()), root.path().join("repo"));
    }
}
