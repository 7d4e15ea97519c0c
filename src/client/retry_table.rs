//! One test per row of the retry table of PROTOCOL.md section 2 that the
//! coordinator client sends (the git rows are tested where their loops are:
//! `workspace::clone`, `workspace::harvest`). Each goes through the route's
//! own `Api` method, against a local coordinator that answers from a script,
//! with the engine's waits recorded instead of slept and a fixed jitter draw,
//! and holds the route to its row:
//!
//! - every attempt failing in each way the rule retries (no response, `429`,
//!   `5xx`): exactly the row's attempts, the exact backoff waits (draw 0.5:
//!   no jitter; draw 1.0: +20 %, never past the cap), then the give-up;
//! - `Retry-After` on 429/503 replacing the backoff up to the cap (and a
//!   `Retry-After` on another 5xx ignored);
//! - every other status a verdict: one request, no wait.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::retry::Recorder;
use super::{Api, ApiConfig, CallError, Policy};
use crate::redact::Redactor;
use crate::secret::Secret;
use crate::timings::Timings;
use crate::wire::{Access, BootStatus, FinishBody, RunOutcome};

/// One scripted answer.
#[derive(Clone, Debug)]
enum Answer {
    /// This status, with a `Retry-After` of this many seconds if given, and
    /// an empty JSON body.
    Status(u16, Option<u64>),
    /// `200` with this body.
    Body(&'static str),
    /// The request is read and the connection closed unanswered: no HTTP
    /// response at all.
    Drop,
}
use Answer::{Body, Drop, Status};

/// What the tests call a route by, from its request path.
fn route_of(path: &str) -> &'static str {
    match path {
        "/agent-token" => "agent token",
        "/boot-status" => "boot status",
        p if p.ends_with("/env-bundle") => "env bundle",
        p if p.ends_with("/repo-token") => "repo token",
        p if p.ends_with("/events/cursor") => "cursor",
        p if p.ends_with("/events") => "events",
        p if p.ends_with("/finish") => "finish",
        p if p.ends_with("/agent-state") => "agent state",
        p if p.contains("/workbench-runs/") => "run_started",
        p if p.contains("/sessions/") => "session",
        _ => "unknown",
    }
}

/// The `200` body a route answers once its script is spent.
fn success(route: &str) -> &'static str {
    match route {
        "agent token" => r#"{"token": "bearer-1", "expiresAt": null}"#,
        "env bundle" => r#"{"connectors": [], "redactVars": []}"#,
        "repo token" => r#"{"token": "repo-1", "expiresAt": null, "repoFullName": "o/n"}"#,
        "session" => {
            r#"{"session": {"workspaceId": "w", "repoBranch": "b", "clientInfo": {"task": "t"}}}"#
        }
        "events" | "cursor" => r#"{"acceptedThrough": 3}"#,
        "agent state" => r#"{"agentState": null}"#,
        _ => "{}",
    }
}

/// A coordinator on loopback answering each route from its script, then
/// with [`success`]; every connection carries one request.
struct Coordinator {
    url: String,
    http: reqwest::Client,
    scripts: Arc<Mutex<HashMap<&'static str, VecDeque<Answer>>>>,
    hits: Arc<Mutex<Vec<&'static str>>>,
}

