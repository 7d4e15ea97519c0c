//! The dev API of the reference coordinator (PROTOCOL.md section 6), under
//! `{base}/dev/`: its route table and handler. Not part of the contract the
//! runner speaks (that is [`crate::wire::routes`]); the tests, the demo and
//! a person debugging a sandbox drive the coordinator through it.

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::Target;
use super::server::{Reply, Shared, auth_value, ok, parse, unauthorized};
use super::state::{ApiError, DevError, Fault, RecordedRequest};
use crate::wire::AnswerToQuestion;

/// A route of the dev API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DevRoute {
    /// `POST turns`: queue a turn.
    Turns,
    /// `POST interrupt`: request an interrupt.
    Interrupt,
    /// `POST end`: end the session.
    End,
    /// `GET`, `POST`, `DELETE faults`: the queued faults.
    Faults,
    /// `GET`, `POST git`: the git server's file size limit.
    Git,
    /// `GET requests`: the request record (JSON), or a table of it
    /// (`?format=table` or `Accept: text/plain`, [`request_table`]).
    Requests,
    /// `GET state`: the session, statuses and runs.
    State,
    /// `GET`, `POST setup`: the session's `setup` field (script, inputs).
    Setup,
    /// `GET`, `POST around-agent`: the session's `egressCanary` and
    /// `instructions` (2.4 extensions).
    AroundAgent,
    /// `POST repos`: serve another repository (a submodule's).
    Repos,
    /// `POST lfs`: hold a Git LFS object.
    Lfs,
}

/// One row of [`DEV_TABLE`].
pub(super) struct DevSpec {
    /// The route.
    pub route: DevRoute,
    /// The path below `dev/`.
    pub name: &'static str,
    /// The methods it answers (any other is `405`).
    pub methods: &'static [&'static str],
}

/// The dev API's routes. Every request under `dev/` needs the dev token when
/// one is set (a non-loopback listen).
pub(super) const DEV_TABLE: &[DevSpec] = &[
    DevSpec {
        route: DevRoute::Turns,
        name: "turns",
        methods: &["POST"],
    },
    DevSpec {
        route: DevRoute::Interrupt,
        name: "interrupt",
        methods: &["POST"],
    },
    DevSpec {
        route: DevRoute::End,
        name: "end",
        methods: &["POST"],
    },
    DevSpec {
        route: DevRoute::Faults,
        name: "faults",
        methods: &["GET", "POST", "DELETE"],
    },
    DevSpec {
        route: DevRoute::Git,
        name: "git",
        methods: &["GET", "POST"],
    },
    DevSpec {
        route: DevRoute::Requests,
        name: "requests",
        methods: &["GET"],
    },
    DevSpec {
        route: DevRoute::State,
        name: "state",
        methods: &["GET"],
    },
    DevSpec {
        route: DevRoute::Setup,
        name: "setup",
        methods: &["GET", "POST"],
    },
    DevSpec {
        route: DevRoute::AroundAgent,
        name: "around-agent",
        methods: &["GET", "POST"],
    },
    DevSpec {
        route: DevRoute::Repos,
        name: "repos",
        methods: &["POST"],
    },
    DevSpec {
        route: DevRoute::Lfs,
        name: "lfs",
        methods: &["POST"],
    },
];

/// `POST repos`: a repository to serve beside the session's.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RepoRequest {
    /// `owner/name`.
    full_name: String,
    /// A local repository (path on the coordinator's machine) to serve a
    /// bare clone of.
    source: std::path::PathBuf,
}

