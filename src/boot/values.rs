//! The value parsers of the runner's flags (`RunArgs`): each duration, size,
//! URL and name is checked where clap reads it, so a bad value stops the
//! parse with a message that quotes the value (cut at [`QUOTED_CHARS`], a
//! URL without its user info) and says what to write; `cli::report` puts
//! the flag and its variable in front. An empty variable never reaches
//! these (`cli::parse` treats it as unset); an empty value given on the
//! command line does. Rules that depend on another flag (plain `http` and
//! `HOSTED_BOOT_INSECURE_HTTP`) stay in `config::load`.

use std::time::Duration;

use reqwest::Url;

use crate::agent::AgentKind;
use crate::egress::Canary;
use crate::timings::parse_duration;

/// The longest value quoted in a message, in characters.
const QUOTED_CHARS: usize = 80;

fn quoted(text: &str) -> String {
    crate::text::clip(text, QUOTED_CHARS)
}

/// A flag's value that does not parse; the message quotes the value (a
/// URL without its user info) and says what to write.
#[derive(Debug, thiserror::Error)]
pub enum InvalidValue {
    /// Not a duration.
    #[error(transparent)]
    Duration(#[from] crate::timings::InvalidDuration),
    /// Zero where a positive duration is needed.
    #[error("{0:?} is not a positive duration; write it like 10m or 90s")]
    NotPositive(String),
    /// Longer than the setting's bound.
    #[error("{text:?} is longer than {max}, the most this setting takes")]
    TooLong {
        /// The value.
        text: String,
        /// The bound, as a person writes it.
        max: &'static str,
    },
    /// Not a size.
    #[error(
        "{text:?} is not a size ({error}); write it like 100MiB, 50MB or 1048576, or 0 for no limit"
    )]
    Size {
        /// The value.
        text: String,
        /// bytesize's reason.
        error: String,
    },
    /// Not an agent the runner drives.
    #[error("unknown agent {0:?}; the agents are: {names}", names = agent_names())]
    UnknownAgent(String),
    /// A URL or canary that fails its check.
    #[error(transparent)]
    Check(#[from] crate::validate::CheckError),
    /// Not in (0, 1].
    #[error("{0:?} is not a number in (0, 1]")]
    TimeScale(String),
    /// Not an RFC 3339 time.
    #[error("{text:?} is not an RFC 3339 time ({error}); write it like 2026-12-07T06:00:00Z")]
    Time {
        /// The value (cut at 80 characters).
        text: String,
        /// humantime's reason.
        error: String,
    },
}

/// `--agent`: a CLI adapter, `command`, or `demo` (the built-in demo agent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentChoice {
    /// An adapter.
    Kind(AgentKind),
    /// `demo`: the `command` agent running this binary's `demo-agent`.
    Demo,
}

/// `--agent demo` (what `hosted-boot-coordinator demo` and the reference
/// coordinator's printed `env` line use).
pub const DEMO_AGENT: &str = "demo";

/// Every name `--agent` takes, for messages.
pub fn agent_names() -> String {
    let mut names: Vec<&str> = AgentKind::ALL.iter().map(|k| k.name()).collect();
    names.push(DEMO_AGENT);
    names.join(", ")
}

/// Parses `--agent`.
pub fn agent(text: &str) -> Result<AgentChoice, InvalidValue> {
    let name = text.trim();
    if name == DEMO_AGENT {
        return Ok(AgentChoice::Demo);
    }
    AgentKind::from_name(name)
        .map(AgentChoice::Kind)
        .ok_or_else(|| InvalidValue::UnknownAgent(quoted(name)))
}

/// `--agent-idle-timeout`'s value when empty: the default (10 min).
pub fn idle_timeout(text: &str) -> Result<Duration, InvalidValue> {
    match text.trim() {
        "" => Ok(crate::agent::AgentTimings::default()
            .idle_timeout
            .unwrap_or_default()),
        text => Ok(parse_duration(text)?),
    }
}

/// `--wrap-up-before`: a duration (`0`: no wrap-up); empty is the default
/// (2 min).
pub fn wrap_up_before(text: &str) -> Result<Duration, InvalidValue> {
    match text.trim() {
        "" => Ok(DEFAULT_WRAP_UP_BEFORE),
        text => Ok(parse_duration(text)?),
    }
}

/// `--retire-at`: an RFC 3339 time with its offset (`Z` or `+01:00`).
pub fn retire_at(text: &str) -> Result<std::time::SystemTime, InvalidValue> {
    let invalid = |error: String| InvalidValue::Time {
        text: crate::text::clip(text, 80),
        error,
    };
    let at =
        time::OffsetDateTime::parse(text.trim(), &time::format_description::well_known::Rfc3339)
            .map_err(|e| invalid(e.to_string()))?;
    let unix = at.unix_timestamp_nanos();
    let since = std::time::Duration::from_nanos(u64::try_from(unix.max(0)).unwrap_or(u64::MAX));
    Ok(std::time::UNIX_EPOCH + since)
}

/// `--wrap-up-before`'s default.
pub const DEFAULT_WRAP_UP_BEFORE: Duration = Duration::from_secs(120);

/// `--setup-timeout`: a positive duration; empty is the default (10 min).
pub fn setup_timeout(text: &str) -> Result<Duration, InvalidValue> {
    let timeout = match text.trim() {
        "" => crate::turn::setup::DEFAULT_TIMEOUT,
        text => parse_duration(text)?,
    };
    if timeout.is_zero() {
        return Err(InvalidValue::NotPositive(quoted(text)));
    }
    Ok(timeout)
}

