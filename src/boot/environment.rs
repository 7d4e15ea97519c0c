//! The agent's environment (PROTOCOL.md 2.3 and section 3): built
//! explicitly from the runner's environment as it was started (boot secret
//! removed), the env bundle's connectors and the contract's variables.

use std::collections::BTreeMap;
use std::ffi::OsString;

use crate::agent_api::AgentApi;
use crate::client::ApiConfig;
use crate::redact::{Redactor, SecretKind};
use crate::secret::Secret;
use crate::wire::{ClientInfo, EnvBundle, ErrorCode};

/// A connector the runner refuses (`reserved_connector_env`, PROTOCOL.md
/// 2.3): the message names the variable, never its value.
#[derive(Debug, thiserror::Error)]
#[error("the env bundle sets {}, {why}; remove it from the session's connectors", shown_name(.name))]
pub struct ReservedConnector {
    /// The variable name.
    pub name: String,
    /// Why it is refused.
    pub why: &'static str,
}

impl ReservedConnector {
    /// The PROTOCOL.md 2.2 code.
    pub const CODE: ErrorCode = ErrorCode::ReservedConnectorEnv;
}

/// A connector's name as a refusal shows it (PROTOCOL.md 2.3: naming the
/// variable, never its value). A name of letters, digits and `_` is shown
/// whole (cut to 64 characters). Another is shown only up to its first
/// other character, cut to 32 characters, with that character and the
/// length: such a "name" is often a `NAME=value` or a value pasted into
/// the name, its text is in no redaction yet, and the refusal goes to the
/// boot status, the log and `hosted-boot check`.
fn shown_name(name: &str) -> String {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let Some((at, bad)) = name.char_indices().find(|&(_, c)| !word(c)) else {
        return format!("`{}`", crate::text::clip(name, 64));
    };
    let start = crate::text::clip(name.get(..at).unwrap_or_default(), 32);
    let bad = match bad {
        ' ' => "a space".to_string(),
        c if c.is_ascii_graphic() => format!("`{c}`"),
        c => format!("`{}`", c.escape_unicode()),
    };
    format!(
        "`{start}…` (then {bad}: a name of {} characters, not shown past its first character outside [A-Za-z0-9_])",
        name.chars().count()
    )
}

/// Why a name cannot be a connector, if it cannot.
pub fn refusal(name: &str) -> Option<&'static str> {
    if !crate::validate::env_name(name) {
        return Some("which is not a valid environment variable name ([A-Za-z_][A-Za-z0-9_]*)");
    }
    let reserved_prefixes = ["ORIZU_", "HOSTED_BOOT_", "LD_", "GIT_"];
    let reserved_names = ["PATH", "HOME", "SSL_CERT_FILE", "SSL_CERT_DIR"];
    if reserved_prefixes.iter().any(|p| name.starts_with(p)) || reserved_names.contains(&name) {
        return Some("a reserved name (it could take over the runner, the dynamic loader or git)");
    }
    if STARTUP_CODE.contains(&name) {
        return Some(
            "a reserved name (it makes a shell, node or git that the runner starts run other code or read other configuration first)",
        );
    }
    if TRANSPORT.iter().any(|t| t.eq_ignore_ascii_case(name)) {
        return Some(
            "a reserved name (it changes where the runner's own processes send credentials, or whom they trust)",
        );
    }
    None
}

/// Names through which a connector would change where the processes the
/// runner starts with credentials (the credential helper, git, an agent CLI
/// on node) send them, or which servers they trust (PROTOCOL.md 2.3): the
/// proxy variables (read in either case by curl, reqwest and node: a
/// connector's proxy would receive the helper's bearer on a plain-http
/// coordinator), curl's and OpenSSL's trust and configuration (an OpenSSL
/// configuration also loads modules: code, in node), node's certificate
/// switches. Compared without case. The image's own values stay: only the
/// env bundle is refused them.
const TRANSPORT: [&str; 10] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "CURL_CA_BUNDLE",
    "OPENSSL_CONF",
    "OPENSSL_MODULES",
    "OPENSSL_ENGINES",
    "NODE_TLS_REJECT_UNAUTHORIZED",
    "NODE_EXTRA_CA_CERTS",
];

