//! The run's event sink (PROTOCOL.md 2.6): every event is redacted, gets the
//! next `seq` (from 1, no gaps) and is appended to the run's spool
//! ([`spool`]) before anything is sent; a sender task reads batches
//! back from the spool and posts them in order.
//!
//! - Producers never wait for the coordinator: [`EventSender::emit`] (the
//!   runner's own events), [`EventSender::emit_agent`] and
//!   [`EventSender::append_agent`] (the agent's, built only through
//!   [`event`]) only write to the spool (a local file).
//! - The sender posts up to [`MAX_BATCH_EVENTS`] events or
//!   [`MAX_BATCH_BYTES`] a request, as soon as a batch is full and at least
//!   every `event_batch_interval` (250 ms) while events flow, and advances to
//!   the `acceptedThrough` answered. Its memory is one batch, whatever the
//!   backlog on disk.
//! - A failed post is retried by the one retry engine under
//!   [`Policy::EVENTS`] (base 250 ms, cap 5 s, `Retry-After` honoured, no
//!   attempt limit) for as long as the turn runs, then until the flush
//!   deadline, where the sender cuts it. An answer that accepted nothing of
//!   the batch is retried the same way. A `413` halves the batch; any other
//!   `4xx` stops sending for the run (the spool is kept).
//! - At turn end, [`EventSink::close`] flushes until the deadline and reports
//!   what was not delivered; the turn puts it in `finish.error`
//!   (`events_undelivered`).
//! - A runner restarted on the same session reopens the spool, reads
//!   `events/cursor` and sends only what the coordinator lacks.

pub mod event;
pub mod spool;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use tracing::Instrument as _;

use self::event::{AgentEvent, RunnerEvent};
use self::spool::{Spool, SpoolError, SpoolReader};
use crate::client::{Api, CallError, Policy};
use crate::redact::Redactor;
use crate::session_dir::RunDir;
use crate::wire::{ErrorCode, FinishError};

/// Most events in one request.
pub const MAX_BATCH_EVENTS: usize = 500;
/// Most bytes of event JSON in one request (1 MiB); a single larger event is
/// sent alone.
pub const MAX_BATCH_BYTES: usize = 1024 * 1024;

/// What the flush at turn end achieved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Highest `seq` assigned.
    pub last_seq: u64,
    /// Highest `seq` the coordinator accepted.
    pub accepted_through: u64,
    /// Events that could not even be written to the spool.
    pub dropped: u64,
    /// Why sending stopped before the end, if it did (a `4xx` verdict).
    pub stopped: Option<String>,
}

impl FlushReport {
    /// Events that could not be delivered.
    pub fn undelivered(&self) -> u64 {
        self.last_seq.saturating_sub(self.accepted_through) + self.dropped
    }

    /// Records undelivered events in a turn's `finish.error` (PROTOCOL.md
    /// 2.6): `events_undelivered` when the turn has no error of its own;
    /// otherwise the turn's own code is kept (it says more about what to do
    /// next) and the count is added to its message.
    pub fn record_in(&self, error: &mut Option<FinishError>) {
        let n = self.undelivered();
        if n == 0 {
            return;
        }
        let why = match &self.stopped {
            Some(reason) => format!(" (sending stopped: {reason})"),
            None => String::new(),
        };
        let text = format!(
            "{n} events could not be delivered (accepted through seq {} of {}){why}; they remain in the sandbox's run spool",
            self.accepted_through, self.last_seq
        );
        match error {
            Some(e) => e.message = format!("{}; also {text}", e.message),
            None => {
                *error = Some(FinishError {
                    code: ErrorCode::EventsUndelivered,
                    message: text,
                    retryable: false,
                    retry_after_ms: None,
                    resets_at: None,
                });
            }
        }
    }
}

/// A cheap handle to add events to one run. Never waits for the coordinator.
pub struct EventSender {
    shared: Arc<Shared>,
}

struct Shared {
    spool: Spool,
    /// Live [`EventSender`]s; the flush ends early once none is left and
    /// everything is delivered.
    senders: AtomicUsize,
}

impl Clone for EventSender {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::SeqCst);
        EventSender {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for EventSender {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shared.spool.appended.notify_one();
        }
    }
}

impl EventSender {
    /// A sender writing to `spool` with no sender task (the benchmark, and
    /// tests of the pipeline).
    pub fn detached(spool: Spool) -> EventSender {
        EventSender {
            shared: Arc::new(Shared {
                spool,
                senders: AtomicUsize::new(1),
            }),
        }
    }

    /// Adds one of the runner's own events (PROTOCOL.md 4.6) with payload
    /// `data` (redacted, numbered, spooled). The agent's events go through
    /// [`EventSender::emit_agent`].
    pub fn emit(&self, kind: RunnerEvent, data: Value) {
        self.shared.spool.append_runner(kind, data, &now_rfc3339());
    }

