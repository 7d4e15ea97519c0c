//! The status file (PROTOCOL.md section 3) and `hosted-boot status`.

use std::os::unix::fs::PermissionsExt;

use hosted_boot::coordinator::CoordinatorOptions;

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
    let (code, out) = status(&sb, true);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("Turn run-1 (turn 1)"), "{out}");
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
    assert_eq!(json["phase"], "stopping");
    assert_eq!(json["sessionId"], "s1");
    assert!(json["lastCoordinatorSuccess"].is_string(), "{json}");
    assert_no_secret("status file", &text, &sb.secrets(&[]));
    let (code, out) = status(&sb, true);
    assert_eq!(code, 1, "the runner is gone: {out}");
    assert!(out.contains("is gone"), "{out}");
    let (code, _) = status(&sb, false);
    assert_eq!(code, 0);
}
