//! The one type that holds secret values (boot secret, bearers, repo tokens,
//! connector values), so that no `Debug`, `Display` or log line prints one.
//!
//! [`Secret`] deserializes from a JSON string but does not implement
//! `Serialize`: a wire field that must carry the value says so with
//! `#[serde(serialize_with = "crate::secret::serialize_exposed")]`, so no
//! secret can end up in an event, a log record or any other serialized
//! structure by accident.

use std::fmt;
use std::sync::Arc;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer, Serializer};

/// A secret string. `Debug` and `Display` print `[REDACTED]`; the memory is
/// zeroed when the last clone is dropped. The value comes out only through
/// [`Secret::expose`], which makes every use greppable.
#[derive(Clone)]
pub struct Secret(Arc<SecretString>);

impl Secret {
    /// Wraps `value`; the `String` is moved, not copied.
    pub fn new(value: String) -> Self {
        Secret(Arc::new(SecretString::from(value)))
    }

    /// Whether the value is empty (reveals nothing else).
    pub fn is_empty(&self) -> bool {
        self.expose().is_empty()
    }

    /// The secret value. Never format it into an error, a log line, a process
    /// argument or a URL.
    pub fn expose(&self) -> &str {
        self.0.expose_secret()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.expose() == other.expose()
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Secret::new(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Secret::new(value.to_string())
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret::new)
    }
}

/// Serializes the secret's value: for the wire fields of PROTOCOL.md
/// section 2 that carry one (the tokens the reference coordinator answers,
/// connector values), named in a `serialize_with` attribute so that every
/// such field is greppable. Never use it for an event, a log or a file
/// other than the secret files of section 3.
///
/// Errors: those of the serializer.
pub fn serialize_exposed<S: Serializer>(secret: &Secret, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(secret.expose())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_never_print_the_value() {
        let s = Secret::new("hunter2-very-secret".to_string());
        assert_eq!(format!("{s:?}"), "[REDACTED]");
        assert_eq!(format!("{s}"), "[REDACTED]");
        assert_eq!(s.expose(), "hunter2-very-secret");
        assert_eq!(format!("{:?}", Some(s.clone())), "Some([REDACTED])");
    }

    #[test]
    fn deserializes_from_a_string_and_serializes_only_when_named() {
        #[derive(serde::Serialize, serde::Deserialize, Debug)]
        struct Wire {
            #[serde(serialize_with = "serialize_exposed")]
            token: Secret,
        }
        let w: Wire = serde_json::from_str(r#"{"token":"tok-123456"}"#).unwrap();
        assert_eq!(w.token.expose(), "tok-123456");
        assert_eq!(format!("{w:?}"), "Wire { token: [REDACTED] }");
        assert_eq!(
            serde_json::to_string(&w).unwrap(),
            r#"{"token":"tok-123456"}"#
        );
    }
}
