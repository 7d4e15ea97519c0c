//! What the workspace's tests and benches share (a dev-dependency only:
//! never in a binary): one way for a test to need something of the machine
//! (issue 35), and the session directory a test or bench that drives the
//! workspace layer through the library needs ([`file_mode_session`]). A test that cannot run here (no root, no second uid, no git-lfs, no
//! real agent CLI, no libfaketime, no nftables, …) calls [`skip`] with what
//! is missing and how to get it, then returns. That fails the test, unless
//! the run allows skipping (`HOSTED_BOOT_ALLOW_SKIP=1`, which `.ci/run`
//! never sets): then the skip is printed and recorded, and
//! `scripts/test-skips` counts and lists the run's skips. A test that
//! passes has run.

use std::io::Write as _;
use std::path::PathBuf;

/// The variable that lets a run skip the tests this machine cannot run.
pub const ALLOW_SKIP_VAR: &str = "HOSTED_BOOT_ALLOW_SKIP";

/// Whether this run allows skipping ([`ALLOW_SKIP_VAR`] is `1`).
pub fn skipping_allowed() -> bool {
    std::env::var_os(ALLOW_SKIP_VAR).is_some_and(|v| v == "1")
}

/// The calling test cannot run here: `reason` says what is missing and how
/// to get it (`git-lfs is not on PATH (apt-get install git-lfs)`).
///
/// Panics (the test fails, naming the reason) unless the run allows
/// skipping; then prints `SKIPPED <test>: <reason>` on stderr, records it
/// for `scripts/test-skips`, and returns: the caller returns next.
pub fn skip(reason: impl std::fmt::Display) {
    let test = std::thread::current()
        .name()
        .unwrap_or("an unnamed test")
        .to_string();
    if !skipping_allowed() {
        panic!(
            "{test} cannot run here: {reason}. Provide it (README, \"The two commands\"), or set {ALLOW_SKIP_VAR}=1 to skip such tests (each skip printed and counted by scripts/test-skips)"
        );
    }
    eprintln!("SKIPPED {test}: {reason}");
    record(&test, &reason.to_string());
}

/// Appends the skip to this run's record (one file per nextest run, by its
/// `NEXTEST_RUN_ID`; `cargo-test.log`, which accumulates, outside nextest),
/// one line each (`O_APPEND`: the tests of a run are processes of their own
/// writing at once). Panics when it cannot be recorded.
fn record(test: &str, reason: &str) {
    let dir = skips_dir();
    let run = std::env::var("NEXTEST_RUN_ID").unwrap_or_else(|_| "cargo-test".to_string());
    let line = format!("{test}\t{}\n", reason.replace(['\n', '\t'], " "));
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{run}.log")))?
            .write_all(line.as_bytes())
    });
    // A skip nobody can count is a pass that did not run: fail instead.
    if let Err(e) = written {
        panic!(
            "{test} cannot run here ({reason}) and its skip cannot be recorded in {}: {e}",
            dir.display()
        );
    }
}

/// `<target dir>/test-skips`: `CARGO_TARGET_DIR` when the run sets it, else
/// the workspace's `target/`.
pub fn skips_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../..")
                .join("target")
        })
        .join("test-skips")
}

/// `Err` naming what is missing unless this process is root (how to get
/// it: run as root, as `.ci/run` does, e.g. in a container).
pub fn root(why: &str) -> Result<(), Missing> {
    if rustix::process::geteuid().is_root() {
        Ok(())
    } else {
        Err(Missing(format!(
            "{why} needs root (run the suite as root, as .ci/run does, e.g. in a container)"
        )))
    }
}

/// What a test needs and this machine lacks, and how to get it: the
/// reason [`skip`] records (or the test's failure, when skipping is not
/// allowed).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Missing(pub String);

/// For a test's own `Result<_, String>` of reasons.
impl From<Missing> for String {
    fn from(missing: Missing) -> String {
        missing.0
    }
}

/// `Err` naming `program` and the package that has it unless it is on
/// `PATH` (or, for an absolute path, exists).
pub fn program(program: &str, package: &str) -> Result<(), Missing> {
    let found = if program.starts_with('/') {
        std::path::Path::new(program).exists()
    } else {
        std::env::var_os("PATH")
            .iter()
            .flat_map(std::env::split_paths)
            .any(|dir| dir.join(program).is_file())
    };
    if found {
        Ok(())
    } else {
        Err(Missing(format!(
            "{program} is not installed (apt-get install {package})"
        )))
    }
}

/// The session directory of `coordinator`'s session under `root`, as the
/// boot writes it in the file credential mode: the boot secret, the
/// credential cache and `boot-context.json` (contract durations scaled by
/// `time_scale`). For tests and benches that run the workspace layer
/// (clone, harvest, sync) through the library rather than a booted runner.
pub fn file_mode_session(
    root: &std::path::Path,
    coordinator: &hosted_boot_coordinator::Coordinator,
    time_scale: f64,
) -> hosted_boot::session_dir::SessionDir {
    use hosted_boot::session_dir::{BootContext, CredentialMode, SessionDir};
    let session = SessionDir::create(root, &coordinator.session_id())
        .unwrap_or_else(|e| panic!("cannot create the session directory: {e}"));
    let written = session
        .write_boot_secret(&hosted_boot::secret::Secret::new(coordinator.boot_secret()))
        .and_then(|()| session.create_credential_cache())
        .and_then(|()| {
            session.write_context(&BootContext {
                api_base_url: coordinator.base_url().to_string(),
                agent_token_url: coordinator.agent_token_url(),
                session_id: coordinator.session_id(),
                remote_url: coordinator.clone_url(),
                submodule_remotes: Vec::new(),
                credential_mode: CredentialMode::File,
                credential_socket: None,
                boot_secret_path: Some(session.boot_secret_path()),
                credential_cache_path: session.credential_cache_path(),
                issued_tokens_path: session.issued_tokens_path(),
                credential_lock_path: session.credential_lock_path(),
                ca_file: None,
                insecure_http: false,
                time_scale,
            })
        });
    if let Err(e) = written {
        panic!("cannot write the session files: {e}");
    }
    session
}
