//! The environment contract (PROTOCOL.md section 1) and the runner's
//! settings, validated into a [`BootConfig`] before any request is made.
//! Every problem here is a configuration error: exit 2, nothing posted.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use reqwest::Url;

use crate::agent::{AgentKind, AgentTimings};
use crate::agent_api::{AgentApiMode, Allowlist};
use crate::client::ApiConfig;
use crate::logging::LogFormat;
use crate::process::cgroup::CgroupMode;
use crate::secret::Secret;
use crate::session_dir::CredentialMode;
use crate::timings::{Timings, parse_duration};
use crate::validate;

use super::values::{self, AgentChoice};

/// The boot secret's variable (PROTOCOL.md section 1).
pub const BOOT_SECRET_VAR: &str = "ORIZU_BOOT_SECRET";
pub use super::secret_file::BOOT_SECRET_FILE_VAR;

/// The shortest boot secret the runner accepts, in bytes (PROTOCOL.md
/// section 1): a shorter one is redacted wherever its bytes occur and
/// shreds the agent's output (`a1` inside every word that holds it).
pub const BOOT_SECRET_MIN_LEN: usize = 16;

/// A configuration error: what is wrong, with which value (never a secret),
/// and what to do.
#[derive(Debug, thiserror::Error)]
#[error("configuration error: {0}")]
pub struct ConfigError(pub String);

pub use crate::agent::AgentConfig;

/// The process's working directory, checked to be readable by this user:
/// git, which the runner and the reference coordinator start, refuses to
/// run in a directory it cannot `stat` (a checkout under a 0700
/// `mktemp -d` directory, started as another uid), and a root resolved
/// against it would fail later with a message about something else.
///
/// Errors: a [`ConfigError`] naming the working directory, the uid, the OS
/// error and what to do.
pub fn working_dir() -> Result<PathBuf, ConfigError> {
    let uid = rustix::process::getuid().as_raw();
    let cwd = std::env::current_dir().map_err(|e| {
        ConfigError(format!(
            "the working directory cannot be determined ({e}); it was probably removed: start hosted-boot from an existing directory"
        ))
    })?;
    std::fs::metadata(&cwd).map_err(|e| {
        ConfigError(format!(
            "the working directory {} cannot be read by uid {uid} ({e}); start hosted-boot from a directory this user can read (the image starts it in /workspace); a parent directory with mode 0700, as `mktemp -d` makes, hides everything under it from other users",
            cwd.display()
        ))
    })?;
    Ok(cwd)
}

/// The directory `root` is resolved against by [`load`]: the working
/// directory ([`working_dir`]), which an absolute `root` does not need
/// (then `/` is returned if the working directory cannot be read).
///
/// Errors: the working directory cannot be read and `root` is absent or
/// relative.
pub fn root_base(root: Option<&std::path::Path>) -> Result<PathBuf, ConfigError> {
    match working_dir() {
        Ok(cwd) => Ok(cwd),
        Err(_) if root.is_some_and(|r| r.is_absolute()) => Ok(PathBuf::from("/")),
        Err(e) => Err(e),
    }
}

/// Everything the boot needs, validated.
#[derive(Clone)]
pub struct BootConfig {
    /// Where the coordinator is.
    pub api: ApiConfig,
    /// `ORIZU_WORKSPACE_ID`, overriding the session's.
    pub workspace_id: Option<String>,
    /// Absolute root of `repo/` and the session files.
    pub root: PathBuf,
    /// Base of clone URLs.
    pub git_base_url: Url,
    /// The agent.
    pub agent: AgentConfig,
    /// Every duration of the contract.
    pub timings: Timings,
    /// `HOSTED_BOOT_TEST_TIME_SCALE` (1.0 in production).
    pub time_scale: f64,
    /// Log format.
    pub log_format: Option<LogFormat>,
    /// `HOSTED_BOOT_INSECURE_HTTP=1`.
    pub insecure_http: bool,
    /// `HOSTED_BOOT_CA_FILE`.
    pub ca_file: Option<PathBuf>,
    /// The runner's environment as it was started, minus the boot secret,
    /// the sandbox's trace context and (unless `--agent-otel-headers`) the
    /// collector's headers: the base of the agent's environment (PROTOCOL.md
    /// section 3).
    pub base_env: Vec<(OsString, OsString)>,
    /// `--turn-cgroup`: whether each turn gets a cgroup when possible.
    pub turn_cgroup: CgroupMode,
    /// `--prestart-agent`: start the next turn's agent CLI ahead of it.
    pub prestart_agent: bool,
    /// `--release-idle-after`: with a coordinator that accepts `released`,
    /// how long without a turn before the session is given back
    /// (PROTOCOL.md 4.2, "Leaving the sandbox"); `None`: never.
    pub release_idle_after: Option<Duration>,
    /// `--max-lifetime` and `--retire-at`, whichever comes first: no turn
    /// starts after it (PROTOCOL.md 4.2, "Leaving the sandbox"); `None`:
    /// no retirement.
    pub retire_at: Option<std::time::Instant>,
    /// `--harvest-max-file-size` in bytes: files larger are left out of the
    /// harvest (PROTOCOL.md 4.5); `None`: no limit (`0`).
    pub harvest_max_file_size: Option<u64>,
    /// `--agent-api`: the agent API proxy or the bearer (PROTOCOL.md 3).
    pub agent_api: AgentApiMode,
    /// `--agent-api-allow`: the routes the proxy forwards.
    pub agent_api_allow: Allowlist,
    /// `--credential-mode`: the credential broker (default) or the
    /// file-based helper (PROTOCOL.md section 3).
    pub credential_mode: CredentialMode,
    /// `--agent-user` resolved (uid, gid, supplementary groups, home): every
    /// process of the agent runs as it, `repo/` belongs to it, and the
    /// session files it may read are its (PROTOCOL.md 3, "The agent as
    /// another user"); `None`: the agent runs as the runner's user. The same
    /// value is in `agent.user`.
    pub agent_user: Option<crate::agent_user::AgentUser>,
    /// `--setup-script`, `--setup-inputs`, `--setup-timeout` (PROTOCOL.md
    /// 4.1, "Setup"); the session's `setup` field wins over the first two.
    pub setup: crate::turn::setup::SetupConfig,
    /// `--on-stop-script` and `--on-stop-timeout` (PROTOCOL.md 4.7);
    /// `None`: no hook.
    pub on_stop: Option<super::on_stop::OnStopConfig>,
    /// `--egress-canary`: the host the sandbox's egress policy must block,
    /// checked before the first agent starts (PROTOCOL.md 4.1 step 3); the
    /// session's `egressCanary` wins. `None`: no check.
    pub egress_canary: Option<crate::egress::Canary>,
    /// `--instructions-file`: the platform's instructions for the agent
    /// (PROTOCOL.md 3, "The platform's instructions"); the session's
    /// `instructions` win. Read when the boot starts.
    pub instructions_file: Option<PathBuf>,
    /// `--git-mirror-dir`: a directory of pre-warmed bare repositories
    /// (`{dir}/{owner}/{name}.git`) a fresh clone copies its packs from,
    /// fetching only what is new (PROTOCOL.md 3, "Git mirror").
    pub git_mirror_dir: Option<PathBuf>,
}

