//! The one retry rule of PROTOCOL.md section 2 and the one engine that runs
//! it, for every route: coordinator calls ([`send`]), the clone and the
//! harvest's git work ([`run`], [`run_blocking`]).
//!
//! Retryable: no HTTP response (connect error, reset, timeout), `429`, any
//! `5xx` ([`retryable_status`]). Every other status outside 2xx (3xx
//! included: redirects are never followed) is a verdict. The wait before
//! retry n is `base * 2^n` with ±20 % jitter, then capped (jitter never takes
//! a wait past the cap); `Retry-After` on 429/503 replaces it, up to the cap
//! ([`wait`]).
//!
//! Each route states its [`Policy`] where it is called (a constant per row of
//! the retry table); the engine counts the attempts, waits through a
//! [`Pace`] (real time and a random jitter in production, a recorder in
//! tests) and gives up as the policy says. The operation decides what one
//! attempt came to ([`Attempt`]): the engine never looks inside it.
//!
//! Every 2xx body is read through its route's size cap ([`caps`]), counted
//! as it streams: never more than the cap is held, and an answer over it is
//! [`CallError::TooLarge`], a verdict (repeating the read gives the same
//! body).

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::{RequestBuilder, StatusCode, header::HeaderMap};
use tracing::Instrument as _;

use crate::timings::{REQUEST_TIMEOUT, scale, scale_timeout};

/// How many attempts a [`Policy`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempts {
    /// At most this many, the first one included (0 counts as 1).
    AtMost(u32),
    /// No limit: the caller cuts the call when its own bound ends. The text
    /// says when, for the log (the events route: "the turn ends, then its
    /// flush deadline").
    Until(&'static str),
}

/// One row of the retry table of PROTOCOL.md section 2: attempts, the
/// backoff's base and cap, and each attempt's timeout. The constants are the
/// contract's numbers; [`Policy::scaled`] shrinks them for
/// `HOSTED_BOOT_TEST_TIME_SCALE` (the client scales the ones it is given).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// How many attempts.
    pub attempts: Attempts,
    /// The wait before the first retry; it doubles for each later one.
    pub base: Duration,
    /// The longest wait between two attempts (it caps `Retry-After` too).
    pub cap: Duration,
    /// Each attempt's timeout (headers and body) for a coordinator request
    /// ([`crate::timings::REQUEST_TIMEOUT`]); `None` for git work, whose
    /// attempt is several requests bounded by the transport's request
    /// timeout and stall bound, and by the caller's time bound.
    pub timeout: Option<Duration>,
}

impl Policy {
    const fn http(attempts: u32, base_ms: u64, cap_ms: u64) -> Policy {
        Policy {
            attempts: Attempts::AtMost(attempts),
            base: Duration::from_millis(base_ms),
            cap: Duration::from_millis(cap_ms),
            timeout: Some(REQUEST_TIMEOUT),
        }
    }

    const fn git(attempts: u32, base_ms: u64, cap_ms: u64) -> Policy {
        Policy {
            timeout: None,
            ..Policy::http(attempts, base_ms, cap_ms)
        }
    }

    /// One attempt, no retry: `hosted-boot check` (one attempt per route,
    /// PROTOCOL.md 9) and the acknowledgements of a graceful stop (4.4).
    pub const ONCE: Policy = Policy::http(1, 0, 0);
    /// Agent token at boot (2.1): 10 attempts, 500 ms doubling to 5 s (the
    /// coordinator may still be arming and answer 503 until it is).
    pub const AGENT_TOKEN_BOOT: Policy = Policy::http(10, 500, 5_000);
    /// Agent token refresh, and the re-pull after a `401`: 3 attempts, 250 ms
    /// doubling to 2 s.
    pub const AGENT_TOKEN_REFRESH: Policy = Policy::http(3, 250, 2_000);
    /// Env bundle, session at boot, repo token (4 step 3): 5 attempts, 250 ms
    /// doubling to 4 s.
    pub const BOOT_FETCH: Policy = Policy::http(5, 250, 4_000);
    /// Required acknowledgements (2.2), `run_started`, `finish`, the events
    /// cursor (2.6): 5 attempts, 250 ms doubling to 4 s.
    pub const REQUIRED: Policy = Policy::http(5, 250, 4_000);
    /// Best-effort statuses `complete`, `failed` (2.2): one attempt.
    pub const BEST_EFFORT: Policy = Policy::ONCE;
    /// Events (2.6): no attempt limit, 250 ms doubling to 5 s; the sender
    /// cuts the post when the turn's flush deadline passes.
    pub const EVENTS: Policy = Policy {
        attempts: Attempts::Until("the turn ends, then its flush deadline"),
        ..Policy::http(1, 250, 5_000)
    };
    /// The interrupt watch read and the idle read: one attempt per tick (the
    /// tick is the retry).
    pub const PER_TICK: Policy = Policy::ONCE;
    /// The agent state's load and save (2.7): 3 attempts, 250 ms doubling
    /// to 2 s. Neither is required: a failed load runs the turn as without
    /// a state, a failed save leaves the last one.
    pub const AGENT_STATE: Policy = Policy::http(3, 250, 2_000);
    /// The credential helper's own calls (agent token, repo token): 3
    /// attempts, 250 ms doubling to 2 s.
    pub const CREDENTIAL_HELPER: Policy = Policy::http(3, 250, 2_000);
    /// `git push` in the harvest (4.5): 3 attempts, 1 s doubling to 4 s.
    pub const HARVEST_PUSH: Policy = Policy::git(3, 1_000, 4_000);
    /// The fetch, and a push of local work, of the workspace sync before a
    /// turn (4.5): 3 attempts each, 1 s doubling to 4 s.
    pub const WORKSPACE_SYNC: Policy = Policy::git(3, 1_000, 4_000);
    /// The clone of the session branch (4 step 5): 4 attempts, 1 s doubling
    /// to 8 s; a transfer that brings no byte for 30 s is a failed attempt.
    pub const CLONE: Policy = Policy::git(4, 1_000, 8_000);

