//! `hosted-boot-coordinator demo`: the main job on an embedded default. It starts the
//! reference coordinator in process on an ephemeral loopback port with a
//! sample repository, runs the real boot (the runner binary it is given,
//! `run`) against it
//! with the built-in demo agent through three turns (the initial task
//! commits and pushes a file through the credential helper, a follow-up
//! turn leaves a file uncommitted, a third turn is interrupted mid-work),
//! ends the session, and prints a readable timeline with the runner's
//! harvest of each turn (PROTOCOL.md 4.5), live, as the coordinator sees
//! each request: each turn's duration, the interrupt's latency, then a
//! summary counted from the coordinator's record. Colour on a terminal
//! (unless `NO_COLOR` is set), plain text otherwise. No network beyond
//! loopback.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::{Command as StdCommand, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};

use clap::Args;

use crate::{Coordinator, CoordinatorOptions, RecordedRequest, Route, Snapshot, Target};

/// The demo shrinks the contract's polls (5 s) so that it runs in seconds.
const DEMO_TIME_SCALE: &str = "0.2";
/// A connector the demo agent prints, to show redaction.
const DEMO_CONNECTOR: (&str, &str) = ("DEMO_API_KEY", "demo-key-7f3a9c1e5b");
/// Marker in a prompt that makes the demo agent work until interrupted (the
/// runner's `cmd::demo`, `hosted-boot demo-agent`).
const SLOW_MARKER: &str = "full test suite";
/// Bound on each step of the scenario.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the demo with the runner binary `runner` (its `run` and its
/// `demo-agent`); returns the exit code (0 when every step went as the
/// contract says).
pub async fn run(args: DemoArgs, runner: &Path) -> i32 {
    match scenario(&args, runner).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("hosted-boot-coordinator demo failed: {e:#}");
            1
        }
    }
}

