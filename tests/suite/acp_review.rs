//! Issue 42's review probes: the `acp` adapter's Codex-style system errors
//! (`session_info_update` with `_meta.codex.threadStatus.type:
//! "systemError"`) and `--acp-permissions` with odd permission requests,
//! the real binary driving `tests/fakes/acp-agent/review_agent.py
//! <scenario>`. Each states what is promised; a failing one is a finding.

use std::path::Path;
use std::time::Duration;

use hosted_boot_coordinator::Snapshot;
use serde_json::Value;

use super::acp_edges::{Probe, SECRET, opts, python};
use super::support::{Runner, Sandbox, agent_events};

const AGENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fakes/acp-agent/review_agent.py"
);
/// The runner driving `review_agent.py`'s `scenario`.
async fn start(scenario: &str, env: &[(&str, &str)]) -> Probe {
    Probe::start_agent(AGENT, scenario, opts("hello"), &[], env).await
}

/// The state once run-1 is sealed (panics after `bound`).
async fn sealed(p: &Probe, bound: Duration) -> Snapshot {
    p.sealed("run-1", bound)
        .await
        .unwrap_or_else(|e| panic!("run-1 was not sealed in {e:?}"))
}

fn finish(snap: &Snapshot) -> Value {
    serde_json::to_value(snap.run("run-1").unwrap().finish.clone().unwrap()).unwrap()
}

/// (status, error code) of run-1 for `scenario`.
async fn outcome(scenario: &str, env: &[(&str, &str)]) -> (Value, Probe) {
    let p = start(scenario, env).await;
    let snap = sealed(&p, Duration::from_secs(90)).await;
    let f = finish(&snap);
    eprintln!("PROBE {scenario}: {f}");
    (f, p)
}

// ---------------------------------------------------------------------
// System errors
// ---------------------------------------------------------------------

/// An ordinary successful turn whose model talks about 429 and 529: no
/// system error was reported, so the turn succeeds.
#[tokio::test]
async fn acp_review_text_429_in_a_successful_turn() {
    let (f, p) = outcome("text_429", &[]).await;
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
}

/// A systemError of another session (and its error text) is not the
/// turn's.
#[tokio::test]
async fn acp_review_system_error_of_another_session() {
    let (f, p) = outcome("sys_err_foreign", &[]).await;
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
}

/// A systemError about another session, sent before the agent answered
/// `session/new` (the runner does not know its session yet, so the filter
/// of "updates of another session" lets it through): not the turn's.
#[tokio::test]
async fn acp_review_system_error_of_another_session_before_session_new() {
    let (f, p) = outcome("sys_err_before_session", &[]).await;
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
}

/// A systemError, then the thread active again: recovered, the turn
/// succeeds.
#[tokio::test]
async fn acp_review_system_error_then_active() {
    let (f, p) = outcome("sys_err_recovered", &[]).await;
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
}

/// A systemError with no text after it: failed, agent_crashed, with a
/// message that says so.
#[tokio::test]
async fn acp_review_system_error_without_text() {
    let (f, p) = outcome("sys_err_empty", &[]).await;
    p.end().await;
    assert_eq!(f["status"], "failed", "{f}");
    assert_eq!(f["error"]["code"], "agent_crashed", "{f}");
}

/// Codex's 429 whose message is longer than the 4 KiB the adapter keeps
/// (a proxy's HTML body after the status line): still the 429's code,
/// not agent_crashed. The adapter drops a chunk that would pass 4 KiB
/// whole, instead of keeping its first 4 KiB.
#[tokio::test]
async fn acp_review_system_error_with_a_long_429_message() {
    let (f, p) = outcome("sys_err_long_429", &[]).await;
    p.end().await;
    assert_eq!(f["status"], "failed", "{f}");
    assert_eq!(f["error"]["code"], "provider_limit_unknown", "{f}");
}

/// The same with a 529: provider_overloaded (which the overload
/// continuation acts on), not agent_crashed.
#[tokio::test]
async fn acp_review_system_error_with_a_long_529_message() {
    let (f, p) = outcome("sys_err_long_529", &[]).await;
    p.end().await;
    assert_eq!(f["status"], "failed", "{f}");
    assert_eq!(f["error"]["code"], "provider_overloaded", "{f}");
}

/// The text of a system error carries a connector's secret: the finish's
/// error message does not.
#[tokio::test]
async fn acp_review_system_error_text_with_a_secret() {
    let (f, p) = outcome("sys_err_secret", &[]).await;
    let snap = sealed(&p, Duration::from_secs(5)).await;
    let all = serde_json::to_string(&snap.run("run-1").unwrap().events).unwrap();
    p.end().await;
    assert_eq!(f["status"], "failed", "{f}");
    assert!(!f.to_string().contains(SECRET), "secret in finish: {f}");
    assert!(!all.contains(SECRET), "secret in events");
}

/// A systemError whose `_meta` is huge (500 KB beside it): still read.
#[tokio::test]
async fn acp_review_system_error_with_huge_meta() {
    let (f, p) = outcome("sys_err_huge_meta", &[]).await;
    p.end().await;
    assert_eq!(f["status"], "failed", "{f}");
    assert_eq!(f["error"]["code"], "provider_overloaded", "{f}");
}

