//! The `hosted-boot` binary. Before any thread or runtime exists it turns
//! core dumps off and marks the process non-dumpable (or refuses to start),
//! takes the boot secret out of the environment (and out of the initial
//! environment block) or from the pipe of a PID 1 split, splits into reaper
//! and worker when it is PID 1 (`reaper.rs`), and installs the TLS provider;
//! then it parses the command line and runs the subcommand.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::ExitCode;

use hosted_boot::boot::config;
use hosted_boot::boot::config::RunArgs;
use hosted_boot::cli::{self, Command};
use hosted_boot::cmd::{check, checkpoint, demo, supervise};
use hosted_boot::process::{guard, reaper};
use hosted_boot::secret::Secret;
use hosted_boot::{boot, status, tls, workspace};

/// Marks every file descriptor above stderr close-on-exec, so that nothing
/// the runner inherited (a socket, a pipe of the platform) reaches the agent.
fn close_inherited_fds_on_exec() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: `fd` was listed as open; fcntl on one that closed since
        // (the directory's own descriptor) fails with EBADF, which is ignored.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        if let Ok(flags) = rustix::io::fcntl_getfd(fd) {
            let _ = rustix::io::fcntl_setfd(fd, flags | rustix::io::FdFlags::CLOEXEC);
        }
    }
}

/// Malloc arenas (glibc's `M_ARENA_MAX`): glibc gives each thread that
/// allocates an arena of its own, up to eight per core, each keeping what
/// it freed; the runner's threads allocate little and rarely at once (the
/// output pipeline's reader and adapter are the two that do, one per
/// worker). Two arenas held the figures of BENCHMARKS.md ("Resident cost",
/// "Event throughput"). An explicit `MALLOC_ARENA_MAX` wins.
const MALLOC_ARENAS: i32 = 2;

/// Limits malloc's arenas ([`MALLOC_ARENAS`]); before any thread exists.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a malloc parameter; no thread runs yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
        }
    }
}