// long: the demo in the order a person reads it (the coordinator, the
// header, the runner, the live timeline, the turns, the summary), over one
// coordinator, runner and timeline; its parts print, they compute little.
async fn scenario(args: &DemoArgs, runner: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    // Ctrl-C or SIGTERM from here on stops the runner as a sandbox's stop
    // does and removes the demo's directory (the default action would
    // leave the runner alone, its session files, and the directory).
    let stop = crate::cli::stop_signal()?;
    // The coordinator's git and the runner start in the working directory.
    crate::cli::readable_working_dir()?;
    let workdir = tempfile::Builder::new()
        .prefix("hosted-boot-demo-")
        .tempdir()?;
    let root = args
        .root
        .clone()
        .unwrap_or_else(|| workdir.path().join("sandbox"));
    std::fs::create_dir_all(&root)?;
    let sources = if args.complete_workspace {
        Some(
            crate::create_complete_sample_repos(&workdir.path().join("sources"))
                .context("cannot create the sample repositories")?,
        )
    } else {
        None
    };
    let coordinator = Coordinator::start(CoordinatorOptions {
        source_repo: sources.as_ref().map(|(app, _)| app.clone()),
        workdir: Some(workdir.path().join("coordinator")),
        task: "Add a CONTRIBUTING.md that says how to run the project.".into(),
        connectors: vec![(DEMO_CONNECTOR.0.into(), DEMO_CONNECTOR.1.into())],
        setup: args
            .setup_script
            .clone()
            .map(|script| crate::wire::SessionSetup {
                script: Some(script),
                inputs: None,
            }),
        egress_canary: args.egress_canary.clone(),
        instructions: args.instructions.clone(),
        ..CoordinatorOptions::default()
    })
    .await
    .context("cannot start the reference coordinator")?;
    if let Some((_, lib)) = &sources {
        coordinator
            .add_repository("acme/lib", lib)
            .context("cannot serve the sample submodule")?;
        coordinator.add_lfs_object(crate::SAMPLE_LFS_CONTENT);
    }
    let exe = runner.to_path_buf();
    let log_path = workdir.path().join("runner.log");

    println!("hosted-boot demo");
    println!("  coordinator  {}", coordinator.base_url());
    println!(
        "  repository   {} (branch {})",
        coordinator.clone_url(),
        coordinator.branch()
    );
    println!("  sandbox root {}", root.display());
    println!(
        "  runner log   {}{}",
        log_path.display(),
        if args.keep {
            ""
        } else {
            " (removed at exit; --keep keeps it)"
        }
    );
    println!(
        "  agent user   the runner's own (uid {}): the same-user mode, in which the runner stays non-dumpable (the image runs the agent as `agent` with HOSTED_BOOT_AGENT_USER)",
        rustix::process::geteuid().as_raw()
    );
    println!("  (contract durations scaled x{DEMO_TIME_SCALE} so the demo takes seconds)");
    println!();

    let log = std::fs::File::create(&log_path)?;
    let mut runner = tokio::process::Command::new(&exe);
    runner
        .arg("run")
        .envs(coordinator.sandbox_env())
        .env("HOSTED_BOOT_AGENT", "command")
        .env(
            "HOSTED_BOOT_AGENT_COMMAND",
            format!(
                "{} demo-agent",
                crate::text::shell_word(&exe.to_string_lossy())
            ),
        )
        .env("HOSTED_BOOT_ROOT", &root)
        .env("HOSTED_BOOT_TEST_TIME_SCALE", DEMO_TIME_SCALE)
        .env("HOSTED_BOOT_LOG_FORMAT", "text")
        .env_remove("HOSTED_BOOT_LOG")
        // The demo's sandbox is a temporary directory of the developer's:
        // the agent runs as the runner's user, even when that is root.
        .env_remove("HOSTED_BOOT_AGENT_USER")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true);
    let mut child = runner.spawn().context("cannot start the runner")?;

    let style = Style::detect();
    println!(
        "{}",
        style.bold("timeline (live, as the coordinator sees each request)")
    );
    let actions: Actions = Mutex::new(Vec::new());
    let mut timeline = Timeline::new(style, &log_path);
    let done = std::sync::atomic::AtomicBool::new(false);
    let run_and_wait = async {
        let outcome = drive(&coordinator, &actions).await;
        let status = tokio::time::timeout(STEP_TIMEOUT, child.wait()).await;
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        (outcome, status)
    };
    let stream = async {
        loop {
            let finished = done.load(std::sync::atomic::Ordering::SeqCst);
            timeline.print_new(&coordinator.requests(), &actions);
            if finished {
                break;
            }
            coordinator.changed(Duration::from_millis(250)).await;
        }
    };
    let joined = tokio::select! {
        both = async { tokio::join!(run_and_wait, stream) } => Some(both),
        () = stop => None,
    };
    let Some(((outcome, status), ())) = joined else {
        println!();
        println!("stopping: the runner gets SIGTERM, as a sandbox's stop (PROTOCOL.md 4.4)");
        let status = stop_runner(&mut child).await;
        coordinator.shutdown().await;
        bail!("stopped by a signal; the runner {status}, the demo's directory is removed");
    };
    let status = match status {
        Ok(s) => s?,
        Err(_) => {
            let _ = child.kill().await;
            bail!("the runner did not exit after the session ended");
        }
    };
    let snapshot = coordinator.snapshot();
    timeline.print_new(&snapshot.requests, &actions);
    let pulls = timeline.token_pulls;
    println!(
        "  ({pulls} agent-token {} in all: the runner's, the credential broker mints through it)",
        if pulls == 1 { "pull" } else { "pulls" }
    );
    println!();
    print_turns(&coordinator, &snapshot, &style);
    println!();
    println!("runner {}", exit_in_words(status, &root));
    let secrets: Vec<String> = coordinator
        .issued_secrets()
        .into_iter()
        .chain([DEMO_CONNECTOR.1.to_string()])
        .collect();
    let received = serde_json::to_string(&(&snapshot.runs, &snapshot.requests)).unwrap_or_default();
    let leaked = secrets
        .iter()
        .filter(|s| received.contains(s.as_str()))
        .count();
    println!(
        "secrets in what the coordinator received: {}",
        if leaked > 0 {
            style.red(&format!("{leaked} FOUND (bug)"))
        } else {
            style.green("none")
        }
    );
    println!("{}", summary(&snapshot, leaked, started.elapsed(), &style));
    coordinator.shutdown().await;
    if args.keep {
        let kept = workdir.keep();
        println!("kept {}", kept.display());
    }
    outcome?;
    if !status.success() || leaked > 0 {
        bail!("the runner did not end the session cleanly");
    }
    Ok(())
}