pub use super::values::{DEFAULT_HARVEST_MAX_FILE_SIZE, DEMO_AGENT};

/// Reads `env` (the environment as the process was started, boot secret
/// already taken out into `boot_secret`) and `args`, in the order a person
/// reading the errors expects: the contract's variables, then the agent,
/// then the runner's own settings.
///
/// Errors: the first problem found, naming the variable and the value.
pub fn load(
    env: &BTreeMap<OsString, OsString>,
    args: &RunArgs,
    boot_secret: Option<Secret>,
    cwd: PathBuf,
) -> Result<BootConfig, ConfigError> {
    let get = |name: &str| -> Option<String> {
        env.get(&OsString::from(name))
            .map(|v| v.to_string_lossy().into_owned())
            .filter(|v| !v.is_empty())
    };
    // The agent user first: whether the boot secret may come from a file
    // depends on it.
    let agent_user = agent_user(args)?;
    let boot_secret = super::secret_file::boot_secret(
        boot_secret,
        env.get(&OsString::from(BOOT_SECRET_FILE_VAR))
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .as_deref(),
        agent_user.as_ref(),
    )
    .map_err(|e| ConfigError(e.to_string()))?;
    let api = api_config(&get, checked_boot_secret(boot_secret)?, args.insecure_http)?;
    let workspace_id = get("ORIZU_WORKSPACE_ID");
    let opencode_port = opencode_port(&get)?;
    let time_scale = args.test_time_scale.unwrap_or(1.0);
    let mut agent = agent(args, &get)?;
    agent.opencode_port = opencode_port;
    agent.user = agent_user.clone();
    if time_scale != 1.0 {
        agent.timings = agent.timings.scaled(time_scale);
    }
    let root = match &args.root {
        Some(r) if r.is_absolute() => r.clone(),
        Some(r) => cwd.join(r),
        None => cwd.clone(),
    };
    let git_base_url = args.git_base_url.clone();
    validate::http_allowed(
        "HOSTED_BOOT_GIT_BASE_URL",
        &git_base_url,
        args.insecure_http,
    )
    .map_err(|e| ConfigError(e.to_string()))?;
    let timings = timings(args, time_scale);
    if let Some(path) = &args.ca_file {
        crate::tls::read_ca_file(path).map_err(|e| ConfigError(format!("{e:#}")))?;
    }
    let harvest_max_file_size = Some(args.harvest_max_file_size).filter(|b| *b > 0);
    let setup = setup_config(args, time_scale);
    let on_stop = on_stop_config(args, time_scale);
    let agent_api_allow =
        Allowlist::with_names(&args.agent_api_allow).map_err(|e| ConfigError(e.to_string()))?;
    let egress_canary = args.egress_canary.clone();
    let instructions_file = instructions_file(args, &cwd)?;
    let base_env = env
        .iter()
        .filter(|(k, _)| k.as_os_str() != BOOT_SECRET_VAR && k.as_os_str() != BOOT_SECRET_FILE_VAR)
        .filter(|(k, v)| !withheld_telemetry(k, v, args.agent_otel_headers))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();

    Ok(BootConfig {
        api,
        workspace_id,
        root,
        git_base_url,
        agent,
        timings,
        time_scale,
        log_format: args.log_format,
        insecure_http: args.insecure_http,
        ca_file: args.ca_file.clone(),
        base_env,
        turn_cgroup: args.turn_cgroup,
        prestart_agent: args.prestart_agent == Toggle::On,
        release_idle_after: (!args.release_idle_after.is_zero()).then_some(args.release_idle_after),
        retire_at: retire_at(args),
        harvest_max_file_size,
        agent_api: args.agent_api,
        agent_api_allow,
        credential_mode: args.credential_mode,
        agent_user,
        setup,
        on_stop,
        egress_canary,
        instructions_file,
        git_mirror_dir: args.git_mirror_dir.clone(),
    })
}

/// The boot secret, present and long enough to be redacted safely.
fn checked_boot_secret(boot_secret: Option<Secret>) -> Result<Secret, ConfigError> {
    let boot_secret = boot_secret
        .filter(|s| !s.expose().is_empty())
        .ok_or_else(|| {
            ConfigError(format!(
                "{BOOT_SECRET_VAR} is not set (nor {BOOT_SECRET_FILE_VAR}); the coordinator must inject it"
            ))
        })?;
    if boot_secret.expose().len() < BOOT_SECRET_MIN_LEN {
        return Err(ConfigError(format!(
            "{BOOT_SECRET_VAR} is {} bytes long, shorter than the {BOOT_SECRET_MIN_LEN} bytes a boot secret must have (a shorter value would be redacted throughout the agent's output); give the runner the secret the coordinator issued (64 hex characters in production)",
            boot_secret.expose().len()
        )));
    }
    if let Some(at) = super::secret_file::unsendable_at(boot_secret.expose().as_bytes()) {
        return Err(ConfigError(format!(
            "{BOOT_SECRET_VAR} holds a byte at offset {at} that an HTTP header cannot carry (a control character or non-ASCII); give the runner the secret the coordinator issued (64 hex characters in production)"
        )));
    }
    Ok(boot_secret)
}

