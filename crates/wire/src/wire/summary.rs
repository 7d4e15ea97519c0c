//! A turn in one line, for people: what the runner prints on a terminal
//! when it seals a run and what the reference coordinator prints when it
//! receives the seal, from the same `finish` body, so that the two read
//! alike (issue 45, "Logs for people").

use std::time::Duration;

use super::{FinishBody, HarvestResult};

/// What a turn's summary line says besides its `finish` body.
#[derive(Clone, Copy, Debug, Default)]
pub struct TurnFacts<'a> {
    /// The turn's ordinal (1 for the initial task), when known.
    pub ordinal: Option<u64>,
    /// The run it sealed.
    pub run_id: &'a str,
    /// Events of the run: sent by the runner, or accepted by the coordinator.
    pub events: u64,
    /// Events the coordinator did not accept (the runner's count).
    pub undelivered: u64,
    /// From the turn's start to its seal.
    pub took: Option<Duration>,
}

/// `turn 2 (run-2) succeeded in 4.2 s · 37 events · pushed 1 commit to
/// session/x at 1a2b3c4 (3 files, +10 -2)`.
pub fn turn_line(facts: &TurnFacts<'_>, finish: &FinishBody) -> String {
    let mut line = match facts.ordinal {
        Some(n) => format!("turn {n} ({})", facts.run_id),
        None => format!("turn {}", facts.run_id),
    };
    line.push(' ');
    line.push_str(finish.status.as_str());
    if let Some(error) = &finish.error {
        line.push_str(&format!(" ({})", error.code.as_str()));
    }
    if let Some(took) = facts.took {
        line.push_str(&format!(" in {}", seconds(took)));
    }
    line.push_str(&format!(" · {}", plural(facts.events, "event")));
    if facts.undelivered > 0 {
        line.push_str(&format!(" ({} not delivered)", facts.undelivered));
    }
    if let Some(reset) = &finish.agent_session_reset {
        line.push_str(&format!(
            " · a fresh agent session (no state for {})",
            reset.requested
        ));
    }
    line.push_str(" · ");
    line.push_str(&match &finish.result {
        Some(result) => harvest_words(result),
        None => "no harvest".to_string(),
    });
    line
}

/// What the harvest did, in words: where the work went, or why it did not.
pub fn harvest_words(result: &HarvestResult) -> String {
    let head = result.head_sha.as_deref().map_or("?", short);
    let mut words = if let Some(error) = &result.push_error {
        format!(
            "NOT pushed ({}): {head} stays in repo/",
            error.code.as_str()
        )
    } else if result.commits == 0 && result.harvest_commit.is_none() {
        "nothing new to push".to_string()
    } else {
        let target = match &result.recovery_branch {
            Some(recovery) => format!("recovery branch {recovery}"),
            None => result.branch.clone(),
        };
        format!(
            "pushed {} to {target} at {head} ({}, +{} -{})",
            plural(result.commits, "commit"),
            plural(result.files_changed, "file"),
            result.insertions,
            result.deletions
        )
    };
    if result.harvest_commit.is_some() {
        words.push_str(", the agent's uncommitted work committed");
    }
    let held = result.blocked_paths.len() + result.skipped_files.len();
    if held > 0 {
        words.push_str(&format!(", {} held back", plural(held as u64, "path")));
    }
    words
}

/// `1.2 s`, `42 ms`, `3 min 5 s`.
fn seconds(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1_000)
    }
}

fn plural(n: u64, one: &str) -> String {
    format!("{n} {one}{}", if n == 1 { "" } else { "s" })
}

/// The first seven characters of a commit id.
fn short(sha: &str) -> &str {
    sha.get(..7).unwrap_or(sha)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ErrorCode, FinishError, PushError, PushErrorCode, RunOutcome};

    fn result() -> HarvestResult {
        serde_json::from_value(serde_json::json!({
            "name": "run-2", "branch": "session/x",
            "headSha": "1a2b3c4d5e6f70819a2b3c4d5e6f70819a2b3c4d",
            "pushed": true, "commits": 1, "filesChanged": 3,
            "insertions": 10, "deletions": 2
        }))
        .unwrap()
    }

    fn finish(status: RunOutcome, result: Option<HarvestResult>) -> FinishBody {
        FinishBody {
            status,
            agent_session_id: None,
            error: None,
            usage: None,
            result,
            agent_session_reset: None,
            resources: None,
        }
    }

    fn facts() -> TurnFacts<'static> {
        TurnFacts {
            ordinal: Some(2),
            run_id: "run-2",
            events: 37,
            undelivered: 0,
            took: Some(Duration::from_millis(4_240)),
        }
    }

    #[test]
    fn a_pushed_turn_says_where_its_work_went() {
        assert_eq!(
            turn_line(&facts(), &finish(RunOutcome::Succeeded, Some(result()))),
            "turn 2 (run-2) succeeded in 4.2 s · 37 events · pushed 1 commit to session/x at 1a2b3c4 (3 files, +10 -2)"
        );
    }

    #[test]
    fn a_failed_turn_names_its_code_and_what_was_not_pushed() {
        let mut r = result();
        r.pushed = false;
        r.push_error = Some(PushError {
            code: PushErrorCode::PushFailed,
            message: "the remote hung up".into(),
        });
        let mut body = finish(RunOutcome::Failed, Some(r));
        body.error = Some(FinishError {
            code: ErrorCode::ProviderRateLimited,
            message: String::new(),
            retryable: true,
            retry_after_ms: None,
            resets_at: None,
        });
        let f = TurnFacts {
            undelivered: 2,
            took: Some(Duration::from_millis(830)),
            ..facts()
        };
        assert_eq!(
            turn_line(&f, &body),
            "turn 2 (run-2) failed (provider_rate_limited) in 830 ms · 37 events (2 not delivered) · NOT pushed (push_failed): 1a2b3c4 stays in repo/"
        );
    }

    #[test]
    fn nothing_to_push_and_no_harvest_are_said_plainly() {
        let mut r = result();
        r.commits = 0;
        let f = TurnFacts {
            ordinal: None,
            events: 1,
            took: None,
            ..facts()
        };
        assert_eq!(
            turn_line(&f, &finish(RunOutcome::Interrupted, Some(r))),
            "turn run-2 interrupted · 1 event · nothing new to push"
        );
        assert_eq!(
            turn_line(&f, &finish(RunOutcome::Failed, None)),
            "turn run-2 failed · 1 event · no harvest"
        );
        let mut fresh = finish(RunOutcome::Succeeded, None);
        fresh.agent_session_reset = Some(crate::wire::AgentSessionReset {
            requested: "ses-1".into(),
            reason: "No conversation found".into(),
        });
        assert_eq!(
            turn_line(&f, &fresh),
            "turn run-2 succeeded · 1 event · a fresh agent session (no state for ses-1) · no harvest"
        );
    }

    #[test]
    fn a_recovery_branch_a_harvest_commit_and_held_paths_are_named() {
        let mut r = result();
        r.recovery_branch = Some("session/x-recovered-run-2".into());
        r.harvest_commit = Some(r.head_sha.clone().unwrap());
        r.blocked_paths = vec![".env".into()];
        assert_eq!(
            harvest_words(&r),
            "pushed 1 commit to recovery branch session/x-recovered-run-2 at 1a2b3c4 (3 files, +10 -2), the agent's uncommitted work committed, 1 path held back"
        );
        assert_eq!(seconds(Duration::from_secs(185)), "3 min 5 s");
    }
}
