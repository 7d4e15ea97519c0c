//! The coordinator's log for people (`hosted-boot-coordinator` on a
//! terminal): one line per request once it is answered, in the order of
//! the answers and stamped with the answer's time, and a line per turn when
//! its seal arrives (issue 45, "Logs for people").
//!
//! A request is printed once answered, not as it arrives: a held session
//! read (the long-poll, PROTOCOL.md 2.4) would otherwise hold back every
//! line after it. Stamped with its arrival, a line printed in the order of
//! answers looked out of order; each line now carries the time it was
//! answered and how long that took.

use std::collections::HashSet;

use crate::state::{RecordedRequest, RunRecord, Snapshot, Target};
use crate::wire::routes::Route;
use crate::wire::summary::{TurnFacts, turn_line};

/// Which requests have been printed.
#[derive(Default)]
pub(crate) struct RequestLog {
    /// Requests before this index were either printed or are in flight.
    seen: usize,
    /// Requests not answered when last looked at.
    in_flight: Vec<usize>,
    /// Runs whose summary was printed (a repeated `finish` is idempotent).
    summarized: HashSet<String>,
}

impl RequestLog {
    /// The lines for the requests answered since the last call, in the
    /// order of their answers.
    pub(crate) fn next_lines(&mut self, snapshot: &Snapshot) -> Vec<String> {
        self.lines(&snapshot.requests, &snapshot.runs)
    }

    fn lines(&mut self, requests: &[RecordedRequest], runs: &[RunRecord]) -> Vec<String> {
        let mut ready = Vec::new();
        self.in_flight.retain(|&i| {
            let done = requests.get(i).is_none_or(answered);
            if done {
                ready.push(i);
            }
            !done
        });
        for (i, r) in requests.iter().enumerate().skip(self.seen) {
            if answered(r) {
                ready.push(i);
            } else {
                self.in_flight.push(i);
            }
        }
        self.seen = requests.len();
        let mut ready: Vec<&RecordedRequest> =
            ready.into_iter().filter_map(|i| requests.get(i)).collect();
        ready.sort_by_key(|r| r.answered_at_ms.unwrap_or(r.at_ms));
        let mut lines = Vec::new();
        for r in ready {
            lines.push(request_line(r));
            if let Some(line) = self.turn_summary(r, requests, runs) {
                lines.push(line);
            }
        }
        lines
    }

    /// The turn's line after its first accepted `finish`.
    fn turn_summary(
        &mut self,
        r: &RecordedRequest,
        requests: &[RecordedRequest],
        runs: &[RunRecord],
    ) -> Option<String> {
        if r.route != Route::Finish || !r.response_status.is_some_and(|s| (200..300).contains(&s)) {
            return None;
        }
        let id = run_id_of(&r.path)?;
        let run = runs.iter().find(|run| run.id == id)?;
        let finish = run.finish.as_ref()?;
        if !self.summarized.insert(run.id.clone()) {
            return None;
        }
        let answered = r.answered_at_ms.unwrap_or(r.at_ms);
        let facts = TurnFacts {
            ordinal: Some(run.ordinal),
            run_id: &run.id,
            events: run.events.len() as u64,
            undelivered: 0,
            took: started_at(run, requests)
                .map(|at| std::time::Duration::from_millis(answered.saturating_sub(at))),
        };
        Some(format!(
            "{}  turn    {}",
            seconds(answered),
            turn_line(&facts, finish)
        ))
    }
}

fn answered(r: &RecordedRequest) -> bool {
    r.response_status.is_some() || r.fault.is_some()
}

/// `    4.213s  runner  POST /api/cli/workbench-runs/run-2/finish  200  (finish, 3 ms)`:
/// when answered, who (`runner`, or `dev` for the dev API), method, path
/// without its query, the answer (`dropped` by a fault), the route and the
/// time it took.
fn request_line(r: &RecordedRequest) -> String {
    let who = if r.route == Target::Dev {
        "dev   "
    } else {
        "runner"
    };
    let path = r.path.split('?').next().unwrap_or("");
    let answer = r
        .response_status
        .map_or_else(|| "dropped".to_string(), |s| s.to_string());
    let at = r.answered_at_ms.unwrap_or(r.at_ms);
    format!(
        "{}  {who}  {:<4} {path}  {answer}  ({}, {} ms)",
        seconds(at),
        r.method,
        r.route.name(),
        at.saturating_sub(r.at_ms)
    )
}

