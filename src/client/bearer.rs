//! The agent bearer (PROTOCOL.md 2.1) and its lifetime, computed once from
//! the coordinator's clock and then counted on the monotonic clock, so a
//! wrong sandbox clock cannot expire it early or keep it forever.
//!
//! A sandbox paused and restored breaks that count: the guest's monotonic
//! clock does not advance while the VM is paused, its wall clock jumps ahead
//! when it is restored. Each use of the bearer therefore compares the two
//! clocks' advance since the pull ([`Bearer::clock_jump`]): the bearer's age
//! is the larger of the two, and a wall clock ahead by more than
//! [`CLOCK_JUMP_TOLERANCE`] makes the bearer stale, refreshed before use.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::secret::Secret;
use crate::timings::Timings;
use crate::wire::AgentTokenResponse;

/// Longest lifetime taken at face value (24 h); beyond it is "absurd".
const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// How far the wall clock may run ahead of the monotonic clock since a pull
/// before the bearer counts as stale (PROTOCOL.md 2.1, "Clocks"): more than
/// a clock step of NTP, less than any bearer's refresh lead.
pub const CLOCK_JUMP_TOLERANCE: Duration = Duration::from_secs(30);

/// How long a bearer lives, as far as the runner can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    /// No `expiresAt`: rotated every 55 min.
    Unknown,
    /// `expiresAt` minus the coordinator's `Date` (or the local time).
    Known(Duration),
    /// Negative, zero or over 24 h: refresh at the earliest allowed.
    Invalid,
}

/// An agent bearer: the secret and when it was obtained.
#[derive(Clone, Debug)]
pub struct Bearer {
    /// The bearer value.
    pub token: Secret,
    /// When the response arrived (monotonic).
    pub obtained: Instant,
    /// When the response arrived (wall clock), to detect a pause.
    pub obtained_wall: SystemTime,
    /// Its lifetime from `obtained`.
    pub lifetime: Lifetime,
}

