//! Test support: a sandbox (root directory) booted by the real binary
//! against the in-process reference coordinator on loopback.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use hosted_boot::coordinator::{Coordinator, CoordinatorOptions};
use tempfile::TempDir;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

/// Durations scaled by this in every runner the tests start (5 s polls →
/// 250 ms, 10 s grace → 500 ms).
pub const TIME_SCALE: &str = "0.05";
/// Bound on any wait in a test.
pub const WAIT: Duration = Duration::from_secs(30);

/// A coordinator, a root for the sandbox and a directory the agent scripts
/// write what they observed to (`$AGENT_OUT`).
pub struct Sandbox {
    pub coordinator: Coordinator,
    pub dir: TempDir,
}

impl Sandbox {
    pub async fn start(opts: CoordinatorOptions) -> Sandbox {
        hosted_boot::tls::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("root")).unwrap();
        std::fs::create_dir_all(dir.path().join("out")).unwrap();
        let opts = CoordinatorOptions {
            workdir: Some(dir.path().join("coordinator")),
            ..opts
        };
        let coordinator = Coordinator::start(opts).await.unwrap();
        Sandbox { coordinator, dir }
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    /// Writes an agent script (run with `sh`) and returns its path.
    pub fn script(&self, body: &str) -> PathBuf {
        let path = self.dir.path().join("agent.sh");
        std::fs::write(&path, format!("set -u\n{body}\n")).unwrap();
        path
    }

    /// The runner command for an agent script, with the sandbox's
    /// environment, trace-level JSON logs and the test time scale.
    pub fn runner(&self, script: &Path) -> Command {
        self.command("run", script)
    }

    /// `hosted-boot <subcommand>` with the environment of [`Sandbox::runner`].
    pub fn command(&self, subcommand: &str, script: &Path) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hosted-boot"));
        cmd.arg(subcommand)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.dir.path())
            .envs(self.coordinator.sandbox_env())
            .env("HOSTED_BOOT_AGENT", "command")
            .env(
                "HOSTED_BOOT_AGENT_COMMAND",
                format!("sh {}", script.display()),
            )
            .env("HOSTED_BOOT_ROOT", self.root())
            .env("HOSTED_BOOT_TEST_TIME_SCALE", TIME_SCALE)
            .env("HOSTED_BOOT_LOG", "trace")
            .env("HOSTED_BOOT_LOG_FORMAT", "json")
            .env("AGENT_OUT", self.out())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    pub fn spawn(&self, script: &Path) -> Child {
        self.runner(script).spawn().unwrap()
    }

    /// Every secret the coordinator issued (boot secret, bearers, repo
    /// tokens) plus the given extra values.
    pub fn secrets(&self, extra: &[&str]) -> Vec<String> {
        let mut s = self.coordinator.issued_secrets();
        s.extend(extra.iter().map(|e| e.to_string()));
        s
    }

    pub fn session_dir(&self) -> PathBuf {
        self.root()
            .join(".orizu-session")
            .join(self.coordinator.session_id())
    }

    /// Waits until run `run_id` is sealed and returns the state then.
    pub async fn wait_sealed(&self, run_id: &str) -> hosted_boot::coordinator::Snapshot {
        self.coordinator
            .wait_for(WAIT, |s| s.run(run_id).is_some_and(|r| r.finish.is_some()))
            .await
            .unwrap()
    }

    pub fn read_out(&self, name: &str) -> String {
        std::fs::read_to_string(self.out().join(name)).unwrap_or_default()
    }
}

/// Waits for the runner to exit (bounded) and returns its status and its
/// whole output (stdout and stderr).
pub async fn finish(mut child: Child) -> (ExitStatus, String) {
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let read = async {
        let mut a = Vec::new();
        let mut b = Vec::new();
        let _ = tokio::join!(stdout.read_to_end(&mut a), stderr.read_to_end(&mut b));
        a.extend(b);
        String::from_utf8_lossy(&a).into_owned()
    };
    let (status, output) = tokio::time::timeout(WAIT, async { tokio::join!(child.wait(), read) })
        .await
        .expect("the runner did not exit in time");
    (status.unwrap(), output)
}

/// Live (non-zombie) processes whose process group is `pgid`.
pub fn live_group_members(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name: state ppid pgrp …
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string() {
            out.push(pid);
        }
    }
    out
}

/// Asserts that `output` contains none of `secrets`.
pub fn assert_no_secret(what: &str, output: &str, secrets: &[String]) {
    for s in secrets {
        assert!(!s.is_empty());
        assert!(
            !output.contains(s.as_str()),
            "{what} contains a secret ({}…)",
            &s[..4.min(s.len())]
        );
    }
}
