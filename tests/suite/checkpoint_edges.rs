//! The edges of the checkpoint on notice (PROTOCOL.md 4.5, "Checkpoint"):
//! a reviewer's probes, as an attacker (FIFOs, secrets in names, signal
//! storms, a stale status file) and in the git states an agent leaves
//! (conflicts, a rebase, an orphan branch, a sparse index), kept as
//! regression tests; each states what is promised.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::checkpoint::{checkpoint, checkpoint_events, wait_file};
use super::harvest::{CONNECTOR, advance_remote, bare_git, result_of, tip};
use super::support::{Runner, Sandbox};

/// Shell helpers prepended to every probe's agent script.
const HELPERS: &str = r#"
STATUS='@STATUS@'
runner_pid() { grep -o '"pid": *[0-9]*' "$STATUS" | head -1 | grep -o '[0-9]*$'; }
wait_running() { while ! grep -q '"outcome": *"running"' "$STATUS"; do sleep 0.02; done; }
wait_for() { while [ ! -e "$AGENT_OUT/$1" ]; do sleep 0.05; done; }
g() { GIT_OPTIONAL_LOCKS=0 git -c user.name=a -c user.email=a@example.invalid "$@"; }
"#;

fn script(sb: &Sandbox, body: &str) -> std::path::PathBuf {
    let status = hosted_boot::status::path(&sb.root());
    let helpers = HELPERS.replace("@STATUS@", &status.display().to_string());
    sb.script(&format!("{helpers}\n{body}"))
}

fn status_text(sb: &Sandbox) -> String {
    std::fs::read_to_string(hosted_boot::status::path(&sb.root())).unwrap_or_default()
}

fn remote_branches(sb: &Sandbox) -> Vec<String> {
    bare_git(
        sb,
        &["for-each-ref", "--format=%(refname:short)", "refs/heads"],
    )
    .lines()
    .map(str::to_string)
    .collect()
}

/// Whether any object reachable on the remote holds `needle` (blobs,
/// paths, commit texts).
fn remote_holds(sb: &Sandbox, needle: &str) -> bool {
    let revs = bare_git(sb, &["rev-list", "--all", "--objects"]);
    if revs.contains(needle) {
        return true;
    }
    for line in revs.lines() {
        let oid = line.split_whitespace().next().unwrap_or("");
        let body = bare_git(sb, &["cat-file", "-p", oid]);
        if body.contains(needle) {
            return true;
        }
    }
    false
}

fn checkpoint_branch(sb: &Sandbox) -> String {
    format!("{}-recovered-checkpoint-run-1", sb.coordinator.branch())
}

/// PROTOCOL: a checkpoint that runs when the agent ends is cut (the
/// harvest saves the work); `hosted-boot checkpoint` exits 0 when the work
/// is safe. Here the checkpoint is slowed (a FIFO where `git check-attr`
/// reads: 3 s) and the agent ends while it runs.
#[tokio::test]
async fn probe_cut_checkpoint_answer() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
echo work > WORK.md
mkfifo .gitattributes
touch "$AGENT_OUT/ready"
wait_running
sleep 0.3
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    wait_file(&sb.out().join("ready")).await;
    let cli = sb
        .command("checkpoint", Path::new("/nonexistent"))
        .args(["--timeout", "20s"])
        .spawn()
        .unwrap();
    let started = Instant::now();
    let snap = sb.wait_sealed("run-1").await;
    let out = cli.wait_with_output().await.unwrap();
    let took = started.elapsed();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let status = status_text(&sb);
    let result = result_of(&snap, "run-1");
    eprintln!(
        "PROBE cut: cli code {:?} after {took:?}: {said}",
        out.status.code()
    );
    eprintln!("PROBE cut: status.json: {status}");
    eprintln!("PROBE cut: harvest: {result}");
    eprintln!("PROBE cut: events: {:?}", checkpoint_events(&sb, "run-1"));
    sb.coordinator.end_session();
    let (_, _output) = child.finish().await;
    let last = hosted_boot::status::read(&sb.root())
        .unwrap()
        .last_checkpoint;
    eprintln!("PROBE cut: last checkpoint after exit: {last:?}");
    assert_eq!(out.status.code(), Some(0), "the CLI: {said}");
    assert!(
        last.is_none_or(|l| l.finished_at.is_some()),
        "status.json's lastCheckpoint left 'running'"
    );
}

