//! The agent as another user (`--agent-user`, PROTOCOL.md 3): the runner
//! is root, every process of the agent runs as a throwaway user created for
//! the test, `repo/` is that user's after every git operation of the
//! runner (its own `git commit` works after each harvest), and the session
//! and run directories stay the runner's (no listing; only the files the
//! contract gives the agent can be read). Needs root: skipped otherwise.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hosted_boot_coordinator::CoordinatorOptions;
use tokio::process::Child;

use super::support::{Sandbox, finish};

/// A system user made for one test with `useradd`, removed (home included)
/// when dropped.
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    pub home: PathBuf,
}

impl TestUser {
    /// Creates a user with a fresh home, or says why it cannot.
    pub fn create() -> Result<TestUser, String> {
        if !rustix::process::getuid().is_root() {
            return Err(
                "creating a user and running the agent as it need root (run the suite as root, as .ci/run does)".into(),
            );
        }
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "hbt{}x{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let home = PathBuf::from(format!("/tmp/{name}-home"));
        let out = std::process::Command::new("useradd")
            .args([
                "--system",
                "--user-group",
                "--create-home",
                "--shell",
                "/bin/sh",
                "--home-dir",
            ])
            .arg(&home)
            .arg(&name)
            .output()
            .map_err(|e| format!("useradd cannot run: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "useradd {name} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let uid = std::fs::metadata(&home)
            .map(|m| m.uid())
            .map_err(|e| e.to_string())?;
        Ok(TestUser { name, uid, home })
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = std::process::Command::new("userdel")
            .args(["--remove", "--force", &self.name])
            .output();
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// A sandbox the agent user can work in: the test's directory traversable,
/// `$AGENT_OUT` its own.
pub(super) async fn sandbox_for(user: &TestUser) -> Sandbox {
    sandbox_with(user, CoordinatorOptions::default()).await
}

/// [`sandbox_for`] with a coordinator of `opts`.
pub(super) async fn sandbox_with(user: &TestUser, opts: CoordinatorOptions) -> Sandbox {
    let sb = Sandbox::start(opts).await;
    std::fs::set_permissions(sb.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(sb.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(sb.out(), Some(user.uid), Some(user.uid)).unwrap();
    sb
}

/// The runner (root) on `script`, the agent as `user`. Through `env`, so
/// that the binary run is the world-executable copy in the sandbox (the
/// agent's git runs it as the credential helper).
pub(super) fn runner_as(sb: &Sandbox, script: &Path, user: &str) -> Child {
    runner_in_mode(sb, script, user, "broker")
}

/// [`runner_as`] with `--credential-mode` `mode` (`broker` or `file`).
pub(super) fn runner_in_mode(sb: &Sandbox, script: &Path, user: &str, mode: &str) -> Child {
    sb.wrapped_command(&["env"], "run", script)
        .env("HOSTED_BOOT_AGENT_USER", user)
        .env("HOSTED_BOOT_CREDENTIAL_MODE", mode)
        .spawn()
        .unwrap()
}

/// What every turn's agent records: who it is, what it can see of the
/// session and run directories, whether repo/ is wholly its own, and
/// whether its own commit and push work after the previous turn's harvest.
/// It leaves a file uncommitted for the harvest.
const AGENT: &str = r#"
o="$AGENT_OUT/$ORIZU_RUN_ID"
mkdir -p "$o"
id -u > "$o/uid"
echo "$HOME" > "$o/home"
session=$(dirname "$ORIZU_TOKEN_FILE")
run=$(dirname "$ORIZU_TASK_FILE")
{ ls "$session" >/dev/null 2>&1; echo "ls-session=$?"
  ls "$run" >/dev/null 2>&1; echo "ls-run=$?"
  touch "$session/planted" 2>/dev/null; echo "write-session=$?"
  for f in boot-secret bearer turn.json boot-context.json repo-credential-cache repo-tokens-issued repo-credential-lock; do
    cat "$session/$f" >/dev/null 2>&1; echo "$f=$?"
  done
  cat "$ORIZU_TASK_FILE" >/dev/null 2>&1; echo "task.txt=$?"
  cat "$run/events.ndjson" >/dev/null 2>&1; echo "events.ndjson=$?"
} > "$o/access"
find . -not -user "$(id -u)" > "$o/not-mine" 2>&1
echo "$ORIZU_RUN_ID" > "agent-$ORIZU_RUN_ID.md"
git add "agent-$ORIZU_RUN_ID.md" && git commit -q -m "agent commit in $ORIZU_RUN_ID" > "$o/commit" 2>&1
echo "commit=$?" >> "$o/commit"
git push -q origin HEAD > "$o/push" 2>&1
echo "push=$?" >> "$o/push"
echo "left by $ORIZU_RUN_ID" > "left-$ORIZU_RUN_ID.md"
"#;

/// `key=value` lines.
fn pairs(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

#[tokio::test]
async fn the_agent_runs_as_the_agent_user_and_commits_after_every_harvest() {
    // Broker mode (the default): the agent reads its bearer file (the
    // proxy token), its task and the helper's context; the boot secret and
    // the file helper's files do not exist.
    agent_user_turns("broker", &[]).await;
}

#[tokio::test]
async fn in_file_mode_the_agent_user_reads_the_helpers_files_and_commits_after_every_harvest() {
    // The file credential mode (PROTOCOL.md 3): the agent's git runs the
    // helper as the agent user, so boot-secret and the helper's files are
    // the agent's to read; file mode hands the agent the boot secret.
    agent_user_turns(
        "file",
        &[
            "boot-secret",
            "repo-credential-cache",
            "repo-tokens-issued",
            "repo-credential-lock",
        ],
    )
    .await;
}

/// Three turns as a throwaway agent user in credential mode `mode`; the
/// agent can read exactly its bearer file, its task, the helper's context
/// and `readable` of the session directory.
async fn agent_user_turns(mode: &str, readable: &[&str]) {
    let user = match TestUser::create() {
        Ok(u) => u,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = sandbox_for(&user).await;
    let script = sb.script(AGENT);
    let child = runner_in_mode(&sb, &script, &user.name, mode);
    sb.wait_sealed("run-1").await;
    let second = sb.coordinator.queue_turn("second", None);
    sb.wait_sealed(&second).await;
    let third = sb.coordinator.queue_turn("third", None);
    let snap = sb.wait_sealed(&third).await;
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");

    // Readable by the agent user (PROTOCOL.md 3): its bearer file, its
    // turn file, its task, the helper's context, and `readable`. Nothing else; no listing,
    // no writing.
    let mut expected: BTreeMap<String, String> = [
        ("ls-session", "2"),
        ("ls-run", "2"),
        ("write-session", "1"),
        ("boot-secret", "1"),
        ("bearer", "0"),
        ("turn.json", "0"),
        ("boot-context.json", "0"),
        ("repo-credential-cache", "1"),
        ("repo-tokens-issued", "1"),
        ("repo-credential-lock", "1"),
        ("task.txt", "0"),
        ("events.ndjson", "1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for name in readable {
        expected.insert(name.to_string(), "0".to_string());
    }
    for run in ["run-1", second.as_str(), third.as_str()] {
        let read = |name: &str| sb.read_out(&format!("{run}/{name}"));
        assert_eq!(read("uid").trim(), user.uid.to_string(), "{run}: {output}");
        assert_eq!(
            read("home").trim(),
            user.home.display().to_string(),
            "{run}"
        );
        assert_eq!(pairs(&read("access")), expected, "{run}");
        assert_eq!(
            read("not-mine").trim(),
            "",
            "{run}: repo/ entries not the agent's"
        );
        assert!(
            read("commit").ends_with("commit=0\n"),
            "{run}: {}",
            read("commit")
        );
        assert!(
            read("push").ends_with("push=0\n"),
            "{run}: {}",
            read("push")
        );
        let finish = snap.run(run).unwrap().finish.as_ref().unwrap();
        let result = serde_json::to_value(&finish.result).unwrap();
        assert_eq!(result["pushed"], serde_json::json!(true), "{run}: {result}");
        assert!(result["harvestCommit"].is_string(), "{run}: {result}");
    }
    // After the last harvest too, repo/ is wholly the agent user's.
    let mut stack = vec![sb.root().join("repo")];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!(m.uid(), user.uid, "{} is not the agent user's", p.display());
        if m.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
    // The runner planted nothing outside its own.
    assert!(!sb.root().join(".orizu-session").exists());
    assert_eq!(std::fs::metadata(sb.root()).unwrap().uid(), 0);
}

#[tokio::test]
async fn an_agent_user_that_does_not_exist_is_a_configuration_error() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script("true");
    let child = runner_as(&sb, &script, "no-such-user-hbt");
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(2), "{output}");
    // As root the user is looked up; otherwise the runner's uid is named.
    let expected = if rustix::process::getuid().is_root() {
        "does not exist".to_string()
    } else {
        format!("runs as uid {}", rustix::process::getuid().as_raw())
    };
    assert!(
        output.contains("no-such-user-hbt") && output.contains(&expected),
        "{output}"
    );
    assert!(
        sb.coordinator.snapshot().requests.is_empty(),
        "a request was made"
    );
}

/// The boot secret from `ORIZU_BOOT_SECRET_FILE` (issue 37): a file root's
/// alone (0400), as a Secret volume with `defaultMode: 0400` gives it. The
/// runner boots from it with no `ORIZU_BOOT_SECRET`; the agent sees neither
/// variable and cannot read the file.
#[tokio::test]
async fn the_boot_secret_from_a_file_the_agent_cannot_read() {
    let Some((user, sb)) = user_and_sandbox().await else {
        return;
    };
    let file = secret_file(&sb, 0o400);
    let script = sb.script(&format!(
        r#"
env > "$AGENT_OUT/env"
cat {} > /dev/null 2>&1; echo "read=$?" > "$AGENT_OUT/read"
"#,
        file.display()
    ));
    let child = runner_as_with(&sb, &script, &user.name, |cmd| {
        cmd.env_remove("ORIZU_BOOT_SECRET")
            .env("ORIZU_BOOT_SECRET_FILE", &file);
    });
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded", "{output}");
    let env = sb.read_out("env");
    assert!(!env.contains("ORIZU_BOOT_SECRET"), "{env}");
    assert!(!env.contains(&sb.coordinator.boot_secret()), "{env}");
    assert_eq!(sb.read_out("read").trim(), "read=1");
}

/// A secret file the agent user could read (a Secret volume's default
/// mode, 0644) is refused before any request, naming its owner and mode.
#[tokio::test]
async fn a_boot_secret_file_the_agent_could_read_is_refused() {
    let Some((user, sb)) = user_and_sandbox().await else {
        return;
    };
    let file = secret_file(&sb, 0o644);
    let script = sb.script("true");
    let child = runner_as_with(&sb, &script, &user.name, |cmd| {
        cmd.env_remove("ORIZU_BOOT_SECRET")
            .env("ORIZU_BOOT_SECRET_FILE", &file);
    });
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(
        output.contains("owner 0:0, mode 0644")
            && output.contains(&format!("agent user {}", user.name)),
        "{output}"
    );
    assert!(!output.contains(&sb.coordinator.boot_secret()), "{output}");
    assert!(
        sb.coordinator.snapshot().requests.is_empty(),
        "a request was made"
    );
}

/// [`runner_as`] with `edit` applied to the command before it starts.
fn runner_as_with(
    sb: &Sandbox,
    script: &Path,
    user: &str,
    edit: impl FnOnce(&mut tokio::process::Command),
) -> Child {
    let mut cmd = sb.wrapped_command(&["env"], "run", script);
    cmd.env("HOSTED_BOOT_AGENT_USER", user);
    edit(&mut cmd);
    cmd.spawn().unwrap()
}

/// A throwaway agent user and a sandbox it can work in; `None` when the
/// test skips (it fails unless the run allows skipping).
async fn user_and_sandbox() -> Option<(TestUser, Sandbox)> {
    match TestUser::create() {
        Ok(user) => {
            let sb = sandbox_for(&user).await;
            Some((user, sb))
        }
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            None
        }
    }
}

/// The boot secret, with a line break as `echo` leaves it, in a file of
/// `mode` (root's) in a directory everyone may enter.
fn secret_file(sb: &Sandbox, mode: u32) -> PathBuf {
    let dir = sb.dir.path().join("secret");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.join("boot-secret");
    std::fs::write(&file, format!("{}\n", sb.coordinator.boot_secret())).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    file
}
