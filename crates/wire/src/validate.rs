//! The value checks of PROTOCOL.md section 5 (path-safe ids, git values) and
//! the URL rule of section 1. Errors name the value (never a secret) and what
//! is expected of it.

use std::net::IpAddr;

use url::Url;

/// A value that failed a check: `what` names the field, `value` is the
/// offending value (ids and branches are not secret; a URL is shown without
/// its user info, query and fragment, see [`shown_url`]), `reason` says why.
#[derive(Debug, thiserror::Error)]
#[error("invalid {what} {value:?}: {reason}")]
pub struct CheckError {
    /// The field, e.g. `session id`.
    pub what: String,
    /// The offending value.
    pub value: String,
    /// Why it fails and what is expected.
    pub reason: String,
}

/// Longest value quoted in an error (characters); longer ones are cut.
const MAX_QUOTED_CHARS: usize = 160;

fn fail(what: &str, value: &str, reason: impl Into<String>) -> CheckError {
    CheckError {
        what: what.to_string(),
        value: crate::text::clip(value, MAX_QUOTED_CHARS),
        reason: reason.into(),
    }
}

/// Whether `name` is a portable environment variable name,
/// `[A-Za-z_][A-Za-z0-9_]*` (what a shell can export).
pub fn env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Path-safe id (section 5): 1 to 128 characters of `[A-Za-z0-9._-]`, not `.`
/// or `..`, not starting with `-`.
pub fn path_safe_id(what: &str, value: &str) -> Result<(), CheckError> {
    if value.is_empty() || value.len() > 128 {
        return Err(fail(what, value, "must be 1 to 128 characters long"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(fail(what, value, "may contain only A-Z a-z 0-9 . _ -"));
    }
    if value == "." || value == ".." {
        return Err(fail(what, value, "must not be . or .."));
    }
    if value.starts_with('-') {
        return Err(fail(what, value, "must not start with -"));
    }
    Ok(())
}

fn git_value(what: &str, value: &str) -> Result<(), CheckError> {
    if value.is_empty() {
        return Err(fail(what, value, "must not be empty"));
    }
    if value.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(fail(
            what,
            value,
            "must not contain spaces or control characters",
        ));
    }
    if value.starts_with('-') {
        return Err(fail(what, value, "must not start with -"));
    }
    Ok(())
}

/// The repository of a repo token's `repoFullName` (2.5), from which the
/// clone URL is built: `owner/name`, each a path-safe id (section 5), so
/// the URL can hold no traversal, control character, leading `-` or
/// transport prefix.
pub fn repo_full_name(value: &str) -> Result<(), CheckError> {
    let parts: Vec<&str> = value.split('/').collect();
    let each_safe = parts
        .iter()
        .all(|p| path_safe_id("repoFullName", p).is_ok());
    if parts.len() != 2 || !each_safe {
        return Err(fail(
            "repoFullName",
            value,
            "must be owner/name, each 1 to 128 characters of A-Z a-z 0-9 . _ -, not . or .., not starting with -",
        ));
    }
    Ok(())
}

/// Git value check for a branch (section 5): a git value that is also a valid
/// branch name by `git check-ref-format --branch` rules.
pub fn git_branch(what: &str, value: &str) -> Result<(), CheckError> {
    git_value(what, value)?;
    if value == "HEAD" || value.starts_with("@{") || value == "@" {
        return Err(fail(what, value, "is not a valid branch name"));
    }
    if !git2::Reference::is_valid_name(&format!("refs/heads/{value}")) {
        return Err(fail(
            what,
            value,
            "is not a valid branch name (git check-ref-format --branch)",
        ));
    }
    Ok(())
}

/// Whether `http` is allowed for this URL's host: loopback only, unless the
/// operator set `HOSTED_BOOT_INSECURE_HTTP=1` (section 1).
pub fn is_loopback_host(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        None => false,
    }
}