/// SIGTERM to the runner, then its exit (bounded by the contract's stop
/// budget and a margin; then SIGKILL), in words.
async fn stop_runner(child: &mut tokio::process::Child) -> String {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok())
        && let Some(pid) = rustix::process::Pid::from_raw(pid)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    let budget = crate::timings::Timings::default().stop_budget + Duration::from_secs(5);
    match tokio::time::timeout(budget, child.wait()).await {
        Ok(Ok(status)) => match status.code() {
            Some(code) => format!("exited {code}"),
            None => "was killed by a signal".to_string(),
        },
        _ => {
            let _ = child.kill().await;
            "did not stop within its stop budget and was killed".to_string()
        }
    }
}

/// The runner's exit in words: its code and the reason its status file
/// gives (PROTOCOL.md section 3), or the signal that killed it.
fn exit_in_words(status: std::process::ExitStatus, root: &Path) -> String {
    use std::os::unix::process::ExitStatusExt;
    // The status file of PROTOCOL.md section 3, read for its `reason`.
    let reason = std::fs::read(root.join(".hosted-boot").join("status.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|s| s.get("reason")?.as_str().map(str::to_string))
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}{reason}"),
        (None, Some(n)) => format!("was killed by {}", crate::text::signal_name(n)),
        _ => "ended in an unknown way".to_string(),
    }
}

/// The closing line, counted from the coordinator's record.
fn summary(snapshot: &Snapshot, leaked: usize, wall: Duration, style: &Style) -> String {
    let mut outcomes: Vec<(String, usize)> = Vec::new();
    for run in &snapshot.runs {
        match outcomes.iter_mut().find(|(s, _)| *s == run.status) {
            Some((_, n)) => *n += 1,
            None => outcomes.push((run.status.clone(), 1)),
        }
    }
    let outcomes: Vec<String> = outcomes.iter().map(|(s, n)| format!("{n} {s}")).collect();
    let pushed: u64 = snapshot
        .requests
        .iter()
        .filter(|r| r.route == Route::Finish && r.body["result"]["pushed"] == true)
        .map(|r| r.body["result"]["commits"].as_u64().unwrap_or(0))
        .sum();
    let events: usize = snapshot.runs.iter().map(|r| r.events.len()).sum();
    format!(
        "{} {} turns ({}), {pushed} commits pushed, {events} events, {leaked} secrets found in what the coordinator received, {:.1} s",
        style.bold("summary"),
        snapshot.runs.len(),
        outcomes.join(", "),
        wall.as_secs_f64()
    )
}

/// Colour on a terminal, unless `NO_COLOR` is set (no-color.org); plain
/// text otherwise.
#[derive(Clone, Copy)]
struct Style {
    color: bool,
}

impl Style {
    fn detect() -> Style {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Style {
            color: !no_color && std::io::stdout().is_terminal(),
        }
    }

    fn paint(&self, code: &str, text: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    fn bold(&self, t: &str) -> String {
        self.paint("1", t)
    }
    fn dim(&self, t: &str) -> String {
        self.paint("2", t)
    }
    fn green(&self, t: &str) -> String {
        self.paint("32", t)
    }
    fn yellow(&self, t: &str) -> String {
        self.paint("33", t)
    }
    fn red(&self, t: &str) -> String {
        self.paint("31", t)
    }
    fn cyan(&self, t: &str) -> String {
        self.paint("36", t)
    }

    fn outcome(&self, status: &str) -> String {
        match status {
            "succeeded" => self.green(status),
            "interrupted" => self.yellow(status),
            "failed" => self.red(status),
            other => other.to_string(),
        }
    }
}

/// What the demo did as the user (queued a turn, set the interrupt flag),
/// at the coordinator's clock.
struct Action {
    at_ms: u64,
    text: String,
    /// For an interrupt: the run and the wall-clock time of the flag.
    interrupt: Option<(String, SystemTime)>,
}

type Actions = Mutex<Vec<Action>>;

fn act(actions: &Actions, c: &Coordinator, text: String, interrupt: Option<String>) {
    crate::lock(actions).push(Action {
        at_ms: c.elapsed_ms(),
        text,
        interrupt: interrupt.map(|r| (r, SystemTime::now())),
    });
}

/// The live timeline: prints each request of the record once, in order.
struct Timeline<'a> {
    style: Style,
    log: &'a Path,
    printed: usize,
    actions_printed: usize,
    run_started: HashMap<String, u64>,
    token_pulls: usize,
}

