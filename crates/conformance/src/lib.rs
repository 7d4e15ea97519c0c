//! `hosted-boot-conformance`: checks a platform's coordinator against the
//! contract (PROTOCOL.md section 2, `docs/openapi.yaml`) with one real turn.
//! A binary of its own (issue 34), so that the sandbox image's runner
//! carries neither the document nor its validator.
//!
//! Given the environment a sandbox gets (section 1), it starts the real
//! runner (`hosted-boot run`, found beside this binary, on PATH or by
//! `--runner`) with the built-in conformance agent (this binary's `agent`,
//! [`agent_main`]) and points the runner's URLs at a recording proxy on
//! loopback ([`proxy`]) that forwards to the coordinator and validates every
//! answer against the document. The agent sends events in a large and a
//! small batch (its last line waits until the proxy saw the large one
//! accepted whole, so it goes alone whatever the coordinator's pace) and
//! pushes a commit to the session branch through the credential helper; the proxy resends the first accepted batch and reads
//! the cursor; once `turn_completed` is acknowledged, the runner gets
//! SIGTERM and stops as a graceful stop does between turns (4.4: nothing
//! posted, files removed), so the session stays usable. Then a table: each
//! check, pass or fail, its section, and for a failure what was expected and
//! what came (never a value that may be a secret). Exit 0 only when all pass.
//!
//! Schema validation lives here only: `run` never loads the document.

pub mod openapi;
pub mod proxy;

// The contract's modules under the names the runner gives them.
pub(crate) use hosted_boot_wire::{locks, runner_binary, secret, text, timings, validate, wire};

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde_json::{Value, json};
use url::Url;

use self::openapi::Document;
use self::proxy::{Exchange, Milestone, Proxy, Record, Upstream};
use crate::secret::Secret;
use crate::wire::routes::{Route, TABLE};

/// Events the agent writes at once: more than one full batch (500, 2.6).
pub const LARGE_BURST: usize = 1200;
/// A batch with at least this many events counts as large.
const LARGE_BATCH: usize = 100;
/// A batch with at most this many events counts as small.
const SMALL_BATCH: usize = 10;
/// The line the agent prints once its push of the session branch succeeded.
pub const PUSH_MARKER: &str = "conformance-push-ok";
/// The variable naming the file the proxy creates once the coordinator has
/// accepted the agent's burst whole: the agent waits for it before its last
/// line, which then goes out in a batch of its own, whatever the
/// coordinator's pace (a slow one had the line join the burst's last
/// batch, and "a small batch" failed a coordinator that conforms).
pub const BURST_ACCEPTED_VAR: &str = "HOSTED_BOOT_CONFORMANCE_BURST_ACCEPTED";
/// How long the agent waits for it: past this the line goes out anyway
/// (and the check says what came).
const BURST_WAIT: Duration = Duration::from_secs(120);

/// Flags of `hosted-boot-conformance`. The coordinator and the session come
/// from the sandbox environment (`ORIZU_*`, PROTOCOL.md section 1).
#[derive(Args, Clone, Debug)]
pub struct ConformanceArgs {
    /// The sandbox root for the runner (an empty directory) [default: a
    /// temporary directory, removed at exit].
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Bound on the whole check (`5m`, `90s`).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = crate::timings::parse_duration)]
    pub timeout: Duration,
    /// The runner binary to run the turn with [default: `hosted-boot`
    /// beside this binary, else on PATH].
    #[arg(long, value_name = "PATH")]
    pub runner: Option<PathBuf>,
}

/// One row of the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// What is checked.
    pub name: String,
    /// The PROTOCOL.md section.
    pub section: &'static str,
    /// `Ok` or what was expected and what came.
    pub outcome: Result<(), String>,
}

fn check(name: impl Into<String>, section: &'static str, outcome: Result<(), String>) -> Check {
    Check {
        name: name.into(),
        section,
        outcome,
    }
}