/// The coordinator's URLs and the session (PROTOCOL.md section 1), each
/// checked; `ORIZU_RUN_ID` is checked though only the session is read.
fn api_config(
    get: &dyn Fn(&str) -> Option<String>,
    boot_secret: Secret,
    insecure_http: bool,
) -> Result<ApiConfig, ConfigError> {
    let require = |name: &str| {
        get(name).ok_or_else(|| {
            ConfigError(format!("{name} is not set; the coordinator must inject it"))
        })
    };
    let check_url = |name: &str, value: &str| {
        validate::url(name, value, insecure_http).map_err(|e| ConfigError(e.to_string()))
    };
    let agent_token_url = check_url("ORIZU_AGENT_TOKEN_URL", &require("ORIZU_AGENT_TOKEN_URL")?)?;
    let boot_status_url = match get("ORIZU_BOOT_STATUS_URL") {
        Some(v) => check_url("ORIZU_BOOT_STATUS_URL", &v)?,
        None => default_boot_status_url(&agent_token_url)?,
    };
    let mut api_base = check_url("ORIZU_API_BASE_URL", &require("ORIZU_API_BASE_URL")?)?;
    if !api_base.path().ends_with('/') {
        let path = format!("{}/", api_base.path());
        api_base.set_path(&path);
    }
    let session_id = require("ORIZU_SESSION_ID")?;
    validate::path_safe_id("ORIZU_SESSION_ID", &session_id)
        .map_err(|e| ConfigError(e.to_string()))?;
    if let Some(run_id) = get("ORIZU_RUN_ID") {
        validate::path_safe_id("ORIZU_RUN_ID", &run_id).map_err(|e| ConfigError(e.to_string()))?;
    }
    Ok(ApiConfig {
        api_base,
        agent_token_url,
        boot_status_url,
        session_id,
        boot_secret,
    })
}

/// `ORIZU_OPENCODE_PORT`: digits only, 1..=65535.
fn opencode_port(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<u16>, ConfigError> {
    match get("ORIZU_OPENCODE_PORT") {
        None => Ok(None),
        Some(v) => match v.parse::<u16>() {
            Ok(p) if p >= 1 && v.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(p)),
            _ => Err(ConfigError(format!(
                "ORIZU_OPENCODE_PORT {v:?} is not a TCP port (1..=65535)"
            ))),
        },
    }
}

/// `--agent-user` resolved against the user database; empty is none.
fn agent_user(args: &RunArgs) -> Result<Option<crate::agent_user::AgentUser>, ConfigError> {
    match args.agent_user.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(spec) => {
            crate::agent_user::AgentUser::resolve(spec, rustix::process::geteuid().as_raw())
                .map(Some)
                .map_err(|e| ConfigError(e.to_string()))
        }
    }
}

/// The contract's durations with `--interrupt-grace` and `--stop-budget`,
/// scaled by the test time scale.
/// When the runner retires: `--max-lifetime` from now or `--retire-at`
/// (the sandbox's clock now), whichever is first; a time past is now, one
/// too far for the clock never.
fn retire_at(args: &RunArgs) -> Option<std::time::Instant> {
    let now = std::time::Instant::now();
    let lifetime = (!args.max_lifetime.is_zero())
        .then(|| now.checked_add(args.max_lifetime))
        .flatten();
    let at = args.retire_at.and_then(|t| {
        now.checked_add(
            t.duration_since(std::time::SystemTime::now())
                .unwrap_or_default(),
        )
    });
    match (lifetime, at) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn timings(args: &RunArgs, time_scale: f64) -> Timings {
    let timings = Timings {
        interrupt_grace: args.interrupt_grace,
        stop_budget: args.stop_budget,
        ..Timings::default()
    };
    if time_scale != 1.0 {
        timings.scaled(time_scale)
    } else {
        timings
    }
}

/// `--instructions-file` against `cwd`, which must name a file that
/// exists; empty is none.
fn instructions_file(
    args: &RunArgs,
    cwd: &std::path::Path,
) -> Result<Option<PathBuf>, ConfigError> {
    let Some(path) = args
        .instructions_file
        .as_ref()
        .filter(|p| !p.as_os_str().is_empty())
        .map(|p| {
            if p.is_absolute() {
                p.clone()
            } else {
                cwd.join(p)
            }
        })
    else {
        return Ok(None);
    };
    std::fs::metadata(&path).map_err(|e| {
        ConfigError(format!(
            "--instructions-file {}: {e}; name a readable file of instructions for the agent",
            path.display()
        ))
    })?;
    Ok(Some(path))
}

/// `--setup-script`, `--setup-inputs` and `--setup-timeout`, the timeout
/// scaled like every contract duration.
fn setup_config(args: &RunArgs, time_scale: f64) -> crate::turn::setup::SetupConfig {
    let mut timeout = args.setup_timeout;
    if time_scale != 1.0 {
        timeout = timeout.mul_f64(time_scale);
    }
    let script = args
        .setup_script
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let inputs = args
        .setup_inputs
        .iter()
        .map(|g| g.trim().to_string())
        .filter(|g| !g.is_empty())
        .collect();
    crate::turn::setup::SetupConfig {
        script,
        inputs,
        timeout,
    }
}

/// `--on-stop-script` (none when empty) and `--on-stop-timeout`, scaled
/// like every contract duration.
fn on_stop_config(args: &RunArgs, time_scale: f64) -> Option<super::on_stop::OnStopConfig> {
    let script = args
        .on_stop_script
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())?;
    let mut timeout = args.on_stop_timeout;
    if time_scale != 1.0 {
        timeout = timeout.mul_f64(time_scale);
    }
    Some(super::on_stop::OnStopConfig {
        script: script.to_string(),
        timeout,
    })
}

fn default_boot_status_url(token_url: &Url) -> Result<Url, ConfigError> {
    let mut url = token_url.clone();
    let path = token_url.path();
    let parent = path.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
    url.set_path(&format!("{parent}/boot-status"));
    Ok(url)
}

