//! `hosted-boot-conformance`: checks a platform's coordinator against the
//! contract with one real turn of the runner (README, "For platform
//! implementers"). Before any thread exists it hardens the process and takes
//! the boot secret out of the environment, as the runner does; `agent` is
//! the built-in agent the runner runs for that turn.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hosted_boot::boot::secret_env;
use hosted_boot_conformance::ConformanceArgs;

/// Check a platform's coordinator against the contract with one real turn
/// of a session it prepared (run with the sandbox's environment), and print
/// a table of checks.
#[derive(Debug, Parser)]
#[command(
    name = "hosted-boot-conformance",
    version,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    args: ConformanceArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The built-in agent (the runner runs it for the turn).
    #[command(hide = true)]
    Agent,
}

fn main() -> ExitCode {
    // Nothing may start a thread before this line.
    if let Err(e) = secret_env::harden("conformance") {
        eprintln!("hosted-boot-conformance: {e}");
        return ExitCode::from(2);
    }
    // SAFETY: single-threaded: nothing else runs yet.
    let (env, boot_secret) = unsafe { secret_env::take_boot_secret() };
    hosted_boot::tls::install_crypto_provider();
    let cli = Cli::parse();
    let code = match cli.command {
        Some(Command::Agent) => hosted_boot_conformance::agent_main(),
        None => match tokio::runtime::Runtime::new() {
            Ok(rt) => {
                let code = rt.block_on(hosted_boot_conformance::run(env, cli.args, boot_secret));
                rt.shutdown_timeout(std::time::Duration::from_secs(1));
                code
            }
            Err(e) => {
                eprintln!("hosted-boot-conformance: cannot start the async runtime: {e}");
                1
            }
        },
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
