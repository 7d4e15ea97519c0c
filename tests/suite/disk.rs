//! Disk (issue 15, RELIABILITY.md row "Disk"): the sandbox's root on a
//! small tmpfs that the agent fills during its turn. The spool reports the
//! events it could not keep, the harvest fails clearly, no partial secret
//! file is left in the session directory, and the runner does not crash.
//! Needs root (to mount the tmpfs); elsewhere it skips with the reason.

use std::path::Path;

use hosted_boot_coordinator::CoordinatorOptions;

use super::reliability_log::record;
use super::support::{Runner, Sandbox, WAIT};

/// The tmpfs mounted at a path for the life of a test.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        hosted_boot_test_support::root("mounting a tmpfs")?;
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(at)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Files under `dir` (recursively) whose name says a write did not finish.
fn partial_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if path.is_dir() && !path.is_symlink() {
            out.extend(partial_files(&path));
        } else if name.ends_with(".tmp") || name.starts_with(".tmp") {
            out.push(path.display().to_string());
        }
    }
    out
}

#[tokio::test]
async fn a_root_that_fills_during_a_turn_fails_clearly_and_leaves_no_partial_secret_file() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let _tmpfs = match Tmpfs::mount(&sb.root(), "24m") {
        Ok(t) => t,
        Err(why) => {
            hosted_boot_test_support::skip(why);
            return;
        }
    };
    // The agent fills the root (outside repo/, so the harvest has only a
    // small change to commit), then prints events the spool cannot keep.
    let script = sb.script(
        r#"
echo '{"type":"message","text":"before the disk is full"}'
sleep 0.3
dd if=/dev/zero of=../filler bs=64k 2>/dev/null
echo change > new-file.txt
i=0
while [ $i -lt 50 ]; do
  echo "{\"type\":\"message\",\"text\":\"after $i\"}"
  i=$((i + 1))
done
"#,
    );
    let runner = Runner::spawn(&sb, &script);
    let sealed = sb
        .coordinator
        .wait_for(WAIT, |s| s.run("run-1").is_some_and(|r| r.finish.is_some()))
        .await;
    if sealed.is_err() {
        panic!("run-1 was never sealed\n{}", runner.kill().await);
    }
    // A turn that succeeded leaves the runner waiting for the next one.
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    // Exits as the contract says (a failed turn: 1), never by a signal or a
    // panic.
    assert!(status.code().is_some(), "killed by a signal\n{output}");
    assert!(!output.contains("panicked"), "{output}");
    let run = sb.coordinator.run("run-1").unwrap();
    let fin = run.finish.clone().expect("the run is sealed");
    let sealed = serde_json::to_string(&fin).unwrap();
    // The harvest failed clearly: what and why, named.
    assert!(
        sealed.contains("No space left on device") || sealed.contains("no space"),
        "{sealed}\n{output}"
    );
    // The spool said what it could not keep.
    let dropped = output.matches("cannot append to the event spool").count();
    assert!(dropped >= 1, "{output}");
    let partial = partial_files(&sb.root());
    assert!(partial.is_empty(), "partial files left: {partial:?}");
    assert!(
        !sb.session_dir().join("bearer").exists(),
        "the bearer file was left"
    );
    record(
        "disk: the root fills during a turn",
        "the spool reports what it could not keep, the harvest fails clearly, no partial secret file, no crash",
        "suite::disk::a_root_that_fills_during_a_turn_fails_clearly_and_leaves_no_partial_secret_file",
        &[
            ("faults_injected", 1),
            ("spool_appends_refused", dropped as u64),
            ("partial_files_left", partial.len() as u64),
            (
                "runner_crashes",
                u64::from(status.code().is_none() || output.contains("panicked")),
            ),
        ],
    );
}
