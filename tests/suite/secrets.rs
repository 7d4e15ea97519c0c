//! Secrets that must never reach the coordinator or the runner's output:
//! repo tokens minted by concurrent credential helpers (PROTOCOL.md
//! section 3), tokens the helper does not cache, and user info in a refused
//! URL (section 1).

use std::time::Duration;

use base64::Engine;
use hosted_boot_coordinator::{CoordinatorOptions, Route, RunRecord};

use super::support::{Sandbox, assert_no_secret, finish};

/// The agent's output lines (`output` and `stderr` events).
fn texts(run: &RunRecord) -> Vec<String> {
    run.events
        .iter()
        .filter(|e| e.kind == "output" || e.kind == "stderr")
        .filter_map(|e| e.data["text"].as_str().map(str::to_string))
        .collect()
}

/// Every secret the coordinator issued, raw and as the Basic auth value git
/// sends for it (`x-access-token:<token>`, base64).
fn secrets_and_basic_auth(sb: &Sandbox) -> Vec<String> {
    let mut out = sb.secrets(&[]);
    let basic: Vec<String> = out
        .iter()
        .map(|s| base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{s}")))
        .collect();
    out.extend(basic);
    out
}

/// An agent that runs `count` `git credential fill` for the session's remote
/// (protocol, host and path, as git sends them with `useHttpPath`), all at
/// once when `concurrent`, and only then prints every password it got, raw
/// and as a Basic auth value.
fn fill_script(sb: &Sandbox, count: u32, concurrent: bool) -> std::path::PathBuf {
    let background = if concurrent { "&" } else { "" };
    sb.script(&format!(
        r#"
url=$(git remote get-url origin)
proto=${{url%%://*}}
rest=${{url#*://}}
host=${{rest%%/*}}
path=${{rest#*/}}
i=1
while [ $i -le {count} ]; do
  printf 'protocol=%s\nhost=%s\npath=%s\n\n' "$proto" "$host" "$path" \
    | git -C . credential fill > "$AGENT_OUT/fill-$i" 2>"$AGENT_OUT/fill-$i.err" {background}
  i=$((i+1))
done
wait
i=1
while [ $i -le {count} ]; do
  pw=$(sed -n 's/^password=//p' "$AGENT_OUT/fill-$i")
  if [ -n "$pw" ]; then
    echo "raw $i: $pw"
    echo "basic $i: $(printf 'x-access-token:%s' "$pw" | base64 | tr -d '\n')"
  else
    echo "no password $i: $(cat "$AGENT_OUT/fill-$i.err")"
  fi
  i=$((i+1))
done
"#
    ))
}

/// Runs the sandbox's first turn with `script` to its end and returns the
/// run and the runner's whole output.
async fn run_one_turn(sb: &Sandbox, script: &std::path::Path) -> (RunRecord, String) {
    let child = sb.spawn(script);
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
    (sb.coordinator.run("run-1").unwrap(), output)
}

/// Every fill got a password, and none of them reached the events or the
/// runner's log, raw or as Basic auth.
fn assert_fills_redacted(sb: &Sandbox, run: &RunRecord, output: &str, count: usize) {
    let lines = texts(run);
    assert!(
        !lines.iter().any(|l| l.starts_with("no password")),
        "{lines:?}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("raw ")).count(),
        count,
        "{lines:?}"
    );
    let secrets = secrets_and_basic_auth(sb);
    assert_no_secret(
        "events",
        &serde_json::to_string(&run.events).unwrap(),
        &secrets,
    );
    assert_no_secret("runner output", output, &secrets);
    for line in lines.iter().filter(|l| l.starts_with("raw ")) {
        assert!(line.ends_with(": [REDACTED]"), "{line}");
    }
}

#[tokio::test]
async fn concurrent_credential_fills_share_one_token_and_none_escapes_redaction() {
    // Tokens live 2 minutes: less than the 5 minutes a cached token used to
    // need left, so the cache must still be shared for them.
    let sb = Sandbox::start(CoordinatorOptions {
        repo_token_ttl: Duration::from_secs(120),
        ..CoordinatorOptions::default()
    })
    .await;
    let (run, output) = run_one_turn(&sb, &fill_script(&sb, 12, true)).await;
    assert_fills_redacted(&sb, &run, &output, 12);
    // The boot's own token (to learn the remote), the clone's, and the
    // agent's twelve fills sharing one valid cached token.
    let minted = sb
        .coordinator
        .requests()
        .iter()
        .filter(|r| r.route == Route::RepoToken)
        .count();
    assert!(minted <= 3, "{minted} repo tokens minted");
}

#[tokio::test]
async fn tokens_the_helper_does_not_cache_are_redacted_too() {
    // No `expiresAt`: the helper caches nothing, so each fill mints.
    let sb = Sandbox::start(CoordinatorOptions {
        repo_token_expires_at: false,
        ..CoordinatorOptions::default()
    })
    .await;
    let (run, output) = run_one_turn(&sb, &fill_script(&sb, 3, false)).await;
    assert_fills_redacted(&sb, &run, &output, 3);
}

#[tokio::test]
async fn a_url_with_user_info_is_refused_without_quoting_the_user_info() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script("echo never");
    let cases = [
        // Each fails a different check first: user info, scheme, spaces,
        // the parser.
        (
            "ORIZU_API_BASE_URL",
            "https://user:pw-SEKRIT@example.com/api/",
        ),
        (
            "ORIZU_AGENT_TOKEN_URL",
            "http://user:pw-SEKRIT@example.com/t",
        ),
        ("ORIZU_BOOT_STATUS_URL", "https://pw-SEKRIT@exa mple.com/s"),
        ("HOSTED_BOOT_GIT_BASE_URL", "https://user:pw-SEKRIT@[::1/x"),
        (
            "ORIZU_API_BASE_URL",
            "https://x:pw-SEKRIT@example.com/?token=q-SEKRIT",
        ),
    ];
    for (var, value) in cases {
        let mut cmd = sb.runner(&script);
        cmd.env(var, value);
        let (status, output) = finish(cmd.spawn().unwrap()).await;
        assert_eq!(status.code(), Some(2), "{var}={value}: {output}");
        assert!(output.contains(var), "{var}={value}: {output}");
        assert!(!output.contains("SEKRIT"), "{var}={value}: {output}");
    }
    // The refusal names the URL, without its credentials.
    let mut cmd = sb.runner(&script);
    cmd.env("ORIZU_API_BASE_URL", cases[0].1);
    let (_, output) = finish(cmd.spawn().unwrap()).await;
    assert!(output.contains("example.com/api/"), "{output}");
    assert!(output.contains("user info"), "{output}");
    assert_eq!(sb.coordinator.snapshot().requests.len(), 0);
}

/// Break: `shown_url` splits at the first `://` anywhere in the value, so a
/// URL whose own scheme lacks `//` (which the URL parser still reads as
/// `https` with user info) but whose query holds another URL is quoted with
/// its password and query in clear.
#[tokio::test]
async fn break_a_refused_url_with_a_url_in_its_query_is_quoted_without_its_password() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script("echo never");
    for (var, value) in [
        (
            "ORIZU_API_BASE_URL",
            "https:user:pw-SEKRIT@example.com/api/?next=https://example.com/",
        ),
        (
            "ORIZU_AGENT_TOKEN_URL",
            "user:pw-SEKRIT@example.com/t?back=https://example.com/",
        ),
    ] {
        let mut cmd = sb.runner(&script);
        cmd.env(var, value);
        let (status, output) = finish(cmd.spawn().unwrap()).await;
        assert_eq!(status.code(), Some(2), "{var}={value}: {output}");
        assert!(!output.contains("SEKRIT"), "{var}={value}: {output}");
    }
}
