//! Failure classes of a turn (PROTOCOL.md 2.6 `finish.error.code`). Each
//! adapter reads its CLI's structured fields first (Claude's
//! `api_error_status` and `rate_limit_event`, Codex's `codexErrorInfo`,
//! opencode's `APIError`); this module holds what they share: the HTTP
//! status table and the text fallback, applied in this order:
//!
//! 1. a refused resume (only when the turn resumed a session);
//! 2. an exhausted quota (a text that says both "quota" and "rate limit" is
//!    a quota);
//! 3. the context window; 4. authentication; 5. an overload;
//! 6. a rate limit ("rate limit", "too many requests");
//! 7. a bare `429` with neither: `provider_limit_unknown`, never assumed to
//!    be a plain rate limit;
//! 8. a provider 5xx; 9. an invalid request (400, 404, unknown model).
//!
//! Between 1 and 2: Gemini CLI's quota error it retried itself ("Suggested
//! retry after Ns": Google's per-minute throttle, whose message says
//! "exceeded your current quota" as an exhausted one does) is a rate limit,
//! or a quota when the wait is over five minutes (as Gemini CLI decides).
//!
//! The exit status comes last, in the runner ([`super::drive`]).

use crate::wire::ErrorCode;

use super::AgentError;

const RESUME: &[&str] = &[
    "no conversation found",
    "session not found",
    "no rollout found",
    "thread not found",
];
const QUOTA: &[&str] = &[
    "quota",
    "hit your limit",
    "usage limit",
    "usage_limit",
    "usage_not_included",
    "credit balance",
    "out of credits",
    "insufficient credit",
    "spend cap",
    "billing",
    "free usage exceeded",
];
const CONTEXT: &[&str] = &[
    "context window",
    "context_window",
    "context length",
    "context_length",
    "prompt is too long",
    "maximum context",
    "ran out of room",
    "contextoverflow",
];
const AUTH: &[&str] = &[
    "authentication",
    "unauthorized",
    "invalid api key",
    "invalid_api_key",
    "invalid x-api-key",
    "incorrect api key",
    "please run /login",
    "token has expired",
    "providerautherror",
    // Google's Gemini API: a bad key is a 400 `API_KEY_INVALID`.
    "api key not valid",
    "api_key_invalid",
];
const OVERLOADED: &[&str] = &[
    "overloaded",
    "at capacity",
    "server_is_overloaded",
    // Google's 503 UNAVAILABLE "This model is currently experiencing high
    // demand", which Gemini CLI passes on without its status.
    "high demand",
];
const RATE_LIMIT: &[&str] = &[
    "rate limit",
    "rate_limit",
    "rate-limit",
    "ratelimit",
    "too many requests",
];
const SERVER: &[&str] = &[
    "internal server error",
    "server_error",
    "server error",
    "bad gateway",
    "service unavailable",
    "gateway timeout",
];
const INVALID: &[&str] = &[
    "invalid_request",
    "invalid request",
    "bad request",
    "model not found",
    "model_not_found",
    "not_found_error",
    "unknown model",
    "unrecognized_model",
];

/// What Gemini CLI appends to a 429 it classed retryable and retried
/// (its `RetryableQuotaError`), and to a terminal quota whose wait exceeds
/// [`GEMINI_MAX_RETRYABLE_MS`].
const GEMINI_RETRIED_QUOTA: &str = "suggested retry after ";
/// Google's message for a 429 `RESOURCE_EXHAUSTED` that carries no
/// details ("Resource has been exhausted (e.g. check quota).").
const GOOGLE_EXHAUSTED: &str = "resource has been exhausted";
/// Gemini CLI's bound between a throttle and a quota (its
/// `MAX_RETRYABLE_DELAY_SECONDS`).
const GEMINI_MAX_RETRYABLE_MS: u64 = 300_000;

fn any(text: &str, needles: &[&str]) -> bool {
    needles.iter().any(|n| text.contains(n))
}

