//! Fuzz targets (issue 15, RELIABILITY.md "Fuzzing"): one per parser of
//! outside input, each a proptest over inputs made from the corpus in
//! `fuzz/corpus/<target>/` (seeds as they are, mutated: bytes flipped,
//! inserted, cut, two seeds spliced) and over arbitrary bytes. Each must
//! end without a panic; the streaming ones must also give the same answer
//! however the input is split (the SSE parser, the streaming redactor),
//! and no secret may survive any split of the redactor's input.
//!
//! `cargo fuzz` is not used: its sanitizer build of every dependency (a C
//! libgit2 among them) costs far more than the CI budget allows on a 2-core
//! machine (see RELIABILITY.md); these run inside the normal test build.
//! `HOSTED_BOOT_FUZZ_CASES` sets the cases per target (default 256; `.ci/run`
//! runs them again at 600). A failure's input is shrunk and kept
//! in `proptest-regressions/fuzz.txt`, replayed first on every later run.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use proptest::sample::Index;

use crate::agent::{Adapter, AdapterIo, AgentSession, AgentTimings, TurnSpec};
use crate::events::EventSender;
use crate::events::spool::Spool;
use crate::process::output::RedactedLines;
use crate::process::supervisor::Stream;
use crate::redact::{Redactor, SecretKind};
use crate::secret::Secret;

/// Counts one input of `target` tried and rewrites its line of the
/// reliability matrix (`target/reliability/fuzz-<target>.jsonl`, the format
/// of tests/suite/reliability_log.rs): the inputs this run tried, shrinking
/// included, as observed.
fn tried(target: &str) {
    static COUNTS: std::sync::Mutex<Vec<(String, u64)>> = std::sync::Mutex::new(Vec::new());
    let mut counts = COUNTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let n = match counts.iter_mut().find(|(t, _)| t == target) {
        Some((_, n)) => {
            *n += 1;
            *n
        }
        None => {
            counts.push((target.to_string(), 1));
            1
        }
    };
    // target/debug/deps/<test binary> → target/reliability/
    let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(|t| t.join("reliability")))
    else {
        return;
    };
    let _ = std::fs::create_dir_all(&dir);
    let line = serde_json::json!({
        "row": format!("fuzzing: {target}"),
        "must": "no panic, no hang; the streaming parsers answer the same however the input is split; no secret survives any split",
        "test": format!("fuzz::fuzz_{target}"),
        "counts": {"inputs_tried": n},
    });
    let _ = std::fs::write(
        dir.join(format!("fuzz-{target}.jsonl")),
        format!("{line}\n"),
    );
}

/// Cases per target: `HOSTED_BOOT_FUZZ_CASES`, else 256.
fn config() -> ProptestConfig {
    let cases = std::env::var("HOSTED_BOOT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    }
}

/// The seeds of `target`, from `fuzz/corpus/<target>/`.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    paths.sort();
    let seeds: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
    assert!(!seeds.is_empty(), "no seed in {}", dir.display());
    seeds
}

/// One mutation of a seed.
#[derive(Clone, Debug)]
enum Mutation {
    Flip(Index, u8),
    Insert(Index, u8),
    Remove(Index, Index),
    Cut(Index),
    Splice(Index, Index, Index),
    Interesting(Index, Index),
}

/// Bytes and texts that reach edge cases of JSON and line protocols.
const INTERESTING: &[&[u8]] = &[
    b"\n",
    b"\r\n",
    b"\0",
    b"\"",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"null",
    b"true",
    b"-1",
    b"0",
    b"1e308",
    b"1e400",
    b"-1e400",
    b"1.5e300",
    b"18446744073709551616",
    b"-9223372036854775809",
    b"NaN",
    b"\xff\xfe",
    b"\xe2\x82",
    b"data:",
    b"data: ",
    b"event:",
    b"id:",
    b":",
    b"=",
    b"\"\"",
    b"{}",
    b"[]",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<Index>(), any::<Index>()).prop_map(|(i, n)| Mutation::Remove(i, n)),
        any::<Index>().prop_map(Mutation::Cut),
        (any::<Index>(), any::<Index>(), any::<Index>())
            .prop_map(|(s, a, b)| Mutation::Splice(s, a, b)),
        (any::<Index>(), any::<Index>()).prop_map(|(i, w)| Mutation::Interesting(i, w)),
    ]
}

