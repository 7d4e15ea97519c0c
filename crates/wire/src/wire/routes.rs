//! The route table of PROTOCOL.md section 2: every route's method, path
//! pattern, credential, where its URL comes from, request and answer body
//! types, and answer size cap, written once ([`route_table!`] below). The
//! runner's client builds its requests from it and the reference
//! coordinator routes its requests by it, so a route cannot exist on one
//! side only: a new row is a new [`Route`] variant, which the coordinator's
//! exhaustive matches refuse to compile without, and its unit test sends a
//! request to every row. PROTOCOL.md stays the prose source of truth; this
//! table is what the code (and the contract kit's OpenAPI check) reads.
//!
//! Two rows have URLs the environment injects whole (section 1):
//! `ORIZU_AGENT_TOKEN_URL` and `ORIZU_BOOT_STATUS_URL` ([`Location`]). For
//! them the runner never builds a path; the path pattern is where the
//! reference coordinator serves them, which a production coordinator may
//! choose freely.

use std::marker::PhantomData;

use serde::{Deserialize, Serialize};

use super::{
    AcceptedThrough, AgentState, AgentStateAnswer, AgentTokenResponse, BootStatusBody, EnvBundle,
    EventsBody, FinishBody, RepoTokenRequest, RepoTokenResponse, SessionEnvelope,
};

/// The answer size caps of PROTOCOL.md section 2 ("body cap" table), in
/// bytes. A 2xx body is read through its route's cap ([`Spec::cap`]).
pub mod caps {
    /// The session read (2.4; at boot, between turns, the interrupt watch):
    /// 64 MiB. It carries the prompts (`clientInfo.task`, `pendingTurn.body`),
    /// and several MiB of pasted logs in one prompt is ordinary.
    pub const SESSION: usize = 64 * 1024 * 1024;
    /// The env bundle (2.3): 4 MiB. Its values become the agent's
    /// environment, which `execve` limits to a few MiB in all.
    pub const ENV_BUNDLE: usize = 4 * 1024 * 1024;
    /// The agent-state load (2.7): 64 MiB, the largest save a coordinator
    /// may offer (its `session.agentState.maxBytes` is at most this).
    pub const AGENT_STATE: usize = 64 * 1024 * 1024;
    /// Every other answer, a few fields (agent token, boot status, repo
    /// token, `run_started`, events, cursor, `finish`): 64 KiB.
    pub const SMALL: usize = 64 * 1024;
}

/// `Prefer` (RFC 7240): the header of the session read's long-poll
/// (PROTOCOL.md 2.4, "Long-poll of the session read"), `wait=<seconds>`.
pub const PREFER: &str = "prefer";
/// `Preference-Applied` (RFC 7240): the coordinator held the read.
pub const PREFERENCE_APPLIED: &str = "preference-applied";

/// The HTTP method of a route.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `POST`.
    Post,
}

impl Method {
    /// The method as HTTP spells it (`GET`, `POST`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
        }
    }
}

/// The credential a route takes, as `Authorization: Bearer <credential>`
/// (PROTOCOL.md section 2: "Bearer" means the agent bearer unless the boot
/// secret is named).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Auth {
    /// The boot secret (2.1, 2.2).
    BootSecret,
    /// The current agent bearer from 2.1; a `401` pulls a fresh one once
    /// (section 2, "Expired bearer").
    Bearer,
}

/// Where a route's URL comes from (PROTOCOL.md section 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// `ORIZU_API_BASE_URL` joined with the route's path.
    ApiBase,
    /// The whole URL is `ORIZU_AGENT_TOKEN_URL`, injected by the
    /// environment.
    AgentTokenUrl,
    /// The whole URL is `ORIZU_BOOT_STATUS_URL`, injected by the environment
    /// (default: the agent-token URL with its last segment `boot-status`).
    BootStatusUrl,
}

impl Location {
    /// The environment variable the URL comes from (for
    /// [`Location::ApiBase`], the base the path is relative to).
    pub const fn env_var(self) -> &'static str {
        match self {
            Location::ApiBase => "ORIZU_API_BASE_URL",
            Location::AgentTokenUrl => "ORIZU_AGENT_TOKEN_URL",
            Location::BootStatusUrl => "ORIZU_BOOT_STATUS_URL",
        }
    }

    /// Whether the environment injects the URL whole (the runner builds no
    /// path for it).
    pub const fn is_injected(self) -> bool {
        !matches!(self, Location::ApiBase)
    }
}

/// The one parameter of a route's path. Every route of section 2 has
/// exactly one; a route with two would change [`Route::path`] and
/// [`match_path`], on purpose, so that both sides say which is which.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// `{sessionId}`: `ORIZU_SESSION_ID`.
    SessionId,
    /// `{runId}`: the run of the turn.
    RunId,
}

