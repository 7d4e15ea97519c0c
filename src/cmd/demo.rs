//! `hosted-boot demo`: the main job on an embedded default. It starts the
//! reference coordinator in process on an ephemeral loopback port with a
//! sample repository, runs the real boot (this binary, `run`) against it
//! with the built-in demo agent through three turns (the initial task
//! commits and pushes a file through the credential helper, a follow-up
//! turn leaves a file uncommitted, a third turn is interrupted mid-work),
//! ends the session, and prints a readable timeline with the runner's
//! harvest of each turn (PROTOCOL.md 4.5). No network beyond loopback.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command as StdCommand, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::json;

use crate::cli::DemoArgs;
use crate::coordinator::{Coordinator, CoordinatorOptions, RecordedRequest, Route, Snapshot};

/// The demo shrinks the contract's polls (5 s) so that it runs in seconds.
const DEMO_TIME_SCALE: &str = "0.2";
/// A connector the demo agent prints, to show redaction.
const DEMO_CONNECTOR: (&str, &str) = ("DEMO_API_KEY", "demo-key-7f3a9c1e5b");
/// Marker in a prompt that makes the demo agent work until interrupted.
const SLOW_MARKER: &str = "full test suite";
/// Bound on each step of the scenario.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the demo; returns the exit code (0 when every step went as the
/// contract says).
pub async fn run(args: DemoArgs) -> i32 {
    match scenario(&args).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("hosted-boot demo failed: {e:#}");
            1
        }
    }
}

async fn scenario(args: &DemoArgs) -> anyhow::Result<()> {
    // The coordinator's git and the runner start in the working directory.
    crate::boot::config::working_dir()?;
    let workdir = tempfile::Builder::new()
        .prefix("hosted-boot-demo-")
        .tempdir()?;
    let root = args
        .root
        .clone()
        .unwrap_or_else(|| workdir.path().join("sandbox"));
    std::fs::create_dir_all(&root)?;
    let coordinator = Coordinator::start(CoordinatorOptions {
        workdir: Some(workdir.path().join("coordinator")),
        task: "Add a CONTRIBUTING.md that says how to run the project.".into(),
        connectors: vec![(DEMO_CONNECTOR.0.into(), DEMO_CONNECTOR.1.into())],
        ..CoordinatorOptions::default()
    })
    .await
    .context("cannot start the reference coordinator")?;
    let exe = std::env::current_exe().context("cannot find this executable")?;
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
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true);
    let mut child = runner.spawn().context("cannot start the runner")?;

    let outcome = drive(&coordinator).await;
    let status = match tokio::time::timeout(STEP_TIMEOUT, child.wait()).await {
        Ok(s) => s?,
        Err(_) => {
            let _ = child.kill().await;
            bail!("the runner did not exit after the session ended");
        }
    };
    let snapshot = coordinator.snapshot();
    print_timeline(&coordinator, &snapshot);
    println!();
    println!("runner exited with {status}");
    let leaked = coordinator
        .issued_secrets()
        .into_iter()
        .chain([DEMO_CONNECTOR.1.to_string()])
        .any(|s| {
            serde_json::to_string(&snapshot.runs)
                .unwrap_or_default()
                .contains(&s)
        });
    println!(
        "secrets in the events the coordinator received: {}",
        if leaked { "FOUND (bug)" } else { "none" }
    );
    coordinator.shutdown().await;
    if args.keep {
        let kept = workdir.keep();
        println!("kept {}", kept.display());
    }
    outcome?;
    if !status.success() || leaked {
        bail!("the runner did not end the session cleanly");
    }
    Ok(())
}

async fn drive(c: &Coordinator) -> anyhow::Result<()> {
    let sealed =
        |id: &'static str| move |s: &Snapshot| s.run(id).is_some_and(|r| r.finish.is_some());
    c.wait_for(STEP_TIMEOUT, sealed("run-1"))
        .await
        .context("turn 1 was not sealed")?;
    let second = c.queue_turn("Summarise the repository in NOTES.md.", None);
    c.wait_for(STEP_TIMEOUT, |s| {
        s.run(&second).is_some_and(|r| r.finish.is_some())
    })
    .await
    .context("turn 2 was not sealed")?;
    let third = c.queue_turn(&format!("Run the {SLOW_MARKER} and report."), None);
    c.wait_for(STEP_TIMEOUT, |s| {
        s.run(&third).is_some_and(|r| r.events.len() >= 3)
    })
    .await
    .context("turn 3 did not start")?;
    c.interrupt(Some(&third))
        .context("cannot interrupt turn 3")?;
    c.wait_for(STEP_TIMEOUT, |s| {
        s.run(&third).is_some_and(|r| r.finish.is_some())
    })
    .await
    .context("turn 3 was not sealed")?;
    c.end_session();
    c.wait_for(STEP_TIMEOUT, |s| s.status_names().contains(&"complete"))
        .await
        .context("the runner did not post complete")?;
    Ok(())
}

