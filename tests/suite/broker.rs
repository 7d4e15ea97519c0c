//! The credential broker (PROTOCOL.md section 3, issue 13): in broker mode
//! (the default) `boot-secret` never exists, the agent's git gets repo
//! tokens through the broker's socket for the session's remote only, one
//! mint serves concurrent requests, nothing the agent can find mints a
//! bearer, and a peer of another uid is refused. File mode keeps the
//! file-based helper.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hosted_boot_coordinator::{CoordinatorOptions, Route};

use super::support::{Sandbox, WAIT, assert_no_secret, wait_for_file};

/// The lines an agent script uses to find the credential helper git runs
/// (`$helper get` runs it with git's request on stdin) and the session's
/// remote as git describes it (protocol, host, path).
const HELPER: &str = r#"
helper=$(git config --get-all credential.helper | tail -n 1 | sed 's/^!//')
url=$(git remote get-url origin)
proto=${url%%://*}
rest=${url#*://}
host=${rest%%/*}
path=${rest#*/}
"#;

/// An agent script that signals `ready` and waits (bounded) for the test to
/// create `go` in `$AGENT_OUT`.
const WAIT_FOR_GO: &str = r#"
: > "$AGENT_OUT/ready"
i=0
while [ ! -e "$AGENT_OUT/go" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
"#;

/// The session directory's files, as the test sees them now.
fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The runner's JSON log lines whose message is `message`.
fn log_lines<'a>(output: &'a str, message: &str) -> Vec<&'a str> {
    output
        .lines()
        .filter(|l| l.contains(&format!("\"message\":\"{message}\"")) || l.contains(message))
        .collect()
}

#[tokio::test]
async fn in_broker_mode_boot_secret_never_exists_and_the_socket_is_served() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // The agent looks for the file too, the way a prompt-injected agent
    // would (its working directory is repo/, the session's files are
    // beside it).
    let script = sb.script(&format!(
        r#"
ls -a ../.orizu-session/*/ > "$AGENT_OUT/agent-listing" 2>&1
if ls ../.orizu-session/*/boot-secret >/dev/null 2>&1; then echo found > "$AGENT_OUT/found"; fi
{WAIT_FOR_GO}
"#
    ));
    let child = sb.spawn(&script);
    // Watch the session directory from before it exists to after the turn.
    let session_dir = sb.session_dir();
    let mut seen = BTreeSet::new();
    let ready = sb.out().join("ready");
    let deadline = tokio::time::Instant::now() + WAIT;
    while !ready.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent never ran"
        );
        seen.extend(listing(&session_dir));
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    seen.extend(listing(&session_dir));
    let socket = session_dir.join("credential.sock");
    let meta = std::fs::metadata(&socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o666);
    let context: serde_json::Value =
        serde_json::from_slice(&std::fs::read(session_dir.join("boot-context.json")).unwrap())
            .unwrap();
    assert_eq!(context["credentialMode"], "broker");
    assert_eq!(context["credentialSocket"], socket.to_str().unwrap());
    assert!(context["bootSecretPath"].is_null(), "{context}");
    // No file under the root holds the boot secret, in any form.
    let secret = sb.coordinator.boot_secret();
    for file in files_under(&sb.root()) {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(&secret),
            "{} holds the boot secret",
            file.display()
        );
    }
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (_, output) = sb.end_after_seal("run-1", child).await;
    assert!(
        !seen.contains("boot-secret"),
        "boot-secret appeared: {seen:?}"
    );
    // Nor the file helper's cache files, which the broker makes unneeded.
    for name in [
        "repo-credential-cache",
        "repo-tokens-issued",
        "repo-credential-lock",
    ] {
        assert!(!seen.contains(name), "{name} appeared: {seen:?}");
    }
    assert!(seen.contains("credential.sock"), "{seen:?}");
    assert!(!sb.out().join("found").exists());
    assert!(
        sb.read_out("agent-listing").contains("credential.sock"),
        "{}",
        sb.read_out("agent-listing")
    );
    assert!(!session_dir.exists());
    assert_no_secret("runner output", &output, &sb.secrets(&[]));
}

