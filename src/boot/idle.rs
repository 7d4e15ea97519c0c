//! Choosing the next turn (PROTOCOL.md 2.4) and waiting for it between turns
//! (4.2): read the session every 5 s, doubling the wait after a failed read
//! (up to 45 s). Before the first turn ten consecutive failed reads are
//! fatal; after it, failed reads never are. A session answer over the
//! session read's size cap is fatal at once (`session_too_large`): it is the
//! same on every read. No bearer file exists here. With a coordinator that
//! offers the long-poll of PROTOCOL.md 2.4 each read is held until the
//! session changes and the next starts at once; a stop ends a held read.

use std::collections::HashSet;

use tokio::sync::watch;

use crate::client::{Api, CallError, LongPoll, Policy};
use crate::signals::{self, Stop};
use crate::turn::TurnInput;
use crate::validate;
use crate::wire::{ErrorCode, Session};

/// Why the runner leaves its sandbox without a stop or the session's end
/// (PROTOCOL.md 4.2, "Leaving the sandbox").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leave {
    /// No turn for `--release-idle-after` (with the coordinator's
    /// `acceptsReleased`).
    Idle,
    /// `--max-lifetime` or `--retire-at` passed.
    Retired,
}

impl Leave {
    /// As the log and the exit reason say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Leave::Idle => "idle",
            Leave::Retired => "retired",
        }
    }
}

/// When the wait ends with no turn, and why: the earlier of the idle
/// release (from the wait's start) and the retirement.
#[derive(Clone, Copy, Debug)]
pub struct LeaveAt {
    /// The idle release's bound, when it applies.
    pub idle_after: Option<std::time::Duration>,
    /// The retirement, when set.
    pub retire_at: Option<std::time::Instant>,
    /// The coordinator takes `released` (the session's `acceptsReleased`).
    pub accepts_released: bool,
}

impl LeaveAt {
    /// The deadline of a wait that starts now, and why.
    fn deadline(self) -> Option<(tokio::time::Instant, Leave)> {
        let now = std::time::Instant::now();
        // A bound too far for the clock is never.
        let idle = self
            .idle_after
            .and_then(|d| now.checked_add(d))
            .map(|at| (at, Leave::Idle));
        let retired = self.retire_at.map(|at| (at, Leave::Retired));
        let first = match (idle, retired) {
            (Some(i), Some(r)) if r.0 <= i.0 => Some(r),
            (Some(i), _) => Some(i),
            (None, r) => r,
        };
        first.map(|(at, why)| (tokio::time::Instant::from_std(at), why))
    }

    /// Whether the retirement has passed.
    pub fn retired(self) -> bool {
        self.retire_at
            .is_some_and(|at| at <= std::time::Instant::now())
    }
}

/// Consecutive failed reads that are fatal before the first turn.
pub const BOOT_MAX_FAILED_READS: u32 = 10;

/// A session answer over the session read's cap (`session_too_large`,
/// PROTOCOL.md 2.2 and 4.2): the message gives the size, the cap and what to
/// do.
#[derive(Debug, thiserror::Error)]
#[error(
    "the session answer is {}, over the session read's cap of {cap} bytes ({} MiB), so the turn it carries can be neither run nor sealed; a prompt (pendingTurn.body or clientInfo.task) is too large: shorten it (put long logs in a file of the repository) and queue it again",
    if *size_exact { format!("{size} bytes") } else { format!("more than {size} bytes") },
    cap / (1024 * 1024)
)]
pub struct SessionTooLarge {
    /// The answer's size in bytes (its `Content-Length`, or what had
    /// arrived when the cap was passed).
    pub size: u64,
    /// Whether `size` is the whole answer's.
    pub size_exact: bool,
    /// The session read's cap in bytes.
    pub cap: usize,
}

impl SessionTooLarge {
    /// The PROTOCOL.md 2.2 code.
    pub const CODE: ErrorCode = ErrorCode::SessionTooLarge;

    /// The refusal a session read's error `e` is, if it is one.
    pub fn from_call(e: &CallError) -> Option<SessionTooLarge> {
        match e {
            CallError::TooLarge {
                size,
                size_exact,
                cap,
                ..
            } => Some(SessionTooLarge {
                size: *size,
                size_exact: *size_exact,
                cap: *cap,
            }),
            _ => None,
        }
    }
}

/// The reason a failed session read gives: `session_too_large: …` for an
/// answer over the cap ([`SessionTooLarge`]), or the error itself.
pub fn session_read_reason(e: &CallError) -> String {
    match SessionTooLarge::from_call(e) {
        Some(t) => SessionTooLarge::CODE.reason(t),
        None => e.to_string(),
    }
}