fn main() -> ExitCode {
    // A checkpoint notice (PROTOCOL.md 4.5) before the boot listens for it
    // must not end the runner (SIGUSR1's default action): ignored from the
    // first line; the boot's handler replaces this, and the other
    // subcommands, which never get one, have the default again below.
    checkpoint_notices(libc::SIG_IGN);
    // Nothing may start a thread before this line.
    if let Err(e) = boot::secret_env::harden("the runner") {
        // Exit 2, as for the other failures before the first request.
        eprintln!("hosted-boot: {e}");
        return ExitCode::from(2);
    }
    limit_malloc_arenas();
    let handed = reaper::take_handed_secret();
    // SAFETY: single-threaded: nothing else runs yet (see above).
    let (env, env_secret) = unsafe { boot::secret_env::take_boot_secret() };
    close_inherited_fds_on_exec();
    let boot_secret = match handed {
        Ok(Some(secret)) => Some(secret),
        Ok(None) => env_secret,
        Err(e) => {
            eprintln!("hosted-boot: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    if reaper::is_pid1() {
        // Still single-threaded: the reaper forks the worker and only reaps.
        return exit_code(reaper::run(boot_secret));
    }
    tls::install_crypto_provider();

    let cli::Parsed { cli, rejected } = match cli::parse(std::env::args_os()) {
        Ok(parsed) => parsed,
        Err(e) => return exit_code(cli::report(&e)),
    };
    if !matches!(cli.command, Command::Run(_)) {
        checkpoint_notices(libc::SIG_DFL);
    }
    let code = match cli.command {
        Command::Run(args) => run(args, env, boot_secret),
        Command::Credential(args) => {
            workspace::credential::run_credential_helper(&args.action, &args.context)
        }
        Command::Check(args) => with_runtime(|| check::run(env, args, boot_secret, rejected)),
        Command::Status(args) => match args.root.map_or_else(config::working_dir, Ok) {
            Ok(root) => status::command(&root, args.check),
            Err(e) => {
                // `status` answers on stdout, exit 1 (never 2, which Docker
                // reserves), as for any other unhealthy state.
                println!("unhealthy: {e}");
                1
            }
        },
        Command::Checkpoint(args) => match args.root.map_or_else(config::working_dir, Ok) {
            Ok(root) => checkpoint::run(&root, args.timeout, !args.no_wait),
            Err(e) => {
                eprintln!("hosted-boot checkpoint: {e}");
                1
            }
        },
        Command::DemoAgent => demo::agent_main(),
        Command::Supervise(args) => with_runtime(|| supervise::run(args, env)),
        Command::Coordinator(_) => moved("coordinator", "hosted-boot-coordinator serve"),
        Command::Demo(_) => moved("demo", "hosted-boot-coordinator demo"),
        Command::Conformance(_) => moved("conformance", "hosted-boot-conformance"),
        Command::TurnGuard(args) => guard::main(args.session, args.cgroup),
    };
    exit_code(code)
}

/// A subcommand that left the runner for a binary of its own (issue 34:
/// the sandbox binary is only the runner): where it went; exit 2.
fn moved(old: &str, new: &str) -> i32 {
    eprintln!(
        "hosted-boot: `{old}` is no longer a subcommand of the runner; run `{new}` (a binary of its own, which `cargo build` leaves beside this one; README, \"The two commands\")"
    );
    2
}

/// Sets the disposition of the checkpoint notices (SIGUSR1, SIGUSR2).
fn checkpoint_notices(disposition: libc::sighandler_t) {
    // SAFETY: plain libc calls setting a disposition (SIG_IGN or SIG_DFL),
    // before any thread or handler of ours exists.
    unsafe {
        libc::signal(libc::SIGUSR1, disposition);
        libc::signal(libc::SIGUSR2, disposition);
    }
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn run(args: RunArgs, env: BTreeMap<OsString, OsString>, boot_secret: Option<Secret>) -> i32 {
    let cwd = match config::root_base(args.root.as_deref()) {
        Ok(cwd) => cwd,
        Err(e) => {
            eprintln!("hosted-boot: {e}");
            return 2;
        }
    };
    let config = match config::load(&env, &args, boot_secret, cwd) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hosted-boot: {e}");
            return 2;
        }
    };
    // With --agent-user the root is the runner's before it writes there
    // (issue 31): an agent that can write it can put links in the runner's
    // place.
    if let Some(user) = &config.agent_user {
        match user.secure_root(&config.root) {
            Ok(true) => eprintln!(
                "hosted-boot: the root {} was writable by the agent user {}: made root's, not writable by group or others",
                config.root.display(),
                user.name
            ),
            Ok(false) => {}
            Err(e) => {
                eprintln!("hosted-boot: configuration error: {e}");
                return 2;
            }
        }
    }
    // Before the boot removes or writes anything under the root, and held
    // until the process exits (runtime shutdown included): a second runner
    // on the root would destroy this one's session (PROTOCOL.md 3, 4 step 1).
    // Here, in the process that boots: under PID 1 that is the worker.
    let _lock = match workspace::RootLock::acquire(&config.root) {
        Ok(lock) => lock,
        Err(e) => {
            eprintln!("hosted-boot: configuration error: {e}");
            return 2;
        }
    };
    with_runtime_of(Some(RUNNER_WORKERS), || boot::run(config))
}

/// The runner's runtime worker threads. Its concurrency is a handful of
/// tasks (the turn's output reader and adapter, the event sender, the
/// interrupt watch, the credential broker, the API proxy), and blocking
/// work (git, waits on the agent) runs on the blocking pool, so two workers
/// let the output pipeline's halves use two cores while one task is busy;
/// tokio's default, one worker per CPU the process may use, would start
/// one thread (a stack, a malloc arena) per core of a large host
/// (BENCHMARKS.md, "Resident cost").
const RUNNER_WORKERS: usize = 2;

fn with_runtime<F, Fut>(f: F) -> i32
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = i32>,
{
    with_runtime_of(None, f)
}

/// [`with_runtime`] with `workers` runtime worker threads (tokio's default
/// when `None`).
fn with_runtime_of<F, Fut>(workers: Option<usize>, f: F) -> i32
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = i32>,
{
    hosted_boot::agent_user::remember_starting_identity();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        builder.worker_threads(n);
    }
    match builder
        .enable_all()
        // A thread born of one acting as the agent user starts as root.
        .on_thread_start(hosted_boot::agent_user::reset_thread_identity)
        .build()
    {
        Ok(rt) => {
            let code = rt.block_on(f());
            // Blocking threads (a clone, a stuck read) must not hold the exit.
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
            code
        }
        Err(e) => {
            eprintln!("hosted-boot: cannot start the async runtime: {e}");
            1
        }
    }
}
