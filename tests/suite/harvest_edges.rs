//! The harvest at git's edges (PROTOCOL.md 4.5, issue 33): states the
//! agent's git can leave (odd modes and names, quoted attribute patterns,
//! intent-to-add entries, conflicts, submodules), as a user and as an
//! attacker (the agent is untrusted). Written by a fresh reviewer against
//! main at 23db22b; each test whose name says what the harvest does (not
//! `held_…`) failed there and passes since its fix. The `held_…` ones held
//! then and guard it.

use hosted_boot_coordinator::CoordinatorOptions;
use serde_json::{Value, json};

use super::harvest::{BIG, CONNECTOR, LIMIT, bare_git, files_at, result_of, spawn_with_limit, tip};
use super::support::{Runner, Sandbox};

/// The agent's git with an identity.
const G: &str = "g() { git -c user.name=a -c user.email=a@example.invalid \"$@\"; }\n";

/// The harvest of run-1, then of a second turn queued after it, and the
/// runner's output: what the first left must not block the second.
async fn two_turns(sb: &Sandbox, child: tokio::process::Child) -> (Value, Value, String) {
    let snap = sb.wait_sealed("run-1").await;
    let first = result_of(&snap, "run-1");
    let next = sb.coordinator.queue_turn("next", None);
    let (snap, output) = sb.end_after_seal(&next, child).await;
    (first, result_of(&snap, &next), output)
}

async fn limited_sandbox() -> Sandbox {
    Sandbox::start(CoordinatorOptions {
        git_max_file_size: Some(LIMIT),
        ..CoordinatorOptions::default()
    })
    .await
}

// ---------------------------------------------------------------------------
// Secret guard

/// A tree entry of mode `0` (git mktree writes it as given): libgit2's diff
/// calls it UNREADABLE and leaves it out of every delta, so the guard never
/// reads its blob; libgit2's pack builder sends it all the same (any entry
/// that is not a tree or a gitlink is a blob to it), and git's receive-pack
/// takes it (canon_mode makes it a gitlink; fsck's badFilemode is INFO).
/// PROTOCOL 4.5: "The runner never pushes a value it keeps secret".
#[tokio::test]
async fn a_blob_behind_mode_zero_is_checked_for_secrets() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  blob=$(printf 'key %s\n' "$ACME_API_KEY" | git hash-object -w --stdin)
  echo "$blob" > "$AGENT_OUT/blob"
  tree=$( (git ls-tree HEAD; printf '0 blob %s\tinnocent.txt\n' "$blob") | git mktree)
  c=$(g commit-tree "$tree" -p HEAD -m 'an innocent commit')
  git update-ref HEAD "$c"
fi
"#
    ));
    let child = sb.spawn(&script);
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    let result = result_of(&snap, "run-1");
    let blob = sb.read_out("blob").trim().to_string();
    let on_remote = bare_git(&sb, &["cat-file", "-p", &blob]);
    assert!(
        !on_remote.contains(CONNECTOR.1),
        "the connector value is on the remote (blob {blob}: {on_remote:?}); result {result}\n{output}"
    );
}

/// A tree entry of a mode git2-rs does not know (`100600`, which git
/// mktree writes as given and git itself reads as 100644): `DiffFile::mode`
/// panics ("unknown mode"), in the size guard's and the secret guard's
/// walks, so the harvest task dies; every later harvest walks the same
/// commit, so no later work of the session is pushed either.
/// PROTOCOL 4.5: the work is pushed, or `pushError` says why; a failed
/// push does not block later harvests.
#[tokio::test]
async fn an_unknown_file_mode_does_not_stop_the_harvests() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  blob=$(echo 'plain text' | git hash-object -w --stdin)
  tree=$( (git ls-tree HEAD; printf '100600 blob %s\tprivate.txt\n' "$blob") | git mktree)
  c=$(g commit-tree "$tree" -p HEAD -m 'a private file')
  git update-ref HEAD "$c"
  git read-tree HEAD
  git checkout -- . 2> /dev/null || true
else
  echo two > TWO.md
