//! The one retry rule of PROTOCOL.md section 2, for every route.
//!
//! Retryable: no HTTP response (connect error, reset, timeout), `429`, any
//! `5xx`. Every other status outside 2xx (3xx included: redirects are never
//! followed) is a verdict. The wait before retry n is `base * 2^n`, capped,
//! with ±20 % jitter; `Retry-After` on 429/503 replaces it, up to the cap.

use std::time::Duration;

use bytes::Bytes;
use reqwest::{RequestBuilder, StatusCode, header::HeaderMap};

use crate::timings::RetryPolicy;

/// Largest response body read (4 MiB); beyond it the answer is refused
/// without being read whole.
pub const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// A successful (2xx) answer, body read through the size cap.
#[derive(Debug)]
pub struct Reply {
    /// The status (2xx).
    pub status: StatusCode,
    /// Response headers (`Date` is used for bearer lifetimes).
    pub headers: HeaderMap,
    /// The body, at most [`MAX_BODY_BYTES`].
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
    /// A 2xx answer whose body is not what the contract says.
    #[error("{call}: invalid response from the coordinator: {reason}")]
    BadResponse {
        /// What was called.
        call: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl CallError {
    /// The HTTP status of a verdict.
    pub fn verdict_status(&self) -> Option<u16> {
        match self {
            CallError::Verdict { status, .. } => Some(*status),
            CallError::Exhausted { .. } | CallError::BadResponse { .. } => None,
        }
    }
}

enum Attempt {
    Done(Reply),
    Verdict(u16, String),
    Retry(String, Option<Duration>),
}

/// Sends the request built by `build` under `policy`, each attempt bounded by
/// `timeout` (headers and body), and returns the 2xx answer.
///
/// Errors: [`CallError::Verdict`] for a non-retryable status,
/// [`CallError::Exhausted`] when the attempts run out.
pub async fn send(
    call: &str,
    policy: RetryPolicy,
    timeout: Duration,
    build: impl Fn() -> RequestBuilder,
) -> Result<Reply, CallError> {
    let attempts = policy.attempts.max(1);
    let mut last = String::new();
    for n in 0..attempts {
        let attempt = match tokio::time::timeout(timeout, attempt(build())).await {
            Ok(a) => a,
            Err(_) => Attempt::Retry(format!("no answer within {} ms", timeout.as_millis()), None),
        };
        let retry_after = match attempt {
            Attempt::Done(reply) => return Ok(reply),
            Attempt::Verdict(status, detail) => {
                return Err(CallError::Verdict {
                    call: call.to_string(),
                    status,
                    detail,
                });
            }
            Attempt::Retry(why, retry_after) => {
                last = why;
                retry_after
            }
        };
        if n + 1 < attempts {
            let wait = wait_before_retry(policy, n, retry_after);
            tracing::warn!(
                call,
                attempt = n + 1,
                of = attempts,
                wait_ms = wait.as_millis() as u64,
                error = %last,
                "coordinator call failed; retrying"
            );
            tokio::time::sleep(wait).await;
        }
    }
    Err(CallError::Exhausted {
        call: call.to_string(),
        attempts,
        last,
    })
}

/// The wait before retry `n`: `Retry-After` when given (up to the cap), else
/// the jittered exponential backoff.
pub fn wait_before_retry(policy: RetryPolicy, n: u32, retry_after: Option<Duration>) -> Duration {
    match retry_after {
        Some(d) => d.min(policy.cap),
        None => {
            let base = policy.backoff(n);
            let jitter = 0.8 + 0.4 * fastrand::f64();
            Duration::from_secs_f64(base.as_secs_f64() * jitter)
        }
    }
}

async fn attempt(request: RequestBuilder) -> Attempt {
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) => return Attempt::Retry(describe(e), None),
    };
    let status = response.status();
    let headers = response.headers().clone();
    if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
        let retry_after = if status == StatusCode::TOO_MANY_REQUESTS
            || status == StatusCode::SERVICE_UNAVAILABLE
        {
            retry_after(&headers)
        } else {
            None
        };
        return Attempt::Retry(format!("HTTP {}", status.as_u16()), retry_after);
    }
    if !status.is_success() {
        let detail = match read_capped(response, 512).await {
            Ok(body) if !body.is_empty() => {
                let text = String::from_utf8_lossy(&body);
                format!(": {}", text.chars().take(200).collect::<String>())
            }
            _ => String::new(),
        };
        return Attempt::Verdict(status.as_u16(), detail);
    }
    match read_capped(response, MAX_BODY_BYTES).await {
        Ok(body) => Attempt::Done(Reply {
            status,
            headers,
            body,
        }),
        Err(BodyError::TooLarge) => Attempt::Verdict(
            status.as_u16(),
            format!(" with a body over {MAX_BODY_BYTES} bytes (refused)"),
        ),
        Err(BodyError::Transport(why)) => Attempt::Retry(why, None),
    }
}

enum BodyError {
    TooLarge,
    Transport(String),
}

async fn read_capped(mut response: reqwest::Response, cap: usize) -> Result<Bytes, BodyError> {
    if response.content_length().is_some_and(|n| n > cap as u64) {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > cap {
                    return Err(BodyError::TooLarge);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(Bytes::from(body)),
            Err(e) => return Err(BodyError::Transport(describe(e))),
        }
    }
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
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

/// A transport error as text, without the URL.
pub fn describe(error: reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "connection failed"
    } else if error.is_body() || error.is_decode() {
        "the response body failed"
    } else {
        "request failed"
    };
    let error = error.without_url();
    let mut text = format!("{kind}: {error}");
    let mut source = std::error::Error::source(&error);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
