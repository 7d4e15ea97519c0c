//! Many sessions behind one listener (PROTOCOL.md section 6, "Fleet"): each
//! session is a [`Shared`] of its own (settings, state, request record,
//! change signal), as a one-session coordinator has; this module only picks
//! which one a request is for. The first session is the one every
//! single-session API names; the others share its bare repository, each on
//! a branch of its own.
//!
//! A request is for the session its path names (the session routes), or
//! the one that issued its credential (the run routes by the bearer, git by
//! the repo token), or the one a dev path names
//! (`dev/sessions/{sessionId}/…`); anything else goes to the first session,
//! which answers as a one-session coordinator would (`404`, `401`).

use std::sync::{Arc, RwLock};

use axum::http::{HeaderMap, Method, StatusCode};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};
use url::Url;

use super::server::{Config, Reply, Shared, auth_value, ok, parse, unauthorized};
use super::state::{ApiError, State, Target};
use crate::secret::Secret;
use crate::wire::routes::{Param, Route};

/// The sessions a coordinator serves, the first one first.
pub(crate) struct Fleet {
    /// The API base URL every session's environment names.
    pub base_url: Url,
    sessions: RwLock<Vec<Arc<Shared>>>,
}

impl Fleet {
    /// A fleet of one session.
    pub(crate) fn new(base_url: Url, first: Arc<Shared>) -> Fleet {
        Fleet {
            base_url,
            sessions: RwLock::new(vec![first]),
        }
    }

    fn all(&self) -> Vec<Arc<Shared>> {
        self.sessions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn first(&self) -> Arc<Shared> {
        self.sessions
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)[0]
            .clone()
    }

    fn find(&self, pred: impl Fn(&Shared) -> bool) -> Option<Arc<Shared>> {
        self.all().into_iter().find(|s| pred(s))
    }

    /// The session `sid`.
    pub(crate) fn session(&self, sid: &str) -> Option<Arc<Shared>> {
        self.find(|s| s.cfg.session_id == sid)
    }

    /// The session a request to `path` with `headers` is for, and the dev
    /// path below `dev/` it addresses there when it is a
    /// `dev/sessions/{sessionId}/…` request.
    pub(crate) fn pick(&self, path: &str, headers: &HeaderMap) -> (Arc<Shared>, Option<String>) {
        if let Some(rest) = path.strip_prefix("/dev/sessions/")
            && let Some((sid, below)) = rest.split_once('/')
            && let Some(sh) = self.session(sid)
        {
            return (sh, Some(below.to_string()));
        }
        let picked = if path.starts_with("/git/") {
            basic_password(headers)
                .and_then(|p| self.find(|s| s.lock().repo_token_access(&p).is_some()))
        } else {
            match crate::wire::routes::match_path(path) {
                Some((route, value)) => match route.spec().param {
                    Param::SessionId => self.session(&value),
                    Param::RunId => auth_value(headers, "Bearer")
                        .and_then(|t| self.find(|s| s.lock().bearer_live(t))),
                },
                None => None,
            }
        };
        (picked.unwrap_or_else(|| self.first()), None)
    }

    /// Adds a session like the first one: id `{first}-{n}`, branch
    /// `{first's branch}-{n}` created from the repository's default branch,
    /// a boot secret of its own; the initial task pending as `run-1` unless
    /// `start_idle`.
    ///
    /// Errors: the branch cannot be created.
    pub(crate) fn add(&self, start_idle: bool) -> anyhow::Result<Arc<Shared>> {
        let first = self.first();
        let mut sessions = self
            .sessions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = sessions.len() + 1;
        let c = &first.cfg;
        let branch = format!("{}-{n}", c.branch);
        super::git::create_branch(&c.repo, &branch)?;
        let cfg = Config {
            session_id: format!("{}-{n}", c.session_id),
            workspace_id: format!("{}-{n}", c.workspace_id),
            repo_full_name: c.repo_full_name.clone(),
            branch,
            client_info: c.client_info.clone(),
            connectors: c.connectors.clone(),
            setup_connectors: c.setup_connectors.clone(),
            redact_vars: c.redact_vars.clone(),
            bearer_ttl: c.bearer_ttl,
            clock_offset_s: c.clock_offset_s,
            bearer_expires_in_s: c.bearer_expires_in_s,
            repo_token_ttl: c.repo_token_ttl,
            repo_token_expires_at: c.repo_token_expires_at,
            boot_secret: Secret::new(super::state::random_hex(32)),
            dev_token: c.dev_token.clone(),
            long_poll: c.long_poll,
            repo: c.repo.clone(),
            served: c.served.clone(),
            latency: c.latency,
            counts_only: c.counts_only,
        };
        let task = (!start_idle).then_some(c.client_info.task.as_str());
        let mut state = State::new(task);
        state.agent_state_offer = first.lock().agent_state_offer;
        state.accepts_released = first.lock().accepts_released;
        let sh = Arc::new(Shared {
            state: std::sync::Mutex::new(state),
            cfg,
            changed: tokio::sync::Notify::new(),
        });
        sessions.push(sh.clone());
        Ok(sh)
    }

