//! `hosted-boot-coordinator serve`: the reference coordinator as a command
//! (PROTOCOL.md section 6): starts it, prints what a sandbox and a person
//! need, serves until Ctrl-C (or SIGTERM).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use super::{Coordinator, CoordinatorOptions};
use crate::timings::parse_duration;

/// Flags of `hosted-boot-coordinator serve`.
#[derive(Args, Clone, Debug)]
pub struct CoordinatorArgs {
    /// A non-bare git repository to serve (cloned bare); a sample repository
    /// when absent.
    #[arg(long, value_name = "PATH")]
    pub repo: Option<PathBuf>,
    /// The session's initial task (`clientInfo.task`), pending as `run-1`.
    #[arg(
        long,
        value_name = "TEXT",
        default_value = "Add a short CONTRIBUTING.md describing how to run the project."
    )]
    pub task: String,
    /// Address to listen on. A non-loopback address makes the dev API require
    /// the dev token printed at start.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8787")]
    pub listen: SocketAddr,
    /// Base URL to advertise instead of the listening address (for example
    /// `http://coordinator:8787/` on a compose network).
    #[arg(long, value_name = "URL")]
    pub advertise_url: Option<url::Url>,
    /// The session branch.
    #[arg(long, value_name = "NAME", default_value = "orizu/session-1")]
    pub branch: String,
    /// Do not create the session branch in the served repository.
    #[arg(long)]
    pub no_create_branch: bool,
    /// The session id.
    #[arg(long, value_name = "ID", default_value = "s1")]
    pub session_id: String,
    /// `repoFullName` (owner/name) of the served repository.
    #[arg(long, value_name = "OWNER/NAME", default_value = "acme/app")]
    pub repo_name: String,
    /// A connector of the env bundle, `NAME=VALUE` (repeatable).
    #[arg(long = "connector", value_name = "NAME=VALUE", value_parser = parse_connector)]
    pub connectors: Vec<(String, String)>,
    /// A name for the env bundle's `redactVars` (repeatable).
    #[arg(long = "redact-var", value_name = "NAME")]
    pub redact_vars: Vec<String>,
    /// A connector of the env bundle for the setup script only (`"scope":
    /// "setup"`), `NAME=VALUE` (repeatable).
    #[arg(long = "setup-connector", value_name = "NAME=VALUE", value_parser = parse_connector)]
    pub setup_connectors: Vec<(String, String)>,
    /// The session's `setup.script`: a shell command the runner runs in
    /// `repo/` before the first agent (PROTOCOL.md 4.1, "Setup").
    #[arg(long = "session-setup-script", value_name = "COMMAND")]
    pub setup_script: Option<String>,
    /// A glob of the session's `setup.inputs` (repeatable).
    #[arg(long = "session-setup-input", value_name = "GLOB")]
    pub setup_inputs: Vec<String>,
    /// Lifetime of each agent bearer (`10m`, `1h`, …).
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    pub bearer_ttl: Duration,
    /// Lifetime of each repo token.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    pub repo_token_ttl: Duration,
    /// `clientInfo.model`.
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// `clientInfo.reasoningEffort`.
    #[arg(long, value_name = "EFFORT")]
    pub reasoning_effort: Option<String>,
    /// `clientInfo.durationMinutes` (per-turn time cap).
    #[arg(long, value_name = "MINUTES")]
    pub duration_minutes: Option<f64>,
    /// Start with no run: the sandbox boots, posts `ready` and waits for a
    /// turn.
    #[arg(long)]
    pub start_idle: bool,
    /// Do not print each request as a line as it arrives (on stderr).
    #[arg(long)]
    pub no_request_log: bool,
    /// Where to put the bare repository; a temporary directory (removed at
    /// exit) when absent.
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// Refuse a push that brings a file larger than this many bytes (as a
    /// git host with a file size limit does); no limit when absent.
    #[arg(long, value_name = "BYTES")]
    pub git_max_file_size: Option<u64>,
    /// Do not offer the long-poll of the session read (PROTOCOL.md 2.4):
    /// answer every session read at once, as a coordinator without the
    /// extension does.
    #[arg(long)]
    pub no_long_poll: bool,
    /// Serve this many sessions (a fleet): the first is `--session-id`, the
    /// others `<id>-2`, `<id>-3`, … (`GET dev/sessions` lists each one's
    /// sandbox environment).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub sessions: u32,
    /// Answer every route of the contract and every git request no sooner
    /// than this many milliseconds after it arrived (the dev API never
    /// waits), as a coordinator one round trip away would.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub latency_ms: u64,
    /// Keep counts of what the runner sends, not its bodies (events keep
    /// their seq and type, not their data; requests their length, not
    /// their body): flat memory over a long session, for `bench/memory`.
    #[arg(long)]
    pub counts_only: bool,
    /// Take a saved agent state (PROTOCOL.md 2.7) of up to this many bytes
    /// (at most 16 MiB); offered in the session as `agentState`.
    #[arg(long, value_name = "BYTES", default_value_t = crate::DEFAULT_AGENT_STATE_MAX_BYTES,
          value_parser = clap::value_parser!(u64).range(1..=16 * 1024 * 1024))]
    pub agent_state_max_bytes: u64,
    /// Do not offer the agent state (PROTOCOL.md 2.7): the session has no
    /// `agentState` and the route answers 404, as a coordinator without the
    /// extension.
    #[arg(long)]
    pub no_agent_state: bool,
    /// Do not accept the `released` status (PROTOCOL.md 2.2): the session
    /// has no `acceptsReleased`, and a runner never releases it.
    #[arg(long)]
    pub no_release: bool,
    /// The runner binary the printed sandbox line runs [default:
    /// `hosted-boot` beside this binary, else on PATH].
    #[arg(long, value_name = "PATH")]
    pub runner: Option<PathBuf>,
}

