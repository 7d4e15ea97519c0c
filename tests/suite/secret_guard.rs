//! The harvest's secret guard and push policy (PROTOCOL.md 4.5, "Secrets in
//! the agent's work", "Push policy"): the real binary, agents that are shell
//! scripts using the git CLI, the reference coordinator's git server. What
//! is asserted is the remote itself: every object of its bare repository,
//! reachable or not, searched for each secret and its encoded forms.

use base64::Engine;
use hosted_boot_coordinator::{CoordinatorOptions, Fault, Route, Snapshot, Target};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::support::{
    Sandbox, WAIT, assert_no_secret, finish, git, kill_group, signal, wait_for_file,
};

const CONNECTOR: (&str, &str) = ("ACME_API_KEY", "acme-connector-value-42");

fn tip(sb: &Sandbox) -> String {
    git(
        &sb.coordinator.bare_repo(),
        &[
            "rev-parse",
            &format!("refs/heads/{}", sb.coordinator.branch()),
        ],
    )
}

fn files_at(sb: &Sandbox, rev: &str) -> Vec<String> {
    git(
        &sb.coordinator.bare_repo(),
        &["ls-tree", "-r", "--name-only", rev],
    )
    .lines()
    .map(str::to_string)
    .collect()
}

/// Each value and what of it a base64 encoding shows at each of the three
/// byte alignments (computed here, not by the redactor under test).
fn forms(values: &[String]) -> Vec<Vec<u8>> {
    let b64 = &base64::engine::general_purpose::STANDARD_NO_PAD;
    let mut out = Vec::new();
    for v in values {
        out.push(v.as_bytes().to_vec());
        for k in 0..3usize {
            let mut bytes = vec![0u8; k];
            bytes.extend_from_slice(v.as_bytes());
            let encoded = b64.encode(&bytes);
            let start = (8 * k).div_ceil(6);
            let end = (8 * k + 8 * v.len()) / 6;
            out.push(encoded.as_bytes()[start..end].to_vec());
        }
    }
    out
}

/// Asserts that no object of the remote's bare repository (every commit,
/// tree and blob, reachable from a ref or not) holds a secret in any of
/// `forms`, and that no ref of it names a held-back ref.
fn assert_remote_clean(sb: &Sandbox, secrets: &[String]) {
    let bare = sb.coordinator.bare_repo();
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(&bare)
        .args(["cat-file", "--batch-all-objects", "--batch"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(
        out.stdout.len() > 100,
        "no objects read from {}",
        bare.display()
    );
    for (i, form) in forms(secrets).iter().enumerate() {
        assert!(
            !out.stdout.windows(form.len()).any(|w| w == form.as_slice()),
            "an object of the remote holds secret form {i} ({}…)",
            String::from_utf8_lossy(&form[..4])
        );
    }
    let refs = git(&bare, &["for-each-ref", "--format=%(refname)"]);
    assert!(!refs.contains("hosted-boot"), "{refs}");
}

fn result_of(snap: &Snapshot, run_id: &str) -> Value {
    let finish = snap.run(run_id).unwrap().finish.as_ref().unwrap();
    serde_json::to_value(&finish.result).unwrap()
}

fn events_of(snap: &Snapshot, run_id: &str, kind: &str) -> Vec<Value> {
    snap.run(run_id)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.kind == kind)
        .map(|e| e.data.clone())
        .collect()
}

fn status_in_repo(sb: &Sandbox) -> String {
    git(&sb.root().join("repo"), &["status", "--porcelain"])
}

/// The agent of run-1: a file holding the connector value committed; another
/// committed, then deleted in a later commit; an innocent file committed and
/// one left uncommitted. Every run writes `git status` at its start.
const LEAKS_TWO_FILES: &str = r#"
git status --porcelain > "$AGENT_OUT/status-$ORIZU_RUN_ID"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  printf 'ACME_API_KEY=%s\n' "$ACME_API_KEY" > leak.env
  git add leak.env && git commit -q -m "agent: config"
  mkdir notes && printf 'token %s\n' "$ACME_API_KEY" > notes/tmp.txt
  git add notes && git commit -q -m "agent: notes"
  git rm -q notes/tmp.txt && git commit -q -m "agent: notes gone"
  echo innocent > INNOCENT.md
  git add INNOCENT.md && git commit -q -m "agent: innocent"
  echo also > ALSO.md
fi
"#;

/// Issue 33: an empty directory named with a connector value, built with
/// `git mktree` (no file, so no file of the commit carries the name), was
/// pushed. Every name in every tree a push brings is checked.
#[tokio::test]
async fn a_name_only_a_tree_carries_is_never_pushed() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let child = sb.spawn(&sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  empty=$(git mktree < /dev/null)
  printf '040000 tree %s\t%s\n' "$empty" "$ACME_API_KEY" > "$AGENT_OUT/entries"
  git ls-tree HEAD >> "$AGENT_OUT/entries"
  tree=$(git mktree < "$AGENT_OUT/entries")
  commit=$(git commit-tree "$tree" -p HEAD -m "agent: a named tree")
  git reset -q --soft "$commit"
  echo fine > FINE.md && git add FINE.md && git commit -q -m "agent: fine"
fi
"#,
    ));
    let snap = sb.wait_sealed("run-1").await;
    assert_remote_clean(&sb, &sb.secrets(&[CONNECTOR.1]));
    let head = tip(&sb);
    assert_eq!(
        files_at(&sb, &head),
        vec!["FINE.md", "README.md", "src/greeting.txt"]
    );
    let result = result_of(&snap, "run-1");
    assert_eq!(result["blockedPaths"], json!(["[REDACTED]"]), "{result}");
    assert_eq!(result["pushed"], true, "{result}");
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
}

