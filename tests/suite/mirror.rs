//! The git mirror (`--git-mirror-dir`, PROTOCOL.md 3 "Git mirror"): the
//! real binary against the reference coordinator, with a mirror made by
//! `git clone --mirror` of the served repository before the session branch
//! moved on. What the clone fetched is read from the coordinator's git
//! request record (`responseLen`); the agent's work must be pushed whether
//! the mirror was used, absent or corrupt.

use std::path::{Path, PathBuf};

use hosted_boot_coordinator::{CoordinatorOptions, Route, Snapshot, Target};
use pretty_assertions::assert_eq;

use super::support::{Sandbox, finish, git};

/// Files of the generated source repository: enough that its objects
/// outweigh the negotiation.
const FILES: usize = 300;

/// An agent that leaves a file for the harvest.
const AGENT: &str = r#"
echo "work of $ORIZU_RUN_ID" > "agent-$ORIZU_RUN_ID.md"
"#;

/// A source repository of [`FILES`] files of distinct content, one commit.
fn source_repo(dir: &Path) -> PathBuf {
    let src = dir.join("source");
    std::fs::create_dir_all(src.join("src")).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    for i in 0..FILES {
        let body: String = (0..40)
            .map(|j| format!("line {j} of file {i}: {}\n", i * 7919 + j))
            .collect();
        std::fs::write(src.join(format!("src/f{i}.txt")), body).unwrap();
    }
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "initial"]);
    src
}

/// A sandbox serving [`source_repo`], and a mirror of its bare repository
/// in `{dir}/mirrors/acme/app.git` made before the session branch got one
/// more commit.
async fn sandbox_with_mirror() -> (Sandbox, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let src = source_repo(tmp.path());
    let sb = Sandbox::start(CoordinatorOptions {
        source_repo: Some(src),
        ..CoordinatorOptions::default()
    })
    .await;
    let mirrors = sb.dir.path().join("mirrors");
    let mirror = mirrors.join("acme/app.git");
    std::fs::create_dir_all(mirror.parent().unwrap()).unwrap();
    git(
        sb.dir.path(),
        &[
            "clone",
            "-q",
            "--mirror",
            "--no-local",
            sb.coordinator.bare_repo().to_str().unwrap(),
            mirror.to_str().unwrap(),
        ],
    );
    advance_session_branch(&sb);
    (sb, mirrors)
}

/// One more commit on the session branch of the served repository (a
/// changed file), so the clone has something new to fetch.
fn advance_session_branch(sb: &Sandbox) {
    let work = sb.dir.path().join("advance");
    let bare = sb.coordinator.bare_repo();
    let branch = sb.coordinator.branch();
    git(
        sb.dir.path(),
        &[
            "clone",
            "-q",
            "--no-local",
            "--branch",
            &branch,
            bare.to_str().unwrap(),
            work.to_str().unwrap(),
        ],
    );
    std::fs::write(
        work.join("src/f0.txt"),
        "changed after the mirror was made\n",
    )
    .unwrap();
    git(&work, &["commit", "-q", "-am", "after the mirror"]);
    // Fetched into the bare repository (the pre-receive hook guards pushes).
    git(
        &bare,
        &[
            "fetch",
            "-q",
            work.to_str().unwrap(),
            &format!("+HEAD:refs/heads/{branch}"),
        ],
    );
}

/// Bytes the coordinator's git answers carried before `turn_started`: the
/// clone's transfer.
fn clone_bytes(snap: &Snapshot) -> u64 {
    let turn = snap
        .requests
        .iter()
        .position(|r| r.route == Route::BootStatus && r.body["status"] == "turn_started")
        .unwrap();
    snap.requests[..turn]
        .iter()
        .filter(|r| r.route == Target::Git)
        .map(|r| r.response_len)
        .sum()
}

/// Boots the binary (with `--git-mirror-dir mirrors` when given) for one
/// turn; returns the state at the seal and the runner's output, after
/// checking the agent's work was pushed onto the session branch.
async fn one_turn(sb: &Sandbox, mirrors: Option<&Path>) -> (Snapshot, String) {
    let mut cmd = sb.runner(&sb.script(AGENT));
    if let Some(dir) = mirrors {
        cmd.arg("--git-mirror-dir").arg(dir);
    }
    let child = cmd.spawn().unwrap();
    let snap = sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
    let finish = snap.run("run-1").unwrap().finish.clone().unwrap();
    let result = serde_json::to_value(&finish.result).unwrap();
    assert_eq!(result["pushed"], serde_json::json!(true), "{result}");
    let bare = sb.coordinator.bare_repo();
    let branch = sb.coordinator.branch();
    assert_eq!(
        git(&bare, &["show", &format!("{branch}:agent-run-1.md")]),
        "work of run-1",
        "the agent's work is on the session branch"
    );
    (snap, output)
}

