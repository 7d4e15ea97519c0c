//! What the container image's runtime stage does, run directly (no Docker
//! engine runs on these machines): the binary, as the unprivileged `agent`
//! uid 1000, with `HOSTED_BOOT_ROOT` pointing at a fresh directory,
//! completes the demo scenario against the reference coordinator; started
//! from a working directory it cannot read, it says so.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

const AGENT_UID: u32 = 1000;

#[test]
fn the_binary_runs_the_demo_as_the_unprivileged_agent_user() {
    if !rustix::process::getuid().is_root() {
        eprintln!("SKIPPED: dropping to uid {AGENT_UID} needs root; this test runs as root in CI");
        return;
    }
    if !Path::new("/usr/bin/setpriv").exists() {
        eprintln!("SKIPPED: setpriv (util-linux) is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let chown = |p: &Path| std::os::unix::fs::chown(p, Some(AGENT_UID), Some(AGENT_UID)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The image's layout: the binary in a root-owned 0755 place, a home and
    // a /workspace owned by the agent user.
    let bin = dir.path().join("hosted-boot");
    std::fs::copy(env!("CARGO_BIN_EXE_hosted-boot"), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
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
        .arg(&bin)
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
    if !rustix::process::getuid().is_root() {
        return Err(format!(
            "dropping to uid {AGENT_UID} needs root; this test runs as root in CI"
        ));
    }
    if !Path::new("/usr/bin/setpriv").exists() {
        return Err("setpriv (util-linux) is not installed".into());
    }
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
    let home = public.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(AGENT_UID), Some(AGENT_UID)).unwrap();

    for subcommand in ["demo", "run"] {
        let mut cmd = match as_agent_user() {
            Ok(c) => c,
            Err(reason) => {
                eprintln!("SKIPPED: {reason}");
                return;
            }
        };
        let out = cmd
            .arg(&bin)
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
