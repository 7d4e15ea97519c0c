//! The command line. Every runner setting is a flag with a `HOSTED_BOOT_`
//! variable of the same name (PROTOCOL.md section 1). The boot secret is
//! never a clap argument: `main` takes it out of the environment first.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::boot::config::RunArgs;

/// The entrypoint of a cloud sandbox in which an AI coding agent works on a
/// user's repository.
#[derive(Debug, Parser)]
#[command(
    name = "hosted-boot",
    version,
    after_help = "With no subcommand, `run` is assumed: `hosted-boot --agent claude` is `hosted-boot run --agent claude` (its settings: `hosted-boot run --help`). See README.md for the environment contract."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Parses the command line, `run` when it names no subcommand. `run`'s
/// settings are parsed only for `run` and `check`: their variables (a bad
/// `HOSTED_BOOT_INTERRUPT_GRACE`) are no concern of `status`, the image's
/// health check, or of the credential helper.
///
/// Errors: clap's, for [`report`].
pub fn parse(argv: impl IntoIterator<Item = OsString>) -> Result<Cli, clap::Error> {
    let mut argv: Vec<OsString> = argv.into_iter().collect();
    let first = argv.get(1).map(|a| a.to_string_lossy().into_owned());
    let names_no_subcommand = match first.as_deref() {
        None => true,
        Some("-h" | "--help" | "-V" | "--version") => false,
        Some(flag) => flag.starts_with('-'),
    };
    if names_no_subcommand {
        argv.insert(1.min(argv.len()), OsString::from("run"));
    }
    Cli::try_parse_from(argv)
}

/// Prints a parse error and gives the exit code: for a bad value, the
/// runner's own configuration error (exit 2, as `load`'s): the flag, its
/// variable, and the parser's message, which quotes the value (never a
/// secret: a URL's user info is not shown) and says what to write; clap's
/// rendering would quote the raw value, user info and all. Anything else
/// (help, version, an unknown flag) as clap prints it.
pub fn report(error: &clap::Error) -> i32 {
    match explain(error) {
        Some(message) => {
            eprintln!("hosted-boot: configuration error: {message}");
            2
        }
        None => {
            let _ = error.print();
            error.exit_code()
        }
    }
}

/// The runner's message for a bad value, `None` for any other error.
fn explain(error: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let ContextValue::String(arg) = error.get(ContextKind::InvalidArg)? else {
        return None;
    };
    let flag = arg.split_whitespace().next().unwrap_or(arg);
    let named = match variable_of(flag) {
        Some(var) => format!("{flag} ({var})"),
        None => flag.to_string(),
    };
    let valid = match error.get(ContextKind::ValidValue) {
        Some(ContextValue::Strings(values)) => values.join(", "),
        _ => String::new(),
    };
    match error.kind() {
        ErrorKind::ValueValidation => {
            let reason = std::error::Error::source(error)?;
            Some(format!("{named}: {reason}"))
        }
        ErrorKind::InvalidValue if !valid.is_empty() => {
            let value = match error.get(ContextKind::InvalidValue) {
                Some(ContextValue::String(v)) if !v.is_empty() => {
                    format!("{:?} is not one of", crate::text::head(v, 80))
                }
                _ => "is empty; write one of".to_string(),
            };
            Some(format!("{named}: {value} {valid}"))
        }
        _ => None,
    }
}

/// The variable behind `--flag`, from the command's own declarations.
fn variable_of(flag: &str) -> Option<String> {
    let long = flag.strip_prefix("--")?;
    let command = <Cli as clap::CommandFactory>::command();
    let run = command.find_subcommand("run")?;
    let arg = run.get_arguments().find(|a| a.get_long() == Some(long))?;
    arg.get_env().map(|v| v.to_string_lossy().into_owned())
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
