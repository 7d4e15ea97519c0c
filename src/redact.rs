//! The redactor: every secret value the runner knows, replaced by
//! `[REDACTED]` in everything it sends or logs (PROTOCOL.md section 5).
//!
//! One `Redactor` is shared (cheap clones) by the event sink, the logger and
//! every error path; bearers and repo tokens are added as they are minted.
//! Matching is aho-corasick over every occurrence of every pattern
//! (overlapping search), and the union of the matched ranges is replaced, so
//! neither a secret that contains another nor two overlapping secrets leak a
//! tail.

use std::sync::{Arc, RwLock};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use base64::Engine;

use crate::secret::Secret;

/// The replacement text.
pub const REDACTED: &str = "[REDACTED]";

/// Connector and `redactVars` values shorter than this (bytes) are not
/// redacted: they would shred ordinary text (PROTOCOL.md section 5).
pub const MIN_REDACTED_LEN: usize = 6;

/// How a value entered the redactor, which decides the length floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretKind {
    /// Boot secret, bearers, repo tokens: always redacted.
    Credential,
    /// Connector and `redactVars` values: redacted from 6 bytes on.
    Configured,
}

/// Shared, growable set of secret values.
#[derive(Clone, Default)]
pub struct Redactor {
    inner: Arc<RwLock<Inner>>,
}

#[derive(Default)]
struct Inner {
    patterns: Vec<String>,
    matcher: Option<AhoCorasick>,
}

impl Redactor {
    /// An empty redactor.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a secret. Returns `false` (and adds nothing) for a `Configured`
    /// value shorter than [`MIN_REDACTED_LEN`] bytes or an empty value; the
    /// caller logs that such a variable exists, without its value.
    ///
    /// Besides the raw value, its JSON-escaped form and the base64 of
    /// `x-access-token:<value>` (git's Basic auth) are matched.
    pub fn add(&self, secret: &Secret, kind: SecretKind) -> bool {
        let value = secret.expose();
        if value.is_empty() || (kind == SecretKind::Configured && value.len() < MIN_REDACTED_LEN) {
            return false;
        }
        let mut forms = vec![value.to_string()];
        let escaped = serde_json::to_string(value).unwrap_or_default();
        let escaped = escaped
            .strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .unwrap_or_default();
        if !escaped.is_empty() && escaped != value {
            forms.push(escaped.to_string());
        }
        let basic =
            base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{value}"));
        forms.push(basic);

        let mut inner = match self.inner.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let before = inner.patterns.len();
        for form in forms {
            if !inner.patterns.contains(&form) {
                inner.patterns.push(form);
            }
        }
        if inner.patterns.len() != before {
            inner.matcher = AhoCorasickBuilder::new()
                .match_kind(MatchKind::Standard)
                .build(&inner.patterns)
                .ok();
        }
        true
    }

    /// `text` with every known secret replaced by `[REDACTED]`; adjacent or
    /// overlapping matches become one `[REDACTED]`.
    pub fn redact(&self, text: &str) -> String {
        let inner = match self.inner.read() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        let Some(matcher) = &inner.matcher else {
            return text.to_string();
        };
        // Overlapping matches are reported by end position, so collect,
        // sort by start and merge before replacing.
        let mut ranges: Vec<(usize, usize)> = matcher
            .find_overlapping_iter(text)
            .map(|m| (m.start(), m.end()))
            .collect();
        if ranges.is_empty() {
            return text.to_string();
        }
        ranges.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        let mut current = ranges[0];
        for &(start, end) in &ranges[1..] {
            if start <= current.1 {
                current.1 = current.1.max(end);
            } else {
                out.push_str(&text[last..current.0]);
                out.push_str(REDACTED);
                last = current.1;
                current = (start, end);
            }
        }
        out.push_str(&text[last..current.0]);
        out.push_str(REDACTED);
        out.push_str(&text[current.1..]);
        out
    }

    /// Whether `text` contains a known secret (for assertions and checks).
    pub fn contains_secret(&self, text: &str) -> bool {
        let inner = match self.inner.read() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        inner.matcher.as_ref().is_some_and(|m| m.is_match(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(values: &[&str]) -> Redactor {
        let r = Redactor::new();
        for v in values {
            assert!(r.add(&Secret::new(v.to_string()), SecretKind::Credential));
        }
        r
    }

    #[test]
    fn replaces_every_occurrence() {
        let r = r(&["s3cr3t-value"]);
        assert_eq!(
            r.redact("a s3cr3t-value b s3cr3t-value"),
            "a [REDACTED] b [REDACTED]"
        );
    }

    #[test]
    fn longest_match_wins_and_overlaps_merge() {
        let r = r(&["abcdef", "abcdefghij", "ghijkl"]);
        assert_eq!(r.redact("xx abcdefghij yy"), "xx [REDACTED] yy");
        assert_eq!(r.redact("xx abcdefghijkl yy"), "xx [REDACTED] yy");
        assert_eq!(r.redact("abcdefghijkl"), "[REDACTED]");
        assert_eq!(r.redact("abcdefghijkl-ghijkl"), "[REDACTED]-[REDACTED]");
        assert_eq!(r.redact("abcdefabcdef"), "[REDACTED]");
        let nested = super::tests::r(&["cdxx", "ab-cdxx-yz", "zz-q1"]);
        assert_eq!(
            nested.redact("0ab-cdxx-yz1 cdxx zz-q1"),
            "0[REDACTED]1 [REDACTED] [REDACTED]"
        );
    }

    #[test]
    fn json_escaped_form_is_matched() {
        let r = r(&["p\"a\\ss/wörd"]);
        let line = serde_json::json!({"text": "token is p\"a\\ss/wörd"}).to_string();
        assert!(!r.redact(&line).contains("wörd"));
    }

    #[test]
    fn basic_auth_form_is_matched() {
        let r = r(&["ghs_token123"]);
        let b = base64::engine::general_purpose::STANDARD.encode("x-access-token:ghs_token123");
        assert_eq!(
            r.redact(&format!("Authorization: Basic {b}")),
            "Authorization: Basic [REDACTED]"
        );
    }

    #[test]
    fn short_configured_values_are_skipped() {
        let r = Redactor::new();
        assert!(!r.add(&Secret::new("abc".into()), SecretKind::Configured));
        assert!(r.add(&Secret::new("abc".into()), SecretKind::Credential));
        assert_eq!(r.redact("xabcx"), "x[REDACTED]x");
    }
}
