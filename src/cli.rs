//! The command line. Every runner setting is a flag with a `HOSTED_BOOT_`
//! variable of the same name (PROTOCOL.md section 1). The boot secret is
//! never a clap argument: `main` takes it out of the environment first.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::boot::config::RunArgs;

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
    /// Check the sandbox's environment, the coordinator and the tools, without
    /// minting a repo token or posting a status.
    Check(RunArgs),
    /// Print the running runner's phase from its status file.
    Status(StatusArgs),
    /// The built-in demo agent (`--agent demo`; the demo scenario of
    /// `hosted-boot-coordinator demo` runs it).
    #[command(hide = true)]
    DemoAgent,
    /// Run a program under the turn supervisor, as a turn runs the agent,
    /// and report how each run ended (for debugging an agent image).
    Supervise(crate::cmd::supervise::SuperviseArgs),
    /// Moved to `hosted-boot-coordinator serve` (issue 34): says so.
    #[command(hide = true, disable_help_flag = true)]
    Coordinator(MovedArgs),
    /// Moved to `hosted-boot-coordinator demo` (issue 34): says so.
    #[command(hide = true, disable_help_flag = true)]
    Demo(MovedArgs),
    /// Moved to `hosted-boot-conformance` (issue 34): says so.
    #[command(hide = true, disable_help_flag = true)]
    Conformance(MovedArgs),
    /// A turn's guard (started by the supervisor, never by hand).
    #[command(hide = true)]
    TurnGuard(TurnGuardArgs),
}

/// The arguments of a subcommand that moved to another binary: taken
/// whole, so that the answer is where it went, not a parse error.
#[derive(Debug, Args)]
pub struct MovedArgs {
    /// Whatever followed.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub rest: Vec<std::ffi::OsString>,
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

/// `hosted-boot credential <action> --context PATH`.
#[derive(Debug, Args)]
pub struct CredentialArgs {
    /// git's action: `get`, `store` or `erase`.
    pub action: String,
    /// The session's `boot-context.json`.
    #[arg(long)]
    pub context: PathBuf,
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