/// Runs `hosted-boot-conformance`; returns 0 when every check passed, 1
/// when one failed, 2 when the environment is not a sandbox's.
pub async fn run(
    env: BTreeMap<OsString, OsString>,
    args: ConformanceArgs,
    boot_secret: Option<Secret>,
) -> i32 {
    let get = |name: &str| {
        env.get(&OsString::from(name))
            .map(|v| v.to_string_lossy().into_owned())
    };
    let setup = (|| -> anyhow::Result<(Upstream, String)> {
        let url = |name: &str| -> anyhow::Result<Url> {
            let text = get(name).with_context(|| {
                format!("{name} is not set: give conformance the sandbox's environment")
            })?;
            Url::parse(&text).map_err(|e| anyhow::anyhow!("{name} is not a URL: {e}"))
        };
        let agent_token = url("ORIZU_AGENT_TOKEN_URL")?;
        let boot_status = match get("ORIZU_BOOT_STATUS_URL") {
            Some(_) => url("ORIZU_BOOT_STATUS_URL")?,
            None => agent_token.join("boot-status")?,
        };
        let mut api_base = url("ORIZU_API_BASE_URL")?;
        if !api_base.path().ends_with('/') {
            let path = format!("{}/", api_base.path());
            api_base.set_path(&path);
        }
        let session = get("ORIZU_SESSION_ID").context("ORIZU_SESSION_ID is not set")?;
        Ok((
            Upstream {
                api_base,
                agent_token,
                boot_status,
            },
            session,
        ))
    })();
    let (upstream, session) = match setup {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hosted-boot-conformance: {e:#}");
            return 2;
        }
    };
    let runner = match crate::runner_binary::find(args.runner.as_deref()) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("hosted-boot-conformance: {e}");
            return 2;
        }
    };
    let Some(boot_secret) = boot_secret else {
        eprintln!(
            "hosted-boot-conformance: ORIZU_BOOT_SECRET is not set: give conformance the sandbox's environment"
        );
        return 2;
    };
    println!(
        "hosted-boot-conformance: session {session} on {}",
        // Never a credential: user info, query and fragment are elided.
        crate::validate::shown_url(upstream.api_base.as_str())
    );
    println!(
        "This runs one real turn of the session, as a sandbox would: it pulls a bearer, reads the \
         env bundle and the session, mints repo tokens, posts turn_started and turn_completed, marks \
         the session's next run started, posts its events (and resends one batch, which the \
         contract says is ignored), pushes one commit (CONFORMANCE.md) to the session branch and \
         seals the run. Then it stops the runner as a graceful stop does (PROTOCOL.md 4.4): no \
         complete or failed is posted and the session stays active. Nothing else is changed."
    );
    println!();
    let checks = match exercise(&env, &args, &runner, boot_secret, upstream).await {
        Ok(checks) => checks,
        Err(e) => {
            eprintln!("hosted-boot-conformance: {e:#}");
            return 2;
        }
    };
    print!("{}", table(&checks));
    let failed = checks.iter().filter(|c| c.outcome.is_err()).count();
    println!();
    if failed == 0 {
        println!("all {} checks passed", checks.len());
        0
    } else {
        println!("{failed} of {} checks failed", checks.len());
        1
    }
}

