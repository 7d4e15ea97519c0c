//! Every duration of the contract in one value, so that tests can shrink them
//! all at once (`HOSTED_BOOT_TEST_TIME_SCALE`) while production keeps the
//! numbers of PROTOCOL.md. The retry table's attempts and backoffs are
//! constants at the routes (`client::retry::Policy`), scaled by
//! [`Timings::scale`] where they are used.

use std::time::Duration;

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
    /// How long the runner asks a coordinator to hold a session read
    /// (`Prefer: wait=30`, the long-poll of PROTOCOL.md 2.4).
    pub session_wait: Duration,
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
    /// Bound on the agent state's save after a turn (30 s, 2.7): the CLI's
    /// export where it has one, the save's attempts.
    pub agent_state_bound: Duration,
    /// Checkpoints on notice start at most this often (30 s, 4.5
    /// "Checkpoint"): notices meanwhile are coalesced into one, run when it
    /// has passed.
    pub checkpoint_interval: Duration,
    /// The factor every duration was scaled by (`HOSTED_BOOT_TEST_TIME_SCALE`;
    /// 1.0 is the contract). The retry policies are constants of
    /// `client::retry::Policy`, scaled by this where they are used.
    pub scale: f64,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            request_timeout: REQUEST_TIMEOUT,
            git_stall: Duration::from_secs(30),
            interrupt_poll: Duration::from_secs(5),
            idle_poll: Duration::from_secs(5),
            session_wait: Duration::from_secs(30),
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
            agent_state_bound: Duration::from_secs(30),
            checkpoint_interval: Duration::from_secs(30),
            scale: 1.0,
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
    /// harvest bounds, the workspace sync's and the agent state's bound are
    /// not scaled below
    /// [`MIN_SCALED_HARVEST_BOUND`], for the same reason.
    pub fn scaled(self, factor: f64) -> Self {
        let s = |d| scale(d, factor);
        Timings {
            request_timeout: scale_timeout(self.request_timeout, factor),
            git_stall: scale_timeout(self.git_stall, factor),
            interrupt_poll: s(self.interrupt_poll),
            idle_poll: s(self.idle_poll),
            session_wait: s(self.session_wait),
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
            agent_state_bound: s(self.agent_state_bound)
                .max(MIN_SCALED_HARVEST_BOUND.min(self.agent_state_bound)),
            checkpoint_interval: s(self.checkpoint_interval),
            scale: self.scale * factor,
        }
    }
}

/// Floor of the scaled per-attempt request timeout (2 s).
pub const MIN_SCALED_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Floor of the scaled harvest bounds (10 s): a harvest is a credential
/// helper process and up to four git requests, which a debug build on a
/// loaded machine does not finish in a scaled 500 ms.
pub const MIN_SCALED_HARVEST_BOUND: Duration = Duration::from_secs(10);

/// The per-attempt timeout of every coordinator request (10 s, PROTOCOL.md
/// section 2): `Timings::request_timeout` and the timeout of every
/// coordinator retry policy.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// `d` multiplied by `factor` (> 0); 1.0 leaves it exact.
pub fn scale(d: Duration, factor: f64) -> Duration {
    if factor == 1.0 {
        return d;
    }
    Duration::from_secs_f64(d.as_secs_f64() * factor)
}

/// A timeout multiplied by `factor`, never below
/// [`MIN_SCALED_REQUEST_TIMEOUT`] (or `d` itself when shorter): see
/// [`Timings::scaled`].
pub fn scale_timeout(d: Duration, factor: f64) -> Duration {
    scale(d, factor).max(MIN_SCALED_REQUEST_TIMEOUT.min(d))
}

/// Parses a duration written `500ms`, `10s`, `2m` or `1h`.
///
/// Errors: the value and humantime's reason.
pub fn parse_duration(text: &str) -> Result<Duration, InvalidDuration> {
    humantime::parse_duration(text.trim()).map_err(|error| InvalidDuration {
        text: crate::text::clip(text, 80),
        error,
    })
}

/// A value that is not a duration; the message names it and the accepted
/// forms.
#[derive(Debug, thiserror::Error)]
#[error("invalid duration {text:?} ({error}); write it like 500ms, 10s or 2m")]
pub struct InvalidDuration {
    /// The value (cut at 80 characters).
    pub text: String,
    /// humantime's reason.
    pub error: humantime::DurationError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_the_documented_forms() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(
            parse_duration("ten")
                .unwrap_err()
                .to_string()
                .contains("\"ten\"")
        );
    }

    #[test]
    fn scaling_keeps_the_timeout_floor() {
        let t = Timings::default().scaled(0.02);
        assert_eq!(t.interrupt_poll, Duration::from_millis(100));
        assert_eq!(t.scale, 0.02);
        assert_eq!(t.request_timeout, Duration::from_secs(2));
        // The stall bound keeps the request timeout's floor (2 s).
        assert_eq!(t.git_stall, Duration::from_secs(2));
        assert_eq!(Timings::default().git_stall, Duration::from_secs(30));
    }
}
