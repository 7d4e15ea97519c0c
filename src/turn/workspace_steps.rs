//! The turn's workspace steps, each bounded and reported as an event: the
//! workspace sync before the agent starts (4.1 step 3), reported as a
//! `hosted_boot.workspace_sync` event; and the harvest after it (4.1 step 6,
//! 4.4, 4.5), bounded by 60 s after a turn, by the stop's 10 s share on a
//! graceful stop (also when the stop comes while the harvest runs), skipped
//! by a second signal; its report goes out as a `hosted_boot.harvest` event
//! and is returned for `finish.result`. The git work itself is the
//! [`Harvester`]'s.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::events::EventSender;
use crate::events::event::RunnerEvent;
use crate::signals::Stop;
use crate::timings::Timings;
use crate::wire::{HarvestResult, RunOutcome, WorkspaceSync};
use crate::workspace::{HarvestJob, Harvester};

/// Brings `repo/` to the remote's session branch before the agent of
/// `run_id` starts (4.1 step 3, 4.5 "Before a turn"), within
/// `Timings::workspace_sync_bound`, and emits the event. Returns the report;
/// its `startSha` is where the turn starts.
pub async fn before_turn(
    harvester: &Harvester,
    run_id: &str,
    timings: &Timings,
    events: &EventSender,
) -> WorkspaceSync {
    let report = harvester
        .sync_before_turn(run_id, timings.workspace_sync_bound)
        .await;
    match serde_json::to_value(&report) {
        Ok(data) => events.emit(RunnerEvent::WorkspaceSync, data),
        Err(e) => tracing::error!(error = %e, "cannot encode the workspace sync event"),
    }
    report
}

/// Harvests the turn `run_id` that ended `outcome`, having started at
/// `start` (the workspace sync's `startSha`), and emits the event.
///
/// Returns `None` when a second stop signal came (before or during the
/// harvest): the caller skips what is left but the file removal (4.4).
pub async fn after_turn(
    harvester: &Harvester,
    run_id: &str,
    outcome: RunOutcome,
    start: Option<String>,
    timings: &Timings,
    stop: &watch::Receiver<Stop>,
    events: &EventSender,
) -> Option<HarvestResult> {
    let stopping = match *stop.borrow() {
        Stop::Immediate(_) => return None,
        Stop::Graceful(_) => true,
        Stop::Running => false,
    };
    let job = HarvestJob {
        name: run_id.to_string(),
        outcome: Some(outcome),
        start,
        bound: if stopping {
            timings.stop_harvest
        } else {
            timings.harvest_bound
        },
    };
    let result = harvester
        .harvest_until(job, cut_by_stop(stop.clone(), timings.stop_harvest))
        .await;
    if matches!(*stop.borrow(), Stop::Immediate(_)) {
        return None;
    }
    emit(events, &result);
    Some(result)
}

/// Emits `result` as a `hosted_boot.harvest` event (redacted by the sink).
pub fn emit(events: &EventSender, result: &HarvestResult) {
    match serde_json::to_value(result) {
        Ok(data) => events.emit(RunnerEvent::Harvest, data),
        Err(e) => tracing::error!(error = %e, "cannot encode the harvest event"),
    }
}

/// Completes when a stop cuts the harvest short: at once on a second
/// signal, `share` after a graceful one (the harvest's share of 4.4).
async fn cut_by_stop(mut stop: watch::Receiver<Stop>, share: Duration) -> String {
    let mut graceful_until: Option<Instant> = None;
    loop {
        match *stop.borrow_and_update() {
            Stop::Immediate(_) => return "a second stop signal cut the harvest short".to_string(),
            Stop::Graceful(_) if graceful_until.is_none() => {
                graceful_until = Some(Instant::now() + share);
            }
            _ => {}
        }
        let share_spent = async {
            match graceful_until {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(share_spent);
        tokio::select! {
            changed = stop.changed() => {
                if changed.is_err() {
                    // No more signals can come.
                    (&mut share_spent).await;
                    break;
                }
            }
            _ = &mut share_spent => break,
        }
    }
    format!(
        "the graceful stop left the harvest {} ms and it did not finish; the work stays in repo/",
        share.as_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_graceful_stop_cuts_after_its_share_a_second_at_once() {
        let share = Duration::from_millis(200);
        let (tx, rx) = watch::channel(Stop::Running);
        let cut = tokio::spawn(cut_by_stop(rx, share));
        tokio::time::sleep(share * 2).await;
        assert!(!cut.is_finished(), "no stop, no cut");
        tx.send_replace(Stop::Graceful(15));
        let t0 = Instant::now();
        let why = cut.await.unwrap();
        assert!(t0.elapsed() >= share, "{:?}", t0.elapsed());
        assert!(why.contains("graceful stop"), "{why}");

        // Already stopping gracefully: a second signal cuts at once.
        let (tx, rx) = watch::channel(Stop::Graceful(15));
        let cut = tokio::spawn(cut_by_stop(rx, Duration::from_secs(3600)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!cut.is_finished());
        tx.send_replace(Stop::Immediate(15));
        let why = tokio::time::timeout(Duration::from_secs(5), cut)
            .await
            .expect("the second signal did not cut at once")
            .unwrap();
        assert!(why.contains("second stop signal"), "{why}");
    }
}