fn logged(output: &str, message: &str) -> bool {
    output
        .lines()
        .any(|l| l.contains(&format!("\"message\":\"{message}\"")))
}

#[tokio::test]
async fn a_warm_git_mirror_makes_the_clone_fetch_less_and_the_work_is_pushed() {
    let (cold_sb, _) = sandbox_with_mirror().await;
    let (cold, cold_out) = one_turn(&cold_sb, None).await;
    let (sb, mirrors) = sandbox_with_mirror().await;
    let (warm, output) = one_turn(&sb, Some(&mirrors)).await;

    assert!(logged(&output, "git mirror used"), "{output}");
    assert!(!logged(&cold_out, "git mirror used"), "{cold_out}");
    let (warm, cold) = (clone_bytes(&warm), clone_bytes(&cold));
    // Only the one new commit's objects come over the wire.
    assert!(
        warm * 4 < cold,
        "the warm clone fetched {warm} bytes, the cold one {cold}"
    );
    // The clone is complete on its own (the mirror's objects were copied,
    // not borrowed) and carries none of the negotiation's refs.
    let repo = sb.root().join("repo");
    assert!(!repo.join(".git/objects/info/alternates").exists());
    assert_eq!(git(&repo, &["for-each-ref", "refs/hosted-boot/"]), "");
    std::fs::remove_dir_all(&mirrors).unwrap();
    git(&repo, &["fsck", "--connectivity-only"]);
    assert_eq!(
        std::fs::read_to_string(repo.join("src/f0.txt")).unwrap(),
        "changed after the mirror was made\n"
    );
}

#[tokio::test]
async fn a_missing_git_mirror_falls_back_to_a_plain_clone_and_the_work_is_pushed() {
    let (sb, mirrors) = sandbox_with_mirror().await;
    std::fs::remove_dir_all(mirrors.join("acme")).unwrap();
    let (_, output) = one_turn(&sb, Some(&mirrors)).await;
    assert!(
        logged(&output, "git mirror absent: plain clone"),
        "{output}"
    );
    assert!(!logged(&output, "git mirror used"), "{output}");
}

#[tokio::test]
async fn a_git_mirror_without_packs_falls_back_to_a_plain_clone_and_the_work_is_pushed() {
    let (sb, mirrors) = sandbox_with_mirror().await;
    let packs = mirrors.join("acme/app.git/objects/pack");
    for e in std::fs::read_dir(&packs).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "idx") {
            std::fs::remove_file(p).unwrap();
        }
    }
    let (_, output) = one_turn(&sb, Some(&mirrors)).await;
    assert!(
        logged(&output, "git mirror unusable: plain clone"),
        "{output}"
    );
}

#[tokio::test]
async fn a_corrupt_git_mirror_falls_back_to_a_plain_clone_and_the_work_is_pushed() {
    let (sb, mirrors) = sandbox_with_mirror().await;
    // Damage one blob of the tip's tree inside the mirror's pack (its
    // commits and trees stay readable, so the mirror is used and the
    // damage is found only when the checkout reads that blob).
    let mirror = mirrors.join("acme/app.git");
    let blob = git(&mirror, &["rev-parse", "main:src/f1.txt"]);
    let pack_dir = mirror.join("objects/pack");
    let idx = std::fs::read_dir(&pack_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "idx"))
        .unwrap();
    let verify = git(&mirror, &["verify-pack", "-v", idx.to_str().unwrap()]);
    let (offset, in_pack) = verify
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&blob.as_str())).then(|| {
                (
                    f[4].parse::<usize>().unwrap(),
                    f[3].parse::<usize>().unwrap(),
                )
            })
        })
        .unwrap();
    let pack = idx.with_extension("pack");
    let mut bytes = std::fs::read(&pack).unwrap();
    for b in &mut bytes[offset + in_pack / 2..offset + in_pack - 1] {
        *b ^= 0x5a;
    }
    std::fs::write(&pack, bytes).unwrap();

    let (_, output) = one_turn(&sb, Some(&mirrors)).await;
    assert!(logged(&output, "git mirror used"), "{output}");
    assert!(
        logged(&output, "the clone from the git mirror failed: plain clone"),
        "{output}"
    );
    let repo = sb.root().join("repo");
    git(&repo, &["fsck"]);
}