fn parse_connector(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err("expected NAME=VALUE (the value is not shown)".to_string()),
    }
}

impl CoordinatorArgs {
    /// The session's `setup` field: absent unless a script or an input is
    /// given.
    fn session_setup(&self) -> Option<crate::wire::SessionSetup> {
        (self.setup_script.is_some() || !self.setup_inputs.is_empty()).then(|| {
            crate::wire::SessionSetup {
                script: self.setup_script.clone(),
                inputs: (!self.setup_inputs.is_empty()).then(|| self.setup_inputs.clone()),
            }
        })
    }

    /// The options these flags describe.
    pub fn options(&self) -> CoordinatorOptions {
        CoordinatorOptions {
            session_id: self.session_id.clone(),
            repo_full_name: self.repo_name.clone(),
            branch: self.branch.clone(),
            create_branch: !self.no_create_branch,
            source_repo: self.repo.clone(),
            workdir: self.workdir.clone(),
            task: self.task.clone(),
            model: self.model.clone(),
            reasoning_effort: self.reasoning_effort.clone(),
            duration_minutes: self.duration_minutes,
            start_idle: self.start_idle,
            connectors: self.connectors.clone(),
            redact_vars: self.redact_vars.clone(),
            setup_connectors: self.setup_connectors.clone(),
            setup: self.session_setup(),
            bearer_ttl: self.bearer_ttl,
            repo_token_ttl: self.repo_token_ttl,
            listen: self.listen,
            advertise_url: self.advertise_url.clone(),
            git_max_file_size: self.git_max_file_size,
            long_poll: !self.no_long_poll,
            sessions: self.sessions as usize,
            latency: Duration::from_millis(self.latency_ms),
            counts_only: self.counts_only,
            agent_state_max_bytes: (!self.no_agent_state).then_some(self.agent_state_max_bytes),
            accepts_released: !self.no_release,
            ..CoordinatorOptions::default()
        }
    }
}

