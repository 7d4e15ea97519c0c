//! The run's event sink (PROTOCOL.md 2.6): every event gets the next `seq`
//! (from 1, no gaps), is redacted, and is sent in batches in order.
//!
//! In memory for now: the durable spool, resume from the cursor and
//! `events_undelivered` are the events issue's. The agent is never blocked:
//! `emit` only queues.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::Api;
use crate::client::retry::wait_before_retry;
use crate::redact::Redactor;
use crate::timings::RetryPolicy;
use crate::wire::Event;

/// Most events in one request.
pub const MAX_BATCH_EVENTS: usize = 500;
/// Most bytes of event JSON in one request (1 MiB).
pub const MAX_BATCH_BYTES: usize = 1024 * 1024;

/// What the flush at turn end achieved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Highest `seq` assigned.
    pub last_seq: u64,
    /// Highest `seq` the coordinator accepted.
    pub accepted_through: u64,
}

impl FlushReport {
    /// Events that could not be delivered.
    pub fn undelivered(&self) -> u64 {
        self.last_seq.saturating_sub(self.accepted_through)
    }
}

/// A cheap handle to queue events of one run.
#[derive(Clone)]
pub struct EventSender {
    tx: mpsc::UnboundedSender<(String, Value)>,
}

impl EventSender {
    /// Queues an event of type `kind` with payload `data`. Never blocks;
    /// after the sink is closed the event is dropped (and logged).
    pub fn emit(&self, kind: impl Into<String>, data: Value) {
        let kind = kind.into();
        if self.tx.send((kind.clone(), data)).is_err() {
            tracing::warn!(event_type = %kind, "event emitted after the sink closed; dropped");
        }
    }
}

/// The sink of one run: a sender task and the handle to close it.
pub struct EventSink {
    sender: EventSender,
    close: oneshot::Sender<Instant>,
    task: JoinHandle<FlushReport>,
}

impl EventSink {
    /// Starts the sender task for `run_id`.
    pub fn start(api: Arc<Api>, run_id: String) -> EventSink {
        let (tx, rx) = mpsc::unbounded_channel();
        let (close, close_rx) = oneshot::channel();
        let task = tokio::spawn(send_loop(api, run_id, rx, close_rx));
        EventSink {
            sender: EventSender { tx },
            close,
            task,
        }
    }

    /// A handle to queue events.
    pub fn sender(&self) -> EventSender {
        self.sender.clone()
    }

    /// Stops accepting events once every sender is dropped, sends what is
    /// queued until `deadline` from now, and reports how far it got.
    pub async fn close(self, deadline: Duration) -> FlushReport {
        let EventSink {
            sender,
            close,
            task,
        } = self;
        drop(sender);
        let _ = close.send(Instant::now() + deadline);
        task.await.unwrap_or_default()
    }
}