impl Bearer {
    /// Builds a bearer from a 2.1 answer that arrived now; `date` is the
    /// answer's `Date` header (the coordinator's clock), if any.
    pub fn from_response(response: AgentTokenResponse, date: Option<SystemTime>) -> Bearer {
        let now = date.unwrap_or_else(SystemTime::now);
        let lifetime = match response.expires_at.and_then(|e| e.epoch_ms()) {
            None => Lifetime::Unknown,
            Some(ms) => {
                let now_ms = now
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs_f64() * 1000.0)
                    .unwrap_or(0.0);
                let left = (ms - now_ms) / 1000.0;
                if left.is_finite() && left > 0.0 && left <= MAX_LIFETIME.as_secs_f64() {
                    Lifetime::Known(Duration::from_secs_f64(left))
                } else {
                    Lifetime::Invalid
                }
            }
        };
        Bearer {
            token: response.token,
            obtained: Instant::now(),
            obtained_wall: SystemTime::now(),
            lifetime,
        }
    }

    /// How far the wall clock has run ahead of the monotonic clock since the
    /// pull: the length of a pause the monotonic clock did not count (zero
    /// when the wall clock went back or kept pace).
    pub fn clock_jump(&self) -> Duration {
        let monotonic = self.obtained.elapsed();
        let wall = SystemTime::now()
            .duration_since(self.obtained_wall)
            .unwrap_or(Duration::ZERO);
        wall.saturating_sub(monotonic)
    }

    /// Whether the wall clock jumped ahead by more than
    /// [`CLOCK_JUMP_TOLERANCE`] since the pull (a pause and restore): the
    /// bearer must be refreshed before its next use.
    pub fn clock_jumped(&self) -> bool {
        self.clock_jump() > CLOCK_JUMP_TOLERANCE
    }

    /// The bearer's age: the monotonic clock's count since the pull plus
    /// any pause it missed ([`Bearer::clock_jump`]).
    pub fn age(&self) -> Duration {
        self.obtained.elapsed() + self.clock_jump()
    }

    /// How long it has left, if known (zero when invalid or past).
    pub fn remaining(&self) -> Option<Duration> {
        match self.lifetime {
            Lifetime::Known(d) => Some(d.saturating_sub(self.age())),
            Lifetime::Invalid => Some(Duration::ZERO),
            Lifetime::Unknown => None,
        }
    }

    /// When the bearer expires, if known (monotonic, pauses counted).
    pub fn expires_at(&self) -> Option<Instant> {
        self.remaining().map(|left| Instant::now() + left)
    }

    /// Whether it expires within `lead` from now; with no known expiry, only
    /// when the clocks jumped ([`Bearer::clock_jumped`]).
    pub fn expires_within(&self, lead: Duration) -> bool {
        if self.clock_jumped() {
            return true;
        }
        self.remaining().is_some_and(|left| left <= lead)
    }

    /// When the rotation refreshes it (PROTOCOL.md 4.1 step 3): 5 min before
    /// expiry, every 55 min with no expiry, never sooner than 30 s nor later
    /// than 6 h from now.
    pub fn refresh_at(&self, timings: &Timings) -> Instant {
        let now = Instant::now();
        let wanted = match self.remaining() {
            _ if self.clock_jumped() => now,
            Some(left) => now + left.saturating_sub(timings.rotation_lead),
            None => (now + timings.rotation_default)
                .checked_sub(self.age())
                .unwrap_or(now),
        };
        wanted.clamp(now + timings.rotation_min, now + timings.rotation_max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ExpiresAt;

    fn bearer(expires_ms: Option<f64>, date: SystemTime) -> Bearer {
        Bearer::from_response(
            AgentTokenResponse {
                token: "t".into(),
                expires_at: expires_ms.map(ExpiresAt::EpochMs),
            },
            Some(date),
        )
    }

    #[test]
    fn lifetime_uses_the_coordinator_clock() {
        // The coordinator says it is epoch+1000 s; the bearer expires at
        // epoch+1600 s: 10 minutes, whatever the local clock says.
        let date = UNIX_EPOCH + Duration::from_secs(1000);
        let b = bearer(Some(1_600_000.0), date);
        assert_eq!(b.lifetime, Lifetime::Known(Duration::from_secs(600)));
    }

    #[test]
    fn absurd_lifetimes_refresh_at_the_earliest() {
        let date = UNIX_EPOCH + Duration::from_secs(1000);
        assert_eq!(bearer(Some(0.0), date).lifetime, Lifetime::Invalid);
        assert_eq!(bearer(Some(1e15), date).lifetime, Lifetime::Invalid);
        let t = Timings::default();
        let b = bearer(Some(0.0), date);
        let wait = b.refresh_at(&t).saturating_duration_since(Instant::now());
        assert!(wait <= t.rotation_min && wait > t.rotation_min - Duration::from_secs(1));
    }

    /// A pause and restore, as the guest sees it: the wall clock of the pull
    /// is two hours behind now, the monotonic clock counted nothing.
    fn paused(mut b: Bearer, pause: Duration) -> Bearer {
        b.obtained_wall = SystemTime::now() - pause;
        b
    }

    #[test]
    fn a_pause_the_monotonic_clock_missed_makes_the_bearer_stale() {
        let t = Timings::default();
        let now = SystemTime::now();
        let in_an_hour = now.duration_since(UNIX_EPOCH).unwrap().as_millis() as f64 + 3.6e6;
        let fresh = bearer(Some(in_an_hour), now);
        assert!(!fresh.clock_jumped());
        assert!(!fresh.expires_within(t.idle_refresh_lead));
        for b in [
            paused(fresh.clone(), Duration::from_secs(2 * 3600)),
            paused(bearer(None, now), Duration::from_secs(2 * 3600)),
            paused(fresh.clone(), CLOCK_JUMP_TOLERANCE + Duration::from_secs(5)),
        ] {
            assert!(b.clock_jumped(), "{b:?}");
            assert!(b.expires_within(Duration::ZERO), "{b:?}");
            let wait = b.refresh_at(&t).saturating_duration_since(Instant::now());
            assert!(wait <= t.rotation_min, "{wait:?}");
        }
        // The age counts the pause: an hour's bearer paused 2 h has nothing left.
        let b = paused(fresh.clone(), Duration::from_secs(2 * 3600));
        assert!(b.age() >= Duration::from_secs(2 * 3600));
        assert_eq!(b.remaining(), Some(Duration::ZERO));
        // A short step of the wall clock is within the tolerance.
        let b = paused(fresh.clone(), Duration::from_secs(10));
        assert!(!b.clock_jumped());
        assert!(b.remaining().unwrap() < Duration::from_secs(3600 - 9));
        // A wall clock set back is no pause: the monotonic count stands.
        let mut back = fresh;
        back.obtained_wall = SystemTime::now() + Duration::from_secs(3600);
        assert_eq!(back.clock_jump(), Duration::ZERO);
        assert!(!back.expires_within(t.idle_refresh_lead));
    }

    #[test]
    fn unknown_lifetime_rotates_every_55_minutes() {
        let b = bearer(None, SystemTime::now());
        let t = Timings::default();
        let wait = b.refresh_at(&t).saturating_duration_since(Instant::now());
        assert!(wait > Duration::from_secs(54 * 60));
        assert!(!b.expires_within(Duration::from_secs(3600)));
    }
}