/// A hostile agent (same uid) leaves many FIFOs where libgit2 opens a file
/// (a `.gitignore` in each of many directories) and sends a notice, then
/// ends. The harvest clears such FIFOs before its hold, but a checkpoint
/// takes the hold as found: each open blocks until the watcher's 100 ms
/// tick, and the hold (the repository lock) is kept all that while.
/// PROMISE: nothing hangs the runner; the turn's harvest as before.
#[tokio::test]
async fn probe_fifo_dirs_hold_the_repo_lock_past_the_turn() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
echo work > WORK.md
i=0
while [ $i -lt 300 ]; do mkdir d$i; echo x > d$i/f; mkfifo d$i/.gitignore; i=$((i+1)); done
kill -USR1 "$(runner_pid)"
wait_running
touch "$AGENT_OUT/checkpoint-running"
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    wait_file(&sb.out().join("checkpoint-running")).await;
    let started = Instant::now();
    let snap = sb.wait_sealed("run-1").await;
    let sealed_after = started.elapsed();
    let result = result_of(&snap, "run-1");
    eprintln!("PROBE fifo: sealed {sealed_after:?} after the agent ended; harvest {result}");
    eprintln!("PROBE fifo: status.json {}", status_text(&sb));
    sb.coordinator.end_session();
    let (status, output) = child.finish().await;
    let unblocked = output.matches("unblocked, it reads an empty file").count();
    eprintln!(
        "PROBE fifo: runner exit {status:?}; FIFO opens unblocked by the watcher: {unblocked}"
    );
    assert!(
        result["pushError"].is_null(),
        "the turn's harvest failed: {result}"
    );
    assert_eq!(sb.remote_file("WORK.md").as_deref(), Some("work\n"));
}

/// A secret the agent knows (a connector value) in the name of a
/// directory its `.git/config` includes: the checkpoint fails with a
/// message naming the path. PROMISE: no secret printed or logged.
#[tokio::test]
async fn probe_secret_in_a_refused_include_path() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let s = script(
        &sb,
        r#"
echo work > WORK.md
cp .git/config "$AGENT_OUT/config.bak"
mkdir ".git/$ACME_API_KEY"
printf '[include]\n\tpath = %s\n' "$ACME_API_KEY" >> .git/config
touch "$AGENT_OUT/ready"
wait_for go
cp "$AGENT_OUT/config.bak" .git/config
rmdir ".git/$ACME_API_KEY"
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    wait_file(&sb.out().join("ready")).await;
    let (code, said) = checkpoint(&sb, &[]).await;
    let status = status_text(&sb);
    let (_, plain_status) = {
        let out = sb
            .command("status", Path::new("/nonexistent"))
            .output()
            .await
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (_, output) = sb.end_after_seal("run-1", child).await;
    let events = checkpoint_events(&sb, "run-1");
    eprintln!("PROBE include: cli {code:?}: {said}");
    eprintln!("PROBE include: hosted-boot status: {plain_status}");
    let leaks: Vec<&str> = [
        ("cli output", said.as_str()),
        ("status.json", status.as_str()),
        ("hosted-boot status", plain_status.as_str()),
        ("runner log", output.as_str()),
        ("events", &format!("{events:?}")),
    ]
    .iter()
    .filter(|(_, text)| text.contains(CONNECTOR.1))
    .map(|(what, _)| *what)
    .collect();
    assert!(leaks.is_empty(), "the secret is in: {leaks:?}");
}

/// A sparse checkout with a sparse index (`--sparse-index`, an index
/// extension libgit2 cannot read). A tree from HEAD would lack the
/// skip-worktree flags and delete every file outside the cone (found by a
/// review): the checkpoint pushes the agent's commits only, says so, and
/// `hosted-boot checkpoint` exits 1; the turn's harvest saves the rest.
#[tokio::test]
async fn probe_sparse_index() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
g sparse-checkout init --cone --sparse-index
g sparse-checkout set nothere
echo work > WORK.md
touch "$AGENT_OUT/ready"
wait_for go
g sparse-checkout disable
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    wait_file(&sb.out().join("ready")).await;
    let (code, said) = checkpoint(&sb, &[]).await;
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("NOT all of the work is saved"), "{said}");
    assert!(said.contains("cannot read the agent's index"), "{said}");
    let events = checkpoint_events(&sb, "run-1");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["outcome"], "partial");
    assert_eq!(events[0]["pushed"], true);
    // Nothing deleted anywhere on the remote.
    for branch in remote_branches(&sb) {
        let files = bare_git(&sb, &["ls-tree", "-r", "--name-only", &branch]);
        assert!(files.contains("src/greeting.txt"), "{branch}: {files}");
    }
    std::fs::write(sb.out().join("go"), "").unwrap();
    sb.end_after_seal("run-1", child).await;
    assert_eq!(sb.remote_file("WORK.md").as_deref(), Some("work\n"));
    assert!(sb.remote_file("src/greeting.txt").is_some());
}