fi
"#
    ));
    let child = sb.spawn(&script);
    let (first, second, output) = two_turns(&sb, child).await;
    let head = tip(&sb, &sb.coordinator.branch());
    assert!(
        first["pushed"] == json!(true) && second["pushed"] == json!(true),
        "run-1: {first}\nrun-2: {second}\nremote head files: {:?}\n{}",
        files_at(&sb, &head),
        output
            .lines()
            .filter(|l| l.contains("panicked") || l.contains("unknown mode"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// ---------------------------------------------------------------------------
// Size guard

/// A file over the limit that the agent committed with mode 100664 (a mode
/// git still accepts, from old repositories or `git mktree`) or as a
/// symbolic link's blob: `oversized_blobs` looks only at Blob and
/// BlobExecutable, so it is pushed, the host refuses the push, and every
/// later harvest carries the same commit. PROTOCOL 4.5 "Files over the size
/// limit": "If one of them adds a file over the limit ... they are
/// replaced ... later harvests are not blocked".
#[tokio::test]
async fn a_large_blob_under_mode_100664_is_left_out() {
    let sb = limited_sandbox().await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  blob=$(head -c {BIG} /dev/zero | git hash-object -w --stdin)
  tree=$( (git ls-tree HEAD; printf '100664 blob %s\tdata.bin\n' "$blob") | git mktree)
  c=$(g commit-tree "$tree" -p HEAD -m 'a dataset')
  git update-ref HEAD "$c"
  git read-tree HEAD
  git checkout -- . 2> /dev/null || true
else
  echo two > TWO.md
fi
"#
    ));
    let child = spawn_with_limit(&sb, &script);
    let (first, second, _) = two_turns(&sb, child).await;
    assert_eq!(
        second["pushed"],
        json!(true),
        "run-1: {first}\nrun-2: {second}"
    );
}

/// The same through a symbolic link whose blob is over the limit.
#[tokio::test]
async fn a_large_symlink_blob_is_left_out() {
    let sb = limited_sandbox().await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  blob=$(head -c {BIG} /dev/zero | tr '\0' a | git hash-object -w --stdin)
  tree=$( (git ls-tree HEAD; printf '120000 blob %s\tlink\n' "$blob") | git mktree)
  c=$(g commit-tree "$tree" -p HEAD -m 'a link')
  git update-ref HEAD "$c"
  git read-tree HEAD
else
  echo two > TWO.md
fi
"#
    ));
    let child = spawn_with_limit(&sb, &script);
    let (first, second, _) = two_turns(&sb, child).await;
    assert_eq!(
        second["pushed"],
        json!(true),
        "run-1: {first}\nrun-2: {second}"
    );
}

/// A file over the limit the agent committed under a name that is not
/// UTF-8: `leave_out_oversized` finds its paths with `entry.name()` (UTF-8
/// only), finds none, and makes a "replacement" with the same tree: the
/// host refuses it, every later harvest too.
#[tokio::test]
async fn a_large_committed_file_with_a_latin1_name_is_left_out() {
    let sb = limited_sandbox().await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  head -c {BIG} /dev/zero > "$(printf 'donn\351es.bin')"
  git add -A && g commit -qm 'data'
else
  echo two > TWO.md
fi
"#
    ));
    let child = spawn_with_limit(&sb, &script);
    let (first, second, _) = two_turns(&sb, child).await;
    assert!(
        first["pushed"] == json!(true) && second["pushed"] == json!(true),
        "run-1: {first}\nrun-2: {second}"
    );
}

/// A file over the limit the agent committed, and anywhere in the tree a
/// directory whose name is not UTF-8: git2's tree walk returns -1 for a
/// root that is not UTF-8, so `leave_out_oversized` fails and the whole
/// harvest is `harvest_failed` with nothing pushed, every turn.
#[tokio::test]
async fn a_latin1_directory_does_not_fail_the_size_guard() {
    let sb = limited_sandbox().await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  d="$(printf 'r\351sum\351')"; mkdir "$d" && echo cv > "$d/cv.txt"
  head -c {BIG} /dev/zero > BIG.bin
  echo small > SMALL.md
  git add -A && g commit -qm 'cv and data'
else
  echo two > TWO.md
fi
"#
    ));
    let child = spawn_with_limit(&sb, &script);
    let (first, second, _) = two_turns(&sb, child).await;
    assert!(
        first["pushed"] == json!(true) && second["pushed"] == json!(true),
        "run-1: {first}\nrun-2: {second}"
    );
}

// ---------------------------------------------------------------------------
// Attributes (clean_filter)

/// git reads a pattern that begins with `"` C-quoted (`"*.env"`, `"my
/// secret.txt"`); libgit2 does not, so the harvest does not see the
/// filter and commits the plaintext that `git add` would have encrypted.
/// PROTOCOL 4.5 `clean_filter`: a file whose attributes name a filter
/// other than LFS's is left out ("committed, the plaintext would be
/// pushed").
#[tokio::test]
async fn a_quoted_attribute_pattern_leaves_the_file_out() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  printf '"*.env" filter=crypt\n"my secret.txt" filter=crypt\n' > .gitattributes
  git config filter.crypt.clean 'tr a-z n-za-m'
  git config filter.crypt.smudge 'tr a-z n-za-m'
  echo 'plaintext-value' > prod.env
  echo 'plaintext-value' > 'my secret.txt'
  git check-attr filter -- prod.env 'my secret.txt' > "$AGENT_OUT/attrs"
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let attrs = sb.read_out("attrs");
    assert_eq!(
        attrs.matches("filter: crypt").count(),
        2,
        "git does not see the filter: {attrs}"
    );
    let head = tip(&sb, &sb.coordinator.branch());
    let files = files_at(&sb, &head);
    let result = result_of(&snap, "run-1");
    assert!(
        !files.contains(&"prod.env".to_string()) && !files.contains(&"my secret.txt".to_string()),
        "plaintext of filtered files pushed: {files:?}; prod.env on the remote: {:?}; result {result}",
        bare_git(&sb, &["show", &format!("{head}:prod.env")])
    );
    assert_eq!(
        result["skippedFiles"],
        json!([
            {"path": "my secret.txt", "bytes": 16, "reason": "clean_filter"},
            {"path": "prod.env", "bytes": 16, "reason": "clean_filter"}
        ]),
        "{result}"
    );
}

