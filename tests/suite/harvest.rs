//! The harvest (PROTOCOL.md 4.5) against the reference coordinator's git
//! server (a bare repository behind `git http-backend`, whose pre-receive
//! hook admits only the session branch and `<branch>-recovered-*`, and which
//! refuses non-fast-forward pushes and deletions): the real binary, agents
//! that are shell scripts using the git CLI.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hosted_boot::wire::{HarvestResult, PushErrorCode};
use hosted_boot::workspace::{
    HarvestJob, Harvester, HttpContext, RepoSpec, credential_helper_command, prepare_repo_async,
};
use hosted_boot_coordinator::{Coordinator, CoordinatorOptions, Fault, Route, Snapshot, Target};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::support::{
    Sandbox, WAIT, assert_no_secret, coordinator_bin, finish, kill_group, signal, wait_for_file,
};

pub(super) const CONNECTOR: (&str, &str) = ("ACME_API_KEY", "acme-connector-value-42");

/// Lets the test act between the agent's start and its end: the agent
/// touches `ready-<runId>` and waits (bounded) for `go`.
const WAIT_FOR_GO: &str = r#"
touch "$AGENT_OUT/ready-$ORIZU_RUN_ID"
i=0
while [ ! -e "$AGENT_OUT/go" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
"#;

/// `git` in the coordinator's bare repository; trimmed stdout ("" on error).
pub(super) fn bare_git(sb: &Sandbox, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(sb.coordinator.bare_repo())
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .unwrap();
    if !out.status.success() {
        return String::new();
    }
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The tip of branch `name` on the remote ("" when it does not exist).
pub(super) fn tip(sb: &Sandbox, name: &str) -> String {
    bare_git(
        sb,
        &["rev-parse", "--verify", "-q", &format!("refs/heads/{name}")],
    )
}

fn subject(sb: &Sandbox, rev: &str) -> String {
    bare_git(sb, &["log", "-1", "--format=%s", rev])
}

/// Adds a commit to the session branch of the bare repository (someone else
/// pushed meanwhile) and returns it.
pub(super) fn advance_remote(sb: &Sandbox, file: &str) -> String {
    let bare = git2::Repository::open_bare(sb.coordinator.bare_repo()).unwrap();
    let refname = format!("refs/heads/{}", sb.coordinator.branch());
    let parent = bare
        .find_reference(&refname)
        .unwrap()
        .peel_to_commit()
        .unwrap();
    let blob = bare.blob(b"from elsewhere\n").unwrap();
    let mut tb = bare.treebuilder(Some(&parent.tree().unwrap())).unwrap();
    tb.insert(file, blob, 0o100644).unwrap();
    let tree = bare.find_tree(tb.write().unwrap()).unwrap();
    let sig = git2::Signature::now("someone", "someone@example.invalid").unwrap();
    bare.commit(
        Some(&refname),
        &sig,
        &sig,
        "pushed elsewhere",
        &tree,
        &[&parent],
    )
    .unwrap()
    .to_string()
}

pub(super) fn result_of(snap: &Snapshot, run_id: &str) -> Value {
    let finish = snap.run(run_id).unwrap().finish.as_ref().unwrap();
    serde_json::to_value(&finish.result).unwrap()
}

pub(super) fn harvest_events(snap: &Snapshot, run_id: &str) -> Vec<Value> {
    snap.run(run_id)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.kind == "hosted_boot.harvest")
        .map(|e| e.data.clone())
        .collect()
}

/// Index of the last push (`POST …/git-receive-pack`) and of the `finish`
/// of `run_id` among the requests.
fn push_and_finish_positions(snap: &Snapshot, run_id: &str) -> (Option<usize>, usize) {
    let push = snap
        .requests
        .iter()
        .rposition(|r| r.method == "POST" && r.path.ends_with("/git-receive-pack"));
    let finish = snap
        .requests
        .iter()
        .position(|r| r.route == Route::Finish && r.path.contains(&format!("/{run_id}/")))
        .unwrap();
    (push, finish)
}

#[tokio::test]
async fn uncommitted_work_of_a_succeeded_turn_lands_on_the_session_branch() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    // A new file (two lines), a tracked file changed (one line added), a
    // .gitignore (one line) and an ignored file, which must stay behind.
    // And the index lock of a git command killed mid-way.
    let script = sb.script(
        r#"
printf 'one\ntwo\n' > NEW.md
echo 'appended' >> README.md
echo 'build.log' > .gitignore
echo "key $ACME_API_KEY" > build.log
touch .git/index.lock
"#,
    );
    let child = sb.spawn(&script);
    let (_, output) = sb.end_after_seal("run-1", child).await;

    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded");
    let branch = sb.coordinator.branch();
    let head = tip(&sb, &branch);
    assert_eq!(
        result_of(&snap, "run-1"),
        json!({"name": "run-1", "branch": branch, "headSha": head, "pushed": true,
               "commits": 1, "filesChanged": 3, "insertions": 4, "deletions": 0,
               "harvestCommit": head})
    );
    assert_eq!(
        harvest_events(&snap, "run-1"),
        vec![result_of(&snap, "run-1")]
    );
    assert_eq!(
        subject(&sb, &head),
        "run-1: work the agent left uncommitted"
    );
    assert_eq!(
        bare_git(&sb, &["log", "-1", "--format=%an <%ae>", &head]),
        "hosted-boot agent <agent@hosted-boot.invalid>"
    );
    let files = bare_git(&sb, &["ls-tree", "-r", "--name-only", &head]);
    let files: Vec<&str> = files.lines().collect();
    assert_eq!(
        files,
        vec![".gitignore", "NEW.md", "README.md", "src/greeting.txt"]
    );
    let (push, finish) = push_and_finish_positions(&snap, "run-1");
    assert!(push.unwrap() < finish, "the push came after the seal");
    // The ignored file is still in the sandbox, not on the remote.
    assert!(sb.root().join("repo/build.log").exists());

    let secrets = sb.secrets(&[CONNECTOR.1]);
    assert_no_secret(
        "harvest event",
        &serde_json::to_string(&harvest_events(&snap, "run-1")).unwrap(),
        &secrets,
    );
    assert_no_secret(
        "finish.result",
        &result_of(&snap, "run-1").to_string(),
        &secrets,
    );
    assert_no_secret("runner output (trace level)", &output, &secrets);
}

/// Issue 33: a gitlink the agent staged and left uncommitted (`git add` of a
/// nested repository: a commit that exists only in the sandbox) is not
/// committed by the harvest; the rest of the agent's work is.
#[tokio::test]
async fn a_gitlink_the_agent_staged_is_not_committed_by_the_harvest() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  git init -q scaffold
  git -C scaffold -c user.name=a -c user.email=a@example.invalid commit -q --allow-empty -m local
  git add scaffold 2> /dev/null
  git ls-files -s scaffold > "$AGENT_OUT/staged"
  echo kept > KEPT.md
fi
"#,
    );
    let child = sb.spawn(&script);
    let (_, output) = sb.end_after_seal("run-1", child).await;
    assert!(
        sb.read_out("staged").starts_with("160000 "),
        "the agent did not stage a gitlink: {:?}",
        sb.read_out("staged")
    );
    let branch = sb.coordinator.branch();
    let head = tip(&sb, &branch);
    let tree = bare_git(&sb, &["ls-tree", "-r", &head]);
    assert!(!tree.contains("160000"), "a gitlink was pushed: {tree}");
    assert!(tree.contains("KEPT.md"), "{tree}");
    assert!(
        output.contains("gitlinks the agent staged are left as HEAD has them"),
        "{output}"
    );
}