#[tokio::test]
async fn a_connector_value_the_agent_committed_is_never_pushed_and_the_rest_is() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let secrets = sb.secrets(&[CONNECTOR.1]);
    assert_remote_clean(&sb, &secrets);
    let child = sb.spawn(&sb.script(LEAKS_TWO_FILES));
    let snap = sb.wait_sealed("run-1").await;
    let branch = sb.coordinator.branch();
    let head = tip(&sb);

    assert_remote_clean(&sb, &sb.secrets(&[CONNECTOR.1]));
    assert_eq!(
        files_at(&sb, &head),
        vec!["ALSO.md", "INNOCENT.md", "README.md", "src/greeting.txt"]
    );
    let result = result_of(&snap, "run-1");
    assert_eq!(
        result,
        json!({"name": "run-1", "branch": branch, "headSha": head, "pushed": true,
               "commits": 1, "filesChanged": 2, "insertions": 2, "deletions": 0,
               "blockedPaths": ["leak.env", "notes/tmp.txt"],
               "blockedRef": "refs/hosted-boot/blocked/run-1"})
    );
    assert_eq!(
        events_of(&snap, "run-1", "hosted_boot.harvest"),
        vec![result]
    );
    let message = git(
        &sb.coordinator.bare_repo(),
        &["log", "-1", "--format=%B", &head],
    );
    assert!(
        message.starts_with("run-1: the agent's work without what holds a secret"),
        "{message}"
    );
    assert!(message.contains("  leak.env\n  notes/tmp.txt"), "{message}");
    // The offending file stays in the work tree, uncommitted; the agent's
    // commits on the local ref.
    let repo = sb.root().join("repo");
    assert_eq!(
        std::fs::read_to_string(repo.join("leak.env")).unwrap(),
        format!("ACME_API_KEY={}\n", CONNECTOR.1)
    );
    assert_eq!(status_in_repo(&sb), "?? leak.env");
    assert_eq!(
        git(
            &repo,
            &["log", "--format=%s", "refs/hosted-boot/blocked/run-1"]
        )
        .lines()
        .take(4)
        .collect::<Vec<_>>(),
        vec![
            "run-1: work the agent left uncommitted",
            "agent: innocent",
            "agent: notes gone",
            "agent: notes"
        ]
    );

    // A second turn that does nothing: it starts with the file still there,
    // and its harvest holds it back again; nothing new reaches the remote.
    let next = sb.coordinator.queue_turn("next", None);
    let (snap, output) = sb.end_after_seal(&next, child).await;
    assert_eq!(sb.read_out(&format!("status-{next}")).trim(), "?? leak.env");
    assert_eq!(tip(&sb), head);
    assert_eq!(
        result_of(&snap, &next),
        json!({"name": next, "branch": branch, "headSha": head, "pushed": true,
               "commits": 0, "filesChanged": 0, "insertions": 0, "deletions": 0,
               "blockedPaths": ["leak.env"],
               "blockedRef": format!("refs/hosted-boot/blocked/{next}")})
    );
    assert_eq!(status_in_repo(&sb), "?? leak.env");
    let secrets = sb.secrets(&[CONNECTOR.1]);
    assert_remote_clean(&sb, &secrets);
    assert_no_secret("runner output (trace level)", &output, &secrets);
    assert_no_secret(
        "events",
        &serde_json::to_string(&snap.run(&next).unwrap().events).unwrap(),
        &secrets,
    );
}

