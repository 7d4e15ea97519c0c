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

    /// The requested stop's signal by name (`SIGTERM`), `none` when running.
    pub fn signal_name(self) -> String {
        self.signal()
            .map_or_else(|| "none".to_string(), signal_name)
    }
}

pub use crate::text::signal_name;

/// A signal whose handler could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("cannot handle {signal}: {error}")]
pub struct ListenError {
    /// The signal's name.
    pub signal: &'static str,
    /// tokio's error.
    pub error: std::io::Error,
}

/// Starts listening for SIGTERM and SIGINT. SIGHUP is ignored (a container
/// has no controlling terminal to hang up).
///
/// Errors: a handler cannot be installed.
pub fn listen() -> Result<watch::Receiver<Stop>, ListenError> {
    let handler = |kind: SignalKind, name: &'static str| {
        signal(kind).map_err(|error| ListenError {
            signal: name,
            error,
        })
    };
    let mut term = handler(SignalKind::terminate(), "SIGTERM")?;
    let mut int = handler(SignalKind::interrupt(), "SIGINT")?;
    let mut hup = handler(SignalKind::hangup(), "SIGHUP")?;
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
                Stop::Graceful(_) => {
                    let _ = FIRST_STOP.set(tokio::time::Instant::now());
                    tracing::warn!(signal = %signal_name(n), "stop signal: stopping gracefully")
                }
                _ => {
                    tracing::warn!(signal = %signal_name(n), "second stop signal: stopping at once")
                }
            }
            tx.send_replace(next);
        }
    });
    Ok(rx)
}

/// When the first stop signal came, on tokio's clock (set by [`listen`]
/// before it publishes the stop): the stop budget counts from it.
static FIRST_STOP: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();

/// When a graceful stop's `budget` runs out: the first stop signal's time
/// plus `budget` (PROTOCOL.md 4.4); `None` before any stop signal came.
pub fn budget_deadline(budget: std::time::Duration) -> Option<tokio::time::Instant> {
    // A budget no clock can add (`--stop-budget` takes any duration) is as
    // good as none: a century.
    const CENTURY: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 86_400);
    FIRST_STOP.get().map(|at| {
        at.checked_add(budget.min(CENTURY))
            .unwrap_or_else(|| *at + CENTURY)
    })
}

/// Starts listening for checkpoint notices (PROTOCOL.md 4.5,
/// "Checkpoint"): SIGUSR1, or SIGUSR2 (an alias, as some platforms send
/// it). The value counts the notices so far; nothing acts here.
///
/// Errors: a handler cannot be installed.
pub fn listen_checkpoints() -> Result<watch::Receiver<u64>, ListenError> {
    let handler = |kind: SignalKind, name: &'static str| {
        signal(kind).map_err(|error| ListenError {
            signal: name,
            error,
        })
    };
    let mut usr1 = handler(SignalKind::user_defined1(), "SIGUSR1")?;
    let mut usr2 = handler(SignalKind::user_defined2(), "SIGUSR2")?;
    let (tx, rx) = watch::channel(0u64);
    tokio::spawn(async move {
        loop {
            let n = tokio::select! {
                _ = usr1.recv() => libc::SIGUSR1,
                _ = usr2.recv() => libc::SIGUSR2,
            };
            tracing::info!(signal = %signal_name(n), "checkpoint notice");
            tx.send_modify(|count| *count += 1);
        }
    });
    Ok(rx)
}

/// Awaits `fut` unless a stop (graceful or immediate, PROTOCOL.md 4.4) is
/// requested first, or was before the call: then `Err` with that stop, and
/// `fut` is dropped. Once no more signals can come (the listener is gone),
/// `fut` is awaited to its end.
pub async fn unless_stopped<T>(
    stop: &mut watch::Receiver<Stop>,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, Stop> {
    if *stop.borrow() != Stop::Running {
        return Err(*stop.borrow());
    }
    tokio::pin!(fut);
    loop {
        tokio::select! {
            r = &mut fut => return Ok(r),
            changed = stop.changed() => {
                if changed.is_err() {
                    return Ok(fut.await);
                }
                let now = *stop.borrow();
                if now != Stop::Running {
                    return Err(now);
                }
            }
        }
    }
}

/// Work under the stop rules of PROTOCOL.md 4.4: once a graceful stop is
/// requested, what is left must finish within the stop budget counted from
/// the signal; an immediate stop abandons it at once.
pub struct StopBudget {
    rx: watch::Receiver<Stop>,
    budget: std::time::Duration,
    deadline: Option<tokio::time::Instant>,
}

impl StopBudget {
    /// Watches `rx` (a clone: the caller's receiver is not consumed);
    /// `budget` is `--stop-budget`.
    pub fn new(rx: watch::Receiver<Stop>, budget: std::time::Duration) -> Self {
        let mut this = StopBudget {
            rx,
            budget,
            deadline: None,
        };
        this.observe();
        this
    }

    fn observe(&mut self) {
        if *self.rx.borrow() != Stop::Running && self.deadline.is_none() {
            self.deadline = Some(tokio::time::Instant::now() + self.budget);
        }
    }

    /// The stop requested so far.
    pub fn current(&self) -> Stop {
        *self.rx.borrow()
    }

    /// Whether any stop was requested.
    pub fn stopping(&self) -> bool {
        self.current() != Stop::Running
    }

    /// Awaits `fut` unless a stop comes first (`None`; the stop budget
    /// starts then), as [`unless_stopped`] does.
    pub async fn unless_stopped<T>(
        &mut self,
        fut: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let done = unless_stopped(&mut self.rx, fut).await;
        self.observe();
        done.ok()
    }

    /// Awaits `fut`; after a graceful stop only until the stop budget runs
    /// out, and not at all after an immediate stop (`None` in both cases).
    pub async fn bounded<T>(&mut self, fut: impl std::future::Future<Output = T>) -> Option<T> {
        self.observe();
        tokio::pin!(fut);
        loop {
            if matches!(self.current(), Stop::Immediate(_)) {
                return None;
            }
            let deadline = crate::concurrency::sleep_until(self.deadline);
            tokio::select! {
                r = &mut fut => return Some(r),
                _ = deadline => {
                    tracing::warn!("the stop budget ran out; skipping what is left");
                    return None;
                }
                changed = self.rx.changed() => {
                    if changed.is_err() {
                        return Some(fut.await);
                    }
                    self.observe();
                }
            }
        }
    }
}