/// Issue 33: gitlinks the agent committed itself are pushed as committed,
/// and those whose commit others cannot fetch are named: a submodule commit
/// the agent did not push (its repository has it, no remote-tracking branch
/// does) and an embedded repository committed with `git add` (no
/// `.gitmodules` entry). A submodule the agent pushed first is not named.
#[tokio::test]
async fn gitlinks_the_agent_committed_to_commits_others_cannot_fetch_are_named() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  G="git -c user.name=a -c user.email=a@example.invalid -c protocol.file.allow=always"
  for n in pushed unpushed; do
    git init -q --bare "$AGENT_OUT/$n.git"
    git init -q "$AGENT_OUT/seed-$n"
    $G -C "$AGENT_OUT/seed-$n" commit -q --allow-empty -m seed
    $G -C "$AGENT_OUT/seed-$n" push -q "$AGENT_OUT/$n.git" HEAD:refs/heads/main
    $G submodule add -q -b main "$AGENT_OUT/$n.git" $n
  done
  $G -C pushed commit -q --allow-empty -m new
  $G -C pushed push -q origin HEAD:main
  $G -C unpushed commit -q --allow-empty -m new
  git -C unpushed rev-parse HEAD > "$AGENT_OUT/unpushed"
  git init -q scaffold
  $G -C scaffold commit -q --allow-empty -m local
  git -C scaffold rev-parse HEAD > "$AGENT_OUT/scaffold"
  $G add pushed unpushed scaffold 2> /dev/null
  $G commit -q -m submodules
  git ls-tree HEAD > "$AGENT_OUT/tree"
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    let committed = sb.read_out("tree");
    assert_eq!(
        committed.matches("160000 commit").count(),
        3,
        "the agent did not commit three gitlinks: {committed}"
    );
    let head = tip(&sb, &sb.coordinator.branch());
    let tree = bare_git(&sb, &["ls-tree", &head]);
    assert_eq!(tree.matches("160000 commit").count(), 3, "{tree}");
    let result = result_of(&snap, "run-1");
    assert_eq!(result["pushed"], true, "{result}");
    assert_eq!(
        result["unpublishedGitlinks"],
        json!([
            {"path": "scaffold", "commit": sb.read_out("scaffold").trim(), "reason": "no_gitmodules_entry"},
            {"path": "unpushed", "commit": sb.read_out("unpushed").trim(), "reason": "submodule_not_pushed"}
        ]),
        "{result}\n{output}"
    );
    assert_eq!(harvest_events(&snap, "run-1"), vec![result.clone()]);
}

/// Issue 33: a directory with its own `.git` (a scaffolder's `git init`)
/// vanished from the harvest with a log line only; a file with an external
/// clean filter (`git-crypt`, transcrypt) was committed in plaintext (libgit2
/// runs no filter). Both are left out and named; the rest is pushed.
#[tokio::test]
async fn a_nested_repository_and_a_clean_filtered_file_are_left_out_and_named() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  git init -q scaffold && echo 'app' > scaffold/app.js
  printf 'secret.env filter=crypt\n' > .gitattributes
  git config filter.crypt.clean 'tr a-z n-za-m'
  git config filter.crypt.smudge 'tr a-z n-za-m'
  echo 'plaintext-value' > secret.env
  echo kept > KEPT.md
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    let head = tip(&sb, &sb.coordinator.branch());
    let files = bare_git(&sb, &["ls-tree", "-r", "--name-only", &head]);
    let files: Vec<&str> = files.lines().collect();
    assert_eq!(
        files,
        vec![".gitattributes", "KEPT.md", "README.md", "src/greeting.txt"],
        "{output}"
    );
    let result = result_of(&snap, "run-1");
    assert_eq!(
        result["skippedFiles"],
        json!([
            {"path": "scaffold", "bytes": 0, "reason": "nested_repository"},
            {"path": "secret.env", "bytes": 16, "reason": "clean_filter"}
        ]),
        "{result}"
    );
    assert_eq!(harvest_events(&snap, "run-1"), vec![result.clone()]);
    // Both stay in the work tree, as the agent left them.
    assert!(sb.root().join("repo/scaffold/app.js").exists());
    assert!(sb.root().join("repo/secret.env").exists());
}

/// Found by a review (issue 33): in a sparse checkout the files outside it
/// are absent from the work tree by design; the harvest staged their
/// deletion and pushed it. A stale lock of the session branch's ref (a
/// `git commit` killed mid-way) failed every harvest. Neither does now.
#[tokio::test]
async fn a_sparse_checkout_and_a_stale_ref_lock_lose_nothing() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  git sparse-checkout set --no-cone '/README.md' 2> /dev/null
  ls src > "$AGENT_OUT/src" 2>&1 || true
  touch ".git/refs/heads/$(git symbolic-ref --short HEAD).lock"
  echo new > NEW.md
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    assert!(
        !sb.read_out("src").contains("greeting"),
        "the sparse checkout did not take src/ out of the work tree"
    );
    let result = result_of(&snap, "run-1");
    assert_eq!(result["pushed"], json!(true), "{result}\n{output}");
    assert_eq!(result["deletions"], json!(0), "{result}");
    let head = tip(&sb, &sb.coordinator.branch());
    let files = bare_git(&sb, &["ls-tree", "-r", "--name-only", &head]);
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        vec!["NEW.md", "README.md", "src/greeting.txt"]
    );
}

/// Found by a review (issue 33): when libgit2 refuses one path (a
/// `.git`-like name) the harvest adds path by path, and a name that is not
/// UTF-8 was then dropped without a word.
#[tokio::test]
async fn a_name_that_is_not_utf8_is_committed_when_another_path_is_refused() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  mkdir 'git~1' && echo x > 'git~1/config'
  echo latin > "$(printf 'caf\351.txt')"
fi
"#,
    );
    let child = sb.spawn(&script);
    let (_, output) = sb.end_after_seal("run-1", child).await;
    let head = tip(&sb, &sb.coordinator.branch());
    let files = bare_git(
        &sb,
        &[
            "-c",
            "core.quotePath=true",
            "ls-tree",
            "-r",
            "--name-only",
            &head,
        ],
    );
    assert!(files.contains(r#""caf\351.txt""#), "{files}\n{output}");
}

/// Found by a review (issue 33): an index libgit2 cannot read (`git
/// update-index --split-index`) failed the harvest's commit, and with it the
/// push of the agent's own commits. They are pushed now, and `pushError`
/// says the work left uncommitted is not.
#[tokio::test]
async fn the_agents_commits_are_pushed_when_its_uncommitted_work_cannot_be() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  echo committed > COMMITTED.md && git add COMMITTED.md
  git -c user.name=a -c user.email=a@example.invalid commit -q -m "agent: committed"
  git update-index --split-index
  echo left > LEFT.md
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    let result = result_of(&snap, "run-1");
    assert_eq!(result["pushed"], json!(true), "{result}\n{output}");
    assert_eq!(
        result["pushError"]["code"],
        json!("harvest_failed"),
        "{result}"
    );
    let head = tip(&sb, &sb.coordinator.branch());
    assert_eq!(result["headSha"], json!(head), "{result}");
    let files = bare_git(&sb, &["ls-tree", "-r", "--name-only", &head]);
    assert_eq!(
        files.lines().collect::<Vec<_>>(),
        vec!["COMMITTED.md", "README.md", "src/greeting.txt"]
    );
    assert!(sb.root().join("repo/LEFT.md").exists());
}

#[tokio::test]
async fn a_commit_the_agent_did_not_push_is_pushed() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
echo change > CHANGE.md
git add CHANGE.md
git commit -q -m "agent change"
git rev-parse HEAD > "$AGENT_OUT/head"
"#,
    );
    let child = sb.spawn(&script);
    sb.end_after_seal("run-1", child).await;
    let agent_head = sb.read_out("head").trim().to_string();
    let branch = sb.coordinator.branch();
    assert_eq!(tip(&sb, &branch), agent_head);
    let result = result_of(&sb.coordinator.snapshot(), "run-1");
    assert_eq!(
        result,
        json!({"name": "run-1", "branch": branch, "headSha": agent_head, "pushed": true,
               "commits": 1, "filesChanged": 1, "insertions": 1, "deletions": 0})
    );
}

#[tokio::test]
async fn a_detached_head_with_a_new_commit_is_pushed_and_the_next_turn_is_on_the_branch() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  git checkout -q --detach
  echo detached > DETACHED.md
  git add DETACHED.md
  git commit -q -m "commit on a detached HEAD"
  git rev-parse HEAD > "$AGENT_OUT/head-run-1"
else
  git rev-parse HEAD > "$AGENT_OUT/head-$ORIZU_RUN_ID"
  git symbolic-ref HEAD > "$AGENT_OUT/symref-$ORIZU_RUN_ID"
fi
"#,
    );
    let child = sb.spawn(&script);
    sb.wait_sealed("run-1").await;
    let next = sb.coordinator.queue_turn("next", None);
    sb.end_after_seal(&next, child).await;
    let branch = sb.coordinator.branch();
    let detached = sb.read_out("head-run-1").trim().to_string();
    assert_eq!(tip(&sb, &branch), detached);
    let result = result_of(&sb.coordinator.snapshot(), "run-1");
    assert_eq!(result["headSha"], json!(detached));
    assert_eq!(result["commits"], json!(1));
    assert!(result.get("recoveryBranch").is_none(), "{result}");
    // The next turn starts on the session branch, at the remote's head.
    assert_eq!(sb.read_out(&format!("head-{next}")).trim(), detached);
    assert_eq!(
        sb.read_out(&format!("symref-{next}")).trim(),
        format!("refs/heads/{branch}")
    );
}