#[tokio::test]
async fn a_repo_token_a_base64_form_a_packed_object_and_a_secret_across_a_large_blob_are_held_back()
{
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    // The repo token: asked of the credential helper, as any git command of
    // the agent's would. The base64 form at an alignment of 2 (`user:`). A
    // 2 MiB file whose secret straddles the first MiB, left uncommitted (a
    // loose object, streamed); the rest committed and packed by `git gc`.
    let script = sb.script(
        r#"
url=$(git config remote.origin.url)
printf 'url=%s\n\n' "$url" | git credential fill | sed -n 's/^password=//p' > token.txt
[ -s token.txt ] || echo "no token" > "$AGENT_OUT/failed"
printf 'user:%s' "$ACME_API_KEY" | base64 > creds.b64
echo fine > OK.md
git add -A && git commit -q -m "agent: token and creds" && git gc -q
head -c 1048571 /dev/zero | tr '\0' a > big.txt
printf '%s' "$ACME_API_KEY" >> big.txt
head -c 1048576 /dev/zero | tr '\0' b >> big.txt
echo fine too > OK2.md
"#,
    );
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    assert_eq!(sb.read_out("failed"), "");
    let head = tip(&sb);
    assert_eq!(
        files_at(&sb, &head),
        vec!["OK.md", "OK2.md", "README.md", "src/greeting.txt"]
    );
    let result = result_of(&snap, "run-1");
    assert_eq!(
        result["blockedPaths"],
        json!(["big.txt", "creds.b64", "token.txt"]),
        "{result}"
    );
    assert_eq!(result["pushed"], json!(true), "{result}");
    let secrets = sb.secrets(&[CONNECTOR.1]);
    assert!(secrets.len() > 2, "no repo token issued: {}", secrets.len());
    assert_remote_clean(&sb, &secrets);
}

/// An agent that leaves a secret and an innocent file, says it works, and
/// sleeps.
const LEAVES_A_SECRET_AND_SLEEPS: &str = r#"
printf 'ACME_API_KEY=%s\n' "$ACME_API_KEY" > leak.env
echo wip > WIP.md
echo '{"type":"message","text":"working"}'
exec sleep 1000
"#;

#[tokio::test]
async fn sigterm_mid_turn_holds_the_secret_back_and_pushes_the_rest() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let child = sb.spawn(&sb.script(LEAVES_A_SECRET_AND_SLEEPS));
    sb.wait_event("run-1", "message", |e| e.kind == "message")
        .await;
    signal(child.id().unwrap(), rustix::process::Signal::TERM);
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(143), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "interrupted");
    let head = tip(&sb);
    assert_eq!(
        files_at(&sb, &head),
        vec!["README.md", "WIP.md", "src/greeting.txt"]
    );
    let result = result_of(&snap, "run-1");
    assert_eq!(result["blockedPaths"], json!(["leak.env"]), "{result}");
    assert_eq!(result["headSha"], json!(head), "{result}");
    assert_eq!(
        events_of(&snap, "run-1", "hosted_boot.harvest"),
        vec![result]
    );
    assert!(sb.root().join("repo/leak.env").exists());
    assert_remote_clean(&sb, &sb.secrets(&[CONNECTOR.1]));
}