/// `-filter` (and `filter` set) means "no filter" to git (convert.c:
/// ATTR_TRUE/ATTR_FALSE/ATTR_UNSET give no driver), a common way to exempt
/// files from an LFS or crypt pattern; git2's `get_attr` returns
/// "[internal]__FALSE__" / "[internal]__TRUE__", which the harvest takes
/// for a driver name: the file is left out and named `clean_filter`,
/// though the agent's `git add` commits it as is.
#[tokio::test]
async fn an_unset_filter_is_no_clean_filter() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  printf '*.psd filter=lfs diff=lfs merge=lfs -text\nsmall.psd -filter -diff -merge\nnotes.txt filter\n' > .gitattributes
  echo 'not lfs' > small.psd
  echo 'notes' > notes.txt
  git check-attr filter -- small.psd notes.txt > "$AGENT_OUT/attrs"
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let head = tip(&sb, &sb.coordinator.branch());
    let files = files_at(&sb, &head);
    let result = result_of(&snap, "run-1");
    assert!(
        files.contains(&"small.psd".to_string()) && files.contains(&"notes.txt".to_string()),
        "git's attrs: {}; pushed {files:?}; result {result}",
        sb.read_out("attrs")
    );
}

/// `git add -N` (intent to add) of a file the harvest leaves out (here a
/// clean-filtered one): libgit2 writes intent-to-add entries into trees
/// (git leaves them out), so the branch gets an empty file at that path,
/// while the report says the path was left out.
#[tokio::test]
async fn intent_to_add_of_a_left_out_file_pushes_nothing() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  printf 'secret.env filter=crypt\n' > .gitattributes
  git config filter.crypt.clean 'tr a-z n-za-m'
  git config filter.crypt.smudge 'tr a-z n-za-m'
  echo 'plaintext-value' > secret.env
  git add -N secret.env
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let head = tip(&sb, &sb.coordinator.branch());
    let files = files_at(&sb, &head);
    let result = result_of(&snap, "run-1");
    assert!(
        !files.contains(&"secret.env".to_string()),
        "secret.env is on the branch (content {:?}) though reported left out: {result}",
        bare_git(&sb, &["cat-file", "-s", &format!("{head}:secret.env")])
    );
    assert_eq!(
        result["skippedFiles"],
        json!([{"path": "secret.env", "bytes": 16, "reason": "clean_filter"}]),
        "{result}"
    );
    assert!(sb.root().join("repo/secret.env").exists());
}

// ---------------------------------------------------------------------------
// Conflicts and gitlinks with names that are not UTF-8

/// A merge conflict on a clean-filtered path whose name is not UTF-8: the
/// conflicted path is carried as lossy UTF-8, `conflict_remove` does not
/// find it, and the harvest's commit fails, every turn: the rest of the
/// work (OTHER.md) is never committed. PROTOCOL 4.5: a conflict on a
/// left-out path "does not keep the rest of the work from being committed".
#[tokio::test]
async fn a_conflict_on_a_left_out_latin1_path_does_not_block_the_rest() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  f="$(printf 'cl\351.enc')"
  printf '*.enc filter=crypt\n' > .gitattributes
  printf 'base\n' > "$f" && git add -A && g commit -qm base
  git checkout -q -b side
  printf 'side\n' > "$f" && g commit -qam side
  git checkout -q -
  printf 'ours\n' > "$f" && g commit -qam ours
  g merge -q side > /dev/null 2>&1 || true
  git ls-files -u > "$AGENT_OUT/unmerged"
  echo other > OTHER.md
fi
"#
    ));
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    assert!(!sb.read_out("unmerged").is_empty(), "no conflict");
    let head = tip(&sb, &sb.coordinator.branch());
    let result = result_of(&snap, "run-1");
    assert!(
        files_at(&sb, &head).contains(&"OTHER.md".to_string()),
        "{result}"
    );
}