    /// This policy with its durations multiplied by `factor` (> 0; attempts
    /// unchanged): `HOSTED_BOOT_TEST_TIME_SCALE`, as
    /// [`crate::timings::Timings::scaled`] does (the timeout keeps its floor).
    pub fn scaled(self, factor: f64) -> Policy {
        Policy {
            attempts: self.attempts,
            base: scale(self.base, factor),
            cap: scale(self.cap, factor),
            timeout: self.timeout.map(|t| scale_timeout(t, factor)),
        }
    }

    /// The wait before retry `n` (0-based) without jitter: `base * 2^n`,
    /// capped.
    pub fn backoff(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(30)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// Whether an HTTP status is worth repeating under the retry rule: `429` or
/// a `5xx`. Any other non-2xx status is a verdict.
pub fn retryable_status(status: u16) -> bool {
    status == 429 || (500..600).contains(&status)
}

/// Whether a status's `Retry-After` replaces the backoff: `429` and `503`.
pub fn honours_retry_after(status: u16) -> bool {
    status == 429 || status == 503
}

/// The wait before retry `n` (0-based): `Retry-After` when the answer gave
/// one (up to the cap, no jitter), else `base * 2^n` jittered by
/// `0.8 + 0.4 * draw` (`draw` in [0, 1]) and then capped, so jitter never
/// takes a wait past the cap.
pub fn wait(policy: &Policy, n: u32, retry_after: Option<Duration>, draw: f64) -> Duration {
    if let Some(d) = retry_after {
        return d.min(policy.cap);
    }
    let factor = 0.8 + 0.4 * draw.clamp(0.0, 1.0);
    // Whole microseconds: a draw of 0.5 gives the backoff exactly.
    let micros = (policy.backoff(n).as_micros() as f64 * factor).round();
    Duration::from_micros(micros as u64).min(policy.cap)
}

/// What one attempt of an operation came to.
#[derive(Debug)]
pub enum Attempt<T, E> {
    /// The end: returned as is (a success, or a verdict the operation
    /// carries in `T`, e.g. a `Result`).
    Done(T),
    /// A failure the retry rule repeats. `retry_after`: the answer's
    /// `Retry-After` (429/503), which replaces the backoff up to the cap.
    Retry {
        /// What went wrong, for the log and the final error.
        error: E,
        /// The server's `Retry-After`, if it sent one.
        retry_after: Option<Duration>,
    },
}

/// Why the engine stopped repeating a failing operation.
#[derive(Debug, PartialEq, Eq)]
pub enum GaveUp<E> {
    /// Every attempt the policy allows failed.
    Exhausted {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: E,
    },
    /// The next wait would end past the caller's deadline ([`run_blocking`]).
    OutOfTime {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: E,
    },
}

/// How the engine waits and where its jitter comes from. Production uses
/// [`REAL`]; tests pass one that records each wait and fixes the draw, so no
/// test sleeps.
pub trait Pace: Send + Sync {
    /// Waits `wait` on the async runtime.
    fn sleep(&self, wait: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// Waits `wait` on this thread (git work on the blocking pool).
    fn sleep_blocking(&self, wait: Duration);
    /// The jitter's draw, in [0, 1] (0: 80 % of the backoff, 1: 120 %).
    fn draw(&self) -> f64;
}

/// Real time ([`tokio::time::sleep`], [`std::thread::sleep`]) and a uniform
/// random draw.
#[derive(Debug)]
pub struct RealPace;

/// The production [`Pace`].
pub static REAL: RealPace = RealPace;

impl Pace for RealPace {
    fn sleep(&self, wait: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(tokio::time::sleep(wait))
    }

    fn sleep_blocking(&self, wait: Duration) {
        std::thread::sleep(wait);
    }

    fn draw(&self) -> f64 {
        fastrand::f64()
    }
}

/// A [`Pace`] for tests: records every wait instead of sleeping, and draws
/// the same jitter every time.
#[cfg(test)]
#[derive(Debug)]
pub(crate) struct Recorder {
    waits: std::sync::Mutex<Vec<Duration>>,
    draw: f64,
}

#[cfg(test)]
impl Recorder {
    /// A recorder whose jitter draw is always `draw` (0.5: no jitter).
    pub(crate) fn new(draw: f64) -> std::sync::Arc<Recorder> {
        std::sync::Arc::new(Recorder {
            waits: std::sync::Mutex::new(Vec::new()),
            draw,
        })
    }

    /// The waits so far, in milliseconds, and forgets them.
    pub(crate) fn take_ms(&self) -> Vec<u64> {
        let mut waits = self.waits.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *waits)
            .iter()
            .map(|w| w.as_millis() as u64)
            .collect()
    }

    fn record(&self, wait: Duration) {
        self.waits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(wait);
    }
}

#[cfg(test)]
impl Pace for Recorder {
    fn sleep(&self, wait: Duration) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        self.record(wait);
        Box::pin(std::future::ready(()))
    }

    fn sleep_blocking(&self, wait: Duration) {
        self.record(wait);
    }

    fn draw(&self) -> f64 {
        self.draw
    }
}

/// The decision code both runners share: counts failed attempts and says
/// how long to wait before the next, or why to give up.
struct Schedule<'a> {
    call: &'a str,
    policy: Policy,
    deadline: Option<Instant>,
    failed: u32,
}

