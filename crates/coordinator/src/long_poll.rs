//! The long-poll of the session read (PROTOCOL.md 2.4, "Long-poll of the
//! session read"), as the reference coordinator offers it: every session
//! answer has an `ETag`; a read with `Prefer: wait=N` and a matching
//! `If-None-Match` is held until the session changes (the state's change
//! signal, then a new tag) or N seconds pass (`304`).

use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::server::Shared;
use crate::wire::routes::{PREFER, PREFERENCE_APPLIED};

/// The longest wait this coordinator applies (a larger `wait=` is cut to it).
pub(super) const MAX_WAIT_SECS: u64 = 60;

/// The session answer's body and its entity tag (a hash of the body).
fn current(sh: &Shared) -> (Vec<u8>, String) {
    let body = serde_json::to_vec(&sh.session_envelope()).unwrap_or_else(|_| b"{}".to_vec());
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    (body, format!("\"{:016x}\"", h.finish()))
}

/// The `wait=N` of a `Prefer` header (RFC 7240), capped at
/// [`MAX_WAIT_SECS`].
fn requested_wait(headers: &HeaderMap) -> Option<u64> {
    headers
        .get_all(PREFER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([',', ';']))
        .find_map(|p| {
            let (k, v) = p.trim().split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case("wait")
                .then(|| v.trim().trim_matches('"').parse::<u64>().ok())
                .flatten()
        })
        .map(|n| n.min(MAX_WAIT_SECS))
}

/// Whether an `If-None-Match` value names `etag` (or is `*`).
fn matches(if_none_match: &str, etag: &str) -> bool {
    if_none_match.split(',').any(|t| {
        let t = t.trim();
        t == "*" || t.strip_prefix("W/").unwrap_or(t) == etag
    })
}

fn answer(status: StatusCode, body: Vec<u8>, etag: &str, wait: Option<u64>) -> Response {
    let mut resp = if status == StatusCode::NOT_MODIFIED {
        status.into_response()
    } else {
        (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response()
    };
    if let Ok(v) = HeaderValue::from_str(etag) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    if let Some(n) = wait
        && let Ok(v) = HeaderValue::from_str(&format!("wait={n}"))
    {
        resp.headers_mut().insert(PREFERENCE_APPLIED, v);
    }
    resp
}

/// The session read's answer (its checks passed), held as the extension
/// says.
pub(super) async fn session_answer(sh: &Shared, headers: &HeaderMap) -> Response {
    let wait = requested_wait(headers);
    let seen = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let deadline = Instant::now() + Duration::from_secs(wait.unwrap_or(0));
    loop {
        // Armed before the state is read, so a change in between wakes it.
        let changed = sh.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let (body, etag) = current(sh);
        let unchanged = seen.as_deref().is_some_and(|s| matches(s, &etag));
        if !unchanged {
            return answer(StatusCode::OK, body, &etag, wait);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        // Without a wait, a plain conditional GET: `304` at once.
        if left.is_zero() || tokio::time::timeout(left, changed).await.is_err() {
            return answer(StatusCode::NOT_MODIFIED, Vec::new(), &etag, wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_and_the_tags_are_read_as_the_rfcs_write_them() {
        let mut h = HeaderMap::new();
        h.insert(PREFER, HeaderValue::from_static("respond-async, wait=10"));
        assert_eq!(requested_wait(&h), Some(10));
        h.insert(PREFER, HeaderValue::from_static("wait=3600"));
        assert_eq!(requested_wait(&h), Some(MAX_WAIT_SECS));
        h.insert(PREFER, HeaderValue::from_static("return=minimal"));
        assert_eq!(requested_wait(&h), None);
        assert!(matches("\"a\", W/\"b\"", "\"b\""));
        assert!(matches("*", "\"b\""));
        assert!(!matches("\"a\"", "\"b\""));
    }
}