/// `--on-stop-timeout`: a positive duration; empty is the default (30 s).
pub fn on_stop_timeout(text: &str) -> Result<Duration, InvalidValue> {
    let timeout = match text.trim() {
        "" => super::on_stop::DEFAULT_TIMEOUT,
        text => parse_duration(text)?,
    };
    if timeout.is_zero() {
        return Err(InvalidValue::NotPositive(quoted(text)));
    }
    // A cleanup, not a job: a bound past a day is a typo (and far past it,
    // one no clock can add).
    if timeout > MAX_ON_STOP_TIMEOUT {
        return Err(InvalidValue::TooLong {
            text: quoted(text),
            max: "24h",
        });
    }
    Ok(timeout)
}

/// The most `--on-stop-timeout` takes (24 h).
pub const MAX_ON_STOP_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// The default of `--harvest-max-file-size`: GitHub's hard limit on a file.
pub const DEFAULT_HARVEST_MAX_FILE_SIZE: u64 = 100 * 1024 * 1024;

/// Parses `--harvest-max-file-size`: a byte count with an optional unit
/// (`100MiB`, `50 MB`, `1048576`; binary units are powers of 1024, decimal
/// ones of 1000). `0` is no limit; empty is the default.
pub fn file_size(text: &str) -> Result<u64, InvalidValue> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(DEFAULT_HARVEST_MAX_FILE_SIZE);
    }
    text.parse::<bytesize::ByteSize>()
        .map(|b| b.as_u64())
        .map_err(|error| InvalidValue::Size {
            text: quoted(text),
            error,
        })
}

/// Parses `--git-base-url` (a trailing `/` dropped): every rule of a
/// contract URL but plain `http`'s, which `load` checks.
pub fn git_base_url(text: &str) -> Result<Url, InvalidValue> {
    Ok(crate::validate::url_syntax(
        "URL",
        text.trim_end_matches('/'),
    )?)
}

/// Parses `--egress-canary`.
pub fn egress_canary(text: &str) -> Result<Canary, InvalidValue> {
    Ok(Canary::parse("value", text)?)
}

/// Parses `HOSTED_BOOT_TEST_TIME_SCALE`: a number in (0, 1].
pub fn time_scale(text: &str) -> Result<f64, InvalidValue> {
    match text.trim().parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(InvalidValue::TimeScale(quoted(text))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retire_at_takes_rfc_3339_with_any_offset_and_nothing_else() {
        let z = retire_at("2026-12-07T06:00:00Z").unwrap();
        assert_eq!(retire_at("2026-12-07T07:00:00+01:00").unwrap(), z);
        assert_eq!(retire_at("2026-12-07T06:00:00-00:00").unwrap(), z);
        assert_eq!(retire_at(" 2026-12-07T06:00:00.000Z ").unwrap(), z);
        for bad in ["2026-12-07T06:00:00", "2026-12-07 06:00:00", "tomorrow", ""] {
            assert!(retire_at(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn file_size_limits_parse_in_the_documented_forms() {
        let p = |t: &str| file_size(t).unwrap();
        assert_eq!(p(""), 100 * 1024 * 1024);
        assert_eq!(p("100MiB"), 100 * 1024 * 1024);
        assert_eq!(p("1 MiB"), 1024 * 1024);
        assert_eq!(p("50MB"), 50_000_000);
        assert_eq!(p("1048576"), 1_048_576);
        assert_eq!(p("0"), 0);
        let e = file_size("lots").unwrap_err().to_string();
        assert!(e.contains("\"lots\"") && e.contains("100MiB"), "{e}");
    }

    #[test]
    fn values_are_quoted_cut_and_empty_ones_are_defaults() {
        assert_eq!(agent(" demo ").unwrap(), AgentChoice::Demo);
        let e = agent("nope").unwrap_err().to_string();
        assert!(e.contains("\"nope\"") && e.contains("command, demo"), "{e}");
        let e = agent(&"x".repeat(10_000)).unwrap_err().to_string();
        assert!(e.len() < 400 && e.contains('…'), "{e}");
        assert!(egress_canary("  ").is_err());
        assert_eq!(idle_timeout("").unwrap(), Duration::from_secs(600));
        assert_eq!(idle_timeout("0").unwrap(), Duration::ZERO);
        assert_eq!(setup_timeout("").unwrap(), Duration::from_secs(600));
        assert!(
            setup_timeout("0s")
                .unwrap_err()
                .to_string()
                .contains("positive")
        );
        assert_eq!(on_stop_timeout("").unwrap(), Duration::from_secs(30));
        assert_eq!(on_stop_timeout("2m").unwrap(), Duration::from_secs(120));
        assert!(
            on_stop_timeout("0")
                .unwrap_err()
                .to_string()
                .contains("positive")
        );
    }

    #[test]
    fn a_base_url_is_checked_but_for_plain_http() {
        assert_eq!(
            git_base_url("http://git.example/").unwrap().as_str(),
            "http://git.example/"
        );
        let e = git_base_url("https://user:pw-SEKRIT@[::1/x")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("SEKRIT"), "{e}");
        assert!(git_base_url("ftp://git.example").is_err());
    }

    #[test]
    fn a_time_scale_is_in_the_unit_interval() {
        assert_eq!(time_scale("0.05").unwrap(), 0.05);
        for bad in ["0", "1.5", "NaN", "", "x"] {
            assert!(time_scale(bad).is_err(), "{bad}");
        }
    }
}