/// Every regular file under `dir`, recursively (symbolic links not
/// followed).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                out.push(entry.path());
            }
        }
    }
    out
}

/// An agent that commits and pushes through git's credential helper, and
/// records its `HEAD`.
const PUSHES: &str = r#"
echo change > CHANGE.md
git add CHANGE.md
git commit -q -m "agent change"
git push -q origin HEAD 2>&1
git rev-parse HEAD > "$AGENT_OUT/head"
"#;

/// The session branch on the coordinator is the `HEAD` the agent
/// recorded ([`PUSHES`]).
fn assert_remote_is_agents_head(sb: &Sandbox, output: &str) {
    let remote = std::process::Command::new("git")
        .arg("-C")
        .arg(sb.coordinator.bare_repo())
        .args(["rev-parse", &sb.coordinator.branch()])
        .output()
        .unwrap();
    let head = sb.read_out("head");
    assert!(!head.trim().is_empty(), "{output}");
    assert_eq!(
        String::from_utf8_lossy(&remote.stdout).trim(),
        head.trim(),
        "{output}"
    );
}

#[tokio::test]
async fn the_agent_pushes_its_branch_through_the_broker() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(PUSHES);
    let child = sb.spawn(&script);
    let (_, output) = sb.end_after_seal("run-1", child).await;
    assert_eq!(sb.coordinator.run("run-1").unwrap().status, "succeeded");
    assert_remote_is_agents_head(&sb, &output);
    // The push's token came from the broker (a socket request of the
    // runner's uid), logged without its value.
    let answered = log_lines(&output, "credential broker answered");
    assert!(!answered.is_empty(), "{output}");
    assert!(
        answered.iter().all(|l| l.contains("\"source\"")),
        "{answered:?}"
    );
    assert_no_secret("runner output", &output, &sb.secrets(&[]));
}

/// Issue 31, item 5: a session id of 120 characters (the check allows 128)
/// puts the broker's socket past the 107 bytes of a socket address; the
/// broker binds it and the agent's git reaches it (through the directory),
/// at its documented place. Before, the boot failed binding it.
#[tokio::test]
async fn a_socket_path_over_a_socket_address_is_served_and_reached() {
    let id = format!("s-{}", "0123456789".repeat(12))
        .chars()
        .take(120)
        .collect::<String>();
    let sb = Sandbox::start(CoordinatorOptions {
        session_id: id,
        ..CoordinatorOptions::default()
    })
    .await;
    let socket = sb.session_dir().join("credential.sock");
    assert!(socket.as_os_str().len() > 107, "{}", socket.display());
    let script = sb.script(&format!(
        "[ -S \"{}\" ] && echo socket > \"$AGENT_OUT/socket\"\n{PUSHES}",
        socket.display()
    ));
    let child = sb.spawn(&script);
    let (_, output) = sb.end_after_seal("run-1", child).await;
    assert_eq!(
        sb.coordinator.run("run-1").unwrap().status,
        "succeeded",
        "{output}"
    );
    assert_eq!(sb.read_out("socket"), "socket\n", "{output}");
    assert_remote_is_agents_head(&sb, &output);
    assert!(
        !log_lines(&output, "credential broker answered").is_empty(),
        "{output}"
    );
}

/// The review of issue 38: a CLI started ahead of its turn starts the
/// MCP servers the repository configures, and one of them pushed to the
/// session branch between turns through the broker. The socket answers the
/// agent's git only while a turn runs; between turns it refuses, saying
/// why, and the next turn gets its token again.
#[tokio::test]
async fn the_socket_answers_during_turns_only() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(&format!(
        r#"{HELPER}
printf 'protocol=%s\nhost=%s\npath=%s\n' "$proto" "$host" "$path" > "$AGENT_OUT/request"
printf "protocol=$proto\nhost=$host\npath=$path\n\n" | sh -c "$helper get" > "$AGENT_OUT/during-$ORIZU_RUN_ID"
"#
    ));
    let child = sb.spawn(&script);
    sb.wait_sealed("run-1").await;
    let socket = sb.session_dir().join("credential.sock");
    let request = sb.read_out("request");
    let between = ask_socket(&socket, &format!("get\n{request}\n"));
    assert!(!between.contains("password="), "{between}");
    assert!(
        between.contains("quit=1") && between.contains("no turn is running"),
        "{between}"
    );
    let next = sb.coordinator.queue_turn("again", None);
    let (_, output) = sb.end_after_seal(&next, child).await;
    for run in ["run-1", next.as_str()] {
        let during = sb.read_out(&format!("during-{run}"));
        assert!(during.contains("password="), "{run}: {during}");
    }
    assert!(
        output.contains("credential broker refused a request between turns"),
        "{output}"
    );
}

