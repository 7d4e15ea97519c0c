//! The break-it review of issue 43 (Gemini CLI through the `acp` adapter):
//! each test fails where the review found a problem (see the review's
//! report). The classifier probes run without Gemini CLI; the others need
//! `HOSTED_BOOT_AGENT_CLIS` (they pass silently when it is not installed).

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hosted_boot::agent::classify::from_text;
use hosted_boot_wire::wire::ErrorCode;

use super::real_acp::{Agent, Case};
use super::real_clis::{Runner, assert_nothing_left, error_code, sealed};

// ------------------------------------------------------------- classifier

/// Google's current 503 wording ("high demand") is an overload, as Gemini
/// CLI's own 503 "The model is overloaded." is: it lands in the server
/// errors, so no overload continuation follows a real 503 storm.
#[test]
fn gemini_review_google_503_high_demand_is_an_overload() {
    let text = "This model is currently experiencing high demand. Spikes in demand are \
                usually temporary. Please try again later.";
    assert_eq!(from_text(text, false), Some(ErrorCode::ProviderOverloaded));
}

/// Google's 429 without details ("Resource has been exhausted (e.g. check
/// quota).", the shared-quota throttle) is what Gemini CLI retries as a
/// `RetryableQuotaError` (a 429 with no details): a throttle, not an
/// exhausted quota that ends the session.
#[test]
fn gemini_review_resource_exhausted_without_details_is_not_a_spent_quota() {
    let text = "Resource has been exhausted (e.g. check quota).";
    assert_ne!(
        from_text(text, false),
        Some(ErrorCode::ProviderQuotaExhausted)
    );
}

/// "Suggested retry after" is checked before everything else: a 503
/// overload that carries Google's RetryInfo (Gemini CLI appends the same
/// sentence to it) becomes a retryable rate limit.
#[test]
fn gemini_review_a_suggested_retry_does_not_hide_an_overload() {
    let text = "The model is overloaded. Please try again later.\nSuggested retry after 30s.";
    assert_eq!(from_text(text, false), Some(ErrorCode::ProviderOverloaded));
}

/// What held up: huge, fractional and malformed waits do not panic and
/// land on a side of the five minutes; other agents' "retry after" texts
/// are untouched by the Gemini rule.
#[test]
fn gemini_review_suggested_retry_edges_hold() {
    let cases: &[(&str, ErrorCode)] = &[
        (
            "x\nSuggested retry after 99999999999999999999999999999999999999s.",
            ErrorCode::ProviderQuotaExhausted,
        ),
        (
            "x\nSuggested retry after 300s.",
            ErrorCode::ProviderRateLimited,
        ),
        (
            "x\nSuggested retry after 300.5s.",
            ErrorCode::ProviderQuotaExhausted,
        ),
        (
            "x\nSuggested retry after 450ms.",
            ErrorCode::ProviderRateLimited,
        ),
        (
            "x\nSuggested retry after .s.",
            ErrorCode::ProviderRateLimited,
        ),
        ("x\nSuggested retry after ", ErrorCode::ProviderRateLimited),
        (
            "x\nSUGGESTED RETRY AFTER 1E9S",
            ErrorCode::ProviderRateLimited,
        ),
        // Anthropic's / OpenAI's wordings stay theirs.
        (
            "429 rate_limit_error: Number of request tokens has exceeded your per-minute rate limit; retry after 60 seconds",
            ErrorCode::ProviderRateLimited,
        ),
        (
            "You exceeded your current quota, please check your plan and billing details. Please retry after 20s",
            ErrorCode::ProviderQuotaExhausted,
        ),
    ];
    for (text, want) in cases {
        assert_eq!(from_text(text, false), Some(*want), "{text}");
    }
    // A model's ordinary text is never classified unless the turn failed;
    // as a failure text, "API key not valid" is auth wherever it is.
    assert_eq!(
        from_text("the model said: API key not valid", false),
        Some(ErrorCode::ProviderAuth)
    );
}

