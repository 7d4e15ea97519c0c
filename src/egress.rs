//! The egress canary (PROTOCOL.md 4.1 step 3, "The egress canary"): before
//! the first agent starts, the runner tries to reach a host the sandbox's
//! egress policy must block. Reached, the policy the sandbox was promised is
//! not enforced: no agent runs and the first turn fails
//! `egress_policy_missing`. Refused, reset, timed out, unroutable or a name
//! that does not resolve: the check passes, and the log says which.
//!
//! The check starts at boot as soon as the session is read
//! ([`Pending::start`]), concurrently with the clone and the rest of the
//! boot, and the first turn waits for its report ([`Pending::take`]) just
//! before its agent would start, so a canary that times out costs the boot
//! no wall time of its own.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::Url;
use serde_json::{Value, json};

use crate::validate::CheckError;

/// How long the canary may take to connect (and, for `https://`, to
/// complete the TLS handshake and get an answer): "a few seconds".
pub const CANARY_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the canary points (`--egress-canary`, or the session's
/// `egressCanary`, 2.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Canary {
    /// `HOST:PORT`: reachable means a TCP connection within
    /// [`CANARY_TIMEOUT`].
    Tcp {
        /// A DNS name or an IP address (IPv6 in brackets).
        host: String,
        /// The TCP port.
        port: u16,
    },
    /// `https://HOST[:PORT]`: reachable means a TLS handshake verified
    /// against the runner's trust roots (an HTTP answer of any status), so
    /// a transparent proxy that accepts every connection but cannot present
    /// the host's certificate is not mistaken for open egress. Through
    /// `HTTPS_PROXY` when the agent's environment sets one.
    Https {
        /// The URL asked for (`HEAD`).
        url: Url,
    },
}

impl Canary {
    /// Parses `HOST:PORT` or `https://HOST[:PORT][/PATH]`; `what` names the
    /// setting in the error.
    ///
    /// Errors: any other form (an `http://` URL, a missing or zero port, a
    /// user or password in the URL).
    pub fn parse(what: &str, text: &str) -> Result<Canary, CheckError> {
        let text = text.trim();
        // Quoted as a contract URL is, without what may be user info
        // (`https://user:pw@host`, `user:pw@host:port`).
        let fail = |reason: &str| CheckError {
            what: what.to_string(),
            value: crate::text::clip(&crate::validate::shown_url(text), 160),
            reason: format!(
                "{reason}; write HOST:PORT (a TCP connection) or https://HOST (a verified TLS handshake)"
            ),
        };
        if text.contains("://") {
            let url = Url::parse(text).map_err(|e| fail(&format!("not a URL ({e})")))?;
            if url.scheme() != "https" {
                return Err(fail("only https:// URLs are checked"));
            }
            if url.host_str().is_none_or(str::is_empty) {
                return Err(fail("the URL names no host"));
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err(fail("a canary URL carries no credentials"));
            }
            return Ok(Canary::Https { url });
        }
        let (host, port) = text.rsplit_once(':').ok_or_else(|| fail("no port"))?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| fail("the port is not 1..=65535"))?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() || host.contains(char::is_whitespace) || host.contains('/') {
            return Err(fail("no host"));
        }
        Ok(Canary::Tcp {
            host: host.to_string(),
            port,
        })
    }

    fn is_https(&self) -> bool {
        matches!(self, Canary::Https { .. })
    }
}

impl fmt::Display for Canary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Canary::Tcp { host, port } if host.contains(':') => write!(f, "[{host}]:{port}"),
            Canary::Tcp { host, port } => write!(f, "{host}:{port}"),
            Canary::Https { url } => write!(f, "{url}"),
        }
    }
}

/// What the check needs besides the canary.
#[derive(Clone, Debug, Default)]
pub struct CheckOptions {
    /// The runner's extra trust roots (`HOSTED_BOOT_CA_FILE`), so the
    /// handshake is verified as the runner's own requests are.
    pub ca_file: Option<PathBuf>,
    /// `HTTPS_PROXY` (or `https_proxy`) of the agent's environment: an
    /// `https://` canary goes through it, as the agent's traffic would.
    pub https_proxy: Option<String>,
    /// `NO_PROXY` (or `no_proxy`) of the agent's environment.
    pub no_proxy: Option<String>,
    /// The bound of the check ([`CANARY_TIMEOUT`], scaled in tests).
    pub timeout: Duration,
}

