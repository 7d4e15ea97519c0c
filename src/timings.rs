//! Every duration of the contract in one value, so that tests can shrink them
//! all at once (`HOSTED_BOOT_TEST_TIME_SCALE`) while production keeps the
//! numbers of PROTOCOL.md.

use std::time::Duration;

/// Attempts and backoff of one call class (PROTOCOL.md section 2, the table
/// under "Retry rule"). The wait before retry n is `base * 2^n` with up to
/// ±20 % jitter, then capped at `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts, the first one included (at least 1).
    pub attempts: u32,
    /// Wait before the first retry.
    pub base: Duration,
    /// Longest wait between two attempts (also caps `Retry-After`).
    pub cap: Duration,
}

impl RetryPolicy {
    /// One attempt, no retry (best-effort statuses).
    pub const ONCE: RetryPolicy = RetryPolicy {
        attempts: 1,
        base: Duration::ZERO,
        cap: Duration::ZERO,
    };

    const fn new(attempts: u32, base_ms: u64, cap_ms: u64) -> Self {
        RetryPolicy {
            attempts,
            base: Duration::from_millis(base_ms),
            cap: Duration::from_millis(cap_ms),
        }
    }

    /// The wait before retry `n` (0-based), without jitter.
    pub fn backoff(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(30)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    fn scaled(self, f: f64) -> Self {
        RetryPolicy {
            attempts: self.attempts,
            base: scale(self.base, f),
            cap: scale(self.cap, f),
        }
    }
}

/// The retry classes of PROTOCOL.md section 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicies {
    /// Agent token at boot (2.1): 10 attempts, 500 ms, cap 5 s.
    pub agent_token_boot: RetryPolicy,
    /// Agent token refresh and re-pull on 401: 3 attempts, 250 ms, cap 2 s.
    pub agent_token_refresh: RetryPolicy,
    /// Env bundle, session at boot, repo token: 5 attempts, 250 ms, cap 4 s.
    pub boot_fetch: RetryPolicy,
    /// Required acknowledgements, `run_started`, `finish`, cursor: 5, 250 ms, 4 s.
    pub required: RetryPolicy,
    /// Events: base 250 ms, cap 5 s, attempts bounded by the flush deadline.
    pub events: RetryPolicy,
    /// The credential helper's own calls: 3 attempts, 250 ms, cap 2 s.
    pub credential_helper: RetryPolicy,
    /// `git push` in the harvest (4.5): 3 attempts, 1 s, cap 4 s.
    pub harvest_push: RetryPolicy,
    /// The clone of the session branch (4 step 5): 4 attempts, 1 s, cap 8 s.
    pub clone: RetryPolicy,
}

impl Default for RetryPolicies {
    fn default() -> Self {
        RetryPolicies {
            agent_token_boot: RetryPolicy::new(10, 500, 5_000),
            agent_token_refresh: RetryPolicy::new(3, 250, 2_000),
            boot_fetch: RetryPolicy::new(5, 250, 4_000),
            required: RetryPolicy::new(5, 250, 4_000),
            events: RetryPolicy::new(u32::MAX, 250, 5_000),
            credential_helper: RetryPolicy::new(3, 250, 2_000),
            harvest_push: RetryPolicy::new(3, 1_000, 4_000),
            clone: RetryPolicy::new(4, 1_000, 8_000),
        }
    }
}