/// `_meta` of the wrong shapes: ignored, the turn succeeds.
#[tokio::test]
async fn acp_review_malformed_meta() {
    let (f, p) = outcome("sys_err_malformed_meta", &[]).await;
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
}

/// A systemError after the prompt's answer does not change the sealed
/// outcome (the answer came first).
#[tokio::test]
async fn acp_review_system_error_after_the_answer() {
    let (f, p) = outcome("sys_err_after_answer", &[]).await;
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
}

// ---------------------------------------------------------------------
// Permissions
// ---------------------------------------------------------------------

/// A secret in the request's title, raw input, an option's name and id:
/// none reaches the events (the answer's `runnerAnswer` included); the
/// answer the agent gets is its own option id.
#[tokio::test]
async fn acp_review_permission_secrets_are_redacted() {
    let (f, p) = outcome("perm_secret", &[]).await;
    let snap = sealed(&p, Duration::from_secs(5)).await;
    let events = snap.run("run-1").unwrap().events.clone();
    let raw = serde_json::to_string(&events).unwrap();
    let decoded = serde_json::to_string(&agent_events(&events)).unwrap();
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
    assert!(
        !raw.contains(SECRET) && !decoded.contains(SECRET),
        "secret in events: {decoded}"
    );
    assert!(
        !raw.contains("s3cr3t-value"),
        "part of the secret in events"
    );
}

/// The same request under reject: the control-character option id is
/// answered verbatim, and the event shows it.
#[tokio::test]
async fn acp_review_permission_control_characters_under_reject() {
    let (f, p) = outcome("perm_secret", &[("HOSTED_BOOT_ACP_PERMISSIONS", "reject")]).await;
    let snap = sealed(&p, Duration::from_secs(5)).await;
    let asked: Vec<Value> = agent_events(&snap.run("run-1").unwrap().events)
        .into_iter()
        .filter(|(k, _)| k == "session/request_permission")
        .map(|(_, d)| d)
        .collect();
    let answer = p.answer();
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
    assert_eq!(
        answer["outcome"]["optionId"], "no\u{0}\u{1b}[2J\n",
        "{answer}"
    );
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(
        asked[0]["runnerAnswer"]["outcome"]["optionId"], "no\u{0}\u{1b}[2J\n",
        "{asked:?}"
    );
}

/// No options at all: cancelled under both policies, and the turn goes
/// on.
#[tokio::test]
async fn acp_review_permission_without_options() {
    for policy in ["allow", "reject"] {
        let (f, p) = outcome("perm_empty", &[("HOSTED_BOOT_ACP_PERMISSIONS", policy)]).await;
        let answer = p.answer();
        p.end().await;
        assert_eq!(f["status"], "succeeded", "{policy}: {f}");
        assert_eq!(
            answer["outcome"]["outcome"], "cancelled",
            "{policy}: {answer}"
        );
    }
}

/// Only a reject option, under allow: never selected as a grant; the
/// documented answer is cancelled.
#[tokio::test]
async fn acp_review_permission_only_reject_under_allow() {
    let (f, p) = outcome("perm_only_reject", &[]).await;
    let answer = p.answer();
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
    assert_eq!(answer["outcome"]["outcome"], "cancelled", "{answer}");
}

/// An "allow once" option whose id is not a string (ACP says string),
/// beside an "allow always": the runner must not answer "always" (which
/// writes rules into the agent's settings, Claude Code's in repo/.claude/,
/// which the harvest pushes) as if no "once" were offered; cancelled or
/// the once option are both acceptable.
#[tokio::test]
async fn acp_review_permission_numeric_once_id_does_not_become_always() {
    let (f, p) = outcome("perm_numeric_once", &[]).await;
    let answer = p.answer();
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
    assert_ne!(answer["outcome"]["optionId"], "always", "{answer}");
}

/// Duplicate option ids (an "always" and a "reject once" both `x`), under
/// reject: the answer `x` is ambiguous; a rejecting runner should not
/// select an id that also names a grant (cancelled is unambiguous).
#[tokio::test]
async fn acp_review_permission_duplicate_ids_under_reject() {
    let (f, p) = outcome("perm_dup_ids", &[("HOSTED_BOOT_ACP_PERMISSIONS", "reject")]).await;
    let answer = p.answer();
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
    assert_ne!(answer["outcome"]["optionId"], "x", "{answer}");
}

/// A permission request about another session than the turn's (whose
/// updates the adapter drops): not granted.
#[tokio::test]
async fn acp_review_permission_of_another_session_not_granted() {
    let (f, p) = outcome("perm_foreign", &[]).await;
    let answer = p.answer();
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
    assert_ne!(answer["outcome"]["optionId"], "once", "{answer}");
}