impl CheckOptions {
    /// The proxy settings of `env` (the agent's environment: the runner's
    /// own and the env bundle's connectors, the later winning), upper case
    /// before lower case as curl reads them.
    pub fn proxy_from<'a>(
        mut self,
        env: impl IntoIterator<Item = (&'a str, &'a str)> + Clone,
    ) -> CheckOptions {
        let find = |names: &[&str]| {
            names.iter().find_map(|name| {
                env.clone()
                    .into_iter()
                    .filter(|(k, v)| k == name && !v.is_empty())
                    .last()
                    .map(|(_, v)| v.to_string())
            })
        };
        self.https_proxy = find(&["HTTPS_PROXY", "https_proxy"]);
        self.no_proxy = find(&["NO_PROXY", "no_proxy"]);
        self
    }
}

/// The canary's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanaryReport {
    /// The canary that was checked.
    pub canary: String,
    /// Whether it was reached: the egress policy is missing.
    pub reachable: bool,
    /// What happened, for people: `connected`, `connection refused`,
    /// `the certificate is not trusted (…)`, `timed out after 5s`, ….
    pub detail: String,
    /// Whether the check went through `HTTPS_PROXY`.
    pub via_proxy: bool,
}

impl CanaryReport {
    /// The data of the `hosted_boot.egress_canary` event (PROTOCOL.md 4.6).
    pub fn event_data(&self) -> Value {
        json!({
            "canary": self.canary,
            "reachable": self.reachable,
            "detail": self.detail,
            "viaProxy": self.via_proxy,
        })
    }

    /// The `finish.error.message` of a first turn that fails on this
    /// report (`egress_policy_missing`).
    pub fn failure_message(&self) -> String {
        format!(
            "the egress canary {} was reachable ({}): the sandbox's egress policy is not enforced, so no agent was started; block it in the sandbox's network policy",
            self.canary, self.detail
        )
    }
}

/// Checks `canary` once, bounded by `opts.timeout`; logs the report.
pub async fn check(canary: &Canary, opts: &CheckOptions) -> CanaryReport {
    let via_proxy = canary.is_https() && proxy_for(canary, opts).is_some();
    let bounded = tokio::time::timeout(opts.timeout, async {
        match canary {
            Canary::Tcp { host, port } => check_tcp(host, *port).await,
            Canary::Https { url } => check_https(url, opts).await,
        }
    });
    let (reachable, detail) = match bounded.await {
        Ok(r) => r,
        Err(_) => (
            false,
            format!(
                "timed out after {}",
                humantime::format_duration(opts.timeout)
            ),
        ),
    };
    let report = CanaryReport {
        canary: canary.to_string(),
        reachable,
        detail,
        via_proxy,
    };
    if report.reachable {
        tracing::error!(canary = %report.canary, detail = %report.detail, via_proxy, "egress canary reachable: the sandbox's egress policy is missing; the first turn fails egress_policy_missing");
    } else {
        tracing::info!(canary = %report.canary, detail = %report.detail, via_proxy, "egress canary not reachable: the egress policy holds");
    }
    report
}

/// A TCP connection to any address of `host`.
async fn check_tcp(host: &str, port: u16) -> (bool, String) {
    let addrs: Vec<_> = match tokio::net::lookup_host((host, port)).await {
        Ok(a) => a.collect(),
        Err(e) => return (false, format!("the name does not resolve ({e})")),
    };
    // Every address at once: tried in turn, one that black-holes (an AAAA
    // dropped on the way) would spend the whole budget, and a reachable
    // address after it would never be tried: the check would fail open.
    let mut attempts = tokio::task::JoinSet::new();
    for addr in addrs {
        attempts.spawn(async move { (addr, tokio::net::TcpStream::connect(addr).await) });
    }
    let mut last = String::from("the name resolves to no address");
    while let Some(done) = attempts.join_next().await {
        match done {
            Ok((addr, Ok(_))) => return (true, format!("connected to {addr}")),
            Ok((addr, Err(e))) => last = format!("{} ({addr})", io_reason(&e)),
            Err(e) => last = format!("the attempt ended ({e})"),
        }
    }
    (false, last)
}

/// A `HEAD` over a verified TLS handshake; any HTTP answer is a reach.
async fn check_https(url: &Url, opts: &CheckOptions) -> (bool, String) {
    let proxy = proxy_for_url(url, opts);
    let client = crate::tls::http_client_with(opts.ca_file.as_deref(), |b| {
        let b = b
            .no_proxy()
            .connect_timeout(opts.timeout)
            .timeout(opts.timeout);
        match proxy.clone() {
            Some(p) => b.proxy(p),
            None => b,
        }
    });
    let client = match client {
        Ok(c) => c,
        // What the agent's traffic would do is not known: fail closed.
        Err(e) => return (true, format!("the check could not run ({e:#})")),
    };
    match client.head(url.clone()).send().await {
        Ok(answer) => (
            true,
            format!(
                "a TLS handshake verified against the runner's trust roots, then HTTP {}",
                answer.status().as_u16()
            ),
        ),
        Err(e) => (false, reqwest_reason(&e.without_url(), proxy.is_some())),
    }
}