impl Coordinator {
    async fn start() -> Coordinator {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let scripts: Arc<Mutex<HashMap<&'static str, VecDeque<Answer>>>> = Arc::default();
        let hits: Arc<Mutex<Vec<&'static str>>> = Arc::default();
        let (s, h) = (scripts.clone(), hits.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let Some(path) = read_request(&mut conn).await else {
                    continue;
                };
                let route = route_of(&path);
                h.lock().unwrap().push(route);
                let answer = s
                    .lock()
                    .unwrap()
                    .get_mut(route)
                    .and_then(VecDeque::pop_front)
                    .unwrap_or(Body(success(route)));
                let (status, retry_after, body) = match answer {
                    Drop => continue,
                    Status(status, retry_after) => (status, retry_after, "{}"),
                    Body(body) => (200, None, body),
                };
                let retry_after = retry_after
                    .map(|s| format!("Retry-After: {s}\r\n"))
                    .unwrap_or_default();
                let head = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{retry_after}Connection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body.as_bytes()).await;
                let _ = conn.shutdown().await;
            }
        });
        crate::tls::install_crypto_provider();
        let http = crate::tls::http_client(None).unwrap();
        Coordinator {
            url,
            http,
            scripts,
            hits,
        }
    }

    fn script(&self, route: &'static str, answers: &[Answer]) {
        self.scripts
            .lock()
            .unwrap()
            .insert(route, answers.iter().cloned().collect());
    }

    /// Requests to `route` so far, and forgets them.
    fn take_hits(&self, route: &str) -> usize {
        let mut hits = self.hits.lock().unwrap();
        let n = hits.iter().filter(|r| **r == route).count();
        hits.clear();
        n
    }

    /// A client of this coordinator with the contract's timings, waiting
    /// through a recorder that draws `draw`.
    fn api(&self, draw: f64) -> (Api, Arc<Recorder>) {
        let url = |p: &str| reqwest::Url::parse(&format!("{}{p}", self.url)).unwrap();
        let config = ApiConfig {
            api_base: url("/"),
            agent_token_url: url("/agent-token"),
            boot_status_url: url("/boot-status"),
            session_id: "s1".into(),
            boot_secret: Secret::new("boot-secret-1".into()),
        };
        let pace = Recorder::new(draw);
        let api = Api::new(
            config,
            self.http.clone(),
            Timings::default(),
            Redactor::new(),
        )
        .with_pace(pace.clone());
        (api, pace)
    }
}

/// Reads one request (head and `Content-Length` body) and returns its path.
async fn read_request(conn: &mut tokio::net::TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while buf.len() < end + length {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    head.split_whitespace().nth(1).map(str::to_string)
}

type Call = for<'a> fn(&'a Api) -> Pin<Box<dyn Future<Output = Result<(), CallError>> + 'a>>;

/// A row of the table as one route meets it.
struct Row {
    /// The route's name in [`route_of`].
    route: &'static str,
    /// The call, through the route's `Api` method.
    call: Call,
    /// Attempts when every one fails.
    attempts: u32,
    /// The waits then, with no jitter (draw 0.5).
    waits_ms: &'static [u64],
    /// The waits then, at the jitter's top (draw 1.0).
    waits_high_ms: &'static [u64],
    /// The waits of the script [`RETRY_AFTER`], ending in success.
    retry_after_waits_ms: &'static [u64],
}

/// Every way the rule retries, in turn: no response, `5xx`, `429`.
const FAILURES: [Answer; 6] = [
    Status(503, None),
    Drop,
    Status(500, None),
    Status(429, None),
    Status(502, None),
    Status(504, None),
];

/// `Retry-After` of 1 s on a 503 (taken), of an hour on a 429 (cut to the
/// cap), of 1 s on a 500 (ignored: only 429 and 503 carry one), then success
/// (for a row with fewer attempts, as many of these as it makes).
const RETRY_AFTER: [Answer; 3] = [
    Status(503, Some(1)),
    Status(429, Some(3600)),
    Status(500, Some(1)),
];

/// Statuses that are verdicts on every route (`401` is the expired-bearer
/// rule's, tested in its row).
const VERDICTS: [u16; 8] = [400, 403, 404, 409, 413, 422, 301, 302];