fn describe(r: &RecordedRequest) -> Option<String> {
    let body = &r.body;
    let run = |path: &str| path.split('/').nth(4).unwrap_or("?").to_string();
    match r.route {
        Route::BootStatus => {
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
        Route::RunStarted => Some(format!("run_started {}", run(&r.path))),
        Route::Finish => {
            let error = body["error"]["code"]
                .as_str()
                .map(|c| format!(" [{c}]"))
                .unwrap_or_default();
            Some(format!(
                "finish      {} {}{error}",
                run(&r.path),
                body["status"].as_str().unwrap_or("?")
            ))
        }
        Route::Git if r.method == "POST" && r.path.contains("git-receive-pack") => {
            Some("git push    received by the coordinator's repository".to_string())
        }
        Route::Git if r.method == "GET" && r.path.contains("service=git-upload-pack") => {
            Some("git fetch   through the credential helper".to_string())
        }
        Route::Dev if r.path.contains("/turns") => Some("user        queued a turn".to_string()),
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

fn print_timeline(c: &Coordinator, snapshot: &Snapshot) {
    println!("timeline (as the coordinator saw it)");
    let mut token_pulls = 0;
    for r in &snapshot.requests {
        if r.route == Route::AgentToken {
            token_pulls += 1;
        }
        if let Some(line) = harvest_line(r) {
            println!("  {:>7.2}s  {line}", r.at_ms as f64 / 1000.0);
        }
        if let Some(line) = describe(r) {
            println!("  {:>7.2}s  {line}", r.at_ms as f64 / 1000.0);
        }
    }
    println!("  ({token_pulls} agent-token pulls in all, runner and credential helper)");
    println!();
    println!("turns");
    for run in &snapshot.runs {
        let types: Vec<&str> = run.events.iter().map(|e| e.kind.as_str()).collect();
        let error = run
            .finish
            .as_ref()
            .and_then(|f| f.error.as_ref())
            .map(|e| format!(" [{}]", e.code.as_str()))
            .unwrap_or_default();
        println!(
            "  {}  {:<11} {} events ({}){error}",
            run.id,
            run.status,
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

/// The built-in demo agent (`hosted-boot demo-agent`): reads the prompt on
/// stdin and emits NDJSON events. A prompt that mentions the full test suite
/// makes it start a report and work until it is interrupted (the runner's
/// harvest saves the report as work in progress); a prompt about
/// CONTRIBUTING.md makes it write the file, commit it and push the session
/// branch through the credential helper; any other prompt makes it write
/// NOTES.md and leave it uncommitted (the harvest commits and pushes it).
pub fn agent_main() -> i32 {
    let mut prompt = String::new();
    let _ = std::io::stdin().read_to_string(&mut prompt);
    let emit = |v: serde_json::Value| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{v}");
        let _ = out.flush();
    };
    let first_line = prompt.lines().next().unwrap_or("").to_string();
    emit(
        json!({"type": "message", "role": "assistant", "text": format!("Working on: {first_line}")}),
    );
    let bearer = std::env::var_os("ORIZU_TOKEN_FILE")
        .and_then(|p| std::fs::read_to_string(p).ok())
        .is_some_and(|t| !t.trim().is_empty());
    emit(
        json!({"type": "message", "role": "assistant", "text": format!("bearer file readable: {bearer}")}),
    );
    let key = std::env::var("DEMO_API_KEY").unwrap_or_default();
    println!("using DEMO_API_KEY={key} to call the model (the runner redacts it)");
    eprintln!("demo agent: prompt of {} bytes", prompt.len());

    if prompt.contains(SLOW_MARKER) {
        if let Err(e) = std::fs::write("TEST_REPORT.md", "# Test report\n\nIn progress.\n") {
            emit(json!({"type": "error", "text": format!("cannot write TEST_REPORT.md: {e}")}));
        }
        for i in 1..=3000 {
            emit(json!({"type": "progress", "text": format!("running test {i}")}));
            std::thread::sleep(Duration::from_millis(200));
        }
        return 0;
    }
    let file = if prompt.contains("CONTRIBUTING") {
        "CONTRIBUTING.md"
    } else {
        "NOTES.md"
    };
    let text =
        format!("# {file}\n\nWritten by the hosted-boot demo agent for:\n\n> {first_line}\n");
    if let Err(e) = std::fs::write(file, text) {
        emit(json!({"type": "error", "text": format!("cannot write {file}: {e}")}));
        return 1;
    }
    if file == "NOTES.md" {
        emit(
            json!({"type": "message", "role": "assistant", "text": "Wrote NOTES.md; leaving it for the runner to commit and push."}),
        );
        return 0;
    }
    for args in [
        vec!["add", file],
        vec!["commit", "-q", "-m", &format!("demo agent: {first_line}")],
        vec!["push", "-q", "origin", "HEAD"],
    ] {
        let out = StdCommand::new("git").args(&args).output();
        let (code, stderr) = match out {
            Ok(o) => (
                o.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            ),
            Err(e) => (-1, e.to_string()),
        };
        emit(json!({"type": "tool_result", "tool": format!("git {}", args[0]), "exitCode": code}));
        if code != 0 {
            eprintln!("git {} failed: {}", args[0], stderr.trim());
            return 1;
        }
    }
    emit(
        json!({"type": "message", "role": "assistant", "text": format!("Committed and pushed {file}.")}),
    );
    0
}
