//! The status file (PROTOCOL.md section 3) and `hosted-boot status`.

use std::os::unix::fs::PermissionsExt;

use hosted_boot_coordinator::CoordinatorOptions;

use super::support::{Sandbox, WAIT, assert_no_secret, finish};

fn status(sb: &Sandbox, check: bool) -> (i32, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_hosted-boot"));
    cmd.arg("status").arg("--root").arg(sb.root());
    if check {
        cmd.arg("--check");
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
async fn status_follows_the_runner_and_check_reports_its_health() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let (code, out) = status(&sb, true);
    assert_eq!(code, 1, "no runner yet: {out}");

    let script = sb.script(
        r#"echo '{"type":"message","text":"working"}'; while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.05; done"#,
    );
    let child = sb.spawn(&script);
    sb.coordinator
        .wait_for(WAIT, |s| {
            s.run("run-1")
                .is_some_and(|r| r.events.iter().any(|e| e.kind == "message"))
        })
        .await
        .unwrap();
    // Events are written at most once a second: the heartbeat's tick
    // writes the last one.
    let deadline = std::time::Instant::now() + WAIT;
    let (code, out) = loop {
        let (code, out) = status(&sb, true);
        if out.contains("\nlast event   message, ") || std::time::Instant::now() > deadline {
            break (code, out);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("phase        turn run-1 (turn 1), step agent, for "),
        "{out}"
    );
    assert!(out.contains("\nagent        pid "), "{out}");
    assert!(out.contains("\nlast event   message, "), "{out}");
    assert!(out.contains(" ago ("), "ages beside timestamps: {out}");
    assert!(out.contains("healthy"), "{out}");

    std::fs::write(sb.out().join("go"), "").unwrap();
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (exit, output) = finish(child).await;
    assert_eq!(exit.code(), Some(0), "{output}");

    let file = sb.root().join(".hosted-boot/status.json");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
    let text = std::fs::read_to_string(&file).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    // The final phase, written on the way out (the issue: it said
    // `stopping` for ever).
    assert_eq!(json["phase"], "exited", "{json}");
    assert_eq!(json["exitCode"], 0, "{json}");
    assert_eq!(
        json["reason"], "the session ended; complete was posted",
        "{json}"
    );
    assert!(json.get("agentPid").is_none(), "{json}");
    assert_eq!(json["sessionId"], "s1");
    assert!(json["lastCoordinatorSuccess"].is_string(), "{json}");
    assert_no_secret("status file", &text, &sb.secrets(&[]));
    let (code, out) = status(&sb, true);
    assert_eq!(code, 1, "the runner exited: {out}");
    assert!(
        out.contains(
            "unhealthy: the runner exited with code 0: the session ended; complete was posted"
        ),
        "{out}"
    );
    let (code, out) = status(&sb, false);
    assert_eq!(code, 0);
    assert!(
        out.starts_with("phase        exited with code 0: "),
        "{out}"
    );
}

#[tokio::test]
async fn a_failed_boot_leaves_its_exit_and_reason_in_the_status_file() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script("exit 3");
    let (exit, output) = finish(sb.spawn(&script)).await;
    assert_eq!(exit.code(), Some(1), "{output}");
    let (code, out) = status(&sb, true);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("unhealthy: the runner exited with code 1: turn run-1 failed (reported): "),
        "{out}"
    );
}

/// The image's health check runs `status --check` in the container's
/// environment, which holds `run`'s variables: a bad one made it exit 2
/// (clap's parse error, a code Docker reserves) instead of reporting.
#[test]
fn a_bad_run_variable_does_not_break_the_health_check() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hosted-boot"))
        .args(["status", "--check", "--root"])
        .arg(dir.path())
        .env("HOSTED_BOOT_INTERRUPT_GRACE", "soon")
        .env("HOSTED_BOOT_TURN_CGROUP", "")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.starts_with("unhealthy: cannot read "), "{stdout}");
    // An empty HOSTED_BOOT_ROOT is unset (the working directory), not
    // clap's "a value is required" and exit 2.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hosted-boot"))
        .args(["status", "--check"])
        .current_dir(dir.path())
        .env("HOSTED_BOOT_ROOT", "")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.starts_with("unhealthy: cannot read "), "{stdout}");
}
