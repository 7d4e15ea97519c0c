//! `hosted-boot supervise`: runs a program under the turn supervisor exactly
//! as a turn runs the agent (a session of its own with no controlling
//! terminal, subreaper, cgroup, guard, sweep, drain, time cap), `--times` runs in a row, with no coordinator.
//! It prints one JSON line per output line and per run on stdout, so that a
//! person can see what an agent image leaves behind, and the tests can run
//! the supervisor many times fast (under the PID 1 reaper too).
//!
//! Output lines:
//! `{"type":"line","run":1,"stream":"stdout","text":"…"}` and
//! `{"type":"exit","run":1,"pgid":…,"code":0,"signal":null,"status":"succeeded",
//! "error":null,"timedOut":false,"swept":0,"killed":[],"guardDied":null}`
//! (`status`/`error` as the `command` agent maps the exit; `killed` lists
//! every process the program left behind when it exited, killed after it:
//! `{"pid":…,"name":"sleep","by":"process group"|"cgroup"|"sweep"}`, its
//! guard aside; `swept` counts those that had left its process group; `guardDied` is the pid of a turn
//! guard that died before the run ended, which fails it `runner_error`), or `{"type":"spawn_failed","run":1,
//! "error":"…"}`. The exit code is the last run's (its exit code, 128+N for
//! signal N, 127 when it could not be started), or 128+N when SIGTERM or
//! SIGINT stopped the runs; 2 when `--agent-user` cannot be used.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::agent;
use crate::boot::config::BOOT_SECRET_VAR;
use crate::process::cgroup::CgroupMode;
use crate::process::supervisor::{self, Control, SpawnSpec, Stream, Supervision};
use crate::redact::Redactor;
use crate::signals::{self, Stop};
use crate::timings::parse_duration;

/// `hosted-boot supervise [OPTIONS] -- PROGRAM [ARGS]...`
#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// Runs in a row.
    #[arg(long, default_value_t = 1)]
    pub times: u32,
    /// SIGINT → SIGKILL grace of an interrupt, a stop signal or the time cap.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Bound on reading the pipes after the program exits.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub drain: Duration,
    /// Time cap of each run (`agent_timeout` when reached).
    #[arg(long, value_parser = parse_duration)]
    pub time_cap: Option<Duration>,
    /// Interrupt each run this long after it started, as a coordinator
    /// interrupt would.
    #[arg(long, value_parser = parse_duration)]
    pub interrupt_after: Option<Duration>,
    /// Per-run cgroup: `auto` or `off`.
    #[arg(long, value_enum, default_value = "auto")]
    pub turn_cgroup: CgroupMode,
    /// Working directory of the program [default: the current one].
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    /// The user (name or uid) the program runs as, as a turn's agent does
    /// with the runner's `--agent-user` (the runner must be root).
    #[arg(long)]
    pub agent_user: Option<String>,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

fn emit(value: Value) {
    // A closed stdout must not stop the runs (nor kill us: SIGPIPE is
    // ignored by the Rust runtime).
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
}