/// An agent that leaves work uncommitted and works until it is stopped.
const LEAVES_WORK_AND_SLEEPS: &str = r#"
echo wip > WIP.md
echo 'half done' >> README.md
record_group > "$AGENT_OUT/pgid"
echo '{"type":"message","text":"working"}'
sleep 1000 &
wait
"#;

async fn wait_working(sb: &Sandbox) {
    sb.wait_event("run-1", "message", |e| e.kind == "message")
        .await;
}

fn assert_wip_pushed_before_the_seal(sb: &Sandbox) {
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "interrupted");
    let branch = sb.coordinator.branch();
    let head = tip(sb, &branch);
    assert_eq!(
        subject(sb, &head),
        "WIP run-1: work in progress (turn interrupted)"
    );
    assert_eq!(bare_git(sb, &["show", &format!("{head}:WIP.md")]), "wip");
    let result = result_of(&snap, "run-1");
    assert_eq!(
        result,
        json!({"name": "run-1", "branch": branch, "headSha": head, "pushed": true,
               "commits": 1, "filesChanged": 2, "insertions": 2, "deletions": 0,
               "harvestCommit": head})
    );
    assert_eq!(harvest_events(&snap, "run-1"), vec![result]);
    let (push, finish) = push_and_finish_positions(&snap, "run-1");
    assert!(push.unwrap() < finish, "the push came after the seal");
}

#[tokio::test]
async fn an_interrupted_turn_gets_a_wip_commit_pushed_before_the_seal() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let child = sb.spawn(&sb.script(LEAVES_WORK_AND_SLEEPS));
    wait_working(&sb).await;
    sb.coordinator.interrupt(Some("run-1")).unwrap();
    sb.end_after_seal("run-1", child).await;
    assert_wip_pushed_before_the_seal(&sb);
}

#[tokio::test]
async fn sigterm_mid_turn_gets_a_wip_commit_pushed_before_the_seal() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let child = sb.spawn(&sb.script(LEAVES_WORK_AND_SLEEPS));
    wait_working(&sb).await;
    signal(child.id().unwrap(), rustix::process::Signal::TERM);
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(143), "{output}");
    assert_wip_pushed_before_the_seal(&sb);
    assert_eq!(
        sb.coordinator.snapshot().status_names(),
        vec!["turn_started", "turn_completed"]
    );
}

#[tokio::test]
async fn when_the_remote_moved_on_the_work_goes_to_a_recovery_branch() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(&format!(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  echo mine > MINE.md
  git add MINE.md
  git commit -q -m "agent work"
  git rev-parse HEAD > "$AGENT_OUT/head-run-1"
  {WAIT_FOR_GO}
  exit 0
fi
git rev-parse HEAD > "$AGENT_OUT/head-$ORIZU_RUN_ID"
ls > "$AGENT_OUT/ls-$ORIZU_RUN_ID"
git status --porcelain > "$AGENT_OUT/status-$ORIZU_RUN_ID"
"#
    ));
    let child = sb.spawn(&script);
    wait_for_file(&sb.out().join("ready-run-1")).await;
    let theirs = advance_remote(&sb, "THEIRS.md");
    std::fs::write(sb.out().join("go"), "").unwrap();
    sb.wait_sealed("run-1").await;
    let next = sb.coordinator.queue_turn("next", None);
    sb.end_after_seal(&next, child).await;

    let branch = sb.coordinator.branch();
    let recovery = format!("{branch}-recovered-run-1");
    let mine = sb.read_out("head-run-1").trim().to_string();
    // Nothing forced: the session branch keeps the other commit; the work is
    // on the recovery branch, which finish.result names.
    assert_eq!(tip(&sb, &branch), theirs);
    assert_eq!(tip(&sb, &recovery), mine);
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded");
    assert_eq!(
        result_of(&snap, "run-1"),
        json!({"name": "run-1", "branch": branch, "headSha": mine, "pushed": true,
               "commits": 1, "filesChanged": 1, "insertions": 1, "deletions": 0,
               "recoveryBranch": recovery})
    );
    // The next turn starts from the remote's head, without the recovered work.
    assert_eq!(sb.read_out(&format!("head-{next}")).trim(), theirs);
    let ls = sb.read_out(&format!("ls-{next}"));
    assert!(ls.contains("THEIRS.md") && !ls.contains("MINE.md"), "{ls}");
    assert_eq!(sb.read_out(&format!("status-{next}")), "");
    assert_eq!(
        result_of(&snap, &next),
        json!({"name": next, "branch": branch, "headSha": theirs, "pushed": true,
               "commits": 0, "filesChanged": 0, "insertions": 0, "deletions": 0})
    );
}

#[tokio::test]
async fn a_restarted_runner_pushes_the_work_left_in_repo_first() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
if [ ! -e "$AGENT_OUT/first-done" ]; then
  touch "$AGENT_OUT/first-done"
  echo committed > COMMITTED.md
  git add COMMITTED.md
  git commit -q -m "agent: committed, not pushed"
  echo left > LEFT.md
  record_group > "$AGENT_OUT/pgid"
  echo '{"type":"message","text":"working"}'
  exec sleep 1000
fi
git rev-parse HEAD > "$AGENT_OUT/head"
git status --porcelain > "$AGENT_OUT/status"
git symbolic-ref HEAD > "$AGENT_OUT/symref"
"#,
    );
    let mut first = sb.spawn(&script);
    wait_working(&sb).await;
    // The sandbox dies: no harvest, no seal.
    first.kill().await.unwrap();
    let _ = first.wait().await;
    let group = sb.read_group("pgid");
    kill_group(&group);
    let branch = sb.coordinator.branch();
    let before = tip(&sb, &branch);
    assert!(sb.coordinator.run("run-1").unwrap().finish.is_none());

    let second = sb.spawn(&script);
    let (_, output) = sb.end_after_seal("run-1", second).await;

    // The work left behind reached the session branch (a fast-forward).
    let head = tip(&sb, &branch);
    assert_eq!(
        subject(&sb, &head),
        "WIP recovered-at-boot: work found in repo/ when the runner restarted"
    );
    assert_eq!(
        subject(&sb, &format!("{head}~1")),
        "agent: committed, not pushed"
    );
    assert_eq!(bare_git(&sb, &["rev-parse", &format!("{head}~2")]), before);
    assert_eq!(bare_git(&sb, &["show", &format!("{head}:LEFT.md")]), "left");
    // Then the turn ran on the remote's head, on the session branch.
    assert_eq!(sb.read_out("head").trim(), head);
    assert_eq!(sb.read_out("status"), "");
    assert_eq!(sb.read_out("symref").trim(), format!("refs/heads/{branch}"));
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded");
    assert_eq!(
        result_of(&snap, "run-1"),
        json!({"name": "run-1", "branch": branch, "headSha": head, "pushed": true,
               "commits": 0, "filesChanged": 0, "insertions": 0, "deletions": 0})
    );
    let boot_harvest = output
        .lines()
        .find(|l| l.contains("harvest done") && l.contains("recovered-at-boot"))
        .unwrap_or_else(|| panic!("no recovered-at-boot harvest in the log:\n{output}"));
    assert!(boot_harvest.contains(&head), "{boot_harvest}");
}

/// An agent that waits for `go`, then leaves a file uncommitted; later turns
/// leave nothing.
fn waits_then_leaves_a_file(sb: &Sandbox) -> PathBuf {
    sb.script(&format!(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  {WAIT_FOR_GO}
  echo kept > KEPT.md
fi
"#
    ))
}

fn git_requests_since(sb: &Sandbox, from: usize) -> Vec<(String, Option<u16>)> {
    sb.coordinator.requests()[from..]
        .iter()
        .filter(|r| r.route == Target::Git)
        .map(|r| (r.method.clone(), r.response_status))
        .collect()
}

