//! The turn supervisor: runs the agent as the leader of its own process
//! group, interrupts it (SIGINT to the group, SIGKILL after the grace
//! period), and ends the turn when the leader exits, not when its pipes
//! close: a grandchild may hold them open forever.
//!
//! The leader is waited for with `waitid(WNOWAIT)`, so it stays a zombie
//! (and its process group id stays reserved) until the group has been
//! signalled: a group id cannot be reused under our feet.
//!
//! Later (the supervisor issue): the descendant sweep for processes that
//! left the group (`setsid`), the per-turn time cap, the PID 1 split.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::output::{OutputSink, pump};

/// What to start.
#[derive(Clone, Debug)]
pub struct SpawnSpec {
    /// The program.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Working directory (`repo/`).
    pub cwd: PathBuf,
    /// The whole environment (nothing is inherited).
    pub env: Vec<(OsString, OsString)>,
    /// Written to stdin, then stdin is closed.
    pub stdin: Vec<u8>,
}

/// Why the agent could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the agent program {program:?}: {reason}")]
pub struct SpawnError {
    /// The program name as configured.
    pub program: String,
    /// The OS error, e.g. "No such file or directory (os error 2)".
    pub reason: String,
}

/// A request to the running supervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// SIGINT to the group now, SIGKILL after `grace`.
    Interrupt {
        /// SIGINT → SIGKILL.
        grace: Duration,
    },
    /// SIGKILL to the group now.
    Kill,
}

/// Which stream a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The agent's stdout.
    Stdout,
    /// The agent's stderr.
    Stderr,
}

/// How the agent process ended.
#[derive(Clone, Copy, Debug)]
pub struct Exit {
    /// The leader's status (`None` if it could not be collected).
    pub status: Option<ExitStatus>,
    /// Whether the runner signalled the group (an interrupt or a kill).
    pub signalled: bool,
    /// The process group id the turn used.
    pub pgid: i32,
}

/// Starts the agent, pumps each output stream into the sink `output` makes
/// for it, obeys `control` until the leader exits, kills what is left of the
/// group, drains the pipes for at most `drain`, and returns how it ended.
///
/// Errors: the program could not be started (not found, not executable,
/// bad working directory): nothing was started.
pub async fn run<F, S>(
    spec: SpawnSpec,
    mut control: mpsc::UnboundedReceiver<Control>,
    drain: Duration,
    output: F,
) -> Result<Exit, SpawnError>
where
    F: Fn(Stream) -> S,
    S: OutputSink,
{
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .current_dir(&spec.cwd)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|e| SpawnError {
        program: spec.program.clone(),
        reason: e.to_string(),
    })?;
    let pid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
    tracing::info!(pgid = pid, program = %spec.program, "agent started in its own process group");

    let mut readers = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        readers.push(tokio::spawn(pump(stdout, output(Stream::Stdout))));
    }
    if let Some(stderr) = child.stderr.take() {
        readers.push(tokio::spawn(pump(stderr, output(Stream::Stderr))));
    }
    if let Some(mut stdin) = child.stdin.take() {
        let input = spec.stdin;
        // A separate task: an agent that never reads stdin must not block us.
        tokio::spawn(async move {
            let _ = stdin.write_all(&input).await;
            let _ = stdin.shutdown().await;
        });
    }

    // Wait for the leader's exit without reaping it.
    let exited = tokio::task::spawn_blocking(move || wait_without_reaping(pid));
    tokio::pin!(exited);
    let mut signalled = false;
    let mut kill_at: Option<Instant> = None;
    loop {
        let kill_sleep = async {
            match kill_at {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut exited => break,
            msg = control.recv() => match msg {
                Some(Control::Interrupt { grace }) => {
                    signalled = true;
                    signal_group(pid, Signal::INT);
                    let at = Instant::now() + grace;
                    kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                }
                Some(Control::Kill) => {
                    signalled = true;
                    signal_group(pid, Signal::KILL);
                }
                None => {
                    // The turn is gone: nobody can interrupt any more; keep waiting.
                    std::future::pending::<()>().await;
                }
            },
            _ = kill_sleep => {
                tracing::warn!(pgid = pid, "agent still running after the grace period; SIGKILL to its process group");
                signal_group(pid, Signal::KILL);
                kill_at = None;
            }
        }
    }
    // The leader is a zombie: its group id is still ours. Kill the rest.
    if group_alive(pid) {
        tracing::info!(
            pgid = pid,
            "agent exited; killing what remains of its process group"
        );
        signal_group(pid, Signal::KILL);
    }
    let status = child.wait().await.ok();

    // Drain what the pipes hold, bounded: a grandchild may keep them open.
    let drain_deadline = Instant::now() + drain;
    for reader in readers.iter_mut() {
        if tokio::time::timeout_at(drain_deadline, &mut *reader)
            .await
            .is_err()
        {
            reader.abort();
            tracing::warn!(
                pgid = pid,
                "agent output still open after the drain bound; closed"
            );
        }
    }
    wait_group_gone(pid, Duration::from_secs(2)).await;
    Ok(Exit {
        status,
        signalled,
        pgid: pid,
    })
}

fn wait_without_reaping(pid: i32) {
    let Some(pid) = Pid::from_raw(pid) else {
        return;
    };
    loop {
        match rustix::process::waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            _ => return,
        }
    }
}

fn signal_group(pgid: i32, signal: Signal) {
    if let Some(pid) = Pid::from_raw(pgid) {
        match rustix::process::kill_process_group(pid, signal) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => {}
            Err(e) => tracing::warn!(pgid, error = %e, "cannot signal the agent's process group"),
        }
    }
}

/// Whether any process of group `pgid` exists (zombies included).
pub fn group_alive(pgid: i32) -> bool {
    Pid::from_raw(pgid).is_some_and(|p| rustix::process::test_kill_process_group(p).is_ok())
}

async fn wait_group_gone(pgid: i32, bound: Duration) {
    let deadline = Instant::now() + bound;
    while group_alive(pgid) {
        if Instant::now() >= deadline {
            tracing::warn!(
                pgid,
                "the agent's process group is not empty after SIGKILL (zombies not yet reaped?)"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
