//! A complete workspace (PROTOCOL.md 3, "A complete workspace"; issue 14)
//! with the real binary: a submodule on the session's host checked out at
//! the commit the session branch records, through the credential helper
//! (broker and file mode); a submodule on another host, or on a local
//! transport, skipped and never contacted; the harvest leaves a submodule
//! the agent changed as it is; an LFS file the reference coordinator serves
//! checked out whole where git-lfs is installed, named as a pointer where
//! it is not; the harvest never commits an LFS-tracked path.

use std::path::{Path, PathBuf};

use hosted_boot::wire::Event;
use hosted_boot_coordinator::{CoordinatorOptions, lfs_pointer};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use super::support::{Runner, Sandbox, git};

/// A repository with `files` (path, content) committed on `main`.
fn repo_with(dir: &Path, files: &[(&str, &str)]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    for (path, content) in files {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "files"]);
    dir.to_path_buf()
}

/// Adds a gitlink at `path` to commit `commit` with `url` in `.gitmodules`,
/// committed (no fetch: the superproject is built offline).
fn add_gitlink(dir: &Path, name: &str, path: &str, url: &str, commit: &str) {
    let mut modules = std::fs::read_to_string(dir.join(".gitmodules")).unwrap_or_default();
    modules.push_str(&format!(
        "[submodule \"{name}\"]\n\tpath = {path}\n\turl = {url}\n"
    ));
    std::fs::write(dir.join(".gitmodules"), modules).unwrap();
    git(
        dir,
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{commit},{path}"),
        ],
    );
    git(dir, &["add", ".gitmodules"]);
    git(dir, &["commit", "-q", "-m", &format!("submodule {name}")]);
}

/// A sandbox whose session repository is a copy of `app`.
async fn sandbox_of(app: PathBuf) -> Sandbox {
    Sandbox::start(CoordinatorOptions {
        source_repo: Some(app),
        ..CoordinatorOptions::default()
    })
    .await
}