/// `value` (a URL, or what was meant as one) as an error may quote it
/// (PROTOCOL.md section 1): user info (`user:password@`, possibly a
/// credential) becomes `…@`, a query `?…` and a fragment `#…` (either may
/// carry a token).
///
/// Where the URL parser (the one the runner itself uses) reads the value as
/// a URL with a host, only its scheme, host, port and path are shown, as
/// the parser read them. Otherwise (no parse, or no host, such as
/// `user:pw@host` read as scheme `user`) it works on the text and shows
/// nothing that may be user info: everything after a leading `scheme://`
/// (or from the start) up to and including the value's last `@` (or `%40`,
/// an encoded `@`) becomes `…@`, wherever that `@` is (path, query), and
/// what follows is cut at its first `?` or `#`.
pub fn shown_url(value: &str) -> String {
    match Url::parse(value) {
        Ok(url) if url.host_str().is_some_and(|h| !h.is_empty()) => shown_parsed(&url),
        _ => shown_text(value),
    }
}

fn shown_parsed(url: &Url) -> String {
    let mut shown = format!("{}://", url.scheme());
    if !url.username().is_empty() || url.password().is_some() {
        shown.push_str("…@");
    }
    shown.push_str(url.host_str().unwrap_or_default());
    if let Some(port) = url.port() {
        shown.push_str(&format!(":{port}"));
    }
    shown.push_str(url.path());
    if url.query().is_some() {
        shown.push_str("?…");
    }
    if url.fragment().is_some() {
        shown.push_str("#…");
    }
    shown
}

fn shown_text(value: &str) -> String {
    // Only a scheme at the very start counts: a `://` later on may be in a
    // password, a path or a query.
    let scheme_len = value
        .split_once("://")
        .filter(|(scheme, _)| {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
        })
        .map_or(0, |(scheme, _)| scheme.len() + 3);
    let (scheme, rest) = value.split_at(scheme_len);
    let mut shown = String::from(scheme);
    let after_user_info = match last_at(rest).and_then(|end| rest.split_at_checked(end)) {
        Some((_, after)) => {
            shown.push_str("…@");
            after
        }
        None => rest,
    };
    let query_at = after_user_info
        .find(['?', '#'])
        .unwrap_or(after_user_info.len());
    let (before_query, query) = after_user_info.split_at(query_at);
    shown.push_str(before_query);
    if query.starts_with('?') {
        shown.push_str("?…");
    }
    if query.contains('#') {
        shown.push_str("#…");
    }
    shown
}

/// The byte offset just after the last `@` or `%40` of `text`.
fn last_at(text: &str) -> Option<usize> {
    let at = text.rfind('@').map(|i| i + 1);
    let encoded = text.to_ascii_lowercase().rfind("%40").map(|i| i + 3);
    at.max(encoded)
}

/// Parses and checks a coordinator or git URL (sections 1 and 5): absolute,
/// `https` (or `http` for a loopback host, or any host when `insecure_http`),
/// with no user info, query or fragment. An error quotes the URL as
/// [`shown_url`] shows it, never its user info (section 1).
pub fn url(what: &str, value: &str, insecure_http: bool) -> Result<Url, CheckError> {
    checked_url(what, value, Some(insecure_http))
}

/// [`url`] without the rule on plain `http`, which depends on
/// `HOSTED_BOOT_INSECURE_HTTP`: for a flag parsed before the others are
/// known; [`http_allowed`] applies the rule once they are.
pub fn url_syntax(what: &str, value: &str) -> Result<Url, CheckError> {
    checked_url(what, value, None)
}

/// The rule of [`url`] on plain `http`, for a URL [`url_syntax`] accepted.
pub fn http_allowed(what: &str, url: &Url, insecure_http: bool) -> Result<(), CheckError> {
    if url.scheme() == "http" && !insecure_http && !is_loopback_host(url) {
        return Err(fail(what, &shown_url(url.as_str()), PLAIN_HTTP));
    }
    Ok(())
}

const PLAIN_HTTP: &str = "must be https (plain http is accepted only for loopback hosts, or with HOSTED_BOOT_INSECURE_HTTP=1)";