/// Runs `hosted-boot-coordinator serve`: starts the coordinator, prints the
/// start-up text ([`Coordinator::startup_text`]) on stdout, serves until
/// Ctrl-C or SIGTERM, then stops.
///
/// Errors: the coordinator cannot start (see [`Coordinator::start`]).
pub async fn run_cli(args: CoordinatorArgs) -> anyhow::Result<()> {
    // Its git starts in the working directory, which must be readable.
    readable_working_dir()?;
    // The sandbox line names the runner; serving does not need it, so a
    // runner not found is said and the line names `hosted-boot` for PATH.
    let runner = match crate::runner_binary::find(args.runner.as_deref()) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("hosted-boot-coordinator: {e:#}");
            PathBuf::from(crate::runner_binary::NAME)
        }
    };
    let stop = stop_signal()?;
    let coordinator = Coordinator::start(args.options()).await?;
    println!("{}", coordinator.startup_text(&runner));
    if let Err(e) = std::fs::create_dir_all(sandbox_root(&coordinator)) {
        eprintln!("hosted-boot-coordinator: cannot create the sample sandbox root: {e}");
    }
    if args.no_request_log {
        stop.await;
    } else {
        tokio::select! {
            () = stop => {}
            () = request_log(&coordinator) => {}
        }
    }
    eprintln!("hosted-boot-coordinator: stopping");
    coordinator.shutdown().await;
    Ok(())
}

/// Prints each request as one line on stderr once answered, and a line per
/// turn when it is sealed (`request_log`).
async fn request_log(c: &Coordinator) {
    let mut log = crate::request_log::RequestLog::default();
    loop {
        for line in log.next_lines(c) {
            eprintln!("{line}");
        }
        c.changed(Duration::from_millis(250)).await;
    }
}

/// The sandbox root the printed `env` line gives the runner: a directory of
/// its own, not the working directory (which may be a checkout), one per coordinator
/// process (its pid in the name). A root named by session and port alone
/// was the same for the next coordinator on that port, whose session has the
/// same id and branch but a new repository: the runner reused the old
/// `repo/` and its harvest at boot pushed the old session's commits into the
/// new one.
fn sandbox_root(c: &Coordinator) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "hosted-boot-sandbox-{}-{}-{}",
        c.session_id(),
        c.local_addr().port(),
        std::process::id()
    ))
}