#[tokio::test]
async fn the_broker_gives_nothing_for_another_host_or_repository() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // Through the real helper, forged requests: another host (same path),
    // another repository on the same host, another scheme, a path that
    // walks out of the repository, no path at all. Then the session's
    // remote, which must work (so the refusals are not a broken socket).
    let script = sb.script(&format!(
        r#"{HELPER}
ask() {{ printf "$1" | sh -c "$helper get" > "$AGENT_OUT/$2" 2>"$AGENT_OUT/$2.err"; }}
ask "protocol=$proto\nhost=evil.example\npath=$path\n\n" other-host
ask "protocol=$proto\nhost=$host\npath=other/repo.git\n\n" other-repo
ask "protocol=https\nhost=$host\npath=$path\n\n" other-scheme
ask "protocol=$proto\nhost=$host\npath=$path/../../other/repo.git\n\n" walk-out
ask "protocol=$proto\nhost=$host\n\n" no-path
ask "protocol=$proto\nhost=$host\npath=$path\n\n" session
printf 'protocol=%s\nhost=%s\npath=%s\n' "$proto" "$host" "$path" > "$AGENT_OUT/request"
{WAIT_FOR_GO}
"#
    ));
    let child = sb.spawn(&script);
    wait_for_file(&sb.out().join("ready")).await;
    // Straight to the socket, as an agent could write to it.
    let socket = sb.session_dir().join("credential.sock");
    let good = sb.read_out("request");
    let host_line = good.lines().find(|l| l.starts_with("host=")).unwrap();
    let path_line = good.lines().find(|l| l.starts_with("path=")).unwrap();
    let forged = [
        ("other host", good.replace(host_line, "host=evil.example")),
        (
            "other repository",
            good.replace(path_line, "path=o/other.git"),
        ),
        (
            "a longer path",
            good.replace(path_line, &format!("{path_line}/x")),
        ),
        ("no protocol", good.replace("protocol=http\n", "")),
    ];
    for (what, request) in &forged {
        let answer = ask_socket(&socket, &format!("get\n{request}\n"));
        assert!(!answer.contains("password="), "{what}: {answer}");
    }
    // A request over the size bound is refused whole.
    let huge = format!("get\n{good}x={}\n\n", "a".repeat(100 * 1024));
    assert!(!ask_socket(&socket, &huge).contains("password="));
    let direct = ask_socket(&socket, &format!("get\n{good}\n"));
    assert!(direct.contains("password="), "{direct}");
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (_, output) = sb.end_after_seal("run-1", child).await;
    for name in [
        "other-host",
        "other-repo",
        "other-scheme",
        "walk-out",
        "no-path",
    ] {
        assert!(
            !sb.read_out(name).contains("password="),
            "{name}: {}",
            sb.read_out(name)
        );
    }
    assert!(
        sb.read_out("session").contains("password="),
        "{}",
        sb.read_out("session.err")
    );
    assert!(
        !log_lines(&output, "not the session's remote").is_empty(),
        "{output}"
    );
    assert_no_secret("runner output", &output, &sb.secrets(&[]));
}