/// Each submodule of a `hosted_boot.workspace` event: path, outcome,
/// commit.
fn outcomes(data: &Value) -> Vec<(String, String, Option<String>)> {
    data["submodules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["path"].as_str().unwrap().to_string(),
                s["outcome"].as_str().unwrap().to_string(),
                s["commit"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// Runs `script` as the agent of run-1, asserts the run succeeded, and
/// returns its `hosted_boot.workspace` event's data and the runner's output.
async fn first_turn_workspace(sb: &Sandbox, script: &std::path::Path) -> (Value, String) {
    let (snapshot, output) = sb.end_after_seal("run-1", Runner::spawn(sb, script)).await;
    let run = snapshot.runs.iter().find(|r| r.id == "run-1").unwrap();
    assert_eq!(run.status, "succeeded", "{output}");
    (workspace_event(&run.events), output)
}

fn workspace_event(events: &[Event]) -> Value {
    let found: Vec<&Event> = events
        .iter()
        .filter(|e| e.kind == "hosted_boot.workspace")
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one hosted_boot.workspace event: {events:?}"
    );
    found[0].data.clone()
}

/// The file at `path` of the session branch on the coordinator, or `None`.
fn remote_file(sb: &Sandbox, path: &str) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(sb.coordinator.bare_repo())
        .args([
            "show",
            &format!("refs/heads/{}:{path}", sb.coordinator.branch()),
        ])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn remote_gitlink(sb: &Sandbox, path: &str) -> String {
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(sb.coordinator.bare_repo())
        .args([
            "ls-tree",
            &format!("refs/heads/{}", sb.coordinator.branch()),
            path,
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The library repository (two commits: the superproject records the
/// first) and a superproject with it as `lib` by a relative URL.
fn submodule_sources(dir: &Path) -> (PathBuf, PathBuf, String) {
    let lib = repo_with(&dir.join("lib"), &[("lib.txt", "library v1\n")]);
    let recorded = git(&lib, &["rev-parse", "HEAD"]);
    std::fs::write(lib.join("lib.txt"), "library v2\n").unwrap();
    git(&lib, &["commit", "-q", "-am", "v2"]);
    let app = repo_with(&dir.join("app"), &[("README.md", "app\n")]);
    add_gitlink(&app, "lib", "lib", "../lib.git", &recorded);
    (lib, app, recorded)
}

/// What the agent reports about `lib`, then its work: a change inside the
/// submodule committed there, another left uncommitted, and a file of the
/// superproject.
const SUBMODULE_AGENT: &str = r#"
git -C lib rev-parse HEAD > "$AGENT_OUT/lib-head"
cat lib/lib.txt > "$AGENT_OUT/lib-txt"
echo changed > lib/lib.txt
git -C lib -c user.name=a -c user.email=a@a commit -q -am "agent inside the submodule"
echo more > lib/more.txt
echo work > notes.txt
"#;

async fn submodule_turn(mode: &str) {
    let src = tempfile::tempdir().unwrap();
    let (lib, app, recorded) = submodule_sources(src.path());
    let sb = sandbox_of(app).await;
    if mode == "file" {
        // Through the dev API, as a platform's test would.
        let resp = reqwest::Client::new()
            .post(format!("{}dev/repos", sb.coordinator.base_url()))
            .json(&json!({"fullName": "acme/lib", "source": lib}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
    } else {
        sb.coordinator.add_repository("acme/lib", &lib).unwrap();
    }
    let mut cmd = sb.runner(&sb.script(SUBMODULE_AGENT));
    cmd.env("HOSTED_BOOT_CREDENTIAL_MODE", mode);
    let (snapshot, output) = sb
        .end_after_seal("run-1", Runner::reading(cmd.spawn().unwrap()))
        .await;
    assert_eq!(sb.read_out("lib-head").trim(), recorded, "{mode}: {output}");
    assert_eq!(sb.read_out("lib-txt"), "library v1\n", "{mode}");
    let run = snapshot.runs.iter().find(|r| r.id == "run-1").unwrap();
    let data = workspace_event(&run.events);
    assert_eq!(
        data["submodules"],
        json!([{
            "path": "lib",
            "url": format!("{}/acme/lib.git", sb.coordinator.git_base_url()),
            "outcome": "checkedOut",
            "commit": recorded,
        }]),
        "{mode}"
    );
    // The harvest committed the superproject's file, left the gitlink at
    // the recorded commit and nothing of the submodule's work.
    assert_eq!(
        remote_file(&sb, "notes.txt").as_deref(),
        Some("work\n"),
        "{mode}: {output}"
    );
    assert!(
        remote_gitlink(&sb, "lib").contains(&recorded),
        "{mode}: the gitlink moved: {}",
        remote_gitlink(&sb, "lib")
    );
    assert_eq!(remote_file(&sb, "lib/more.txt"), None, "{mode}");
    assert_eq!(
        std::fs::read_to_string(sb.root().join("repo/lib/more.txt")).unwrap(),
        "more\n",
        "{mode}: the submodule's work is left in its work tree"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submodule_on_the_sessions_host_is_checked_out_at_its_recorded_commit_and_left_alone_by_the_harvest()
 {
    submodule_turn("broker").await;
    submodule_turn("file").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submodule_on_another_host_or_a_local_transport_is_skipped_and_never_contacted() {
    let src = tempfile::tempdir().unwrap();
    let lib = repo_with(&src.path().join("lib"), &[("lib.txt", "library\n")]);
    let commit = git(&lib, &["rev-parse", "HEAD"]);
    // Another host: a listener on another loopback address that counts
    // every connection.
    let other = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let other_url = format!("http://{}/git/acme/lib.git", other.local_addr().unwrap());
    let app = repo_with(&src.path().join("app"), &[("README.md", "app\n")]);
    add_gitlink(&app, "elsewhere", "elsewhere", &other_url, &commit);
    let file_url = format!("file://{}", lib.display());
    add_gitlink(&app, "local", "local", &file_url, &commit);
    // On the session's host, but its path is pathspec magic that, read as
    // magic, would select every submodule, the skipped ones too.
    add_gitlink(&app, "magic", ":(exclude)zz", "../lib.git", &commit);
    let sb = sandbox_of(app).await;
    sb.coordinator.add_repository("acme/lib", &lib).unwrap();
    let script =
        sb.script("ls -A elsewhere local > \"$AGENT_OUT/listing\" 2>&1; echo ok > notes.txt");
    let (data, _) = first_turn_workspace(&sb, &script).await;
    let outcomes: Vec<(String, String)> = outcomes(&data)
        .into_iter()
        .map(|(path, outcome, _)| (path, outcome))
        .filter(|(path, _)| path != ":(exclude)zz")
        .collect();
    assert_eq!(
        outcomes,
        vec![
            ("elsewhere".to_string(), "skipped".to_string()),
            ("local".to_string(), "skipped".to_string())
        ],
        "{data}"
    );
    assert_eq!(
        sb.read_out("listing"),
        "elsewhere:\n\nlocal:\n",
        "empty directories"
    );
    let contacted =
        tokio::time::timeout(std::time::Duration::from_millis(200), other.accept()).await;
    assert!(contacted.is_err(), "the other host was contacted");
    let config = std::fs::read_to_string(sb.root().join("repo/.git/config")).unwrap();
    assert!(
        !config.contains("[submodule \"elsewhere\"]") && !config.contains("[submodule \"local\"]"),
        "a skipped submodule stays configured: {config}"
    );
}

/// Whether git-lfs runs here; where it does not, the test skips (and
/// fails, naming git-lfs, unless the run allows skipping).
fn git_lfs_or_skip() -> bool {
    let runs = std::process::Command::new("git-lfs")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !runs {
        hosted_boot_test_support::skip("git-lfs is not on PATH (apt-get install git-lfs)");
    }
    runs
}

const LFS_CONTENT: &str = "binary-ish content served from LFS, 0123456789\n";

pub(super) fn lfs_sources(dir: &Path) -> PathBuf {
    repo_with(
        &dir.join("app"),
        &[
            ("README.md", "app\n"),
            (
                ".gitattributes",
                "*.bin filter=lfs diff=lfs merge=lfs -text\n",
            ),
            ("assets/model.bin", &lfs_pointer(LFS_CONTENT.as_bytes())),
        ],
    )
}

const LFS_AGENT: &str = r#"
cat assets/model.bin > "$AGENT_OUT/model"
echo new > assets/new.bin
echo work > notes.txt
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_lfs_file_served_by_the_coordinator_is_checked_out_whole_and_never_committed_by_the_harvest()
 {
    if !git_lfs_or_skip() {
        return;
    }
    let src = tempfile::tempdir().unwrap();
    let sb = Sandbox::start(CoordinatorOptions {
        source_repo: Some(lfs_sources(src.path())),
        ..CoordinatorOptions::default()
    })
    .await;
    sb.coordinator.add_lfs_object(LFS_CONTENT.as_bytes());
    let (snapshot, output) = sb
        .end_after_seal("run-1", Runner::spawn(&sb, &sb.script(LFS_AGENT)))
        .await;
    assert_eq!(sb.read_out("model"), LFS_CONTENT, "{output}");
    let run = snapshot.runs.iter().find(|r| r.id == "run-1").unwrap();
    assert_eq!(
        workspace_event(&run.events),
        json!({"submodules": [], "lfs": {"gitLfs": true, "files": 1, "pointers": []}})
    );
    assert_eq!(
        remote_file(&sb, "notes.txt").as_deref(),
        Some("work\n"),
        "{output}"
    );
    assert_eq!(
        remote_file(&sb, "assets/model.bin"),
        Some(lfs_pointer(LFS_CONTENT.as_bytes())),
        "the harvest replaced the pointer"
    );
    assert_eq!(
        remote_file(&sb, "assets/new.bin"),
        None,
        "an LFS-tracked file was committed"
    );
    // The agent's git sees the LFS file as unchanged (the filter is set).
    let status = git(
        &sb.root().join("repo"),
        &["status", "--porcelain", "assets/model.bin"],
    );
    assert_eq!(status, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_git_lfs_the_pointer_checkout_is_named_in_an_event() {
    // A PATH of every program of the test's PATH but git-lfs.
    let bin = tempfile::tempdir().unwrap();
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let link = bin.path().join(&name);
            if name != "git-lfs" && !link.exists() {
                let _ = std::os::unix::fs::symlink(entry.path(), link);
            }
        }
    }
    let src = tempfile::tempdir().unwrap();
    let sb = Sandbox::start(CoordinatorOptions {
        source_repo: Some(lfs_sources(src.path())),
        ..CoordinatorOptions::default()
    })
    .await;
    // Through the dev API, which also gives the pointer to commit.
    let resp: Value = reqwest::Client::new()
        .post(format!("{}dev/lfs", sb.coordinator.base_url()))
        .json(&json!({"content": LFS_CONTENT}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resp["pointer"], lfs_pointer(LFS_CONTENT.as_bytes()));
    let mut cmd = sb.runner(&sb.script(LFS_AGENT));
    cmd.env("PATH", bin.path());
    let (snapshot, output) = sb
        .end_after_seal("run-1", Runner::reading(cmd.spawn().unwrap()))
        .await;
    assert_eq!(
        sb.read_out("model"),
        lfs_pointer(LFS_CONTENT.as_bytes()),
        "{output}"
    );
    let run = snapshot.runs.iter().find(|r| r.id == "run-1").unwrap();
    assert_eq!(
        workspace_event(&run.events),
        json!({"submodules": [], "lfs": {"gitLfs": false, "files": 1, "pointers": ["assets/model.bin"]}})
    );
    assert_eq!(
        remote_file(&sb, "assets/new.bin"),
        None,
        "an LFS-tracked file was committed"
    );
    assert_eq!(remote_file(&sb, "notes.txt").as_deref(), Some("work\n"));
}

/// `hosted-boot-coordinator demo --complete-workspace` serves the sample with a
/// submodule and an LFS file; the runner checks both out and the demo shows
/// the first turn's `hosted_boot.workspace` event.
#[tokio::test]
async fn the_demo_serves_a_submodule_and_an_lfs_file_with_complete_workspace() {
    let text = super::support::demo_stdout(&["--complete-workspace"]).await;
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("workspace: "))
        .unwrap_or_else(|| panic!("no workspace line:\n{text}"));
    let data: Value = serde_json::from_str(line.trim_start().trim_start_matches("workspace: "))
        .unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(data["submodules"][0]["path"], "vendor/lib", "{line}");
    assert_eq!(data["submodules"][0]["outcome"], "checkedOut", "{line}");
    let has_lfs = std::process::Command::new("git-lfs")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert_eq!(data["lfs"]["gitLfs"], has_lfs, "{line}");
    assert_eq!(data["lfs"]["files"], 1, "{line}");
}

/// A stand-in `git-lfs` in `bin` whose `pull` hangs with a child of its
/// own, after writing its process group's id to the returned marker; and
/// a PATH with it first. The group's id comes from `/proc`: `ps` (procps)
/// is not on a minimal Debian machine, where this test once failed.
fn lfs_pull_stand_in(bin: &Path) -> (PathBuf, String) {
    let marker = bin.join("pulling");
    let fake = bin.join("git-lfs");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\ncase \"$1\" in\n  version) echo 'git-lfs/3.3.0 (a test stand-in)'; exit 0;;\n  pull) sleep 600 & cut -d' ' -f5 /proc/$$/stat > '{m}.tmp'; mv '{m}.tmp' '{m}'; wait; exit 0;;\nesac\nexit 0\n",
            m = marker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    (marker, path)
}

/// A stop signal while the completion's `git` runs (here a `git lfs pull`
/// that hangs, with a child of its own) kills that git's whole process
/// group: nothing the runner started outlives it (PROTOCOL.md 4.4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_signal_during_the_lfs_pull_leaves_no_git_process_running() {
    let bin = tempfile::tempdir().unwrap();
    let (marker, path) = lfs_pull_stand_in(bin.path());
    let src = tempfile::tempdir().unwrap();
    let sb = Sandbox::start(CoordinatorOptions {
        source_repo: Some(lfs_sources(src.path())),
        ..CoordinatorOptions::default()
    })
    .await;
    let mut cmd = sb.runner(&sb.script(LFS_AGENT));
    cmd.env("PATH", path);
    let runner = Runner::reading(cmd.spawn().unwrap());
    let group = stand_in_group(&marker).await;
    assert!(
        !group.live_members().is_empty(),
        "the stand-in's group is not alive"
    );
    super::support::signal(runner.pid(), rustix::process::Signal::TERM);
    let (_status, output) = runner.finish().await;
    super::support::assert_groups_empty(&[group]);
    assert!(
        !sb.out().join("model").exists(),
        "the agent ran after a stop during the clone step: {output}"
    );
}

/// A repository's `.lfsconfig` cannot send `git lfs pull` elsewhere: its
/// `lfs.url` (another host here; ssh or a local store alike) is overridden
/// by the session's own endpoint, so the object comes from the session's
/// coordinator and the other host is never contacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_lfsconfig_naming_another_endpoint_is_not_followed() {
    if !git_lfs_or_skip() {
        return;
    }
    let other = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let src = tempfile::tempdir().unwrap();
    let app = lfs_sources(src.path());
    std::fs::write(
        app.join(".lfsconfig"),
        format!(
            "[lfs]\n\turl = http://{}/lfs\n",
            other.local_addr().unwrap()
        ),
    )
    .unwrap();
    git(&app, &["add", ".lfsconfig"]);
    git(&app, &["commit", "-q", "-m", "lfsconfig"]);
    let sb = sandbox_of(app).await;
    sb.coordinator.add_lfs_object(LFS_CONTENT.as_bytes());
    let (_snapshot, output) = sb
        .end_after_seal("run-1", Runner::spawn(&sb, &sb.script(LFS_AGENT)))
        .await;
    assert_eq!(sb.read_out("model"), LFS_CONTENT, "{output}");
    let contacted =
        tokio::time::timeout(std::time::Duration::from_millis(200), other.accept()).await;
    assert!(contacted.is_err(), "the .lfsconfig endpoint was contacted");
}

/// An LFS-tracked path by a nested `.gitattributes` the agent wrote is
/// left out of the harvest's commit, as one tracked by the root's is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_lfs_tracked_by_a_nested_gitattributes_is_never_committed() {
    let src = tempfile::tempdir().unwrap();
    let app = repo_with(&src.path().join("app"), &[("README.md", "app\n")]);
    let sb = sandbox_of(app).await;
    let script = sb.script(
        "mkdir sub; printf '*.dat filter=lfs diff=lfs merge=lfs -text\\n' > sub/.gitattributes; echo 'BIG LFS CONTENT' > sub/x.dat; echo work > notes.txt",
    );
    let (snapshot, output) = sb
        .end_after_seal("run-1", Runner::spawn(&sb, &script))
        .await;
    assert_eq!(
        remote_file(&sb, "notes.txt").as_deref(),
        Some("work\n"),
        "{output}"
    );
    assert_eq!(
        remote_file(&sb, "sub/x.dat"),
        None,
        "an LFS-tracked file was committed as a blob"
    );
    // Named, so that the coordinator knows work stays in the sandbox
    // (issue 33).
    let result = serde_json::to_value(
        &snapshot
            .run("run-1")
            .unwrap()
            .finish
            .as_ref()
            .unwrap()
            .result,
    )
    .unwrap();
    assert_eq!(
        result["skippedFiles"],
        serde_json::json!([{"path": "sub/x.dat", "bytes": 16, "reason": "lfs"}]),
        "{result}"
    );
}

/// One malformed or refused entry of `.gitmodules` skips that submodule
/// alone (PROTOCOL.md 3, "A complete workspace"): no URL, a URL that reads
/// as an option, `update = !command` (never run) or `none`, a path `.`,
/// `../x` or into `.git`, a name defined twice; the others of the same
/// level are checked out (`update = rebase` as a fresh checkout, as git
/// does for a submodule it has just cloned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_gitmodules_entry_skips_that_submodule_and_checks_out_the_others() {
    let src = tempfile::tempdir().unwrap();
    let lib = repo_with(&src.path().join("lib"), &[("lib.txt", "library\n")]);
    let commit = git(&lib, &["rev-parse", "HEAD"]);
    let ran = src.path().join("update-command-ran");
    let app = repo_with(&src.path().join("app"), &[("README.md", "app\n")]);
    for path in ["good", "nourl", "cmd", "none", "rebase", "dash", "dup"] {
        git(
            &app,
            &[
                "update-index",
                "--add",
                "--cacheinfo",
                &format!("160000,{commit},{path}"),
            ],
        );
    }
    std::fs::write(
        app.join(".gitmodules"),
        format!(
            "[submodule \"good\"]\n\tpath = good\n\turl = ../lib.git\n\
             [submodule \"nourl\"]\n\tpath = nourl\n\
             [submodule \"cmd\"]\n\tpath = cmd\n\turl = ../lib.git\n\tupdate = !touch {}\n\
             [submodule \"none\"]\n\tpath = none\n\turl = ../lib.git\n\tupdate = none\n\
             [submodule \"rebase\"]\n\tpath = rebase\n\turl = ../lib.git\n\tupdate = rebase\n\
             [submodule \"dash\"]\n\tpath = dash\n\turl = -oProxyCommand=x\n\
             [submodule \"dup\"]\n\tpath = dup\n\turl = ../lib.git\n\
             [submodule \"dup\"]\n\tpath = dup2\n\turl = ../lib.git\n\
             [submodule \"dot\"]\n\tpath = .\n\turl = ../lib.git\n\
             [submodule \"up\"]\n\tpath = ../x\n\turl = ../lib.git\n\
             [submodule \"ingit\"]\n\tpath = .git/hooks\n\turl = ../lib.git\n",
            ran.display()
        ),
    )
    .unwrap();
    git(&app, &["add", ".gitmodules"]);
    git(&app, &["commit", "-q", "-m", "submodules"]);
    let sb = sandbox_of(app).await;
    sb.coordinator.add_repository("acme/lib", &lib).unwrap();
    let script = sb.script("cat good/lib.txt rebase/lib.txt > \"$AGENT_OUT/libs\"; ls -A none cmd > \"$AGENT_OUT/empty\" 2>&1");
    let (data, output) = first_turn_workspace(&sb, &script).await;
    let mut outcomes = outcomes(&data);
    outcomes.sort();
    let checked_out = |p: &str| {
        (
            p.to_string(),
            "checkedOut".to_string(),
            Some(commit.clone()),
        )
    };
    let skipped = |p: &str| (p.to_string(), "skipped".to_string(), None);
    let mut expected = vec![
        checked_out("good"),
        checked_out("rebase"),
        skipped("nourl"),
        skipped("cmd"),
        skipped("none"),
        skipped("dash"),
        skipped("dup"),
        skipped("."),
        skipped("../x"),
        skipped(".git/hooks"),
    ];
    expected.sort();
    assert_eq!(outcomes, expected, "{data}\n{output}");
    for s in data["submodules"].as_array().unwrap() {
        if s["outcome"] == "skipped" {
            assert!(
                s["reason"].as_str().is_some_and(|r| !r.is_empty()),
                "a skipped submodule with no reason: {s}"
            );
        }
    }
    assert_eq!(sb.read_out("libs"), "library\nlibrary\n", "{output}");
    assert_eq!(sb.read_out("empty"), "cmd:\n\nnone:\n", "{output}");
    assert!(!ran.exists(), "the update command of .gitmodules ran");
}

/// A boot killed (SIGKILL) during the completion's `git lfs pull` leaves
/// `repo/` with its completion unfinished; the restarted boot reuses
/// `repo/` and finishes the completion (PROTOCOL.md 3, "A complete
/// workspace": the marker `<root>/.hosted-boot/completion-pending`): the
/// submodule is checked out, the LFS file smudged, and the agent's work is
/// pushed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_boot_killed_during_the_lfs_pull_is_completed_by_the_restarted_boot() {
    // The restarted boot completes the pull with the real git-lfs.
    if !git_lfs_or_skip() {
        return;
    }
    let bin = tempfile::tempdir().unwrap();
    let (marker, stand_in_path) = lfs_pull_stand_in(bin.path());
    let src = tempfile::tempdir().unwrap();
    let lib = repo_with(&src.path().join("lib"), &[("lib.txt", "library\n")]);
    let recorded = git(&lib, &["rev-parse", "HEAD"]);
    let app = lfs_sources(src.path());
    add_gitlink(&app, "lib", "lib", "../lib.git", &recorded);
    let commits_before: usize = git(&app, &["rev-list", "--count", "HEAD"]).parse().unwrap();
    let sb = sandbox_of(app).await;
    sb.coordinator.add_repository("acme/lib", &lib).unwrap();
    sb.coordinator.add_lfs_object(LFS_CONTENT.as_bytes());
    let script = sb.script(
        "cat assets/model.bin > \"$AGENT_OUT/model\"; cat lib/lib.txt > \"$AGENT_OUT/lib\"; echo work > notes.txt",
    );
    let mut cmd = sb.runner(&script);
    cmd.env("PATH", stand_in_path);
    let first = Runner::reading(cmd.spawn().unwrap());
    let group = stand_in_group(&marker).await;
    let first_output = first.kill().await;
    super::support::kill_group(&group);
    assert!(
        !sb.out().join("model").exists(),
        "the agent ran before the completion: {first_output}"
    );
    let (snapshot, output) = sb
        .end_after_seal("run-1", Runner::spawn(&sb, &script))
        .await;
    assert_eq!(sb.read_out("model"), LFS_CONTENT, "{output}");
    assert_eq!(sb.read_out("lib"), "library\n", "{output}");
    let run = snapshot.runs.iter().find(|r| r.id == "run-1").unwrap();
    let data = workspace_event(&run.events);
    assert_eq!(data["submodules"][0]["outcome"], "checkedOut", "{data}");
    assert_eq!(data["lfs"]["pointers"], json!([]), "{data}");
    assert_eq!(
        remote_file(&sb, "notes.txt").as_deref(),
        Some("work\n"),
        "{output}"
    );
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(sb.coordinator.bare_repo())
        .args([
            "rev-list",
            "--count",
            &format!("refs/heads/{}", sb.coordinator.branch()),
        ])
        .output()
        .unwrap();
    let commits_after: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(
        commits_after,
        commits_before + 1,
        "one harvest commit: {output}"
    );
    assert!(
        !sb.root().join(".hosted-boot/completion-pending").exists(),
        "the marker stays after the completion"
    );
}

/// The process group the stand-in `git lfs pull` wrote into `marker` once it
/// runs (waits for the file).
async fn stand_in_group(marker: &std::path::Path) -> super::support::Group {
    super::support::wait_for_file(marker).await;
    let pgid = std::fs::read_to_string(marker)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The stand-in waits for its own child: the git that leads its group
    // is alive now.
    super::support::Group::of_live_leader(pgid)
}