#[tokio::test]
async fn a_push_that_keeps_failing_is_reported_retried_three_times_and_never_dropped() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let child = sb.spawn(&waits_then_leaves_a_file(&sb));
    wait_for_file(&sb.out().join("ready-run-1")).await;
    sb.coordinator
        .add_fault(Fault::status(Target::Git, 503).times(1000))
        .unwrap();
    let from = sb.coordinator.requests().len();
    std::fs::write(sb.out().join("go"), "").unwrap();
    let snap = sb.wait_sealed("run-1").await;
    // The turn is not failed by it, and the failure is not silent.
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded");
    let result: HarvestResult = serde_json::from_value(result_of(&snap, "run-1")).unwrap();
    assert!(!result.pushed);
    let error = result.push_error.clone().unwrap();
    assert_eq!(error.code, PushErrorCode::PushFailed, "{error:?}");
    assert!(error.message.contains("after 3 attempts"), "{error:?}");
    assert!(error.message.contains("503"), "{error:?}");
    assert_eq!(
        git_requests_since(&sb, from),
        vec![("GET".to_string(), Some(503)); 3],
        "one advertisement request per attempt"
    );
    assert_eq!(
        harvest_events(&snap, "run-1"),
        vec![serde_json::to_value(&result).unwrap()]
    );
    let kept = result.head_sha.clone().unwrap();
    assert_eq!(result.harvest_commit.as_deref(), Some(kept.as_str()));

    // The next harvest pushes the commit that could not be pushed.
    sb.coordinator.clear_faults();
    let next = sb.coordinator.queue_turn("next", None);
    let (snap, _) = sb.end_after_seal(&next, child).await;
    let branch = sb.coordinator.branch();
    assert_eq!(tip(&sb, &branch), kept);
    assert_eq!(result_of(&snap, &next)["pushed"], json!(true));
    assert_eq!(result_of(&snap, &next)["headSha"], json!(kept));
}

#[tokio::test]
async fn a_push_refused_by_the_server_is_a_verdict_and_not_retried() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let child = sb.spawn(&waits_then_leaves_a_file(&sb));
    wait_for_file(&sb.out().join("ready-run-1")).await;
    sb.coordinator
        .add_fault(Fault::status(Target::Git, 403).times(1000))
        .unwrap();
    let from = sb.coordinator.requests().len();
    std::fs::write(sb.out().join("go"), "").unwrap();
    let snap = sb.wait_sealed("run-1").await;
    sb.coordinator.clear_faults();
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded");
    let result: HarvestResult = serde_json::from_value(result_of(&snap, "run-1")).unwrap();
    assert!(!result.pushed);
    let error = result.push_error.clone().unwrap();
    assert_eq!(error.code, PushErrorCode::PushRejected, "{error:?}");
    assert_eq!(
        git_requests_since(&sb, from),
        vec![("GET".to_string(), Some(403))]
    );
    let secrets = sb.secrets(&[CONNECTOR.1]);
    assert_no_secret(
        "harvest event",
        &serde_json::to_string(&harvest_events(&snap, "run-1")).unwrap(),
        &secrets,
    );
    assert_no_secret(
        "finish.result",
        &result_of(&snap, "run-1").to_string(),
        &secrets,
    );
    assert_no_secret("runner output (trace level)", &output, &secrets);
    // The log line names the code as the wire does, not as Rust's debug text.
    assert!(
        output.contains("harvest: the work is not on the remote")
            && output.contains("push_rejected")
            && !output.contains("PushRejected"),
        "{output}"
    );
    // No line of the runner's own shows Rust's debug text of an Option
    // (`Some(0)`, `signal=Some(2)`): issue 17's message pass.
    for line in output.lines() {
        let Ok(json) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if json["target"]
            .as_str()
            .is_some_and(|t| t.starts_with("hosted_boot"))
        {
            assert!(!line.contains("Some("), "debug text in a log line: {line}");
        }
    }
}

/// The time bound, through the library: a git server slower than the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harvest_that_outlives_its_bound_reports_a_timeout_with_what_it_did() {
    hosted_boot::tls::install_crypto_provider();
    let root = tempfile::tempdir().unwrap();
    let coord = Coordinator::start(CoordinatorOptions {
        workdir: Some(root.path().join("coordinator")),
        ..CoordinatorOptions::default()
    })
    .await
    .unwrap();
    let session = hosted_boot_test_support::file_mode_session(root.path(), &coord, 0.05);
    let helper = credential_helper_command(
        Path::new(env!("CARGO_BIN_EXE_hosted-boot")),
        &session.context_path(),
    )
    .unwrap();
    let http = HttpContext {
        client: hosted_boot::tls::http_client(None).unwrap(),
        runtime: tokio::runtime::Handle::current(),
        request_timeout: Duration::from_secs(10),
        redactor: hosted_boot::redact::Redactor::new(),
        stall: Duration::from_secs(30),
        broker: None,
    };
    let prepared = prepare_repo_async(RepoSpec {
        root: root.path().to_path_buf(),
        remote_url: coord.clone_url(),
        branch: coord.branch(),
        credential_helper: helper.clone(),
        http: http.clone(),
        retry: hosted_boot::client::Policy::ONCE,
        owner: None,
        git_mirror: None,
    })
    .await
    .unwrap();
    std::fs::write(prepared.path.join("SLOW.md"), "slow\n").unwrap();
    coord
        .add_fault(Fault::delay(Target::Git, Duration::from_secs(20)).times(10))
        .unwrap();
    let harvester = Harvester {
        repo_dir: prepared.path.clone(),
        remote_url: coord.clone_url(),
        branch: coord.branch(),
        credential_helper: helper,
        http,
        time_scale: 1.0,
        max_file_size: None,
        owner: None,
    };
    let started = std::time::Instant::now();
    let result = harvester
        .harvest(HarvestJob {
            name: "run-9".into(),
            outcome: None,
            start: None,
            bound: Duration::from_millis(1500),
        })
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the bound was not kept: {:?}",
        started.elapsed()
    );
    assert!(!result.pushed);
    assert_eq!(
        result.push_error.as_ref().map(|e| e.code),
        Some(PushErrorCode::HarvestTimeout),
        "{result:?}"
    );
    // What was done by then is reported: the commit of the work left.
    let head = result.head_sha.clone().unwrap();
    assert_eq!(result.harvest_commit.as_deref(), Some(head.as_str()));
    let repo = git2::Repository::open(&prepared.path).unwrap();
    assert_eq!(
        repo.head().unwrap().target().unwrap().to_string(),
        head,
        "the commit is kept in repo/ for the next harvest"
    );
    coord.clear_faults();
    coord.shutdown().await;
}

/// The demo (README's main command) shows the harvest of each turn, the
/// interrupted one included, before its seal.
#[tokio::test]
async fn the_demo_timeline_shows_a_harvest_line_for_each_turn() {
    let text = super::support::demo_stdout(&[]).await;
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    for (run, finish) in [
        ("run-1", "succeeded"),
        ("run-2", "succeeded"),
        ("run-3", "interrupted"),
    ] {
        let harvest = lines
            .iter()
            .position(|l| l.contains(&format!("harvest     {run} ")))
            .unwrap_or_else(|| panic!("no harvest line for {run}:\n{text}"));
        let sealed = lines
            .iter()
            .position(|l| l.contains(&format!("finish      {run} {finish}")))
            .unwrap_or_else(|| panic!("no finish line for {run}:\n{text}"));
        assert!(harvest < sealed, "{text}");
        assert!(!lines[harvest].contains("NOT pushed"), "{text}");
    }
    // The work the interrupted turn left is on the session branch as WIP.
    assert!(
        text.contains("WIP run-3: work in progress (turn interrupted)"),
        "{text}"
    );
}

/// Ctrl-C or SIGTERM during the demo stops the runner as a sandbox's stop
/// does and removes the demo's directory: nothing of it is left running,
/// nothing left in the temporary directory (it used to exit by the
/// signal's default action and leave both).
#[tokio::test]
async fn a_demo_stopped_by_a_signal_leaves_no_process_and_no_directory() {
    use tokio::io::AsyncBufReadExt;
    for stop in [rustix::process::Signal::TERM, rustix::process::Signal::INT] {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(coordinator_bin())
            .arg("demo")
            .env("TMPDIR", tmp.path())
            .env_remove("HOSTED_BOOT_ROOT")
            .env_remove("HOSTED_BOOT_LOG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // Stopped once the runner runs its first turn.
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                if line.contains("turn_started") {
                    return;
                }
            }
            panic!("the demo ended before its first turn");
        })
        .await
        .expect("no turn_started line");
        signal(child.id().unwrap(), stop);
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("the demo did not stop")
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stop:?}: {stderr}");
        assert!(
            stderr.contains("stopped by a signal; the runner exited"),
            "{stop:?}: {stderr}"
        );
        super::support::assert_nothing_left(tmp.path(), &format!("{stop:?}"));
    }
}

