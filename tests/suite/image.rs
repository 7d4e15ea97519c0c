//! What the container image's runtime stage does, run directly (no Docker
//! engine runs on these machines): by default the runner as root and the
//! agent as the `agent` user (`HOSTED_BOOT_AGENT_USER`; a user made for the
//! test stands in for it), on a root-owned `HOSTED_BOOT_ROOT`; in the
//! non-root variant (image/README.md) the binary, as the unprivileged uid
//! 1000, with `HOSTED_BOOT_ROOT` pointing at a fresh directory, completes
//! the demo scenario against the reference coordinator; started from a
//! working directory it cannot read, it says so.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use super::support::coordinator_bin;

const AGENT_UID: u32 = 1000;

/// The runtime stage of the Dockerfile (from `AS runtime` on).
fn runtime_stage() -> String {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile")).unwrap();
    let (_, runtime) = text.split_once(" AS runtime").unwrap();
    runtime.to_string()
}

#[tokio::test]
async fn the_image_default_runs_the_runner_as_root_and_the_agent_as_the_agent_user() {
    // What the image sets: the agent user by its environment, no USER (the
    // runner is root).
    let stage = runtime_stage();
    assert!(stage.contains("HOSTED_BOOT_AGENT_USER=agent"), "{stage}");
    assert!(
        !stage.lines().any(|l| l.trim_start().starts_with("USER ")),
        "the runtime stage drops root: {stage}"
    );
    let user = match super::agent_user::TestUser::create() {
        Ok(u) => u,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = super::support::Sandbox::start(Default::default()).await;
    std::fs::set_permissions(sb.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // /workspace: root's, 0755.
    std::fs::set_permissions(sb.root(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(sb.out(), Some(user.uid), Some(user.uid)).unwrap();
    let script = sb.script(
        r#"
id -u > "$AGENT_OUT/uid"
echo image > IMAGE.md
git add IMAGE.md && git commit -q -m "from the agent user" > "$AGENT_OUT/commit" 2>&1
echo "commit=$?" >> "$AGENT_OUT/commit"
"#,
    );
    // The image's /etc/gitconfig, where the agent user can read it (CI
    // clones into a 0700 temporary directory, which the agent cannot enter).
    let gitconfig = sb.dir.path().join("gitconfig");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("image/gitconfig"),
        &gitconfig,
    )
    .unwrap();
    std::fs::set_permissions(&gitconfig, std::fs::Permissions::from_mode(0o644)).unwrap();
    // The runner's HOME as the image's /root: 0700, which the agent user
    // cannot enter (libgit2 acting as that user once failed every harvest
    // on `failed to stat '/root/.gitconfig'`).
    let home = sb.dir.path().join("root-home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    let child = sb
        .wrapped_command(&["env"], "run", &script)
        .current_dir(sb.root())
        .env("HOME", &home)
        .env("HOSTED_BOOT_AGENT_USER", &user.name)
        .env("GIT_CONFIG_SYSTEM", &gitconfig)
        .spawn()
        .unwrap();
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    assert_eq!(sb.read_out("uid").trim(), user.uid.to_string(), "{output}");
    assert!(
        sb.read_out("commit").ends_with("commit=0\n"),
        "{}",
        sb.read_out("commit")
    );
    let finish = snap.run("run-1").unwrap().finish.as_ref().unwrap();
    let result = serde_json::to_value(&finish.result).unwrap();
    assert_eq!(result["pushed"], serde_json::json!(true), "{result}");
    assert_eq!(result["commits"], serde_json::json!(1), "{result}");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(sb.root().join("repo")).unwrap().uid(),
        user.uid
    );
    assert_eq!(std::fs::metadata(sb.root()).unwrap().uid(), 0);
}

/// The non-root variant (image/README.md: `runAsNonRoot`, runner and
/// agent one uid, `HOSTED_BOOT_AGENT_USER` empty).
#[test]
fn the_binary_runs_the_demo_as_the_unprivileged_agent_user() {
    if let Err(reason) = super::support::root_and_setpriv(&format!("dropping to uid {AGENT_UID}")) {
        hosted_boot_test_support::skip(reason);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let chown = |p: &Path| std::os::unix::fs::chown(p, Some(AGENT_UID), Some(AGENT_UID)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The image's layout: the binary in a root-owned 0755 place, a home and
    // a /workspace owned by the agent user.
    // The runner and, beside it, the coordinator's binary that runs the demo.
    let bin = dir.path().join("hosted-boot");
    std::fs::copy(env!("CARGO_BIN_EXE_hosted-boot"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let coordinator = dir.path().join("hosted-boot-coordinator");
    std::fs::copy(coordinator_bin(), &coordinator).unwrap();
    std::fs::set_permissions(&coordinator, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = dir.path().join("home");
    let workspace = dir.path().join("workspace");
    for d in [&home, &workspace] {
        std::fs::create_dir(d).unwrap();
        chown(d);
    }
    let mut child = std::process::Command::new("/usr/bin/setpriv")
        .args([
            format!("--reuid={AGENT_UID}"),
            format!("--regid={AGENT_UID}"),
            "--clear-groups".to_string(),
            "--".to_string(),
        ])
        .arg(&coordinator)
        .arg("demo")
        // The image's WORKDIR. Not the test's own working directory: the
        // checkout may sit under a 0700 directory (`mktemp -d`) the agent
        // uid cannot enter.
        .current_dir(&workspace)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("TMPDIR", &home)
        .env("HOSTED_BOOT_ROOT", &workspace)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the demo did not finish"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("run-3  interrupted"), "{text}");
    assert!(
        text.contains("runner exited with code 0 (the session ended; complete was posted)"),
        "{text}"
    );
    assert!(
        text.contains(&format!("agent user   the runner's own (uid {AGENT_UID})")),
        "{text}"
    );
    use std::os::unix::fs::MetadataExt;
    let repo = std::fs::metadata(workspace.join("repo")).unwrap();
    assert_eq!(
        repo.uid(),
        AGENT_UID,
        "the clone is not owned by the agent user"
    );
    assert!(!workspace.join(".orizu-session").exists());
}

/// `setpriv` to the agent uid, or the reason to skip.
fn as_agent_user() -> Result<std::process::Command, String> {
    super::support::root_and_setpriv(&format!("dropping to uid {AGENT_UID}"))?;
    let mut cmd = std::process::Command::new("/usr/bin/setpriv");
    cmd.args([
        format!("--reuid={AGENT_UID}"),
        format!("--regid={AGENT_UID}"),
        "--clear-groups".to_string(),
        "--".to_string(),
    ]);
    Ok(cmd)
}

#[test]
fn a_working_directory_the_runner_cannot_read_is_named_as_such() {
    // A checkout cloned into `mktemp -d`: a 0700 root-owned parent, so the
    // agent uid cannot stat the directory it is started in.
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let cwd = private.path().join("checkout");
    std::fs::create_dir(&cwd).unwrap();
    std::fs::set_permissions(&cwd, std::fs::Permissions::from_mode(0o755)).unwrap();
    let public = tempfile::tempdir().unwrap();
    std::fs::set_permissions(public.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = public.path().join("hosted-boot");
    std::fs::copy(env!("CARGO_BIN_EXE_hosted-boot"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let coordinator = public.path().join("hosted-boot-coordinator");
    std::fs::copy(coordinator_bin(), &coordinator).unwrap();
    std::fs::set_permissions(&coordinator, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = public.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(AGENT_UID), Some(AGENT_UID)).unwrap();

    for subcommand in ["demo", "run"] {
        let mut cmd = match as_agent_user() {
            Ok(c) => c,
            Err(reason) => {
                hosted_boot_test_support::skip(reason);
                return;
            }
        };
        // `demo` is the coordinator binary's (issue 34), `run` the runner's.
        let program = if subcommand == "demo" {
            &coordinator
        } else {
            &bin
        };
        let out = cmd
            .arg(program)
            .arg(subcommand)
            .current_dir(&cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &home)
            .env("TMPDIR", &home)
            .env("HOSTED_BOOT_AGENT", "command")
            .env("HOSTED_BOOT_AGENT_COMMAND", "true")
            .env("ORIZU_API_BASE_URL", "http://127.0.0.1:9/")
            .env("ORIZU_AGENT_TOKEN_URL", "http://127.0.0.1:9/agent-token")
            .env("ORIZU_SESSION_ID", "s1")
            .env("ORIZU_BOOT_SECRET", "boot-secret-value")
            .env("HOSTED_BOOT_INSECURE_HTTP", "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let expected = if subcommand == "run" { 2 } else { 1 };
        assert_eq!(out.status.code(), Some(expected), "{subcommand}: {text}");
        assert!(
            text.contains(&format!("the working directory {}", cwd.display()))
                && text.contains("cannot be read"),
            "{subcommand}: {text}"
        );
        assert!(!text.contains("session branch"), "{subcommand}: {text}");
        assert!(!text.contains("boot-secret-value"), "{subcommand}: {text}");
    }
}

/// The image's `HOSTED_BOOT_AGENT_USER=agent` under `runAsNonRoot` without
/// the override image/README.md shows: the runner refuses, naming its uid
/// and what to do, and makes no request.
#[test]
fn the_image_default_as_a_non_root_uid_is_refused_with_what_to_do() {
    let mut cmd = match as_agent_user() {
        Ok(c) => c,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("hosted-boot");
    std::fs::copy(env!("CARGO_BIN_EXE_hosted-boot"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = cmd
        .arg(&bin)
        .arg("run")
        .current_dir(dir.path())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOSTED_BOOT_AGENT_USER", "agent")
        .env("HOSTED_BOOT_AGENT", "command")
        .env("HOSTED_BOOT_AGENT_COMMAND", "true")
        .env("HOSTED_BOOT_ROOT", dir.path())
        .env("ORIZU_API_BASE_URL", "http://127.0.0.1:9/")
        .env("ORIZU_AGENT_TOKEN_URL", "http://127.0.0.1:9/agent-token")
        .env("ORIZU_SESSION_ID", "s1")
        .env("ORIZU_BOOT_SECRET", "boot-secret-value")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains(&format!("runs as uid {AGENT_UID}"))
            && text.contains("unset HOSTED_BOOT_AGENT_USER (or set it empty)"),
        "{text}"
    );
    assert!(!text.contains("boot-secret-value"), "{text}");
    assert!(!dir.path().join(".orizu-session").exists());
}

/// image/agent-cli.Dockerfile installs the Claude Code the suite tests
/// (tools/agent-clis/package.json), which the image tests run in it.
#[test]
fn the_agent_cli_image_pins_the_tested_claude_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(root.join("image/agent-cli.Dockerfile")).unwrap();
    let pinned = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix("ARG CLAUDE_CODE_VERSION="))
        .expect("an ARG CLAUDE_CODE_VERSION= line");
    let package: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("tools/agent-clis/package.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        package["dependencies"]["@anthropic-ai/claude-code"],
        serde_json::json!(pinned)
    );
    assert!(
        dockerfile.contains("\"@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION}\""),
        "{dockerfile}"
    );
}