/// Holds one route to its row (see the module's comment).
async fn holds_to_its_row(row: Row) {
    let c = Coordinator::start().await;
    let what = row.route;
    let failing: Vec<Answer> = FAILURES
        .iter()
        .cycle()
        .take(row.attempts as usize)
        .cloned()
        .collect();

    for (draw, expected) in [(0.5, row.waits_ms), (1.0, row.waits_high_ms)] {
        c.script(what, &failing);
        let (api, pace) = c.api(draw);
        let e = (row.call)(&api).await.unwrap_err();
        assert!(
            matches!(&e, CallError::Exhausted { attempts, .. } if *attempts == row.attempts),
            "{what}: {e}"
        );
        let attempts = row.attempts;
        let s = if attempts == 1 { "" } else { "s" };
        assert!(
            e.to_string()
                .contains(&format!("failed after {attempts} attempt{s}")),
            "{what}: {e}"
        );
        assert_eq!(c.take_hits(what), attempts as usize, "{what}: requests");
        assert_eq!(pace.take_ms(), expected, "{what}: waits at draw {draw}");
    }

    let tries = (row.attempts as usize).min(RETRY_AFTER.len() + 1);
    let mut script: Vec<Answer> = RETRY_AFTER.iter().take(tries - 1).cloned().collect();
    if tries == 1 {
        script.push(RETRY_AFTER[0].clone());
    }
    c.script(what, &script);
    let (api, pace) = c.api(0.5);
    let result = (row.call)(&api).await;
    assert_eq!(result.is_ok(), tries > 1, "{what}: {result:?}");
    assert_eq!(c.take_hits(what), tries, "{what}: requests");
    assert_eq!(
        pace.take_ms(),
        row.retry_after_waits_ms,
        "{what}: Retry-After"
    );

    for status in VERDICTS {
        c.script(what, &[Status(status, Some(1))]);
        let (api, pace) = c.api(0.5);
        let e = (row.call)(&api).await.unwrap_err();
        assert_eq!(e.verdict_status(), Some(status), "{what}: {e}");
        assert_eq!(c.take_hits(what), 1, "{what}: a {status} was repeated");
        assert!(pace.take_ms().is_empty(), "{what}: waited after a {status}");
    }
}

/// An events post whose answer counts when it accepts through seq 3.
async fn post(api: &Api) -> Result<u64, CallError> {
    api.post_events_body("r1", bytes::Bytes::from_static(b"{}"), |a| a >= 3)
        .await
}

fn finish_body() -> FinishBody {
    FinishBody {
        status: RunOutcome::Succeeded,
        agent_session_id: None,
        error: None,
        usage: None,
        result: None,
        agent_session_reset: None,
        resources: None,
    }
}

#[tokio::test]
async fn row_agent_token_at_boot_10_attempts_500ms_doubling_to_5s() {
    holds_to_its_row(Row {
        route: "agent token",
        call: |api| {
            Box::pin(async move { api.pull_bearer(Policy::AGENT_TOKEN_BOOT).await.map(drop) })
        },
        attempts: 10,
        waits_ms: &[500, 1000, 2000, 4000, 5000, 5000, 5000, 5000, 5000],
        waits_high_ms: &[600, 1200, 2400, 4800, 5000, 5000, 5000, 5000, 5000],
        retry_after_waits_ms: &[1000, 5000, 2000],
    })
    .await;
}

#[tokio::test]
async fn row_agent_token_refresh_and_re_pull_3_attempts_250ms_doubling_to_2s() {
    holds_to_its_row(Row {
        route: "agent token",
        call: |api| {
            Box::pin(async move { api.pull_bearer(Policy::AGENT_TOKEN_REFRESH).await.map(drop) })
        },
        attempts: 3,
        waits_ms: &[250, 500],
        waits_high_ms: &[300, 600],
        retry_after_waits_ms: &[1000, 2000],
    })
    .await;

    // The re-pull after a 401 (PROTOCOL.md 2, "Expired bearer") is this row:
    // a bearer route refused once pulls a fresh bearer once, under it.
    let c = Coordinator::start().await;
    let (api, pace) = c.api(0.5);
    api.pull_bearer(Policy::ONCE).await.unwrap();
    c.take_hits("agent token");
    let failing: Vec<Answer> = FAILURES.iter().take(3).cloned().collect();
    c.script("agent token", &failing);
    c.script("run_started", &[Status(401, None)]);
    let e = api.run_started("r1").await.unwrap_err();
    assert!(
        e.to_string()
            .starts_with("agent-token pull failed after 3 attempts"),
        "{e}"
    );
    assert_eq!(pace.take_ms(), [250, 500]);
    assert_eq!(c.take_hits("agent token"), 3);
    // Pulled, the fresh bearer repeats the request once; a second 401 is a
    // verdict.
    c.script("run_started", &[Status(401, None), Status(401, None)]);
    let e = api.run_started("r1").await.unwrap_err();
    assert_eq!(e.verdict_status(), Some(401));
    let hits = c.hits.lock().unwrap().clone();
    assert_eq!(hits, ["run_started", "agent token", "run_started"]);
    assert!(pace.take_ms().is_empty());
}

