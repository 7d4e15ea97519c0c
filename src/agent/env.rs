//! Environment hygiene per adapter (the per-adapter part that PROTOCOL.md
//! section 3 allows; never an `ORIZU_` name). Applied to the agent's
//! environment after the contract's variables, in this order: strip what a
//! CLI would misread when inherited from a parent agent, set what headless
//! use needs, apply `--agent-env`, then the provider-key placeholder.
//!
//! | agent | strips | sets |
//! |---|---|---|
//! | `claude` | [`CLAUDE_PARENT_MARKERS`] (unless the env bundle sets them); every other `CLAUDE_CODE_*` passes (an image configures Claude Code with them) | `IS_SANDBOX=1` when the runner is root (Claude refuses bypass mode as root otherwise) |
//! | `codex`, `codex-exec` | `CODEX_SANDBOX`, `CODEX_SANDBOX_NETWORK_DISABLED` (set by Codex for its own tools) | |
//! | `opencode`, `opencode-run` | `OPENCODE_SERVER_USERNAME`, `OPENCODE_SERVER_PASSWORD` (serve mode sets its own) | `OPENCODE_PERMISSION` allowing edits, shell and fetches, `OPENCODE_DISABLE_AUTOUPDATE=1`, unless already set |
//! | `acp` | [`CLAUDE_PARENT_MARKERS`], as for `claude` (Claude Code's ACP agent runs Claude Code) | `IS_SANDBOX=1` when the runner is root, as for `claude`; `CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION=false` unless set (Claude Code's agent would ask the model what the user might type next after every turn) |
//!
//! State directories (`HOME`, `CODEX_HOME`, `XDG_DATA_HOME`,
//! `CLAUDE_CONFIG_DIR`) pass through unchanged: they are on the sandbox's
//! disk and stay there across turns, which is what resume needs.
//!
//! **Placeholder key.** When the agent needs a provider key and has none
//! (no key variable and no login file of the CLI), the runner sets the key
//! variable to [`PLACEHOLDER_KEY`], a non-secret value, for sandboxes whose
//! egress proxy injects the real key.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

use super::AgentKind;

/// The non-secret placeholder for a provider key the egress proxy injects.
pub const PLACEHOLDER_KEY: &str = "HOSTED_BOOT_PROVIDER_PLACEHOLDER_KEY";

/// opencode permissions for an unattended turn in a sandbox.
pub const OPENCODE_PERMISSION: &str = r#"{"edit":"allow","bash":"allow","webfetch":"allow"}"#;

/// What a parent Claude Code session leaves in its children's environment
/// (set by Claude Code 2.1.197 for its tools and subagents), stripped for
/// `claude`: a runner started from inside a Claude session would otherwise
/// hand them on.
/// - `CLAUDECODE`: "running inside Claude Code"; a nested CLI changes
///   behaviour (and refuses some modes) on it.
/// - `CLAUDE_CODE_ENTRYPOINT`: the parent's entrypoint (`cli`, `sdk-ts`…);
///   the child would report itself as the parent's kind of client.
/// - `CLAUDE_CODE_SESSION_ID`, `CLAUDE_CODE_SESSION_KIND`: the parent's
///   session, which the child would take as its own context.
/// - `CLAUDE_CODE_SESSION_ACCESS_TOKEN`: the parent's session credential,
///   never the agent's to use.
/// - `CLAUDE_CODE_AGENT`, `CLAUDE_CODE_COORDINATOR_MODE`: the parent's
///   subagent and coordinator roles.
/// - `CLAUDE_CODE_SSE_PORT`: the parent's IDE connection port.
pub const CLAUDE_PARENT_MARKERS: &[&str] = &[
    "CLAUDECODE",
    "CLAUDE_CODE_ENTRYPOINT",
    "CLAUDE_CODE_SESSION_ID",
    "CLAUDE_CODE_SESSION_KIND",
    "CLAUDE_CODE_SESSION_ACCESS_TOKEN",
    "CLAUDE_CODE_AGENT",
    "CLAUDE_CODE_COORDINATOR_MODE",
    "CLAUDE_CODE_SSE_PORT",
];

type Env = BTreeMap<OsString, OsString>;

fn get<'a>(env: &'a Env, name: &str) -> Option<&'a str> {
    env.get(OsStr::new(name))
        .and_then(|v| v.to_str())
        .filter(|v| !v.is_empty())
}

fn set(env: &mut Env, name: &str, value: &str) {
    env.insert(name.into(), value.into());
}