/// A gitlink the agent staged (`git add` of an embedded repository) at a
/// path that is not UTF-8: `moved_gitlinks` resets a lossy path, which
/// matches nothing, so the harvest commits the gitlink. PROTOCOL 4.5: a
/// gitlink the agent staged and left uncommitted is put back as HEAD has it.
#[tokio::test]
async fn a_staged_gitlink_with_a_latin1_path_is_put_back() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  d="$(printf 'caf\351')"
  git init -q "$d"
  g -C "$d" commit -q --allow-empty -m local
  git add "$d" 2> /dev/null
  git ls-files -s > "$AGENT_OUT/staged"
  echo kept > KEPT.md
fi
"#
    ));
    let child = sb.spawn(&script);
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    assert!(sb.read_out("staged").contains("160000"), "not staged");
    let head = tip(&sb, &sb.coordinator.branch());
    let tree = bare_git(&sb, &["ls-tree", "-r", &head]);
    let result = result_of(&snap, "run-1");
    assert!(
        !tree.contains("160000"),
        "the harvest committed a gitlink: {tree}\n{result}\n{}",
        output
            .lines()
            .filter(|l| l.contains("gitlink"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// ---------------------------------------------------------------------------
// Bounds

/// Held: a submodule whose git directory (here `sub/.git` itself, in the
/// work tree, which the pre-hold clearing does not walk) holds many FIFO
/// refs under refs/remotes: the gitlink check did not block on them (150
/// FIFOs, sealed in 0.5 s). PROTOCOL 4.5: a FIFO in a
/// submodule's git directory is unblocked "so that ... the work goes on
/// within its bound".
#[tokio::test]
async fn held_fifo_refs_in_a_submodule_git_dir_do_not_hold_the_harvest() {
    let sb = Sandbox::start(Default::default()).await;
    let n = 150;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  git init -q --bare "$AGENT_OUT/sub.git"
  git init -q "$AGENT_OUT/seed"
  g -C "$AGENT_OUT/seed" commit -q --allow-empty -m seed
  g -C "$AGENT_OUT/seed" push -q "$AGENT_OUT/sub.git" HEAD:refs/heads/main
  g -c protocol.file.allow=always clone -q "$AGENT_OUT/sub.git" sub
  printf '[submodule "sub"]\n\tpath = sub\n\turl = ../sub.git\n' > .gitmodules
  g -C sub commit -q --allow-empty -m unpushed
  git add .gitmodules sub 2> /dev/null
  g commit -qm 'add sub'
  mkdir -p sub/.git/refs/remotes/origin/f
  i=0; while [ $i -lt {n} ]; do mkfifo sub/.git/refs/remotes/origin/f/$i; i=$((i+1)); done
  date +%s > "$AGENT_OUT/end"
fi
"#
    ));
    let child = sb.spawn(&script);
    let snap = sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (_, output) = super::support::Exits::exit(child).await;
    let result = result_of(&snap, "run-1");
    assert!(output.contains("boot finished"), "{output}");
    assert_eq!(result["pushed"], json!(true), "{result}");
}

// ---------------------------------------------------------------------------
// What held (expected to pass)

/// `[attr]` macros, `.git/info/attributes`, a nested `.gitattributes`.
#[tokio::test]
async fn held_filter_via_macro_info_attributes_and_nested_file() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  printf '[attr]secret filter=crypt diff=crypt\na.env secret\n' > .gitattributes
  mkdir -p .git/info && printf 'b.env filter=crypt\n' > .git/info/attributes
  mkdir -p deep/er && printf '*.key filter=crypt\n' > deep/.gitattributes
  echo p > a.env; echo p > b.env; echo p > deep/er/c.key
  echo kept > KEPT.md
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let head = tip(&sb, &sb.coordinator.branch());
    let files = files_at(&sb, &head);
    let result = result_of(&snap, "run-1");
    for f in ["a.env", "b.env", "deep/er/c.key"] {
        assert!(!files.contains(&f.to_string()), "{f} pushed: {result}");
    }
    assert!(files.contains(&"KEPT.md".to_string()));
    let reasons: Vec<String> = result["skippedFiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| format!("{}:{}", s["path"], s["reason"]))
        .collect();
    assert_eq!(reasons.len(), 3, "{result}");
}

/// A gitlink added only on a merge's second parent, and `.gitmodules` with a
/// trailing slash and odd quoting: named as the others.
#[tokio::test]
async fn held_gitlink_via_merge_second_parent_is_named() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  git init -q --bare "$AGENT_OUT/sub.git"
  git init -q "$AGENT_OUT/seed"
  g -C "$AGENT_OUT/seed" commit -q --allow-empty -m seed
  g -C "$AGENT_OUT/seed" push -q "$AGENT_OUT/sub.git" HEAD:refs/heads/main
  git checkout -q -b side
  g -c protocol.file.allow=always clone -q "$AGENT_OUT/sub.git" sub
  g -C sub commit -q --allow-empty -m unpushed
  git -C sub rev-parse HEAD > "$AGENT_OUT/unpushed"
  printf '[submodule "s"]\n\tpath = "sub/" ; odd\n\turl = ../sub.git\n' > .gitmodules
  git add .gitmodules sub 2> /dev/null && g commit -qm 'sub on side'
  git checkout -q -
  echo main > MAIN.md && git add MAIN.md && g commit -qm main
  g merge -q --no-edit side > /dev/null 2>&1
  git log --format=%P -1 > "$AGENT_OUT/parents"
fi
"#
    ));
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let result = result_of(&snap, "run-1");
    assert_eq!(
        sb.read_out("parents").split_whitespace().count(),
        2,
        "no merge"
    );
    assert_eq!(result["pushed"], json!(true), "{result}");
    assert_eq!(
        result["unpublishedGitlinks"],
        json!([{"path": "sub", "commit": sb.read_out("unpushed").trim(), "reason": "submodule_not_pushed"}]),
        "{result}"
    );
}

