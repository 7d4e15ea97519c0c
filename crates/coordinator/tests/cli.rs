//! The `hosted-boot-coordinator` binary: how it finds the runner it prints
//! (`serve`) or boots (`demo`), and what it says when there is none. The
//! scenarios that boot the real runner are in the runner's suite
//! (tests/suite/harvest.rs, coordinator.rs, image.rs), which needs both
//! binaries; this package having integration tests is also what makes
//! cargo build this binary with the workspace's tests.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a panic is a test failure"
)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_hosted-boot-coordinator");

/// This binary copied alone into a fresh directory: no runner beside it.
fn alone(dir: &Path) -> PathBuf {
    let bin = dir.join("hosted-boot-coordinator");
    std::fs::copy(BIN, &bin).unwrap();
    bin
}

/// An executable file named `hosted-boot` in `dir`.
fn fake_runner(dir: &Path) -> PathBuf {
    let runner = dir.join("hosted-boot");
    std::fs::write(&runner, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o755)).unwrap();
    runner
}

/// Runs `args` with the coordinator binary `bin` and an empty `PATH` (no
/// runner there); returns the exit code and stderr.
fn run(bin: &Path, args: &[&str], cwd: &Path) -> (Option<i32>, String) {
    let out = Command::new(bin)
        .args(args)
        .current_dir(cwd)
        .env("PATH", "")
        .env("TMPDIR", cwd)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A `PATH` with git and nothing else (the coordinator serves with git; no
/// `hosted-boot` on it).
fn git_only_path(dir: &Path) -> PathBuf {
    let tools = dir.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    let out = Command::new("sh")
        .args(["-c", "command -v git"])
        .output()
        .unwrap();
    let git = String::from_utf8(out.stdout).unwrap();
    let _ = std::os::unix::fs::symlink(git.trim(), tools.join("git"));
    tools
}

/// The first line of `serve`'s output that starts with `prefix`, then a
/// SIGTERM; asserts that it stops with 0.
fn serve_line(bin: &Path, extra: &[&str], cwd: &Path, prefix: &str) -> (String, String) {
    let path = git_only_path(cwd);
    let mut child = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--no-request-log"])
        .args(extra)
        .current_dir(cwd)
        .env("PATH", path)
        .env("TMPDIR", cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    let line = loop {
        assert!(Instant::now() < deadline, "no line starting {prefix:?}");
        let line = lines.next().expect("serve ended").unwrap();
        if line.trim_start().starts_with(prefix) {
            break line;
        }
    };
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "serve stops on SIGTERM");
    (line, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The printed sandbox line runs the runner beside this binary, as
/// `cargo build` and an image that ships both leave them.
#[test]
fn serve_prints_the_runner_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let bin = alone(dir.path());
    let runner = fake_runner(dir.path());
    let (line, _) = serve_line(&bin, &[], dir.path(), "mkdir -p ");
    assert!(
        line.contains(&format!("{} run", runner.display())),
        "{line}"
    );
}

/// `--runner` names the runner the sandbox line runs.
#[test]
fn serve_prints_the_runner_it_is_given() {
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let runner = fake_runner(elsewhere.path());
    let (line, _) = serve_line(
        &alone(dir.path()),
        &["--runner", runner.to_str().unwrap()],
        dir.path(),
        "mkdir -p ",
    );
    assert!(
        line.contains(&format!("{} run", runner.display())),
        "{line}"
    );
}

/// Serving needs no runner: without one it says where it looked and
/// prints the line for a `hosted-boot` on PATH.
#[test]
fn serve_without_a_runner_says_so_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let (line, stderr) = serve_line(&alone(dir.path()), &[], dir.path(), "mkdir -p ");
    assert!(line.ends_with(" hosted-boot run"), "{line}");
    assert!(
        stderr.contains("neither beside this binary") && stderr.contains("--runner PATH"),
        "{stderr}"
    );
}

/// The demo needs the runner: without one it fails at once, saying where
/// it looked and what to do, and leaves nothing in the working directory.
#[test]
fn the_demo_without_a_runner_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let bin = alone(dir.path());
    let (code, stderr) = run(&bin, &["demo"], dir.path());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "neither beside this binary ({})",
            dir.path().join("hosted-boot").display()
        )) && stderr.contains("cargo build --release")
            && stderr.contains("--runner PATH"),
        "{stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("hosted-boot-coordinator")]
    );
}

/// A `--runner` that is not an executable file is named, for both
/// subcommands; `serve` still serves (it only prints the line).
#[test]
fn a_runner_that_cannot_run_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let bin = alone(dir.path());
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a program").unwrap();
    for given in [text.clone(), dir.path().join("missing")] {
        let given = given.to_str().unwrap();
        let (code, stderr) = run(&bin, &["demo", "--runner", given], dir.path());
        assert_eq!(code, Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!("the runner {given} is not an executable file")),
            "{stderr}"
        );
        let (_, stderr) = serve_line(&bin, &["--runner", given], dir.path(), "mkdir -p ");
        assert!(
            stderr.contains(&format!("the runner {given} is not an executable file")),
            "{stderr}"
        );
    }
}