/// Names, beyond the loader's `LD_*` and git's `GIT_*`, through which a
/// connector would make a process the runner starts for the contract run
/// code other than the program named, before it (PROTOCOL.md 2.3): bash's
/// start-up file and the options it imports (`BASH_ENV`, `SHELLOPTS`,
/// `BASHOPTS`: the shells a setup script, a git hook or an agent CLI's
/// tools run in), node's options
/// (`NODE_OPTIONS`: every agent CLI runs on node), git's other global
/// configuration file and its fallback password program (`XDG_CONFIG_HOME`,
/// `SSH_ASKPASS`). Variables read by interactive interpreters only (`ENV`,
/// `PYTHONSTARTUP`) are not here: no process the runner starts is
/// interactive, and they are common names of a user's own tools.
const STARTUP_CODE: [&str; 6] = [
    "BASH_ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "NODE_OPTIONS",
    "XDG_CONFIG_HOME",
    "SSH_ASKPASS",
];

/// What a connector's `scope` (2.3) says about who gets it: absent or
/// `agent`, the agent (and so every process that inherits its environment);
/// `setup`, the setup script alone. Anything else is refused.
fn setup_scoped(scope: Option<&str>) -> Result<bool, &'static str> {
    match scope {
        None | Some("agent") => Ok(false),
        Some("setup") => Ok(true),
        Some(_) => Err("with an unknown scope (the scopes are agent and setup)"),
    }
}

/// The applied env bundle: connectors checked, their values and the
/// `redactVars` values added to the redactor.
#[derive(Clone, Debug, Default)]
pub struct AppliedBundle {
    /// `(name, value)` of each connector, in order.
    pub connectors: Vec<(String, Secret)>,
    /// `(name, value)` of each connector of `"scope": "setup"`, in order:
    /// in the setup script's environment only (PROTOCOL.md 2.3, 4.1
    /// "Setup"), redacted for the whole boot all the same.
    pub setup_only: Vec<(String, Secret)>,
    /// The value of `ORIZU_INJECTED_ENV_VARS`.
    pub injected: String,
}

/// The longest `NAME=value` one connector may make, in bytes, its
/// terminating NUL included: the kernel's `MAX_ARG_STRLEN` (32 pages),
/// past which `execve` fails with `E2BIG` (PROTOCOL.md 2.3).
pub const MAX_CONNECTOR_BYTES: usize = 128 * 1024;

/// The most bytes all connectors together may make (each `NAME=value` and
/// its NUL): 1 MiB, half of the usual 2 MiB `execve` allows for argv and
/// environment together, leaving the rest to the runner's environment, the
/// contract's variables and the agent's arguments (PROTOCOL.md 2.3).
pub const MAX_CONNECTORS_TOTAL_BYTES: usize = 1024 * 1024;

/// The checks of [`apply_bundle`] on every connector, before any value
/// reaches the redactor: the first refused one.
fn check_connectors(connectors: &[crate::wire::Connector]) -> Result<(), ReservedConnector> {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0usize;
    // `ORIZU_INJECTED_ENV_VARS=` and the names joined with commas: one
    // variable, under the same kernel limit as each connector.
    let mut names = "ORIZU_INJECTED_ENV_VARS=".len() + 1;
    for c in connectors {
        let size = c.env_var.len() + c.value.expose().len() + 2;
        total = total.saturating_add(size);
        names = names.saturating_add(c.env_var.len() + 1);
        let why = refusal(&c.env_var)
            .or_else(|| {
                (!seen.insert(c.env_var.clone()))
                    .then_some("more than once (each connector name must be unique)")
            })
            .or_else(|| {
                c.value
                    .expose()
                    .contains('\0')
                    .then_some("to a value holding a NUL byte, which no environment can carry")
            })
            .or_else(|| {
                (size > MAX_CONNECTOR_BYTES).then_some(
                    "to a value over 128 KiB (NAME=value, the kernel's limit for one variable)",
                )
            })
            .or_else(|| {
                (names > MAX_CONNECTOR_BYTES).then_some(
                    "past the 128 KiB the connectors' names may take together (ORIZU_INJECTED_ENV_VARS lists them in one variable)",
                )
            })
            .or_else(|| {
                (total > MAX_CONNECTORS_TOTAL_BYTES).then_some(
                    "past the 1 MiB all connectors may take together (NAME=value of each)",
                )
            });
        if let Some(why) = why {
            return Err(ReservedConnector {
                name: c.env_var.clone(),
                why,
            });
        }
    }
    Ok(())
}

