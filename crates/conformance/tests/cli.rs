//! The `hosted-boot-conformance` binary before it contacts anything: what
//! it says when the environment is not a sandbox's or there is no runner,
//! and that the boot secret never reaches its output. The checks against a
//! coordinator (one real turn of the runner) are in the runner's suite
//! (tests/suite/openapi.rs), which needs both binaries; this package having
//! integration tests is also what makes cargo build this binary with the
//! workspace's tests.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is a test failure"
)]

use std::path::Path;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_hosted-boot-conformance");
const SECRET: &str = "0123456789abcdef0123456789abcdef-conformance-test";

/// Runs the binary at `bin` with `args` and exactly the environment `env`
/// (plus PATH, emptied when `no_path`); returns the exit code and stdout
/// and stderr together.
fn run(bin: &Path, args: &[&str], env: &[(&str, &str)], no_path: bool) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .current_dir(dir.path())
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    if !no_path {
        cmd.env("PATH", std::env::var_os("PATH").unwrap_or_default());
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn sandbox_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("ORIZU_BOOT_SECRET", SECRET),
        (
            "ORIZU_AGENT_TOKEN_URL",
            "http://127.0.0.1:9/api/cli/sessions/s1/agent-token",
        ),
        ("ORIZU_API_BASE_URL", "http://127.0.0.1:9/"),
        ("ORIZU_SESSION_ID", "s1"),
    ]
}

/// Each variable a sandbox gets, missing in turn: exit 2, named, and the
/// boot secret never printed.
#[test]
fn an_incomplete_environment_is_named_with_exit_2() {
    for missing in [
        "ORIZU_AGENT_TOKEN_URL",
        "ORIZU_API_BASE_URL",
        "ORIZU_SESSION_ID",
        "ORIZU_BOOT_SECRET",
    ] {
        let env: Vec<_> = sandbox_env()
            .into_iter()
            .filter(|(k, _)| *k != missing)
            .collect();
        let (code, out) = run(Path::new(BIN), &[], &env, false);
        assert_eq!(code, Some(2), "{missing}: {out}");
        assert!(
            out.contains(&format!("{missing} is not set")),
            "{missing}: {out}"
        );
        assert!(!out.contains(SECRET), "{missing}: {out}");
    }
}

/// Without a runner beside it or on PATH it says where it looked and what
/// to do, before it changes anything of the session (exit 2).
#[test]
fn no_runner_is_named_before_anything_is_changed() {
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("hosted-boot-conformance");
    std::fs::copy(BIN, &alone).unwrap();
    let (code, out) = run(&alone, &[], &sandbox_env(), true);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("the runner binary `hosted-boot` is neither beside this binary")
            && out.contains("--runner PATH"),
        "{out}"
    );
    assert!(!out.contains("This runs one real turn"), "{out}");
    assert!(!out.contains(SECRET), "{out}");
    let (code, out) = run(
        &alone,
        &["--runner", "/nonexistent/hosted-boot"],
        &sandbox_env(),
        true,
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.contains("the runner /nonexistent/hosted-boot is not an executable file"),
        "{out}"
    );
}

/// `agent` is the runner's to run, not a person's: `--help` hides it and
/// shows the flags.
#[test]
fn the_agent_subcommand_is_hidden_from_help() {
    let (code, out) = run(Path::new(BIN), &["--help"], &[], false);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("agent "), "{out}");
    assert!(
        out.contains("--runner <PATH>") && out.contains("--timeout"),
        "{out}"
    );
}