/// `POST lfs`: an LFS object's content (UTF-8 text).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LfsRequest {
    content: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TurnRequest {
    body: String,
    #[serde(default)]
    answer_to_question: Option<AnswerToQuestion>,
    /// The trace context its `pendingTurn` carries (issue 40).
    #[serde(default)]
    traceparent: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GitSettings {
    /// Bytes, or null for no limit.
    max_file_size: Option<u64>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct InterruptRequest {
    #[serde(default)]
    run_id: Option<String>,
}

fn dev_error(e: DevError) -> ApiError {
    let status = match e {
        DevError::UnknownRun(_) => StatusCode::NOT_FOUND,
        DevError::NoRunningRun | DevError::RunSealed(_) => StatusCode::CONFLICT,
        DevError::InvalidFault(_) => StatusCode::BAD_REQUEST,
        DevError::Timeout { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(status, e.to_string())
}

/// `use POST on this route`, `use GET or POST`, `use GET, POST or DELETE`.
fn method_not_allowed(methods: &[&str]) -> ApiError {
    let message = match methods {
        [one] => format!("use {one} on this route"),
        [rest @ .., last] => format!("use {} or {last}", rest.join(", ")),
        [] => "this route takes no method".to_string(),
    };
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, message)
}

/// The dev API: `rest` is the path below `dev/`. Order of checks: dev token
/// (401), route (404, naming the path and the routes), method (405), body
/// (400), state (404, 409).
// long: the dev API's table, one arm per route after the checks its doc
// gives in order; each arm is a few lines.
pub(super) fn route(
    sh: &Shared,
    method: &Method,
    rest: &str,
    query: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Reply {
    if let Some(token) = &sh.cfg.dev_token
        && auth_value(headers, "Bearer") != Some(token.expose())
    {
        return Err(unauthorized("dev token"));
    }
    let Some(spec) = DEV_TABLE.iter().find(|s| s.name == rest) else {
        let names: Vec<&str> = DEV_TABLE.iter().map(|s| s.name).collect();
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "no such dev route: {method} /dev/{rest} (the dev API, PROTOCOL.md section 6: {})",
                names.join(", ")
            ),
        ));
    };
    if !spec.methods.contains(&method.as_str()) {
        return Err(method_not_allowed(spec.methods));
    }
    match spec.route {
        DevRoute::Turns => {
            let req: TurnRequest = parse(body)?;
            let run_id = sh.update(|st| {
                let id = st.queue_turn(req.body, req.answer_to_question);
                st.trace_run(&id, req.traceparent);
                id
            });
            Ok(ok(&json!({"runId": run_id})))
        }
        DevRoute::Interrupt => {
            let req: InterruptRequest = if body.is_empty() {
                InterruptRequest::default()
            } else {
                parse(body)?
            };
            let run_id = sh
                .update(|st| st.interrupt(req.run_id.as_deref()))
                .map_err(dev_error)?;
            Ok(ok(&json!({"runId": run_id})))
        }
        DevRoute::End => {
            sh.update(|st| st.status = "ended".into());
            Ok(ok(&json!({"status": "ended"})))
        }
        DevRoute::Faults => match *method {
            Method::POST => {
                let fault: Fault = parse(body)?;
                sh.add_fault(fault).map_err(dev_error)?;
                Ok(ok(&json!({"ok": true})))
            }
            Method::DELETE => {
                sh.update(|st| st.faults.clear());
                Ok(ok(&json!({"ok": true})))
            }
            // GET: the table lets no other method through.
            _ => Ok(ok(&sh.lock().faults)),
        },
        DevRoute::Git => match *method {
            Method::POST => {
                let settings: GitSettings = parse(body)?;
                sh.update(|st| st.git_max_file_size = settings.max_file_size);
                Ok(ok(&json!({"maxFileSize": settings.max_file_size})))
            }
            // GET, as above.
            _ => Ok(ok(&json!({"maxFileSize": sh.lock().git_max_file_size}))),
        },
        DevRoute::Requests if wants_table(query, headers) => {
            Ok(text(request_table(&sh.lock().requests)))
        }
        DevRoute::Requests => Ok(ok(&sh.lock().requests)),
        DevRoute::State => Ok(ok(&sh.snapshot())),
        DevRoute::Setup => setup_route(sh, method, body),
        DevRoute::AroundAgent => match *method {
            Method::POST => {
                let around: super::state::AroundAgent = parse(body)?;
                sh.update(|st| st.around = around.clone());
                Ok(ok(&around))
            }
            // GET, as above.
            _ => Ok(ok(&sh.lock().around)),
        },
        DevRoute::Repos => {
            let req: RepoRequest = parse(body)?;
            sh.cfg
                .served
                .add_repository(&sh.cfg.repo.project_root, &req.full_name, &req.source)
                .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("{e:#}")))?;
            Ok(ok(&json!({"fullName": req.full_name})))
        }
        DevRoute::Lfs => {
            let req: LfsRequest = parse(body)?;
            let oid = sh.cfg.served.add_lfs_object(req.content.as_bytes());
            Ok(ok(
                &json!({"oid": oid, "pointer": super::lfs_pointer(req.content.as_bytes())}),
            ))
        }
    }
}

