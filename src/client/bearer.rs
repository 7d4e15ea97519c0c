//! The agent bearer (PROTOCOL.md 2.1) and its lifetime, computed once from
//! the coordinator's clock and then counted on the monotonic clock, so a
//! wrong sandbox clock cannot expire it early or keep it forever.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::secret::Secret;
use crate::timings::Timings;
use crate::wire::AgentTokenResponse;

/// Longest lifetime taken at face value (24 h); beyond it is "absurd".
const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);

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
            lifetime,
        }
    }

    /// When the bearer expires, if known.
    pub fn expires_at(&self) -> Option<Instant> {
        match self.lifetime {
            Lifetime::Known(d) => Some(self.obtained + d),
            Lifetime::Invalid => Some(self.obtained),
            Lifetime::Unknown => None,
        }
    }

    /// Whether it expires within `lead` from now (never, when unknown).
    pub fn expires_within(&self, lead: Duration) -> bool {
        self.expires_at()
            .is_some_and(|at| at.saturating_duration_since(Instant::now()) <= lead)
    }

    /// When the rotation refreshes it (PROTOCOL.md 4.1 step 3): 5 min before
    /// expiry, every 55 min with no expiry, never sooner than 30 s nor later
    /// than 6 h from now.
    pub fn refresh_at(&self, timings: &Timings) -> Instant {
        let now = Instant::now();
        let wanted = match self.lifetime {
            Lifetime::Known(d) => (self.obtained + d)
                .checked_sub(timings.rotation_lead)
                .unwrap_or(now),
            Lifetime::Invalid => now,
            Lifetime::Unknown => self.obtained + timings.rotation_default,
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

    #[test]
    fn unknown_lifetime_rotates_every_55_minutes() {
        let b = bearer(None, SystemTime::now());
        let t = Timings::default();
        let wait = b.refresh_at(&t).saturating_duration_since(Instant::now());
        assert!(wait > Duration::from_secs(54 * 60));
        assert!(!b.expires_within(Duration::from_secs(3600)));
    }
}