fn agent(args: &RunArgs, get: &dyn Fn(&str) -> Option<String>) -> Result<AgentConfig, ConfigError> {
    let kind = match &args.agent {
        Some(AgentChoice::Demo) => return demo_agent(args, get),
        Some(AgentChoice::Kind(kind)) => *kind,
        None => {
            return Err(ConfigError(format!(
                "no agent configured; set HOSTED_BOOT_AGENT (or --agent) to one of {}",
                super::values::agent_names()
            )));
        }
    };
    let text = args.agent_command.as_deref().unwrap_or("").trim();
    let words = if text.is_empty() {
        Vec::new()
    } else {
        shlex::split(text).ok_or_else(|| {
            ConfigError(format!(
                "HOSTED_BOOT_AGENT_COMMAND {text:?} cannot be split into words (unbalanced quote?)"
            ))
        })?
    };
    let mut words = words.into_iter();
    let program = match (words.next(), kind.default_program()) {
        (Some(p), _) => p,
        (None, Some(p)) => p.to_string(),
        (None, None) => {
            return Err(ConfigError(format!(
                "HOSTED_BOOT_AGENT={} needs HOSTED_BOOT_AGENT_COMMAND (or --agent-command): \
                 the program and its arguments",
                kind.name()
            )));
        }
    };
    let mut extra_args = args.agent_arg.clone();
    if let Some(text) = get("HOSTED_BOOT_AGENT_ARGS") {
        extra_args.extend(shell_words("HOSTED_BOOT_AGENT_ARGS", &text)?);
    }
    let mut env_words = args.agent_env.clone();
    if let Some(text) = get("HOSTED_BOOT_AGENT_ENV") {
        env_words.extend(shell_words("HOSTED_BOOT_AGENT_ENV", &text)?);
    }
    let env = env_words
        .iter()
        .map(|w| agent_env_pair(w))
        .collect::<Result<Vec<_>, _>>()?;
    let idle_timeout = Some(args.agent_idle_timeout).filter(|d| !d.is_zero());
    Ok(AgentConfig {
        kind,
        program,
        args: words.collect(),
        extra_args,
        env,
        opencode_port: None,
        timings: AgentTimings {
            idle_timeout,
            ..AgentTimings::default()
        },
        user: None,
        wrap_up: wrap_up(args),
        acp_permissions: args.acp_permissions,
    })
}

/// `--wrap-up-before` and `--wrap-up-message`.
fn wrap_up(args: &RunArgs) -> Option<crate::agent::WrapUp> {
    let message = match args.wrap_up_message.as_deref().map(str::trim) {
        Some("") | None => crate::agent::DEFAULT_WRAP_UP_MESSAGE.to_string(),
        Some(text) => text.to_string(),
    };
    (!args.wrap_up_before.is_zero()).then_some(crate::agent::WrapUp {
        before: args.wrap_up_before,
        message,
    })
}