/// A session whose pending turn breaks the contract
/// (`hosted_pending_turn_invalid`, PROTOCOL.md 2.4): what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InvalidTurn(pub String);

impl InvalidTurn {
    /// The PROTOCOL.md 2.2 code.
    pub const CODE: ErrorCode = ErrorCode::HostedPendingTurnInvalid;
}

fn is_open(status: &str) -> bool {
    status == "pending" || status == "running"
}

/// The prompt of a pending turn: its body, or the answer prompt of 4.3.
pub fn prompt_of(turn: &crate::wire::PendingTurn) -> String {
    match &turn.answer_to_question {
        Some(q) => format!(
            "The user answered your earlier question.\n\nQuestion: {}\n\nAnswer: {}",
            q.question, turn.body
        ),
        None => turn.body.clone(),
    }
}

/// Selects the turn to run (2.4). At boot, the oldest run with the initial
/// task is a candidate too; between turns only `pendingTurn` starts a turn.
/// Runs in `done` (already run by this boot) are never started again.
///
/// Errors: a `pendingTurn` of the wrong shape or with an unsafe run id, or
/// (at boot) an oldest run with an unsafe id.
pub fn select_turn(
    session: &Session,
    at_boot: bool,
    done: &HashSet<String>,
) -> Result<Option<TurnInput>, InvalidTurn> {
    let pending = session
        .pending_turn()
        .map_err(|e| InvalidTurn(e.to_string()))?;
    if let Some(turn) = pending {
        validate::path_safe_id("pendingTurn.runId", &turn.run_id)
            .map_err(|e| InvalidTurn(e.to_string()))?;
        if turn.ordinal < 1 {
            return Err(InvalidTurn(format!(
                "pendingTurn.ordinal {} is below 1",
                turn.ordinal
            )));
        }
        let open = session.run_status(&turn.run_id).is_none_or(is_open);
        if open && !done.contains(&turn.run_id) {
            return Ok(Some(TurnInput {
                run_id: turn.run_id.clone(),
                prompt: prompt_of(&turn),
                ordinal: Some(turn.ordinal),
                trace: turn
                    .traceparent
                    .clone()
                    .map(|parent| (parent, turn.tracestate.clone())),
            }));
        }
    }
    if at_boot && let Some(oldest) = session.runs.last() {
        validate::path_safe_id("run id", &oldest.id).map_err(|e| InvalidTurn(e.to_string()))?;
        if is_open(&oldest.status) && !done.contains(&oldest.id) {
            return Ok(Some(TurnInput {
                run_id: oldest.id.clone(),
                prompt: session.client_info.task.clone(),
                ordinal: Some(1),
                trace: None,
            }));
        }
    }
    Ok(None)
}

/// How a wait between turns ended.
#[derive(Debug)]
pub enum IdleEnd {
    /// A turn to run.
    Turn(TurnInput),
    /// The session is no longer `active`.
    Ended,
    /// A stop signal came (4.4).
    Stopped(Stop),
    /// No turn before the wait's deadline (4.2, "Leaving the sandbox").
    Leave(Leave),
}

/// Why the wait failed (fatal).
#[derive(Debug, thiserror::Error)]
pub enum IdleError {
    /// The boot secret was refused ([`CallError::BootSecretRefused`]).
    #[error("the boot secret was refused while waiting for a turn: {0}")]
    BootSecretRefused(CallError),
    /// The session answer is over the session read's cap.
    #[error(transparent)]
    SessionTooLarge(#[from] SessionTooLarge),
    /// Ten consecutive failed reads before the first turn.
    #[error(
        "{BOOT_MAX_FAILED_READS} consecutive session reads failed before the first turn; last: {0}"
    )]
    TooManyFailures(String),
}

impl IdleError {
    /// The PROTOCOL.md 2.2 code a `failed` reason for it starts with, if
    /// it has one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            IdleError::SessionTooLarge(_) => Some(SessionTooLarge::CODE),
            IdleError::BootSecretRefused(_) | IdleError::TooManyFailures(_) => None,
        }
    }
}