impl Param {
    /// The placeholder in a path pattern (`{sessionId}`, `{runId}`).
    pub const fn placeholder(self) -> &'static str {
        match self {
            Param::SessionId => "{sessionId}",
            Param::RunId => "{runId}",
        }
    }
}

/// One row of the table.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    /// The route this row describes.
    pub route: Route,
    /// Its name in logs, the reference coordinator's faults and request
    /// record (PROTOCOL.md section 6: `agent-token`, `run-started`, …).
    pub name: &'static str,
    /// The HTTP method.
    pub method: Method,
    /// The path pattern, relative to `ORIZU_API_BASE_URL` (no leading `/`),
    /// with its parameter as `{sessionId}` or `{runId}` (OpenAPI's
    /// spelling). For an injected [`Location`], the path the reference
    /// coordinator serves.
    pub path: &'static str,
    /// The path's one parameter.
    pub param: Param,
    /// The credential.
    pub auth: Auth,
    /// Where the URL comes from.
    pub location: Location,
    /// The 2xx answer's size cap, bytes ([`caps`]).
    pub cap: usize,
    /// The request body type (`NoBody`: none is sent).
    pub request: &'static str,
    /// The 2xx answer's body type (`Ack`: the runner reads no field).
    pub response: &'static str,
    /// The PROTOCOL.md section.
    pub section: &'static str,
}

/// A route together with its body types: `Q` is what the runner sends,
/// `R` the 2xx answer it reads. The client and the coordinator both name
/// the route's constant ([`FINISH`], …), so they encode and decode the same
/// types.
pub struct Endpoint<Q, R> {
    route: Route,
    bodies: PhantomData<fn(Q) -> R>,
}

// By hand: a derive would require `Q: Copy, R: Copy`.
impl<Q, R> Clone for Endpoint<Q, R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Q, R> Copy for Endpoint<Q, R> {}

impl<Q, R> Endpoint<Q, R> {
    const fn new(route: Route) -> Self {
        Endpoint {
            route,
            bodies: PhantomData,
        }
    }

    /// The route.
    pub const fn route(self) -> Route {
        self.route
    }

    /// Its row of the table.
    pub fn spec(self) -> &'static Spec {
        self.route.spec()
    }
}

/// The request body of a route that sends none (the `GET`s).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoBody;

/// `{}`: the `run_started` request body (2.6).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmptyObject {}

/// The 2xx answer of a route whose body the contract leaves open (boot
/// status, `run_started`, `finish`): the runner reads only the status. The
/// reference coordinator answers `{"ok": true}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Always true from the reference coordinator.
    #[serde(default)]
    pub ok: bool,
}

impl Ack {
    /// `{"ok": true}`.
    pub const OK: Ack = Ack { ok: true };
}

