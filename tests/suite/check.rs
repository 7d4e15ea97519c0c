//! `hosted-boot check` against the reference coordinator: a good
//! environment, and each kind of failure, each with a hint and no secret;
//! it reads only (no repo token, no status).

use hosted_boot::coordinator::{CoordinatorOptions, Fault, Route};

use super::support::{Sandbox, assert_no_secret, finish};

async fn check(sb: &Sandbox, edit: impl FnOnce(&mut tokio::process::Command)) -> (i32, String) {
    let mut cmd = sb.command("check", &sb.script("true"));
    edit(&mut cmd);
    let (status, output) = finish(cmd.spawn().unwrap()).await;
    assert_no_secret("check output", &output, &sb.secrets(&[]));
    (status.code().unwrap_or(-1), output)
}

#[tokio::test]
async fn a_good_environment_passes_and_only_reads() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let (code, out) = check(&sb, |_| {}).await;
    assert_eq!(code, 0, "{out}");
    for name in [
        "environment",
        "agent token",
        "session",
        "env bundle",
        "git",
        "agent program",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with("ok") && l.contains(name)),
            "{name}: {out}"
        );
    }
    assert!(out.contains("all 6 checks passed"), "{out}");
    let routes: Vec<Route> = sb.coordinator.requests().iter().map(|r| r.route).collect();
    let mut sorted = routes.clone();
    sorted.sort_by_key(|r| r.as_str());
    assert_eq!(
        sorted,
        vec![Route::AgentToken, Route::EnvBundle, Route::Session],
        "{routes:?}"
    );
}

#[tokio::test]
async fn each_kind_of_failure_is_named_with_a_hint() {
    let sb = Sandbox::start(CoordinatorOptions {
        connectors: vec![("LD_PRELOAD".into(), "/secret/evil.so".into())],
        ..CoordinatorOptions::default()
    })
    .await;
    // A reserved connector, an agent program that does not exist.
    let (code, out) = check(&sb, |c| {
        c.env("HOSTED_BOOT_AGENT_COMMAND", "/nonexistent/agent");
    })
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  env bundle") && out.contains("LD_PRELOAD"),
        "{out}"
    );
    assert!(!out.contains("/secret/evil.so"), "{out}");
    assert!(
        out.contains("FAIL  agent program") && out.contains("/nonexistent/agent"),
        "{out}"
    );
    assert!(out.contains("2 of 6 checks failed"), "{out}");

    // A refused boot secret: the coordinator checks are marked, with a hint.
    sb.coordinator
        .add_fault(Fault::status(Route::AgentToken, 401))
        .unwrap();
    let (code, out) = check(&sb, |_| {}).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  agent token") && out.contains("boot secret is not"),
        "{out}"
    );

    // The session route failing.
    sb.coordinator
        .add_fault(Fault::status(Route::Session, 503))
        .unwrap();
    let (code, out) = check(&sb, |_| {}).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  session") && out.contains("503"),
        "{out}"
    );

    // No git on PATH.
    let (code, out) = check(&sb, |c| {
        c.env("PATH", "/nonexistent");
        c.env("HOSTED_BOOT_AGENT_COMMAND", "/bin/sh");
    })
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL  git") && out.contains("hint:"), "{out}");

    // A broken environment.
    let (code, out) = check(&sb, |c| {
        c.env_remove("ORIZU_AGENT_TOKEN_URL");
    })
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  environment") && out.contains("ORIZU_AGENT_TOKEN_URL"),
        "{out}"
    );
    assert!(
        !sb.coordinator
            .requests()
            .iter()
            .any(|r| matches!(r.route, Route::RepoToken | Route::BootStatus))
    );
}
