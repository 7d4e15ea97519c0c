//! Why a boot failed before its drain began (PROTOCOL.md 4 step 7): the
//! errors of the steps, each with the code of 2.2 its `failed` reason starts
//! with, when it has one.

use crate::client::CallError;
use crate::validate::CheckError;
use crate::wire::ErrorCode;
use crate::workspace::WorkspaceError;

use super::environment::ReservedConnector;
use super::idle::{IdleError, InvalidTurn, SessionTooLarge};

/// A fatal error before the drain began. Messages name the value concerned
/// and what to do, never a secret; [`BootError::reason`] is the `failed`
/// reason.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// A coordinator call failed (step 2 or 3).
    #[error(transparent)]
    Call(#[from] CallError),
    /// The session answer at boot is over its cap (`session_too_large`).
    #[error(transparent)]
    SessionTooLarge(#[from] SessionTooLarge),
    /// The env bundle sets a reserved name (`reserved_connector_env`).
    #[error(transparent)]
    ReservedConnector(#[from] ReservedConnector),
    /// The pending turn breaks its shape (`hosted_pending_turn_invalid`).
    #[error(transparent)]
    InvalidTurn(#[from] InvalidTurn),
    /// The wait for a first turn failed (step 4).
    #[error(transparent)]
    Idle(#[from] IdleError),
    /// A value the coordinator sent failed its check (`invalid_value`,
    /// section 5): the session branch, the clone URL.
    #[error(transparent)]
    Invalid(#[from] CheckError),
    /// A session file or the clone failed (step 5; its code is
    /// [`WorkspaceError::code`]'s).
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    /// `ready` (step 4) was not acknowledged.
    #[error("ready was not acknowledged: {0}")]
    ReadyUnacknowledged(CallError),
    /// The repo token (2.5) has neither `repoFullName` nor
    /// `artifactsRemote`.
    #[error("the repo token names no repository")]
    NoRepository,
    /// The agent API proxy could not start (before the first turn).
    #[error(transparent)]
    AgentApi(#[from] crate::agent_api::proxy::ProxyError),
}

impl From<crate::session_dir::SessionDirError> for BootError {
    fn from(e: crate::session_dir::SessionDirError) -> Self {
        BootError::Workspace(e.into())
    }
}

impl BootError {
    /// The PROTOCOL.md 2.2 code of the failure, if it has one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            BootError::SessionTooLarge(_) => Some(SessionTooLarge::CODE),
            BootError::ReservedConnector(_) => Some(ReservedConnector::CODE),
            BootError::InvalidTurn(_) => Some(InvalidTurn::CODE),
            BootError::Idle(e) => e.code(),
            BootError::Invalid(_) => Some(ErrorCode::InvalidValue),
            BootError::Workspace(e) => Some(e.code()),
            BootError::Call(e) => e.code(),
            BootError::ReadyUnacknowledged(_)
            | BootError::NoRepository
            | BootError::AgentApi(_) => None,
        }
    }

    /// The `failed` reason (2.2): `<code>: <message>`, or the message alone
    /// for a failure without a code.
    pub fn reason(&self) -> String {
        match self.code() {
            Some(code) => code.reason(self),
            None => self.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_starts_with_the_code_of_its_failure() {
        let missing = BootError::from(WorkspaceError::SessionBranchMissing {
            branch: "orizu/s".into(),
            url: "https://git.example/o/r.git".into(),
        });
        assert!(
            missing
                .reason()
                .starts_with("session_branch_missing: the session branch \"orizu/s\""),
            "{}",
            missing.reason()
        );
        let large = BootError::from(SessionTooLarge {
            size: 10,
            size_exact: false,
            cap: 8,
        });
        assert!(
            large
                .reason()
                .starts_with("session_too_large: the session answer is more than 10 bytes"),
            "{}",
            large.reason()
        );
        assert_eq!(
            BootError::NoRepository.reason(),
            "the repo token names no repository"
        );
    }

    /// PROTOCOL.md 2.2: `invalid_value` is "a value the coordinator sent
    /// fails its check (5): the session branch, the clone URL". An
    /// `artifactsRemote` is the clone URL (2.5), but its check's
    /// A refused `artifactsRemote` is `invalid_value`, as the same URL
    /// built from `repoFullName` and refused by `validate::url` is (2.2).
    #[test]
    fn a_refused_artifacts_remote_is_an_invalid_value() {
        let response: crate::wire::RepoTokenResponse = serde_json::from_value(serde_json::json!({
            "token": "t-1",
            "artifactsRemote": "http://0123456789abcdef0123456789abcdef.artifacts.cloudflare.net/git/ns/app.git",
        }))
        .unwrap();
        let e = crate::client::repo_token_from(
            "repo-token mint",
            response,
            None,
            &crate::redact::Redactor::new(),
        )
        .unwrap_err();
        let reason = BootError::from(e).reason();
        assert!(reason.starts_with("invalid_value: "), "{reason}");
    }
}