/// A secret in the work tree for the whole turn, two checkpoints with a
/// change between. PROMISE: every checkpoint of a run fast-forwards the one
/// before (one branch), the secret never pushed.
#[tokio::test]
async fn probe_second_checkpoint_with_a_secret_fast_forwards() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let s = script(
        &sb,
        r#"
echo "key $ACME_API_KEY" > SECRET.txt
echo one > WORK.md
touch "$AGENT_OUT/ready1"
wait_for go1
echo two > WORK.md
touch "$AGENT_OUT/ready2"
wait_for go2
rm SECRET.txt
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    wait_file(&sb.out().join("ready1")).await;
    let (code1, said1) = checkpoint(&sb, &[]).await;
    let first = tip(&sb, &checkpoint_branch(&sb));
    std::fs::write(sb.out().join("go1"), "").unwrap();
    wait_file(&sb.out().join("ready2")).await;
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let (code2, said2) = checkpoint(&sb, &[]).await;
    std::fs::write(sb.out().join("go2"), "").unwrap();
    let (_, output) = sb.end_after_seal("run-1", child).await;
    let branches = remote_branches(&sb);
    eprintln!("PROBE secret-ff: 1: {code1:?} {said1}\n 2: {code2:?} {said2}");
    eprintln!("PROBE secret-ff: remote branches {branches:?}");
    let second = tip(&sb, &checkpoint_branch(&sb));
    let work = bare_git(&sb, &["show", &format!("{second}:WORK.md")]);
    assert!(!remote_holds(&sb, CONNECTOR.1), "a secret on the remote");
    assert!(!output.contains(CONNECTOR.1), "a secret in the log");
    assert_eq!(
        branches
            .iter()
            .filter(|b| b.contains("recovered-checkpoint"))
            .count(),
        1,
        "{branches:?} (first {first}, second {second})"
    );
    assert_eq!(
        work, "two",
        "the checkpoint branch does not hold the second checkpoint"
    );
}

