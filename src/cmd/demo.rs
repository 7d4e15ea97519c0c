//! The built-in demo agent (`hosted-boot demo-agent`, `--agent demo`): the
//! agent of the demo scenario (`hosted-boot-coordinator demo`, which the reference
//! coordinator's crate holds), usable to try a sandbox without a CLI.

use std::io::{Read, Write};
use std::process::Command as StdCommand;
use std::time::Duration;

use serde_json::json;

/// Marker in a prompt that makes the demo agent work until interrupted (the
/// demo scenario's third turn asks for it: `hosted_boot_coordinator::demo`).
const SLOW_MARKER: &str = "full test suite";

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