/// [`url`]'s checks in their order; `insecure_http` `None` accepts plain
/// `http` for any host.
fn checked_url(what: &str, value: &str, insecure_http: Option<bool>) -> Result<Url, CheckError> {
    let shown = shown_url(value);
    let refuse = |reason: String| fail(what, &shown, reason);
    git_value(what, value).map_err(|e| refuse(e.reason))?;
    let url = Url::parse(value).map_err(|e| refuse(format!("is not a URL ({e})")))?;
    match url.scheme() {
        "https" => {}
        "http" if insecure_http.is_none_or(|insecure| insecure || is_loopback_host(&url)) => {}
        "http" => return Err(refuse(PLAIN_HTTP.into())),
        other => return Err(refuse(format!("has scheme {other:?}; must be https"))),
    }
    if url.host().is_none() {
        return Err(refuse("has no host".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(refuse(
            "must not contain user info (a user name or password, shown here as …@); remove it: the runner authenticates with the boot secret and bearers"
                .into(),
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(refuse(
            "must not contain a query or fragment (shown here as ?… or #…)".into(),
        ));
    }
    Ok(url)
}

/// Checks an `artifactsRemote` (PROTOCOL.md 2.5): exactly
/// `https://<32 hex>.artifacts.cloudflare.net/git/<ns>/<name>.git`, equal to
/// its own canonical form.
pub fn artifacts_remote(value: &str) -> Result<Url, CheckError> {
    let what = "artifactsRemote";
    let url = url(what, value, false)?;
    let shape_error = || {
        fail(
            what,
            &shown_url(value),
            "must be https://<32 hex>.artifacts.cloudflare.net/git/<ns>/<name>.git",
        )
    };
    if url.scheme() != "https" || url.port().is_some() || url.as_str() != value {
        return Err(shape_error());
    }
    let host = url.host_str().unwrap_or_default();
    let Some(label) = host.strip_suffix(".artifacts.cloudflare.net") else {
        return Err(shape_error());
    };
    if label.len() != 32 || !label.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(shape_error());
    }
    let segments: Vec<&str> = url.path().trim_start_matches('/').split('/').collect();
    let ok = matches!(segments.as_slice(), ["git", ns, name]
        if !ns.is_empty() && name.len() > 4 && name.ends_with(".git"));
    if !ok {
        return Err(shape_error());
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names_are_portable_shell_names() {
        for ok in ["A", "_", "PATH", "a_1", "_X9"] {
            assert!(env_name(ok), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A B", "A=B", "É", "AÉ"] {
            assert!(!env_name(bad), "{bad}");
        }
    }

    #[test]
    fn path_safe_ids() {
        for ok in ["s1", "run-1", "a.b_c-d", &"x".repeat(128)] {
            path_safe_id("id", ok).unwrap();
        }
        for bad in ["", ".", "..", "-x", "a/b", "a b", &"x".repeat(129), "é"] {
            assert!(path_safe_id("id", bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn branches() {
        for ok in ["main", "feature/x", "orizu/session-1"] {
            git_branch("branch", ok).unwrap();
        }
        for bad in [
            "", "-x", "a b", "a..b", "a.lock", "HEAD", "x~1", "a\nb", "/a", "a/",
        ] {
            assert!(git_branch("branch", bad).is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn urls() {
        url("u", "https://example.com/a", false).unwrap();
        url("u", "http://127.0.0.1:8080/a", false).unwrap();
        url("u", "http://localhost/a", false).unwrap();
        url("u", "http://[::1]/a", false).unwrap();
        assert!(url("u", "http://example.com/a", false).is_err());
        url("u", "http://example.com/a", true).unwrap();
        assert!(url("u", "https://u:p@example.com/a", false).is_err());
        assert!(url("u", "https://example.com/a?x=1", false).is_err());
        assert!(url("u", "ftp://example.com/a", false).is_err());
    }

    #[test]
    fn url_errors_never_quote_user_info_query_or_fragment() {
        for (value, shown) in [
            (
                "https://u:pw-secret@example.com/a/",
                "https://…@example.com/a/",
            ),
            ("http://u:pw-secret@example.com/a", "http://…@example.com/a"),
            (
                "https://pw-secret@exa mple.com/s",
                "https://…@exa mple.com/s",
            ),
            ("https://u:pw-secret@[::1/x", "https://…@[::1/x"),
            (
                "https://a:b@c@example.com/?t=pw-secret#pw-secret",
                "https://…@example.com/?…#…",
            ),
            (
                "https://u:pw-secret/x@example.com/",
                "https://…@example.com/",
            ),
            ("u:pw-secret@example.com/x", "…@example.com/x"),
            ("https://example.com/a#pw-secret", "https://example.com/a#…"),
        ] {
            assert_eq!(shown_url(value), shown, "{value}");
            let e = url("ORIZU_API_BASE_URL", value, false)
                .unwrap_err()
                .to_string();
            assert!(!e.contains("pw-secret"), "{e}");
            assert!(e.contains(shown), "{e}");
        }
        assert_eq!(shown_url("https://example.com/a"), "https://example.com/a");
    }

    /// Inputs a text rule splitting at the first `://` got wrong, and
    /// inputs the URL parser reads in ways a reader may not expect: none
    /// may quote what could be a password.
    #[test]
    fn tricky_urls_are_shown_without_their_user_info() {
        for (value, shown) in [
            ("user:pw-secret@example.com", "…@example.com"),
            ("https:u:pw-secret@example.com", "https://…@example.com/"),
            (
                "https:user:pw-secret@example.com/api/?next=https://example.com/",
                "https://…@example.com/api/?…",
            ),
            (
                "user:pw-secret@example.com/t?back=https://example.com/",
                "…@example.com/t?…",
            ),
            (
                "https://u:pw-secret@h/x?y=https://a:pw-secret@c",
                "https://…@h/x?…",
            ),
            ("//u:pw-secret@example.com/x", "…@example.com/x"),
            ("https://example.com/@x", "https://example.com/@x"),
            (
                "https://u%40x:pw-secret@example.com/",
                "https://…@example.com/",
            ),
            (
                "https://u:pw-secret%40example.com/",
                "https://…@example.com/",
            ),
            ("u:pw-secret%40example.com/x", "…@example.com/x"),
            ("u:pw-secret%40exa mple.com/x@", "…@"),
            ("http://u:pw-secret@[::1/x?y=1", "http://…@[::1/x?…"),
            ("u:pw-secret?x@h/", "…@h/"),
            ("https://u:pw-secret?x@h/", "https://…@h/"),
            ("user://pw-secret@[x/", "user://…@[x/"),
            (
                "https://example.com:8443/a?b#c",
                "https://example.com:8443/a?…#…",
            ),
        ] {
            assert_eq!(shown_url(value), shown, "{value}");
            assert!(!shown_url(value).contains("pw-secret"), "{value}");
            if let Err(e) = url("ORIZU_API_BASE_URL", value, false) {
                assert!(!e.to_string().contains("pw-secret"), "{e}");
            }
        }
    }

    #[test]
    fn artifacts_remotes() {
        let hex = "0123456789abcdef0123456789abcdef";
        artifacts_remote(&format!(
            "https://{hex}.artifacts.cloudflare.net/git/ns/repo.git"
        ))
        .unwrap();
        for bad in [
            format!("https://{hex}.artifacts.cloudflare.net:444/git/ns/repo.git"),
            format!("https://{hex}.artifacts.cloudflare.net/git/ns/repo"),
            format!("https://{hex}.evil.net/git/ns/repo.git"),
            "https://abc.artifacts.cloudflare.net/git/ns/repo.git".to_string(),
            format!("https://{hex}.artifacts.cloudflare.net/git/ns/x/repo.git"),
        ] {
            assert!(artifacts_remote(&bad).is_err(), "{bad} passed");
        }
    }
}