/// Sends `request` to the broker's socket and returns its whole answer.
fn ask_socket(socket: &Path, request: &str) -> String {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    // A refused request may be answered before it is all written.
    let _ = stream.write_all(request.as_bytes());
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

#[tokio::test]
async fn nothing_the_agent_can_find_mints_a_bearer() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    // The agent gets a repo token through git as well, so one is on disk
    // or in its memory if anything leaks it; and it records its
    // environment.
    let script = sb.script(&format!(
        r#"{HELPER}
env > "$AGENT_OUT/env"
printf "protocol=$proto\nhost=$host\npath=$path\n\n" | sh -c "$helper get" > "$AGENT_OUT/token"
{WAIT_FOR_GO}
"#
    ));
    let child = sb.spawn(&script);
    wait_for_file(&sb.out().join("ready")).await;
    // Everything under the root (the session directory included: the agent
    // runs as the runner's user) and in the agent's environment.
    let mut sources: Vec<Vec<u8>> = files_under(&sb.root())
        .iter()
        .filter_map(|f| std::fs::read(f).ok())
        .collect();
    sources.push(std::fs::read(sb.out().join("env")).unwrap());
    sources.push(std::fs::read(sb.out().join("token")).unwrap());
    let mut candidates = BTreeSet::new();
    for bytes in &sources {
        for word in bytes.split(|b| !(b.is_ascii_alphanumeric() || b"-_.+/=:".contains(b))) {
            if (16..=512).contains(&word.len()) {
                let word = String::from_utf8_lossy(word).into_owned();
                // `NAME=value` lines and `key=value` answers: the value too.
                if let Some((_, value)) = word.split_once('=') {
                    candidates.insert(value.to_string());
                }
                candidates.insert(word);
            }
        }
    }
    assert!(
        !candidates.contains(&sb.coordinator.boot_secret()),
        "the boot secret is on disk or in the agent's environment"
    );
    let client = reqwest::Client::new();
    let url = sb.coordinator.agent_token_url();
    let mut minted = 0;
    for candidate in &candidates {
        let Ok(response) = client.get(&url).bearer_auth(candidate).send().await else {
            continue;
        };
        if response.status().is_success() {
            minted += 1;
        }
    }
    assert!(candidates.len() > 20, "{} candidates", candidates.len());
    assert_eq!(
        minted,
        0,
        "a candidate of {} minted a bearer",
        candidates.len()
    );
    std::fs::write(sb.out().join("go"), "").unwrap();
    sb.end_after_seal("run-1", child).await;
}

