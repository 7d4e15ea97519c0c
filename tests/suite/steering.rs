//! The agent cannot steer the runner (issue 31): no root process trusts a
//! file the agent user can write or follows its links, and every process
//! started for git work in `repo/` is wholly the agent user. The runner is
//! root and the agent a throwaway user (`--agent-user`): these tests need
//! root, as CI has; without it they fail.

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hosted_boot_coordinator::CoordinatorOptions;

use super::agent_user::{TestUser, runner_in_mode, sandbox_for, sandbox_with};
use super::support::{Runner, Sandbox, finish};

/// A user for the test; these tests do not skip.
fn test_user() -> TestUser {
    TestUser::create().unwrap_or_else(|reason| panic!("{reason}"))
}

/// Everything sent to a loopback listener (each connection read for up to
/// 2 s, answered by a close): where an agent would point a stolen request.
fn listener() -> (u16, Arc<Mutex<Vec<u8>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let kept = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 4096];
            while let Ok(n) = conn.read(&mut buf) {
                if n == 0 {
                    break;
                }
                kept.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        }
    });
    (port, seen)
}

/// Item 1. In file mode `boot-context.json` is the agent user's: the agent
/// points its boot secret at a root-only file, its token URLs at its own
/// listener and the helper's cache, lock and token files into a root-only
/// directory, then leaves work for the harvest. The runner's push must not
/// run that helper as root (before the fix its `sh` took root back and
/// sent the root-only file to the listener): the work is pushed, the
/// listener hears nothing, the directory gets nothing.
#[tokio::test]
async fn in_file_mode_a_rewritten_helper_context_steers_no_root_process() {
    let user = test_user();
    let sb = sandbox_for(&user).await;
    let vault = tempfile::tempdir().unwrap();
    std::fs::set_permissions(vault.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let marker = format!("root-only-{}", std::process::id());
    let secret = vault.path().join("secret");
    std::fs::write(&secret, &marker).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (port, heard) = listener();
    let script = sb.script(&format!(
        r#"
ctx="$(dirname "$ORIZU_TOKEN_FILE")/boot-context.json"
python3 - "$ctx" <<'PY'
import json, sys
path = sys.argv[1]
c = json.load(open(path))
c["bootSecretPath"] = "{secret}"
c["agentTokenUrl"] = "http://127.0.0.1:{port}/agent-token"
c["apiBaseUrl"] = "http://127.0.0.1:{port}/"
c["credentialCachePath"] = "{vault}/cache"
c["credentialLockPath"] = "{vault}/lock"
c["issuedTokensPath"] = "{vault}/issued"
c["insecureHttp"] = True
open(path, "w").write(json.dumps(c))
PY
echo "rewrote=$?" > "$AGENT_OUT/rewrote"
echo "work of the turn" > left.md
"#,
        secret = secret.display(),
        vault = vault.path().display(),
    ));
    let child = runner_in_mode(&sb, &script, &user.name, "file");
    let snap = sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(sb.read_out("rewrote").trim(), "rewrote=0", "{output}");
    let heard = String::from_utf8_lossy(&heard.lock().unwrap()).into_owned();
    assert!(
        !heard.contains(&marker),
        "the root-only file reached the agent's listener: {heard}"
    );
    assert_eq!(heard, "", "a runner process followed the rewritten URLs");
    let planted: Vec<_> = std::fs::read_dir(vault.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(planted, vec!["secret".to_string()], "{output}");
    let finish = snap.run("run-1").unwrap().finish.as_ref().unwrap();
    let result = serde_json::to_value(&finish.result).unwrap();
    assert_eq!(
        result["pushed"],
        serde_json::json!(true),
        "{result}\n{output}"
    );
    assert_eq!(
        sb.remote_file("left.md").as_deref(),
        Some("work of the turn\n")
    );
    assert_eq!(status.code(), Some(0), "{output}");
}

/// Item 1. Every process started for the runner's git work in `repo/` is
/// wholly the agent user (real, effective and saved ids): here the git of
/// the clone's completion, through the `git-lfs` it runs (a stand-in that
/// records its ids). Before, it ran as root in the agent's `repo/`.
#[tokio::test]
async fn the_completions_git_runs_wholly_as_the_agent_user() {
    let user = test_user();
    let src = tempfile::tempdir().unwrap();
    let sb = sandbox_with(
        &user,
        CoordinatorOptions {
            source_repo: Some(super::complete_workspace::lfs_sources(src.path())),
            ..CoordinatorOptions::default()
        },
    )
    .await;
    let bin = tempfile::tempdir().unwrap();
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let stand_in = bin.path().join("git-lfs");
    std::fs::write(
        &stand_in,
        "#!/bin/sh\ngrep -E '^(Uid|Gid):' /proc/self/status > \"$IDS_DIR/lfs-$1\"\n[ \"$1\" = version ] && echo 'git-lfs/3.3.0 (a test stand-in)'\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = sb.script("echo ran > \"$AGENT_OUT/ran\"");
    let child = runner_cmd(&sb, &script, &user.name)
        .env("PATH", path)
        .env("IDS_DIR", sb.out())
        .spawn()
        .unwrap();
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
    let ids = sb.read_out("lfs-version");
    let (uid, gid) = (user.uid, user_gid(&user));
    assert_eq!(
        ids,
        format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{gid}\t{gid}\t{gid}\t{gid}\n"),
        "{output}"
    );
}

/// The runner command of [`runner_in_mode`] (broker mode), not spawned.
fn runner_cmd(sb: &Sandbox, script: &std::path::Path, user: &str) -> tokio::process::Command {
    let mut cmd = sb.wrapped_command(&["env"], "run", script);
    cmd.env("HOSTED_BOOT_AGENT_USER", user);
    cmd
}

fn user_gid(user: &TestUser) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(&user.home).unwrap().gid()
}

/// Item 2. The documented root Pod mounts an `emptyDir` (0777) at the
/// root. The agent swaps `.orizu-run` for a link to a root-only directory;
/// before, the runner made that directory 0711, wrote the next run's files
/// through the link, and the next agent read what it held. Now the root is
/// made root's and 0755 at boot, so the swap fails, and the runner's
/// directories are never made through a link.
#[tokio::test]
async fn an_agent_cannot_put_a_link_where_the_runner_keeps_its_run_files() {
    use std::os::unix::fs::MetadataExt;
    let user = test_user();
    let sb = sandbox_for(&user).await;
    std::fs::set_permissions(sb.root(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let vault = tempfile::tempdir().unwrap();
    std::fs::set_permissions(vault.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(vault.path().join("secret"), "root-only").unwrap();
    std::fs::set_permissions(
        vault.path().join("secret"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let script = sb.script(&format!(
        r#"
root="{root}"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  mv "$root/.orizu-run" "$root/.orizu-run-moved" 2>/dev/null
  ln -s "{vault}" "$root/.orizu-run" 2>/dev/null
  echo "planted=$?" > "$AGENT_OUT/planted"
else
  cat "$root/.orizu-run/secret" > "$AGENT_OUT/read" 2>/dev/null
  echo "read=$?" >> "$AGENT_OUT/read"
fi
"#,
        root = sb.root().display(),
        vault = vault.path().display(),
    ));
    let child = runner_in_mode(&sb, &script, &user.name, "broker");
    sb.wait_sealed("run-1").await;
    let second = sb.coordinator.queue_turn("second", None);
    sb.wait_sealed(&second).await;
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
    let root = std::fs::metadata(sb.root()).unwrap();
    assert_eq!((root.uid(), root.mode() & 0o7777), (0, 0o755), "{output}");
    assert_eq!(sb.read_out("planted").trim(), "planted=1", "{output}");
    assert_eq!(sb.read_out("read").trim(), "read=1", "{output}");
    let vault_mode = std::fs::metadata(vault.path()).unwrap().mode() & 0o7777;
    assert_eq!(vault_mode, 0o700, "the runner changed the link's target");
    let held: Vec<_> = std::fs::read_dir(vault.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(held, vec!["secret".to_string()], "{output}");
}

/// Item 3. A FIFO where libgit2 opens a file by name (a `.gitignore`, a
/// `sub/.gitattributes`) or a FIFO ref behind a linked `.git/refs/heads`
/// blocked the harvest in `open(2)` with `repo/` held: the turn ended
/// `harvest_timeout` with nothing pushed and the next turn never sealed.
/// Now every harvest pushes and the runner ends.
#[tokio::test]
async fn a_fifo_the_agent_plants_wedges_no_harvest() {
    for plant in [
        "mkfifo .gitignore",
        "mkdir -p sub && mkfifo sub/.gitattributes && echo x > sub/file.txt",
        "mv .git/refs/heads \"$AGENT_OUT/heads\" && ln -s \"$AGENT_OUT/heads\" .git/refs/heads && mkfifo \"$AGENT_OUT/heads/stuck\"",
        // Where the harvest reads the work tree itself: an untracked FIFO,
        // a tracked file replaced by one.
        "mkfifo untracked-pipe && f=$(git ls-files | head -n 1) && rm \"$f\" && mkfifo \"$f\"",
    ] {
        let sb = Sandbox::start(CoordinatorOptions::default()).await;
        let script = sb.script(&format!(
            r#"
echo "work of $ORIZU_RUN_ID" > "work-$ORIZU_RUN_ID.md"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  {plant}
  echo "planted=$?" > "$AGENT_OUT/planted"
fi
"#
        ));
        let child = sb.spawn(&script);
        let first = sb.wait_sealed("run-1").await;
        let second = sb.coordinator.queue_turn("second", None);
        let (snap, output) = sb.end_after_seal(&second, child).await;
        assert_eq!(
            sb.read_out("planted").trim(),
            "planted=0",
            "{plant}: {output}"
        );
        for (run, snap) in [("run-1", &first), (second.as_str(), &snap)] {
            let finish = snap.run(run).unwrap().finish.as_ref().unwrap();
            let result = serde_json::to_value(&finish.result).unwrap();
            assert_eq!(
                result["pushed"],
                serde_json::json!(true),
                "{plant}: {run}: {result}\n{output}"
            );
            assert_eq!(
                sb.remote_file(&format!("work-{run}.md")).as_deref(),
                Some(format!("work of {run}\n").as_str()),
                "{plant}: {run}"
            );
        }
    }
}

/// Item 4. `repo/.git/config` is the agent's, and none of its settings
/// changes what the runner's git work contacts or opens: a rewrite of the
/// session remote (`insteadOf`, `pushInsteadOf`) to a dead port, a proxy,
/// an excludes file that ignores everything, an attributes file that is a
/// FIFO. Before, the rewrite made every later harvest fail `push_failed`.
/// Every turn's work is pushed, by a restarted runner too (it reuses
/// `repo/` with that configuration).
#[tokio::test]
async fn no_line_of_the_agents_git_config_redirects_the_runners_git() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
echo "work of $ORIZU_RUN_ID" > "work-$ORIZU_RUN_ID.md"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  u=$(git config --get remote.origin.url)
  git config url."http://127.0.0.1:9/nowhere/".insteadOf "$u" &&
  git config url."http://127.0.0.1:9/nowhere/".pushInsteadOf "$u" &&
  git config http.proxy http://127.0.0.1:9 &&
  echo '*' > "$AGENT_OUT/ignore-all" &&
  git config core.excludesFile "$AGENT_OUT/ignore-all" &&
  mkfifo "$AGENT_OUT/attributes" &&
  git config core.attributesFile "$AGENT_OUT/attributes"
  echo "configured=$?" > "$AGENT_OUT/configured"
fi
if [ "$ORIZU_RUN_ID" = run-3 ] && [ ! -e "$AGENT_OUT/restarted" ]; then
  touch "$AGENT_OUT/restarted"
  echo '{"type":"message","text":"waiting"}'
  sleep 1000
fi
"#,
    );
    let first = Runner::spawn(&sb, &script);
    sb.wait_sealed("run-1").await;
    let second = sb.coordinator.queue_turn("second", None);
    sb.wait_sealed(&second).await;
    let third = sb.coordinator.queue_turn("third", None);
    sb.wait_event(&third, "message", |e| e.kind == "message")
        .await;
    // The sandbox dies mid-turn: the next runner reuses repo/.
    let first_output = first.kill().await;
    let second_runner = Runner::spawn(&sb, &script);
    let sealed = sb
        .coordinator
        .wait_for(super::support::WAIT, |s| {
            s.run(&third).is_some_and(|r| r.finish.is_some())
        })
        .await;
    if sealed.is_err() {
        let output = second_runner.kill().await;
        panic!("the restarted runner never sealed {third}: {output}");
    }
    let (snap, output) = sb.end_after_seal(&third, second_runner).await;
    assert_eq!(
        sb.read_out("configured").trim(),
        "configured=0",
        "{first_output}"
    );
    for run in ["run-1", second.as_str(), third.as_str()] {
        assert_eq!(
            sb.remote_file(&format!("work-{run}.md")).as_deref(),
            Some(format!("work of {run}\n").as_str()),
            "{run}: {first_output}\n{output}"
        );
    }
    for run in ["run-1", second.as_str()] {
        let first_snap = sb.coordinator.snapshot();
        let finish = first_snap.run(run).unwrap().finish.clone().unwrap();
        let result = serde_json::to_value(&finish.result).unwrap();
        assert_eq!(result["pushed"], serde_json::json!(true), "{run}: {result}");
    }
    let finish = snap.run(&third).unwrap().finish.as_ref().unwrap();
    let result = serde_json::to_value(&finish.result).unwrap();
    assert_eq!(
        result["pushed"],
        serde_json::json!(true),
        "{result}\n{output}"
    );
}

/// Item 3, the places the removal before a hold does not know (found by
/// the review of the fix): a FIFO behind `.git/commondir`, behind
/// `objects/info/alternates`, as a tracked submodule's configuration or
/// behind its `gitdir:` file, behind an include the check misreads. The
/// watcher of the runner's git opens unblocks each (its open sees an empty
/// file): the work is pushed and the next turn seals.
#[tokio::test]
async fn a_fifo_wherever_the_repository_leads_wedges_no_harvest() {
    let nested = "mkdir nested && cd nested && git init -q && echo x > f && git add f && git -c user.name=a -c user.email=a@b commit -qm x && cd .. && git add nested && git -c user.name=a -c user.email=a@b commit -qm sub";
    for plant in [
        r#"mkdir -p "$AGENT_OUT/common" && cp -r .git/objects .git/refs "$AGENT_OUT/common/" && mkfifo "$AGENT_OUT/common/config" && echo "$AGENT_OUT/common" > .git/commondir"#.to_string(),
        r#"mkdir -p "$AGENT_OUT/alt/pack" && : > "$AGENT_OUT/alt/pack/pack-0000000000000000000000000000000000000000.pack" && mkfifo "$AGENT_OUT/alt/pack/pack-0000000000000000000000000000000000000000.idx" && echo "$AGENT_OUT/alt" > .git/objects/info/alternates"#.to_string(),
        format!("{nested} && rm nested/.git/config && mkfifo nested/.git/config && echo change > nested/f"),
        format!(r#"{nested} && mv nested/.git "$AGENT_OUT/subgit" && echo "gitdir: $AGENT_OUT/subgit" > nested/.git && rm "$AGENT_OUT/subgit/config" && mkfifo "$AGENT_OUT/subgit/config""#),
        r#"mkfifo pipe && printf '[core] [include] path = ../pipe\n' >> .git/config"#.to_string(),
    ] {
        let sb = Sandbox::start(CoordinatorOptions::default()).await;
        let script = sb.script(&format!(
            r#"
echo "work of $ORIZU_RUN_ID" > "work-$ORIZU_RUN_ID.md"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  ( {plant} ) > "$AGENT_OUT/plant.log" 2>&1
  echo "planted=$?" > "$AGENT_OUT/planted"
fi
"#
        ));
        let runner = Runner::spawn(&sb, &script);
        let first = sb.wait_sealed("run-1").await;
        let second = sb.coordinator.queue_turn("second", None);
        let sealed = sb
            .coordinator
            .wait_for(super::support::WAIT, |s| {
                s.run(&second).is_some_and(|r| r.finish.is_some())
            })
            .await;
        let output = if sealed.is_ok() {
            sb.coordinator.end_session();
            runner.finish().await.1
        } else {
            runner.kill().await
        };
        assert_eq!(
            sb.read_out("planted").trim(),
            "planted=0",
            "{plant}: {}",
            sb.read_out("plant.log")
        );
        assert!(sealed.is_ok(), "{plant}: the second turn never sealed: {output}");
        let finish = first.run("run-1").unwrap().finish.as_ref().unwrap();
        let result = serde_json::to_value(&finish.result).unwrap();
        assert_eq!(result["pushed"], serde_json::json!(true), "{plant}: {result}");
    }
}