/// `POST dev/setup` with a `session.setup` object (or `null` to remove
/// it) sets what the session route serves from then on; `GET` reads it.
fn setup_route(sh: &Shared, method: &Method, body: &[u8]) -> Reply {
    if *method == Method::POST {
        let setup: Option<crate::wire::SessionSetup> = parse(body)?;
        sh.update(|st| st.setup = setup);
    }
    Ok(ok(&json!({"setup": sh.lock().setup})))
}

/// Whether `GET dev/requests` should answer with [`request_table`]:
/// `?format=table`, or an `Accept` that names `text/plain` (`curl -H
/// 'accept: text/plain'`).
fn wants_table(query: &str, headers: &HeaderMap) -> bool {
    let asked = query.split('&').any(|p| p == "format=table");
    let accepts = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|t| t.trim().starts_with("text/plain")));
    asked || accepts
}

fn text(body: String) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

/// The request record as text for a person: the runner's calls (every
/// route but the dev API's) in one table, then the dev API's in another,
/// each in order of arrival with when it arrived (seconds since the
/// coordinator started), method, path without its query, route, the
/// answer's status (`dropped` for a `reset` fault, `…` while in flight)
/// and how long the answer took. Authorization values never appear (the
/// record masks them, and the table shows no header).
pub(super) fn request_table(requests: &[RecordedRequest]) -> String {
    let (dev, runner): (Vec<&RecordedRequest>, Vec<&RecordedRequest>) =
        requests.iter().partition(|r| r.route == Target::Dev);
    let mut out = String::new();
    for (title, rows) in [("runner calls", runner), ("dev calls", dev)] {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!("{title} ({})\n", rows.len()));
        let cells: Vec<[String; 6]> = rows.iter().map(|r| row(r)).collect();
        let header = ["at", "method", "path", "route", "status", "took"].map(String::from);
        let mut width = [0usize; 6];
        for c in std::iter::once(&header).chain(&cells) {
            for (w, cell) in width.iter_mut().zip(c) {
                *w = (*w).max(cell.chars().count());
            }
        }
        for c in std::iter::once(&header).chain(&cells) {
            let line = c
                .iter()
                .zip(width)
                .enumerate()
                .map(|(i, (cell, w))| {
                    // Times right-aligned, words left-aligned.
                    if i == 0 || i == 5 {
                        format!("{cell:>w$}")
                    } else {
                        format!("{cell:<w$}")
                    }
                })
                .collect::<Vec<_>>()
                .join("  ");
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

fn row(r: &RecordedRequest) -> [String; 6] {
    let status = match (r.response_status, &r.fault) {
        (Some(s), _) => s.to_string(),
        (None, Some(_)) => "dropped".to_string(),
        (None, None) => "…".to_string(),
    };
    let took = r
        .answered_at_ms
        .map(|a| format!("{} ms", a.saturating_sub(r.at_ms)))
        .unwrap_or_default();
    [
        format!("{:.3}s", r.at_ms as f64 / 1000.0),
        r.method.clone(),
        r.path.split('?').next().unwrap_or("").to_string(),
        r.route.name().to_string(),
        status,
        took,
    ]
}