    /// Adds one event the agent produced (numbered, spooled; it was redacted
    /// and checked when it was built).
    pub fn emit_agent(&self, event: AgentEvent) {
        let mut one = vec![event];
        self.append_agent(&mut one, &now_rfc3339());
    }

    /// Adds the agent's `events` (drained) in order, all stamped `at` (RFC
    /// 3339), in one write. Returns the last `seq`, or `None` if the spool
    /// write failed (the events are counted as undelivered).
    pub fn append_agent(&self, events: &mut Vec<AgentEvent>, at: &str) -> Option<u64> {
        self.shared.spool.append(events, at)
    }

    /// The run's redactor, its sources polled: what the [`AgentEvent`]
    /// constructors are given, once per batch of events.
    pub fn fresh_redactor(&self) -> &Redactor {
        let redactor = self.shared.spool.redactor();
        redactor.refresh();
        redactor
    }
}

/// The sink of one run: the spool, the sender task and the handle to close
/// it.
pub struct EventSink {
    sender: EventSender,
    close: oneshot::Sender<Instant>,
    task: JoinHandle<FlushReport>,
}

/// Where the sender starts.
struct Start {
    pos: u64,
    accepted: u64,
}

impl EventSink {
    /// Opens the run's spool in `run_dir` and starts the sender for
    /// `run_id`. A spool that already holds events (a runner restarted on
    /// the same session) is resumed: the cursor is read (`events/cursor`,
    /// required policy) and only what the coordinator lacks is sent; new
    /// events continue the numbering. If the cursor cannot be read, the whole
    /// spool is resent (the coordinator ignores what it has).
    ///
    /// Errors: the spool cannot be opened.
    pub async fn open(
        api: Arc<Api>,
        run_dir: &RunDir,
        run_id: &str,
    ) -> Result<EventSink, SpoolError> {
        let (spool, existing) = Spool::open(run_dir.path(), api.redactor().clone())?;
        let mut start = Start {
            pos: 0,
            accepted: 0,
        };
        if existing.torn > 0 {
            tracing::warn!(
                run_id,
                bytes = existing.torn,
                "the event spool ended with a torn line (a runner killed while writing); cut"
            );
        }
        if existing.last_seq > 0 {
            match api.events_cursor(run_id).await {
                Ok(cursor) => {
                    tracing::info!(
                        run_id,
                        cursor,
                        spooled = existing.last_seq,
                        "resuming the event spool from the coordinator's cursor"
                    );
                    spool.continue_after(cursor);
                    start.accepted = cursor;
                    start.pos = match spool.reader() {
                        Ok(r) => r.offset_after(cursor, existing.len).unwrap_or(0),
                        Err(_) => 0,
                    };
                }
                Err(e) => {
                    tracing::warn!(run_id, error = %e, spooled = existing.last_seq, "cannot read the events cursor; resending the whole spool");
                }
            }
        }
        let reader = spool.reader().map_err(|source| SpoolError {
            action: "read",
            path: spool.path().to_path_buf(),
            source,
        })?;
        let sender = EventSender {
            shared: Arc::new(Shared {
                spool,
                senders: AtomicUsize::new(1),
            }),
        };
        let (close, close_rx) = oneshot::channel();
        // In the opener's span (the turn's): its requests are the turn's.
        let task = tokio::spawn(
            send_loop(
                api,
                run_id.to_string(),
                sender.shared.clone(),
                reader,
                start,
                close_rx,
            )
            .in_current_span(),
        );
        Ok(EventSink {
            sender,
            close,
            task,
        })
    }

    /// A handle to add events.
    pub fn sender(&self) -> EventSender {
        self.sender.clone()
    }

    /// Stops waiting for new events once every sender is dropped, sends what
    /// is spooled until `deadline` from now, and reports how far it got.
    pub async fn close(self, deadline: Duration) -> FlushReport {
        let EventSink {
            sender,
            close,
            task,
        } = self;
        let shared = sender.shared.clone();
        drop(sender);
        let _ = close.send(Instant::now() + deadline);
        let report = match task.await {
            Ok(report) => report,
            Err(e) => {
                tracing::error!(error = %e, "the event sender task failed");
                let (_, last_seq) = shared.spool.committed();
                FlushReport {
                    last_seq,
                    accepted_through: 0,
                    dropped: shared.spool.dropped(),
                    stopped: Some("the sender task failed".into()),
                }
            }
        };
        // A run's events, counted once, when its sink closes.
        crate::telemetry::metrics::events("spooled", report.last_seq);
        crate::telemetry::metrics::events("sent", report.accepted_through);
        crate::telemetry::metrics::events("undelivered", report.undelivered());
        report
    }
}

