//! `hosted-boot check` against the reference coordinator: a good
//! environment, and each kind of failure, each with a hint and no secret;
//! it reads only (no repo token, no status).

use hosted_boot_coordinator::{CoordinatorOptions, Fault, Route, Target};

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
        "root",
        "root lock",
        "credential socket",
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
    assert!(
        out.contains("all 9 checks passed: `hosted-boot run` can boot"),
        "{out}"
    );
    // The bearer's lifetime in words, not Rust's debug text.
    assert!(out.contains("bearer received, expires in "), "{out}");
    assert!(!out.contains("Known("), "{out}");
    // The initial task is what `run` would run first, not "none".
    assert!(
        out.contains("first turn: run-1 (the initial task, runs at once)"),
        "{out}"
    );
    let routes: Vec<Target> = sb.coordinator.requests().iter().map(|r| r.route).collect();
    let mut sorted = routes.clone();
    sorted.sort_by_key(|r| r.name());
    assert_eq!(
        sorted,
        vec![Route::AgentToken, Route::EnvBundle, Route::Session],
        "{routes:?}"
    );
}

/// Issue 15: `check` said "all passed" while another runner held the root,
/// which `run` refuses (one runner per root, PROTOCOL.md 3). The lock is
/// held here as a runner holds it (`RootLock`, in this test process).
#[tokio::test]
async fn a_root_another_runner_holds_fails_the_check_naming_its_pid() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let held = hosted_boot::workspace::lock::RootLock::acquire(&sb.root()).unwrap();
    let (code, out) = check(&sb, |_| {}).await;
    assert_eq!(code, 1, "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("FAIL  root lock"))
        .unwrap_or_else(|| panic!("no failed root lock line: {out}"));
    assert!(
        line.contains(&format!(
            "another hosted-boot runner (pid {}",
            std::process::id()
        )),
        "{line}"
    );
    assert!(out.contains("hint: stop the runner that holds it"), "{out}");
    assert!(
        out.contains("checks failed: `hosted-boot run` would fail"),
        "{out}"
    );
    drop(held);
    let (code, out) = check(&sb, |_| {}).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ok    root lock"), "{out}");
}

/// Issue 45: `check` in another shell beside the live runner of the root
/// (README, "The first hour") said FAIL on the root lock. Held by the
/// runner the status file names, alive, it is information; exit 0.
#[tokio::test]
async fn the_live_runner_of_the_root_is_information_not_a_failure() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
touch "$AGENT_OUT/working"
while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.05; done
"#,
    );
    let runner = sb.spawn(&script);
    super::support::wait_for_file(&sb.out().join("working")).await;
    let (code, out) = check(&sb, |_| {}).await;
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (_, output) = sb.end_after_seal("run-1", runner).await;
    assert_eq!(code, 0, "{out}\nrunner:\n{output}");
    let line = out
        .lines()
        .find(|l| l.starts_with("ok    root lock"))
        .unwrap_or_else(|| panic!("no passed root lock line: {out}"));
    assert!(
        line.contains("held by this root's live runner (pid ") && line.contains("phase turn"),
        "{line}"
    );
}

/// The review of issue 45: the pid file and the status file are anyone's
/// who can write the root. A lock held by another process, both files
/// naming a live process that is no runner (`sleep`), is still a failure:
/// the kernel's lock owner and the holder's program must be the runner's.
#[tokio::test]
async fn a_status_file_naming_another_live_process_does_not_pass_the_lock() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let held = hosted_boot::workspace::lock::RootLock::acquire(&sb.root()).unwrap();
    let mut sleep = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = sleep.id();
    let dir = sb.root().join(".hosted-boot");
    std::fs::write(dir.join("lock"), format!("{pid}\n")).unwrap();
    let status = serde_json::json!({
        "phase": "turn", "sessionId": "s1", "runId": "run-1", "turnOrdinal": 1,
        "since": "2026-12-06T00:00:00Z", "lastCoordinatorAttempt": null,
        "lastCoordinatorSuccess": null, "updatedAt": "2026-12-06T00:00:00Z",
        "runnerVersion": "0.1.0", "pid": pid
    });
    std::fs::write(dir.join("status.json"), status.to_string()).unwrap();
    assert!(
        hosted_boot::status::read(&sb.root()).is_ok(),
        "the forged status file must read as a runner's"
    );
    let (code, out) = check(&sb, |_| {}).await;
    let _ = sleep.kill();
    let _ = sleep.wait();
    drop(held);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL  root lock"), "{out}");
}

