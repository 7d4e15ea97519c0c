//! The command line. Every runner setting is a flag with a `HOSTED_BOOT_`
//! variable of the same name (PROTOCOL.md section 1). The boot secret is
//! never a clap argument: `main` takes it out of the environment first.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::process::cgroup::CgroupMode;

/// The entrypoint of a cloud sandbox in which an AI coding agent works on a
/// user's repository.
#[derive(Debug, Parser)]
#[command(
    name = "hosted-boot",
    version,
    args_conflicts_with_subcommands = true,
    after_help = "With no subcommand, `run` is assumed. See README.md for the environment contract."
)]
pub struct Cli {
    /// What to do (default: `run`).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Settings of `run` when no subcommand is given.
    #[command(flatten)]
    pub run: RunArgs,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Boot the sandbox: the container entrypoint (PROTOCOL.md section 4).
    Run(RunArgs),
    /// The git credential helper (git's credential protocol on stdin/stdout).
    Credential(CredentialArgs),
    /// Serve the reference coordinator on loopback, for local debugging.
    Coordinator(Box<crate::coordinator::CoordinatorArgs>),
    /// Check the sandbox's environment, the coordinator and the tools, without
    /// minting a repo token or posting a status.
    Check(RunArgs),
    /// Print the running runner's phase from its status file.
    Status(StatusArgs),
    /// Run a three-turn scenario against an in-process coordinator.
    Demo(DemoArgs),
    /// The built-in demo agent (used by `demo` and the tests).
    #[command(hide = true)]
    DemoAgent,
    /// Run a program under the turn supervisor, as a turn runs the agent,
    /// and report how each run ended (for debugging an agent image).
    Supervise(crate::cmd::supervise::SuperviseArgs),
    /// A turn's guard (started by the supervisor, never by hand).
    #[command(hide = true)]
    TurnGuard(TurnGuardArgs),
}

/// `hosted-boot turn-guard`.
#[derive(Debug, Args)]
pub struct TurnGuardArgs {
    /// The agent's session id (its leader's pid); the guard acts only in
    /// its own session and refuses any other.
    #[arg(long)]
    pub session: i32,
    /// The turn's cgroup directory, killed and removed with the group.
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
}

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Settings of `hosted-boot run`.
#[derive(Clone, Debug, Default, Args)]
pub struct RunArgs {
    /// The agent to run: `claude`, `codex`, `codex-exec`, `opencode`,
    /// `opencode-run` or `command` (any program).
    #[arg(long, env = "HOSTED_BOOT_AGENT", hide_env_values = true)]
    pub agent: Option<String>,
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
        default_value = "10m"
    )]
    pub agent_idle_timeout: String,
    /// Directory holding `repo/`, the session files and the run files
    /// [default: the working directory].
    #[arg(long, env = "HOSTED_BOOT_ROOT", hide_env_values = true)]
    pub root: Option<PathBuf>,
    /// Base URL of clone URLs (`{base}/{owner}/{name}.git`).
    #[arg(
        long,
        env = "HOSTED_BOOT_GIT_BASE_URL",
        hide_env_values = true,
        default_value = "https://github.com"
    )]
    pub git_base_url: String,
    /// Grace of an interrupt (`500ms`, `10s`, `2m`): the CLI's protocol
    /// interrupt at once, SIGINT at half of it, SIGKILL at its end.
    #[arg(
        long,
        env = "HOSTED_BOOT_INTERRUPT_GRACE",
        hide_env_values = true,
        default_value = "10s"
    )]
    pub interrupt_grace: String,
    /// Time budget of a graceful stop on SIGTERM/SIGINT (PROTOCOL.md 4.4).
    #[arg(
        long,
        env = "HOSTED_BOOT_STOP_BUDGET",
        hide_env_values = true,
        default_value = "25s"
    )]
    pub stop_budget: String,
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
    /// Files larger than this are left out of the harvest (PROTOCOL.md 4.5):
    /// `100MiB` (GitHub's hard limit), `50MB`, `1048576` (bytes); `0` turns
    /// the guard off. Set it at or below the git host's own file size limit.
    #[arg(
        long,
        env = "HOSTED_BOOT_HARVEST_MAX_FILE_SIZE",
        hide_env_values = true,
        default_value = "100MiB"
    )]
    pub harvest_max_file_size: String,
    /// Accept plain `http` URLs for any host, not only loopback.
    #[arg(long, env = "HOSTED_BOOT_INSECURE_HTTP", hide_env_values = true, value_parser = parse_flag, default_value = "0")]
    pub insecure_http: bool,
    /// Multiply every contract duration by this factor. For tests only.
    #[arg(
        long,
        env = "HOSTED_BOOT_TEST_TIME_SCALE",
        hide_env_values = true,
        hide = true
    )]
    pub test_time_scale: Option<f64>,
}

fn parse_flag(text: &str) -> Result<bool, String> {
    match text {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" | "" => Ok(false),
        other => Err(format!("expected 1 or 0, got {other:?}")),
    }
}

/// `hosted-boot credential <action> --context PATH`.
#[derive(Debug, Args)]
pub struct CredentialArgs {
    /// git's action: `get`, `store` or `erase`.
    pub action: String,
    /// The session's `boot-context.json`.
    #[arg(long)]
    pub context: PathBuf,
}

/// `hosted-boot demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Keep the demo's working directory instead of removing it.
    #[arg(long)]
    pub keep: bool,
    /// The sandbox root the booted runner uses (an empty directory)
    /// [default: a directory inside the demo's temporary directory].
    #[arg(long, env = "HOSTED_BOOT_ROOT", hide_env_values = true)]
    pub root: Option<std::path::PathBuf>,
}

/// `hosted-boot status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The runner's root [default: the working directory].
    #[arg(long, env = "HOSTED_BOOT_ROOT", hide_env_values = true)]
    pub root: Option<PathBuf>,
    /// Exit 1 when the runner is gone or its status file is stale (2 min);
    /// for a container HEALTHCHECK.
    #[arg(long)]
    pub check: bool,
}