/// Every duration the runner waits for. `Timings::default()` is the contract.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timings {
    /// Per-attempt timeout of every coordinator request (10 s).
    pub request_timeout: Duration,
    /// A git transfer (clone, the harvest's fetch and push) that receives no
    /// byte for this long is aborted (30 s, PROTOCOL.md section 2, the
    /// clone row): a failed attempt.
    pub git_stall: Duration,
    /// Interrupt watch tick during a turn (5 s, PROTOCOL.md 4.1 step 3).
    pub interrupt_poll: Duration,
    /// Session read between turns (5 s, 4.2).
    pub idle_poll: Duration,
    /// Longest wait between failed idle reads (45 s, 4.2).
    pub idle_backoff_cap: Duration,
    /// Between turns, refresh the bearer when it expires within this (60 s).
    pub idle_refresh_lead: Duration,
    /// Rotation: refresh this long before `expiresAt` (5 min).
    pub rotation_lead: Duration,
    /// Rotation period when the bearer has no expiry (55 min).
    pub rotation_default: Duration,
    /// Rotation never sooner than this (30 s).
    pub rotation_min: Duration,
    /// Rotation never later than this (6 h).
    pub rotation_max: Duration,
    /// A failed rotation retries after this (5 min).
    pub rotation_retry: Duration,
    /// SIGINT → SIGKILL for an interrupt request (`--interrupt-grace`, 10 s).
    pub interrupt_grace: Duration,
    /// SIGINT → SIGKILL on a stop signal (5 s, 4.4).
    pub stop_grace: Duration,
    /// The whole graceful stop (`--stop-budget`, 25 s, 4.4).
    pub stop_budget: Duration,
    /// Share of the stop budget for flushing events (5 s, 4.4).
    pub stop_flush: Duration,
    /// After the agent exits, read its pipes for at most this (2 s).
    pub pipe_drain: Duration,
    /// Events are sent at least this often while they flow (250 ms).
    pub event_batch_interval: Duration,
    /// Deadline of the event flush at turn end (30 s).
    pub event_flush_deadline: Duration,
    /// Bound on the harvest after a turn (60 s, 4.5).
    pub harvest_bound: Duration,
    /// The harvest's share of a graceful stop (10 s, 4.4).
    pub stop_harvest: Duration,
    /// Bound on the workspace sync before a turn (30 s, 4.1 step 3, 4.5).
    pub workspace_sync_bound: Duration,
    /// Attempts and backoff per call class.
    pub retry: RetryPolicies,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            request_timeout: Duration::from_secs(10),
            git_stall: Duration::from_secs(30),
            interrupt_poll: Duration::from_secs(5),
            idle_poll: Duration::from_secs(5),
            idle_backoff_cap: Duration::from_secs(45),
            idle_refresh_lead: Duration::from_secs(60),
            rotation_lead: Duration::from_secs(5 * 60),
            rotation_default: Duration::from_secs(55 * 60),
            rotation_min: Duration::from_secs(30),
            rotation_max: Duration::from_secs(6 * 3600),
            rotation_retry: Duration::from_secs(5 * 60),
            interrupt_grace: Duration::from_secs(10),
            stop_grace: Duration::from_secs(5),
            stop_budget: Duration::from_secs(25),
            stop_flush: Duration::from_secs(5),
            pipe_drain: Duration::from_secs(2),
            event_batch_interval: Duration::from_millis(250),
            event_flush_deadline: Duration::from_secs(30),
            harvest_bound: Duration::from_secs(60),
            stop_harvest: Duration::from_secs(10),
            workspace_sync_bound: Duration::from_secs(30),
            retry: RetryPolicies::default(),
        }
    }
}