/// Issue 15: with `--agent claude` and no provider key (nor a login file)
/// `check` said nothing of it; `run` then gives the CLI a placeholder key
/// that only an egress proxy injecting the real one makes work (README,
/// "Provider key placeholder"). A warning, naming the variable.
#[tokio::test]
async fn claude_without_a_provider_key_is_warned_of_the_placeholder() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let (_, out) = check(&sb, |c| {
        c.env("HOSTED_BOOT_AGENT", "claude")
            .env_remove("HOSTED_BOOT_AGENT_COMMAND");
    })
    .await;
    let line = out
        .lines()
        .find(|l| l.starts_with("warn  provider key"))
        .unwrap_or_else(|| panic!("no provider key warning: {out}"));
    assert!(
        line.contains("no ANTHROPIC_API_KEY")
            && line.contains("ANTHROPIC_API_KEY=HOSTED_BOOT_PROVIDER_PLACEHOLDER_KEY"),
        "{line}"
    );
    assert!(
        out.contains("hint: set ANTHROPIC_API_KEY in the image or as a connector"),
        "{out}"
    );
    // With a key: no warning.
    let (_, out) = check(&sb, |c| {
        c.env("HOSTED_BOOT_AGENT", "claude")
            .env_remove("HOSTED_BOOT_AGENT_COMMAND")
            .env("ANTHROPIC_API_KEY", "sk-test-provider-key-value");
    })
    .await;
    assert!(out.contains("ok    provider key"), "{out}");
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
    assert!(
        out.contains("2 of 9 checks failed: `hosted-boot run` would fail"),
        "{out}"
    );

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
    assert!(!sb.coordinator.requests().iter().any(|r| matches!(
        r.route,
        Target::Route(Route::RepoToken) | Target::Route(Route::BootStatus)
    )));
}

#[tokio::test]
async fn a_root_that_is_a_file_is_named_as_such() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let file = sb.dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let (code, out) = check(&sb, |c| {
        c.env("HOSTED_BOOT_ROOT", &file);
    })
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("FAIL  root ")
            && l.ends_with(&format!(
                "the root {} is a file, not a directory",
                file.display()
            ))),
        "{out}"
    );
    assert!(out.contains("hint: set HOSTED_BOOT_ROOT"), "{out}");
    assert!(!out.contains("Not a directory"), "{out}");
    // `run` says the same, before touching anything.
    let mut run = sb.runner(&sb.script("true"));
    run.env("HOSTED_BOOT_ROOT", &file);
    let (status, output) = finish(run.spawn().unwrap()).await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(
        output.contains(&format!(
            "the root {} is a file, not a directory",
            file.display()
        )),
        "{output}"
    );
}

#[tokio::test]
async fn a_root_this_user_cannot_write_fails_the_check() {
    if let Err(reason) = super::support::root_and_setpriv("running the check as uid 65534") {
        hosted_boot_test_support::skip(reason);
        return;
    }
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(sb.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::create_dir_all(sb.root()).unwrap();
    // Owned by root, 0755: uid 65534 can read it, not write it.
    std::fs::set_permissions(sb.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let setpriv = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ];
    let script = sb.script("true");
    let mut cmd = sb.wrapped_command(&setpriv, "check", &script);
    cmd.env("HOSTED_BOOT_AGENT_COMMAND", "/bin/true");
    let (status, out) = finish(cmd.spawn().unwrap()).await;
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(
        out.lines().any(|l| l.starts_with("FAIL  root ")
            && l.contains(&format!(
                "the root {} is not writable by uid 65534",
                sb.root().display()
            ))),
        "{out}"
    );
    assert!(!out.contains("checks passed"), "{out}");
    assert!(out.contains("1 of 8 checks failed"), "{out}");
}

#[tokio::test]
async fn an_agent_script_whose_interpreter_is_missing_is_not_runnable() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    use std::os::unix::fs::PermissionsExt;
    let agent = sb.dir.path().join("agent");
    std::fs::write(&agent, "#!/nonexistent/python9 -u\nprint('hi')\n").unwrap();
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (code, out) = check(&sb, |c| {
        c.env("HOSTED_BOOT_AGENT_COMMAND", &agent);
    })
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  agent program")
            && out.contains("whose interpreter /nonexistent/python9 does not exist"),
        "{out}"
    );
}

/// A runner setting whose variable clap cannot parse fails the
/// environment check, with the rest of the report and exit 1, as a bad
/// contract variable does (a fresh reviewer found it cut to clap's one
/// line and exit 2); an empty variable is unset.
#[tokio::test]
async fn a_setting_that_does_not_parse_fails_the_environment_check() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let (code, out) = check(&sb, |c| {
        c.env("HOSTED_BOOT_STOP_BUDGET", "soon")
            .env("HOSTED_BOOT_TURN_CGROUP", "always")
            .env("HOSTED_BOOT_SETUP_TIMEOUT", "");
    })
    .await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("FAIL  environment  configuration error: --stop-budget (HOSTED_BOOT_STOP_BUDGET): invalid duration \"soon\"")
            && out.contains("--turn-cgroup (HOSTED_BOOT_TURN_CGROUP): \"always\" is not one of auto, off"),
        "{out}"
    );
    assert!(out.contains("ok    git"), "{out}");
    assert!(out.contains("checks failed"), "{out}");
    // On the command line, the value is the caller's typo: refused at once.
    let (code, out) = check(&sb, |c| {
        c.arg("--stop-budget=soon");
    })
    .await;
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("--stop-budget (HOSTED_BOOT_STOP_BUDGET)"),
        "{out}"
    );
}