fn proxy_for(canary: &Canary, opts: &CheckOptions) -> Option<reqwest::Proxy> {
    match canary {
        Canary::Https { url } => proxy_for_url(url, opts),
        Canary::Tcp { .. } => None,
    }
}

/// `HTTPS_PROXY` unless `NO_PROXY` exempts the host.
fn proxy_for_url(url: &Url, opts: &CheckOptions) -> Option<reqwest::Proxy> {
    let proxy = opts.https_proxy.as_deref()?;
    if no_proxy_matches(opts.no_proxy.as_deref().unwrap_or(""), url) {
        return None;
    }
    match reqwest::Proxy::https(proxy) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(error = %e.without_url(), "HTTPS_PROXY is not a proxy URL; the egress canary goes direct");
            None
        }
    }
}

/// Whether `list` (`NO_PROXY`: comma-separated hosts, `.suffix`es, `*`)
/// exempts `url`'s host.
fn no_proxy_matches(list: &str, url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    list.split(',').map(str::trim).any(|entry| {
        let entry = entry.trim_start_matches('.');
        entry == "*"
            || (!entry.is_empty()
                && (host.eq_ignore_ascii_case(entry)
                    || host
                        .to_ascii_lowercase()
                        .ends_with(&format!(".{}", entry.to_ascii_lowercase()))))
    })
}

/// Why a connection failed, in the log's words.
fn io_reason(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => "connection refused".to_string(),
        K::ConnectionReset | K::ConnectionAborted => "connection reset".to_string(),
        K::TimedOut => "timed out".to_string(),
        K::NetworkUnreachable => "network unreachable".to_string(),
        K::HostUnreachable => "host unreachable".to_string(),
        _ => format!("not reachable: {e}"),
    }
}

/// Why an `https://` canary was not reached (through a proxy when
/// `proxied`): the first cause in the chain the log can name, told apart by
/// type. Through a proxy, a connection error with no I/O error under it is
/// the proxy's answer to the CONNECT (a status other than 200, or none):
/// reqwest keeps that error's type private, and a tunnel the proxy opened
/// and the far end closed fails with an I/O error (an EOF in the TLS
/// handshake).
fn reqwest_reason(e: &reqwest::Error, proxied: bool) -> String {
    if e.is_timeout() {
        return "timed out".to_string();
    }
    let causes = crate::tls::causes(e);
    for c in &causes {
        if let Some(tls) = c.downcast_ref::<rustls::Error>() {
            return tls_reason(tls);
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            if matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::TimedOut
                    | K::NetworkUnreachable
                    | K::HostUnreachable
            ) {
                return io_reason(io);
            }
        }
    }
    let text = crate::tls::texts(&causes).join(": ");
    if causes.iter().any(|c| c.is::<crate::tls::Unresolved>()) {
        format!("the name does not resolve ({text})")
    } else if proxied && e.is_connect() && !causes.iter().any(|c| c.is::<std::io::Error>()) {
        format!("the proxy refused the tunnel ({text})")
    } else {
        format!("not reachable: {text}")
    }
}

fn tls_reason(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(why) => {
            format!(
                "the certificate is not trusted ({why}): not the canary host, or an intercepting proxy"
            )
        }
        other => format!("the TLS handshake failed ({other})"),
    }
}

/// The canary's check started at boot, for the first turn to wait for; or,
/// when a setup script may run, deferred until the first turn takes it
/// after setup (4.1 step 3: setup may need the network the policy closes
/// after it).
#[derive(Debug, Default)]
pub struct Pending {
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<CanaryReport>>>,
    deferred: std::sync::Mutex<Option<(Canary, CheckOptions)>>,
}

impl Pending {
    /// No canary configured: nothing to wait for.
    pub fn none() -> Pending {
        Pending::default()
    }

    /// Starts checking `canary` in the background.
    pub fn start(canary: Canary, opts: CheckOptions) -> Pending {
        tracing::info!(canary = %canary, "egress canary: checking in the background");
        let task = tokio::spawn(async move { check(&canary, &opts).await });
        Pending {
            task: std::sync::Mutex::new(Some(task)),
            deferred: std::sync::Mutex::new(None),
        }
    }

    /// Checks `canary` only when [`Pending::take`] is first called (after
    /// the setup script).
    pub fn after_setup(canary: Canary, opts: CheckOptions) -> Pending {
        tracing::info!(canary = %canary, "egress canary: checked after the setup script");
        Pending {
            task: std::sync::Mutex::new(None),
            deferred: std::sync::Mutex::new(Some((canary, opts))),
        }
    }

    /// Whether the check waits for [`Pending::take`] (a setup may run).
    pub fn is_deferred(&self) -> bool {
        crate::concurrency::lock(&self.deferred).is_some()
    }