/// Run-1 waits for `go`, then leaves a secret and an innocent file; later
/// runs leave nothing.
const WAITS_THEN_LEAVES_A_SECRET: &str = r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  touch "$AGENT_OUT/ready-run-1"
  i=0
  while [ ! -e "$AGENT_OUT/go" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
  printf 'ACME_API_KEY=%s\n' "$ACME_API_KEY" > leak.env
  echo kept > KEPT.md
fi
"#;

/// Run-1's harvest cannot reach the remote (every git request answers
/// 503): its commit, which holds the secret, stays in `repo/`. Returns the
/// runner.
async fn leave_an_unpushed_secret(sb: &Sandbox) -> tokio::process::Child {
    let child = sb.spawn(&sb.script(WAITS_THEN_LEAVES_A_SECRET));
    wait_for_file(&sb.out().join("ready-run-1")).await;
    sb.coordinator
        .add_fault(Fault::status(Target::Git, 503).times(1000))
        .unwrap();
    std::fs::write(sb.out().join("go"), "").unwrap();
    let snap = sb.wait_sealed("run-1").await;
    assert_eq!(result_of(&snap, "run-1")["pushed"], json!(false));
    sb.coordinator
        .wait_for(WAIT, |s| {
            s.status_names() == vec!["turn_started", "turn_completed"]
        })
        .await
        .unwrap();
    sb.coordinator.clear_faults();
    child
}

#[tokio::test]
async fn the_fatal_path_holds_the_secret_back() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let child = leave_an_unpushed_secret(&sb).await;
    // The next run fails before its own harvest (turn_started is never
    // acknowledged): the fatal path harvests what repo/ holds.
    sb.coordinator
        .add_fault(Fault::status(Route::BootStatus, 503).times(5))
        .unwrap();
    let next = sb.coordinator.queue_turn("next", None);
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(1), "{output}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run(&next).unwrap().status, "failed");
    let head = tip(&sb);
    assert_eq!(
        files_at(&sb, &head),
        vec!["KEPT.md", "README.md", "src/greeting.txt"]
    );
    let result = result_of(&snap, &next);
    assert_eq!(result["blockedPaths"], json!(["leak.env"]), "{result}");
    assert_eq!(result["pushed"], json!(true), "{result}");
    assert!(sb.root().join("repo/leak.env").exists());
    let secrets = sb.secrets(&[CONNECTOR.1]);
    assert_remote_clean(&sb, &secrets);
    assert_no_secret("runner output", &output, &secrets);
}

#[tokio::test]
async fn the_sync_before_a_turn_holds_back_local_work_that_holds_a_secret() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let child = leave_an_unpushed_secret(&sb).await;
    let next = sb.coordinator.queue_turn("next", None);
    let (snap, _) = sb.end_after_seal(&next, child).await;
    let sync = events_of(&snap, &next, "hosted_boot.workspace_sync");
    assert_eq!(sync.len(), 1, "{sync:?}");
    assert_eq!(sync[0]["outcome"], json!("pushed"), "{sync:?}");
    assert_eq!(sync[0]["blockedPaths"], json!(["leak.env"]), "{sync:?}");
    assert_eq!(
        sync[0]["blockedRef"],
        json!(format!("refs/hosted-boot/blocked/before-{next}"))
    );
    let head = tip(&sb);
    assert_eq!(sync[0]["startSha"], json!(head));
    assert_eq!(
        files_at(&sb, &head),
        vec!["KEPT.md", "README.md", "src/greeting.txt"]
    );
    // The turn's own harvest meets the file again and holds it back again.
    let result = result_of(&snap, &next);
    assert_eq!(result["blockedPaths"], json!(["leak.env"]), "{result}");
    assert_eq!(result["headSha"], json!(head), "{result}");
    assert_eq!(status_in_repo(&sb), "?? leak.env");
    assert_remote_clean(&sb, &sb.secrets(&[CONNECTOR.1]));
}