impl Timings {
    /// Every duration multiplied by `factor` (attempt counts unchanged).
    /// Used for `HOSTED_BOOT_TEST_TIME_SCALE`; `factor` must be > 0.
    ///
    /// The per-attempt request timeout and the git stall bound are not
    /// scaled below [`MIN_SCALED_REQUEST_TIMEOUT`]: a debug build's git
    /// server on a loaded machine needs that long, and a timeout that fires
    /// on a healthy request would make tests flaky rather than fast. The
    /// harvest bounds and the workspace sync's bound are not scaled below
    /// [`MIN_SCALED_HARVEST_BOUND`], for the same reason.
    pub fn scaled(self, factor: f64) -> Self {
        let s = |d| scale(d, factor);
        let r = self.retry;
        Timings {
            request_timeout: s(self.request_timeout)
                .max(MIN_SCALED_REQUEST_TIMEOUT.min(self.request_timeout)),
            git_stall: s(self.git_stall).max(MIN_SCALED_REQUEST_TIMEOUT.min(self.git_stall)),
            interrupt_poll: s(self.interrupt_poll),
            idle_poll: s(self.idle_poll),
            idle_backoff_cap: s(self.idle_backoff_cap),
            idle_refresh_lead: s(self.idle_refresh_lead),
            rotation_lead: s(self.rotation_lead),
            rotation_default: s(self.rotation_default),
            rotation_min: s(self.rotation_min),
            rotation_max: s(self.rotation_max),
            rotation_retry: s(self.rotation_retry),
            interrupt_grace: s(self.interrupt_grace),
            stop_grace: s(self.stop_grace),
            stop_budget: s(self.stop_budget),
            stop_flush: s(self.stop_flush),
            pipe_drain: s(self.pipe_drain),
            event_batch_interval: s(self.event_batch_interval),
            event_flush_deadline: s(self.event_flush_deadline),
            harvest_bound: s(self.harvest_bound)
                .max(MIN_SCALED_HARVEST_BOUND.min(self.harvest_bound)),
            stop_harvest: s(self.stop_harvest).max(MIN_SCALED_HARVEST_BOUND.min(self.stop_harvest)),
            workspace_sync_bound: s(self.workspace_sync_bound)
                .max(MIN_SCALED_HARVEST_BOUND.min(self.workspace_sync_bound)),
            retry: RetryPolicies {
                agent_token_boot: r.agent_token_boot.scaled(factor),
                agent_token_refresh: r.agent_token_refresh.scaled(factor),
                boot_fetch: r.boot_fetch.scaled(factor),
                required: r.required.scaled(factor),
                events: r.events.scaled(factor),
                credential_helper: r.credential_helper.scaled(factor),
                harvest_push: r.harvest_push.scaled(factor),
                clone: r.clone.scaled(factor),
            },
        }
    }
}

/// Floor of the scaled per-attempt request timeout (2 s).
pub const MIN_SCALED_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Floor of the scaled harvest bounds (10 s): a harvest is a credential
/// helper process and up to four git requests, which a debug build on a
/// loaded machine does not finish in a scaled 500 ms.
pub const MIN_SCALED_HARVEST_BOUND: Duration = Duration::from_secs(10);

fn scale(d: Duration, factor: f64) -> Duration {
    Duration::from_secs_f64(d.as_secs_f64() * factor)
}

/// Parses a duration written `500ms`, `10s`, `2m` or `1h`.
///
/// Errors: a message naming the value and the accepted forms.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("invalid duration {text:?} ({e}); write it like 500ms, 10s or 2m"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let p = RetryPolicies::default().required;
        let waits: Vec<u64> = (0..6).map(|n| p.backoff(n).as_millis() as u64).collect();
        assert_eq!(waits, vec![250, 500, 1000, 2000, 4000, 4000]);
        assert_eq!(p.backoff(200), Duration::from_secs(4));
    }

    #[test]
    fn durations_parse_in_the_documented_forms() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("ten").unwrap_err().contains("\"ten\""));
    }

    #[test]
    fn scaling_keeps_attempts() {
        let t = Timings::default().scaled(0.02);
        assert_eq!(t.interrupt_poll, Duration::from_millis(100));
        assert_eq!(t.retry.agent_token_boot.attempts, 10);
        assert_eq!(t.retry.clone.attempts, 4);
        assert_eq!(t.retry.clone.base, Duration::from_millis(20));
        // The stall bound keeps the request timeout's floor (2 s).
        assert_eq!(t.git_stall, Duration::from_secs(2));
        assert_eq!(Timings::default().git_stall, Duration::from_secs(30));
    }
}