/// Everything in `.git` but the objects, hashed, before and after a
/// checkpoint that fetched (the remote moved during the turn). PROMISE: no
/// change but `refs/remotes/origin/<branch>` (and its reflog).
#[tokio::test]
async fn probe_agents_git_dir_after_a_checkpoint() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
snap() {
  (cd .git && find . -path ./objects -prune -o -type f -print | LC_ALL=C sort | xargs sha256sum) > "$AGENT_OUT/$1.files"
  (cd .git && find . -path ./objects -prune -o -print | LC_ALL=C sort) > "$AGENT_OUT/$1.entries"
  g status --porcelain=v2 --branch > "$AGENT_OUT/$1.status"
  g stash list > "$AGENT_OUT/$1.stash"
}
echo staged > S.md && g add S.md
echo work > WORK.md
g stash list >/dev/null
sleep 1.1
g status >/dev/null
git status >/dev/null
snap before
touch "$AGENT_OUT/ready"
wait_for go
snap after
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    wait_file(&sb.out().join("ready")).await;
    advance_remote(&sb, "ELSEWHERE.md");
    let (code, said) = checkpoint(&sb, &[]).await;
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    eprintln!("PROBE gitdir: cli {code:?}: {said}");
    eprintln!("PROBE gitdir: harvest {}", result_of(&snap, "run-1"));
    let lines = |name: &str| -> std::collections::BTreeSet<String> {
        sb.read_out(name).lines().map(str::to_string).collect()
    };
    let mut changed = Vec::new();
    for kind in ["files", "entries", "status", "stash"] {
        let (before, after) = (
            lines(&format!("before.{kind}")),
            lines(&format!("after.{kind}")),
        );
        for l in before.symmetric_difference(&after) {
            changed.push(format!(
                "{kind}: {}{l}",
                if before.contains(l) { "-" } else { "+" }
            ));
        }
    }
    eprintln!("PROBE gitdir: changes:\n{}", changed.join("\n"));
    eprintln!(
        "PROBE gitdir: before.files:\n{}",
        sb.read_out("before.files")
    );
    let branch = sb.coordinator.branch();
    let unexpected: Vec<&String> = changed
        .iter()
        .filter(|c| {
            !c.ends_with(&format!("refs/remotes/origin/{branch}"))
                && !c.contains("status: ") // ahead/behind follows the remote ref
                && !c.ends_with("./refs/remotes/origin")
                && !c.ends_with("./logs/refs/remotes/origin")
        })
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:#?}");
    assert_eq!(code, Some(0), "{said}");
}

/// A merge stopped on a conflict (unmerged index entries, MERGE_HEAD).
/// PROMISE: the agent's index, status and merge state untouched; the
/// checkpoint holds the work tree as it stands.
#[tokio::test]
async fn probe_conflicted_merge() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
g checkout -qb other
echo theirs > README.md && g commit -qam theirs
g checkout -q -
echo ours > README.md && g commit -qam ours
g merge other > /dev/null 2>&1 || true
echo new > NEW.md
sleep 1.1
g ls-files -u > "$AGENT_OUT/unmerged-before"
g status --porcelain=v2 > "$AGENT_OUT/status-before"
sha256sum .git/index > "$AGENT_OUT/index-before"
ls .git > "$AGENT_OUT/gitdir-before"
touch "$AGENT_OUT/ready"
wait_for go
g ls-files -u > "$AGENT_OUT/unmerged-after"
g status --porcelain=v2 > "$AGENT_OUT/status-after"
sha256sum .git/index > "$AGENT_OUT/index-after"
ls .git > "$AGENT_OUT/gitdir-after"
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    wait_file(&sb.out().join("ready")).await;
    let (code, said) = checkpoint(&sb, &[]).await;
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    eprintln!("PROBE merge: cli {code:?}: {said}");
    eprintln!("PROBE merge: unmerged {}", sb.read_out("unmerged-before"));
    eprintln!("PROBE merge: harvest {}", result_of(&snap, "run-1"));
    for (a, b) in [
        ("unmerged-before", "unmerged-after"),
        ("status-before", "status-after"),
        ("index-before", "index-after"),
        ("gitdir-before", "gitdir-after"),
    ] {
        assert_eq!(sb.read_out(a), sb.read_out(b), "{a}");
    }
    assert!(!sb.read_out("unmerged-before").is_empty());
    assert_eq!(code, Some(0), "{said}");
    let commit = tip(&sb, &checkpoint_branch(&sb));
    let readme = bare_git(&sb, &["show", &format!("{commit}:README.md")]);
    let new = bare_git(&sb, &["show", &format!("{commit}:NEW.md")]);
    eprintln!("PROBE merge: checkpoint README.md: {readme:?}");
    assert!(readme.contains("<<<<<<<"), "{readme}");
    assert_eq!(new, "new");
}