/// Between turns, right after a turn was sealed and acknowledged (4.2): the
/// session is read at once, so a turn queued while the last one ran starts
/// within one round trip of `turn_completed`; only when that read finds no
/// turn (or fails) does the wait of [`wait`] begin. The idle backoff applies
/// to waiting, not to draining a queue.
///
/// Errors: see [`IdleError`].
pub async fn after_turn(
    api: &Api,
    done: &HashSet<String>,
    stop: &mut watch::Receiver<Stop>,
    leave: LeaveAt,
) -> Result<IdleEnd, IdleError> {
    let timings = *api.timings();
    let deadline = leave.deadline();
    // No entity tag yet: a long-poll coordinator answers this read at once.
    let mut poll = LongPoll::new();
    let delay = match signals::unless_stopped(stop, read(api, false, done, &mut poll)).await {
        Err(s) => return Ok(IdleEnd::Stopped(s)),
        // An ended session ends as it does; a turn is left to the next
        // sandbox once the runner retires.
        Ok(Ok(Some(IdleEnd::Turn(_)))) if leave.retired() => {
            return Ok(IdleEnd::Leave(Leave::Retired));
        }
        Ok(Ok(Some(end))) => return Ok(end),
        Ok(Ok(None) | Err(ReadError::Failed(_))) if leave.retired() => {
            return Ok(IdleEnd::Leave(Leave::Retired));
        }
        Ok(Ok(None)) => poll.delay(timings.idle_poll, &timings),
        Ok(Err(ReadError::Fatal(e))) => return Err(e),
        Ok(Err(ReadError::Failed(why))) => {
            tracing::warn!(error = %why, "session read after the turn failed; waiting for a turn");
            timings.idle_poll
        }
    };
    wait_from(api, false, done, stop, poll, delay, deadline).await
}

/// Waits for the next turn (4.2). `at_boot` applies the boot's stricter rule
/// and its turn selection.
///
/// Errors: see [`IdleError`].
pub async fn wait(
    api: &Api,
    at_boot: bool,
    done: &HashSet<String>,
    stop: &mut watch::Receiver<Stop>,
    leave: LeaveAt,
) -> Result<IdleEnd, IdleError> {
    if leave.retired() {
        return Ok(IdleEnd::Leave(Leave::Retired));
    }
    let idle_poll = api.timings().idle_poll;
    let deadline = leave.deadline();
    wait_from(
        api,
        at_boot,
        done,
        stop,
        LongPoll::new(),
        idle_poll,
        deadline,
    )
    .await
}

/// [`wait`] from a long-poll state already begun, its first read after
/// `delay`; at `deadline` (a held read is cut), one last read that is not
/// held: a turn it finds still runs unless the runner retires.
async fn wait_from(
    api: &Api,
    at_boot: bool,
    done: &HashSet<String>,
    stop: &mut watch::Receiver<Stop>,
    mut poll: LongPoll,
    mut delay: std::time::Duration,
    deadline: Option<(tokio::time::Instant, Leave)>,
) -> Result<IdleEnd, IdleError> {
    let timings = *api.timings();
    let mut failures = 0u32;
    let passed = || deadline.filter(|(at, _)| tokio::time::Instant::now() >= *at);
    loop {
        let sleep = tokio::time::sleep(delay);
        let until_deadline = crate::concurrency::sleep_until(deadline.map(|(at, _)| at));
        let slept = async {
            tokio::select! {
                () = sleep => {}
                _ = until_deadline => {}
            }
        };
        if let Err(s) = signals::unless_stopped(stop, slept).await {
            return Ok(IdleEnd::Stopped(s));
        }
        if let Some((_, why)) = passed() {
            return last_read(api, at_boot, done, stop, why).await;
        }
        let held = async {
            let until_deadline = crate::concurrency::sleep_until(deadline.map(|(at, _)| at));
            tokio::select! {
                read = read(api, at_boot, done, &mut poll) => Some(read),
                _ = until_deadline => None,
            }
        };
        let read = match signals::unless_stopped(stop, held).await {
            Ok(Some(read)) => read,
            Ok(None) => {
                let why = deadline.map_or(Leave::Idle, |(_, why)| why);
                return last_read(api, at_boot, done, stop, why).await;
            }
            Err(s) => return Ok(IdleEnd::Stopped(s)),
        };
        match read {
            Ok(Some(end)) => return Ok(end),
            Ok(None) => {
                failures = 0;
                delay = poll.delay(timings.idle_poll, &timings);
            }
            Err(ReadError::Fatal(e)) => return Err(e),
            Err(ReadError::Failed(why)) => {
                failures += 1;
                tracing::warn!(failures, error = %why, "session read failed while waiting for a turn");
                if at_boot && failures >= BOOT_MAX_FAILED_READS {
                    return Err(IdleError::TooManyFailures(why));
                }
                // From the tick, never from a held read's (near-zero) gap:
                // a failing coordinator is backed off, not hammered.
                delay = (delay.max(timings.idle_poll) * 2).min(timings.idle_backoff_cap);
            }
        }
    }
}