/// Delivers what earlier runners left in the spools of other runs (a run
/// sealed with `events_undelivered`, whatever its outcome, or a runner
/// stopped or killed during the flush): for each run directory under `root`
/// but `current` (the turn about to run resumes its own; `""` when none is
/// selected), reads the cursor, sends the rest within
/// the flush deadline, and removes the run directory once everything is
/// delivered (or it holds no event). What still cannot be delivered stays
/// for the next boot. Never fails the boot: problems are logged.
pub async fn deliver_leftovers(api: &Arc<Api>, root: &std::path::Path, current: &str) {
    let parent = root.join(crate::session_dir::RUN_PARENT);
    let Ok(entries) = std::fs::read_dir(&parent) else {
        return;
    };
    let mut runs: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name != current)
        .collect();
    runs.sort();
    for run_id in runs {
        let dir = match RunDir::create(root, &run_id) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(run_id, error = %e, "skipping a leftover run directory");
                continue;
            }
        };
        let sink = match EventSink::open(api.clone(), &dir, &run_id).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(run_id, error = %e, "cannot open a leftover event spool");
                continue;
            }
        };
        let report = sink.close(api.timings().event_flush_deadline).await;
        if report.undelivered() == 0 {
            tracing::info!(
                run_id,
                events = report.last_seq,
                "leftover events delivered; removing the run directory"
            );
            if let Err(e) = dir.remove() {
                tracing::warn!(run_id, error = %e, "cannot remove the run directory");
            }
        } else {
            tracing::warn!(
                run_id,
                undelivered = report.undelivered(),
                "leftover events still undelivered; kept for the next boot"
            );
        }
    }
}

/// Now, as an event timestamp (RFC 3339, milliseconds, UTC).
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

/// The state of the sender between requests.
struct SendState {
    /// Offset of the first event not accepted.
    pos: u64,
    /// Highest `seq` accepted.
    accepted: u64,
    /// Events per request (halved by a `413`).
    max_events: usize,
    /// When the oldest event not yet sent was first seen.
    waiting_since: Option<Instant>,
    /// A `4xx` verdict: nothing more is sent.
    stopped: Option<String>,
    /// Failed bearer re-pulls in a row (see [`send_batch`]).
    repulls: u32,
    /// Not before this after such a failure.
    retry_at: Option<Instant>,
}