/// Writes the table once: the [`Route`] enum (one variant per row, in row
/// order), [`TABLE`] (the rows, in the same order) and one [`Endpoint`]
/// constant per row with its body types.
macro_rules! route_table {
    ($(
        $(#[doc = $doc:literal])*
        $route:ident => $endpoint:ident {
            name: $name:literal,
            method: $method:ident,
            path: $path:literal,
            param: $param:ident,
            auth: $auth:ident,
            location: $location:ident,
            cap: $cap:expr,
            request: $req:ty,
            response: $resp:ty,
            section: $section:literal $(,)?
        }
    )*) => {
        /// A route of PROTOCOL.md section 2, one per row of [`TABLE`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Route {
            $( $(#[doc = $doc])* $route, )*
        }

        /// The rows, in [`Route`] order.
        pub const TABLE: &[Spec] = &[
            $(
                Spec {
                    route: Route::$route,
                    name: $name,
                    method: Method::$method,
                    path: $path,
                    param: Param::$param,
                    auth: Auth::$auth,
                    location: Location::$location,
                    cap: $cap,
                    request: stringify!($req),
                    response: stringify!($resp),
                    section: $section,
                },
            )*
        ];

        $(
            #[doc = concat!("[`Route::", stringify!($route), "`] with its body types.")]
            pub const $endpoint: Endpoint<$req, $resp> = Endpoint::new(Route::$route);
        )*
    };
}

route_table! {
    /// `GET` agent token (2.1): a fresh bearer, with the boot secret.
    AgentToken => AGENT_TOKEN {
        name: "agent-token",
        method: Get,
        path: "api/cli/sessions/{sessionId}/agent-token",
        param: SessionId,
        auth: BootSecret,
        location: AgentTokenUrl,
        cap: caps::SMALL,
        request: NoBody,
        response: AgentTokenResponse,
        section: "2.1",
    }
    /// `POST` boot status (2.2), with the boot secret.
    BootStatus => BOOT_STATUS {
        name: "boot-status",
        method: Post,
        path: "api/cli/sessions/{sessionId}/boot-status",
        param: SessionId,
        auth: BootSecret,
        location: BootStatusUrl,
        cap: caps::SMALL,
        request: BootStatusBody,
        response: Ack,
        section: "2.2",
    }
    /// `GET` env bundle (2.3).
    EnvBundle => ENV_BUNDLE {
        name: "env-bundle",
        method: Get,
        path: "api/cli/sessions/{sessionId}/env-bundle",
        param: SessionId,
        auth: Bearer,
        location: ApiBase,
        cap: caps::ENV_BUNDLE,
        request: NoBody,
        response: EnvBundle,
        section: "2.3",
    }
    /// `GET` session (2.4): at boot, between turns, and the interrupt
    /// watch (with `x-orizu-hosted-poll: during-turn`).
    Session => SESSION {
        name: "session",
        method: Get,
        path: "api/cli/sessions/{sessionId}",
        param: SessionId,
        auth: Bearer,
        location: ApiBase,
        cap: caps::SESSION,
        request: NoBody,
        response: SessionEnvelope,
        section: "2.4",
    }
    /// `POST` repo token (2.5).
    RepoToken => REPO_TOKEN {
        name: "repo-token",
        method: Post,
        path: "api/cli/sessions/{sessionId}/repo-token",
        param: SessionId,
        auth: Bearer,
        location: ApiBase,
        cap: caps::SMALL,
        request: RepoTokenRequest,
        response: RepoTokenResponse,
        section: "2.5",
    }
    /// `POST` `run_started` (2.6).
    RunStarted => RUN_STARTED {
        name: "run-started",
        method: Post,
        path: "api/cli/workbench-runs/{runId}",
        param: RunId,
        auth: Bearer,
        location: ApiBase,
        cap: caps::SMALL,
        request: EmptyObject,
        response: Ack,
        section: "2.6",
    }
    /// `POST` events (2.6).
    Events => EVENTS {
        name: "events",
        method: Post,
        path: "api/cli/workbench-runs/{runId}/events",
        param: RunId,
        auth: Bearer,
        location: ApiBase,
        cap: caps::SMALL,
        request: EventsBody,
        response: AcceptedThrough,
        section: "2.6",
    }
    /// `GET` events cursor (2.6).
    Cursor => CURSOR {
        name: "cursor",
        method: Get,
        path: "api/cli/workbench-runs/{runId}/events/cursor",
        param: RunId,
        auth: Bearer,
        location: ApiBase,
        cap: caps::SMALL,
        request: NoBody,
        response: AcceptedThrough,
        section: "2.6",
    }
    /// `POST` finish (2.6): the run's terminal seal.
    Finish => FINISH {
        name: "finish",
        method: Post,
        path: "api/cli/workbench-runs/{runId}/finish",
        param: RunId,
        auth: Bearer,
        location: ApiBase,
        cap: caps::SMALL,
        request: FinishBody,
        response: Ack,
        section: "2.6",
    }
    /// `GET` agent state (2.7, offered by `session.agentState`): the state
    /// to restore.
    AgentStateLoad => AGENT_STATE_LOAD {
        name: "agent-state-load",
        method: Get,
        path: "api/cli/sessions/{sessionId}/agent-state",
        param: SessionId,
        auth: Bearer,
        location: ApiBase,
        cap: caps::AGENT_STATE,
        request: NoBody,
        response: AgentStateAnswer,
        section: "2.7",
    }
    /// `POST` agent state (2.7, offered by `session.agentState`): the
    /// state after a turn.
    AgentStateSave => AGENT_STATE_SAVE {
        name: "agent-state-save",
        method: Post,
        path: "api/cli/sessions/{sessionId}/agent-state",
        param: SessionId,
        auth: Bearer,
        location: ApiBase,
        cap: caps::SMALL,
        request: AgentState,
        response: Ack,
        section: "2.7",
    }
}

impl Route {
    /// Every route, in table order.
    pub fn all() -> impl Iterator<Item = Route> {
        TABLE.iter().map(|spec| spec.route)
    }

    /// The route's row.
    pub fn spec(self) -> &'static Spec {
        // The macro writes the variants and the rows from one list, in one
        // order (checked by a test).
        &TABLE[self as usize]
    }

    /// The route's name (`agent-token`, `run-started`, …; [`Spec::name`]).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// The route named `name`, if any.
    pub fn from_name(name: &str) -> Option<Route> {
        TABLE.iter().find(|s| s.name == name).map(|s| s.route)
    }

    /// The path relative to `ORIZU_API_BASE_URL` with its parameter set to
    /// `value` (a path-safe id, PROTOCOL.md 5), e.g.
    /// `api/cli/workbench-runs/run-1/finish`.
    pub fn path(self, value: &str) -> String {
        let spec = self.spec();
        spec.path.replace(spec.param.placeholder(), value)
    }
}

/// The route a request with `method` (as HTTP spells it) to `path` is for:
/// the row of that path and method, else the first row of that path (whose
/// handler then refuses the method), with its parameter's value; as
/// [`match_path`]. Two rows share a path only with different methods (the
/// agent state's load and save).
pub fn match_request(method: &str, path: &str) -> Option<(Route, String)> {
    let first = match_path(path)?;
    let same_method = TABLE
        .iter()
        .filter(|spec| spec.path == first.0.spec().path)
        .find(|spec| spec.method.as_str().eq_ignore_ascii_case(method));
    Some(match same_method {
        Some(spec) => (spec.route, first.1),
        None => first,
    })
}

/// The first route a request path matches (with or without its leading
/// `/`, no query), and the value of its parameter; `None` when no row
/// matches. A parameter matches any one segment; the handler then checks it
/// names the session or a run. For the route of a request, whose method
/// may pick between rows of one path, [`match_request`].
pub fn match_path(path: &str) -> Option<(Route, String)> {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    TABLE.iter().find_map(|spec| {
        let pattern: Vec<&str> = spec.path.split('/').collect();
        if pattern.len() != segments.len() {
            return None;
        }
        let mut value = None;
        for (want, got) in pattern.iter().zip(&segments) {
            if *want == spec.param.placeholder() {
                value = Some(*got);
            } else if want != got {
                return None;
            }
        }
        value.map(|v| (spec.route, v.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_in_route_order_and_well_formed() {
        let mut names = std::collections::HashSet::new();
        for (i, spec) in TABLE.iter().enumerate() {
            assert_eq!(spec.route as usize, i, "{}", spec.name);
            assert!(names.insert(spec.name), "{} twice", spec.name);
            assert_eq!(Route::from_name(spec.name), Some(spec.route));
            // Exactly one `{…}`, the row's parameter, and no leading `/`
            // (the base URL's path is kept by `Url::join`).
            assert_eq!(spec.path.matches('{').count(), 1, "{}", spec.path);
            assert_eq!(spec.path.matches(spec.param.placeholder()).count(), 1);
            assert!(!spec.path.starts_with('/'), "{}", spec.path);
            assert_eq!(
                spec.method == Method::Get,
                spec.request == "NoBody",
                "{}: a GET sends no body, every POST one",
                spec.name
            );
        }
        assert_eq!(Route::all().count(), TABLE.len());
    }

    /// The two URLs PROTOCOL.md section 1 injects whole are the two
    /// boot-secret routes; every other route is under the API base.
    #[test]
    fn injected_urls_are_the_boot_secret_routes() {
        for spec in TABLE {
            assert_eq!(
                spec.location.is_injected(),
                spec.auth == Auth::BootSecret,
                "{}",
                spec.name
            );
        }
        assert_eq!(
            Route::AgentToken.spec().location.env_var(),
            "ORIZU_AGENT_TOKEN_URL"
        );
        assert_eq!(
            Route::BootStatus.spec().location.env_var(),
            "ORIZU_BOOT_STATUS_URL"
        );
    }

    #[test]
    fn every_path_matches_its_own_route_only() {
        for route in Route::all() {
            let path = route.path("id-1");
            let method = route.spec().method.as_str();
            assert_eq!(
                match_request(method, &path),
                Some((route, "id-1".into())),
                "{method} {path}"
            );
            assert_eq!(
                match_request(method, &format!("/{path}")),
                Some((route, "id-1".into()))
            );
            assert_eq!(match_path(&format!("{path}/x")), None, "{path}/x");
        }
        // A path with one row answers that row whatever the method (its
        // handler refuses it); a path with two picks by method.
        assert_eq!(
            match_request("DELETE", "api/cli/sessions/s1"),
            Some((Route::Session, "s1".into()))
        );
        assert_eq!(
            match_request("get", "api/cli/sessions/s1/agent-state"),
            Some((Route::AgentStateLoad, "s1".into()))
        );
        assert_eq!(
            match_request("PUT", "api/cli/sessions/s1/agent-state"),
            Some((Route::AgentStateLoad, "s1".into()))
        );
        assert_eq!(
            Route::Cursor.path("run-1"),
            "api/cli/workbench-runs/run-1/events/cursor"
        );
        assert_eq!(match_path("api/cli/sessions"), None);
        assert_eq!(match_path("/"), None);
    }
}
