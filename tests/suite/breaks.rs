//! Attacks on the least-privilege promises (SECURITY.md, PROTOCOL.md 3 and
//! 4.5) found by the review of issue 13 (branch review/lp): each failed
//! against the merged tree before its fix.

use super::support::{Sandbox, git};

const CONNECTOR: (&str, &str) = ("ACME_API_KEY", "acme-connector-value-42");

/// Every object of the remote's bare repository (reachable or not), raw.
fn remote_objects(sb: &Sandbox) -> Vec<u8> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(sb.coordinator.bare_repo())
        .args(["cat-file", "--batch-all-objects", "--batch"])
        .output()
        .unwrap();
    assert!(out.status.success());
    out.stdout
}

fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

/// PROTOCOL 4.5 / SECURITY.md "The harvest's secret guard": no push of a
/// path that holds a secret. The guard once checked the names of regular
/// files, executables and symbolic links only, so a submodule gitlink whose
/// *name* is a connector value went to the remote in the tree object; every
/// entry's path is checked now, whatever its mode.
#[tokio::test]
async fn a_gitlink_named_with_a_connector_value_is_held_back() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  git update-index --add --cacheinfo "160000,$(git rev-parse HEAD),vendor-$ACME_API_KEY"
  git commit -q -m "agent: vendor" || echo "commit failed" > "$AGENT_OUT/failed"
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    assert_eq!(sb.read_out("failed"), "");
    let branch = sb.coordinator.branch();
    let tree = git(
        &sb.coordinator.bare_repo(),
        &["ls-tree", &format!("refs/heads/{branch}")],
    );
    let finish =
        serde_json::to_value(&snap.run("run-1").unwrap().finish.as_ref().unwrap().result).unwrap();
    assert!(
        !holds(&remote_objects(&sb), CONNECTOR.1),
        "the remote holds the connector value (in a gitlink's name): tree {tree}; finish {finish}"
    );
}

/// SECURITY.md, `--agent-user`: "the agent cannot read the runner's files".
/// The runner's git once ran as root in `repo/`, and libgit2 honours
/// `core.worktree` from `repo/.git/config`, which the agent user owns: the
/// agent points it at a directory only root can read, the harvest (root)
/// commits that directory's files, gives the objects in `repo/.git` to the
/// agent and pushes them: the agent read a root-only file, and the remote
/// got it. The harvest now acts as the agent user, and cannot read it.
#[tokio::test]
async fn core_worktree_in_the_agents_git_config_gets_the_harvest_no_root_only_file() {
    use std::os::unix::fs::PermissionsExt;
    let user = match super::agent_user::TestUser::create() {
        Ok(u) => u,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = super::agent_user::sandbox_for(&user).await;
    let private = sb.dir.path().join("root-only");
    std::fs::create_dir(&private).unwrap();
    std::fs::write(private.join("secret.txt"), "root-only-content-7731\n").unwrap();
    std::fs::set_permissions(
        private.join("secret.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let script = sb.script(&format!(
        r#"
o="$AGENT_OUT/$ORIZU_RUN_ID"; mkdir -p "$o"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  cat {dir}/secret.txt > "$o/direct" 2>/dev/null; echo "direct=$?" >> "$o/direct"
  git config core.worktree {dir}
else
  git config --unset core.worktree
  git show HEAD:secret.txt > "$o/got" 2>&1 || true
fi
"#,
        dir = private.display()
    ));
    let child = super::agent_user::runner_as(&sb, &script, &user.name);
    sb.wait_sealed("run-1").await;
    let second = sb.coordinator.queue_turn("second", None);
    let (_snap, _output) = sb.end_after_seal(&second, child).await;
    assert!(
        sb.read_out("run-1/direct").contains("direct=1"),
        "the agent user could read the file itself: the test proves nothing"
    );
    let got = sb.read_out(&format!("{second}/got"));
    assert!(
        !got.contains("root-only-content-7731"),
        "the agent user read a root-only file through the runner's harvest: {got:?}"
    );
    assert!(
        !holds(&remote_objects(&sb), "root-only-content-7731"),
        "the runner pushed a root-only file"
    );
}

/// `--agent-user`: "symbolic links planted in repo/.git". libgit2 appends
/// to a reflog with `open(O_APPEND)`, following a symbolic link: the agent
/// points `repo/.git/logs/HEAD` at a file only root may write, and a root
/// harvest appended its reflog line to it. As the agent user it cannot.
#[tokio::test]
async fn a_reflog_symlinked_by_the_agent_gets_the_harvest_no_root_write() {
    use std::os::unix::fs::PermissionsExt;
    let user = match super::agent_user::TestUser::create() {
        Ok(u) => u,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = super::agent_user::sandbox_for(&user).await;
    let private = sb.dir.path().join("root-only");
    std::fs::create_dir(&private).unwrap();
    let victim = private.join("victim");
    std::fs::write(&victim, "original\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let script = sb.script(&format!(
        r#"
o="$AGENT_OUT/$ORIZU_RUN_ID"; mkdir -p "$o"
echo hi >> "{victim}" 2>/dev/null; echo "direct=$?" > "$o/direct"
mkdir -p .git/logs/refs/heads
rm -f .git/logs/HEAD && ln -s "{victim}" .git/logs/HEAD
echo work > WORK.md
"#,
        victim = victim.display()
    ));
    let child = super::agent_user::runner_as(&sb, &script, &user.name);
    let (_snap, _) = sb.end_after_seal("run-1", child).await;
    assert!(
        !sb.read_out("run-1/direct").contains("direct=0"),
        "the agent user could write the file itself: the test proves nothing"
    );
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "original\n",
        "the runner (root) wrote to a file the agent pointed repo/.git/logs/HEAD at"
    );
}