// long: one conformance run in order (proxy, runner, the wait for a
// milestone or a stop, the graceful stop, the judging) over one proxy,
// child and temporary directory.
async fn exercise(
    env: &BTreeMap<OsString, OsString>,
    args: &ConformanceArgs,
    runner_bin: &Path,
    boot_secret: Secret,
    upstream: Upstream,
) -> anyhow::Result<Vec<Check>> {
    // Listened for from here on: a person's Ctrl-C or a SIGTERM stops the
    // runner as a sandbox's stop does (4.4), with the proxy still serving
    // it, and the temporary directory goes (its default action would leave
    // the runner alone against a proxy that is gone, and the directory).
    let mut stop = hosted_boot::signals::listen().map_err(anyhow::Error::msg)?;
    let doc = Document::load().map_err(anyhow::Error::msg)?;
    let ca = env
        .get(&OsString::from("HOSTED_BOOT_CA_FILE"))
        .map(PathBuf::from);
    let http = hosted_boot::tls::http_client(ca.as_deref())?;
    let temp = tempfile::Builder::new()
        .prefix("hosted-boot-conformance-")
        .tempdir()?;
    let burst_accepted = temp.path().join("burst-accepted");
    let proxy = Proxy::start(upstream, http, doc, burst_accepted.clone()).await?;
    let root = match &args.root {
        Some(r) => r.clone(),
        None => temp.path().join("sandbox"),
    };
    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    let log_path = temp.path().join("runner.log");
    let log = std::fs::File::create(&log_path)?;
    let mut child = runner_command(env, runner_bin, &boot_secret, &proxy, &root, log)?
        .env(BURST_ACCEPTED_VAR, &burst_accepted)
        .spawn()
        .context("cannot start the runner")?;
    drop(boot_secret);
    let mut milestones = proxy.milestones.clone();
    let mut interrupted = None;
    let waited = tokio::time::timeout(args.timeout, async {
        loop {
            tokio::select! {
                status = child.wait() => return (None, status.ok()),
                changed = stop.changed() => {
                    if changed.is_ok() && stop.borrow().signal().is_some() {
                        interrupted = Some(stop.borrow().signal_name());
                        return (None, None);
                    }
                }
                changed = milestones.changed() => {
                    if changed.is_err() {
                        continue;
                    }
                    let m = *milestones.borrow();
                    match m {
                        Milestone::Ready | Milestone::BetweenTurns => return (Some(m), None),
                        // Stopped only once the runner waits between turns (4.2),
                        // so that the stop is the between-turns one of 4.4.
                        Milestone::TurnCompleted | Milestone::None => {}
                    }
                }
            }
        }
    })
    .await;
    let (milestone, mut exit) = waited.unwrap_or_default();
    let mut stopped_by_us = false;
    if exit.is_none() {
        stopped_by_us = child.id().is_some();
        exit = stop_runner(&mut child).await;
    }
    if let Some(signal) = interrupted {
        // The temporary directory (the root, unless --root) goes when
        // `temp` drops; the session keeps what the runner sealed.
        anyhow::bail!(
            "stopped by {signal} before the checks were done: the runner was stopped as a sandbox is (it exited {}); no table",
            exit.and_then(|s| s.code())
                .map_or_else(|| "by a signal".to_string(), |c| c.to_string())
        );
    }
    let record = proxy.finish();
    let session_files_left = std::fs::read_dir(root.join(".orizu-session"))
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    let checks = judge(
        &record,
        milestone,
        exit.and_then(|s| {
            use std::os::unix::process::ExitStatusExt;
            s.code().or_else(|| s.signal().map(|n| 128 + n))
        }),
        stopped_by_us,
        session_files_left,
    );
    if checks.iter().any(|c| c.outcome.is_err())
        && let Ok(text) = std::fs::read_to_string(&log_path)
    {
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines.len().saturating_sub(30);
        eprintln!("the runner's log (its last lines, redacted by the runner):");
        for line in lines.iter().skip(tail) {
            eprintln!("  {line}");
        }
        eprintln!();
    }
    Ok(checks)
}

/// The real runner (`run`) with the sandbox's environment, its URLs the
/// proxy's, the built-in agent (this binary's `agent`), `root` and its log.
fn runner_command(
    env: &BTreeMap<OsString, OsString>,
    runner_bin: &Path,
    boot_secret: &Secret,
    proxy: &Proxy,
    root: &Path,
    log: std::fs::File,
) -> anyhow::Result<tokio::process::Command> {
    // The agent is this binary's `agent`.
    let exe = std::env::current_exe().context("cannot find this executable")?;
    let mut runner = tokio::process::Command::new(runner_bin);
    runner
        .arg("run")
        .env_clear()
        .envs(
            env.iter()
                .filter(|(k, _)| !k.to_string_lossy().starts_with("HOSTED_BOOT_AGENT")),
        )
        .env("ORIZU_BOOT_SECRET", boot_secret.expose())
        .env("ORIZU_API_BASE_URL", proxy.url(proxy::API_PREFIX))
        .env("ORIZU_AGENT_TOKEN_URL", proxy.url(proxy::AGENT_TOKEN_PATH))
        .env("ORIZU_BOOT_STATUS_URL", proxy.url(proxy::BOOT_STATUS_PATH))
        .env("HOSTED_BOOT_AGENT", "command")
        .env(
            "HOSTED_BOOT_AGENT_COMMAND",
            format!("{} agent", crate::text::shell_word(&exe.to_string_lossy())),
        )
        .env("HOSTED_BOOT_ROOT", root)
        .env("HOSTED_BOOT_LOG_FORMAT", "text")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true);
    Ok(runner)
}
/// The graceful stop of 4.4 (between turns: nothing posted): SIGTERM, then
/// its exit within 40 s, else SIGKILL and `None`.
async fn stop_runner(child: &mut tokio::process::Child) -> Option<std::process::ExitStatus> {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok())
        && let Some(pid) = rustix::process::Pid::from_raw(pid)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    match tokio::time::timeout(Duration::from_secs(40), child.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            let _ = child.kill().await;
            None
        }
    }
}