/// The demo streams its timeline as the coordinator sees each request: its
/// first timeline line is printed while the runner still runs (its status
/// file not yet at the final phase), not all at once at the end. It closes
/// with a summary counted from the coordinator's record, plain text when
/// stdout is not a terminal.
#[tokio::test]
async fn the_demo_streams_its_timeline_before_the_session_ends() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("sandbox");
    let mut child = tokio::process::Command::new(coordinator_bin())
        .arg("demo")
        .env("HOSTED_BOOT_ROOT", &root)
        .env_remove("HOSTED_BOOT_LOG")
        .env_remove("NO_COLOR")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut text = String::new();
    let mut phase_at_first_line = None;
    let read_all = async {
        let mut in_timeline = false;
        while let Some(line) = lines.next_line().await.unwrap() {
            text.push_str(&line);
            text.push('\n');
            if line.starts_with("timeline") {
                in_timeline = true;
            } else if in_timeline && phase_at_first_line.is_none() {
                let status = std::fs::read(root.join(".hosted-boot/status.json")).unwrap();
                let json: serde_json::Value = serde_json::from_slice(&status).unwrap();
                phase_at_first_line = Some(json["phase"].as_str().unwrap_or("").to_string());
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), read_all)
        .await
        .expect("the demo did not finish");
    let status = child.wait().await.unwrap();
    assert!(status.success(), "{text}");
    let phase = phase_at_first_line.unwrap_or_else(|| panic!("no timeline line:\n{text}"));
    assert_ne!(
        phase, "exited",
        "the first timeline line came after the runner exited:\n{text}"
    );
    assert!(
        text.lines().any(|l| l
            .starts_with("summary 3 turns (2 succeeded, 1 interrupted), 3 commits pushed, ")
            && l.contains(" events, 0 secrets found in what the coordinator received, ")),
        "{text}"
    );
    assert!(text.contains("(turn took "), "{text}");
    assert!(
        text.contains("; interrupt flag to agent stopped: ") && text.contains(" ms, by SIGINT"),
        "{text}"
    );
    assert!(!text.contains('\x1b'), "no colour off a terminal:\n{text}");
}

/// Runs `hosted-boot-coordinator demo` with its stdout and stderr on a pseudo-terminal
/// (python3's `pty.fork`) when `tty`, else piped; returns what it wrote.
async fn demo_output(tty: bool, no_color: bool) -> String {
    const UNDER_PTY: &str = r#"
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
out = b""
while True:
    try:
        data = os.read(fd, 65536)
    except OSError:
        break
    if not data:
        break
    out += data
_, status = os.waitpid(pid, 0)
sys.stdout.buffer.write(out)
sys.exit(os.waitstatus_to_exitcode(status))
"#;
    let bin = coordinator_bin();
    let mut cmd = if tty {
        let mut c = tokio::process::Command::new("python3");
        c.args(["-c", UNDER_PTY]).arg(&bin).arg("demo");
        c
    } else {
        let mut c = tokio::process::Command::new(&bin);
        c.arg("demo");
        c
    };
    cmd.env_remove("HOSTED_BOOT_LOG")
        .env_remove("NO_COLOR")
        .env("TERM", "xterm-256color")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    if no_color {
        cmd.env("NO_COLOR", "1");
    }
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("the demo did not finish")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "tty {tty}, NO_COLOR {no_color}:\n{text}"
    );
    assert!(
        without_sgr(&text).contains("summary 3 turns"),
        "tty {tty}, NO_COLOR {no_color}:\n{text:?}"
    );
    text
}

/// `text` without its SGR sequences (`ESC [ digits ; … m`).
fn without_sgr(text: &str) -> String {
    let mut out = String::new();
    for (i, part) in text.split("\x1b[").enumerate() {
        let params = part
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == ';')
            .count();
        match part.chars().nth(params) {
            Some('m') if i > 0 => out.extend(part.chars().skip(params + 1)),
            _ if i > 0 => {
                out.push_str("\x1b[");
                out.push_str(part);
            }
            _ => out.push_str(part),
        }
    }
    out
}

/// Whether `text` holds an ANSI colour sequence (SGR: `ESC [ digits ; … m`).
fn has_colour(text: &str) -> bool {
    without_sgr(text) != text
}

/// The demo's colour: on a pseudo-terminal it is in colour; with
/// `NO_COLOR` set on the same terminal, and piped, there is none (neither
/// in the demo's lines nor in any log line).
#[tokio::test]
async fn the_demo_is_in_colour_on_a_terminal_and_plain_with_no_color_or_piped() {
    let (tty, tty_no_color, piped) = tokio::join!(
        demo_output(true, false),
        demo_output(true, true),
        demo_output(false, false)
    );
    assert!(has_colour(&tty), "no colour on a terminal:\n{tty:?}");
    assert!(
        !has_colour(&tty_no_color),
        "colour despite NO_COLOR:\n{tty_no_color:?}"
    );
    assert!(!has_colour(&piped), "colour when piped:\n{piped:?}");
    assert!(!has_colour("plain \x1b[2K erase") && has_colour("\x1b[1;32mok\x1b[0m"));
    assert_eq!(without_sgr("a\x1b[1mb\x1b[0mc \x1b[2K"), "abc \x1b[2K");
    // The same demo, whatever the terminal: only the colour differs.
    for text in [&tty, &tty_no_color] {
        assert!(text.contains("\r\n"), "not through a terminal:\n{text:?}");
    }
}

#[tokio::test]
async fn a_failed_turn_gets_its_work_pushed_before_the_seal() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script("echo partial > FAIL.md\nexit 3");
    let (status, output) = finish(sb.spawn(&script)).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "failed");
    let branch = sb.coordinator.branch();
    let head = tip(&sb, &branch);
    assert_eq!(
        subject(&sb, &head),
        "WIP run-1: work in progress (turn failed)"
    );
    assert_eq!(
        result_of(&snap, "run-1"),
        json!({"name": "run-1", "branch": branch, "headSha": head, "pushed": true,
               "commits": 1, "filesChanged": 1, "insertions": 1, "deletions": 0,
               "harvestCommit": head})
    );
    let (push, finish) = push_and_finish_positions(&snap, "run-1");
    assert!(push.unwrap() < finish, "the push came after the seal");
}

/// A run that fails before its own harvest (here: `turn_started` is never
/// acknowledged) is harvested on the fatal path when `repo/` holds work: a
/// commit an earlier harvest could not push.
#[tokio::test]
async fn the_fatal_path_harvests_what_an_earlier_failed_push_left() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let child = sb.spawn(&waits_then_leaves_a_file(&sb));
    wait_for_file(&sb.out().join("ready-run-1")).await;
    sb.coordinator
        .add_fault(Fault::status(Target::Git, 503).times(1000))
        .unwrap();
    std::fs::write(sb.out().join("go"), "").unwrap();
    let snap = sb.wait_sealed("run-1").await;
    let kept = result_of(&snap, "run-1")["headSha"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(result_of(&snap, "run-1")["pushed"], json!(false));
    sb.coordinator
        .wait_for(WAIT, |s| {
            s.status_names() == vec!["turn_started", "turn_completed"]
        })
        .await
        .unwrap();
    sb.coordinator.clear_faults();
    sb.coordinator
        .add_fault(Fault::status(Route::BootStatus, 503).times(5))
        .unwrap();
    let next = sb.coordinator.queue_turn("next", None);
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(1), "{output}");

    let snap = sb.coordinator.snapshot();
    let run = snap.run(&next).unwrap();
    assert_eq!(run.status, "failed");
    let seal = run.finish.as_ref().unwrap();
    assert_eq!(
        serde_json::to_value(seal.error.as_ref().unwrap().code).unwrap(),
        json!("runner_error")
    );
    let branch = sb.coordinator.branch();
    assert_eq!(tip(&sb, &branch), kept);
    assert_eq!(
        result_of(&snap, &next),
        json!({"name": next, "branch": branch, "headSha": kept, "pushed": true,
               "commits": 1, "filesChanged": 1, "insertions": 1, "deletions": 0})
    );
}

// ---------------------------------------------------------------------------
// Before a turn (PROTOCOL.md 4.1 step 3, 4.5 "Before a turn"): the workspace
// moves to the remote's session branch, whatever the user pushed meanwhile.

/// Records where the turn started, says something, leaves a file.
const RECORDS_START_AND_LEAVES_A_FILE: &str = r#"
git rev-parse HEAD > "$AGENT_OUT/head-$ORIZU_RUN_ID"
git symbolic-ref HEAD > "$AGENT_OUT/symref-$ORIZU_RUN_ID"
echo '{"type":"message","text":"working"}'
echo "$ORIZU_RUN_ID" > "WORK-$ORIZU_RUN_ID.md"
"#;

