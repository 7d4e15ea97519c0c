//! `hosted-boot checkpoint`: sends the running runner of a root a
//! checkpoint notice (SIGUSR1, PROTOCOL.md 4.5 "Checkpoint") and waits for
//! its answer in the status file, for a platform's preemption hook (a
//! Kubernetes `preStop`, a spot instance's notice).

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use clap::Args;

use crate::status::{self, CheckpointStatus, Phase};

/// `hosted-boot checkpoint`.
#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// The runner's root [default: the working directory].
    #[arg(long, env = "HOSTED_BOOT_ROOT", hide_env_values = true)]
    pub root: Option<std::path::PathBuf>,
    /// How long to wait for the checkpoint's end: past it, exit 1 (the
    /// checkpoint goes on).
    #[arg(long, default_value = "3m", value_parser = crate::timings::parse_duration)]
    pub timeout: Duration,
    /// Send the notice and exit 0 at once.
    #[arg(long)]
    pub no_wait: bool,
}

/// How often the status file is read while waiting.
const POLL: Duration = Duration::from_millis(100);

/// Sends the notice and waits; returns the exit code: 0 when the work is
/// safe (pushed, on the remote already, harvested, or nothing to save), 1
/// when it is not (the checkpoint failed or saved only part of it), the
/// wait timed out, or no runner runs at `root`.
pub fn run(root: &Path, timeout: Duration, wait: bool) -> i32 {
    let status = match status::read(root) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "hosted-boot checkpoint: cannot read {} ({e}); is the runner started with this root (--root, HOSTED_BOOT_ROOT)?",
                status::path(root).display()
            );
            return 1;
        }
    };
    if status.phase == Phase::Exited || !status::process_exists(status.pid) {
        eprintln!(
            "hosted-boot checkpoint: the runner (pid {}) is not running (phase {}); nothing to checkpoint",
            status.pid,
            status.phase.as_str()
        );
        return 1;
    }
    // A stale file may name a pid another process has now: signalled, it
    // would die (SIGUSR1's default action).
    if let Err(why) = is_the_runner(&status) {
        eprintln!("hosted-boot checkpoint: {why}; no notice sent");
        return 1;
    }
    let sent_at = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
    let pid = i32::try_from(status.pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    let sent = pid.map(|p| rustix::process::kill_process(p, rustix::process::Signal::USR1));
    match sent {
        Some(Ok(())) => {}
        Some(Err(e)) => {
            eprintln!(
                "hosted-boot checkpoint: cannot signal the runner (pid {}): {e}; run this as the runner's user",
                status.pid
            );
            return 1;
        }
        None => {
            eprintln!(
                "hosted-boot checkpoint: the status file names no valid pid ({})",
                status.pid
            );
            return 1;
        }
    }
    if !wait {
        println!("checkpoint notice sent to pid {}", status.pid);
        return 0;
    }
    let deadline = Instant::now() + timeout;
    loop {
        std::thread::sleep(POLL);
        let now = status::read(root).ok();
        if let Some(c) = now.as_ref().and_then(|s| answer(s, &sent_at)) {
            println!("checkpoint: {}", c.describe());
            return match c.outcome.as_str() {
                "failed" | "partial" | "turn_ended" => 1,
                _ => 0,
            };
        }
        if now.is_some_and(|s| s.phase == Phase::Exited) {
            eprintln!("hosted-boot checkpoint: the runner exited before it answered");
            return 1;
        }
        if Instant::now() >= deadline {
            eprintln!(
                "hosted-boot checkpoint: no answer within {}; the checkpoint may still be running (hosted-boot status shows it)",
                humantime::format_duration(timeout)
            );
            return 1;
        }
    }
}

/// Whether the status file's pid is its runner: the file is fresh (the
/// runner rewrites it at least every 30 s) and the process is a
/// `hosted-boot` (`/proc/<pid>/comm`, readable whoever owns it).
fn is_the_runner(status: &status::Status) -> Result<(), String> {
    let age = humantime::parse_rfc3339(&status.updated_at)
        .ok()
        .and_then(|at| SystemTime::now().duration_since(at).ok())
        .unwrap_or_default();
    if age > status::STALE_AFTER {
        return Err(format!(
            "the status file was last written {} ago: its runner (pid {}) is stuck or gone, and the pid may be another process's",
            status::format_age(age),
            status.pid
        ));
    }
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", status.pid)).unwrap_or_default();
    if comm.trim_end() != "hosted-boot" {
        return Err(format!(
            "pid {} is {:?}, not a hosted-boot runner",
            status.pid,
            comm.trim_end()
        ));
    }
    Ok(())
}

/// The finished answer to a notice sent at `sent_at`, if the status holds
/// one (an answer starts after the notice it answers).
fn answer<'a>(s: &'a status::Status, sent_at: &str) -> Option<&'a CheckpointStatus> {
    s.last_checkpoint
        .as_ref()
        .filter(|c| c.started_at.as_str() >= sent_at && c.finished_at.is_some())
}