/// Checks and applies an env bundle against the runner's environment.
///
/// Errors: the first reserved or invalid connector name, a name set twice,
/// a value holding a NUL byte, a connector over [`MAX_CONNECTOR_BYTES`] or
/// all of them over [`MAX_CONNECTORS_TOTAL_BYTES`] (each before any agent
/// is spawned: the boot fails at step 3).
pub fn apply_bundle(
    bundle: EnvBundle,
    base_env: &[(OsString, OsString)],
    redactor: &Redactor,
) -> Result<AppliedBundle, ReservedConnector> {
    check_connectors(&bundle.connectors)?;
    let values: Vec<&Secret> = bundle.connectors.iter().map(|c| &c.value).collect();
    let redacted = redactor.add_many(&values, SecretKind::Configured);
    let mut connectors = Vec::new();
    let mut setup_only = Vec::new();
    for (c, redacted) in bundle.connectors.into_iter().zip(redacted) {
        let for_setup = match setup_scoped(c.scope.as_deref()) {
            Ok(s) => s,
            Err(why) => {
                return Err(ReservedConnector {
                    name: c.env_var,
                    why,
                });
            }
        };
        let value = c.value;
        if !redacted && !value.expose().is_empty() {
            tracing::warn!(variable = %c.env_var, "connector value shorter than 6 bytes is not redacted");
        }
        if for_setup {
            setup_only.push((c.env_var, value));
        } else {
            connectors.push((c.env_var, value));
        }
    }
    for name in &bundle.redact_vars {
        let value = connectors
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.expose().to_string())
            .or_else(|| {
                base_env
                    .iter()
                    .find(|(k, _)| k.to_str() == Some(name.as_str()))
                    .map(|(_, v)| v.to_string_lossy().into_owned())
            });
        if let Some(value) = value {
            let secret = Secret::new(value);
            if !redactor.add(&secret, SecretKind::Configured) && !secret.expose().is_empty() {
                tracing::warn!(variable = %name, "redactVars value shorter than 6 bytes is not redacted");
            }
        }
    }
    let previous = base_env
        .iter()
        .find(|(k, _)| k == "ORIZU_INJECTED_ENV_VARS")
        .map(|(_, v)| v.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut names: Vec<String> = Vec::new();
    // A set beside the list: 10,000 connectors made the list's own
    // `contains` quadratic (PROTOCOL.md 2.3 allows that many).
    let mut listed = std::collections::HashSet::new();
    let all = previous
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .chain(connectors.iter().map(|(n, _)| n.clone()))
        .chain(bundle.redact_vars.iter().cloned());
    for name in all {
        if listed.insert(name.clone()) {
            names.push(name);
        }
    }
    Ok(AppliedBundle {
        connectors,
        setup_only,
        injected: names.join(","),
    })
}

/// Variables of the runner's environment the agent does not get with the
/// agent API proxy (PROTOCOL.md section 3): the URLs of the two routes
/// that take the boot secret, which the agent has no use for and the proxy
/// never forwards.
pub const PROXY_WITHHELD: [&str; 2] = ["ORIZU_AGENT_TOKEN_URL", "ORIZU_BOOT_STATUS_URL"];

/// The agent's environment without the per-turn variables (`ORIZU_TOKEN_FILE`,
/// `ORIZU_TASK_FILE`, `ORIZU_RUN_ID`, which the turn adds).
/// `ORIZU_API_BASE_URL` is the agent API proxy's in proxy mode, which also
/// withholds [`PROXY_WITHHELD`]; the coordinator's in bearer mode.
pub fn agent_env(
    base_env: &[(OsString, OsString)],
    bundle: &AppliedBundle,
    api: &ApiConfig,
    agent_api: &AgentApi,
    client_info: &ClientInfo,
) -> Vec<(OsString, OsString)> {
    let proxied = agent_api.proxy().is_some();
    let mut env: BTreeMap<OsString, OsString> = base_env
        .iter()
        .filter(|(k, _)| k != crate::boot::config::BOOT_SECRET_VAR)
        .filter(|(k, _)| !(proxied && PROXY_WITHHELD.iter().any(|w| k == w)))
        .cloned()
        .collect();
    for (name, value) in &bundle.connectors {
        env.insert(name.into(), value.expose().into());
    }
    let mut set = |k: &str, v: &str| {
        env.insert(k.into(), v.into());
    };
    set(
        "ORIZU_API_BASE_URL",
        agent_api.base_url(&api.api_base).as_str(),
    );
    set("ORIZU_SESSION_ID", &api.session_id);
    set("ORIZU_INJECTED_ENV_VARS", &bundle.injected);
    if let Some(m) = &client_info.model {
        set("ORIZU_MODEL", m);
    }
    if let Some(e) = &client_info.reasoning_effort {
        set("ORIZU_REASONING_EFFORT", e);
    }
    set("GIT_TERMINAL_PROMPT", "0");
    env.into_iter().collect()
}