/// A rebase stopped on a conflict (detached HEAD, .git/rebase-merge).
#[tokio::test]
async fn probe_conflicted_rebase() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
g checkout -qb other
echo theirs > README.md && g commit -qam theirs
g checkout -q -
echo ours > README.md && g commit -qam ours
g rebase other > /dev/null 2>&1 || true
echo new > NEW.md
sleep 1.1
[ -d .git/rebase-merge ] && echo yes > "$AGENT_OUT/rebasing"
g status --porcelain=v2 --branch > "$AGENT_OUT/status-before"
sha256sum .git/index > "$AGENT_OUT/index-before"
(cd .git && find . -path ./objects -prune -o -type f -print | LC_ALL=C sort | xargs sha256sum) > "$AGENT_OUT/files-before"
touch "$AGENT_OUT/ready"
wait_for go
g status --porcelain=v2 --branch > "$AGENT_OUT/status-after"
sha256sum .git/index > "$AGENT_OUT/index-after"
(cd .git && find . -path ./objects -prune -o -type f -print | LC_ALL=C sort | xargs sha256sum) > "$AGENT_OUT/files-after"
g rebase --abort
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    wait_file(&sb.out().join("ready")).await;
    let (code, said) = checkpoint(&sb, &[]).await;
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    eprintln!("PROBE rebase: rebasing {:?}", sb.read_out("rebasing"));
    eprintln!("PROBE rebase: cli {code:?}: {said}");
    eprintln!("PROBE rebase: harvest {}", result_of(&snap, "run-1"));
    for (a, b) in [
        ("status-before", "status-after"),
        ("index-before", "index-after"),
        ("files-before", "files-after"),
    ] {
        assert_eq!(sb.read_out(a), sb.read_out(b), "{a}");
    }
    assert_eq!(code, Some(0), "{said}");
    let commit = tip(&sb, &checkpoint_branch(&sb));
    let new = bare_git(&sb, &["show", &format!("{commit}:NEW.md")]);
    assert_eq!(new, "new");
}

/// An unborn branch (`git checkout --orphan`): a root commit of the work.
#[tokio::test]
async fn probe_orphan_branch() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
g checkout -q --orphan fresh
echo orphan > ORPHAN.md
touch "$AGENT_OUT/ready"
wait_for go
(g rev-parse --verify -q HEAD || echo unborn) > "$AGENT_OUT/head-after"
g symbolic-ref HEAD >> "$AGENT_OUT/head-after"
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    wait_file(&sb.out().join("ready")).await;
    let (code, said) = checkpoint(&sb, &[]).await;
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    eprintln!("PROBE orphan: cli {code:?}: {said}");
    eprintln!("PROBE orphan: harvest {}", result_of(&snap, "run-1"));
    assert_eq!(sb.read_out("head-after"), "unborn\nrefs/heads/fresh\n");
    assert_eq!(code, Some(0), "{said}");
    let commit = tip(&sb, &checkpoint_branch(&sb));
    let files = bare_git(&sb, &["ls-tree", "-r", "--name-only", &commit]);
    assert!(files.contains("ORPHAN.md"), "{files}");
}

/// Hundreds of SIGUSR1 and SIGUSR2 from the agent: two checkpoints (one,
/// and one more after the interval); the runner lives on.
#[tokio::test]
async fn probe_notice_storm() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
echo work > WORK.md
pid=$(runner_pid)
i=0
while [ $i -lt 300 ]; do kill -USR1 $pid; kill -USR2 $pid; i=$((i+1)); done
sleep 5
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let events = checkpoint_events(&sb, "run-1");
    eprintln!("PROBE storm: {} checkpoints: {events:?}", events.len());
    eprintln!("PROBE storm: harvest {}", result_of(&snap, "run-1"));
    assert!(events.len() <= 3, "{}", events.len());
    assert_eq!(sb.remote_file("WORK.md").as_deref(), Some("work\n"));
}

