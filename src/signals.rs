//! Stop signals (PROTOCOL.md 4.4): SIGTERM or SIGINT asks for a graceful
//! stop; a second one during the graceful stop asks for an immediate one.
//! Signals become values on a watch channel; nothing acts inside a handler.

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// The stop requested so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// No stop requested.
    Running,
    /// First SIGTERM/SIGINT: stop gracefully within the stop budget.
    Graceful(i32),
    /// Second signal: kill the agent's tree at once, only remove the files.
    Immediate(i32),
}

impl Stop {
    /// The signal number of a requested stop.
    pub fn signal(self) -> Option<i32> {
        match self {
            Stop::Running => None,
            Stop::Graceful(n) | Stop::Immediate(n) => Some(n),
        }
    }

    /// The exit code for a stop by signal N: 128+N (PROTOCOL.md 4.4).
    pub fn exit_code(self) -> Option<i32> {
        self.signal().map(|n| 128 + n)
    }
}

/// Starts listening for SIGTERM and SIGINT. SIGHUP is ignored (a container
/// has no controlling terminal to hang up).
///
/// Errors: the handlers cannot be installed (returned as text).
pub fn listen() -> Result<watch::Receiver<Stop>, String> {
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle SIGINT: {e}"))?;
    let mut hup = signal(SignalKind::hangup()).map_err(|e| format!("cannot handle SIGHUP: {e}"))?;
    let (tx, rx) = watch::channel(Stop::Running);
    tokio::spawn(async move {
        loop {
            let n = tokio::select! {
                _ = term.recv() => 15,
                _ = int.recv() => 2,
                _ = hup.recv() => {
                    tracing::info!("SIGHUP ignored");
                    continue;
                }
            };
            let next = match *tx.borrow() {
                Stop::Running => Stop::Graceful(n),
                Stop::Graceful(first) | Stop::Immediate(first) => Stop::Immediate(first),
            };
            match next {
                Stop::Graceful(_) => tracing::warn!(signal = n, "stop signal: stopping gracefully"),
                _ => tracing::warn!(signal = n, "second stop signal: stopping at once"),
            }
            tx.send_replace(next);
        }
    });
    Ok(rx)
}