/// Why [`Schedule::after_failure`] says stop.
enum Stop {
    Exhausted,
    OutOfTime,
}

impl Schedule<'_> {
    /// After a failed attempt (`error`, for the log): the wait before the
    /// next one, logged, or why to stop.
    fn after_failure(
        &mut self,
        error: &dyn std::fmt::Display,
        retry_after: Option<Duration>,
        draw: f64,
    ) -> Result<Duration, Stop> {
        let n = self.failed;
        self.failed = self.failed.saturating_add(1);
        if let Attempts::AtMost(max) = self.policy.attempts
            && self.failed >= max.max(1)
        {
            return Err(Stop::Exhausted);
        }
        let wait = wait(&self.policy, n, retry_after, draw);
        if self.deadline.is_some_and(|d| Instant::now() + wait >= d) {
            return Err(Stop::OutOfTime);
        }
        let (call, attempt, wait_ms) = (self.call, self.failed, wait.as_millis() as u64);
        match self.policy.attempts {
            Attempts::AtMost(of) => {
                tracing::warn!(call, attempt, of, wait_ms, error = %error, "call failed; retrying");
            }
            Attempts::Until(until) => {
                tracing::warn!(call, attempt, until, wait_ms, error = %error, "call failed; retrying");
            }
        }
        Ok(wait)
    }

    fn gave_up<E>(&self, stop: Stop, last: E) -> GaveUp<E> {
        let attempts = self.failed;
        match stop {
            Stop::Exhausted => GaveUp::Exhausted { attempts, last },
            Stop::OutOfTime => GaveUp::OutOfTime { attempts, last },
        }
    }
}

/// Runs `attempt` under `policy` until it is [`Attempt::Done`] or the policy
/// gives up, waiting through `pace` between attempts. `call` names the work
/// in the log. Each attempt's timeout is the operation's business (see
/// [`send`]).
///
/// Errors: [`GaveUp::Exhausted`] with the last failure when the attempts run
/// out (never under [`Attempts::Until`]: the caller cuts that future).
pub async fn run<T, E, Fut>(
    call: &str,
    policy: Policy,
    pace: &dyn Pace,
    mut attempt: impl FnMut() -> Fut,
) -> Result<T, GaveUp<E>>
where
    Fut: Future<Output = Attempt<T, E>>,
    E: std::fmt::Display,
{
    let mut schedule = Schedule {
        call,
        policy,
        deadline: None,
        failed: 0,
    };
    loop {
        let (error, retry_after) = match attempt().await {
            Attempt::Done(value) => return Ok(value),
            Attempt::Retry { error, retry_after } => (error, retry_after),
        };
        match schedule.after_failure(&error, retry_after, pace.draw()) {
            Ok(wait) => pace.sleep(wait).await,
            Err(stop) => return Err(schedule.gave_up(stop, error)),
        }
    }
}