/// Runs `args.command` `args.times` times; returns the exit code described
/// in the module documentation. `env` is the program's environment (the
/// runner's, boot secret already removed).
pub async fn run(args: SuperviseArgs, env: BTreeMap<OsString, OsString>) -> i32 {
    let _log = crate::logging::init(None, Redactor::new(), None);
    let mut stop = match signals::listen() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hosted-boot supervise: {e}");
            return 1;
        }
    };
    let user = match &args.agent_user {
        Some(spec) => {
            match crate::agent_user::AgentUser::resolve(spec, rustix::process::geteuid().as_raw()) {
                Ok(u) => Some(u),
                Err(e) => {
                    eprintln!("hosted-boot supervise: {e}");
                    return 2;
                }
            }
        }
        None => None,
    };
    let cwd = match &args.cwd {
        Some(c) => c.clone(),
        None => std::env::current_dir().unwrap_or_else(|_| "/".into()),
    };
    let env: Vec<(OsString, OsString)> = env
        .into_iter()
        .filter(|(k, _)| k != BOOT_SECRET_VAR)
        .collect();
    let mut words = args.command.iter().cloned();
    let program = words.next().unwrap_or_default();
    let rest: Vec<String> = words.collect();
    let supervision = Supervision {
        drain: args.drain,
        time_cap: args.time_cap,
        cap_grace: args.grace,
        cgroup: args.turn_cgroup,
        guard_exe: Some(PathBuf::from("/proc/self/exe")),
        stop_signal: rustix::process::Signal::INT,
    };
    let mut code = 0;
    for n in 1..=args.times {
        let spec = SpawnSpec {
            program: program.clone(),
            args: rest.clone(),
            cwd: cwd.clone(),
            env: env.clone(),
            stdin: Vec::new(),
            stdin_feed: None,
            user: user.clone(),
        };
        let on_line = move |stream, line: crate::process::lines::Line| {
            let stream = match stream {
                Stream::Stdout => "stdout",
                Stream::Stderr => "stderr",
            };
            emit(json!({"type": "line", "run": n, "stream": stream, "text": line.text()}));
        };
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let redactor = crate::redact::Redactor::new();
        let output =
            move |stream| crate::process::output::LineSink::new(stream, &redactor, on_line);
        let supervised = supervisor::run(spec, control_rx, &supervision, output);
        tokio::pin!(supervised);
        let interrupt = async {
            match args.interrupt_after {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(interrupt);
        let mut interrupted = false;
        let mut stopped = false;
        let result = loop {
            tokio::select! {
                r = &mut supervised => break r,
                _ = &mut interrupt, if !interrupted => {
                    interrupted = true;
                    let _ = control_tx.send(Control::Interrupt { grace: args.grace });
                }
                changed = stop.changed() => {
                    if changed.is_err() {
                        continue;
                    }
                    stopped = true;
                    let control = match *stop.borrow_and_update() {
                        Stop::Immediate(_) => Control::Kill,
                        _ => Control::Interrupt { grace: args.grace },
                    };
                    let _ = control_tx.send(control);
                }
            }
        };
        code = report(n, result, interrupted || stopped, &supervision);
        if let Some(c) = stop.borrow().exit_code() {
            return c;
        }
    }
    code
}

/// Prints how run `n` ended (one `exit` line, or `spawn_failed`) and
/// returns its exit code: the program's, 128+N for a signal, 127 when it
/// could not start. `interrupted`: an interrupt or a stop was sent to it.
fn report(
    n: u32,
    result: Result<supervisor::Exit, supervisor::SpawnError>,
    interrupted: bool,
    supervision: &Supervision,
) -> i32 {
    match result {
        Ok(exit) => {
            let outcome = if let Some(guard) = exit.guard_died {
                agent::TurnOutcome::failed(
                    crate::wire::ErrorCode::RunnerError,
                    agent::drive::guard_died_message(guard),
                )
            } else if exit.timed_out && !interrupted {
                agent::TurnOutcome::failed(
                    crate::wire::ErrorCode::AgentTimeout,
                    supervision.timeout_message(),
                )
            } else if interrupted {
                agent::TurnOutcome::interrupted()
            } else {
                agent::command::outcome(&exit)
            };
            let status = exit.status;
            let code = match status.map(|s| (s.code(), s.signal())) {
                Some((Some(c), _)) => c,
                Some((None, Some(sig))) => 128 + sig,
                _ => 1,
            };
            emit(json!({
                "type": "exit",
                "run": n,
                "pgid": exit.pgid,
                "code": status.and_then(|s| s.code()),
                "signal": status.and_then(|s| s.signal()),
                "status": outcome.status.as_str(),
                "error": outcome.error.map(|e| e.code),
                "timedOut": exit.timed_out,
                "swept": exit.swept,
                "killed": exit.left_behind.iter().map(|l| json!({
                    "pid": l.pid,
                    "name": l.name,
                    "by": l.by.as_str(),
                })).collect::<Vec<_>>(),
                "guardDied": exit.guard_died,
            }));
            code
        }
        Err(e) => {
            emit(json!({"type": "spawn_failed", "run": n, "error": e.to_string()}));
            127
        }
    }
}