/// Makes a commit on `parent` in the bare repository and sets the session
/// branch to it, forced (the user pushed with `--force`, or a plain push
/// when `parent` is the tip). Returns the commit.
fn user_push(sb: &Sandbox, parent: &str, file: &str) -> String {
    let bare = git2::Repository::open_bare(sb.coordinator.bare_repo()).unwrap();
    let refname = format!("refs/heads/{}", sb.coordinator.branch());
    let parent = bare
        .find_commit(git2::Oid::from_str(parent).unwrap())
        .unwrap();
    let blob = bare.blob(b"from the user\n").unwrap();
    let mut tb = bare.treebuilder(Some(&parent.tree().unwrap())).unwrap();
    tb.insert(file, blob, 0o100644).unwrap();
    let tree = bare.find_tree(tb.write().unwrap()).unwrap();
    let sig = git2::Signature::now("user", "user@example.invalid").unwrap();
    let commit = bare
        .commit(None, &sig, &sig, "pushed by the user", &tree, &[&parent])
        .unwrap();
    bare.reference(&refname, commit, true, "the user pushed")
        .unwrap();
    commit.to_string()
}

/// The recovery branches of the bare repository.
fn recovery_branches(sb: &Sandbox) -> Vec<String> {
    bare_git(sb, &["for-each-ref", "--format=%(refname)", "refs/heads/"])
        .lines()
        .filter(|r| r.contains("-recovered-"))
        .map(str::to_string)
        .collect()
}

fn sync_events(snap: &Snapshot, run_id: &str) -> Vec<Value> {
    snap.run(run_id)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.kind == "hosted_boot.workspace_sync")
        .map(|e| e.data.clone())
        .collect()
}

/// The workspace_sync event of `run_id` comes before the agent's first
/// event (the sync is done before the agent starts).
fn assert_synced_before_the_agent(snap: &Snapshot, run_id: &str) {
    let events = &snap.run(run_id).unwrap().events;
    let sync = events
        .iter()
        .position(|e| e.kind == "hosted_boot.workspace_sync")
        .unwrap_or_else(|| panic!("no workspace_sync event in {run_id}: {events:?}"));
    let agent = events.iter().position(|e| e.kind == "message").unwrap();
    assert!(sync < agent, "{events:?}");
}

#[tokio::test]
async fn a_push_by_the_user_between_turns_is_where_the_next_turn_starts() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let child = sb.spawn(&sb.script(RECORDS_START_AND_LEAVES_A_FILE));
    sb.wait_sealed("run-1").await;
    let branch = sb.coordinator.branch();
    let first = tip(&sb, &branch);
    assert_eq!(
        subject(&sb, &first),
        "run-1: work the agent left uncommitted"
    );
    // The user pushes on top of the session branch between the turns.
    let users = user_push(&sb, &first, "USER.md");
    let next = sb.coordinator.queue_turn("next", None);
    let (snap, _) = sb.end_after_seal(&next, child).await;

    // The turn started at the user's commit, on the session branch.
    assert_eq!(sb.read_out(&format!("head-{next}")).trim(), users);
    assert_eq!(
        sb.read_out(&format!("symref-{next}")).trim(),
        format!("refs/heads/{branch}")
    );
    // Its work landed on the session branch, on top of the user's commit,
    // and nothing went to a recovery branch.
    let head = tip(&sb, &branch);
    assert_eq!(bare_git(&sb, &["rev-parse", &format!("{head}~1")]), users);
    assert_eq!(recovery_branches(&sb), Vec::<String>::new());
    assert_eq!(
        result_of(&snap, &next),
        json!({"name": next, "branch": branch, "headSha": head, "pushed": true,
               "commits": 1, "filesChanged": 1, "insertions": 1, "deletions": 0,
               "harvestCommit": head})
    );
    assert_eq!(
        sync_events(&snap, &next),
        vec![
            json!({"branch": branch, "outcome": "fast_forward", "localSha": first,
                    "remoteSha": users, "startSha": users})
        ]
    );
    assert_synced_before_the_agent(&snap, &next);
}

#[tokio::test]
async fn commits_a_force_push_discarded_are_not_pushed_back() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let child = sb.spawn(&sb.script(RECORDS_START_AND_LEAVES_A_FILE));
    sb.wait_sealed("run-1").await;
    let branch = sb.coordinator.branch();
    let discarded = tip(&sb, &branch);
    let base = bare_git(&sb, &["rev-parse", &format!("{discarded}~1")]);
    // The user force-pushes the session branch back before run-1's commit,
    // with a commit of their own.
    let users = user_push(&sb, &base, "USER.md");
    let next = sb.coordinator.queue_turn("next", None);
    let (snap, _) = sb.end_after_seal(&next, child).await;

    // The turn started at the user's commit; its work is on the session
    // branch on top of it.
    assert_eq!(sb.read_out(&format!("head-{next}")).trim(), users);
    let head = tip(&sb, &branch);
    assert_eq!(bare_git(&sb, &["rev-parse", &format!("{head}~1")]), users);
    // The discarded commit is on no branch of the remote: not pushed back,
    // not to a recovery branch either.
    assert_eq!(recovery_branches(&sb), Vec::<String>::new());
    assert_eq!(
        bare_git(&sb, &["for-each-ref", "--contains", &discarded]),
        ""
    );
    assert!(result_of(&snap, &next).get("recoveryBranch").is_none());
    // The event says so, and the commit stays in repo/ on a local ref.
    let discarded_ref = format!("refs/hosted-boot/discarded/{next}");
    assert_eq!(
        sync_events(&snap, &next),
        vec![
            json!({"branch": branch, "outcome": "reset", "localSha": discarded,
                    "remoteSha": users, "startSha": users,
                    "discardedRef": discarded_ref, "discardedCommits": [discarded],
                    "discardedCount": 1})
        ]
    );
    assert_synced_before_the_agent(&snap, &next);
    let local = std::process::Command::new("git")
        .arg("-C")
        .arg(sb.root().join("repo"))
        .args(["rev-parse", &discarded_ref])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&local.stdout).trim(), discarded);
}

#[tokio::test]
async fn a_fetch_that_fails_before_a_turn_is_a_warning_and_the_turn_runs() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(&format!(
        r#"
if [ "$ORIZU_RUN_ID" != run-1 ]; then
  {WAIT_FOR_GO}
fi
{RECORDS_START_AND_LEAVES_A_FILE}
"#
    ));
    let child = sb.spawn(&script);
    sb.wait_sealed("run-1").await;
    let branch = sb.coordinator.branch();
    let first = tip(&sb, &branch);
    sb.coordinator
        .add_fault(Fault::status(Target::Git, 503).times(1000))
        .unwrap();
    let next = sb.coordinator.queue_turn("next", None);
    // The agent starts although the fetch failed; the git server heals
    // before the turn's harvest.
    wait_for_file(&sb.out().join(format!("ready-{next}"))).await;
    sb.coordinator.clear_faults();
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (snap, output) = sb.end_after_seal(&next, child).await;

    assert_eq!(snap.run(&next).unwrap().status, "succeeded");
    assert_eq!(sb.read_out(&format!("head-{next}")).trim(), first);
    // The sync's log lines name outcome and code as the wire does.
    assert!(
        output.contains("the turn starts from the local HEAD")
            && output.contains("fetch_failed")
            && !output.contains("FetchFailed")
            && !output.contains("KeptLocal")
            && !output.contains("UpToDate"),
        "{output}"
    );
    let events = sync_events(&snap, &next);
    assert_eq!(events.len(), 1, "{events:?}");
    let event = &events[0];
    assert_eq!(event["outcome"], json!("kept_local"), "{event}");
    assert_eq!(event["localSha"], json!(first), "{event}");
    assert_eq!(event["startSha"], json!(first), "{event}");
    assert_eq!(event["remoteSha"], Value::Null, "{event}");
    assert_eq!(event["warning"]["code"], json!("fetch_failed"), "{event}");
    let message = event["warning"]["message"].as_str().unwrap();
    assert!(message.contains("503"), "{message}");
    assert_synced_before_the_agent(&snap, &next);
    // The harvest reconciles as ever: the turn's work is on the branch.
    let head = tip(&sb, &branch);
    assert_eq!(bare_git(&sb, &["rev-parse", &format!("{head}~1")]), first);
    assert_eq!(result_of(&snap, &next)["pushed"], json!(true));
}