/// [`run`] for blocking work (git on the blocking pool), with a deadline:
/// a wait that would end at or past `deadline` gives up instead
/// ([`GaveUp::OutOfTime`]). Whether an attempt may still start is the
/// operation's call (it sees the same clock).
///
/// Errors: as [`run`], and [`GaveUp::OutOfTime`].
pub fn run_blocking<T, E>(
    call: &str,
    policy: Policy,
    pace: &dyn Pace,
    deadline: Option<Instant>,
    mut attempt: impl FnMut() -> Attempt<T, E>,
) -> Result<T, GaveUp<E>>
where
    E: std::fmt::Display,
{
    let mut schedule = Schedule {
        call,
        policy,
        deadline,
        failed: 0,
    };
    loop {
        let (error, retry_after) = match attempt() {
            Attempt::Done(value) => return Ok(value),
            Attempt::Retry { error, retry_after } => (error, retry_after),
        };
        match schedule.after_failure(&error, retry_after, pace.draw()) {
            Ok(wait) => pace.sleep_blocking(wait),
            Err(stop) => return Err(schedule.gave_up(stop, error)),
        }
    }
}

pub use crate::wire::routes::caps;

/// The start of a refused (non-2xx) answer's body kept for its message.
const VERDICT_DETAIL_BYTES: usize = 512;

/// A successful (2xx) answer, body read through the route's size cap.
#[derive(Debug)]
pub struct Reply {
    /// The status (2xx, or `304` to a conditional read).
    pub status: StatusCode,
    /// Response headers (`Date` is used for bearer lifetimes).
    pub headers: HeaderMap,
    /// The body, at most the cap given to [`send`].
    pub body: Bytes,
}

impl Reply {
    /// The `Date` header (the coordinator's clock), when present and valid.
    pub fn date(&self) -> Option<std::time::SystemTime> {
        self.headers
            .get(reqwest::header::DATE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| httpdate::parse_http_date(v).ok())
    }
}