/// The checks of one conformance run, from what the proxy recorded and how
/// the runner ended: each route's answers, then what the run must have
/// shown, in the order of the contract's sections.
pub fn judge(
    record: &Record,
    milestone: Option<Milestone>,
    exit: Option<i32>,
    stopped_by_us: bool,
    session_files_left: bool,
) -> Vec<Check> {
    let runner: Vec<&Exchange> = record
        .exchanges
        .iter()
        .filter(|e| !e.by_conformance)
        .collect();
    let mut out = route_checks(record);
    out.push(redirect_check(record));
    out.push(turn_started_check(&runner, milestone));
    out.extend(event_checks(&runner, record));
    out.push(push_check(&runner));
    out.push(seal_check(&runner));
    out.push(stop_check(&runner, exit, stopped_by_us, session_files_left));
    out
}

fn answered_2xx(e: &Exchange) -> bool {
    e.status.is_some_and(|s| (200..300).contains(&s))
}

/// A boot status post of `status`.
fn posts_status(e: &Exchange, status: &str) -> bool {
    e.route == Route::BootStatus && e.request.get("status").and_then(Value::as_str) == Some(status)
}

/// Two checks per route of the table: every call answered 2xx, and the
/// answers match the document.
fn route_checks(record: &Record) -> Vec<Check> {
    let mut out = Vec::new();
    for spec in TABLE {
        let mine: Vec<&Exchange> = record
            .exchanges
            .iter()
            .filter(|e| e.route == spec.route)
            .collect();
        let label = format!("{} {}", spec.method.as_str(), spec.name);
        // The agent state (2.7) is an optional extension: checked when the
        // session offers it; the save only when the runner sent one (the
        // conformance agent keeps no state of a CLI).
        let optional = matches!(spec.route, Route::AgentStateLoad | Route::AgentStateSave);
        if optional && mine.is_empty() {
            let why = if record.agent_state_offered {
                "the conformance agent keeps no CLI state to save"
            } else {
                "the session does not offer it (no session.agentState)"
            };
            out.push(check(
                format!("{label}: optional, not called ({why})"),
                spec.section,
                Ok(()),
            ));
            continue;
        }
        let status = if mine.is_empty() {
            Err("at least one call, got none (the boot stopped before it)".to_string())
        } else {
            match mine.iter().find(|e| !answered_2xx(e)) {
                None => Ok(()),
                Some(e) => Err(match (e.status, &e.transport_error) {
                    (Some(s), _) => format!("2xx, got {s}"),
                    (None, Some(t)) => format!("2xx, got {t}"),
                    (None, None) => "2xx, got no HTTP answer".to_string(),
                }),
            }
        };
        out.push(check(format!("{label}: answers 2xx"), spec.section, status));
        let shape = if mine.is_empty() {
            Err("an answer to check, got none".to_string())
        } else {
            match mine.iter().find_map(|e| e.mismatch.as_ref()) {
                None if mine.iter().any(|e| answered_2xx(e)) => Ok(()),
                None => Err("a 2xx answer to check, got none".to_string()),
                Some(m) => Err(m.clone()),
            }
        };
        out.push(check(
            format!("{label}: answers match docs/openapi.yaml"),
            spec.section,
            shape,
        ));
    }
    out
}

/// No answer was a redirect (the runner never follows one).
fn redirect_check(record: &Record) -> Check {
    let redirect = record
        .exchanges
        .iter()
        .find(|e| e.status.is_some_and(|s| (300..400).contains(&s)));
    check(
        "no redirects",
        "2",
        match redirect {
            None => Ok(()),
            Some(e) => Err(format!(
                "no 3xx (the runner never follows one), got {} on {}{}",
                e.status.unwrap_or(0),
                e.route.name(),
                if e.location { " with a Location" } else { "" }
            )),
        },
    )
}

/// The session had a run for the runner to take, and it took it.
fn turn_started_check(runner: &[&Exchange], milestone: Option<Milestone>) -> Check {
    check(
        "a run to take: the runner starts a turn",
        "2.4",
        if runner.iter().any(|e| posts_status(e, "turn_started")) {
            Ok(())
        } else if milestone == Some(Milestone::Ready) {
            Err(
                "a pending or running run, got none (the runner posted ready): queue a turn first"
                    .into(),
            )
        } else {
            Err("turn_started posted, got none".into())
        },
    )
}