// -------------------------------------------------- a Google of our own

/// A loopback Gemini API that answers every request with one status and
/// body (as Google sends them), counting the requests.
struct Google {
    port: u16,
    hits: Arc<AtomicUsize>,
}

impl Google {
    fn start(status: u16, reason: &'static str, body: &'static str) -> Google {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let counted = counted.clone();
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 8192];
                    loop {
                        let Ok(n) = s.read(&mut chunk) else { return };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                            let len = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .and_then(|v| v.trim().parse::<usize>().ok())
                                .unwrap_or(0);
                            while buf.len() < end + 4 + len {
                                let Ok(n) = s.read(&mut chunk) else { return };
                                if n == 0 {
                                    break;
                                }
                                buf.extend_from_slice(&chunk[..n]);
                            }
                            break;
                        }
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    let _ = write!(
                        s,
                        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json; charset=UTF-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                });
            }
        });
        Google { port, hits }
    }
}

/// One turn against `google`: its finish (status, code, message).
async fn against_google(
    status: u16,
    reason: &'static str,
    body: &'static str,
) -> Option<(String, String, String)> {
    let case = Case::start(Agent::Gemini, "hello").await?;
    let google = Google::start(status, reason, body);
    let mut cmd = case.command();
    cmd.args([
        "--agent-env",
        &format!("GOOGLE_GEMINI_BASE_URL=http://127.0.0.1:{}", google.port),
    ]);
    let mut runner = Runner::spawn(&mut cmd);
    let snap = case.sealed(&mut runner, "run-1").await;
    let body = sealed(&snap, "run-1");
    let message = body
        .error
        .as_ref()
        .map(|e| e.message.clone())
        .unwrap_or_default();
    let out = (body.status.as_str().to_string(), error_code(&body), message);
    eprintln!(
        "{status}: {out:?} after {} requests",
        google.hits.load(Ordering::SeqCst)
    );
    assert!(
        google.hits.load(Ordering::SeqCst) > 0,
        "our Google was not asked"
    );
    case.sb.coordinator.end_session();
    runner.finish().await;
    assert_nothing_left(&case.sb.root()).await;
    Some(out)
}

/// Google's real 500 (`INTERNAL`, "An internal error has occurred."):
/// a provider server error.
#[tokio::test]
async fn gemini_review_real_google_500_is_a_server_error() {
    let Some((status, code, message)) = against_google(
        500,
        "Internal Server Error",
        r#"{"error":{"code":500,"message":"An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting","status":"INTERNAL"}}"#,
    )
    .await
    else {
        return;
    };
    assert_eq!(status, "failed");
    assert_eq!(code, "provider_server_error", "{message}");
}

// ------------------------------------------------------------- behaviour

/// An interrupt while Gemini CLI is still starting (before its prompt):
/// the run is interrupted promptly and nothing is left running (its
/// relaunched child node process included).
#[tokio::test]
async fn gemini_review_interrupt_while_starting() {
    let Some(case) = Case::start(Agent::Gemini, "sleep:started.txt").await else {
        return;
    };
    let mut runner = Runner::spawn(&mut case.command());
    // As soon as the run is there.
    let deadline = Instant::now() + Duration::from_secs(30);
    while case.sb.coordinator.snapshot().run("run-1").is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at = Instant::now();
    case.sb.coordinator.interrupt(Some("run-1")).unwrap();
    let snap = case.sealed(&mut runner, "run-1").await;
    let took = at.elapsed();
    let body = sealed(&snap, "run-1");
    eprintln!("interrupted while starting: {:?} in {took:?}", body.status);
    case.sb.coordinator.end_session();
    runner.finish().await;
    assert_nothing_left(&case.sb.root()).await;
    assert_eq!(body.status.as_str(), "interrupted");
    assert!(
        !case.repo().join("started.txt").exists(),
        "the tool ran after the interrupt"
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
}