/// A rebase stopped on a conflict: the conflicted file (markers) and the
/// rest are committed on the detached HEAD and pushed; the agent's
/// original commits stay reachable.
#[tokio::test]
async fn held_a_rebase_stopped_midway_loses_nothing() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  git checkout -q -b topic
  echo topic > README.md && g commit -qam topic
  echo topic2 > T2.md && git add T2.md && g commit -qm topic2
  git rev-parse HEAD > "$AGENT_OUT/topic"
  git checkout -q -
  echo main > README.md && g commit -qam main
  git checkout -q topic
  g rebase -q "$(git rev-parse HEAD@{{1}})" > /dev/null 2>&1 || true
  g rebase main > /dev/null 2>&1 || true
  git status --short > "$AGENT_OUT/status"
  echo more > MORE.md
fi
"#
    ));
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let result = result_of(&snap, "run-1");
    assert_eq!(result["pushed"], json!(true), "{result}");
    let head = result["headSha"].as_str().unwrap().to_string();
    let files = files_at(&sb, &head);
    assert!(
        files.contains(&"MORE.md".to_string()),
        "{files:?} {result} status: {}",
        sb.read_out("status")
    );
}

/// The agent committed a file whose *name* is the connector value, under
/// a directory, and a symlink whose target holds it: both held back.
#[tokio::test]
async fn held_secret_in_a_symlink_target_and_a_nested_name() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  mkdir -p "a/$ACME_API_KEY" && echo x > "a/$ACME_API_KEY/f"
  ln -s "/tmp/$ACME_API_KEY" link
  echo ok > OK.md
  git add -A && g commit -qm stuff
fi
"#
    ));
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let result = result_of(&snap, "run-1");
    let all = bare_git(&sb, &["rev-list", "--objects", "--all"]);
    assert!(!all.contains(CONNECTOR.1), "{all}");
    for line in all.lines() {
        let id = line.split_whitespace().next().unwrap();
        let body = bare_git(&sb, &["cat-file", "-p", id]);
        assert!(!body.contains(CONNECTOR.1), "{id}: {body}");
    }
    assert!(result["blockedPaths"].is_array(), "{result}");
}

/// A submodule the agent removed from the index (`git rm --cached sub`) is
/// committed removed, as `git commit` would, whether or not the agent
/// changed anything else: the status leaves submodules out, so the removal
/// alone made no commit while, with another change, it was committed
/// (found by a review). Putting the gitlink back would undo half of a
/// removal whose `.gitmodules` edit is the agent's to commit.
#[tokio::test]
async fn a_submodule_removed_from_the_index_is_committed_removed() {
    for other in [true, false] {
        let sb = Sandbox::start(Default::default()).await;
        let script = sb.script(&format!(
            r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  git init -q --bare "$AGENT_OUT/sub.git"
  git init -q "$AGENT_OUT/seed"
  g -C "$AGENT_OUT/seed" commit -q --allow-empty -m seed
  g -C "$AGENT_OUT/seed" push -q "$AGENT_OUT/sub.git" HEAD:refs/heads/main
  g -c protocol.file.allow=always submodule add -q -b main "$AGENT_OUT/sub.git" sub
  g commit -qm 'add sub'
  git rm -q --cached sub
  git ls-files -s > "$AGENT_OUT/index"
  if {other}; then echo other > OTHER.md; fi
fi
"#
        ));
        let child = sb.spawn(&script);
        let (snap, _) = sb.end_after_seal("run-1", child).await;
        assert!(!sb.read_out("index").contains("160000"), "not removed");
        let result = result_of(&snap, "run-1");
        let head = tip(&sb, &sb.coordinator.branch());
        let tree = bare_git(&sb, &["ls-tree", &head]);
        assert!(
            !tree.contains("160000") && tree.contains(".gitmodules"),
            "other change: {other}: {tree}\n{result}"
        );
        assert_eq!(tree.contains("OTHER.md"), other, "{tree}");
        // Its work tree, a repository of its own, stays in the sandbox.
        assert!(sb.root().join("repo/sub/.git").exists());
    }
}