    /// The environment a sandbox on session `sh` needs (PROTOCOL.md section
    /// 1), as [`super::Coordinator::sandbox_env`] gives it for the first.
    /// Holds the session's boot secret.
    pub(crate) fn sandbox_env(&self, sh: &Shared) -> Vec<(String, String)> {
        let sid = &sh.cfg.session_id;
        let url = |r: Route| format!("{}{}", self.base_url, r.path(sid));
        vec![
            (
                "ORIZU_BOOT_SECRET".into(),
                sh.cfg.boot_secret.expose().to_string(),
            ),
            ("ORIZU_AGENT_TOKEN_URL".into(), url(Route::AgentToken)),
            ("ORIZU_API_BASE_URL".into(), self.base_url.to_string()),
            ("ORIZU_SESSION_ID".into(), sid.clone()),
            ("ORIZU_BOOT_STATUS_URL".into(), url(Route::BootStatus)),
            (
                "HOSTED_BOOT_GIT_BASE_URL".into(),
                format!("{}git", self.base_url),
            ),
        ]
    }

    fn describe(&self, sh: &Shared) -> Value {
        let env: serde_json::Map<String, Value> = self
            .sandbox_env(sh)
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        json!({
            "sessionId": sh.cfg.session_id,
            "branch": sh.cfg.branch,
            "env": env,
            "requests": sh.lock().requests.iter().filter(|r| r.route != Target::Dev).count(),
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AddSessions {
    #[serde(default)]
    count: Option<usize>,
    #[serde(default)]
    start_idle: bool,
}

/// `GET dev/sessions`: every session (id, branch, sandbox environment, how
/// many requests it received outside the dev API); `POST dev/sessions` `{"count": n?,
/// "startIdle": bool?}`: adds `n` (default 1) and lists those.
pub(crate) async fn dev_sessions(
    fleet: &Arc<Fleet>,
    method: &Method,
    headers: &HeaderMap,
    body: &[u8],
) -> Reply {
    let first = fleet.first();
    if let Some(token) = &first.cfg.dev_token
        && auth_value(headers, "Bearer") != Some(token.expose())
    {
        return Err(unauthorized("dev token"));
    }
    match *method {
        Method::GET => {
            let all: Vec<Value> = fleet.all().iter().map(|s| fleet.describe(s)).collect();
            Ok(ok(&json!({"sessions": all})))
        }
        Method::POST => {
            let req: AddSessions = if body.is_empty() {
                AddSessions::default()
            } else {
                parse(body)?
            };
            let (f, count, idle) = (fleet.clone(), req.count.unwrap_or(1), req.start_idle);
            // Each new session's branch is a `git` process.
            let added = tokio::task::spawn_blocking(move || {
                (0..count)
                    .map(|_| f.add(idle).map(|sh| f.describe(&sh)))
                    .collect::<anyhow::Result<Vec<Value>>>()
            })
            .await
            .map_err(|e| anyhow::anyhow!("adding sessions panicked: {e}"))
            .and_then(|r| r)
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}")))?;
            Ok(ok(&json!({"sessions": added})))
        }
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "use GET or POST on this route",
        )),
    }
}

/// The password of a Basic `Authorization` (a repo token, user
/// `x-access-token`).
fn basic_password(headers: &HeaderMap) -> Option<String> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(auth_value(headers, "Basic")?)
        .ok()?;
    let cred = String::from_utf8(raw).ok()?;
    let (_, pass) = cred.split_once(':')?;
    Some(pass.to_string())
}