/// The HTTP statuses (400..=599) a text names: `429` anywhere as a word,
/// the others only after "status", "error", "code", "http" or "api" (so
/// that "400 ms" is not a bad request).
pub fn statuses_in(text: &str) -> Vec<u16> {
    let lower = text.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i + 3 <= bytes.len() {
        let is_num = bytes[i..i + 3].iter().all(u8::is_ascii_digit)
            && (i == 0 || !bytes[i - 1].is_ascii_digit())
            && (i + 3 == bytes.len() || !bytes[i + 3].is_ascii_digit());
        if is_num {
            let n = u16::from(bytes[i] - b'0') * 100
                + u16::from(bytes[i + 1] - b'0') * 10
                + u16::from(bytes[i + 2] - b'0');
            // Up to 16 bytes before the number, from a char boundary (the
            // text is the agent's: any UTF-8).
            let mut start = i.saturating_sub(16);
            while !lower.is_char_boundary(start) {
                start += 1;
            }
            let before = lower.get(start..i).unwrap_or("");
            let named = ["status", "error", "code", "http", "api"]
                .iter()
                .any(|w| before.contains(w));
            if (400..=599).contains(&n) && (n == 429 || named) {
                out.push(n);
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    out
}

/// The class a failure text names, if any (the text fallback).
pub fn from_text(text: &str, resuming: bool) -> Option<ErrorCode> {
    let t = text.to_lowercase();
    let statuses = statuses_in(&t);
    let has = |s: u16| statuses.contains(&s);
    if resuming && any(&t, RESUME) {
        return Some(ErrorCode::ResumeFailed);
    }
    // Gemini CLI's retried throttle, unless the text names a class that
    // says more (it appends the suggestion to any 429 or 503 with a
    // RetryInfo: an overload among them).
    let says_more = any(&t, CONTEXT) || any(&t, AUTH) || any(&t, OVERLOADED) || has(529);
    if let Some((_, wait)) = t.split_once(GEMINI_RETRIED_QUOTA).filter(|_| !says_more) {
        return Some(match retry_after_in_text(&format!("retry after {wait}")) {
            Some(ms) if ms > GEMINI_MAX_RETRYABLE_MS => ErrorCode::ProviderQuotaExhausted,
            _ => ErrorCode::ProviderRateLimited,
        });
    }
    // Google's 429 RESOURCE_EXHAUSTED without its details names a quota
    // but is a throttle as often (Gemini CLI retries it): not a spent one.
    if t.contains(GOOGLE_EXHAUSTED) && !t.contains("daily") && !t.contains("per day") {
        return Some(ErrorCode::ProviderLimitUnknown);
    }
    if any(&t, QUOTA) {
        return Some(ErrorCode::ProviderQuotaExhausted);
    }
    if any(&t, CONTEXT) {
        return Some(ErrorCode::ContextWindowExceeded);
    }
    if any(&t, AUTH) || has(401) || has(403) {
        return Some(ErrorCode::ProviderAuth);
    }
    if any(&t, OVERLOADED) || has(529) {
        return Some(ErrorCode::ProviderOverloaded);
    }
    // "429 Too Many Requests" is the status and its reason phrase (Codex's
    // "exceeded retry limit, last status: 429 Too Many Requests", in both
    // of its modes), not evidence of a throttle (PROTOCOL.md section 7).
    if any(&t.replace("429 too many requests", "429"), RATE_LIMIT) {
        return Some(ErrorCode::ProviderRateLimited);
    }
    if has(429) {
        return Some(ErrorCode::ProviderLimitUnknown);
    }
    if any(&t, SERVER) || statuses.iter().any(|s| (500..=599).contains(s)) {
        return Some(ErrorCode::ProviderServerError);
    }
    if any(&t, INVALID) || has(400) || has(404) || has(422) {
        return Some(ErrorCode::InvalidRequest);
    }
    None
}

/// The class of a provider's HTTP status, with `text` (its message or
/// body) deciding a 429 and refining a 400.
pub fn from_http_status(status: u16, text: &str) -> ErrorCode {
    let t = text.to_lowercase();
    match status {
        429 => {
            if any(&t, QUOTA) {
                ErrorCode::ProviderQuotaExhausted
            } else if any(&t, RATE_LIMIT) {
                ErrorCode::ProviderRateLimited
            } else {
                ErrorCode::ProviderLimitUnknown
            }
        }
        401 | 403 => ErrorCode::ProviderAuth,
        402 => ErrorCode::ProviderQuotaExhausted,
        413 => ErrorCode::ContextWindowExceeded,
        529 => ErrorCode::ProviderOverloaded,
        400..=499 => {
            if any(&t, CONTEXT) {
                ErrorCode::ContextWindowExceeded
            } else if any(&t, QUOTA) {
                // Anthropic's "credit balance is too low" is a 400.
                ErrorCode::ProviderQuotaExhausted
            } else {
                ErrorCode::InvalidRequest
            }
        }
        503 if any(&t, OVERLOADED) => ErrorCode::ProviderOverloaded,
        _ => ErrorCode::ProviderServerError,
    }
}

/// An error from a failure text alone, if the text names a class.
pub fn text_error(text: &str, resuming: bool) -> Option<AgentError> {
    from_text(text, resuming).map(|code| AgentError::new(code, clip(text)))
}

/// At most 600 characters of `text`, trimmed, `…` marking a cut (the finish
/// message holds 800, and the runner prefixes it).
pub fn clip(text: &str) -> String {
    crate::text::clip(text.trim(), 600)
}

/// The wait a provider's message names: "try again in 2.4s", "… in
/// 500ms", "retry after 7 seconds".
pub fn retry_after_in_text(text: &str) -> Option<u64> {
    let lower = text.to_lowercase();
    for marker in ["try again in ", "retry after ", "retry in "] {
        let Some((_, rest)) = lower.split_once(marker) else {
            continue;
        };
        let in_number = |c: char| c.is_ascii_digit() || c == '.';
        let num: String = rest.chars().take_while(|c| in_number(*c)).collect();
        let Ok(value) = num.parse::<f64>() else {
            continue;
        };
        let unit = rest.trim_start_matches(in_number).trim_start();
        let ms = if unit.starts_with("ms") || unit.starts_with("milli") {
            value
        } else if unit.starts_with('m') && !unit.starts_with("ms") {
            value * 60_000.0
        } else {
            value * 1000.0
        };
        if ms.is_finite() && ms >= 0.0 {
            return Some(ms.round() as u64);
        }
    }
    None
}

/// Unix seconds (or milliseconds, when the value is too large for seconds)
/// as RFC 3339 UTC.
pub fn rfc3339_from_unix(value: f64) -> Option<String> {
    if !value.is_finite() || value <= 0.0 {
        return None;
    }
    // Values beyond the year 5000 in seconds are milliseconds.
    let secs = if value > 95_617_584_000.0 {
        value / 1000.0
    } else {
        value
    };
    // Past the year 9999 no RFC 3339 text holds it (and an agent's
    // `resetsAt: 1e300` panicked `from_secs_f64`: found by the fuzz target
    // `fuzz_stream_json`).
    if secs >= 253_402_300_800.0 {
        return None;
    }
    let t =
        std::time::UNIX_EPOCH.checked_add(std::time::Duration::try_from_secs_f64(secs).ok()?)?;
    Some(humantime::format_rfc3339_seconds(t).to_string())
}

/// The epoch in Claude's older quota text `Claude AI usage limit
/// reached|1712345678`.
pub fn claude_reset_epoch(text: &str) -> Option<f64> {
    let (_, rest) = text.split_once("limit reached|")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse::<f64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ErrorCode::*;

    #[test]
    fn a_status_after_text_that_is_not_ascii_is_read() {
        // The 16 bytes before the 429 start inside an `é` (two bytes each).
        let text = "xéééééééé 429";
        assert_eq!(statuses_in(text), vec![429]);
        assert_eq!(
            from_text("errör: ééééééé status 500", false),
            Some(ProviderServerError)
        );
    }

    #[test]
    fn the_text_table() {
        let cases: &[(&str, Option<ErrorCode>)] = &[
            // Quota wins over a rate limit named in the same text.
            (
                "429 rate_limit_error: You exceeded your current quota, please check your plan",
                Some(ProviderQuotaExhausted),
            ),
            (
                "You've hit your limit · resets 8am (Europe/London)",
                Some(ProviderQuotaExhausted),
            ),
            (
                "Your credit balance is too low to access the Anthropic API",
                Some(ProviderQuotaExhausted),
            ),
            (
                "Free usage exceeded, add credits",
                Some(ProviderQuotaExhausted),
            ),
            // A bare 429 is never a plain rate limit.
            ("429", Some(ProviderLimitUnknown)),
            ("API Error: 429", Some(ProviderLimitUnknown)),
            // Codex's text for a 429 (codex exec has nothing else).
            (
                "exceeded retry limit, last status: 429 Too Many Requests, request id: r1",
                Some(ProviderLimitUnknown),
            ),
            (
                "This request would exceed your account's rate limit. Please try again later.",
                Some(ProviderRateLimited),
            ),
            ("Too Many Requests", Some(ProviderRateLimited)),
            (
                "API Error: Repeated 529 Overloaded errors",
                Some(ProviderOverloaded),
            ),
            (
                "Selected model is at capacity. Please try a different model.",
                Some(ProviderOverloaded),
            ),
            (
                "API Error: 500 Internal server error",
                Some(ProviderServerError),
            ),
            ("upstream returned status 502", Some(ProviderServerError)),
            ("Invalid API key · Please run /login", Some(ProviderAuth)),
            ("API Error: 401 unauthorized", Some(ProviderAuth)),
            ("Prompt is too long", Some(ContextWindowExceeded)),
            (
                "Codex ran out of room in the model's context window.",
                Some(ContextWindowExceeded),
            ),
            ("model_not_found: no such model", Some(InvalidRequest)),
            ("API Error: 400 bad request", Some(InvalidRequest)),
            ("waited 400 ms", None),
            ("4290 tokens", None),
            ("something else broke", None),
        ];
        for (text, want) in cases {
            assert_eq!(from_text(text, false), *want, "{text}");
        }
    }

    #[test]
    fn resume_refusals_count_only_when_resuming() {
        let text = "Error: No conversation found with session ID: abc";
        assert_eq!(from_text(text, true), Some(ResumeFailed));
        assert_eq!(from_text(text, false), None);
    }

    #[test]
    fn http_statuses() {
        assert_eq!(from_http_status(429, ""), ProviderLimitUnknown);
        assert_eq!(from_http_status(429, "Rate limited"), ProviderRateLimited);
        assert_eq!(
            from_http_status(429, r#"{"error":{"type":"insufficient_quota"}}"#),
            ProviderQuotaExhausted
        );
        assert_eq!(from_http_status(401, ""), ProviderAuth);
        assert_eq!(
            from_http_status(400, "prompt is too long"),
            ContextWindowExceeded
        );
        assert_eq!(
            from_http_status(400, "credit balance is too low"),
            ProviderQuotaExhausted
        );
        assert_eq!(from_http_status(404, "model"), InvalidRequest);
        assert_eq!(from_http_status(529, ""), ProviderOverloaded);
        assert_eq!(
            from_http_status(503, "Provider is overloaded"),
            ProviderOverloaded
        );
        assert_eq!(from_http_status(500, ""), ProviderServerError);
    }

    #[test]
    fn only_rate_limits_are_retryable() {
        for code in [
            ProviderQuotaExhausted,
            ProviderRateLimited,
            ProviderLimitUnknown,
            ProviderOverloaded,
            ProviderServerError,
            ProviderAuth,
            ContextWindowExceeded,
            InvalidRequest,
            ResumeFailed,
            AgentHung,
            AgentTimeout,
            AgentCrashed,
            AgentSpawnFailed,
        ] {
            assert_eq!(
                AgentError::new(code, "x").retryable,
                code == ProviderRateLimited
            );
        }
    }

    #[test]
    fn reset_times() {
        assert_eq!(
            rfc3339_from_unix(1_700_000_000.0).as_deref(),
            Some("2023-11-14T22:13:20Z")
        );
        assert_eq!(
            rfc3339_from_unix(1_700_000_000_000.0).as_deref(),
            Some("2023-11-14T22:13:20Z")
        );
        assert_eq!(
            claude_reset_epoch("Claude AI usage limit reached|1700000000"),
            Some(1_700_000_000.0)
        );
        assert_eq!(retry_after_in_text("Please try again in 2.4s."), Some(2400));
        assert_eq!(retry_after_in_text("try again in 500ms"), Some(500));
        assert_eq!(retry_after_in_text("Retry after 7 seconds"), Some(7000));
        assert_eq!(retry_after_in_text("try again in 2m"), Some(120_000));
        assert_eq!(retry_after_in_text("later"), None);
    }

    #[test]
    fn gemini_cli_errors() {
        // Its text for Google's per-minute throttle (retried, then given up).
        let throttle = "You exceeded your current quota, please check your plan and billing \
                        details. \n* Quota exceeded for metric: x, limit: 10, model: m\nPlease \
                        retry in 1s.\nSuggested retry after 1s.";
        assert_eq!(from_text(throttle, false), Some(ProviderRateLimited));
        let long = throttle.replace("after 1s.", "after 3600s.");
        assert_eq!(from_text(&long, false), Some(ProviderQuotaExhausted));
        assert_eq!(
            from_text("You have exhausted your daily quota on this model.", false),
            Some(ProviderQuotaExhausted)
        );
        let bad_key = r#"{"error":{"code":400,"message":"API key not valid. Please pass a valid API key.","status":"INVALID_ARGUMENT","details":[{"reason":"API_KEY_INVALID"}]}}"#;
        assert_eq!(from_text(bad_key, false), Some(ProviderAuth));
        let denied = r#"{"error":{"code":403,"message":"Your API key was reported as leaked.","status":"PERMISSION_DENIED"}}"#;
        assert_eq!(from_text(denied, false), Some(ProviderAuth));
        assert_eq!(
            from_text("The model is overloaded. Please try again later.", false),
            Some(ProviderOverloaded)
        );
    }
}