/// A tracked file replaced by a directory of the same name, and a case-only
/// rename: committed as the work tree has them.
#[tokio::test]
async fn held_file_replaced_by_directory_and_case_rename() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  rm README.md && mkdir README.md && echo inner > README.md/inner.txt
  mv src/greeting.txt src/Greeting.txt
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let result = result_of(&snap, "run-1");
    let head = tip(&sb, &sb.coordinator.branch());
    assert_eq!(
        files_at(&sb, &head),
        vec!["README.md/inner.txt", "src/Greeting.txt"],
        "{result}"
    );
}

/// A large file the agent staged under a name that is a pathspec pattern
/// (`*`): putting it back as HEAD has it must touch that path alone (`git
/// reset`'s pathspec would read `*` as every path and undo the whole
/// harvest's commit, found while fixing the review's Latin-1 findings).
#[tokio::test]
async fn a_large_staged_file_named_like_a_pattern_is_put_back_alone() {
    let sb = limited_sandbox().await;
    let script = sb.script(&format!(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  head -c {BIG} /dev/zero > '*'
  git add -- ':(literal)*'
  git ls-files -s > "$AGENT_OUT/staged"
  echo kept > KEPT.md
fi
"#
    ));
    let child = spawn_with_limit(&sb, &script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    assert!(sb.read_out("staged").contains("\t*\n"), "not staged");
    let result = result_of(&snap, "run-1");
    let files = files_at(&sb, &tip(&sb, &sb.coordinator.branch()));
    assert!(files.contains(&"KEPT.md".to_string()), "{files:?} {result}");
    assert!(!files.contains(&"*".to_string()), "{files:?} {result}");
    assert_eq!(
        result["skippedFiles"],
        json!([{"path": "*", "bytes": BIG}]),
        "{result}"
    );
}

/// Every object of the remote that holds the connector value.
fn remote_objects_with_secret(sb: &Sandbox) -> Vec<String> {
    let all = bare_git(
        sb,
        &[
            "cat-file",
            "--batch-all-objects",
            "--batch-check=%(objectname)",
        ],
    );
    all.lines()
        .filter(|id| bare_git(sb, &["cat-file", "-p", id]).contains(CONNECTOR.1))
        .map(str::to_string)
        .collect()
}

// The second review (main at 799b843): each failed there.

/// Commit 1 records a gitlink `vendor` whose "commit" id is the id of a
/// blob holding the connector value (a gitlink is never read, nor sent).
/// Commit 2 puts a blob entry with that same id at `vendor`: the walk of
/// what a push brings took the parent's entry of the same id for the same,
/// so no guard read the blob, which the push sends. PROTOCOL 4.5: "The
/// runner never pushes a value it keeps secret".
#[tokio::test]
async fn a_blob_first_committed_as_a_gitlink_is_checked_for_secrets() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  blob=$(printf 'key %s\n' "$ACME_API_KEY" | git hash-object -w --stdin)
  echo "$blob" > "$AGENT_OUT/blob"
  git update-index --add --cacheinfo "160000,$blob,vendor"
  g commit -qm 'add vendor'
  git update-index --cacheinfo "100644,$blob,vendor"
  g commit -qm 'vendor as a file'
  git checkout -- vendor
  git status --short > "$AGENT_OUT/status"
fi
"#
    ));
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let result = result_of(&snap, "run-1");
    let blob = sb.read_out("blob").trim().to_string();
    let leaked = remote_objects_with_secret(&sb);
    assert!(
        leaked.is_empty(),
        "the connector value is on the remote in {leaked:?} (blob {blob}); status {:?}; result {result}",
        sb.read_out("status")
    );
}

/// The same with a tree: a gitlink whose id is a tree holding the secret,
/// then that tree at the same path. The subtree is never walked.
#[tokio::test]
async fn a_tree_first_committed_as_a_gitlink_is_checked_for_secrets() {
    let sb = Sandbox::with_connectors(&[CONNECTOR]).await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  blob=$(printf 'key %s\n' "$ACME_API_KEY" | git hash-object -w --stdin)
  tree=$(printf '100644 blob %s\tkey.txt\n' "$blob" | git mktree)
  git update-index --add --cacheinfo "160000,$tree,vendor"
  g commit -qm 'add vendor'
  git rm -q --cached vendor
  git read-tree --prefix=vendor/ "$tree"
  g commit -qm 'vendor inline'
  git checkout -- vendor
fi
"#
    ));
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let result = result_of(&snap, "run-1");
    let leaked = remote_objects_with_secret(&sb);
    assert!(
        leaked.is_empty(),
        "the connector value is on the remote in {leaked:?}; result {result}"
    );
}