#[tokio::test]
async fn concurrent_credential_gets_cause_one_mint_and_stay_redacted() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(&format!(
        r#"{HELPER}
i=1
while [ $i -le 8 ]; do
  printf "protocol=$proto\nhost=$host\npath=$path\n\n" | sh -c "$helper get" > "$AGENT_OUT/get-$i" 2>&1 &
  i=$((i+1))
done
wait
sed -n 's/^password=//p' "$AGENT_OUT"/get-* | sort -u > "$AGENT_OUT/distinct"
echo "distinct: $(wc -l < "$AGENT_OUT/distinct")"
i=1
while [ $i -le 8 ]; do echo "got $i: $(cat "$AGENT_OUT/get-$i")"; i=$((i+1)); done
"#
    ));
    let child = sb.spawn(&script);
    let (_, output) = sb.end_after_seal("run-1", child).await;
    assert_eq!(sb.read_out("distinct").lines().count(), 1, "{output}");
    // The boot's read token (step 3, which also served the clone and the
    // fetches) and one write token for the eight requests.
    let mints: Vec<_> = sb
        .coordinator
        .requests()
        .into_iter()
        .filter(|r| r.route == Route::RepoToken)
        .map(|r| r.body["access"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(mints, ["read", "write"], "{mints:?}");
    let run = sb.coordinator.run("run-1").unwrap();
    let events = serde_json::to_string(&run.events).unwrap();
    assert!(events.contains("distinct: 1"), "{events}");
    assert!(events.contains("password=[REDACTED]"), "{events}");
    let secrets = sb.secrets(&[]);
    assert_no_secret("events", &events, &secrets);
    assert_no_secret("runner output", &output, &secrets);
    // Each answer was logged without the value: one minted, the rest from
    // the cache.
    let answered = log_lines(&output, "credential broker answered");
    assert_eq!(answered.len(), 8, "{answered:?}");
    assert_eq!(
        answered
            .iter()
            .filter(|l| l.contains("\"source\":\"minted\""))
            .count(),
        1,
        "{answered:?}"
    );
}

#[tokio::test]
async fn file_mode_keeps_the_file_helper_end_to_end() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
ls ../.orizu-session/*/ > "$AGENT_OUT/listing"
echo change > CHANGE.md
git add CHANGE.md
git commit -q -m "agent change"
git push -q origin HEAD 2>&1
git rev-parse HEAD > "$AGENT_OUT/head"
"#,
    );
    let mut cmd = sb.runner(&script);
    cmd.env("HOSTED_BOOT_CREDENTIAL_MODE", "file");
    let child = cmd.spawn().unwrap();
    let (_, output) = sb.end_after_seal("run-1", child).await;
    let listing = sb.read_out("listing");
    assert!(listing.contains("boot-secret"), "{listing}");
    assert!(listing.contains("repo-tokens-issued"), "{listing}");
    assert!(!listing.contains("credential.sock"), "{listing}");
    let remote = std::process::Command::new("git")
        .arg("-C")
        .arg(sb.coordinator.bare_repo())
        .args(["rev-parse", &sb.coordinator.branch()])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&remote.stdout).trim(),
        sb.read_out("head").trim()
    );
    // The runner's own git work asks the broker in process (issue 31), but
    // file mode serves no socket.
    assert!(
        log_lines(&output, "credential broker listening").is_empty(),
        "{output}"
    );
    assert!(!sb.session_dir().exists());
}

#[tokio::test]
async fn a_peer_of_another_uid_is_refused() {
    if let Err(reason) = hosted_boot_test_support::root("connecting as another uid (nobody, 65534)")
    {
        hosted_boot_test_support::skip(reason);
        return;
    }
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(&format!(
        r#"{HELPER}
printf 'protocol=%s\nhost=%s\npath=%s\n' "$proto" "$host" "$path" > "$AGENT_OUT/request"
{WAIT_FOR_GO}
"#
    ));
    let child = sb.spawn(&script);
    wait_for_file(&sb.out().join("ready")).await;
    let request = format!("get\n{}\n", sb.read_out("request"));
    let socket = sb.session_dir().join("credential.sock");
    // The session directory is 0700: the child reaches the socket through a
    // descriptor opened before it drops to nobody (O_PATH, inherited), so
    // that only the uid check stands between it and the broker.
    let path = std::ffi::CString::new(socket.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a plain open(2) of a NUL-terminated path; the descriptor is
    // closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_PATH) };
    assert!(fd > 2, "{}", std::io::Error::last_os_error());
    let connect = |uid: Option<u32>| {
        let drop_to = uid.map_or(String::new(), |u| {
            format!("os.setgroups([]); os.setgid({u}); os.setuid({u})")
        });
        // Async: the coordinator runs on this test's runtime.
        tokio::process::Command::new("python3")
            .arg("-c")
            .arg(format!(
                r#"
import os, socket, sys
{drop_to}
s = socket.socket(socket.AF_UNIX)
s.connect("/proc/self/fd/{fd}")
s.sendall(sys.argv[1].encode())
s.shutdown(socket.SHUT_WR)
out = b""
while True:
    b = s.recv(4096)
    if not b: break
    out += b
print("uid", os.getuid())
print(out.decode())
"#
            ))
            .arg(&request)
            .output()
    };
    let refused = connect(Some(65534)).await.unwrap();
    let allowed = connect(None).await.unwrap();
    // SAFETY: closes the descriptor opened above, used by no one else.
    unsafe { libc::close(fd) };
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (_, output) = sb.end_after_seal("run-1", child).await;
    let refused_out = String::from_utf8_lossy(&refused.stdout);
    assert!(
        refused_out.contains("uid 65534"),
        "{refused_out} {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(refused_out.contains("quit=1"), "{refused_out}");
    assert!(!refused_out.contains("password="), "{refused_out}");
    // The same connection as the runner's uid is answered: the refusal is
    // the uid check.
    let allowed_out = String::from_utf8_lossy(&allowed.stdout);
    assert!(allowed_out.contains("password="), "{allowed_out}");
    let refusals = log_lines(&output, "credential broker refused a peer");
    assert_eq!(refusals.len(), 1, "{output}");
    assert!(refusals[0].contains("65534"), "{refusals:?}");
}