/// Section 2.6's events: a large and a small batch accepted through their
/// last seq, a resend ignored, the cursor, `acceptedThrough` monotonic.
fn event_checks(runner: &[&Exchange], record: &Record) -> Vec<Check> {
    let batches: Vec<(usize, bool)> = runner
        .iter()
        .filter(|e| e.route == Route::Events)
        .map(|e| {
            let events = e.request.get("events").and_then(Value::as_array);
            let n = events.map_or(0, Vec::len);
            let last = events
                .and_then(|v| v.last())
                .and_then(|v| v.get("seq"))
                .and_then(Value::as_u64);
            let accepted = e.answer.get("acceptedThrough").and_then(Value::as_u64);
            (n, answered_2xx(e) && last.is_some() && accepted >= last)
        })
        .collect();
    let sizes = |pred: &dyn Fn(usize) -> bool| -> Result<(), String> {
        if batches.iter().any(|(n, ok)| pred(*n) && *ok) {
            Ok(())
        } else if batches.iter().any(|(n, _)| pred(*n)) {
            Err("such a batch accepted through its last seq, got an answer short of it".into())
        } else {
            let seen: Vec<String> = batches.iter().map(|(n, _)| n.to_string()).collect();
            Err(format!(
                "such a batch sent, got batches of [{}]",
                seen.join(", ")
            ))
        }
    };
    vec![
        check(
            format!("events: a large batch (>= {LARGE_BATCH}) accepted"),
            "2.6",
            sizes(&|n| n >= LARGE_BATCH),
        ),
        check(
            format!("events: a small batch (<= {SMALL_BATCH}) accepted"),
            "2.6",
            sizes(&|n| (1..=SMALL_BATCH).contains(&n)),
        ),
        check(
            "events: a resend at or below the cursor is ignored",
            "2.6",
            record
                .resend
                .clone()
                .unwrap_or_else(|| Err("an accepted batch to resend, got none".into())),
        ),
        check(
            "events: the cursor is the last acceptedThrough",
            "2.6",
            record
                .cursor
                .clone()
                .unwrap_or_else(|| Err("a cursor read after an accepted batch, got none".into())),
        ),
        check(
            "events: acceptedThrough never goes backwards",
            "2.6",
            match &record.backwards {
                None => Ok(()),
                Some(b) => Err(b.clone()),
            },
        ),
    ]
}

/// The credential helper got a write repo token, the agent's push went
/// through, and the seal says so.
fn push_check(runner: &[&Exchange]) -> Check {
    let write_token = runner.iter().any(|e| {
        e.route == Route::RepoToken
            && e.request.get("access").and_then(Value::as_str) == Some("write")
            && answered_2xx(e)
    });
    let pushed = runner
        .iter()
        .any(|e| e.route == Route::Events && e.request.to_string().contains(PUSH_MARKER));
    let result_pushed = last_finish(runner)
        .and_then(|f| f.request.pointer("/result/pushed"))
        .and_then(Value::as_bool)
        == Some(true);
    check(
        "credential helper: a write repo token, the agent's push of the session branch",
        "2.5",
        match (write_token, pushed, result_pushed) {
            (true, true, true) => Ok(()),
            (false, _, _) => Err("a write repo token minted (2xx), got none".into()),
            (true, false, _) => {
                Err("the agent's git push to succeed, got a failure (see the runner's log)".into())
            }
            (true, true, false) => Err("finish.result.pushed true, got otherwise".into()),
        },
    )
}

fn last_finish<'a>(runner: &[&'a Exchange]) -> Option<&'a Exchange> {
    runner
        .iter()
        .rev()
        .find(|e| e.route == Route::Finish)
        .copied()
}