fn seconds(ms: u64) -> String {
    format!("{:>9.3}s", ms as f64 / 1000.0)
}

/// The run id of `…/workbench-runs/{runId}/finish`.
fn run_id_of(path: &str) -> Option<&str> {
    let path = path.split('?').next()?;
    let mut segments = path.rsplit('/');
    (segments.next()? == "finish").then_some(())?;
    segments.next()
}

/// When the run's first accepted `run_started` arrived.
fn started_at(run: &RunRecord, requests: &[RecordedRequest]) -> Option<u64> {
    requests
        .iter()
        .find(|r| {
            r.route == Route::RunStarted
                && r.response_status.is_some_and(|s| (200..300).contains(&s))
                && r.path.split('?').next().and_then(|p| p.rsplit('/').next())
                    == Some(run.id.as_str())
        })
        .map(|r| r.at_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(at: u64, answered: Option<u64>, route: Route, path: &str) -> RecordedRequest {
        RecordedRequest {
            at_ms: at,
            method: "POST".into(),
            path: path.into(),
            route: route.into(),
            headers: Default::default(),
            body: serde_json::Value::Null,
            body_len: 0,
            response_status: answered.map(|_| 200),
            answered_at_ms: answered,
            fault: None,
            response_len: 0,
        }
    }

    fn run(finish: serde_json::Value) -> RunRecord {
        RunRecord {
            id: "run-2".into(),
            ordinal: 2,
            initial: false,
            status: "succeeded".into(),
            body: String::new(),
            answer_to_question: None,
            events: serde_json::from_value(serde_json::json!([
                {"seq": 1, "type": "message", "at": "2026-12-06T00:00:00Z", "data": {}},
                {"seq": 2, "type": "output", "at": "2026-12-06T00:00:00Z", "data": {}}
            ]))
            .unwrap_or_else(|e| panic!("events: {e}")),
            finish: Some(serde_json::from_value(finish).unwrap_or_else(|e| panic!("finish: {e}"))),
            started_count: 1,
            finish_count: 1,
        }
    }

    #[test]
    fn lines_follow_the_answers_and_a_held_read_holds_nothing_back() {
        let mut log = RequestLog::default();
        let held = request(100, None, Route::Session, "/api/cli/sessions/s1?wait=30");
        let quick = request(
            200,
            Some(205),
            Route::Events,
            "/api/cli/workbench-runs/run-1/events",
        );
        let lines = log.lines(&[held.clone(), quick.clone()], &[]);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with(
                "    0.205s  runner  POST /api/cli/workbench-runs/run-1/events  200  (events, 5 ms)"
            ),
            "{lines:?}"
        );
        let mut held = held;
        held.response_status = Some(200);
        held.answered_at_ms = Some(900);
        let later = request(300, Some(400), Route::Events, "/x");
        let lines = log.lines(&[held, quick, later], &[]);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("    0.400s"), "{lines:?}");
        assert!(
            lines[1].contains("/api/cli/sessions/s1  200  (session, 800 ms)"),
            "{lines:?}"
        );
    }

    #[test]
    fn a_turn_is_summed_up_once_after_its_first_accepted_finish() {
        let mut log = RequestLog::default();
        let started = request(
            1_000,
            Some(1_002),
            Route::RunStarted,
            "/api/cli/workbench-runs/run-2",
        );
        let finish = request(
            5_200,
            Some(5_210),
            Route::Finish,
            "/api/cli/workbench-runs/run-2/finish",
        );
        let runs = [run(serde_json::json!({
            "status": "succeeded", "agentSessionId": null, "error": null, "usage": null,
            "result": {"name": "run-2", "branch": "session/x",
                "headSha": "1a2b3c4d5e6f70819a2b3c4d5e6f70819a2b3c4d", "pushed": true,
                "commits": 1, "filesChanged": 3, "insertions": 10, "deletions": 2}
        }))];
        let lines = log.lines(&[started.clone(), finish.clone()], &runs);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(
            lines[2],
            "    5.210s  turn    turn 2 (run-2) succeeded in 4.2 s · 2 events · pushed 1 commit to session/x at 1a2b3c4 (3 files, +10 -2)"
        );
        let again = request(
            6_000,
            Some(6_001),
            Route::Finish,
            "/api/cli/workbench-runs/run-2/finish",
        );
        let lines = log.lines(&[started, finish, again], &runs);
        assert_eq!(
            lines.len(),
            1,
            "a repeated finish is not summed up again: {lines:?}"
        );
    }
}