/// The size guard walks the same way: a blob over the limit masked by a
/// gitlink of the same id is pushed, the host refuses the push, and (the
/// commit staying in HEAD) every later harvest. PROTOCOL 4.5 "Files over the
/// size limit": "later harvests are not blocked".
#[tokio::test]
async fn a_large_blob_first_committed_as_a_gitlink_is_left_out() {
    let sb = Sandbox::start(CoordinatorOptions {
        git_max_file_size: Some(LIMIT),
        ..CoordinatorOptions::default()
    })
    .await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  blob=$(head -c {BIG} /dev/zero | git hash-object -w --stdin)
  git update-index --add --cacheinfo "160000,$blob,data"
  g commit -qm 'add data'
  git update-index --cacheinfo "100644,$blob,data"
  g commit -qm 'data as a file'
  git checkout -- data
else
  echo two > TWO.md
fi
"#
    ));
    let child = spawn_with_limit(&sb, &script);
    let (first, second, _) = two_turns(&sb, child).await;
    assert_eq!(
        second["pushed"],
        json!(true),
        "run-1: {first}\nrun-2: {second}"
    );
}

/// A POSIX class in a quoted pattern (`[[:digit:]]`, which git's wildmatch
/// reads): a reader of the attributes of our own (before git was asked)
/// matched nothing, and the plaintext was pushed. PROTOCOL 4.5
/// `clean_filter`.
#[tokio::test]
async fn posix_class_in_a_quoted_pattern_leaves_the_file_out() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  printf '"secret[[:digit:]].env" filter=crypt\n' > .gitattributes
  echo 'plaintext-value' > secret1.env
  git check-attr filter -- secret1.env > "$AGENT_OUT/attrs"
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let attrs = sb.read_out("attrs");
    assert!(attrs.contains("filter: crypt"), "{attrs}");
    let head = tip(&sb, &sb.coordinator.branch());
    let result = result_of(&snap, "run-1");
    assert!(
        !files_at(&sb, &head).contains(&"secret1.env".to_string()),
        "plaintext pushed: {:?}; result {result}",
        bare_git(&sb, &["show", &format!("{head}:secret1.env")])
    );
}

/// An agent's `.gitattributes` of five macros, each naming the next 1000
/// times (9 KB; git answers in milliseconds): a reader of our own expanded
/// 1000^4 words for one path, the harvest's blocking thread never ended and
/// kept the runner's repository lock, so every later sync and harvest of the
/// session hung. PROTOCOL 4.5: a bound runs out with a report, not for the
/// rest of the session.
#[tokio::test]
async fn macro_fanout_does_not_wedge_later_harvests() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  for m in 0 1 2 3 4; do
    n=$((m+1)); printf '[attr]m%s' $m
    i=0; while [ $i -lt 1000 ]; do printf ' m%s' $n; i=$((i+1)); done; echo
  done > .gitattributes
  printf '"*.env" m0\n' >> .gitattributes
  echo x > x.env
  echo one > ONE.md
else
  rm -f .gitattributes x.env
  echo two > TWO.md
fi
"#,
    );
    let runner = Runner::spawn(&sb, &script);
    let snap = sb.wait_sealed("run-1").await;
    let first = result_of(&snap, "run-1");
    let next = sb.coordinator.queue_turn("next", None);
    // Longer than the suite's 30 s: the sync's and the harvest's bounds
    // (10 s each, scaled) and the turn between them.
    let sealed = sb
        .coordinator
        .wait_for(std::time::Duration::from_secs(150), |s| {
            s.run(&next).is_some_and(|r| r.finish.is_some())
        })
        .await;
    let Ok(snap) = sealed else {
        sb.coordinator.end_session();
        let output = runner.kill().await;
        panic!(
            "run-1: {first}\nrun-2 not sealed in 150 s (its turn never started: the sync waits on the repository lock the hung harvest holds)\n{}",
            output
                .lines()
                .filter(|l| l.contains("sync") || l.contains("timeout"))
                .take(8)
                .collect::<Vec<_>>()
                .join("\n")
        );
    };
    let second = result_of(&snap, &next);
    sb.coordinator.end_session();
    let output = runner.kill().await;
    let head = tip(&sb, &sb.coordinator.branch());
    assert!(
        second["pushed"] == json!(true) && files_at(&sb, &head).contains(&"TWO.md".to_string()),
        "run-1: {first}\nrun-2: {second}\nremote: {:?}\n{}",
        files_at(&sb, &head),
        output
            .lines()
            .filter(|l| l.contains("timeout") || l.contains("bound"))
            .take(6)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// `git add -N` of an ordinary file (no filter, small): the harvest must
/// commit its content; the intent-to-add removal must only drop entries
/// the harvest left out.
#[tokio::test]
async fn held_intent_to_add_of_an_ordinary_file_is_committed() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  echo 'new content' > new.txt
  git add -N new.txt
  mkdir -p d && echo 'deep' > d/n.txt && git add -N d/n.txt
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let result = result_of(&snap, "run-1");
    assert_eq!(
        sb.remote_file("new.txt").as_deref(),
        Some("new content\n"),
        "{result}"
    );
    assert_eq!(
        sb.remote_file("d/n.txt").as_deref(),
        Some("deep\n"),
        "{result}"
    );
}