    /// The report, once: the first caller waits for it, later ones get
    /// `None` (only the first agent of a boot waits for the canary).
    pub async fn take(&self) -> Option<CanaryReport> {
        let deferred = crate::concurrency::lock(&self.deferred).take();
        if let Some((canary, opts)) = deferred {
            return Some(check(&canary, &opts).await);
        }
        let task = crate::concurrency::lock(&self.task).take()?;
        match task.await {
            Ok(v) => Some(v),
            // The check panicked: its report is unknown, so fail closed.
            Err(e) => Some(CanaryReport {
                canary: String::new(),
                reachable: true,
                detail: format!("the check did not finish ({e})"),
                via_proxy: false,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_forms() {
        assert_eq!(
            Canary::parse("c", "example.com:443").unwrap(),
            Canary::Tcp {
                host: "example.com".into(),
                port: 443
            }
        );
        assert_eq!(
            Canary::parse("c", "[::1]:8080").unwrap().to_string(),
            "[::1]:8080"
        );
        assert!(matches!(
            Canary::parse("c", "https://blocked.example").unwrap(),
            Canary::Https { .. }
        ));
        for bad in [
            "example.com",
            "example.com:0",
            "example.com:http",
            ":443",
            "http://example.com",
            "https://user:pw@example.com",
            "user:pw@example.com:0",
        ] {
            let e = Canary::parse("--egress-canary", bad).unwrap_err();
            assert!(e.to_string().contains("HOST:PORT"), "{bad}: {e}");
            assert!(!e.to_string().contains("pw"), "{bad}: {e}");
        }
    }

    #[test]
    fn no_proxy_exempts_hosts_and_suffixes() {
        let url = Url::parse("https://canary.blocked.example/").unwrap();
        assert!(no_proxy_matches("localhost, .example", &url));
        assert!(no_proxy_matches("canary.blocked.example", &url));
        assert!(no_proxy_matches("*", &url));
        assert!(!no_proxy_matches("localhost,other.example", &url));
        assert!(!no_proxy_matches("", &url));
    }

    #[test]
    fn the_agent_environment_names_the_proxy() {
        let env = [
            ("https_proxy", "http://lower:1"),
            ("HTTPS_PROXY", "http://upper:1"),
            ("NO_PROXY", "localhost"),
        ];
        let opts = CheckOptions::default().proxy_from(env.iter().copied());
        assert_eq!(opts.https_proxy.as_deref(), Some("http://upper:1"));
        assert_eq!(opts.no_proxy.as_deref(), Some("localhost"));
    }

    fn opts() -> CheckOptions {
        CheckOptions {
            timeout: Duration::from_secs(20),
            ..CheckOptions::default()
        }
    }

    /// Told apart by the resolver's error type, once by reqwest's text.
    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_said_so() {
        let canary = Canary::parse("c", "https://no-such-host.invalid").unwrap();
        let report = check(&canary, &opts()).await;
        assert!(!report.reachable, "{}", report.detail);
        assert!(
            report.detail.starts_with("the name does not resolve ("),
            "{}",
            report.detail
        );
    }

    /// The canary `https://blocked.example` through a proxy on loopback
    /// that answers every CONNECT with `answer` and closes.
    async fn through_proxy(answer: &'static [u8]) -> CanaryReport {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = conn.read(&mut buf).await;
                let _ = conn.write_all(answer).await;
            }
        });
        let canary = Canary::parse("c", "https://blocked.example").unwrap();
        let opts = CheckOptions {
            https_proxy: Some(proxy),
            ..opts()
        };
        let report = check(&canary, &opts).await;
        assert!(report.via_proxy && !report.reachable, "{report:?}");
        report
    }

    /// A proxy that answers CONNECT with 403: the proxy's refusal, not an
    /// unreachable host.
    #[tokio::test]
    async fn a_proxy_that_refuses_the_tunnel_is_said_so() {
        let report = through_proxy(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n").await;
        assert!(
            report.detail.starts_with("the proxy refused the tunnel ("),
            "{}",
            report.detail
        );
    }

    /// A tunnel the proxy opened and the far end closed is not the proxy's
    /// refusal (a fresh reviewer found it said so), and no cause's text
    /// is repeated.
    #[tokio::test]
    async fn a_tunnel_closed_after_it_opened_is_not_the_proxys_refusal() {
        let report = through_proxy(b"HTTP/1.1 200 Connection established\r\n\r\n").await;
        assert!(
            report.detail.starts_with("not reachable: "),
            "{}",
            report.detail
        );
        let parts: Vec<&str> = report.detail.split(": ").collect();
        assert!(parts.windows(2).all(|w| w[0] != w[1]), "{}", report.detail);
    }
}