/// Why a call failed. Messages name the call and the status, never a secret
/// or a URL with credentials (reqwest errors are stripped of their URL).
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// A non-retryable answer (4xx other than 429, 3xx).
    #[error("{call}: the coordinator answered HTTP {status}{detail}")]
    Verdict {
        /// What was called, e.g. `agent-token pull`.
        call: String,
        /// The HTTP status.
        status: u16,
        /// `": <start of body>"` or empty.
        detail: String,
    },
    /// The agent-token pull (2.1) answered `401` or `403`: the boot secret
    /// is not (or no longer) valid. A verdict like [`CallError::Verdict`],
    /// its own variant because it is fatal wherever it happens (4.2) and
    /// callers match on it, not on the call's name.
    #[error("agent-token pull: the coordinator answered HTTP {status}{detail}")]
    BootSecretRefused {
        /// `401` or `403`.
        status: u16,
        /// `": <start of body>"` or empty.
        detail: String,
    },
    /// An `https://` URL whose server answered the TLS handshake with
    /// plain HTTP: a configuration error, never retried (PROTOCOL.md 2).
    #[error(
        "{call}: {at} answered the TLS handshake in plain HTTP: the URL says https:// but the server there speaks http; use an http:// URL (HOSTED_BOOT_INSECURE_HTTP=1 off loopback), or serve TLS there"
    )]
    PlainHttp {
        /// What was called.
        call: String,
        /// `HOST:PORT`.
        at: String,
    },
    /// Every attempt failed with a retryable error.
    #[error("{call} failed after {attempts} attempt{}: {last}", if *attempts == 1 { "" } else { "s" })]
    Exhausted {
        /// What was called.
        call: String,
        /// Attempts made.
        attempts: u32,
        /// The last error.
        last: String,
    },
    /// A 2xx answer whose body is over the route's cap ([`caps`]): refused
    /// without being read whole, and never retried (the same read gives the
    /// same body).
    #[error(
        "{call}: the coordinator's answer is {} bytes, over this route's cap of {cap} bytes (PROTOCOL.md section 2); it was refused without being read",
        if *size_exact { size.to_string() } else { format!("more than {size}") }
    )]
    TooLarge {
        /// What was called.
        call: String,
        /// The body's size: its `Content-Length`, or (`size_exact` false,
        /// a body without one) what had arrived when the cap was passed.
        size: u64,
        /// Whether `size` is the whole body's.
        size_exact: bool,
        /// The route's cap.
        cap: usize,
    },
    /// A 2xx answer whose body is not what the contract says.
    #[error("{call}: invalid response from the coordinator: {reason}")]
    BadResponse {
        /// What was called.
        call: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A 2xx answer holding a value that fails its check (PROTOCOL.md
    /// section 5, e.g. an `artifactsRemote` that is not https): the
    /// `invalid_value` code (2.2) travels with it.
    #[error("{call}: invalid response from the coordinator: {source}")]
    Invalid {
        /// What was called.
        call: String,
        /// The refused value's check.
        #[source]
        source: crate::validate::CheckError,
    },
}

impl CallError {
    /// The PROTOCOL code the failure maps to, where it has one: a refused
    /// value is `invalid_value` (2.2); transport and status failures have none.
    pub fn code(&self) -> Option<crate::wire::ErrorCode> {
        match self {
            CallError::Invalid { .. } => Some(crate::wire::ErrorCode::InvalidValue),
            _ => None,
        }
    }

    /// The HTTP status of a verdict.
    pub fn verdict_status(&self) -> Option<u16> {
        match self {
            CallError::Verdict { status, .. } | CallError::BootSecretRefused { status, .. } => {
                Some(*status)
            }
            CallError::Exhausted { .. }
            | CallError::BadResponse { .. }
            | CallError::Invalid { .. }
            | CallError::PlainHttp { .. }
            | CallError::TooLarge { .. } => None,
        }
    }

    /// Whether the boot secret was refused ([`CallError::BootSecretRefused`]).
    pub fn is_boot_secret_refused(&self) -> bool {
        matches!(self, CallError::BootSecretRefused { .. })
    }

    /// Whether the answer was over the route's size cap.
    pub fn is_too_large(&self) -> bool {
        matches!(self, CallError::TooLarge { .. })
    }
}

/// What one HTTP attempt came to.
enum Outcome {
    Done(Reply),
    Verdict(u16, String),
    /// An `https://` URL whose server answered the TLS handshake in plain
    /// HTTP: the same on every attempt.
    PlainHttp(String),
    TooLarge {
        size: u64,
        size_exact: bool,
    },
    Retry(String, Option<Duration>),
}

/// Sends the request built by `build` under `policy` through the engine,
/// each attempt bounded by the policy's timeout (headers and body), and
/// returns what `accept` makes of the 2xx answer, its body read through
/// `cap` bytes ([`caps`]). `accept` refusing an answer (`Err(why)`) counts as
/// a failed attempt the rule repeats (the events route: an answer that
/// accepted nothing, or whose body is not the contract's); most routes pass
/// `Ok`.
///
/// Errors: [`CallError::Verdict`] for a non-retryable status,
/// [`CallError::TooLarge`] for a body over `cap`, [`CallError::Exhausted`]
/// when the attempts run out.
pub async fn send<T>(
    call: &str,
    policy: Policy,
    pace: &dyn Pace,
    cap: usize,
    build: impl Fn() -> RequestBuilder,
    accept: impl Fn(Reply) -> Result<T, String>,
) -> Result<T, CallError> {
    let timeout = policy.timeout.unwrap_or(REQUEST_TIMEOUT);
    let (build, accept) = (&build, &accept);
    // A span per call and one per attempt (issue 40): the attempt's is the
    // trace context the coordinator receives.
    let span = tracing::info_span!(
        "coordinator request",
        otel.name = %call,
        otel.kind = "client",
        route = %call,
        attempts = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let tries = std::sync::atomic::AtomicU32::new(0);
    let last_end = std::sync::Mutex::new(None::<std::time::Instant>);
    let (tries, last_end) = (&tries, &last_end);
    let result = run(call, policy, pace, move || async move {
        let number = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let waited = last_end
            .lock()
            .ok()
            .and_then(|end| end.map(|end| end.elapsed().as_millis() as u64));
        let attempt_span = tracing::info_span!(
            "attempt",
            otel.name = %format_args!("{call} attempt {number}"),
            otel.kind = "client",
            attempt = number,
            retry_wait_ms = waited,
            http.response.status_code = tracing::field::Empty,
            error = tracing::field::Empty,
        );
        let sent = attempt(build(), cap, &attempt_span);
        let outcome = match tokio::time::timeout(timeout, sent.instrument(attempt_span.clone()))
            .await
        {
            Ok(outcome) => outcome,
            Err(_) => Outcome::Retry(format!("no answer within {} ms", timeout.as_millis()), None),
        };
        if let Ok(mut end) = last_end.lock() {
            *end = Some(std::time::Instant::now());
        }
        record_attempt(&attempt_span, call, &outcome);
        match outcome {
            Outcome::Done(reply) => match accept(reply) {
                Ok(value) => Attempt::Done(Ok(value)),
                Err(why) => Attempt::Retry {
                    error: why,
                    retry_after: None,
                },
            },
            Outcome::Verdict(status, detail) => Attempt::Done(Err(CallError::Verdict {
                call: call.to_string(),
                status,
                detail,
            })),
            Outcome::TooLarge { size, size_exact } => Attempt::Done(Err(CallError::TooLarge {
                call: call.to_string(),
                size,
                size_exact,
                cap,
            })),
            Outcome::PlainHttp(at) => Attempt::Done(Err(CallError::PlainHttp {
                call: call.to_string(),
                at,
            })),
            Outcome::Retry(error, retry_after) => Attempt::Retry { error, retry_after },
        }
    })
    .instrument(span.clone())
    .await;
    span.record("attempts", tries.load(std::sync::atomic::Ordering::Relaxed));
    if !matches!(result, Ok(Ok(_))) {
        span.record("otel.status_code", "ERROR");
    }
    match result {
        Ok(done) => done,
        Err(GaveUp::Exhausted { attempts, last } | GaveUp::OutOfTime { attempts, last }) => {
            Err(CallError::Exhausted {
                call: call.to_string(),
                attempts,
                last,
            })
        }
    }
}

/// An attempt's result on its span and in the metrics.
fn record_attempt(span: &tracing::Span, call: &str, outcome: &Outcome) {
    let (result, status) = match outcome {
        Outcome::Done(reply) => ("ok", Some(reply.status.as_u16())),
        Outcome::Verdict(status, _) => ("refused", Some(*status)),
        Outcome::Retry(error, _) => {
            span.record("error", error.as_str());
            (
                "retried",
                error.strip_prefix("HTTP ").and_then(|s| s.parse().ok()),
            )
        }
        Outcome::TooLarge { .. } | Outcome::PlainHttp(_) => ("refused", None),
    };
    if let Some(status) = status {
        span.record("http.response.status_code", status);
    }
    crate::telemetry::metrics::request(call, result);
}

async fn attempt(request: RequestBuilder, cap: usize, span: &tracing::Span) -> Outcome {
    let (client, request) = request.build_split();
    let mut request = match request {
        Ok(r) => r,
        Err(e) => return Outcome::Retry(describe(e), None),
    };
    crate::telemetry::inject(span, request.headers_mut());
    // A `304` answers a conditional read (the session read's long-poll,
    // PROTOCOL.md 2.4): "unchanged", handed to the caller like a 2xx with
    // no body. To any other request it stays a verdict, as every 3xx.
    let conditional = request
        .headers()
        .contains_key(reqwest::header::IF_NONE_MATCH);
    let response = match client.execute(request).await {
        Ok(r) => r,
        Err(e) => {
            return match plain_http_answer(&e) {
                Some(at) => Outcome::PlainHttp(at),
                None => Outcome::Retry(describe(e), None),
            };
        }
    };
    let status = response.status();
    let headers = response.headers().clone();
    if conditional && status == StatusCode::NOT_MODIFIED {
        return Outcome::Done(Reply {
            status,
            headers,
            body: Bytes::new(),
        });
    }
    if retryable_status(status.as_u16()) {
        let retry_after = if honours_retry_after(status.as_u16()) {
            retry_after(&headers)
        } else {
            None
        };
        return Outcome::Retry(format!("HTTP {}", status.as_u16()), retry_after);
    }
    if !status.is_success() {
        let detail = match read_capped(response, VERDICT_DETAIL_BYTES).await {
            Ok(body) if !body.is_empty() => {
                let text = String::from_utf8_lossy(&body);
                format!(": {}", crate::text::head(&text, 200))
            }
            _ => String::new(),
        };
        return Outcome::Verdict(status.as_u16(), detail);
    }
    match read_capped(response, cap).await {
        Ok(body) => Outcome::Done(Reply {
            status,
            headers,
            body,
        }),
        Err(BodyError::TooLarge { size, size_exact }) => Outcome::TooLarge { size, size_exact },
        Err(BodyError::Transport(why)) => Outcome::Retry(why, None),
    }
}

#[derive(Debug, PartialEq)]
enum BodyError {
    TooLarge { size: u64, size_exact: bool },
    Transport(String),
}

/// Reads the body, holding at most `cap` bytes: a `Content-Length` over the
/// cap is refused before any byte is read, and a body without one is
/// counted chunk by chunk and refused as soon as it passes the cap.
async fn read_capped(mut response: reqwest::Response, cap: usize) -> Result<Bytes, BodyError> {
    let declared = response.content_length();
    if let Some(n) = declared.filter(|n| *n > cap as u64) {
        return Err(BodyError::TooLarge {
            size: n,
            size_exact: true,
        });
    }
    // The declared length (within the cap) is allocated once, so growing the
    // buffer never holds a second copy.
    let mut body = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let read = body.len() + chunk.len();
                if read > cap {
                    return Err(BodyError::TooLarge {
                        size: read as u64,
                        size_exact: false,
                    });
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(Bytes::from(body)),
            Err(e) => return Err(BodyError::Transport(describe(e))),
        }
    }
}

/// The `Retry-After` header (seconds or an HTTP date) as a wait.
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    if let Ok(secs) = value.trim().parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// A transport error in words, naming the host and port but not the rest
/// of the URL (a query may carry a token): `connection refused by
/// HOST:PORT (nothing listens there)`, `TLS handshake with HOST:PORT
/// failed: …`, `no answer from HOST:PORT in time`, `cannot resolve HOST`.
/// Never the HTTP stack's internal names (`client error (SendRequest)`).
pub fn describe(error: reqwest::Error) -> String {
    let at = host_port(&error);
    let error = error.without_url();
    let chain = crate::tls::causes(&error);
    let io = chain
        .iter()
        .find_map(|e| e.downcast_ref::<std::io::Error>());
    let tls = chain.iter().find_map(|e| e.downcast_ref::<rustls::Error>());
    if let Some(tls) = tls {
        return format!("TLS handshake with {at} failed: {tls}");
    }
    if error.is_timeout() {
        return format!("no answer from {at} in time (timed out)");
    }
    if let Some(io) = io {
        use std::io::ErrorKind::*;
        let what = match io.kind() {
            ConnectionRefused => Some("connection refused by"),
            ConnectionReset => Some("connection reset by"),
            ConnectionAborted => Some("connection aborted by"),
            TimedOut => Some("no answer (timed out) from"),
            HostUnreachable | NetworkUnreachable => Some("no route to"),
            _ => None,
        };
        if let Some(what) = what {
            let hint = if io.kind() == ConnectionRefused {
                " (nothing listens there)"
            } else {
                ""
            };
            return format!("{what} {at}{hint}");
        }
    }
    let words: Vec<String> = crate::tls::texts(&chain)
        .into_iter()
        .filter(|t| !internal_text(t))
        .collect();
    if chain.iter().any(|e| e.is::<crate::tls::Unresolved>()) {
        return format!("cannot resolve {at}: {}", words.join(": "));
    }
    let kind = if error.is_connect() {
        format!("cannot connect to {at}")
    } else if error.is_body() || error.is_decode() {
        format!("the response body from {at} failed")
    } else {
        format!("the request to {at} failed")
    };
    if words.is_empty() {
        kind
    } else {
        format!("{kind}: {}", words.join(": "))
    }
}

/// `HOST:PORT` when `error` is a TLS handshake the server answered in
/// plain HTTP (rustls reads an HTTP status line as a record of an invalid
/// content type).
pub(crate) fn plain_http_answer(error: &reqwest::Error) -> Option<String> {
    let chain = crate::tls::causes(error);
    let plain = chain.iter().any(|e| {
        matches!(
            e.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidMessage(
                rustls::InvalidMessage::InvalidContentType
            ))
        )
    });
    plain.then(|| host_port(error))
}

