//! The long-poll of the session read (PROTOCOL.md 2.4, "Long-poll of the
//! session read"): what a reader keeps from one read to the next (the
//! session answer's entity tag, whether the coordinator held the last
//! read), the headers it sends, and when its next read starts.

use std::time::{Duration, Instant};

use reqwest::RequestBuilder;
use reqwest::header::{ETAG, IF_NONE_MATCH};

use super::Reply;
use crate::timings::Timings;

pub use crate::wire::routes::{PREFER, PREFERENCE_APPLIED};
/// Two reads never start closer together than this (100 ms, scaled): a
/// coordinator that claims the preference and answers at once costs at most
/// ten reads a second.
pub const MIN_GAP: Duration = Duration::from_millis(100);

/// One reader's long-poll state: the interrupt watch of a turn, or one wait
/// between turns. A new one has no entity tag, so its first read is
/// answered at once.
#[derive(Debug, Default)]
pub struct LongPoll {
    etag: Option<String>,
    /// The last answer carried `Preference-Applied: wait`.
    held: bool,
    /// Some answer to this reader carried it: a read with `If-None-Match`
    /// may be held, and its timeout covers the wait.
    offered: bool,
    started: Option<Instant>,
}

impl LongPoll {
    /// A reader that has seen no answer yet.
    pub fn new() -> LongPoll {
        LongPoll::default()
    }

    /// The `Prefer: wait=N` value: `timings.session_wait` in whole seconds,
    /// at least 1 (RFC 7240 delta-seconds).
    pub fn wait_secs(timings: &Timings) -> u64 {
        timings.session_wait.as_secs().max(1)
    }

    /// Whether the next read may be held by the coordinator.
    pub fn may_hold(&self) -> bool {
        self.offered && self.etag.is_some()
    }

    /// `r` with `Prefer: wait=N` and, once an answer carried one,
    /// `If-None-Match` with its entity tag.
    pub(super) fn headers(&self, r: RequestBuilder, wait_secs: u64) -> RequestBuilder {
        let r = r.header(PREFER, format!("wait={wait_secs}"));
        match &self.etag {
            Some(tag) => r.header(IF_NONE_MATCH, tag.as_str()),
            None => r,
        }
    }

    /// Notes that a read starts now.
    pub(super) fn start(&mut self) {
        self.started = Some(Instant::now());
    }

    /// Notes an answer (`200`, or `304` unchanged): its entity tag and
    /// whether the coordinator applied the wait.
    pub(super) fn answered(&mut self, reply: &Reply) {
        self.held = reply
            .headers
            .get_all(PREFERENCE_APPLIED)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|p| p.trim().to_ascii_lowercase().starts_with("wait"))
            });
        self.offered |= self.held;
        if let Some(tag) = reply.headers.get(ETAG).and_then(|v| v.to_str().ok()) {
            self.etag = Some(tag.to_string());
        }
    }

    /// Notes a failed read (no answer, a refusal, a body that does not
    /// decode): the next read waits the tick and asks for the whole session.
    pub(super) fn failed(&mut self) {
        self.held = false;
        self.etag = None;
    }

    /// How long to wait before the next read after a successful one: at
    /// once after a held answer (no sooner than [`MIN_GAP`] after the last
    /// read started), else `tick`, as without the extension.
    pub fn delay(&self, tick: Duration, timings: &Timings) -> Duration {
        if !self.held {
            return tick;
        }
        let gap = crate::timings::scale(MIN_GAP, timings.scale);
        let since = self.started.map_or(gap, |t| t.elapsed());
        gap.saturating_sub(since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::StatusCode;
    use reqwest::header::{HeaderMap, HeaderValue};

    fn reply(status: u16, headers: &[(&'static str, &'static str)]) -> Reply {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(*k, HeaderValue::from_static(v));
        }
        Reply {
            status: StatusCode::from_u16(status).unwrap(),
            headers: map,
            body: Default::default(),
        }
    }

    #[test]
    fn the_tick_applies_unless_the_coordinator_held() {
        let t = Timings::default();
        let tick = Duration::from_secs(5);
        let mut p = LongPoll::new();
        assert!(!p.may_hold());
        assert_eq!(p.delay(tick, &t), tick);
        // A coordinator that ignores the preference: an ETag maybe, no
        // Preference-Applied: polling as without the extension.
        p.answered(&reply(200, &[("etag", "\"a\"")]));
        assert!(!p.may_hold());
        assert_eq!(p.delay(tick, &t), tick);
        p.start();
        p.answered(&reply(
            304,
            &[("etag", "\"a\""), ("preference-applied", "wait=30")],
        ));
        assert!(p.may_hold());
        assert!(p.delay(tick, &t) <= MIN_GAP);
        p.failed();
        assert_eq!(p.delay(tick, &t), tick);
        assert!(!p.may_hold(), "a failed read asks for the whole session");
    }
}