impl<'a> Timeline<'a> {
    fn new(style: Style, log: &'a Path) -> Self {
        Timeline {
            style,
            log,
            printed: 0,
            actions_printed: 0,
            run_started: HashMap::new(),
            token_pulls: 0,
        }
    }

    fn line(&self, at_ms: u64, text: &str) {
        let at = self.style.dim(&format!("{:>7.2}s", at_ms as f64 / 1000.0));
        println!("  {at}  {text}");
        let _ = std::io::stdout().flush();
    }

    fn print_new(&mut self, requests: &[RecordedRequest], actions: &Actions) {
        for r in requests.iter().skip(self.printed) {
            self.print_actions(actions, Some(r.at_ms));
            self.print_one(r, actions);
        }
        self.printed = self.printed.max(requests.len());
        self.print_actions(actions, None);
    }

    /// The user's actions not yet printed, up to `until` (all: `None`).
    fn print_actions(&mut self, actions: &Actions, until: Option<u64>) {
        let lines: Vec<(u64, String)> = crate::lock(actions)
            .iter()
            .skip(self.actions_printed)
            .take_while(|a| until.is_none_or(|u| a.at_ms <= u))
            .map(|a| (a.at_ms, a.text.clone()))
            .collect();
        self.actions_printed += lines.len();
        for (at, text) in lines {
            self.line(at, &self.style.cyan(&format!("user        {text}")));
        }
    }

    fn print_one(&mut self, r: &RecordedRequest, actions: &Actions) {
        match r.route {
            Target::Route(Route::AgentToken) => self.token_pulls += 1,
            Target::Route(Route::RunStarted) => {
                self.run_started.insert(run_of(&r.path), r.at_ms);
            }
            _ => {}
        }
        if let Some(line) = harvest_line(r) {
            self.line(r.at_ms, &line);
        }
        let Some(mut line) = describe(r, &self.style) else {
            return;
        };
        if r.route == Route::Finish {
            let run = run_of(&r.path);
            if let Some(start) = self.run_started.get(&run) {
                let took = r.at_ms.saturating_sub(*start) as f64 / 1000.0;
                line.push_str(&self.style.dim(&format!("  (turn took {took:.2}s")));
                let flag = crate::lock(actions)
                    .iter()
                    .find_map(|a| a.interrupt.clone().filter(|(r, _)| *r == run));
                if let Some((_, wall)) = flag {
                    line.push_str(&self.style.dim(&format!("; {}", self.latency(wall))));
                }
                line.push_str(&self.style.dim(")"));
            }
        }
        self.line(r.at_ms, &line);
    }

    /// From the interrupt flag to the agent's stop, as the runner's log
    /// says it stopped (the interrupt line of `agent::drive`).
    fn latency(&self, flag: SystemTime) -> String {
        const MARK: &str = "the agent stopped after the interrupt: ";
        let text = std::fs::read_to_string(self.log).unwrap_or_default();
        let Some(line) = text.lines().rev().find(|l| l.contains(MARK)) else {
            return "the runner's log does not say when the agent stopped".to_string();
        };
        let how = line
            .split_once(MARK)
            .map(|(_, rest)| rest.split(" stopped_by=").next().unwrap_or(rest))
            .unwrap_or("");
        let stamp = line.split_whitespace().next().unwrap_or("");
        match stopped_after(stamp, flag) {
            Some(d) => format!(
                "interrupt flag to agent stopped: {} ms, by {how}",
                d.as_millis()
            ),
            None => format!("agent stopped by {how}"),
        }
    }
}

/// From `flag` to the runner's log line stamped `HH:MM:SS.mmm` (its time
/// of day, UTC), within the day after the flag.
fn stopped_after(stamp: &str, flag: SystemTime) -> Option<Duration> {
    let (hms, ms) = stamp.split_once('.')?;
    let mut parts = hms.split(':').map(str::parse::<u64>);
    let (h, m, s) = (
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    );
    let line_ms = ((h * 60 + m) * 60 + s) * 1000 + ms.parse::<u64>().ok()?;
    let flag_ms =
        u64::try_from(flag.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() % 86_400_000)
            .ok()?;
    let day = 86_400_000;
    Some(Duration::from_millis((line_ms + day - flag_ms) % day))
}