#[tokio::test]
async fn work_recovered_at_boot_that_holds_a_secret_is_held_back() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let script = sb.script(
        r#"
if [ ! -e "$AGENT_OUT/first-done" ]; then
  touch "$AGENT_OUT/first-done"
  printf 'ACME_API_KEY=%s\n' "$ACME_API_KEY" > leak.env
  echo left > LEFT.md
  git add -A && git commit -q -m "agent: committed, not pushed"
  record_group > "$AGENT_OUT/pgid"
  echo '{"type":"message","text":"working"}'
  exec sleep 1000
fi
"#,
    );
    let mut first = sb.spawn(&script);
    sb.wait_event("run-1", "message", |e| e.kind == "message")
        .await;
    // The sandbox dies: no harvest, no seal.
    first.kill().await.unwrap();
    let _ = first.wait().await;
    kill_group(&sb.read_group("pgid"));

    let second = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", second).await;
    let boot = events_of(&snap, "run-1", "hosted_boot.harvest")
        .into_iter()
        .find(|h| h["name"] == "recovered-at-boot")
        .expect("no harvest at boot");
    assert_eq!(boot["blockedPaths"], json!(["leak.env"]), "{boot}");
    assert_eq!(
        boot["blockedRef"],
        json!("refs/hosted-boot/blocked/recovered-at-boot")
    );
    assert!(files_at(&sb, &tip(&sb)).contains(&"LEFT.md".to_string()));
    assert_remote_clean(&sb, &sb.secrets(&[CONNECTOR.1]));
}

#[tokio::test]
async fn the_harvest_pushes_only_the_session_branch_and_its_recovery_branches() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // A hook that admits every ref and records each: what the runner tried
    // to push, not what the coordinator's policy let through.
    let bare = sb.coordinator.bare_repo();
    let log = sb.out().join("pushed-refs");
    std::fs::write(
        bare.join("hooks/pre-receive"),
        format!(
            "#!/bin/sh\nwhile read -r old new ref; do echo \"$ref\" >> '{}'; done\nexit 0\n",
            log.display()
        ),
    )
    .unwrap();
    let before = git(&bare, &["for-each-ref", "--format=%(refname)"]);
    // Other local branches and a tag, HEAD on one of them, a local session
    // branch with a commit of its own, and a push configuration that would
    // mirror them all.
    let script = sb.script(
        r#"
branch=$(git symbolic-ref --short HEAD)
echo s > S.md && git add S.md && git commit -q -m "on the session branch"
git checkout -q -b feature HEAD~1
echo f > F.md && git add F.md && git commit -q -m "feature"
git branch other
git tag v1
git checkout -q -b wip
echo w > W.md
git config remote.origin.push 'refs/*:refs/*'
git config remote.origin.mirror true
git config push.default matching
"#,
    );
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let branch = sb.coordinator.branch();
    let result = result_of(&snap, "run-1");
    assert_eq!(result["pushed"], json!(true), "{result}");
    let after = git(&bare, &["for-each-ref", "--format=%(refname)"]);
    let mut expected: Vec<String> = before.lines().map(str::to_string).collect();
    expected.push(format!("refs/heads/{branch}-recovered-run-1-branch"));
    expected.sort();
    let mut after: Vec<String> = after.lines().map(str::to_string).collect();
    after.sort();
    assert_eq!(after, expected);
    let pushed = std::fs::read_to_string(&log).unwrap();
    for line in pushed.lines() {
        assert!(
            line == format!("refs/heads/{branch}")
                || line.starts_with(&format!("refs/heads/{branch}-recovered-")),
            "the runner pushed {line}: {pushed}"
        );
    }
    assert!(!pushed.is_empty());
    // The work of HEAD (the `wip` branch) is on the session branch.
    let files = files_at(&sb, &tip(&sb));
    assert!(files.contains(&"W.md".to_string()) && files.contains(&"F.md".to_string()));
}