#[tokio::test]
async fn row_env_bundle_session_at_boot_repo_token_5_attempts_250ms_doubling_to_4s() {
    let calls: [(&'static str, Call); 3] = [
        ("env bundle", |api| {
            Box::pin(async move { api.env_bundle().await.map(drop) })
        }),
        ("session", |api| {
            Box::pin(async move { api.session(Policy::BOOT_FETCH, false).await.map(drop) })
        }),
        ("repo token", |api| {
            Box::pin(async move {
                api.repo_token(Access::Read, Policy::BOOT_FETCH)
                    .await
                    .map(drop)
            })
        }),
    ];
    for (route, call) in calls {
        holds_to_its_row(Row {
            route,
            call,
            attempts: 5,
            waits_ms: &[250, 500, 1000, 2000],
            waits_high_ms: &[300, 600, 1200, 2400],
            retry_after_waits_ms: &[1000, 4000, 1000],
        })
        .await;
    }
}

#[tokio::test]
async fn row_required_acknowledgements_run_started_finish_cursor_5_attempts_250ms_doubling_to_4s() {
    let calls: [(&'static str, Call); 6] = [
        ("boot status", |api| {
            Box::pin(async move { api.post_status(BootStatus::Ready, None, None).await })
        }),
        ("boot status", |api| {
            Box::pin(async move {
                api.post_status(BootStatus::TurnStarted, Some("r1"), None)
                    .await
            })
        }),
        ("boot status", |api| {
            Box::pin(async move {
                api.post_status(BootStatus::TurnFailed, Some("r1"), Some("x"))
                    .await
            })
        }),
        ("run_started", |api| Box::pin(api.run_started("r1"))),
        ("finish", |api| {
            Box::pin(async move { api.finish("r1", &finish_body(), Policy::REQUIRED).await })
        }),
        ("cursor", |api| {
            Box::pin(async move { api.events_cursor("r1").await.map(drop) })
        }),
    ];
    for (route, call) in calls {
        holds_to_its_row(Row {
            route,
            call,
            attempts: 5,
            waits_ms: &[250, 500, 1000, 2000],
            waits_high_ms: &[300, 600, 1200, 2400],
            retry_after_waits_ms: &[1000, 4000, 1000],
        })
        .await;
    }
}

#[tokio::test]
async fn row_best_effort_statuses_complete_failed_one_attempt() {
    let calls: [Call; 2] = [
        |api| Box::pin(api.post_status(BootStatus::Complete, None, None)),
        |api| Box::pin(api.post_status(BootStatus::Failed, None, Some("why"))),
    ];
    for call in calls {
        holds_to_its_row(Row {
            route: "boot status",
            call,
            attempts: 1,
            waits_ms: &[],
            waits_high_ms: &[],
            retry_after_waits_ms: &[],
        })
        .await;
    }
}

#[tokio::test]
async fn row_events_while_the_turn_runs_then_until_the_flush_deadline_250ms_doubling_to_5s() {
    let c = Coordinator::start().await;
    let logs = Logs::capture();
    // No attempt limit: far more failures than any other row allows, then
    // the answer; the sender cuts the post at its flush deadline instead.
    let failing: Vec<Answer> = FAILURES.iter().cycle().take(40).cloned().collect();
    let mut waits = vec![250, 500, 1000, 2000, 4000];
    waits.extend([5000; 35]);
    let mut high = vec![300, 600, 1200, 2400, 4800];
    high.extend([5000; 35]);
    for (draw, expected) in [(0.5, &waits), (1.0, &high)] {
        c.script("events", &failing);
        let (api, pace) = c.api(draw);
        let accepted = api
            .post_events_body("r1", bytes::Bytes::from_static(b"{}"), |_| true)
            .await
            .unwrap();
        assert_eq!(accepted, 3);
        assert_eq!(c.take_hits("events"), 41);
        assert_eq!(&pace.take_ms(), expected, "draw {draw}");
    }
    let text = logs.text();
    assert!(text.contains("attempt=40"), "{text}");
    assert!(
        text.contains("until=\"the turn ends, then its flush deadline\""),
        "{text}"
    );
    assert!(
        !text.contains("4294967295") && !text.contains(" of="),
        "{text}"
    );

    // Retry-After, as every route.
    c.script("events", &RETRY_AFTER);
    let (api, pace) = c.api(0.5);
    assert_eq!(post(&api).await.unwrap(), 3);
    assert_eq!(c.take_hits("events"), 4);
    assert_eq!(pace.take_ms(), [1000, 5000, 1000]);

    // An answer that accepted nothing of the batch, or is not the
    // contract's, is retried like a failure (resending at once would spin).
    c.script(
        "events",
        &[Body(r#"{"acceptedThrough": 2}"#), Body("not json")],
    );
    assert_eq!(post(&api).await.unwrap(), 3);
    assert_eq!(c.take_hits("events"), 3);
    assert_eq!(pace.take_ms(), [250, 500]);

    // Verdicts end the post at once: a 413 (the sender halves the batch),
    // any other 4xx (the sender stops sending for the run).
    for status in VERDICTS {
        c.script("events", &[Status(status, None)]);
        let e = post(&api).await.unwrap_err();
        assert_eq!(e.verdict_status(), Some(status), "{e}");
        assert_eq!(c.take_hits("events"), 1);
        assert!(pace.take_ms().is_empty());
    }
}

#[tokio::test]
async fn row_interrupt_watch_read_idle_read_one_attempt_per_tick() {
    let calls: [Call; 2] = [
        |api| {
            Box::pin(async move {
                let token = Secret::new("bearer-1".into());
                api.session_with(&token).await.map(drop)
            })
        },
        |api| Box::pin(async move { api.session(Policy::PER_TICK, false).await.map(drop) }),
    ];
    for call in calls {
        holds_to_its_row(Row {
            route: "session",
            call,
            attempts: 1,
            waits_ms: &[],
            waits_high_ms: &[],
            retry_after_waits_ms: &[],
        })
        .await;
    }
}

#[tokio::test]
async fn row_the_credential_helpers_own_calls_3_attempts_250ms_doubling_to_2s() {
    let calls: [(&'static str, Call); 2] = [
        ("agent token", |api| {
            Box::pin(async move { api.pull_bearer(Policy::CREDENTIAL_HELPER).await.map(drop) })
        }),
        ("repo token", |api| {
            Box::pin(async move {
                api.repo_token(Access::Write, Policy::CREDENTIAL_HELPER)
                    .await
                    .map(drop)
            })
        }),
    ];
    for (route, call) in calls {
        holds_to_its_row(Row {
            route,
            call,
            attempts: 3,
            waits_ms: &[250, 500],
            waits_high_ms: &[300, 600],
            retry_after_waits_ms: &[1000, 2000],
        })
        .await;
    }
}

#[tokio::test]
async fn row_agent_state_load_and_save_3_attempts_250ms_doubling_to_2s() {
    let calls: [(&'static str, Call); 2] = [
        ("agent state", |api| {
            Box::pin(async move { api.agent_state_load().await.map(drop) })
        }),
        ("agent state", |api| {
            Box::pin(async move { api.agent_state_save(bytes::Bytes::from_static(b"{}")).await })
        }),
    ];
    for (route, call) in calls {
        holds_to_its_row(Row {
            route,
            call,
            attempts: 3,
            waits_ms: &[250, 500],
            waits_high_ms: &[300, 600],
            retry_after_waits_ms: &[1000, 2000],
        })
        .await;
    }
}

/// The log lines written on this thread while it lives.
struct Logs {
    buffer: Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

impl Logs {
    fn capture() -> Logs {
        let buffer: Arc<Mutex<Vec<u8>>> = Arc::default();
        let sink = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || LogWriter(sink.clone()))
            .finish();
        Logs {
            buffer,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.buffer.lock().unwrap()).to_string()
    }
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