/// `HOST:PORT` of the request that failed, never the rest of its URL (a
/// query may carry a token); "the server" when the error has no URL.
fn host_port(error: &reqwest::Error) -> String {
    error
        .url()
        .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)))
        .unwrap_or_else(|| "the server".to_string())
}

/// Whether `text` is one of the HTTP stack's own layers' messages, which
/// say nothing to a reader (`error sending request`, `client error
/// (SendRequest)`, `tcp connect error`).
fn internal_text(text: &str) -> bool {
    text.starts_with("client error (")
        || ["error sending request", "tcp connect error", "dns error"].contains(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot HTTP server answering `200` with `body`, in chunks of
    /// 1000 bytes without a `Content-Length` (`chunked`), or with one.
    /// Returns the URL and how many body bytes it managed to write.
    async fn serve(body: usize, chunked: bool) -> (String, tokio::task::JoinHandle<usize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = conn.read(&mut request).await;
            let head = if chunked {
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_string()
            } else {
                format!("HTTP/1.1 200 OK\r\nContent-Length: {body}\r\n\r\n")
            };
            if conn.write_all(head.as_bytes()).await.is_err() {
                return 0;
            }
            let mut written = 0;
            while written < body {
                let n = (body - written).min(1000);
                let data = vec![b' '; n];
                let ok = if chunked {
                    let mut frame = format!("{n:x}\r\n").into_bytes();
                    frame.extend_from_slice(&data);
                    frame.extend_from_slice(b"\r\n");
                    conn.write_all(&frame).await.is_ok()
                } else {
                    conn.write_all(&data).await.is_ok()
                };
                if !ok {
                    return written;
                }
                written += n;
            }
            if chunked {
                let _ = conn.write_all(b"0\r\n\r\n").await;
            }
            written
        });
        (url, task)
    }

    async fn get(url: &str, cap: usize) -> Result<Reply, CallError> {
        crate::tls::install_crypto_provider();
        let client = crate::tls::http_client(None).unwrap();
        send(
            "test read",
            Policy::ONCE,
            &REAL,
            cap,
            || client.get(url),
            Ok,
        )
        .await
    }

    /// PROTOCOL.md section 2: jitter never takes a wait past its cap (a
    /// wait at the cap is between 80 % and 100 % of it), over the whole
    /// range of draws and over the production pace's random ones (seeded,
    /// so the draws are the same on every run).
    #[test]
    fn jitter_never_pushes_a_wait_past_its_cap() {
        let policy = Policy::REQUIRED;
        fastrand::seed(7);
        let draws = (0..=100).map(|i| f64::from(i) / 100.0);
        let draws: Vec<f64> = draws.chain((0..200).map(|_| REAL.draw())).collect();
        let mut highest = Duration::ZERO;
        for n in [4, 5, 10] {
            for &draw in &draws {
                let wait = wait(&policy, n, None, draw);
                assert!(
                    wait >= policy.cap.mul_f64(0.8),
                    "retry {n}: {wait:?} under 80 % of the cap"
                );
                highest = highest.max(wait);
            }
        }
        assert!(
            highest <= policy.cap,
            "a jittered wait of {highest:?} is past the cap {:?}",
            policy.cap
        );
        // Below the cap, jitter spreads a wait both ways.
        assert_eq!(wait(&policy, 1, None, 0.0), Duration::from_millis(400));
        assert_eq!(wait(&policy, 1, None, 1.0), Duration::from_millis(600));
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let p = Policy::REQUIRED;
        let waits: Vec<u64> = (0..6).map(|n| p.backoff(n).as_millis() as u64).collect();
        assert_eq!(waits, vec![250, 500, 1000, 2000, 4000, 4000]);
        assert_eq!(p.backoff(200), Duration::from_secs(4));
    }

    #[test]
    fn scaling_keeps_attempts_and_the_timeout_floor() {
        let p = Policy::AGENT_TOKEN_BOOT.scaled(0.02);
        assert_eq!(p.attempts, Attempts::AtMost(10));
        let c = Policy::CLONE.scaled(0.02);
        assert_eq!(c.attempts, Attempts::AtMost(4));
        assert_eq!(c.base, Duration::from_millis(20));
        assert_eq!(c.timeout, None);
        // The per-attempt timeout keeps the request timeout's floor (2 s).
        assert_eq!(p.timeout, Some(Duration::from_secs(2)));
        assert_eq!(Policy::REQUIRED.scaled(1.0), Policy::REQUIRED);
    }

    #[tokio::test]
    async fn a_body_within_its_cap_is_read_whole() {
        let (url, _) = serve(5000, true).await;
        assert_eq!(get(&url, 5000).await.unwrap().body.len(), 5000);
        let (url, _) = serve(5000, false).await;
        assert_eq!(get(&url, 5000).await.unwrap().body.len(), 5000);
    }

    #[tokio::test]
    async fn a_declared_length_over_the_cap_is_refused_unread() {
        let (url, _) = serve(50_000, false).await;
        match get(&url, 4000).await {
            Err(CallError::TooLarge {
                size,
                size_exact,
                cap,
                ..
            }) => assert_eq!((size, size_exact, cap), (50_000, true, 4000)),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_streamed_body_is_refused_as_soon_as_it_passes_the_cap() {
        // Far more than a socket buffers: the server is left unable to send
        // the rest once the runner stops reading at the cap.
        let (url, server) = serve(64 * 1024 * 1024, true).await;
        let e = get(&url, 4000).await.unwrap_err();
        match &e {
            CallError::TooLarge {
                size,
                size_exact,
                cap,
                ..
            } => {
                assert!(!size_exact);
                assert_eq!(*cap, 4000);
                assert!(*size > 4000 && *size <= 5000, "{size}");
            }
            other => panic!("{other:?}"),
        }
        assert!(e.to_string().contains("more than"), "{e}");
        assert!(e.is_too_large() && e.verdict_status().is_none());
        let written = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .unwrap()
            .unwrap();
        assert!(written < 64 * 1024 * 1024, "the whole body was read");
    }

    /// An https:// URL answered in plain HTTP (issue 45): a configuration
    /// error at the first attempt, named with the host and what to do,
    /// never retried, though the policy allows ten attempts.
    #[tokio::test]
    async fn a_tls_handshake_answered_in_plain_http_is_not_retried() {
        crate::tls::install_crypto_provider();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut hello = [0u8; 1024];
                let _ = conn.read(&mut hello).await;
                let _ = conn
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    .await;
            }
        });
        let client = crate::tls::http_client(None).unwrap();
        let url = format!("https://127.0.0.1:{port}/api/x?token=t");
        let e = send(
            "agent-token pull",
            Policy::AGENT_TOKEN_BOOT.scaled(0.01),
            &REAL,
            1000,
            || client.get(&url),
            Ok,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, CallError::PlainHttp { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains(&format!(
                "127.0.0.1:{port} answered the TLS handshake in plain HTTP"
            )) && text.contains("use an http:// URL"),
            "{text}"
        );
        assert!(!text.contains("token=t"), "{text}");
        assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    /// A name that does not resolve, told by the resolver's error type.
    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_described_as_such() {
        let client = crate::tls::http_client(None).unwrap();
        let error = client
            .get("http://no-such-host.invalid:8080/x?token=t")
            .send()
            .await
            .unwrap_err();
        let text = describe(error);
        assert!(
            text.starts_with("cannot resolve no-such-host.invalid:8080: "),
            "{text}"
        );
        assert!(
            !text.contains("token") && !text.contains("dns error"),
            "{text}"
        );
    }
}