/// The run was sealed `succeeded` and `turn_completed` acknowledged.
fn seal_check(runner: &[&Exchange]) -> Check {
    let turn_completed = runner
        .iter()
        .any(|e| posts_status(e, "turn_completed") && answered_2xx(e));
    check(
        "seal: finish succeeded accepted, turn_completed acknowledged",
        "2.6",
        match last_finish(runner) {
            None => Err("a finish, got none".into()),
            Some(f) if !answered_2xx(f) => Err(format!(
                "finish answered 2xx, got {}",
                f.status
                    .map_or("no HTTP answer".to_string(), |s| s.to_string())
            )),
            Some(f) if f.request.get("status").and_then(Value::as_str) != Some("succeeded") => {
                Err(format!(
                    "finish with status succeeded, got {}",
                    f.request
                        .get("status")
                        .and_then(Value::as_str)
                        .unwrap_or("none")
                ))
            }
            Some(_) if !turn_completed => Err("turn_completed acknowledged, got none".into()),
            Some(_) => Ok(()),
        },
    )
}

/// Stopped between turns by SIGTERM, the runner exits 143, removes the
/// session files and posts nothing (4.4).
fn stop_check(
    runner: &[&Exchange],
    exit: Option<i32>,
    stopped_by_us: bool,
    session_files_left: bool,
) -> Check {
    let posted_after = runner.iter().any(|e| {
        e.route == Route::BootStatus
            && matches!(
                e.request.get("status").and_then(Value::as_str),
                Some("complete" | "failed" | "turn_failed")
            )
    });
    check(
        "graceful stop: exit 143, session files removed, nothing posted",
        "4.4",
        match (stopped_by_us, exit) {
            (false, code) => Err(format!(
                "the runner to wait for a turn, got its exit {}",
                code.map_or("unknown".to_string(), |c| c.to_string())
            )),
            (true, Some(143)) if !session_files_left && !posted_after => Ok(()),
            (true, Some(143)) if session_files_left => {
                Err("the session directory removed, got it left".into())
            }
            (true, Some(143)) => Err("nothing posted, got complete, failed or turn_failed".into()),
            (true, code) => Err(format!(
                "exit 143 after SIGTERM, got {}",
                code.map_or("none".to_string(), |c| c.to_string())
            )),
        },
    )
}

/// The table: check, PASS or FAIL, section, and for a failure what was
/// expected and what came.
pub fn table(checks: &[Check]) -> String {
    let width = checks
        .iter()
        .map(|c| c.name.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!(
        "{:<width$}  {:<6}  {:<7}  expected, got\n",
        "check", "result", "section"
    );
    for c in checks {
        let (result, detail) = match &c.outcome {
            Ok(()) => ("PASS", String::new()),
            Err(why) => ("FAIL", format!("expected {why}")),
        };
        out.push_str(&format!(
            "{:<width$}  {result:<6}  {:<7}  {detail}\n",
            c.name, c.section
        ));
    }
    out
}

/// The built-in agent of `conformance` (`hosted-boot-conformance agent`, run
/// by the runner as the `command` agent): a large burst of events, a commit
/// pushed to the session branch through the credential helper, then one
/// line (a small batch). Exit 0 only when the push succeeded.
pub fn agent_main() -> i32 {
    let mut prompt = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut prompt);
    let mut burst = String::new();
    for i in 1..=LARGE_BURST {
        burst.push_str(&json!({"type": "conformance.burst", "n": i}).to_string());
        burst.push('\n');
    }
    {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(burst.as_bytes());
        let _ = out.flush();
    }
    let text = format!(
        "# Conformance\n\nWritten by `hosted-boot-conformance` (one turn of {} bytes of prompt).\n",
        prompt.len()
    );
    if let Err(e) = std::fs::write("CONFORMANCE.md", text) {
        eprintln!("conformance agent: cannot write CONFORMANCE.md: {e}");
        return 1;
    }
    for args in [
        vec!["add", "CONFORMANCE.md"],
        vec!["commit", "-q", "-m", "hosted-boot-conformance: one turn"],
        vec!["push", "-q", "origin", "HEAD"],
    ] {
        match std::process::Command::new("git").args(&args).status() {
            Ok(s) if s.success() => {}
            other => {
                eprintln!("conformance agent: git {} failed: {other:?}", args[0]);
                return 1;
            }
        }
    }
    // Once the burst is accepted whole, so that this line goes in a batch
    // of its own.
    if let Some(path) = std::env::var_os(BURST_ACCEPTED_VAR) {
        let deadline = std::time::Instant::now() + BURST_WAIT;
        while !Path::new(&path).exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    println!(
        "{}",
        json!({"type": "conformance.push", "text": PUSH_MARKER})
    );
    0
}
