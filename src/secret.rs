//! The one type that holds secret values (boot secret, bearers, repo tokens,
//! connector values), so that no `Debug`, `Display` or log line prints one.

use std::fmt;
use std::sync::Arc;

use secrecy::{ExposeSecret, SecretString};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_and_display_never_print_the_value() {
        let s = Secret::new("hunter2-very-secret".to_string());
        assert_eq!(format!("{s:?}"), "[REDACTED]");
        assert_eq!(format!("{s}"), "[REDACTED]");
        assert_eq!(s.expose(), "hunter2-very-secret");
    }
}
