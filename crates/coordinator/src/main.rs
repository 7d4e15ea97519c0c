//! `hosted-boot-coordinator`: the reference coordinator (`serve`) and the
//! demo scenario (`demo`), a binary of their own so that the sandbox image
//! carries only the runner (issue 34). Both run the runner binary,
//! `hosted-boot`, found beside this one or on PATH (`--runner` names it).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hosted_boot_coordinator::{CoordinatorArgs, demo, run_cli, runner_binary};

/// The reference coordinator of hosted-boot (PROTOCOL.md section 6) and its
/// demo.
#[derive(Debug, Parser)]
#[command(name = "hosted-boot-coordinator", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the reference coordinator on loopback, for local debugging; it
    /// prints a sandbox line that runs the runner against it.
    Serve(Box<CoordinatorArgs>),
    /// Run a three-turn scenario: the coordinator in this process, the
    /// runner (`hosted-boot run`) booted against it with its demo agent.
    Demo(demo::DemoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hosted-boot-coordinator: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match cli.command {
        Command::Serve(args) => {
            init_logging();
            match runtime.block_on(run_cli(*args)) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("hosted-boot-coordinator: {e:#}");
                    1
                }
            }
        }
        // The demo prints its own timeline; the coordinator's log lines
        // would interleave with it, so none is installed.
        Command::Demo(args) => match runner_binary::find(args.runner.as_deref()) {
            Ok(runner) => runtime.block_on(demo::run(args, &runner)),
            Err(e) => {
                eprintln!("hosted-boot-coordinator demo: {e:#}");
                1
            }
        },
    };
    // Blocking threads (a git child, a held read) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Log lines on stderr, filtered by `HOSTED_BOOT_LOG` (as the runner's,
/// `info` by default).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOSTED_BOOT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