fn apply(seed: &[u8], seeds: &[Vec<u8>], mutations: &[Mutation]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for m in mutations {
        let at = |i: &Index, len: usize| if len == 0 { 0 } else { i.index(len + 1) };
        match m {
            Mutation::Flip(i, b) if !out.is_empty() => {
                let i = i.index(out.len());
                out[i] ^= b | 1;
            }
            Mutation::Flip(..) => {}
            Mutation::Insert(i, b) => {
                let i = at(i, out.len());
                out.insert(i, *b);
            }
            Mutation::Remove(i, n) if !out.is_empty() => {
                let i = i.index(out.len());
                let n = n.index(16.min(out.len() - i) + 1);
                out.drain(i..i + n);
            }
            Mutation::Remove(..) => {}
            Mutation::Cut(i) => {
                let i = at(i, out.len());
                out.truncate(i);
            }
            Mutation::Splice(s, a, b) => {
                let other = s.get(seeds);
                let from = at(a, other.len()).min(other.len());
                let i = at(b, out.len()).min(out.len());
                out.truncate(i);
                out.extend_from_slice(&other[from..]);
            }
            Mutation::Interesting(i, w) => {
                let i = at(i, out.len()).min(out.len());
                let word = w.get(INTERESTING);
                out.splice(i..i, word.iter().copied());
            }
        }
    }
    out
}

/// Inputs for `target`: a seed as it is, a mutated seed, or arbitrary bytes.
fn input(target: &str) -> impl Strategy<Value = Vec<u8>> {
    let seeds = Arc::new(corpus(target));
    let mutated = {
        let seeds = seeds.clone();
        (any::<Index>(), prop::collection::vec(mutation(), 0..12)).prop_map(move |(s, ms)| {
            let seed: &Vec<u8> = s.get(&seeds[..]);
            apply(seed, &seeds, &ms)
        })
    };
    prop_oneof![
        1 => any::<Index>().prop_map(move |s| s.get(&seeds[..]).to_vec()),
        6 => mutated,
        2 => prop::collection::vec(any::<u8>(), 0..512),
    ]
}

/// A date near now, or anywhere a `Date` header could name.
fn date() -> impl Strategy<Value = Option<SystemTime>> {
    prop_oneof![
        Just(None),
        Just(Some(SystemTime::now())),
        (0u64..u64::from(u32::MAX) * 4)
            .prop_map(|s| UNIX_EPOCH.checked_add(Duration::from_secs(s))),
    ]
}

/// Splits of a slice: sorted cut points.
fn cuts() -> impl Strategy<Value = Vec<Index>> {
    prop::collection::vec(any::<Index>(), 0..24)
}

fn split<'a>(bytes: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
    at.sort_unstable();
    let mut out = Vec::new();
    let mut last = 0;
    for a in at {
        out.push(&bytes[last..a]);
        last = a;
    }
    out.push(&bytes[last..]);
    out
}

/// Runs `adapter` on `output` (the agent's stdout, split at `cuts`, through
/// the redaction and framing every agent's output passes), with the
/// commands channel open, until it returns; bounded, so a parser that
/// stops the adapter from ending fails too.
fn drive_adapter(adapter: Box<dyn Adapter>, output: &[u8], cuts: &[Index]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let redactor = Redactor::new();
    redactor.add(
        &Secret::new("fuzz-secret-0123456789".into()),
        SecretKind::Credential,
    );
    rt.block_on(async {
        let (spool, _) = Spool::open(dir.path(), redactor.clone()).unwrap();
        let events = EventSender::detached(spool);
        let (line_tx, line_rx) = tokio::sync::mpsc::channel(64);
        let (stdin_tx, _stdin_rx) = tokio::sync::mpsc::unbounded_channel();
        let (_cmd_tx, cmd_rx) = tokio::sync::mpsc::unbounded_channel();
        let (note_tx, _note_rx) = tokio::sync::mpsc::unbounded_channel();
        let io = AdapterIo {
            lines: crate::process::output::LineReceiver::new(line_rx),
            stdin: Some(stdin_tx),
            commands: cmd_rx,
            notes: note_tx,
            events,
        };
        let task = tokio::spawn(adapter.run(io));
        let mut lines = RedactedLines::new(&redactor);
        for piece in split(output, cuts) {
            let mut batch = Vec::new();
            lines.write(piece, |l| batch.push(l));
            if !batch.is_empty() {
                let _ = line_tx.send((Stream::Stdout, batch)).await;
            }
        }
        let mut batch = Vec::new();
        lines.end(|l| batch.push(l));
        let _ = line_tx.send((Stream::Stdout, batch)).await;
        drop(line_tx);
        match tokio::time::timeout(Duration::from_secs(10), task).await {
            Ok(Ok(_observation)) => {}
            Ok(Err(e)) => panic!("the adapter panicked: {e}"),
            Err(_) => panic!("the adapter did not end after its output ended"),
        }
    });
}