/// A notice, then SIGTERM at once (a preemption): the runner stops
/// within its budget and the work is saved.
#[tokio::test]
async fn probe_notice_then_sigterm() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
echo work > WORK.md
touch "$AGENT_OUT/ready"
sleep 60
"#,
    );
    let child = Runner::spawn(&sb, &s);
    let pid = child.pid();
    wait_file(&sb.out().join("ready")).await;
    let (code, said) = checkpoint(&sb, &["--no-wait"]).await;
    assert_eq!(code, Some(0), "{said}");
    super::support::signal(pid, rustix::process::Signal::TERM);
    let started = Instant::now();
    let (status, output) = child.finish().await;
    let took = started.elapsed();
    let branches = remote_branches(&sb);
    eprintln!("PROBE sigterm: exit {status:?} after {took:?}; branches {branches:?}");
    eprintln!(
        "PROBE sigterm: events {:?}",
        checkpoint_events(&sb, "run-1")
    );
    let saved = sb.remote_file("WORK.md").is_some()
        || branches
            .iter()
            .any(|b| !bare_git(&sb, &["show", &format!("refs/heads/{b}:WORK.md")]).is_empty());
    assert!(saved, "the work is nowhere: {output}");
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// A status file left by a runner that is gone, its pid now another
/// process's. PROMISE (4.5): exit 1 when no runner runs at the root; and
/// nothing else should be signalled.
#[tokio::test]
async fn probe_stale_status_file_pid_reused() {
    let dir = tempfile::tempdir().unwrap();
    let mut victim = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let status = serde_json::json!({
        "phase": "turn",
        "sessionId": "s",
        "since": "2026-01-01T00:00:00.000Z",
        "updatedAt": "2026-01-01T00:00:00.000Z",
        "runnerVersion": "0",
        "pid": victim.id(),
    });
    let path = hosted_boot::status::path(dir.path());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, status.to_string()).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_hosted-boot"))
        .arg("checkpoint")
        .arg("--root")
        .arg(dir.path())
        .args(["--timeout", "1s"])
        .env_clear()
        .output()
        .await
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let victim_status = victim.try_wait().unwrap();
    let _ = victim.kill();
    eprintln!(
        "PROBE stale: cli {:?} {} {}; victim {victim_status:?}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        victim_status.is_none(),
        "an unrelated process named by a stale status file was killed: {victim_status:?}"
    );
}

/// File names: a secret in the name of an uncommitted file over the size
/// limit, a name that is not UTF-8. PROMISE: no secret in any output; the
/// non-UTF-8 file saved.
#[tokio::test]
async fn probe_names_size_limit_and_secret_in_a_name() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let s = script(
        &sb,
        r#"
head -c 5000 /dev/zero > "big-$ACME_API_KEY.bin"
head -c 5000 /dev/zero > "big.bin"
echo small > "small-$ACME_API_KEY.txt"
printf 'latin' > "$(printf 'caf\351.txt')"
g add "big.bin"
touch "$AGENT_OUT/ready"
wait_for go
rm -f big* small*
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::reading(
        sb.runner(&s)
            .env("HOSTED_BOOT_HARVEST_MAX_FILE_SIZE", "1000")
            .spawn()
            .unwrap(),
    );
    wait_file(&sb.out().join("ready")).await;
    let (code, said) = checkpoint(&sb, &[]).await;
    let status = status_text(&sb);
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (_, output) = sb.end_after_seal("run-1", child).await;
    let events = checkpoint_events(&sb, "run-1");
    eprintln!("PROBE names: cli {code:?}: {said}");
    eprintln!("PROBE names: events {events:?}");
    let commit = tip(&sb, &checkpoint_branch(&sb));
    let files = bare_git(&sb, &["ls-tree", "-r", "--name-only", &commit]);
    eprintln!("PROBE names: checkpoint tree {files:?}");
    for (what, text) in [
        ("cli", said.as_str()),
        ("status.json", status.as_str()),
        ("log", output.as_str()),
        ("events", &format!("{events:?}")),
    ] {
        assert!(!text.contains(CONNECTOR.1), "the secret in {what}");
    }
    assert!(!remote_holds(&sb, CONNECTOR.1), "a secret on the remote");
    assert!(!files.contains("big"), "{files}");
    assert!(
        files.contains("caf"),
        "the non-UTF-8 name is missing: {files}"
    );
}