/// What the on-stop hook does not get of the runner's environment
/// (PROTOCOL.md 4.7): the coordinator's URLs (the hook holds no
/// credential for any route) and the variables of a turn, should the
/// runner's environment set them.
pub const ON_STOP_WITHHELD: [&str; 10] = [
    "ORIZU_AGENT_TOKEN_URL",
    "ORIZU_BOOT_STATUS_URL",
    "ORIZU_API_BASE_URL",
    "ORIZU_TOKEN_FILE",
    "ORIZU_TURN_FILE",
    "ORIZU_TASK_FILE",
    "ORIZU_RUN_ID",
    "ORIZU_TURN_DEADLINE",
    "ORIZU_INSTRUCTIONS_FILE",
    "ORIZU_AGENT_SESSION_ID",
];

/// The on-stop hook's environment (PROTOCOL.md 4.7): the runner's as
/// it was started (boot secret removed) without [`ON_STOP_WITHHELD`], the
/// env bundle's connectors once it was applied (`bundle`; the setup-only
/// ones never) with `ORIZU_INJECTED_ENV_VARS`, `ORIZU_SESSION_ID` and
/// `GIT_TERMINAL_PROMPT=0`. No bearer, proxy token, boot secret or turn
/// file is in it: none is ever in an environment, and the hook runs once
/// the session directory is gone.
pub fn on_stop_env(
    base_env: &[(OsString, OsString)],
    bundle: Option<&AppliedBundle>,
    session_id: &str,
) -> Vec<(OsString, OsString)> {
    let mut env: BTreeMap<OsString, OsString> = base_env
        .iter()
        .filter(|(k, _)| k != crate::boot::config::BOOT_SECRET_VAR)
        .filter(|(k, _)| !ON_STOP_WITHHELD.iter().any(|w| k == w))
        .cloned()
        .collect();
    if let Some(bundle) = bundle {
        for (name, value) in &bundle.connectors {
            env.insert(name.into(), value.expose().into());
        }
        env.insert(
            "ORIZU_INJECTED_ENV_VARS".into(),
            bundle.injected.clone().into(),
        );
    }
    env.insert("ORIZU_SESSION_ID".into(), session_id.into());
    env.insert("GIT_TERMINAL_PROMPT".into(), "0".into());
    env.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Connector;

    #[test]
    fn the_on_stop_hook_gets_the_connectors_but_no_route_nor_turn_variable() {
        let base: Vec<(OsString, OsString)> = [
            ("PATH", "/usr/bin"),
            ("ORIZU_BOOT_SECRET", "boot-secret-value-0123456789"),
            ("ORIZU_AGENT_TOKEN_URL", "https://plane.example/t"),
            ("ORIZU_API_BASE_URL", "https://plane.example/"),
            ("ORIZU_TOKEN_FILE", "/x/bearer"),
            ("ORIZU_INJECTED_ENV_VARS", "OLD"),
        ]
        .iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
        let bundle = AppliedBundle {
            connectors: vec![("API_KEY".into(), Secret::new("k-123456".into()))],
            setup_only: vec![("SETUP_KEY".into(), Secret::new("s-123456".into()))],
            injected: "OLD,API_KEY".into(),
        };
        let names = |env: &[(OsString, OsString)]| -> Vec<String> {
            env.iter()
                .map(|(k, v)| format!("{}={}", k.to_string_lossy(), v.to_string_lossy()))
                .collect()
        };
        assert_eq!(
            names(&on_stop_env(&base, Some(&bundle), "s1")),
            [
                "API_KEY=k-123456",
                "GIT_TERMINAL_PROMPT=0",
                "ORIZU_INJECTED_ENV_VARS=OLD,API_KEY",
                "ORIZU_SESSION_ID=s1",
                "PATH=/usr/bin"
            ]
        );
        // Before the env bundle was applied: no connector.
        assert_eq!(
            names(&on_stop_env(&base, None, "s1")),
            [
                "GIT_TERMINAL_PROMPT=0",
                "ORIZU_INJECTED_ENV_VARS=OLD",
                "ORIZU_SESSION_ID=s1",
                "PATH=/usr/bin"
            ]
        );
    }

    #[test]
    fn reserved_names_are_refused() {
        for bad in [
            "ORIZU_X",
            "HOSTED_BOOT_AGENT",
            "LD_PRELOAD",
            "GIT_DIR",
            "PATH",
            "HOME",
            "SSL_CERT_FILE",
            "SSL_CERT_DIR",
            "BASH_ENV",
            "SHELLOPTS",
            "BASHOPTS",
            "NODE_OPTIONS",
            "XDG_CONFIG_HOME",
            "SSH_ASKPASS",
            "GIT_ASKPASS",
            "http_proxy",
            "HTTPS_PROXY",
            "all_proxy",
            "no_proxy",
            "OPENSSL_CONF",
            "NODE_TLS_REJECT_UNAUTHORIZED",
            "NODE_EXTRA_CA_CERTS",
            "CURL_CA_BUNDLE",
            "1X",
            "A-B",
            "",
        ] {
            assert!(refusal(bad).is_some(), "{bad}");
        }
        for ok in [
            "OPENAI_API_KEY",
            "_X",
            "GITHUB_TOKEN",
            "PATHX",
            "ENV",
            "PYTHONSTARTUP",
            "NODE_OPTIONS_X",
        ] {
            assert!(refusal(ok).is_none(), "{ok}");
        }
    }

    #[test]
    fn injected_names_are_joined_once_in_order() {
        let base = vec![
            ("ORIZU_INJECTED_ENV_VARS".into(), "A,B".into()),
            ("SECRET_IN_ENV".into(), "zzzzzzzz".into()),
        ];
        let bundle = EnvBundle {
            connectors: vec![
                Connector {
                    env_var: "B".into(),
                    value: "value-b-long".into(),
                    scope: None,
                },
                Connector {
                    env_var: "C".into(),
                    value: "value-c-long".into(),
                    scope: None,
                },
            ],
            redact_vars: vec!["SECRET_IN_ENV".into(), "C".into()],
        };
        let r = Redactor::new();
        let applied = apply_bundle(bundle, &base, &r).unwrap();
        assert_eq!(applied.injected, "A,B,C,SECRET_IN_ENV");
        assert_eq!(r.redact("zzzzzzzz value-c-long"), "[REDACTED] [REDACTED]");
    }

    fn bundle(connectors: &[(&str, &str)]) -> EnvBundle {
        EnvBundle {
            connectors: connectors
                .iter()
                .map(|(n, v)| Connector {
                    env_var: (*n).into(),
                    value: (*v).into(),
                    scope: None,
                })
                .collect(),
            redact_vars: vec![],
        }
    }

    #[test]
    fn a_name_twice_a_nul_and_oversized_values_are_refused() {
        let r = Redactor::new();
        let cases: [(&[(&str, &str)], &str); 2] = [
            (
                &[("A_KEY", "value-one-1"), ("A_KEY", "value-two-2")],
                "more than once",
            ),
            (&[("A_KEY", "before\0after")], "NUL"),
        ];
        for (connectors, why) in cases {
            let e = apply_bundle(bundle(connectors), &[], &r).unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
            assert!(!e.to_string().contains("after"), "{e}");
        }
        // Exactly at the limit, one is fine; a byte more is not. (The
        // checks alone: adding values this large to the redactor is slow
        // in a debug build.)
        let fits = "x".repeat(MAX_CONNECTOR_BYTES - "BIG_0".len() - 2);
        assert!(check_connectors(&bundle(&[("BIG_0", &fits)]).connectors).is_ok());
        let big = format!("{fits}x");
        let e = check_connectors(&bundle(&[("BIG_0", &big)]).connectors).unwrap_err();
        assert!(e.to_string().contains("128 KiB"), "{e}");
        let names: Vec<String> = (0..9).map(|i| format!("BIG_{i}")).collect();
        let many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), fits.as_str())).collect();
        assert!(check_connectors(&bundle(&many[..8]).connectors).is_ok());
        let e = check_connectors(&bundle(&many).connectors).unwrap_err();
        assert!(e.to_string().contains("1 MiB") && e.name == "BIG_8", "{e}");
    }

    /// 10,000 connectors of small values but 20-byte names: each is within
    /// its limits, but `ORIZU_INJECTED_ENV_VARS` would pass the kernel's
    /// 128 KiB for one variable and every spawn would fail `E2BIG`; refused
    /// here, before any spawn. 10,000 short names fit.
    #[test]
    fn names_that_would_overflow_the_injected_list_are_refused_before_any_spawn() {
        let long: Vec<String> = (0..10_000)
            .map(|i| format!("CONNECTOR_{i:05}_LONGX"))
            .collect();
        let c: Vec<(&str, &str)> = long.iter().map(|n| (n.as_str(), "v")).collect();
        let e = check_connectors(&bundle(&c).connectors).unwrap_err();
        assert!(e.to_string().contains("ORIZU_INJECTED_ENV_VARS"), "{e}");
        let short: Vec<String> = (0..10_000).map(|i| format!("C_{i:05}")).collect();
        let c: Vec<(&str, &str)> = short.iter().map(|n| (n.as_str(), "v")).collect();
        assert!(check_connectors(&bundle(&c).connectors).is_ok());
    }

    #[test]
    fn setup_scoped_connectors_are_kept_apart_and_redacted_and_unknown_scopes_refused() {
        let connector = |name: &str, value: &str, scope: Option<&str>| Connector {
            env_var: name.into(),
            value: value.into(),
            scope: scope.map(str::to_string),
        };
        let bundle = EnvBundle {
            connectors: vec![
                connector("A", "value-a-long", None),
                connector("B", "value-b-long", Some("agent")),
                connector("S", "value-s-long", Some("setup")),
            ],
            redact_vars: vec![],
        };
        let r = Redactor::new();
        let applied = apply_bundle(bundle, &[], &r).unwrap();
        let names = |v: &[(String, Secret)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        assert_eq!(names(&applied.connectors), ["A", "B"]);
        assert_eq!(names(&applied.setup_only), ["S"]);
        assert_eq!(applied.injected, "A,B");
        assert_eq!(r.redact("value-s-long"), "[REDACTED]");
        let bundle = EnvBundle {
            connectors: vec![connector("T", "value-t-long", Some("Setup"))],
            redact_vars: vec![],
        };
        let e = apply_bundle(bundle, &[], &Redactor::new()).unwrap_err();
        let reason = ReservedConnector::CODE.reason(&e);
        assert!(
            reason.starts_with("reserved_connector_env: ")
                && reason.contains("`T`")
                && reason.contains("scope")
                && !reason.contains("value-t-long"),
            "{reason}"
        );
    }

    #[test]
    fn the_error_names_the_variable_not_the_value() {
        let bundle = EnvBundle {
            connectors: vec![Connector {
                env_var: "LD_PRELOAD".into(),
                value: "/evil/secret.so".into(),
                scope: None,
            }],
            redact_vars: vec![],
        };
        let e = apply_bundle(bundle, &[], &Redactor::new()).unwrap_err();
        let reason = ReservedConnector::CODE.reason(&e);
        assert!(
            reason.starts_with("reserved_connector_env: ")
                && reason.contains("LD_PRELOAD")
                && !reason.contains("evil"),
            "{reason}"
        );
    }

    /// A `NAME=value` pasted as the name, or a value pasted into it: the
    /// refusal names the part before the first character outside
    /// `[A-Za-z0-9_]`, that character and the length, never what follows.
    #[test]
    fn an_invalid_name_is_named_up_to_its_first_bad_character() {
        for (name, shown) in [
            (
                "OPENAI_API_KEY=sk-live-abc123",
                "`OPENAI_API_KEY…` (then `=`: a name of 29 characters",
            ),
            (
                "OPENAI_API_KEY sk-live-abc123",
                "`OPENAI_API_KEY…` (then a space: a name of 29",
            ),
            ("sk-proj-abc123", "`sk…` (then `-`: a name of 14"),
            ("A\u{1b}[2Jabc123", "`A…` (then `\\u{1b}`: a name of 11"),
        ] {
            let bundle = EnvBundle {
                connectors: vec![Connector {
                    env_var: name.into(),
                    value: "x".into(),
                    scope: None,
                }],
                redact_vars: vec![],
            };
            let e = apply_bundle(bundle, &[], &Redactor::new()).unwrap_err();
            let reason = ReservedConnector::CODE.reason(&e);
            assert!(reason.contains(shown), "{reason}");
            assert!(
                !reason.contains("abc123") && !reason.contains('\u{1b}'),
                "{reason}"
            );
            assert!(
                reason.contains("not a valid environment variable name"),
                "{reason}"
            );
        }
        let long = "A".repeat(1000);
        let e = ReservedConnector {
            name: long,
            why: "a reserved name",
        };
        assert!(e.to_string().len() < 200, "{e}");
    }
}