#[tokio::test]
async fn local_work_the_remote_lacks_goes_to_a_recovery_branch_before_the_turn() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(&format!(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  {WAIT_FOR_GO}
fi
{RECORDS_START_AND_LEAVES_A_FILE}
"#
    ));
    let child = sb.spawn(&script);
    let branch = sb.coordinator.branch();
    let base = tip(&sb, &branch);
    // run-1's push fails: its commit stays in repo/ only.
    wait_for_file(&sb.out().join("ready-run-1")).await;
    sb.coordinator
        .add_fault(Fault::status(Target::Git, 503).times(1000))
        .unwrap();
    std::fs::write(sb.out().join("go"), "").unwrap();
    let snap = sb.wait_sealed("run-1").await;
    sb.coordinator.clear_faults();
    let unpushed = result_of(&snap, "run-1")["headSha"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(result_of(&snap, "run-1")["pushed"], json!(false));
    // Meanwhile the user pushed to the session branch.
    let users = user_push(&sb, &base, "USER.md");
    let next = sb.coordinator.queue_turn("next", None);
    let (snap, _) = sb.end_after_seal(&next, child).await;

    // The unpushed commit went to a recovery branch before the turn, which
    // started from the user's commit and pushed its work onto it.
    let recovery = format!("{branch}-recovered-before-{next}");
    assert_eq!(tip(&sb, &recovery), unpushed);
    assert_eq!(sb.read_out(&format!("head-{next}")).trim(), users);
    assert_eq!(
        sync_events(&snap, &next),
        vec![
            json!({"branch": branch, "outcome": "reset", "localSha": unpushed,
                    "remoteSha": users, "startSha": users,
                    "recoveryBranch": recovery})
        ]
    );
    let head = tip(&sb, &branch);
    assert_eq!(bare_git(&sb, &["rev-parse", &format!("{head}~1")]), users);
    assert!(result_of(&snap, &next).get("recoveryBranch").is_none());
}

// ---------------------------------------------------------------------------
// The size guard (PROTOCOL.md 4.5 step 1 and "Files over the size limit"):
// the coordinator's git server refuses a push that brings a file over 1 MiB,
// as GitHub refuses files over 100 MiB; the runner's limit is set to match.

pub(super) const LIMIT: u64 = 1024 * 1024;
pub(super) const BIG: u64 = 2_000_000;

pub(super) fn spawn_with_limit(sb: &Sandbox, script: &Path) -> tokio::process::Child {
    sb.runner(script)
        .env("HOSTED_BOOT_HARVEST_MAX_FILE_SIZE", "1MiB")
        .spawn()
        .unwrap()
}

pub(super) fn files_at(sb: &Sandbox, rev: &str) -> Vec<String> {
    bare_git(sb, &["ls-tree", "-r", "--name-only", rev])
        .lines()
        .map(str::to_string)
        .collect()
}

/// Issue 33: a merge the agent left conflicted on a file over the size
/// limit kept its conflict entries in the index (the harvest leaves the
/// file out), so the harvest's tree failed ("not fully merged") and none of
/// the turn's work was pushed, at every later harvest too. The conflicted
/// path stays as HEAD has it, is named, and the rest is pushed.
#[tokio::test]
async fn a_conflict_on_a_file_the_harvest_leaves_out_does_not_block_the_rest() {
    let sb = Sandbox::start(CoordinatorOptions {
        git_max_file_size: Some(LIMIT),
        ..CoordinatorOptions::default()
    })
    .await;
    let script = sb.script(&format!(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  g() {{ git -c user.name=a -c user.email=a@example.invalid "$@"; }}
  printf 'base\n' > data.txt && git add data.txt && g commit -qm base
  git checkout -q -b side
  head -c {BIG} /dev/zero | tr '\0' x > data.txt && g commit -qam side
  git checkout -q -
  printf 'ours\n' > data.txt && g commit -qam ours
  g merge -q side > /dev/null 2>&1 || true
  git ls-files -u > "$AGENT_OUT/unmerged"
  echo other > OTHER.md
fi
"#
    ));
    let child = spawn_with_limit(&sb, &script);
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    assert!(
        !sb.read_out("unmerged").is_empty(),
        "the agent's merge did not conflict"
    );
    let result = result_of(&snap, "run-1");
    assert_eq!(result["pushed"], json!(true), "{result}\n{output}");
    let head = tip(&sb, &sb.coordinator.branch());
    assert_eq!(
        files_at(&sb, &head),
        vec!["OTHER.md", "README.md", "data.txt", "src/greeting.txt"]
    );
    assert_eq!(
        bare_git(&sb, &["show", &format!("{head}:data.txt")]),
        "ours"
    );
    let skipped = result["skippedFiles"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(skipped.iter().any(|s| s["path"] == "data.txt"), "{result}");
}

#[tokio::test]
async fn a_file_over_the_size_limit_is_left_out_named_and_later_work_is_pushed() {
    let sb = Sandbox::start(CoordinatorOptions {
        git_max_file_size: Some(LIMIT),
        ..CoordinatorOptions::default()
    })
    .await;
    let script = sb.script(&format!(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  head -c {BIG} /dev/zero > BIG.bin
  echo small > SMALL.md
else
  echo two > TWO.md
fi
"#
    ));
    let child = spawn_with_limit(&sb, &script);
    let snap = sb.wait_sealed("run-1").await;
    let branch = sb.coordinator.branch();
    let first = tip(&sb, &branch);
    // The small file is on the session branch, the big one is not; the
    // report names it; it stays in the sandbox's work tree.
    assert_eq!(
        result_of(&snap, "run-1"),
        json!({"name": "run-1", "branch": branch, "headSha": first, "pushed": true,
               "commits": 1, "filesChanged": 1, "insertions": 1, "deletions": 0,
               "harvestCommit": first,
               "skippedFiles": [{"path": "BIG.bin", "bytes": BIG}]})
    );
    assert_eq!(
        harvest_events(&snap, "run-1"),
        vec![result_of(&snap, "run-1")]
    );
    assert_eq!(
        files_at(&sb, &first),
        vec!["README.md", "SMALL.md", "src/greeting.txt"]
    );
    assert_eq!(
        std::fs::metadata(sb.root().join("repo/BIG.bin"))
            .unwrap()
            .len(),
        BIG
    );

    // The next turn's work is pushed too: the session is not blocked.
    let next = sb.coordinator.queue_turn("next", None);
    let (snap, _) = sb.end_after_seal(&next, child).await;
    let head = tip(&sb, &branch);
    assert_eq!(bare_git(&sb, &["rev-parse", &format!("{head}~1")]), first);
    assert_eq!(
        files_at(&sb, &head),
        vec!["README.md", "SMALL.md", "TWO.md", "src/greeting.txt"]
    );
    let result = result_of(&snap, &next);
    assert_eq!(result["pushed"], json!(true), "{result}");
    assert_eq!(result["headSha"], json!(head), "{result}");
    // Still in the work tree, still left out, still named.
    assert_eq!(
        result["skippedFiles"],
        json!([{"path": "BIG.bin", "bytes": BIG}]),
        "{result}"
    );
}

#[tokio::test]
async fn a_file_over_the_size_limit_the_agent_committed_is_left_out_of_the_push() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // The limit through the dev API (PROTOCOL.md section 6).
    let answer = hosted_boot::tls::http_client(None)
        .unwrap()
        .post(format!("{}dev/git", sb.coordinator.base_url()))
        .json(&json!({"maxFileSize": LIMIT}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(
        answer.json::<Value>().await.unwrap(),
        json!({"maxFileSize": LIMIT})
    );
    let script = sb.script(&format!(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  head -c {BIG} /dev/zero > BIG.bin
  echo small > SMALL.md
  git add -A
  git commit -q -m "agent: a big file and a small one"
  git rev-parse HEAD > "$AGENT_OUT/head-run-1"
else
  echo two > TWO.md
fi
"#
    ));
    let child = spawn_with_limit(&sb, &script);
    let snap = sb.wait_sealed("run-1").await;
    let branch = sb.coordinator.branch();
    let first = tip(&sb, &branch);
    let agents = sb.read_out("head-run-1").trim().to_string();
    // What was pushed is the agent's work without the big file; the agent's
    // own commit stays in repo/ on a local ref, and the report says so.
    assert_ne!(first, agents);
    assert_eq!(
        files_at(&sb, &first),
        vec!["README.md", "SMALL.md", "src/greeting.txt"]
    );
    assert_eq!(
        subject(&sb, &first),
        "run-1: the agent's commits without the files over the size limit"
    );
    let oversized_ref = "refs/hosted-boot/oversized/run-1";
    assert_eq!(
        result_of(&snap, "run-1"),
        json!({"name": "run-1", "branch": branch, "headSha": first, "pushed": true,
               "commits": 1, "filesChanged": 1, "insertions": 1, "deletions": 0,
               "skippedFiles": [{"path": "BIG.bin", "bytes": BIG}],
               "oversizedRef": oversized_ref})
    );
    let local = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(sb.root().join("repo"))
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(local(&["rev-parse", oversized_ref]), agents);
    assert_eq!(
        std::fs::metadata(sb.root().join("repo/BIG.bin"))
            .unwrap()
            .len(),
        BIG
    );

    let next = sb.coordinator.queue_turn("next", None);
    let (snap, _) = sb.end_after_seal(&next, child).await;
    let head = tip(&sb, &branch);
    assert_eq!(bare_git(&sb, &["rev-parse", &format!("{head}~1")]), first);
    assert!(files_at(&sb, &head).contains(&"TWO.md".to_string()));
    assert_eq!(result_of(&snap, &next)["pushed"], json!(true));
}

/// A git host whose limit is below the runner's refuses the push; the
/// report says why, in the server's words.
#[tokio::test]
async fn a_push_the_host_refuses_for_a_large_file_says_why() {
    let sb = Sandbox::start(CoordinatorOptions {
        git_max_file_size: Some(LIMIT),
        ..CoordinatorOptions::default()
    })
    .await;
    let script = sb.script(&format!("head -c {BIG} /dev/zero > BIG.bin"));
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let result: HarvestResult = serde_json::from_value(result_of(&snap, "run-1")).unwrap();
    assert!(!result.pushed);
    let error = result.push_error.unwrap();
    assert_eq!(error.code, PushErrorCode::PushRejected, "{error:?}");
    assert!(
        error
            .message
            .contains("files over the limit of 1048576 bytes")
            && error.message.contains("BIG.bin"),
        "{error:?}"
    );
}

/// Issue 33: a host that checks what it receives (`receive.fsckObjects`)
/// refuses a malformed commit of the agent's by failing the unpack, not a
/// ref: a verdict (`push_rejected`, once, in the server's words), not a
/// transport failure retried and reported without a reason.
#[tokio::test]
async fn a_push_the_host_refuses_at_unpack_is_rejected_in_its_words() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let set = std::process::Command::new("git")
        .arg("-C")
        .arg(sb.coordinator.bare_repo())
        .args(["config", "receive.fsckObjects", "true"])
        .status()
        .unwrap();
    assert!(set.success());
    let script = sb.script(
        r#"
tree=$(git write-tree)
parent=$(git rev-parse HEAD)
bad=$(printf 'tree %s\nparent %s\nauthor a<a@example.invalid> 1 +0000\ncommitter a <a@example.invalid> 1 +0000\n\nno space before the email\n' "$tree" "$parent" | git hash-object -t commit -w --literally --stdin)
git update-ref HEAD "$bad"
"#,
    );
    let child = sb.spawn(&script);
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    let result: HarvestResult = serde_json::from_value(result_of(&snap, "run-1")).unwrap();
    assert!(!result.pushed, "{output}");
    let error = result.push_error.unwrap();
    assert_eq!(
        error.code,
        PushErrorCode::PushRejected,
        "{error:?}\n{output}"
    );
    assert!(
        error.message.contains("missingSpaceBeforeEmail"),
        "{error:?}"
    );
    let pushes = snap
        .requests
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/git-receive-pack"))
        .count();
    assert_eq!(pushes, 1, "a refusal is not retried");
}

// ---------------------------------------------------------------------------
// Breaks found in review (review/losses).

/// The refs of `repo/` that contain `commit` (reflogs excluded).
fn local_refs_containing(sb: &Sandbox, commit: &str) -> String {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(sb.root().join("repo"))
        .args(["for-each-ref", "--contains", commit, "--format=%(refname)"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The agent commits on the session branch, then moves `HEAD` elsewhere
/// (a detached look at the commit before). The commit is on no remote
/// branch; the harvest's "bring the local session branch to the remote's"
/// must not drop it (PROTOCOL.md 4.5 step 3: never drop a commit that was
/// not pushed somewhere).
#[tokio::test]
async fn break_a_commit_left_on_the_session_branch_with_head_elsewhere_is_not_dropped() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  echo kept > KEPT.md
  git add KEPT.md
  git commit -q -m "agent: work on the session branch"
  git rev-parse HEAD > "$AGENT_OUT/commit"
  git checkout -q --detach HEAD~1
fi
"#,
    );
    let child = sb.spawn(&script);
    sb.wait_sealed("run-1").await;
    let next = sb.coordinator.queue_turn("next", None);
    sb.end_after_seal(&next, child).await;
    let commit = sb.read_out("commit").trim().to_string();
    let on_remote = bare_git(&sb, &["for-each-ref", "--contains", &commit]);
    let local = local_refs_containing(&sb, &commit);
    assert!(
        !on_remote.is_empty(),
        "the agent's commit {commit} is on no branch of the remote; refs of repo/ holding it: {local:?}"
    );
}

/// An ignored file of the agent's (never harvested: PROTOCOL.md 4.5 says
/// ignored files stay in the work tree) and a user push that adds a file of
/// that name between turns: the sync's checkout must not overwrite it
/// (git's safe checkout overwrites ignored files unless told not to).
#[tokio::test]
async fn break_the_sync_does_not_overwrite_an_ignored_file_of_the_agent() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  echo 'notes.local' >> .git/info/exclude
  echo 'the agent notes' > notes.local
fi
"#,
    );
    let child = sb.spawn(&script);
    sb.wait_sealed("run-1").await;
    let branch = sb.coordinator.branch();
    let first = tip(&sb, &branch);
    user_push(&sb, &first, "notes.local");
    let next = sb.coordinator.queue_turn("next", None);
    let (snap, _) = sb.end_after_seal(&next, child).await;
    let notes = std::fs::read_to_string(sb.root().join("repo/notes.local")).unwrap_or_default();
    assert!(
        notes.contains("the agent notes"),
        "the agent's ignored file was overwritten: {notes:?}; sync: {:?}",
        sync_events(&snap, &next)
    );
}