/// Replaces every secret in the string leaves (and keys) of `value`.
pub fn redact_value(redactor: &Redactor, value: &mut Value) {
    match value {
        Value::String(s) => {
            if redactor.contains_secret(s) {
                *s = redactor.redact(s);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| redact_value(redactor, v)),
        Value::Object(map) => {
            let keys: Vec<String> = map
                .keys()
                .filter(|k| redactor.contains_secret(k))
                .cloned()
                .collect();
            for key in keys {
                if let Some(v) = map.remove(&key) {
                    map.insert(redactor.redact(&key), v);
                }
            }
            map.values_mut().for_each(|v| redact_value(redactor, v));
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

async fn send_loop(
    api: Arc<Api>,
    run_id: String,
    mut rx: mpsc::UnboundedReceiver<(String, Value)>,
    mut close_rx: oneshot::Receiver<Instant>,
) -> FlushReport {
    let timings = *api.timings();
    let policy = timings.retry.events;
    let mut pending: VecDeque<(Event, usize, Instant)> = VecDeque::new();
    let mut report = FlushReport::default();
    let mut deadline: Option<Instant> = None;
    let mut open = true;
    let mut failures = 0u32;
    let mut next_try = Instant::now();
    let mut max_events = MAX_BATCH_EVENTS;
    let mut stopped = false;

    let push = |pending: &mut VecDeque<(Event, usize, Instant)>,
                report: &mut FlushReport,
                kind: String,
                mut data: Value| {
        redact_value(api.redactor(), &mut data);
        report.last_seq += 1;
        let event = Event {
            seq: report.last_seq,
            kind,
            at: now_rfc3339(),
            data,
        };
        let size = serde_json::to_vec(&event).map(|v| v.len()).unwrap_or(0);
        pending.push_back((event, size, Instant::now()));
    };

    loop {
        while let Ok((kind, data)) = rx.try_recv() {
            push(&mut pending, &mut report, kind, data);
        }
        let now = Instant::now();
        if let Some(d) = deadline {
            if (pending.is_empty() && !open) || now >= d || stopped {
                break;
            }
        }
        // Send when the batch is full, when the oldest event waited a batch
        // interval, or at once while flushing.
        let due = pending.front().map(|(_, _, queued)| {
            if deadline.is_some() || pending.len() >= max_events {
                next_try
            } else {
                next_try.max(*queued + timings.event_batch_interval)
            }
        });
        if !stopped && due.is_some_and(|d| d <= now) {
            let mut bytes = 0;
            let batch: Vec<Event> = pending
                .iter()
                .take(max_events)
                .take_while(|(_, size, _)| {
                    bytes += size;
                    bytes <= MAX_BATCH_BYTES || bytes == *size
                })
                .map(|(e, _, _)| e.clone())
                .collect();
            let limit = match deadline {
                Some(d) => d
                    .saturating_duration_since(now)
                    .min(timings.request_timeout),
                None => timings.request_timeout,
            };
            let result =
                tokio::time::timeout(limit, api.post_events(&run_id, &batch, RetryPolicy::ONCE))
                    .await;
            match result {
                Ok(Ok(accepted)) => {
                    report.accepted_through = report.accepted_through.max(accepted);
                    while pending
                        .front()
                        .is_some_and(|(e, _, _)| e.seq <= report.accepted_through)
                    {
                        pending.pop_front();
                    }
                    failures = 0;
                    next_try = Instant::now();
                }
                Ok(Err(e)) if e.verdict_status() == Some(413) && max_events > 1 => {
                    max_events = (batch.len() / 2).max(1);
                    tracing::warn!(run_id = %run_id, max_events, "events batch too large (413); halving");
                }
                Ok(Err(e)) if e.verdict_status().is_some_and(|s| s != 429 && s < 500) => {
                    tracing::error!(run_id = %run_id, error = %e, "events refused; no more events are sent for this run");
                    stopped = true;
                }
                Ok(Err(e)) => {
                    tracing::warn!(run_id = %run_id, error = %e, "events post failed; retrying");
                    next_try = Instant::now() + wait_before_retry(policy, failures, None);
                    failures = failures.saturating_add(1);
                }
                Err(_) => {
                    tracing::warn!(run_id = %run_id, "events post timed out; retrying");
                    next_try = Instant::now() + wait_before_retry(policy, failures, None);
                    failures = failures.saturating_add(1);
                }
            }
            continue;
        }
        let wake = match (due, deadline) {
            (Some(d), Some(dl)) => d.min(dl),
            (Some(d), None) => d,
            (None, Some(dl)) => dl,
            (None, None) => now + Duration::from_secs(3600),
        };
        tokio::select! {
            msg = rx.recv(), if open => match msg {
                Some((kind, data)) => push(&mut pending, &mut report, kind, data),
                None => open = false,
            },
            d = &mut close_rx, if deadline.is_none() => {
                deadline = Some(d.unwrap_or_else(|_| Instant::now()));
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
    }
    if report.undelivered() > 0 {
        tracing::warn!(run_id = %run_id, undelivered = report.undelivered(), "events not delivered by the flush deadline");
    }
    report
}

/// The payload of a plain text event (`output`, `stderr`).
pub fn text_data(text: String, continued: bool) -> Value {
    if continued {
        json!({"text": text, "continued": true})
    } else {
        json!({"text": text})
    }
}