fn run_of(path: &str) -> String {
    path.split('/').nth(4).unwrap_or("?").to_string()
}

async fn drive(c: &Coordinator, actions: &Actions) -> anyhow::Result<()> {
    let sealed =
        |id: &'static str| move |s: &Snapshot| s.run(id).is_some_and(|r| r.finish.is_some());
    c.wait_for(STEP_TIMEOUT, sealed("run-1"))
        .await
        .context("turn 1 was not sealed")?;
    let second = c.queue_turn("Summarise the repository in NOTES.md.", None);
    act(actions, c, format!("queued a turn ({second})"), None);
    c.wait_for(STEP_TIMEOUT, |s| {
        s.run(&second).is_some_and(|r| r.finish.is_some())
    })
    .await
    .context("turn 2 was not sealed")?;
    let third = c.queue_turn(&format!("Run the {SLOW_MARKER} and report."), None);
    act(actions, c, format!("queued a turn ({third})"), None);
    c.wait_for(STEP_TIMEOUT, |s| {
        s.run(&third).is_some_and(|r| r.events.len() >= 3)
    })
    .await
    .context("turn 3 did not start")?;
    act(
        actions,
        c,
        format!("interrupted {third}"),
        Some(third.clone()),
    );
    c.interrupt(Some(&third))
        .context("cannot interrupt turn 3")?;
    c.wait_for(STEP_TIMEOUT, |s| {
        s.run(&third).is_some_and(|r| r.finish.is_some())
    })
    .await
    .context("turn 3 was not sealed")?;
    c.end_session();
    act(actions, c, "ended the session".to_string(), None);
    c.wait_for(STEP_TIMEOUT, |s| s.status_names().contains(&"complete"))
        .await
        .context("the runner did not post complete")?;
    Ok(())
}

fn describe(r: &RecordedRequest, style: &Style) -> Option<String> {
    let body = &r.body;
    let run = |path: &str| path.split('/').nth(4).unwrap_or("?").to_string();
    match r.route {
        Target::Route(Route::BootStatus) => {
            let status = body["status"].as_str().unwrap_or("?");
            let run_id = body["runId"]
                .as_str()
                .map(|id| format!(" {id}"))
                .unwrap_or_default();
            let reason = body["reason"]
                .as_str()
                .map(|s| format!(" ({s})"))
                .unwrap_or_default();
            Some(format!("status      {status}{run_id}{reason}"))
        }
        Target::Route(Route::RunStarted) => Some(format!("run_started {}", run(&r.path))),
        Target::Route(Route::Finish) => {
            let error = body["error"]["code"]
                .as_str()
                .map(|c| format!(" [{c}]"))
                .unwrap_or_default();
            Some(format!(
                "finish      {} {}{error}",
                run(&r.path),
                style.outcome(body["status"].as_str().unwrap_or("?"))
            ))
        }
        Target::Git if r.method == "POST" && r.path.contains("git-receive-pack") => {
            Some("git push    received by the coordinator's repository".to_string())
        }
        Target::Git if r.method == "GET" && r.path.contains("service=git-upload-pack") => {
            Some("git fetch   through the credential helper".to_string())
        }
        Target::Dev if r.path.contains("/turns") => Some(style.cyan("user        queued a turn")),
        _ => None,
    }
}

/// The harvest a `finish` request reports (PROTOCOL.md 4.5), as one line.
fn harvest_line(r: &RecordedRequest) -> Option<String> {
    if r.route != Route::Finish {
        return None;
    }
    let run_id = r.path.split('/').nth(4).unwrap_or("?");
    let result = &r.body["result"];
    if result.is_null() {
        return Some(format!("harvest     {run_id} none"));
    }
    let short = |key: &str| {
        result[key]
            .as_str()
            .unwrap_or("?")
            .chars()
            .take(7)
            .collect::<String>()
    };
    let count = |key: &str, one: &str| {
        let n = result[key].as_u64().unwrap_or(0);
        format!("{n} {one}{}", if n == 1 { "" } else { "s" })
    };
    let stats = format!(
        "{}, {}, +{} -{}",
        count("commits", "commit"),
        count("filesChanged", "file"),
        result["insertions"].as_u64().unwrap_or(0),
        result["deletions"].as_u64().unwrap_or(0)
    );
    let head = if result["harvestCommit"].is_string() {
        format!(
            "committed what the agent left as {}",
            short("harvestCommit")
        )
    } else {
        format!("head {}", short("headSha"))
    };
    let error = &result["pushError"];
    let line = if error.is_object() {
        format!(
            "harvest     {run_id} {head}, NOT pushed: {} ({})",
            error["code"].as_str().unwrap_or("?"),
            error["message"].as_str().unwrap_or("")
        )
    } else if let Some(recovery) = result["recoveryBranch"].as_str() {
        format!("harvest     {run_id} {head}, on recovery branch {recovery} ({stats})")
    } else {
        format!(
            "harvest     {run_id} {head}, on {} ({stats})",
            result["branch"].as_str().unwrap_or("?")
        )
    };
    Some(line)
}

