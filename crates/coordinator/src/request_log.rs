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

use std::collections::{BTreeMap, HashSet};

use crate::state::{RecordedRequest, RunRecord, Target};
use crate::text::printable;
use crate::wire::routes::Route;
use crate::wire::summary::{TurnFacts, turn_line};

/// Which requests have been printed.
#[derive(Default)]
pub(crate) struct RequestLog {
    /// Requests before this index were either printed or are in flight.
    seen: usize,
    /// Requests not answered when last looked at, by index.
    in_flight: Vec<usize>,
    /// When each run's first accepted `run_started` arrived.
    started: BTreeMap<String, u64>,
    /// Runs whose summary was printed (a repeated `finish` is idempotent).
    summarized: HashSet<String>,
}

impl RequestLog {
    /// The lines for the requests answered since the last call, in the
    /// order of their answers: `c`'s requests from the first not seen, the
    /// ones in flight looked up again by index, a run only for its seal
    /// (a copy of the whole state at every change cost a long session's
    /// coordinator seconds of CPU).
    pub(crate) fn next_lines(&mut self, c: &crate::Coordinator) -> Vec<String> {
        let new = c.requests_since(self.seen);
        let in_flight: Vec<(usize, RecordedRequest)> = self
            .in_flight
            .iter()
            .filter_map(|&i| Some((i, c.request(i)?)))
            .collect();
        self.lines(new, in_flight, |id| c.run(id))
    }

    /// [`RequestLog::next_lines`] over `new` (from index `seen` on) and the
    /// requests in flight as they are now.
    fn lines(
        &mut self,
        new: Vec<RecordedRequest>,
        in_flight: Vec<(usize, RecordedRequest)>,
        run: impl Fn(&str) -> Option<RunRecord>,
    ) -> Vec<String> {
        let mut ready = Vec::new();
        let mut still = Vec::new();
        let first_new = self.seen;
        self.seen += new.len();
        let all = in_flight
            .into_iter()
            .chain(new.into_iter().enumerate().map(|(k, r)| (first_new + k, r)));
        for (i, r) in all {
            if answered(&r) {
                ready.push(r);
            } else {
                still.push(i);
            }
        }
        self.in_flight = still;
        ready.sort_by_key(|r| r.answered_at_ms.unwrap_or(r.at_ms));
        let mut lines = Vec::new();
        for r in &ready {
            if r.route == Route::RunStarted
                && accepted(r)
                && let Some(id) = run_id_of(&r.path, None)
            {
                self.started.entry(id.to_string()).or_insert(r.at_ms);
            }
            lines.push(printable(&request_line(r)).into_owned());
            if let Some(line) = self.turn_summary(r, &run) {
                lines.push(printable(&line).into_owned());
            }
        }
        lines
    }

    /// The turn's line after its first accepted `finish`.
    fn turn_summary(
        &mut self,
        r: &RecordedRequest,
        run: &impl Fn(&str) -> Option<RunRecord>,
    ) -> Option<String> {
        if r.route != Route::Finish || !accepted(r) {
            return None;
        }
        let run = run(run_id_of(&r.path, Some("finish"))?)?;
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
            took: self
                .started
                .get(&run.id)
                .map(|&at| std::time::Duration::from_millis(answered.saturating_sub(at))),
        };
        Some(format!(
            "{}  turn    {}",
            seconds(answered),
            turn_line(&facts, finish)
        ))
    }
}

/// Answered, or dropped by a fault: the server stamps both when it is done
/// with the request (a delayed or failing fault is answered later).
fn answered(r: &RecordedRequest) -> bool {
    r.answered_at_ms.is_some()
}

fn accepted(r: &RecordedRequest) -> bool {
    r.response_status.is_some_and(|s| (200..300).contains(&s))
}

/// `    4.213s  runner  POST /api/cli/workbench-runs/run-2/finish  200  (finish, 3 ms)`:
/// when answered, who (`dev` for the dev API, `runner` for every other
/// route: the sandbox's), method, path without its query, the answer
/// (`dropped` by a fault), the route and the time it took.
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

/// The run id of `…/workbench-runs/{runId}` followed by `tail`, if any.
fn run_id_of<'a>(path: &'a str, tail: Option<&str>) -> Option<&'a str> {
    let path = path.split('?').next()?;
    let mut segments = path.rsplit('/');
    if let Some(tail) = tail {
        (segments.next()? == tail).then_some(())?;
    }
    segments.next()
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
            traceparent: None,
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
        let lines = log.lines(vec![held.clone(), quick], Vec::new(), |_| None);
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
        let lines = log.lines(vec![later], vec![(0, held)], |_| None);
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
        let lookup = |id: &str| runs.iter().find(|r| r.id == id).cloned();
        let lines = log.lines(vec![started, finish], Vec::new(), lookup);
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
        let lines = log.lines(vec![again], Vec::new(), lookup);
        assert_eq!(
            lines.len(),
            1,
            "a repeated finish is not summed up again: {lines:?}"
        );
    }

    #[test]
    fn a_delayed_fault_is_printed_when_answered_and_control_characters_are_escaped() {
        let mut log = RequestLog::default();
        let mut delayed = request(
            100,
            None,
            Route::RunStarted,
            "/api/cli/workbench-runs/run-1",
        );
        delayed.fault = Some(
            serde_json::from_value(serde_json::json!({"route": "run-started", "delayMs": 1500}))
                .unwrap_or_else(|e| panic!("fault: {e}")),
        );
        let lines = log.lines(vec![delayed.clone()], Vec::new(), |_| None);
        assert!(lines.is_empty(), "printed at arrival: {lines:?}");
        delayed.response_status = Some(200);
        delayed.answered_at_ms = Some(1_602);
        let evil = request(
            1_700,
            Some(1_701),
            Route::Events,
            "/api/\x1b]0;T\x07\u{9b}41m\nFAKE  9.9s",
        );
        let lines = log.lines(vec![evil], vec![(0, delayed)], |_| None);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].contains("  200  (run-started, 1502 ms)"),
            "{lines:?}"
        );
        assert!(
            lines[1].contains("/api/\\u{1b}]0;T\\u{7}\\u{9b}41m\\u{a}FAKE"),
            "{lines:?}"
        );
    }
}