/// Under reject no unattended mode is set, though the agent offers `yolo`.
#[tokio::test]
async fn acp_review_reject_sets_no_mode() {
    let (f, p) = outcome(
        "perm_only_reject",
        &[("HOSTED_BOOT_ACP_PERMISSIONS", "reject")],
    )
    .await;
    let methods = p.sent_methods();
    let answer = p.answer();
    p.end().await;
    assert_eq!(f["status"], "succeeded", "{f}");
    assert!(
        !methods.contains(&"session/set_mode".to_string()),
        "{methods:?}"
    );
    assert_eq!(answer["outcome"]["optionId"], "no", "{answer}");
}

// ---------------------------------------------------------------------
// The option's values
// ---------------------------------------------------------------------

/// A bad value, by flag or variable: exit 2 and a message naming it,
/// before anything runs.
#[tokio::test]
async fn acp_review_bad_permission_values_are_refused() {
    for (flag, env) in [
        (Some("maybe"), None),
        (Some("Reject"), None),
        (None, Some("REJECT")),
        (None, Some("deny")),
        (None, Some(" reject")),
    ] {
        let sb = Sandbox::start(opts("hello")).await;
        let mut cmd = sb.command("run", Path::new("/nonexistent"));
        cmd.env("HOSTED_BOOT_AGENT", "acp").env(
            "HOSTED_BOOT_AGENT_COMMAND",
            format!("{} {AGENT} ok", python()),
        );
        if let Some(v) = flag {
            cmd.args(["--acp-permissions", v]);
        }
        if let Some(v) = env {
            cmd.env("HOSTED_BOOT_ACP_PERMISSIONS", v);
        }
        let (status, out) = Runner::reading(cmd.spawn().unwrap()).finish().await;
        let value = flag.or(env).unwrap();
        eprintln!("PROBE value {value:?}: {status:?}\n{out}");
        assert_eq!(status.code(), Some(2), "{value:?}: {out}");
        assert!(out.contains(value.trim()), "{value:?} not named: {out}");
        assert!(
            sb.read_out("acp-log.jsonl").is_empty(),
            "{value:?}: the agent ran"
        );
    }
}

/// `--acp-permissions reject` with another agent than `acp` (Claude Code
/// runs in bypassPermissions whatever it says): refused, or at least
/// warned about, not silently ignored.
#[tokio::test]
async fn acp_review_reject_with_another_agent_is_not_silent() {
    let sb = Sandbox::start(opts("hello")).await;
    let mut cmd = sb.command("run", Path::new("/nonexistent"));
    cmd.env("HOSTED_BOOT_AGENT", "command")
        .env("HOSTED_BOOT_AGENT_COMMAND", "sh -c 'echo done'")
        .env("HOSTED_BOOT_ACP_PERMISSIONS", "reject");
    let runner = Runner::reading(cmd.spawn().unwrap());
    let sealed = sb
        .coordinator
        .wait_for(Duration::from_secs(20), |s| {
            s.run("run-1").is_some_and(|r| r.finish.is_some())
        })
        .await
        .is_ok();
    if sealed {
        sb.coordinator.end_session();
    }
    let (status, out) = runner.finish().await;
    eprintln!("PROBE reject+command: {status:?} sealed {sealed}\n{out}");
    assert!(
        status.code() == Some(2)
            || out.to_lowercase().contains("acp-permissions")
            || out.contains("ACP_PERMISSIONS"),
        "--acp-permissions reject ignored without a word: {out}"
    );
}

// ---------------------------------------------------------------------
// Reject with Claude Code's real ACP agent, as a platform runs it
// ---------------------------------------------------------------------

/// `--acp-permissions reject` with Claude Code's ACP agent in its own
/// default configuration (no `.claude/settings.json` forcing
/// `defaultMode: "default"`, as `real_acp.rs`'s `claude_asks` writes): the
/// runner leaves the agent's mode as it is, and that mode is its built-in
/// default, `auto` (or `acceptEdits` on a model without auto), which
/// writes files without asking. The promise of reject ("so that the agent
/// asks") is that the scenario's write does not happen.
#[tokio::test]
async fn acp_review_real_claude_reject_prevents_the_write_by_default() {
    use super::real_acp::{Agent, Case};
    use super::real_clis::{Runner, events};
    let Some(case) = Case::start(Agent::Claude, "write:one.txt").await else {
        return;
    };
    let mut runner = Runner::spawn(case.command().env("HOSTED_BOOT_ACP_PERMISSIONS", "reject"));
    let snap = case.sealed(&mut runner, "run-1").await;
    let asked = events(&snap, "run-1", "session/request_permission");
    let modes = events(&snap, "run-1", "current_mode_update");
    let repo = std::fs::canonicalize(case.sb.root()).unwrap().join("repo");
    let written = repo.join("one.txt").exists();
    let pushed = case.sb.remote_file("one.txt");
    case.sb.coordinator.end_session();
    let (_status, output) = runner.finish().await;
    eprintln!(
        "PROBE real reject: asked {asked:?} modes {modes:?} written {written} pushed {pushed:?}"
    );
    assert!(
        !written && pushed.is_none(),
        "reject let Claude's agent write one.txt without asking (asked: {asked:?})\n{output}"
    );
}