/// A file over the runner's limit that the remote already has (its host's
/// limit is higher, as PROTOCOL.md 4.5 allows: "set it at or below the
/// host's"), renamed by the agent (`git mv`): the blob is no new object for
/// the host, yet the guard leaves the renamed path out while keeping the
/// deletion of the old one, so the pushed session branch loses the file.
#[tokio::test]
async fn break_a_large_file_the_remote_has_renamed_by_the_agent_stays_on_the_branch() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // The user's repository already holds a 2 MB file.
    {
        let bare = git2::Repository::open_bare(sb.coordinator.bare_repo()).unwrap();
        let refname = format!("refs/heads/{}", sb.coordinator.branch());
        let parent = bare
            .find_reference(&refname)
            .unwrap()
            .peel_to_commit()
            .unwrap();
        let blob = bare.blob(&vec![7u8; BIG as usize]).unwrap();
        let mut tb = bare.treebuilder(Some(&parent.tree().unwrap())).unwrap();
        tb.insert("big.bin", blob, 0o100644).unwrap();
        let tree = bare.find_tree(tb.write().unwrap()).unwrap();
        let sig = git2::Signature::now("user", "user@example.invalid").unwrap();
        bare.commit(
            Some(&refname),
            &sig,
            &sig,
            "a large asset",
            &tree,
            &[&parent],
        )
        .unwrap();
    }
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  mkdir -p assets
  git mv big.bin assets/big.bin
  git commit -q -m "agent: move the asset"
fi
"#,
    );
    let child = spawn_with_limit(&sb, &script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let branch = sb.coordinator.branch();
    let files = files_at(&sb, &tip(&sb, &branch));
    assert!(
        files.iter().any(|f| f.ends_with("big.bin")),
        "the session branch no longer holds the asset: {files:?}; result {}",
        result_of(&snap, "run-1")
    );
}

/// The user force-pushes away the runner's commit while the runner is down
/// (killed between turns). PROTOCOL.md 4.5 "Before a turn": commits a force
/// push discarded are the user's choice and are not pushed back. The
/// restarted runner's clone reuse fetch overwrites the record of the tip it
/// last saw, and its harvest at boot pushes the discarded commit back, to
/// `<branch>-recovered-at-boot`.
#[tokio::test]
async fn break_commits_a_force_push_discarded_while_the_runner_was_down_are_not_pushed_back() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(RECORDS_START_AND_LEAVES_A_FILE);
    let mut child = sb.spawn(&script);
    sb.wait_sealed("run-1").await;
    sb.coordinator
        .wait_for(WAIT, |s| s.status_names().contains(&"turn_completed"))
        .await
        .unwrap();
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let branch = sb.coordinator.branch();
    let discarded = tip(&sb, &branch);
    let base = bare_git(&sb, &["rev-parse", &format!("{discarded}~1")]);
    user_push(&sb, &base, "USER.md");
    let child = sb.spawn(&script);
    let next = sb.coordinator.queue_turn("next", None);
    sb.end_after_seal(&next, child).await;
    assert_eq!(
        bare_git(&sb, &["for-each-ref", "--contains", &discarded]),
        "",
        "the discarded commit was pushed back; recovery branches: {:?}",
        recovery_branches(&sb)
    );
}
