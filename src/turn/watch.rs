//! The interrupt watch (PROTOCOL.md 4.1 step 3): reads the session every
//! tick with the bearer from the bearer file (or, with the agent API proxy,
//! where that file holds the proxy token, the runner's current bearer) and
//! reports when
//! `interruptRequestedRunId` names this run. A failed read is logged and
//! retried at the next tick; it never fails the turn. A session answer over
//! the session read's size cap is logged once per turn (it would be the same
//! at every tick) and the watch keeps its last answer: no interrupt seen.
//! With a coordinator that offers the long-poll of PROTOCOL.md 2.4 each
//! read is held until the session changes, and the next starts at once.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::client::{Api, LongPoll};
use crate::secret::Secret;

/// Why a watch read failed: the text, and whether the answer was over the
/// session read's size cap.
#[derive(Debug)]
pub struct ReadFailure {
    /// What failed (no secret: the bearer never enters it).
    pub text: String,
    /// The session answer was over its cap (PROTOCOL.md section 2).
    pub over_cap: bool,
}

impl std::fmt::Display for ReadFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Where the watch takes the bearer of each read.
#[derive(Clone, Debug)]
pub enum BearerSource {
    /// The bearer file (`--agent-api bearer`): read at each tick.
    File(PathBuf),
    /// The runner's current bearer (`Api::bearer`): the bearer file holds
    /// the agent's proxy token.
    Current,
}

/// Reads the session once; `Ok(true)` when it asks to interrupt `run_id`.
/// `poll` is the watch's long-poll state: an unchanged answer (`304`) is
/// `Ok(false)`, since the answer before it did not ask (the watch would
/// have ended).
///
/// Errors: the bearer file cannot be read (no bearer is known), or the
/// read failed.
pub async fn interrupt_requested(
    api: &Api,
    source: &BearerSource,
    run_id: &str,
    poll: &mut LongPoll,
) -> Result<bool, ReadFailure> {
    let token = bearer(api, source).await?;
    let session = api
        .session_poll(poll, Some(&token))
        .await
        .map_err(|e| ReadFailure {
            over_cap: e.is_too_large(),
            text: e.to_string(),
        })?;
    Ok(session.is_some_and(|s| s.interrupt_requested_run_id.as_deref() == Some(run_id)))
}

async fn bearer(api: &Api, source: &BearerSource) -> Result<Secret, ReadFailure> {
    // After a pause and restore the bearer is refreshed before its next use
    // (PROTOCOL.md 2.1, "Clocks"): the watch ticks every 5 s, so it is the
    // first to notice; the rotation writes the fresh one to the bearer file.
    if api.bearer().is_some_and(|b| b.clock_jumped()) {
        return api
            .usable_bearer()
            .await
            .map(|b| b.token)
            .map_err(|e| ReadFailure {
                text: e.to_string(),
                over_cap: false,
            });
    }
    match source {
        BearerSource::File(path) => tokio::fs::read_to_string(path)
            .await
            .map(|text| Secret::new(text.trim_end().to_string()))
            .map_err(|e| ReadFailure {
                text: format!("cannot read the bearer file: {e}"),
                over_cap: false,
            }),
        BearerSource::Current => api.bearer().map(|b| b.token).ok_or_else(|| ReadFailure {
            text: "no bearer was pulled yet".to_string(),
            over_cap: false,
        }),
    }
}

/// Starts watching; `on_interrupt` runs once, when the interrupt is seen.
/// `over_cap_logged`: the turn's first read (before the agent started) was
/// over the cap and logged already. `poll`: the long-poll state the first
/// read left (so the watch's next read is held at once where the
/// coordinator offers it).
pub fn spawn(
    api: Arc<Api>,
    source: BearerSource,
    run_id: String,
    over_cap_logged: bool,
    mut poll: LongPoll,
    on_interrupt: impl FnOnce() + Send + 'static,
) -> JoinHandle<()> {
    // In the turn's span: its reads are the turn's requests.
    tokio::spawn(tracing::Instrument::in_current_span(async move {
        let timings = *api.timings();
        let mut over_cap_logged = over_cap_logged;
        loop {
            tokio::time::sleep(poll.delay(timings.interrupt_poll, &timings)).await;
            match interrupt_requested(&api, &source, &run_id, &mut poll).await {
                Ok(true) => {
                    tracing::info!(run_id = %run_id, "interrupt requested by the coordinator");
                    on_interrupt();
                    return;
                }
                Ok(false) => {}
                Err(e) if e.over_cap => {
                    if !over_cap_logged {
                        over_cap_logged = true;
                        log_over_cap(&run_id, &e);
                    }
                }
                Err(e) => {
                    tracing::warn!(run_id = %run_id, error = %e, "interrupt watch read failed; retrying at the next tick")
                }
            }
        }
    }))
}

/// The one log line of a turn for session answers over the cap.
pub fn log_over_cap(run_id: &str, e: &ReadFailure) {
    tracing::warn!(
        run_id,
        error = %e,
        "interrupt watch: the session answer is over the session read's size cap; the watch keeps its last answer (no interrupt seen) and the turn goes on (logged once per turn)"
    );
}