fn print_turns(c: &Coordinator, snapshot: &Snapshot, style: &Style) {
    println!("{}", style.bold("turns"));
    for run in &snapshot.runs {
        let types: Vec<&str> = run.events.iter().map(|e| e.kind.as_str()).collect();
        let error = run
            .finish
            .as_ref()
            .and_then(|f| f.error.as_ref())
            .map(|e| format!(" [{}]", e.code.as_str()))
            .unwrap_or_default();
        println!(
            "  {}  {} {} events ({}){error}",
            run.id,
            style.outcome(&format!("{:<11}", run.status)),
            run.events.len(),
            summarize_types(&types)
        );
        for e in &run.events {
            if let Some(text) = e.data["text"]
                .as_str()
                .filter(|t| t.contains("DEMO_API_KEY"))
            {
                println!("           agent printed: {text}");
            }
            if e.kind == "hosted_boot.workspace" {
                println!("           workspace: {}", e.data);
            }
        }
    }
    println!();
    match branch_log(&c.bare_repo(), &c.branch()) {
        Ok(log) => {
            println!("session branch {} on the coordinator:", c.branch());
            for line in log.lines() {
                println!("  {line}");
            }
        }
        Err(e) => println!("cannot read the session branch: {e:#}"),
    }
}

fn summarize_types(types: &[&str]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < types.len() {
        let mut n = 1;
        while i + n < types.len() && types[i + n] == types[i] {
            n += 1;
        }
        out.push(if n > 1 {
            format!("{} x{n}", types[i])
        } else {
            types[i].to_string()
        });
        i += n;
    }
    out.join(", ")
}

fn branch_log(bare: &Path, branch: &str) -> anyhow::Result<String> {
    let out = StdCommand::new("git")
        .arg("-C")
        .arg(bare)
        .args(["log", "--format=%h %an: %s", branch, "--"])
        .output()?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `hosted-boot-coordinator demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Keep the demo's working directory instead of removing it.
    #[arg(long)]
    pub keep: bool,
    /// The sandbox root the booted runner uses (an empty directory)
    /// [default: a directory inside the demo's temporary directory].
    #[arg(long, env = "HOSTED_BOOT_ROOT", hide_env_values = true)]
    pub root: Option<std::path::PathBuf>,
    /// A shell command served as the session's `setup.script`: the runner
    /// runs it in `repo/` before the first agent, its output among the first
    /// turn's events (PROTOCOL.md 4.1, "Setup").
    #[arg(long, value_name = "COMMAND")]
    pub setup_script: Option<String>,
    /// The session's `egressCanary` (`HOST:PORT` or `https://HOST`): a
    /// reachable one fails the first turn `egress_policy_missing`.
    #[arg(long)]
    pub egress_canary: Option<String>,
    /// The session's `instructions` for the agent.
    #[arg(long)]
    pub instructions: Option<String>,
    /// Serve the sample repository with a submodule (`vendor/lib`, served as
    /// `acme/lib`) and a Git LFS file (`assets/logo.bin`): the first turn's
    /// `hosted_boot.workspace` event says what the runner checked out
    /// (PROTOCOL.md 4.5, "A complete workspace").
    #[arg(long)]
    pub complete_workspace: bool,
    /// The runner binary the demo boots [default: `hosted-boot` beside this
    /// binary, else on PATH].
    #[arg(long, value_name = "PATH")]
    pub runner: Option<std::path::PathBuf>,
}
