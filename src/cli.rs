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

/// A parsed command line, and for `check` the settings whose variable held
/// a bad value, each as the runner's message: `check` reports them as its
/// environment check, with the rest of its report, where `run` stops at
/// the first.
pub struct Parsed {
    /// The command.
    pub cli: Cli,
    /// `check`'s variables that did not parse (their flags then take their
    /// defaults).
    pub rejected: Vec<String>,
}

/// A command line that did not parse, for [`report`].
pub struct Rejected {
    error: clap::Error,
    /// The subcommand it named (`run` when none).
    subcommand: Option<String>,
}

/// Parses the command line, `run` when it names no subcommand. `run`'s
/// settings are parsed only for `run` and `check`: their variables (a bad
/// `HOSTED_BOOT_INTERRUPT_GRACE`) are no concern of `status`, the image's
/// health check, or of the credential helper. An empty variable counts as
/// unset, as a platform's template writes `VAR=` to turn a setting off.
///
/// Errors: clap's, for [`report`].
pub fn parse(argv: impl IntoIterator<Item = OsString>) -> Result<Parsed, Rejected> {
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
    let subcommand = argv.get(1).map(|a| a.to_string_lossy().into_owned());
    let mut command = unset_empty_variables(<Cli as clap::CommandFactory>::command());
    let mut rejected = Vec::new();
    loop {
        let error = match command.try_get_matches_from_mut(argv.iter()) {
            Ok(matches) => match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
                Ok(cli) => return Ok(Parsed { cli, rejected }),
                Err(error) => error,
            },
            Err(error) => error,
        };
        let from_variable = (subcommand.as_deref() == Some("check"))
            .then(|| bad_variable(&command, "check", &error, &argv))
            .flatten();
        match from_variable {
            Some(id) => {
                rejected.extend(explain(&error, &command, "check"));
                command = command.mut_subcommand("check", |c| c.mut_arg(id, |a| a.env(None)));
            }
            None => return Err(Rejected { error, subcommand }),
        }
    }
}

/// `command` (and its subcommands) with the variable of every argument
/// whose variable is set but empty dropped: clap would hand the empty value
/// to the parser ("a value is required", "invalid duration \"\"").
fn unset_empty_variables(mut command: clap::Command) -> clap::Command {
    let empty: Vec<clap::Id> = command
        .get_arguments()
        .filter(|a| {
            a.get_env()
                .and_then(std::env::var_os)
                .is_some_and(|v| v.is_empty())
        })
        .map(|a| a.get_id().clone())
        .collect();
    for id in empty {
        command = command.mut_arg(id, |a| a.env(None));
    }
    let names: Vec<String> = command
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    for name in names {
        command = command.mut_subcommand(name, unset_empty_variables);
    }
    command
}

/// The argument of `subcommand` whose bad value came from its variable
/// (not from the command line), if that is what `error` is about.
fn bad_variable(
    command: &clap::Command,
    subcommand: &str,
    error: &clap::Error,
    argv: &[OsString],
) -> Option<clap::Id> {
    use clap::error::ErrorKind;
    if !matches!(
        error.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return None;
    }
    let arg = failed_arg(command, subcommand, error)?;
    arg.get_env()?;
    let long = format!("--{}", arg.get_long()?);
    let on_command_line = argv.iter().any(|a| {
        let a = a.to_string_lossy();
        a == long || a.starts_with(&format!("{long}="))
    });
    (!on_command_line).then(|| arg.get_id().clone())
}

/// The argument of `subcommand` that `error` names.
fn failed_arg<'a>(
    command: &'a clap::Command,
    subcommand: &str,
    error: &clap::Error,
) -> Option<&'a clap::Arg> {
    use clap::error::{ContextKind, ContextValue};
    let ContextValue::String(arg) = error.get(ContextKind::InvalidArg)? else {
        return None;
    };
    let long = arg.split_whitespace().next()?.strip_prefix("--")?;
    let scope = command.find_subcommand(subcommand).unwrap_or(command);
    scope.get_arguments().find(|a| a.get_long() == Some(long))
}

/// Prints a parse error and gives the exit code: for a bad value, the
/// runner's own configuration error (exit 2, as `load`'s): the flag, its
/// variable, and the parser's message, which quotes the value (never a
/// secret: a URL's user info is not shown) and says what to write; clap's
/// rendering would quote the raw value, user info and all. Anything else
/// (help, version, an unknown flag) as clap prints it.
pub fn report(rejected: &Rejected) -> i32 {
    let command = <Cli as clap::CommandFactory>::command();
    let subcommand = rejected.subcommand.as_deref().unwrap_or("run");
    match explain(&rejected.error, &command, subcommand) {
        Some(message) => {
            eprintln!("hosted-boot: configuration error: {message}");
            2
        }
        None => {
            let _ = rejected.error.print();
            rejected.error.exit_code()
        }
    }
}

/// The runner's message for a bad value of `subcommand`'s, `None` for any
/// other error.
fn explain(error: &clap::Error, command: &clap::Command, subcommand: &str) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let ContextValue::String(arg) = error.get(ContextKind::InvalidArg)? else {
        return None;
    };
    let flag = arg.split_whitespace().next().unwrap_or(arg);
    let variable = failed_arg(command, subcommand, error).and_then(|a| a.get_env());
    let named = match variable {
        Some(var) => format!("{flag} ({})", var.to_string_lossy()),
        None => flag.to_string(),
    };
    let value = match error.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(v)) => crate::text::clip(v, 80),
        _ => String::new(),
    };
    match error.kind() {
        ErrorKind::ValueValidation => {
            let reason = std::error::Error::source(error)?;
            // The runner's parsers quote the value themselves (a URL
            // without its user info); another's message may not name it.
            if reason.is::<crate::boot::values::InvalidValue>()
                || reason.is::<crate::timings::InvalidDuration>()
            {
                Some(format!("{named}: {reason}"))
            } else {
                Some(format!("{named}: {value:?} is not valid ({reason})"))
            }
        }
        ErrorKind::InvalidValue => {
            let valid = match error.get(ContextKind::ValidValue) {
                Some(ContextValue::Strings(values)) => values.join(", "),
                _ => return None,
            };
            let said = if value.is_empty() {
                "is empty; write one of".to_string()
            } else {
                format!("{value:?} is not one of")
            };
            Some(format!("{named}: {said} {valid}"))
        }
        _ => None,
    }
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
    /// Ask the running runner to save the agent's work now (a checkpoint
    /// notice, SIGUSR1) and wait for its answer.
    Checkpoint(crate::cmd::checkpoint::CheckpointArgs),
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