/// As [`probe_fifo_dirs_hold_the_repo_lock_past_the_turn`], then a second
/// turn: what does its workspace sync see while the first turn's
/// checkpoint still holds `repo/`?
#[tokio::test]
async fn probe_fifo_dirs_and_the_next_turn() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
if [ -e "$AGENT_OUT/first-done" ]; then
  g status --porcelain > "$AGENT_OUT/second-status" 2>&1
  echo second > SECOND.md
  touch "$AGENT_OUT/second-ran"
  echo '{"type":"message","text":"second"}'
  exit 0
fi
echo work > WORK.md
i=0
while [ $i -lt 400 ]; do mkdir d$i; echo x > d$i/f; mkfifo d$i/.gitignore; i=$((i+1)); done
kill -USR1 "$(runner_pid)"
wait_running
touch "$AGENT_OUT/first-done"
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    wait_file(&sb.out().join("first-done")).await;
    let started = Instant::now();
    let snap = sb.wait_sealed("run-1").await;
    eprintln!(
        "PROBE fifo2: run-1 sealed after {:?}: {}",
        started.elapsed(),
        result_of(&snap, "run-1")
    );
    let run_2 = sb.coordinator.queue_turn("second turn", None);
    let snap = sb
        .coordinator
        .wait_for(Duration::from_secs(60), |s| {
            s.run(&run_2).is_some_and(|r| r.finish.is_some())
        })
        .await
        .unwrap();
    eprintln!(
        "PROBE fifo2: {run_2} sealed after {:?}: {}",
        started.elapsed(),
        result_of(&snap, &run_2)
    );
    let syncs: Vec<Value> = snap
        .run(&run_2)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.kind == "hosted_boot.workspace_sync")
        .map(|e| e.data.clone())
        .collect();
    eprintln!("PROBE fifo2: {run_2} workspace_sync: {syncs:?}");
    eprintln!(
        "PROBE fifo2: second agent ran: {}",
        sb.out().join("second-ran").exists()
    );
    sb.coordinator.end_session();
    let (status, _) = child.finish().await;
    eprintln!("PROBE fifo2: exit {status:?}");
    assert!(
        result_of(&snap, "run-1")["pushError"].is_null(),
        "run-1's harvest failed"
    );
    assert!(
        result_of(&snap, &run_2)["pushError"].is_null(),
        "{run_2}'s harvest failed"
    );
}

/// A notice after the agent ended, while the turn's harvest is still
/// committing a large file: `hosted-boot checkpoint` answers at once.
/// PROMISE (4.5): exit 0 only "when the work is safe".
#[tokio::test]
async fn probe_notice_during_the_harvest() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
head -c 80000000 /dev/urandom > BIG.bin
touch "$AGENT_OUT/ending"
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    wait_file(&sb.out().join("ending")).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let (code, said) = checkpoint(&sb, &[]).await;
    let sealed = sb
        .coordinator
        .snapshot()
        .run("run-1")
        .is_some_and(|r| r.finish.is_some());
    let on_remote = bare_git(
        &sb,
        &[
            "cat-file",
            "-e",
            &format!("refs/heads/{}:BIG.bin", sb.coordinator.branch()),
        ],
    );
    let on_remote = bare_git(
        &sb,
        &[
            "ls-tree",
            "--name-only",
            &format!("refs/heads/{}", sb.coordinator.branch()),
        ],
    )
    .contains("BIG.bin")
        || !on_remote.is_empty();
    eprintln!(
        "PROBE during-harvest: cli {code:?}: {said}; sealed {sealed}; BIG.bin on the remote {on_remote}"
    );
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    eprintln!(
        "PROBE during-harvest: harvest {}",
        result_of(&snap, "run-1")
    );
    assert!(
        code != Some(0) || on_remote,
        "exit 0 (work safe) while the work is not on the remote yet: {said}"
    );
}