/// `--agent demo`: the `command` agent with `<this binary> demo-agent`.
/// `--agent-command` would be ignored, so it is refused.
fn demo_agent(
    args: &RunArgs,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<AgentConfig, ConfigError> {
    if args
        .agent_command
        .as_deref()
        .is_some_and(|c| !c.trim().is_empty())
    {
        return Err(ConfigError(
            "HOSTED_BOOT_AGENT=demo runs the built-in demo agent and takes no \
             HOSTED_BOOT_AGENT_COMMAND; unset it, or set HOSTED_BOOT_AGENT=command to run that command"
                .to_string(),
        ));
    }
    if !args.agent_arg.is_empty()
        || get("HOSTED_BOOT_AGENT_ARGS").is_some_and(|a| !a.trim().is_empty())
    {
        // The demo agent takes no arguments: it would exit 2 and cost the
        // user's first turn.
        return Err(ConfigError(
            "HOSTED_BOOT_AGENT=demo runs the built-in demo agent and takes no \
             --agent-arg or HOSTED_BOOT_AGENT_ARGS; remove them, or set HOSTED_BOOT_AGENT=command \
             with HOSTED_BOOT_AGENT_COMMAND"
                .to_string(),
        ));
    }
    let exe = std::env::current_exe().map_err(|e| {
        ConfigError(format!(
            "HOSTED_BOOT_AGENT=demo runs this binary's demo-agent, but its path cannot be read \
             (/proc/self/exe: {e}); set HOSTED_BOOT_AGENT=command and \
             HOSTED_BOOT_AGENT_COMMAND='/path/to/hosted-boot demo-agent'"
        ))
    })?;
    let command = RunArgs {
        agent: Some(AgentChoice::Kind(AgentKind::Command)),
        agent_command: Some(format!(
            "{} demo-agent",
            crate::text::shell_word(&exe.to_string_lossy())
        )),
        ..args.clone()
    };
    agent(&command, get)
}

fn shell_words(name: &str, text: &str) -> Result<Vec<String>, ConfigError> {
    shlex::split(text).ok_or_else(|| {
        ConfigError(format!(
            "{name} cannot be split into words (unbalanced quote?)"
        ))
    })
}

/// One `--agent-env NAME=VALUE`: a valid name, never `ORIZU_*` (the
/// contract's own variables). The error names the variable, not the value.
fn agent_env_pair(word: &str) -> Result<(String, String), ConfigError> {
    let Some((name, value)) = word.split_once('=') else {
        return Err(ConfigError(format!(
            "--agent-env {:?} is not NAME=VALUE",
            crate::text::head(word, 40)
        )));
    };
    if !validate::env_name(name) {
        return Err(ConfigError(format!(
            "--agent-env names {name:?}, which is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)"
        )));
    }
    if name.starts_with("ORIZU_") {
        return Err(ConfigError(format!(
            "--agent-env sets {name}: ORIZU_* variables belong to the coordinator contract; remove it"
        )));
    }
    Ok((name.to_string(), value.to_string()))
}

/// Settings of `hosted-boot run`.
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// The agent to run: `claude`, `codex`, `codex-exec`, `opencode`,
    /// `opencode-run`, `acp` (any Agent Client Protocol agent, named by
    /// `--agent-command`), `command` (any program) or `demo` (the built-in
    /// demo agent, `hosted-boot demo-agent`, to try a sandbox without a CLI).
    #[arg(
        long,
        env = "HOSTED_BOOT_AGENT",
        hide_env_values = true,
        value_parser = values::agent
    )]
    pub agent: Option<AgentChoice>,
    /// A program and its arguments, split as a POSIX shell splits words (no
    /// shell is run). Required for `--agent command`; for a CLI agent it
    /// replaces the CLI's name (a path, or a launcher and its arguments).
    #[arg(long, env = "HOSTED_BOOT_AGENT_COMMAND", hide_env_values = true)]
    pub agent_command: Option<String>,
    /// A literal argument added after the adapter's own (repeatable; also
    /// `HOSTED_BOOT_AGENT_ARGS`, shell words).
    #[arg(long = "agent-arg", allow_hyphen_values = true, value_name = "ARG")]
    pub agent_arg: Vec<String>,
    /// `NAME=VALUE` added to the agent's environment (repeatable; also
    /// `HOSTED_BOOT_AGENT_ENV`, shell words). `ORIZU_*` names are refused.
    #[arg(long = "agent-env", value_name = "NAME=VALUE")]
    pub agent_env: Vec<String>,
    /// No output from the agent for this long: interrupt it and fail the
    /// turn with `agent_hung` (`0`: never).
    #[arg(
        long,
        env = "HOSTED_BOOT_AGENT_IDLE_TIMEOUT",
        hide_env_values = true,
        default_value = "10m",
        value_parser = values::idle_timeout
    )]
    pub agent_idle_timeout: Duration,
    /// How long before a turn's time cap (`clientInfo.durationMinutes`) the
    /// agent is sent the wrap-up message, where its CLI takes a message
    /// mid-turn (Claude Code); `0`: never. No time cap, no wrap-up.
    #[arg(
        long,
        env = "HOSTED_BOOT_WRAP_UP_BEFORE",
        hide_env_values = true,
        default_value = "2m",
        value_parser = values::wrap_up_before
    )]
    pub wrap_up_before: Duration,
    /// The wrap-up message [default: asks the agent to stop starting new
    /// work, commit, and summarise what is done and what is left].
    #[arg(long, env = "HOSTED_BOOT_WRAP_UP_MESSAGE", hide_env_values = true)]
    pub wrap_up_message: Option<String>,
    /// Directory holding `repo/`, the session files and the run files
    /// [default: the working directory].
    #[arg(long, env = "HOSTED_BOOT_ROOT", hide_env_values = true)]
    pub root: Option<PathBuf>,
    /// Base URL of clone URLs (`{base}/{owner}/{name}.git`).
    #[arg(
        long,
        env = "HOSTED_BOOT_GIT_BASE_URL",
        hide_env_values = true,
        default_value = "https://github.com",
        value_parser = values::git_base_url
    )]
    pub git_base_url: Url,
    /// Grace of an interrupt (`500ms`, `10s`, `2m`): the CLI's protocol
    /// interrupt at once, SIGINT at half of it, SIGKILL at its end.
    #[arg(
        long,
        env = "HOSTED_BOOT_INTERRUPT_GRACE",
        hide_env_values = true,
        default_value = "10s",
        value_parser = parse_duration
    )]
    pub interrupt_grace: Duration,
    /// With a coordinator that accepts `released` (PROTOCOL.md 2.2): give
    /// the session back and exit after this long without a turn (`0`:
    /// never).
    #[arg(
        long,
        env = "HOSTED_BOOT_RELEASE_IDLE_AFTER",
        hide_env_values = true,
        default_value = "0",
        value_parser = parse_duration
    )]
    pub release_idle_after: Duration,
    /// Start no turn this long after the runner started: a running turn
    /// ends as it would, then the session is released (or, without the
    /// coordinator's `acceptsReleased`, the runner exits) (`0`: never).
    #[arg(
        long,
        env = "HOSTED_BOOT_MAX_LIFETIME",
        hide_env_values = true,
        default_value = "0",
        value_parser = parse_duration
    )]
    pub max_lifetime: Duration,
    /// As `--max-lifetime`, at this time (RFC 3339, by the sandbox's clock
    /// when the runner starts).
    #[arg(
        long,
        env = "HOSTED_BOOT_RETIRE_AT",
        hide_env_values = true,
        value_parser = values::retire_at
    )]
    pub retire_at: Option<std::time::SystemTime>,
    /// Time budget of a graceful stop on SIGTERM/SIGINT (PROTOCOL.md 4.4).
    #[arg(
        long,
        env = "HOSTED_BOOT_STOP_BUDGET",
        hide_env_values = true,
        default_value = "25s",
        value_parser = parse_duration
    )]
    pub stop_budget: Duration,
    /// Log format [default: text on a terminal, json otherwise]. The filter
    /// is `HOSTED_BOOT_LOG` (tracing syntax, default `info`).
    #[arg(long, env = "HOSTED_BOOT_LOG_FORMAT", hide_env_values = true)]
    pub log_format: Option<LogFormat>,
    /// PEM file of extra CA certificates (an intercepting proxy's CA).
    #[arg(long, env = "HOSTED_BOOT_CA_FILE", hide_env_values = true)]
    pub ca_file: Option<PathBuf>,
    /// Give each turn a cgroup v2 (killed whole at the turn's end) when the
    /// sandbox allows one: `auto`, or `off` for the `/proc` sweep alone.
    #[arg(
        long,
        env = "HOSTED_BOOT_TURN_CGROUP",
        hide_env_values = true,
        value_enum,
        default_value = "auto"
    )]
    pub turn_cgroup: CgroupMode,
    /// Start the next turn's agent CLI while the runner waits for the turn,
    /// and hand it the prompt when the turn comes (PROTOCOL.md 4.1,
    /// "Pre-started agents"): `on` for the CLIs that can wait for their
    /// prompt (today `claude`), or `off`.
    #[arg(
        long,
        env = "HOSTED_BOOT_PRESTART_AGENT",
        hide_env_values = true,
        value_enum,
        default_value = "on"
    )]
    pub prestart_agent: Toggle,
    /// How `--agent acp` answers its agent's permission requests
    /// (`session/request_permission`), each an event: `allow` (its "allow
    /// once" option, else "allow always"; a mode that runs tools unasked
    /// set when the agent offers one) or `reject` (its "reject once"
    /// option, else "reject always", else cancelled; a mode that asks set
    /// when the agent offers one: `default`, `read-only`).
    #[arg(
        long,
        env = "HOSTED_BOOT_ACP_PERMISSIONS",
        hide_env_values = true,
        value_enum,
        default_value = "allow"
    )]
    pub acp_permissions: crate::agent::AcpPermissions,
    /// Files larger than this are left out of the harvest (PROTOCOL.md 4.5):
    /// `100MiB` (GitHub's hard limit), `50MB`, `1048576` (bytes); `0` turns
    /// the guard off. Set it at or below the git host's own file size limit.
    #[arg(
        long,
        env = "HOSTED_BOOT_HARVEST_MAX_FILE_SIZE",
        hide_env_values = true,
        default_value = "100MiB",
        value_parser = values::file_size
    )]
    pub harvest_max_file_size: u64,
    /// How the agent reaches the coordinator's API during a turn
    /// (PROTOCOL.md section 3, "The agent's API"): `proxy`, the runner's
    /// API proxy on loopback with a per-turn proxy token in the bearer
    /// file (the agent never holds a bearer); `bearer`, the coordinator's
    /// base URL and the real bearer.
    #[arg(
        long,
        env = "HOSTED_BOOT_AGENT_API",
        hide_env_values = true,
        value_enum,
        default_value = "proxy"
    )]
    pub agent_api: AgentApiMode,
    /// Routes the agent API proxy forwards besides the session read, by
    /// their route-table names, comma-separated or repeated (`cursor`,
    /// `events`, `run-started`, `finish`). `agent-token`, `boot-status`,
    /// `env-bundle` and `repo-token` are never forwarded.
    #[arg(
        long,
        env = "HOSTED_BOOT_AGENT_API_ALLOW",
        hide_env_values = true,
        value_delimiter = ',',
        value_name = "ROUTE[,ROUTE]"
    )]
    pub agent_api_allow: Vec<String>,
    /// Where git's credential helper gets repo tokens (PROTOCOL.md section
    /// 3): `broker`, the runner's credential broker over a Unix socket in
    /// the session directory (the boot secret stays in the runner's memory;
    /// `boot-secret` is never written), or `file`, the helper reads
    /// `boot-secret` and mints tokens itself (for sandboxes that cannot
    /// pass a Unix socket between the agent and the runner).
    #[arg(
        long,
        env = "HOSTED_BOOT_CREDENTIAL_MODE",
        hide_env_values = true,
        value_enum,
        default_value = "broker"
    )]
    pub credential_mode: CredentialMode,
    /// Run the agent as this user (a name or a uid): its processes get the
    /// user's uid, gid, supplementary groups and home; `repo/` belongs to
    /// it; the session directory stays the runner's (PROTOCOL.md 3). Needs a
    /// runner running as root.
    #[arg(long, env = "HOSTED_BOOT_AGENT_USER", hide_env_values = true)]
    pub agent_user: Option<String>,
    /// The repository's setup, run once per sandbox in `repo/` (as the
    /// agent user) before the first agent starts: a path to a program, or a
    /// shell command (`sh -c`). The session's `setup.script` wins
    /// (PROTOCOL.md 4.1, "Setup").
    #[arg(long, env = "HOSTED_BOOT_SETUP_SCRIPT", hide_env_values = true)]
    pub setup_script: Option<String>,
    /// Globs of the files under `repo/` the setup depends on (lockfiles),
    /// comma-separated or repeated: with the script and the machine's boot
    /// id they make the setup cache's fingerprint. The session's
    /// `setup.inputs` wins.
    #[arg(
        long,
        env = "HOSTED_BOOT_SETUP_INPUTS",
        hide_env_values = true,
        value_delimiter = ',',
        value_name = "GLOB[,GLOB]"
    )]
    pub setup_inputs: Vec<String>,
    /// Bound on the setup script: past it every process of the setup is
    /// stopped and the first turn fails `setup_failed`.
    #[arg(
        long,
        env = "HOSTED_BOOT_SETUP_TIMEOUT",
        hide_env_values = true,
        default_value = "10m",
        value_parser = values::setup_timeout
    )]
    pub setup_timeout: Duration,
    /// A shell command (`sh -c`) run once when the boot ends (the session
    /// ended, the sandbox was released or retired, a graceful stop, a
    /// failure; never on a second stop signal): after the last harvest,
    /// before the final report, as the agent user, in `repo/`. Its output
    /// goes to the runner's log (PROTOCOL.md 4.7).
    #[arg(long, env = "HOSTED_BOOT_ON_STOP_SCRIPT", hide_env_values = true)]
    pub on_stop_script: Option<String>,
    /// Bound on the on-stop hook: past it every process of the hook is
    /// killed. On a graceful stop, what the stop budget leaves bounds it
    /// sooner.
    #[arg(
        long,
        env = "HOSTED_BOOT_ON_STOP_TIMEOUT",
        hide_env_values = true,
        default_value = "30s",
        value_parser = values::on_stop_timeout
    )]
    pub on_stop_timeout: Duration,
    /// A host the sandbox's egress policy must block, tried before the
    /// first agent starts: `HOST:PORT` (reachable: a TCP connection) or
    /// `https://HOST` (reachable: a TLS handshake verified against the
    /// runner's trust roots, through `HTTPS_PROXY` when the agent has one).
    /// Reachable: no agent runs, the turn fails `egress_policy_missing`.
    /// The session's `egressCanary` wins. Unset: no check.
    #[arg(
        long,
        env = "HOSTED_BOOT_EGRESS_CANARY",
        hide_env_values = true,
        value_parser = values::egress_canary
    )]
    pub egress_canary: Option<crate::egress::Canary>,
    /// A file of the platform's instructions for the agent, given to each
    /// CLI its own way (README, "Instructions for the agent"); the
    /// session's `instructions` win.
    #[arg(long, env = "HOSTED_BOOT_INSTRUCTIONS_FILE", hide_env_values = true)]
    pub instructions_file: Option<PathBuf>,
    /// A directory of git mirrors (bare repositories the image or a volume
    /// provides, `{dir}/{owner}/{name}.git`, as `git clone --mirror` makes
    /// them): a fresh clone copies the mirror's packs and fetches only what
    /// is new. A missing or unusable mirror falls back to a plain clone
    /// (PROTOCOL.md 3, "Git mirror").
    #[arg(long, env = "HOSTED_BOOT_GIT_MIRROR_DIR", hide_env_values = true)]
    pub git_mirror_dir: Option<PathBuf>,
    /// Accept plain `http` URLs for any host, not only loopback.
    #[arg(long, env = "HOSTED_BOOT_INSECURE_HTTP", hide_env_values = true, value_parser = parse_flag, default_value = "0")]
    pub insecure_http: bool,
    /// Pass the collector's credentials (`OTEL_EXPORTER_OTLP_HEADERS` and
    /// its per-signal variants; an `OTEL_EXPORTER_OTLP_*ENDPOINT` with user
    /// info) on to the agent, for an agent CLI that exports telemetry of its
    /// own. Off: the agent gets every other `OTEL_*` variable, not those.
    #[arg(long, env = "HOSTED_BOOT_AGENT_OTEL_HEADERS", hide_env_values = true, value_parser = parse_flag, default_value = "0")]
    pub agent_otel_headers: bool,
    /// Multiply every contract duration by this factor. For tests only.
    #[arg(
        long,
        env = "HOSTED_BOOT_TEST_TIME_SCALE",
        hide_env_values = true,
        hide = true,
        value_parser = values::time_scale
    )]
    pub test_time_scale: Option<f64>,
}