fn spec() -> TurnSpec {
    TurnSpec {
        prompt: "p".into(),
        cwd: PathBuf::from("/nonexistent/repo"),
        resume: None,
        model: Some("m".into()),
        effort: None,
        extra_args: Vec::new(),
        opencode_port: None,
        timings: AgentTimings::default(),
        instructions: None,
        wrap_up: None,
        acp_permissions: Default::default(),
    }
}

proptest! {
    #![proptest_config(config())]

    /// 2.4: the session answer, its pending turn and the turn selection.
    #[test]
    fn fuzz_session(bytes in input("session"), at_boot in any::<bool>()) {
        tried("session");
        if let Ok(envelope) = serde_json::from_slice::<crate::wire::SessionEnvelope>(&bytes) {
            let session = envelope.session;
            let _ = session.is_active();
            let _ = session.pending_turn();
            let done: HashSet<String> = ["run-1".to_string()].into();
            let _ = crate::boot::idle::select_turn(&session, at_boot, &done);
        }
    }

    /// 2.4: a pending turn of any shape inside a valid session.
    #[test]
    fn fuzz_pending_turn(bytes in input("pending_turn"), at_boot in any::<bool>()) {
        tried("pending_turn");
        let Ok(turn) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            return Ok(());
        };
        // A session of every required field, so that each case reaches
        // pending_turn (the fuzzed member is any JSON value).
        let text = format!(
            r#"{{"session":{{"workspaceId":"w1","repoBranch":"orizu/s1","status":"active","clientInfo":{{"task":"t"}},"runs":[{{"id":"run-2","status":"pending"}},{{"id":"run-1","status":"succeeded"}}],"pendingTurn":{turn},"interruptRequestedRunId":null}}}}"#
        );
        let parsed = serde_json::from_str::<crate::wire::SessionEnvelope>(&text);
        prop_assert!(parsed.is_ok(), "the session around the case does not parse: {parsed:?}");
        if let Ok(envelope) = parsed {
            let _ = envelope.session.pending_turn();
            let _ = crate::boot::idle::select_turn(&envelope.session, at_boot, &HashSet::new());
        }
    }

    /// 2.3: the env bundle, checked and applied; an accepted value is
    /// redacted in the agent's output.
    #[test]
    fn fuzz_env_bundle(bytes in input("env_bundle")) {
        tried("env_bundle");
        if let Ok(bundle) = serde_json::from_slice::<crate::wire::EnvBundle>(&bytes) {
            let redactor = Redactor::new();
            let values: Vec<String> = bundle
                .connectors
                .iter()
                .map(|c| c.value.expose().to_string())
                .collect();
            if crate::boot::environment::apply_bundle(bundle, &[], &redactor).is_ok() {
                for v in values.iter().filter(|v| redactor.contains(v.as_bytes())) {
                    prop_assert!(!redactor.redact(v).contains(v.as_str()) || v.contains("[REDACTED]"));
                }
            }
        }
    }

    /// 2.1: the agent-token answer, its lifetime and refresh times against
    /// any `Date`.
    #[test]
    fn fuzz_agent_token(bytes in input("agent_token"), date in date()) {
        tried("agent_token");
        if let Ok(response) = serde_json::from_slice::<crate::wire::AgentTokenResponse>(&bytes) {
            let bearer = crate::client::Bearer::from_response(response, date);
            let timings = crate::timings::Timings::default();
            let _ = bearer.refresh_at(&timings);
            let _ = bearer.expires_within(timings.idle_refresh_lead);
            let _ = bearer.expires_at();
        }
    }

    /// 2.5: the repo-token answer, validated, its expiry converted through
    /// any `Date`.
    #[test]
    fn fuzz_repo_token(bytes in input("repo_token"), date in date()) {
        tried("repo_token");
        if let Ok(response) = serde_json::from_slice::<crate::wire::RepoTokenResponse>(&bytes) {
            let _ = crate::client::repo_token_from("repo-token mint", response, date, &Redactor::new());
        }
    }

    /// The git credential protocol: the helper's `key=value` input, and its
    /// match against the session's remote.
    #[test]
    fn fuzz_git_credential(bytes in input("git_credential")) {
        tried("git_credential");
        let attributes = crate::workspace::credential::read_attributes(&bytes[..]);
        let remote = reqwest::Url::parse("https://git.example/acme/app.git").unwrap();
        let _ = crate::workspace::credential::request_matches_remote(&attributes, &remote);
        let mut out = Vec::new();
        let mut err = Vec::new();
        let code = crate::workspace::credential::credential_helper_with_io(
            "get",
            std::path::Path::new("/nonexistent/boot-context.json"),
            &bytes[..],
            &mut out,
            &mut err,
        );
        prop_assert_eq!(code, 0);
    }

    /// Claude Code's stream-json, through the whole adapter.
    #[test]
    fn fuzz_stream_json(bytes in input("stream_json"), cuts in cuts()) {
        tried("stream_json");
        drive_adapter(Box::new(crate::agent::claude::ClaudeAdapter::new(spec())), &bytes, &cuts);
    }

    /// opencode run's JSON lines, through the whole adapter.
    #[test]
    fn fuzz_opencode_run_json(bytes in input("stream_json"), cuts in cuts()) {
        tried("opencode_run_json");
        drive_adapter(Box::new(crate::agent::opencode_run::OpenCodeRunAdapter::new(spec())), &bytes, &cuts);
    }

    /// codex exec's JSON lines, through the whole adapter.
    #[test]
    fn fuzz_codex_exec_json(bytes in input("stream_json"), cuts in cuts()) {
        tried("codex_exec_json");
        let session = Arc::new(AgentSession::default());
        drive_adapter(Box::new(crate::agent::codex_exec::CodexExecAdapter::new(spec(), session)), &bytes, &cuts);
    }

    /// The Codex app-server's JSON-RPC, through the whole adapter, and its
    /// message and error parsers.
    #[test]
    fn fuzz_json_rpc(bytes in input("json_rpc"), cuts in cuts()) {
        tried("json_rpc");
        for line in bytes.split(|b| *b == b'\n') {
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(line) {
                let _ = crate::agent::jsonrpc::parse(&value);
                let _ = crate::agent::jsonrpc::error_message(&value);
                let _ = crate::agent::codex::classify_error(&crate::agent::lenient::read(&value));
            }
        }
        drive_adapter(Box::new(crate::agent::codex::CodexAdapter::new(spec())), &bytes, &cuts);
    }

    /// opencode serve's event stream: the same events however the bytes
    /// are split, each event's data through the error and usage parsers.
    #[test]
    fn fuzz_sse(bytes in input("sse"), cuts in cuts()) {
        tried("sse");
        let whole = crate::agent::sse::SseParser::new().push(&bytes);
        let mut parser = crate::agent::sse::SseParser::new();
        let mut pieces = Vec::new();
        for piece in split(&bytes, &cuts) {
            pieces.extend(parser.push(piece));
        }
        prop_assert_eq!(&pieces, &whole);
        for data in &whole {
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(data) {
                let _ = crate::agent::opencode::classify_error(&crate::agent::lenient::read(&value), false);
                let _ = crate::agent::opencode::step_usage(&crate::agent::lenient::read(&value));
            }
        }
    }

    /// The streaming redactor: output split anywhere equals whole-input
    /// redaction, and no secret (from the corpus, or from the input
    /// itself) survives any split.
    #[test]
    fn fuzz_streaming_redactor(
        bytes in input("redactor"),
        picks in prop::collection::vec((any::<Index>(), 8usize..24), 1..4),
        cuts in cuts(),
    ) {
        tried("streaming_redactor");
        let redactor = Redactor::new();
        let mut secrets = Vec::new();
        for (at, len) in &picks {
            // A secret taken from the input, so that it occurs in it.
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let chars: Vec<char> = text.chars().collect();
            if chars.len() < *len {
                continue;
            }
            let start = at.index(chars.len() - len + 1);
            let secret: String = chars[start..start + len].iter().collect();
            // Bytes that are not UTF-8 are no part of a secret (they were
            // replaced by U+FFFD here, which the input does not hold).
            if secret.contains('\u{FFFD}') {
                continue;
            }
            if redactor.add(&Secret::new(secret.clone()), SecretKind::Credential) {
                secrets.push(secret);
            }
        }
        let whole = redactor.redact_bytes(&bytes);
        let mut stream = redactor.stream();
        let mut streamed = Vec::new();
        for piece in split(&bytes, &cuts) {
            stream.push(piece, &mut streamed);
        }
        stream.finish(&mut streamed);
        prop_assert_eq!(&streamed, &whole);
        let out = String::from_utf8_lossy(&streamed);
        for s in &secrets {
            if !"[REDACTED]".contains(s.as_str()) {
                prop_assert!(!out.contains(s.as_str()), "{:?} survived in {:?}", s, out);
            }
        }
    }
}