/// `back_to_head` writes HEAD's entry into the index with the tree's raw
/// mode; libgit2's `git_index_add` refuses any mode but git's four
/// ("invalid entry mode"). A HEAD whose file has mode 100664 (old
/// repositories; `git mktree`) and a large file staged there: the
/// harvest's commit fails, and with it every later one while it stays
/// staged. PROTOCOL 4.5: a large staged file "gets HEAD's version back in
/// the index", the rest is committed.
#[tokio::test]
async fn staged_large_file_over_an_old_mode_is_put_back() {
    let sb = Sandbox::start(CoordinatorOptions {
        git_max_file_size: Some(LIMIT),
        ..CoordinatorOptions::default()
    })
    .await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  blob=$(echo small | git hash-object -w --stdin)
  tree=$( (git ls-tree HEAD; printf '100664 blob %s\tdata.bin\n' "$blob") | git mktree)
  c=$(g commit-tree "$tree" -p HEAD -m 'an old-style mode')
  git update-ref HEAD "$c"
  git read-tree HEAD
  git checkout -- .
  head -c {BIG} /dev/zero > data.bin
  git add data.bin
  echo kept > KEPT.md
fi
"#
    ));
    let child = spawn_with_limit(&sb, &script);
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    let result = result_of(&snap, "run-1");
    let head = tip(&sb, &sb.coordinator.branch());
    assert!(
        files_at(&sb, &head).contains(&"KEPT.md".to_string()),
        "{result}\n{}",
        output
            .lines()
            .filter(|l| l.contains("invalid entry mode"))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A submodule whose `.gitmodules` entry says `ignore = all`, moved in the
/// index to a commit only the sandbox has: `moved_gitlinks` reads libgit2's
/// tree-to-index diff, which may honour the submodule's ignore setting.
/// PROTOCOL 4.5: a gitlink the agent staged "is put back as HEAD has it".
#[tokio::test]
async fn held_staged_gitlink_of_an_ignore_all_submodule_is_put_back() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(&format!(
        r#"{G}
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  git init -q --bare "$AGENT_OUT/sub.git"
  git init -q "$AGENT_OUT/seed"
  g -C "$AGENT_OUT/seed" commit -q --allow-empty -m seed
  g -C "$AGENT_OUT/seed" push -q "$AGENT_OUT/sub.git" HEAD:refs/heads/main
  g -c protocol.file.allow=always submodule add -q -b main "$AGENT_OUT/sub.git" sub
  git config -f .gitmodules submodule.sub.ignore all
  git add .gitmodules
  g commit -qm 'add sub'
  g -C sub commit -q --allow-empty -m unpushed
  git -C sub rev-parse HEAD > "$AGENT_OUT/unpushed"
  git update-index --cacheinfo "160000,$(git -C sub rev-parse HEAD),sub"
  git ls-files -s sub > "$AGENT_OUT/staged"
  echo kept > KEPT.md
fi
"#
    ));
    let child = sb.spawn(&script);
    let (snap, _) = sb.end_after_seal("run-1", child).await;
    let result = result_of(&snap, "run-1");
    let head = tip(&sb, &sb.coordinator.branch());
    let unpushed = sb.read_out("unpushed").trim().to_string();
    let tree = bare_git(&sb, &["ls-tree", "-r", &head]);
    assert!(sb.read_out("staged").contains(&unpushed), "not staged");
    assert!(tree.contains("KEPT.md"), "{tree}\n{result}");
    assert!(
        !tree.contains(&unpushed),
        "the harvest committed the staged gitlink: {tree}\n{result}"
    );
}

/// A FIFO where git reads an attributes file (a nested `.gitattributes`):
/// `git check-attr` blocks on it; its own bound (3 s) ends it, the
/// harvest falls back to libgit2's reading and pushes the work within its
/// bound.
#[tokio::test]
async fn a_fifo_attributes_file_does_not_hold_the_harvest() {
    let sb = Sandbox::start(Default::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  mkdir -p d && mkfifo d/.gitattributes && echo x > d/f.txt
  echo kept > KEPT.md
fi
"#,
    );
    let child = sb.spawn(&script);
    let (snap, output) = sb.end_after_seal("run-1", child).await;
    let result = result_of(&snap, "run-1");
    assert_eq!(result["pushed"], json!(true), "{result}\n{output}");
    let files = files_at(&sb, &tip(&sb, &sb.coordinator.branch()));
    assert!(
        files.contains(&"KEPT.md".to_string()) && files.contains(&"d/f.txt".to_string()),
        "{files:?}"
    );
}