/// Whether a variable of the runner's environment stays out of the
/// agent's (issue 40): the sandbox's `TRACEPARENT`/`TRACESTATE` (each turn
/// gives the agent its own), and the collector's credentials (its headers,
/// an endpoint URL with user info) unless the platform passes them on.
fn withheld_telemetry(name: &OsString, value: &OsString, pass_credentials: bool) -> bool {
    use crate::telemetry::{ENDPOINT_VARS, HEADER_VARS, TRACEPARENT_VAR, TRACESTATE_VAR};
    let name = name.as_os_str();
    let credential = HEADER_VARS.iter().any(|h| name == *h)
        || (ENDPOINT_VARS.iter().any(|e| name == *e)
            && crate::telemetry::user_info(&value.to_string_lossy()).is_some());
    name == TRACEPARENT_VAR || name == TRACESTATE_VAR || (!pass_credentials && credential)
}

fn parse_flag(text: &str) -> Result<bool, String> {
    match text {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" | "" => Ok(false),
        other => Err(format!("expected 1 or 0, got {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<OsString, OsString> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn base() -> Vec<(&'static str, &'static str)> {
        vec![
            (
                "ORIZU_AGENT_TOKEN_URL",
                "https://plane.example/api/cli/sessions/s1/agent-token",
            ),
            ("ORIZU_API_BASE_URL", "https://plane.example"),
            ("ORIZU_SESSION_ID", "s1"),
            ("PATH", "/usr/bin"),
        ]
    }

    /// `RunArgs` as clap parses `argv` (each flag's defaults and parser).
    fn parse(argv: &[&str]) -> Result<RunArgs, clap::Error> {
        #[derive(clap::Parser)]
        struct Run {
            #[command(flatten)]
            run: RunArgs,
        }
        <Run as clap::Parser>::try_parse_from(std::iter::once("run").chain(argv.iter().copied()))
            .map(|r| r.run)
    }

    fn args() -> RunArgs {
        parse(&[
            "--agent",
            "command",
            "--agent-command",
            "my-agent --flag 'two words'",
        ])
        .unwrap()
    }

    fn secret() -> Option<Secret> {
        Some(Secret::new("b".repeat(64)))
    }

    #[test]
    fn the_wrap_up_defaults_to_two_minutes_and_zero_turns_it_off() {
        let wrap_up = |argv: &[&str]| {
            let a = parse(&[&["--agent", "claude"], argv].concat()).unwrap();
            load(&env(&base()), &a, secret(), "/".into())
                .unwrap()
                .agent
                .wrap_up
        };
        let default = wrap_up(&[]).unwrap();
        assert_eq!(default.before, Duration::from_secs(120));
        assert_eq!(default.message, crate::agent::DEFAULT_WRAP_UP_MESSAGE);
        let set = wrap_up(&["--wrap-up-before", "30s", "--wrap-up-message", "Stop."]).unwrap();
        assert_eq!(
            (set.before, set.message.as_str()),
            (Duration::from_secs(30), "Stop.")
        );
        assert_eq!(wrap_up(&["--wrap-up-before", "0"]), None);
    }

    #[test]
    fn the_on_stop_hook_is_off_by_default_and_its_timeout_scales() {
        let on_stop = |argv: &[&str]| {
            let a = parse(&[&["--agent", "claude"], argv].concat()).unwrap();
            load(&env(&base()), &a, secret(), "/".into())
                .unwrap()
                .on_stop
        };
        assert_eq!(on_stop(&[]), None);
        assert_eq!(on_stop(&["--on-stop-script", "  "]), None);
        let set = on_stop(&["--on-stop-script", "./flush-cache"]).unwrap();
        assert_eq!(
            (set.script.as_str(), set.timeout),
            ("./flush-cache", Duration::from_secs(30))
        );
        let scaled = on_stop(&[
            "--on-stop-script",
            "true",
            "--on-stop-timeout",
            "20s",
            "--test-time-scale",
            "0.05",
        ])
        .unwrap();
        assert_eq!(scaled.timeout, Duration::from_secs(1));
    }

    #[test]
    fn a_complete_environment_loads() {
        let c = load(&env(&base()), &args(), secret(), "/work".into()).unwrap();
        assert_eq!(
            c.api.boot_status_url.as_str(),
            "https://plane.example/api/cli/sessions/s1/boot-status"
        );
        assert_eq!(c.api.api_base.as_str(), "https://plane.example/");
        assert_eq!(c.agent.kind, AgentKind::Command);
        assert_eq!(c.agent.program, "my-agent");
        assert_eq!(c.agent.args, vec!["--flag", "two words"]);
        assert_eq!(c.root, PathBuf::from("/work"));
        assert!(c.base_env.iter().all(|(k, _)| k != BOOT_SECRET_VAR));
    }

    #[test]
    fn the_demo_agent_is_this_binarys_demo_agent() {
        let demo = RunArgs {
            agent: Some(AgentChoice::Demo),
            agent_command: None,
            agent_arg: Vec::new(),
            ..args()
        };
        let c = load(&env(&base()), &demo, secret(), "/work".into()).unwrap();
        // Arguments would make the demo agent exit 2 in the first turn.
        let err = load(
            &env(&base()),
            &RunArgs {
                agent_arg: vec!["x".into()],
                ..demo.clone()
            },
            secret(),
            "/work".into(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("takes no --agent-arg"), "{err}");
        assert_eq!(c.agent.kind, AgentKind::Command);
        assert_eq!(
            PathBuf::from(&c.agent.program),
            std::env::current_exe().unwrap()
        );
        assert_eq!(c.agent.args, vec!["demo-agent"]);
        // A command beside it would be ignored: refused, naming both.
        let err = load(
            &env(&base()),
            &RunArgs {
                agent: Some(AgentChoice::Demo),
                ..args()
            },
            secret(),
            "/".into(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(err.contains("HOSTED_BOOT_AGENT_COMMAND"), "{err}");
        let err = parse(&["--agent", "nope"]).err().unwrap().to_string();
        assert!(err.contains("command, demo"), "{err}");
    }

    #[test]
    fn bad_values_are_named() {
        let mut e = base();
        e[2] = ("ORIZU_SESSION_ID", "a/b");
        let err = load(&env(&e), &args(), secret(), "/".into())
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("ORIZU_SESSION_ID") && err.contains("a/b"),
            "{err}"
        );

        let mut e = base();
        e[1] = ("ORIZU_API_BASE_URL", "http://plane.example");
        let err = load(&env(&e), &args(), secret(), "/".into())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("must be https"), "{err}");

        let err = load(&env(&base()), &args(), None, "/".into())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("ORIZU_BOOT_SECRET is not set"), "{err}");

        for short in ["k", "fifteen-bytes-1"] {
            let err = load(
                &env(&base()),
                &args(),
                Some(Secret::new(short.into())),
                "/".into(),
            )
            .err()
            .unwrap()
            .to_string();
            assert!(
                err.contains(&format!("ORIZU_BOOT_SECRET is {} bytes long", short.len()))
                    && err.contains("16 bytes"),
                "{err}"
            );
            assert!(!err.contains(short), "the value in the error: {err}");
        }
        assert!(
            load(
                &env(&base()),
                &args(),
                Some(Secret::new("s".repeat(16))),
                "/".into()
            )
            .is_ok()
        );

        let no_agent = RunArgs {
            agent: None,
            ..args()
        };
        let err = load(&env(&base()), &no_agent, secret(), "/".into())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("no agent configured"), "{err}");

        let mut e = base();
        e.push(("ORIZU_RUN_ID", ".."));
        assert!(load(&env(&e), &args(), secret(), "/".into()).is_err());
        let mut e = base();
        e.push(("ORIZU_OPENCODE_PORT", "0"));
        assert!(load(&env(&e), &args(), secret(), "/".into()).is_err());
    }

    #[test]
    fn cli_agents_default_their_program_and_take_args_and_env() {
        let a = RunArgs {
            agent: Some(AgentChoice::Kind(AgentKind::Claude)),
            agent_command: None,
            agent_arg: vec!["--max-turns=3".into()],
            agent_env: vec!["FOO=bar=baz".into()],
            agent_idle_timeout: Duration::ZERO,
            ..args()
        };
        let mut e = base();
        e.push(("HOSTED_BOOT_AGENT_ARGS", "--add-dir '/a b'"));
        e.push(("ORIZU_OPENCODE_PORT", "4242"));
        let c = load(&env(&e), &a, secret(), "/".into()).unwrap();
        assert_eq!(c.agent.kind, AgentKind::Claude);
        assert_eq!(c.agent.program, "claude");
        assert_eq!(
            c.agent.extra_args,
            vec!["--max-turns=3", "--add-dir", "/a b"]
        );
        assert_eq!(
            c.agent.env,
            vec![("FOO".to_string(), "bar=baz".to_string())]
        );
        assert_eq!(c.agent.timings.idle_timeout, None);
        assert_eq!(c.agent.opencode_port, Some(4242));

        for bad in ["ORIZU_MODEL=x", "1X=y", "novalue"] {
            let a = RunArgs {
                agent_env: vec![bad.into()],
                ..args()
            };
            let err = load(&env(&base()), &a, secret(), "/".into())
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains("--agent-env"), "{err}");
        }
        // An ACP agent has no program of its own to default to.
        let a = RunArgs {
            agent: Some(AgentChoice::Kind(AgentKind::Acp)),
            agent_command: None,
            ..args()
        };
        let err = load(&env(&base()), &a, secret(), "/".into())
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("HOSTED_BOOT_AGENT=acp needs HOSTED_BOOT_AGENT_COMMAND"),
            "{err}"
        );
        let err = parse(&["--agent", "gemini"]).err().unwrap().to_string();
        assert!(
            err.contains("claude, codex, codex-exec, opencode, opencode-run, acp, command"),
            "{err}"
        );
    }

    #[test]
    fn the_agent_api_allowlist_is_checked_at_load() {
        let c = load(&env(&base()), &args(), secret(), "/".into()).unwrap();
        assert_eq!(c.agent_api, AgentApiMode::Proxy);
        assert_eq!(c.agent_api_allow, Allowlist::default());
        let a = RunArgs {
            agent_api_allow: vec!["cursor".into()],
            ..args()
        };
        let c = load(&env(&base()), &a, secret(), "/".into()).unwrap();
        assert!(c.agent_api_allow.allows(crate::wire::routes::Route::Cursor));
        for (bad, expected) in [("bogus", "not a route"), ("repo-token", "never forwards")] {
            let a = RunArgs {
                agent_api_allow: vec![bad.into()],
                ..args()
            };
            let err = load(&env(&base()), &a, secret(), "/".into())
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains("--agent-api-allow") && err.contains(expected),
                "{err}"
            );
        }
    }

    #[test]
    fn an_agent_user_is_resolved_or_refused_by_name() {
        let a = RunArgs {
            agent_user: Some("no-such-user-hb".into()),
            ..args()
        };
        let err = load(&env(&base()), &a, secret(), "/".into())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("\"no-such-user-hb\""), "{err}");
        let c = load(&env(&base()), &args(), secret(), "/".into()).unwrap();
        assert!(c.agent_user.is_none() && c.agent.user.is_none());
    }

    #[test]
    fn secret_values_never_appear_in_errors() {
        let s = Secret::new("supersecretvalue".into());
        let mut e = base();
        e[0] = ("ORIZU_AGENT_TOKEN_URL", "nope");
        let err = load(&env(&e), &args(), Some(s), "/".into())
            .err()
            .unwrap()
            .to_string();
        assert!(!err.contains("supersecretvalue"));
    }
}

/// An on/off setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Toggle {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}