fn set_default(env: &mut Env, name: &str, value: &str) {
    if get(env, name).is_none() {
        set(env, name, value);
    }
}

/// Strips and sets what `kind` needs (before `--agent-env`).
pub fn hygiene(kind: AgentKind, env: &mut Env, runner_is_root: bool) {
    match kind {
        AgentKind::Command => {}
        AgentKind::Claude | AgentKind::Acp => {
            if kind == AgentKind::Acp {
                // Claude Code's ACP agent asks the model, after each turn,
                // what the user might type next (a request with tools, paid
                // for): no user reads it here.
                set_default(env, "CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION", "false");
            }
            let bundle: Vec<String> = get(env, "ORIZU_INJECTED_ENV_VARS")
                .unwrap_or("")
                .split(',')
                .map(|s| s.trim().to_string())
                .collect();
            env.retain(|k, _| {
                let Some(k) = k.to_str() else { return true };
                !CLAUDE_PARENT_MARKERS.contains(&k) || bundle.iter().any(|b| b == k)
            });
            if runner_is_root {
                set(env, "IS_SANDBOX", "1");
            }
        }
        AgentKind::Codex | AgentKind::CodexExec => {
            env.remove(OsStr::new("CODEX_SANDBOX"));
            env.remove(OsStr::new("CODEX_SANDBOX_NETWORK_DISABLED"));
        }
        AgentKind::OpenCode | AgentKind::OpenCodeRun => {
            env.remove(OsStr::new("OPENCODE_SERVER_USERNAME"));
            env.remove(OsStr::new("OPENCODE_SERVER_PASSWORD"));
            set_default(env, "OPENCODE_PERMISSION", OPENCODE_PERMISSION);
            set_default(env, "OPENCODE_DISABLE_AUTOUPDATE", "1");
        }
    }
}

fn home(env: &Env) -> Option<PathBuf> {
    get(env, "HOME").map(PathBuf::from)
}

/// The key variable the agent would use, when it has neither a key nor a
/// login file; `model` is `provider/model` for opencode.
pub fn missing_key(kind: AgentKind, env: &Env, model: Option<&str>) -> Option<&'static str> {
    let has = |names: &[&str]| names.iter().any(|n| get(env, n).is_some());
    let exists = |p: Option<PathBuf>| p.is_some_and(|p| p.is_file());
    match kind {
        // Which key an ACP agent reads is its own business.
        AgentKind::Command | AgentKind::Acp => None,
        AgentKind::Claude => {
            let keyed = has(&[
                "ANTHROPIC_API_KEY",
                "ANTHROPIC_AUTH_TOKEN",
                "CLAUDE_CODE_OAUTH_TOKEN",
                "CLAUDE_CODE_USE_BEDROCK",
                "CLAUDE_CODE_USE_VERTEX",
            ]);
            let config = get(env, "CLAUDE_CONFIG_DIR")
                .map(PathBuf::from)
                .or_else(|| home(env).map(|h| h.join(".claude")));
            let login = exists(config.map(|c| c.join(".credentials.json")));
            (!keyed && !login).then_some("ANTHROPIC_API_KEY")
        }
        AgentKind::Codex | AgentKind::CodexExec => {
            let keyed = has(&["OPENAI_API_KEY", "CODEX_API_KEY"]);
            let codex_home = get(env, "CODEX_HOME")
                .map(PathBuf::from)
                .or_else(|| home(env).map(|h| h.join(".codex")));
            let login = exists(codex_home.map(|c| c.join("auth.json")));
            (!keyed && !login).then_some("OPENAI_API_KEY")
        }
        AgentKind::OpenCode | AgentKind::OpenCodeRun => {
            let var = match model.and_then(|m| m.split_once('/')).map(|(p, _)| p) {
                Some("anthropic") => "ANTHROPIC_API_KEY",
                Some("openai") => "OPENAI_API_KEY",
                _ => return None,
            };
            let data = get(env, "XDG_DATA_HOME")
                .map(PathBuf::from)
                .or_else(|| home(env).map(|h| h.join(".local/share")));
            let login = exists(data.map(|d| d.join("opencode/auth.json")));
            (get(env, var).is_none() && !login).then_some(var)
        }
    }
}