async fn send_loop(
    api: Arc<Api>,
    run_id: String,
    shared: Arc<Shared>,
    reader: SpoolReader,
    start: Start,
    mut close_rx: oneshot::Receiver<Instant>,
) -> FlushReport {
    let timings = *api.timings();
    let mut st = SendState {
        pos: start.pos,
        accepted: start.accepted,
        max_events: MAX_BATCH_EVENTS,
        waiting_since: None,
        stopped: None,
        repulls: 0,
        retry_at: None,
    };
    let mut deadline: Option<Instant> = None;
    loop {
        let (end, last) = shared.spool.committed();
        let now = Instant::now();
        let pending = last > st.accepted && st.stopped.is_none();
        if pending && st.waiting_since.is_none() {
            st.waiting_since = Some(now);
        }
        if let Some(d) = deadline {
            let idle = shared.senders.load(Ordering::SeqCst) == 0;
            if now >= d || (!pending && idle) {
                break;
            }
        }
        let full = last.saturating_sub(st.accepted) >= st.max_events as u64
            || end.saturating_sub(st.pos) >= MAX_BATCH_BYTES as u64;
        let due = match (pending, st.waiting_since) {
            (true, Some(since)) if deadline.is_none() && !full => {
                Some(since + timings.event_batch_interval)
            }
            (true, _) => Some(now),
            (false, _) => None,
        }
        .map(|d| st.retry_at.map_or(d, |r| d.max(r)));
        if due.is_some_and(|d| d <= now) {
            send_batch(
                &api,
                &run_id,
                &reader,
                end,
                &mut st,
                &mut deadline,
                &mut close_rx,
            )
            .await;
            continue;
        }
        let wake = match (due, deadline) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => now + Duration::from_secs(3600),
        };
        tokio::select! {
            _ = shared.spool.appended.notified() => {}
            d = &mut close_rx, if deadline.is_none() => {
                deadline = Some(d.unwrap_or_else(|_| Instant::now()));
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
    let (_, last_seq) = shared.spool.committed();
    let report = FlushReport {
        last_seq,
        accepted_through: st.accepted.min(last_seq),
        dropped: shared.spool.dropped(),
        stopped: st.stopped,
    };
    if report.undelivered() > 0 {
        tracing::warn!(run_id = %run_id, undelivered = report.undelivered(), last_seq, accepted_through = report.accepted_through, "events not delivered by the flush deadline");
    }
    report
}

/// Reads one batch from the spool and posts it, retried by the engine under
/// [`Policy::EVENTS`] until it is answered or the deadline passes; updates
/// `st`.
async fn send_batch(
    api: &Api,
    run_id: &str,
    reader: &SpoolReader,
    end: u64,
    st: &mut SendState,
    deadline: &mut Option<Instant>,
    close_rx: &mut oneshot::Receiver<Instant>,
) {
    let timings = api.timings();
    let mut batch = match reader.read_batch(
        st.pos,
        end,
        st.accepted,
        st.max_events,
        MAX_BATCH_BYTES,
    ) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(run_id, error = %e, "cannot read the event spool; no more events are sent for this run");
            st.stopped = Some(format!("the spool could not be read: {e}"));
            return;
        }
    };
    if batch.events.is_empty() {
        // The committed length covers the last seq, so this only happens if
        // the file lost lines (edited under us): nothing more can be sent.
        tracing::error!(
            run_id,
            pos = st.pos,
            "the event spool holds no event after the accepted one; no more events are sent for this run"
        );
        st.stopped = Some("the spool lost events".into());
        return;
    }
    let started = Instant::now();
    let body = Bytes::from(std::mem::take(&mut batch.body));
    // An answer that accepted none of the batch (and did not go back) is
    // retried by the engine: resending at once would spin.
    let (first, before) = (batch.events[0].0, st.accepted);
    let post = api.post_events_body(run_id, body, move |accepted| {
        accepted >= first || accepted < before
    });
    let Some(result) = until_deadline(post, deadline, close_rx).await else {
        return; // the deadline passed with the request still failing
    };
    match result {
        Ok(accepted) => {
            advance(reader, &batch.events, accepted, end, st);
            st.waiting_since = (st.accepted < batch.last_seq()).then_some(started);
            st.repulls = 0;
            st.retry_at = None;
        }
        // An answer over its cap would be the same on every resend.
        Err(e) if e.is_too_large() => stop(run_id, st, &e),
        Err(e) => match e.verdict_status() {
            Some(413) if batch.events.len() > 1 => {
                st.max_events = (batch.events.len() / 2).max(1);
                tracing::warn!(
                    run_id,
                    max_events = st.max_events,
                    "events batch too large (413); halving"
                );
            }
            Some(_) => stop(run_id, st, &e),
            None => {
                // The events policy never gives up, so only a failed bearer
                // pull gets here (none yet, or the re-pull after a 401; its
                // own attempts spent): the next batch waits the events
                // backoff, not to spin.
                let wait = Policy::EVENTS.scaled(timings.scale).backoff(st.repulls);
                tracing::warn!(run_id, error = %e, wait_ms = wait.as_millis() as u64, "cannot pull a fresh bearer for the events; retrying");
                st.retry_at = Some(Instant::now() + wait);
                st.repulls = st.repulls.saturating_add(1);
            }
        },
    }
}

/// Drives `post` until it ends, or until the flush deadline passes
/// (`None`): the deadline, learnt from `close_rx` at turn end, cuts the
/// engine's unbounded retries of the events route.
async fn until_deadline<T>(
    post: impl std::future::Future<Output = T>,
    deadline: &mut Option<Instant>,
    close_rx: &mut oneshot::Receiver<Instant>,
) -> Option<T> {
    tokio::pin!(post);
    loop {
        let cut = crate::concurrency::sleep_until(*deadline);
        tokio::select! {
            r = &mut post => return Some(r),
            d = &mut *close_rx, if deadline.is_none() => {
                *deadline = Some(d.unwrap_or_else(|_| Instant::now()));
            }
            _ = cut => return None,
        }
    }
}

fn stop(run_id: &str, st: &mut SendState, e: &CallError) {
    tracing::error!(run_id, error = %e, "events refused; no more events are sent for this run (the spool is kept)");
    st.stopped = Some(e.to_string());
}

/// Moves past what the coordinator accepted.
fn advance(
    reader: &SpoolReader,
    events: &[(u64, u64)],
    accepted: u64,
    end: u64,
    st: &mut SendState,
) {
    if accepted < st.accepted {
        // The coordinator went back: resend from its cursor (it ignores
        // what it has, and a gap would be refused).
        tracing::warn!(
            was = st.accepted,
            now = accepted,
            "the coordinator's acceptedThrough went back; resending from it"
        );
        st.accepted = accepted;
        st.pos = reader.offset_after(accepted, end).unwrap_or(0);
        return;
    }
    st.accepted = accepted;
    crate::status::events_sent(accepted);
    if let Some(&(_, after)) = events.iter().rev().find(|(seq, _)| *seq <= accepted) {
        st.pos = after;
    }
}
