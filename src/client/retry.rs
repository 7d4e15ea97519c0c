//! The one retry rule of PROTOCOL.md section 2, for every route.
//!
//! Retryable: no HTTP response (connect error, reset, timeout), `429`, any
//! `5xx`. Every other status outside 2xx (3xx included: redirects are never
//! followed) is a verdict. The wait before retry n is `base * 2^n`, capped,
//! with ±20 % jitter; `Retry-After` on 429/503 replaces it, up to the cap.
//!
//! Every 2xx body is read through its route's size cap ([`caps`]), counted
//! as it streams: never more than the cap is held, and an answer over it is
//! [`CallError::TooLarge`], a verdict (repeating the read gives the same
//! body).

use std::time::Duration;

use bytes::Bytes;
use reqwest::{RequestBuilder, StatusCode, header::HeaderMap};

use crate::timings::RetryPolicy;

pub use crate::wire::routes::caps;

/// The start of a refused (non-2xx) answer's body kept for its message.
const VERDICT_DETAIL_BYTES: usize = 512;

/// A successful (2xx) answer, body read through the route's size cap.
#[derive(Debug)]
pub struct Reply {
    /// The status (2xx).
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
}

impl CallError {
    /// The HTTP status of a verdict.
    pub fn verdict_status(&self) -> Option<u16> {
        match self {
            CallError::Verdict { status, .. } | CallError::BootSecretRefused { status, .. } => {
                Some(*status)
            }
            CallError::Exhausted { .. }
            | CallError::BadResponse { .. }
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

enum Attempt {
    Done(Reply),
    Verdict(u16, String),
    TooLarge { size: u64, size_exact: bool },
    Retry(String, Option<Duration>),
}

/// Sends the request built by `build` under `policy`, each attempt bounded by
/// `timeout` (headers and body), and returns the 2xx answer, its body read
/// through `cap` bytes ([`caps`]).
///
/// Errors: [`CallError::Verdict`] for a non-retryable status,
/// [`CallError::TooLarge`] for a body over `cap`, [`CallError::Exhausted`]
/// when the attempts run out.
pub async fn send(
    call: &str,
    policy: RetryPolicy,
    timeout: Duration,
    cap: usize,
    build: impl Fn() -> RequestBuilder,
) -> Result<Reply, CallError> {
    let attempts = policy.attempts.max(1);
    let mut last = String::new();
    for n in 0..attempts {
        let attempt = match tokio::time::timeout(timeout, attempt(build(), cap)).await {
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
            Attempt::TooLarge { size, size_exact } => {
                return Err(CallError::TooLarge {
                    call: call.to_string(),
                    size,
                    size_exact,
                    cap,
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

async fn attempt(request: RequestBuilder, cap: usize) -> Attempt {
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
        let detail = match read_capped(response, VERDICT_DETAIL_BYTES).await {
            Ok(body) if !body.is_empty() => {
                let text = String::from_utf8_lossy(&body);
                format!(": {}", crate::text::head(&text, 200))
            }
            _ => String::new(),
        };
        return Attempt::Verdict(status.as_u16(), detail);
    }
    match read_capped(response, cap).await {
        Ok(body) => Attempt::Done(Reply {
            status,
            headers,
            body,
        }),
        Err(BodyError::TooLarge { size, size_exact }) => Attempt::TooLarge { size, size_exact },
        Err(BodyError::Transport(why)) => Attempt::Retry(why, None),
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
            RetryPolicy::ONCE,
            Duration::from_secs(10),
            cap,
            || client.get(url),
        )
        .await
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

    /// Issue 11: "Jitter must not push a wait past its cap". Once the
    /// backoff reaches the cap (`base * 2^n >= cap`), the ±20 % jitter is
    /// applied to the capped value, so about half of the waits are up to
    /// 1.2 × the cap. The jitter's draw is not injectable here, so the test
    /// draws 200 times (all 200 under the cap by chance: 2^-200).
    #[test]
    fn jitter_never_takes_a_wait_past_the_cap() {
        let policies = crate::timings::RetryPolicies::default();
        for (name, policy) in [
            ("agent token at boot", policies.agent_token_boot),
            ("required", policies.required),
            ("clone", policies.clone),
        ] {
            for n in [4, 5, 10] {
                for _ in 0..200 {
                    let wait = wait_before_retry(policy, n, None);
                    assert!(
                        wait <= policy.cap,
                        "{name}, retry {n}: waits {wait:?}, over its cap of {:?}",
                        policy.cap
                    );
                }
            }
        }
    }
}