/// A split index (`git update-index --split-index`, which libgit2 cannot
/// read), with a staged file git ignores (`git add -f`) and a staged
/// deletion; then `.git/index` as a symbolic link and as a FIFO.
#[tokio::test]
async fn probe_split_symlinked_and_fifo_index() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
echo 'ignored.txt' > .gitignore
echo forced > ignored.txt
g add .gitignore && g add -f ignored.txt
g rm -q --cached src/greeting.txt
g update-index --split-index
ls .git > "$AGENT_OUT/gitdir"
touch "$AGENT_OUT/ready1"
wait_for go1
g update-index --no-split-index
mv .git/index "$AGENT_OUT/index.real"
ln -s "$AGENT_OUT/index.real" .git/index
touch "$AGENT_OUT/ready2"
wait_for go2
rm .git/index
mkfifo .git/index
touch "$AGENT_OUT/ready3"
wait_for go3
rm .git/index
cp "$AGENT_OUT/index.real" .git/index
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    let mut said = Vec::new();
    for n in 1..=3 {
        wait_file(&sb.out().join(format!("ready{n}"))).await;
        if n > 1 {
            tokio::time::sleep(Duration::from_millis(1600)).await;
        }
        let t = Instant::now();
        let (code, text) = checkpoint(&sb, &[]).await;
        let commit = tip(&sb, &checkpoint_branch(&sb));
        let files = bare_git(&sb, &["ls-tree", "-r", "--name-only", &commit]);
        said.push(format!(
            "{n}: {code:?} in {:?}: {text} tree {files:?}",
            t.elapsed()
        ));
        std::fs::write(sb.out().join(format!("go{n}")), "").unwrap();
    }
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    eprintln!("PROBE index: gitdir {}", sb.read_out("gitdir"));
    for s in &said {
        eprintln!("PROBE index: {s}");
    }
    eprintln!("PROBE index: events {:?}", checkpoint_events(&sb, "run-1"));
    eprintln!("PROBE index: harvest {}", result_of(&snap, "run-1"));
}

/// `<branch>-recovered-checkpoint-run-1` on the remote holds someone
/// else's work: the checkpoint goes to `-2`, and the second checkpoint of
/// the run fast-forwards that one.
#[tokio::test]
async fn probe_checkpoint_branch_name_taken() {
    let sb = Sandbox::start(Default::default()).await;
    let s = script(
        &sb,
        r#"
echo one > WORK.md
touch "$AGENT_OUT/ready1"
wait_for go1
echo two > WORK.md
touch "$AGENT_OUT/ready2"
wait_for go2
echo '{"type":"message","text":"done"}'
"#,
    );
    let child = Runner::spawn(&sb, &s);
    wait_file(&sb.out().join("ready1")).await;
    let taken = checkpoint_branch(&sb);
    {
        let bare = git2::Repository::open_bare(sb.coordinator.bare_repo()).unwrap();
        let sig = git2::Signature::now("x", "x@example.invalid").unwrap();
        let tree = bare
            .find_tree(bare.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        bare.commit(
            Some(&format!("refs/heads/{taken}")),
            &sig,
            &sig,
            "someone else",
            &tree,
            &[],
        )
        .unwrap();
    }
    let someone = tip(&sb, &taken);
    let (code1, said1) = checkpoint(&sb, &[]).await;
    std::fs::write(sb.out().join("go1"), "").unwrap();
    wait_file(&sb.out().join("ready2")).await;
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let (code2, said2) = checkpoint(&sb, &[]).await;
    std::fs::write(sb.out().join("go2"), "").unwrap();
    let _ = sb.end_after_seal("run-1", child).await;
    let branches = remote_branches(&sb);
    eprintln!("PROBE taken: 1 {code1:?} {said1}\n 2 {code2:?} {said2}\n branches {branches:?}");
    assert_eq!(tip(&sb, &taken), someone, "someone else's branch moved");
    let two = bare_git(&sb, &["show", &format!("refs/heads/{taken}-2:WORK.md")]);
    assert_eq!(two, "two");
    assert!(!branches.iter().any(|b| b.ends_with("-3")), "{branches:?}");
}