/// `--agent-user`, a restart: the runner reuses a `repo/` the agent had in
/// its hands (PROTOCOL.md 3) and writes its configuration (origin, the
/// credential helper). libgit2 writes a configuration file through a
/// symbolic link, so an agent that pointed `repo/.git/config` at a file only
/// root may write would have a restarted root runner write it. The reuse
/// acts as the agent user: the file is left as it was (and the reuse, which
/// the agent sabotaged, fails the boot rather than run as root).
#[tokio::test]
async fn a_restarted_runner_reuses_the_agents_repo_as_the_agent_user_not_as_root() {
    use std::os::unix::fs::PermissionsExt;
    let user = match super::agent_user::TestUser::create() {
        Ok(u) => u,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = super::agent_user::sandbox_for(&user).await;
    let private = sb.dir.path().join("root-only");
    std::fs::create_dir(&private).unwrap();
    let victim = private.join("config");
    // A valid git configuration naming the session's remote, so that a
    // root runner would take the repository for its clone and rewrite it.
    let original = format!(
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n[remote \"origin\"]\n\turl = {}\n",
        sb.coordinator.clone_url()
    );
    std::fs::write(&victim, &original).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).unwrap();
    let script = sb.script(&format!(
        r#"
o="$AGENT_OUT/$ORIZU_RUN_ID"; mkdir -p "$o"
cat "{victim}" > /dev/null 2>&1; echo "direct=$?" > "$o/direct"
rm -f .git/config && ln -s "{victim}" .git/config
record_group > "$AGENT_OUT/pgid.tmp"; mv "$AGENT_OUT/pgid.tmp" "$AGENT_OUT/pgid"
exec sleep 1000
"#,
        victim = victim.display()
    ));
    let mut first = super::agent_user::runner_as(&sb, &script, &user.name);
    super::support::wait_for_file(&sb.out().join("pgid")).await;
    // The sandbox dies mid-turn: the next runner reuses repo/.
    first.kill().await.unwrap();
    let _ = first.wait().await;
    let group = sb.read_group("pgid");
    super::support::kill_group(&group);
    assert!(
        sb.read_out("run-1/direct").contains("direct=1"),
        "the agent user could read the file itself: the test proves nothing"
    );
    let second = super::agent_user::runner_as(&sb, &script, &user.name);
    let (_status, output) = super::support::finish(second).await;
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        original,
        "the restarted runner (root) wrote the file the agent pointed repo/.git/config at: {output}"
    );
}

/// `--agent-user`: a FIFO the agent puts at `repo/.git/config` makes the
/// harvest's `Repository::open` (as the agent user, which may open it)
/// block in `open(2)` for good, on a blocking-pool thread that holds the
/// runner's lock on `repo/` (`REPO_LOCK`) and acts as the agent user. The
/// harvest's report comes at its bound, but every later git work of the
/// runner waits for that lock: the next turn's sync never ends, so the next
/// turn never starts nor seals. A hold must never wait on a file the agent
/// planted without a bound (open `.git` files with `O_NONBLOCK`, refuse
/// anything not a regular file or directory before libgit2 opens it).
#[tokio::test]
async fn a_fifo_at_the_agents_git_config_does_not_wedge_the_runners_git_work() {
    let user = match super::agent_user::TestUser::create() {
        Ok(u) => u,
        Err(reason) => {
            hosted_boot_test_support::skip(reason);
            return;
        }
    };
    let sb = super::agent_user::sandbox_for(&user).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  echo work > WORK.md
  rm -f .git/config && mkfifo .git/config
fi
"#,
    );
    let child = super::agent_user::runner_as(&sb, &script, &user.name);
    let first =
        tokio::time::timeout(std::time::Duration::from_secs(30), sb.wait_sealed("run-1")).await;
    assert!(first.is_ok(), "run-1 never sealed");
    let second = sb.coordinator.queue_turn("second", None);
    let snap =
        tokio::time::timeout(std::time::Duration::from_secs(20), sb.wait_sealed(&second)).await;
    let mut child = child;
    if snap.is_err() {
        // Wedged: it would not exit at the session's end either.
        child.start_kill().unwrap();
    }
    sb.coordinator.end_session();
    let (_status, output) = super::support::finish(child).await;
    assert!(
        snap.is_ok(),
        "the second turn never sealed: the runner's git work waits for a harvest stuck opening the agent's FIFO: {}",
        output
            .lines()
            .filter(|l| l.contains("harvest")
                || l.contains("sync")
                || l.contains("WARN")
                || l.contains("ERROR"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
