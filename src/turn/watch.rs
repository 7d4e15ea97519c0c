//! The interrupt watch (PROTOCOL.md 4.1 step 3): reads the session every
//! tick with the bearer from the bearer file and reports when
//! `interruptRequestedRunId` names this run. A failed read is logged and
//! retried at the next tick; it never fails the turn.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::client::Api;
use crate::secret::Secret;

/// Reads the session once; `Ok(true)` when it asks to interrupt `run_id`.
///
/// Errors: the bearer file cannot be read, or the read failed (text).
pub async fn interrupt_requested(
    api: &Api,
    bearer_path: &Path,
    run_id: &str,
) -> Result<bool, String> {
    let text = tokio::fs::read_to_string(bearer_path)
        .await
        .map_err(|e| format!("cannot read the bearer file: {e}"))?;
    let token = Secret::new(text.trim_end().to_string());
    let session = api.session_with(&token).await.map_err(|e| e.to_string())?;
    Ok(session.interrupt_requested_run_id.as_deref() == Some(run_id))
}

/// Starts watching; `on_interrupt` runs once, when the interrupt is seen.
pub fn spawn(
    api: Arc<Api>,
    bearer_path: PathBuf,
    run_id: String,
    on_interrupt: impl FnOnce() + Send + 'static,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let tick = api.timings().interrupt_poll;
        loop {
            tokio::time::sleep(tick).await;
            match interrupt_requested(&api, &bearer_path, &run_id).await {
                Ok(true) => {
                    tracing::info!(run_id = %run_id, "interrupt requested by the coordinator");
                    on_interrupt();
                    return;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(run_id = %run_id, error = %e, "interrupt watch read failed; retrying at the next tick")
                }
            }
        }
    })
}
