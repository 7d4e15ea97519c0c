//! Bearer rotation during a turn (PROTOCOL.md 4.1 step 3) and the one writer
//! of the bearer file: every new bearer (rotated here, or pulled after a
//! `401` anywhere) is written atomically; after [`Rotation::stop`] returns
//! nothing writes the file again. With the agent API proxy the bearer file
//! holds the turn's proxy token instead: the rotation keeps the bearer
//! fresh in the runner's memory only (`Api::bearer`, which the proxy and
//! the interrupt watch read).

use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::Api;
use crate::session_dir::SessionDir;

/// The running rotation of one turn.
pub struct Rotation {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Rotation {
    /// Starts rotating; the current bearer is assumed written already.
    /// `bearer_file`: the session directory whose bearer file receives each
    /// new bearer (`--agent-api bearer`), or `None` (the agent API proxy:
    /// the bearer never leaves the runner's memory).
    pub fn start(api: Arc<Api>, bearer_file: Option<Arc<SessionDir>>) -> Rotation {
        let cancel = CancellationToken::new();
        // In the turn's span: its bearer pulls are the turn's requests.
        let task = tokio::spawn(tracing::Instrument::in_current_span(rotate(
            api,
            bearer_file,
            cancel.clone(),
        )));
        Rotation { cancel, task }
    }

    /// Stops the rotation and waits for it (a refresh in flight is dropped
    /// and cannot recreate the file).
    pub async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }

    /// Stops the rotation without waiting for it, for a turn that cannot
    /// await (its drop): the task is not polled again, a refresh in flight
    /// is dropped. Unlike [`Rotation::stop`] it cannot rule out one last
    /// write by a poll running on another thread at that moment.
    pub fn cancel(&self) {
        self.cancel.cancel();
        self.task.abort();
    }
}

async fn rotate(api: Arc<Api>, bearer_file: Option<Arc<SessionDir>>, cancel: CancellationToken) {
    let timings = *api.timings();
    let mut bearers = api.subscribe_bearer();
    bearers.mark_unchanged();
    let mut retry_at: Option<Instant> = None;
    loop {
        let due = retry_at.unwrap_or_else(|| match api.bearer() {
            Some(b) => Instant::from_std(b.refresh_at(&timings)),
            None => Instant::now(),
        });
        tokio::select! {
            _ = cancel.cancelled() => return,
            changed = bearers.changed() => {
                if changed.is_err() {
                    return;
                }
                let bearer = bearers.borrow_and_update().clone();
                if let (Some(b), Some(dir)) = (bearer, &bearer_file)
                    && let Err(e) = dir.write_bearer(&b.token)
                {
                    tracing::error!(error = %e, "cannot write the rotated bearer file");
                }
            }
            _ = tokio::time::sleep_until(due) => {
                let pulled = tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = api.pull_bearer(crate::client::Policy::AGENT_TOKEN_REFRESH) => r,
                };
                match pulled {
                    Ok(_) => {
                        tracing::info!("bearer rotated");
                        retry_at = None;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "bearer rotation failed; retrying later");
                        retry_at = Some(Instant::now() + timings.rotation_retry);
                    }
                }
            }
        }
    }
}
