//! How the agent reaches the coordinator's API during a turn (PROTOCOL.md
//! section 3, "The agent's API"): through the runner's API proxy
//! (`--agent-api proxy`, the default), which holds the real bearer and
//! forwards an allowlist of routes, or with the bearer itself
//! (`--agent-api bearer`, the contract before the proxy).
//!
//! The proxy ([`proxy::ApiProxy`]) is started once per boot; the turn asks
//! it for a per-turn proxy token ([`proxy::ApiProxy::issue`]) and revokes
//! that token when the agent's processes are gone
//! ([`proxy::ApiProxy::revoke`]).

mod listener;
mod peer;
pub mod proxy;

use std::sync::Arc;

use reqwest::Url;

use crate::wire::routes::Route;

pub use proxy::ApiProxy;

/// `--agent-api` (`HOSTED_BOOT_AGENT_API`): what `ORIZU_API_BASE_URL` and
/// `ORIZU_TOKEN_FILE` give the agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentApiMode {
    /// The runner's API proxy on loopback and a per-turn proxy token: the
    /// agent never holds a bearer.
    #[default]
    Proxy,
    /// The coordinator's base URL and the real bearer (the contract for
    /// platforms whose agents call routes the proxy does not forward).
    Bearer,
}

/// The routes the proxy never forwards, whatever the allowlist: each mints
/// or reads a credential (agent token, env bundle, repo token), speaks
/// for the runner with the boot secret (boot status), or carries what the
/// runner restores as the agent's own state (the agent state, which an
/// agent could otherwise plant for the next sandbox's CLI to resume).
pub const NEVER_FORWARDED: [Route; 6] = [
    Route::AgentToken,
    Route::BootStatus,
    Route::EnvBundle,
    Route::RepoToken,
    Route::AgentStateLoad,
    Route::AgentStateSave,
];

/// The routes the proxy forwards by default: reading the session (2.4).
pub const DEFAULT_ALLOWED: [Route; 1] = [Route::Session];

/// The routes the proxy forwards (`--agent-api-allow`, added to
/// [`DEFAULT_ALLOWED`]). Never holds a route of [`NEVER_FORWARDED`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowlist(Vec<Route>);

impl Default for Allowlist {
    fn default() -> Self {
        Allowlist(DEFAULT_ALLOWED.to_vec())
    }
}

/// A route name `--agent-api-allow` refuses: the message names it and
/// lists what may be named.
#[derive(Debug, thiserror::Error)]
pub enum AllowlistError {
    /// Not a route of `wire::routes`.
    #[error(
        "--agent-api-allow names {name:?}, which is not a route; the routes the agent API proxy can forward are: {}",
        forwardable_names()
    )]
    Unknown {
        /// The name given.
        name: String,
    },
    /// A route the proxy never forwards.
    #[error(
        "--agent-api-allow names {name}, which the agent API proxy never forwards (agent-token, boot-status, env-bundle and repo-token mint or read credentials, or speak for the runner); the routes it can forward are: {}",
        forwardable_names()
    )]
    NeverForwarded {
        /// The route's name.
        name: &'static str,
    },
}

/// The routes `--agent-api-allow` may name, comma-separated, in table order.
pub fn forwardable_names() -> String {
    Route::all()
        .filter(|r| !NEVER_FORWARDED.contains(r))
        .map(Route::name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Allowlist {
    /// [`DEFAULT_ALLOWED`] plus the routes `names` gives, by their
    /// `wire::routes` names (`session`, `cursor`, …; each already split on
    /// commas, blanks ignored).
    ///
    /// Errors: the first name that is not a route, or names a route of
    /// [`NEVER_FORWARDED`].
    pub fn with_names<S: AsRef<str>>(names: &[S]) -> Result<Allowlist, AllowlistError> {
        let mut routes = DEFAULT_ALLOWED.to_vec();
        for name in names.iter().map(|n| n.as_ref().trim()) {
            if name.is_empty() {
                continue;
            }
            let route = Route::from_name(name).ok_or_else(|| AllowlistError::Unknown {
                name: crate::text::head(name, 80).to_string(),
            })?;
            if NEVER_FORWARDED.contains(&route) {
                return Err(AllowlistError::NeverForwarded { name: route.name() });
            }
            if !routes.contains(&route) {
                routes.push(route);
            }
        }
        Ok(Allowlist(routes))
    }

    /// Whether `route` is forwarded.
    pub fn allows(&self, route: Route) -> bool {
        self.0.contains(&route)
    }

    /// The routes, in the order given.
    pub fn routes(&self) -> &[Route] {
        &self.0
    }
}

/// The agent's API for the turns of one boot.
#[derive(Clone)]
pub enum AgentApi {
    /// `--agent-api bearer`: the bearer file holds the real bearer, the
    /// agent calls the coordinator.
    Bearer,
    /// `--agent-api proxy`: the bearer file holds the turn's proxy token,
    /// the agent calls this proxy.
    Proxy(Arc<ApiProxy>),
}

impl AgentApi {
    /// The agent's `ORIZU_API_BASE_URL`: the proxy's, or `coordinator`.
    pub fn base_url(&self, coordinator: &Url) -> Url {
        match self {
            AgentApi::Bearer => coordinator.clone(),
            AgentApi::Proxy(p) => p.base_url().clone(),
        }
    }

    /// The proxy, in proxy mode.
    pub fn proxy(&self) -> Option<&ApiProxy> {
        match self {
            AgentApi::Bearer => None,
            AgentApi::Proxy(p) => Some(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_reads_the_session_only() {
        let a = Allowlist::default();
        assert_eq!(a.routes(), &[Route::Session]);
        assert_eq!(Allowlist::with_names::<&str>(&[]).unwrap(), a);
        assert_eq!(Allowlist::with_names(&["", " "]).unwrap(), a);
    }

    #[test]
    fn names_add_routes_once() {
        let a = Allowlist::with_names(&["cursor", " events ", "session", "cursor"]).unwrap();
        assert_eq!(a.routes(), &[Route::Session, Route::Cursor, Route::Events]);
        assert!(a.allows(Route::Events) && !a.allows(Route::Finish));
    }

    #[test]
    fn an_unknown_name_is_refused_with_the_valid_ones() {
        let e = Allowlist::with_names(&["sessions"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"sessions\"")
                && e.contains("session, run-started, events, cursor, finish"),
            "{e}"
        );
        assert!(!e.contains("agent-token,"), "{e}");
    }

    #[test]
    fn credential_routes_can_never_be_allowed() {
        for name in ["agent-token", "boot-status", "env-bundle", "repo-token"] {
            let e = Allowlist::with_names(&["session", name])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(name) && e.contains("never forwards") && e.contains("cursor"),
                "{e}"
            );
        }
    }
}