/// Ctrl-C or SIGTERM. Both are listened for from when this is called, not
/// from the first poll: `run_cli` calls it before it prints the start-up
/// text, so a stop sent by whoever read the text is never the signal's
/// default action (an exit without the coordinator's cleanup); the demo
/// before it creates anything.
pub(crate) fn stop_signal() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// See [`Coordinator::startup_text`].
pub(crate) fn startup_text(c: &Coordinator, runner: &Path) -> String {
    let base = c.base_url();
    let mut env = c.sandbox_env();
    let loopback = c.local_addr().ip().is_loopback();
    if !loopback {
        env.push(("HOSTED_BOOT_INSECURE_HTTP".into(), "1".into()));
    }
    let assignments: Vec<String> = env
        .iter()
        .map(|(k, v)| crate::text::shell_word(&format!("{k}={v}")))
        .collect();
    let docker_env: Vec<String> = assignments.iter().map(|a| format!("-e {a}")).collect();
    let network = if loopback { "--network host " } else { "" };
    let auth = c
        .dev_token()
        .map(|t| {
            format!(
                " -H {}",
                crate::text::shell_word(&format!("authorization: Bearer {t}"))
            )
        })
        .unwrap_or_default();
    let json = " -H 'content-type: application/json'";
    let dev = |p: &str| format!("{base}dev/{p}");
    let mut out = String::new();
    out.push_str(&format!(
        "hosted-boot-coordinator: session {} on {base}\n",
        c.session_id()
    ));
    out.push_str(&format!(
        "repository: {} (bare repository {}), session branch {}\n",
        c.clone_url(),
        c.bare_repo().display(),
        c.branch()
    ));
    if let Some(t) = c.dev_token() {
        out.push_str(&format!(
            "dev token (dev API, Authorization: Bearer): {t}\n"
        ));
    }
    let exe = crate::text::shell_word(&runner.to_string_lossy());
    let root = crate::text::shell_word(&sandbox_root(c).to_string_lossy());
    out.push_str(
        "\nA sandbox, runnable as pasted (the built-in demo agent; for a real CLI set\nHOSTED_BOOT_AGENT=claude, codex or opencode, with its provider key).\nThe initial task runs at once as run-1; a turn queued during it waits until it is sealed:\n\n",
    );
    out.push_str(&format!(
        "  mkdir -p {root} && env {} HOSTED_BOOT_ROOT={root} HOSTED_BOOT_AGENT=demo {exe} run\n\n",
        assignments.join(" "),
    ));
    out.push_str(&format!(
        "  docker run --rm {network}{} -e HOSTED_BOOT_AGENT=demo \"$IMAGE\"\n",
        docker_env.join(" ")
    ));
    out.push_str(&format!(
        "\n(The runner above is {exe}: `cargo build` leaves hosted-boot and\nhosted-boot-coordinator in target/debug/ or target/release/, not on PATH.)\n"
    ));
    out.push_str("\nDev API: a turn (the demo agent finishes it at once), a slow turn (a prompt\nthat mentions the full test suite makes it work until interrupted), the\ninterrupt, the end of the session, what the coordinator saw:\n\n");
    out.push_str(&format!(
        "  curl -sS -X POST {}{auth}{json} -d '{{\"body\": \"Now add a test\"}}'\n",
        dev("turns")
    ));
    out.push_str(&format!(
        "  curl -sS -X POST {}{auth}{json} -d '{{\"body\": \"Run the full test suite\"}}'\n",
        dev("turns")
    ));
    out.push_str(&format!(
        "  curl -sS -X POST {}{auth}{json} -d '{{}}'\n",
        dev("interrupt")
    ));
    out.push_str(&format!("  curl -sS -X POST {}{auth}\n", dev("end")));
    out.push_str(&format!("  curl -sS {}{auth}\n", dev("state")));
    out.push_str(&format!("  curl -sS {}{auth}\n", dev("requests")));
    out.push_str(&format!(
        "  curl -sS {}{auth}\n",
        crate::text::shell_word(&dev("requests?format=table"))
    ));
    out.push_str(&format!(
        "  curl -sS -X POST {}{auth}{json} -d '{{\"route\": \"session\", \"status\": 503, \"count\": 2}}'\n",
        dev("faults")
    ));
    out.push_str("\nCtrl-C stops it.");
    out
}

/// The working directory, where the coordinator's git (and the demo's
/// runner) start: it must exist and be readable.
///
/// Errors: it was removed, or this user cannot read it.
pub(crate) fn readable_working_dir() -> anyhow::Result<PathBuf> {
    let cwd = std::env::current_dir().context(
        "the working directory cannot be determined (it was probably removed); start from an existing directory",
    )?;
    std::fs::metadata(&cwd).with_context(|| {
        format!(
            "the working directory {} cannot be read; start from a directory this user can read (a parent with mode 0700, as `mktemp -d` makes, hides everything under it from other users)",
            cwd.display()
        )
    })?;
    Ok(cwd)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: CoordinatorArgs,
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "x",
            "--connector",
            "API_KEY=a=b",
            "--connector",
            "OTHER=",
            "--redact-var",
            "SECRET",
            "--bearer-ttl",
            "10m",
            "--listen",
            "127.0.0.1:0",
            "--start-idle",
            "--latency-ms",
            "50",
        ])
        .unwrap();
        let o = cli.args.options();
        assert_eq!(
            o.connectors,
            vec![
                ("API_KEY".to_string(), "a=b".to_string()),
                ("OTHER".to_string(), String::new())
            ]
        );
        assert_eq!(o.redact_vars, vec!["SECRET".to_string()]);
        assert_eq!(o.bearer_ttl, Duration::from_secs(600));
        assert!(o.start_idle && o.create_branch);
        assert_eq!(o.latency, Duration::from_millis(50));
        assert_eq!(o.session_id, "s1");
        assert!(Cli::try_parse_from(["x", "--connector", "novalue"]).is_err());
        assert!(Cli::try_parse_from(["x", "--bearer-ttl", "soon"]).is_err());
    }
}