/// At the wait's deadline: leaves for `why`, unless a read that is not
/// held finds a turn and the runner is not retiring (an idle release never
/// strands a turn queued at its last moment), or the session ended.
async fn last_read(
    api: &Api,
    at_boot: bool,
    done: &HashSet<String>,
    stop: &mut watch::Receiver<Stop>,
    why: Leave,
) -> Result<IdleEnd, IdleError> {
    if why == Leave::Retired {
        return Ok(IdleEnd::Leave(why));
    }
    let mut fresh = LongPoll::new();
    match signals::unless_stopped(stop, read(api, at_boot, done, &mut fresh)).await {
        Err(s) => Ok(IdleEnd::Stopped(s)),
        Ok(Ok(Some(end))) => Ok(end),
        Ok(Err(ReadError::Fatal(e))) => Err(e),
        Ok(Ok(None) | Err(ReadError::Failed(_))) => Ok(IdleEnd::Leave(why)),
    }
}

enum ReadError {
    Fatal(IdleError),
    Failed(String),
}

async fn read(
    api: &Api,
    at_boot: bool,
    done: &HashSet<String>,
    poll: &mut LongPoll,
) -> Result<Option<IdleEnd>, ReadError> {
    let timings = api.timings();
    let pulled = match api.bearer() {
        // A pause and restore (PROTOCOL.md 2.1, "Clocks"): logged and pulled.
        Some(b) if b.clock_jumped() => Some(api.usable_bearer().await.map(|_| ())),
        Some(b) if !b.expires_within(timings.idle_refresh_lead) => None,
        _ => Some(
            api.pull_bearer(Policy::AGENT_TOKEN_REFRESH)
                .await
                .map(|_| ()),
        ),
    };
    if let Some(pulled) = pulled {
        match pulled {
            Ok(_) => {}
            Err(e) if e.is_boot_secret_refused() => {
                return Err(ReadError::Fatal(IdleError::BootSecretRefused(e)));
            }
            Err(e) => return Err(ReadError::Failed(e.to_string())),
        }
    }
    let session = match api.session_poll(poll, None).await {
        // Unchanged: the last answer had no turn to start.
        Ok(None) => return Ok(None),
        Ok(Some(s)) => s,
        // A 401 on the session read pulls a fresh bearer once (the client's
        // expired-bearer rule); that pull refused means the boot secret is
        // no longer valid.
        Err(e) if e.is_boot_secret_refused() => {
            return Err(ReadError::Fatal(IdleError::BootSecretRefused(e)));
        }
        Err(e) => {
            return Err(match SessionTooLarge::from_call(&e) {
                Some(t) => ReadError::Fatal(t.into()),
                None => ReadError::Failed(e.to_string()),
            });
        }
    };
    if !session.is_active() {
        return Ok(Some(IdleEnd::Ended));
    }
    match select_turn(&session, at_boot, done) {
        Ok(Some(turn)) => Ok(Some(IdleEnd::Turn(turn))),
        Ok(None) => Ok(None),
        Err(e) => Err(ReadError::Failed(InvalidTurn::CODE.reason(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn session(v: serde_json::Value) -> Session {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn boot_selection_follows_the_contract() {
        let none = HashSet::new();
        let s = session(
            json!({"workspaceId": "w", "repoBranch": "b", "clientInfo": {"task": "T"},
            "runs": [{"id": "run-2", "status": "pending"}, {"id": "run-1", "status": "pending"}],
            "pendingTurn": {"turnId": "t2", "ordinal": 2, "runId": "run-2", "body": "B", "clientMessageId": "m",
                "answerToQuestion": {"questionId": "q", "question": "Which?"}}}),
        );
        let t = select_turn(&s, true, &none).unwrap().unwrap();
        assert_eq!(t.run_id, "run-2");
        assert_eq!(
            t.prompt,
            "The user answered your earlier question.\n\nQuestion: Which?\n\nAnswer: B"
        );

        let s = session(
            json!({"workspaceId": "w", "repoBranch": "b", "clientInfo": {"task": "T"},
            "runs": [{"id": "run-1", "status": "running"}], "pendingTurn": null}),
        );
        assert_eq!(select_turn(&s, true, &none).unwrap().unwrap().prompt, "T");
        assert!(select_turn(&s, false, &none).unwrap().is_none());

        let s = session(
            json!({"workspaceId": "w", "repoBranch": "b", "clientInfo": {"task": "T"},
            "runs": [{"id": "run-1", "status": "succeeded"}], "pendingTurn": null}),
        );
        assert!(select_turn(&s, true, &none).unwrap().is_none());

        let s = session(
            json!({"workspaceId": "w", "repoBranch": "b", "clientInfo": {"task": "T"},
            "pendingTurn": {"ordinal": 1, "runId": "../x", "body": "B", "clientMessageId": "m", "turnId": null, "answerToQuestion": null}}),
        );
        assert!(select_turn(&s, true, &none).is_err());
        let s = session(
            json!({"workspaceId": "w", "repoBranch": "b", "clientInfo": {"task": "T"},
            "pendingTurn": {"runId": "run-1"}}),
        );
        assert!(select_turn(&s, true, &none).is_err());
    }
}