/// The whole per-adapter step: hygiene, `--agent-env` (`extra`), and the
/// placeholder key. Returns the placeholder variable set, if any.
pub fn for_agent(
    kind: AgentKind,
    env: &mut Env,
    extra: &[(String, String)],
    model: Option<&str>,
    runner_is_root: bool,
) -> Option<&'static str> {
    hygiene(kind, env, runner_is_root);
    for (k, v) in extra {
        set(env, k, v);
    }
    let missing = missing_key(kind, env, model);
    if let Some(var) = missing {
        set(env, var, PLACEHOLDER_KEY);
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn names(e: &Env) -> Vec<String> {
        e.keys().map(|k| k.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn claude_strips_a_parent_agents_variables_and_keeps_credentials() {
        let mut e = env(&[
            ("CLAUDECODE", "1"),
            ("CLAUDE_CODE_ENTRYPOINT", "cli"),
            ("CLAUDE_CODE_SSE_PORT", "1234"),
            ("CLAUDE_CODE_SESSION_ID", "parent"),
            ("CLAUDE_CODE_MAX_RETRIES", "2"),
            ("CLAUDE_CODE_OAUTH_TOKEN", "tok"),
            ("CLAUDE_CODE_USE_BEDROCK", "1"),
            ("ORIZU_INJECTED_ENV_VARS", "CLAUDE_CODE_USE_BEDROCK"),
            ("HOME", "/nonexistent"),
        ]);
        let placeholder = for_agent(AgentKind::Claude, &mut e, &[], None, true);
        assert_eq!(placeholder, None);
        assert_eq!(
            names(&e),
            vec![
                "CLAUDE_CODE_MAX_RETRIES",
                "CLAUDE_CODE_OAUTH_TOKEN",
                "CLAUDE_CODE_USE_BEDROCK",
                "HOME",
                "IS_SANDBOX",
                "ORIZU_INJECTED_ENV_VARS"
            ]
        );
        let mut e = env(&[("HOME", "/nonexistent")]);
        assert_eq!(
            for_agent(AgentKind::Claude, &mut e, &[], None, false),
            Some("ANTHROPIC_API_KEY")
        );
        assert_eq!(get(&e, "ANTHROPIC_API_KEY"), Some(PLACEHOLDER_KEY));
        assert_eq!(get(&e, "IS_SANDBOX"), None);
        // An ACP agent: Claude's markers go and its sandbox flag is set
        // (its agent may be Claude Code's), no prompt suggestions unless
        // the image asks, and no placeholder: its key is its own business.
        let mut e = env(&[
            ("HOME", "/nonexistent"),
            ("CLAUDECODE", "1"),
            ("CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION", ""),
        ]);
        assert_eq!(for_agent(AgentKind::Acp, &mut e, &[], None, true), None);
        assert_eq!(get(&e, "CLAUDECODE"), None);
        assert_eq!(get(&e, "IS_SANDBOX"), Some("1"));
        assert_eq!(
            get(&e, "CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION"),
            Some("false")
        );
        let mut e = env(&[("CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION", "true")]);
        for_agent(AgentKind::Acp, &mut e, &[], None, false);
        assert_eq!(
            get(&e, "CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION"),
            Some("true")
        );
    }

    #[test]
    fn a_login_file_or_agent_env_key_means_no_placeholder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join(".codex")).unwrap();
        std::fs::write(dir.path().join(".codex/auth.json"), "{}").unwrap();
        let home = dir.path().to_string_lossy().into_owned();
        let mut e = env(&[("HOME", &home)]);
        assert_eq!(for_agent(AgentKind::Codex, &mut e, &[], None, false), None);
        let mut e = env(&[("HOME", "/nonexistent")]);
        let extra = [("OPENAI_API_KEY".to_string(), "sk-x".to_string())];
        assert_eq!(
            for_agent(AgentKind::CodexExec, &mut e, &extra, None, false),
            None
        );
        assert_eq!(get(&e, "OPENAI_API_KEY"), Some("sk-x"));
    }

    #[test]
    fn opencode_gets_permissions_and_the_key_of_its_model() {
        let mut e = env(&[
            ("HOME", "/nonexistent"),
            ("OPENCODE_SERVER_PASSWORD", "old"),
        ]);
        let p = for_agent(
            AgentKind::OpenCode,
            &mut e,
            &[],
            Some("anthropic/claude-sonnet-4"),
            false,
        );
        assert_eq!(p, Some("ANTHROPIC_API_KEY"));
        assert_eq!(get(&e, "OPENCODE_PERMISSION"), Some(OPENCODE_PERMISSION));
        assert_eq!(get(&e, "OPENCODE_SERVER_PASSWORD"), None);
        let mut e = env(&[("HOME", "/nonexistent")]);
        assert_eq!(
            for_agent(AgentKind::OpenCodeRun, &mut e, &[], Some("zen/x"), false),
            None
        );
    }
}
