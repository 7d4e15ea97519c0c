//! The workspace: the clone of the
//! session branch through a git smart-HTTP transport on the runner's own
//! HTTP client (4 step 5), and the git credential helper (3).
//!
//! - [`transport`]: the git2 subtransport over reqwest (one TLS stack, our
//!   trust roots), with credentials from the repository's helper.
//! - [`clone`]: `repo/`: clone the session branch or reuse an existing clone.
//! - [`credential`]: `hosted-boot credential get|store|erase`.
//! - [`broker`]: the credential broker (broker mode): repo tokens for the
//!   transport in process and for the helper over a Unix socket.
//! - [`harvest`]: commit and push the agent's work after a turn and at boot
//!   (4.5); the [`Harvester`] that the steps below share.
//! - [`checkpoint`]: the work as it stands while the agent runs, on a
//!   notice, to `<branch>-recovered-checkpoint-<runId>` (4.5).
//! - [`sync`]: bring `repo/` to the remote's session branch before a turn
//!   (4.5 "Before a turn").
//! - [`commit`]: the harvest's commit of what the agent left uncommitted.
//! - [`size_limit`]: files over `--harvest-max-file-size` left out of what
//!   the harvest commits and pushes.
//! - [`attributes`]: the `filter` attribute of a path as git reads it
//!   (quoted patterns libgit2 does not read).
//! - [`brought`]: the entries a commit brings to the remote (any mode, names
//!   as bytes), walked by the checks every push passes.
//! - [`gitlinks`]: gitlinks the agent committed whose commit others cannot
//!   fetch, named in the harvest's report.
//! - [`secret_guard`]: the check every push passes (the push policy, no
//!   secret in the commits it brings) and the hold-back of the agent's
//!   commits that hold one.
//! - [`push`]: one attempt of the harvest's push, to the session branch or a
//!   recovery branch.
//! - [`remote`]: fetch and push through the boot's transport, transport
//!   failures retried within the bound.
//! - [`recovery`]: recovery branch names and the local refs that keep
//!   commits (`refs/hosted-boot/discarded/`, `refs/hosted-boot/oversized/`).
//! - [`completion`]: a fresh clone's submodules ([`submodules`]) and Git
//!   LFS objects ([`lfs`]), for the first turn's `hosted_boot.workspace`.
//! - [`local_branch`]: the local session branch saved, then moved to the
//!   remote's tip.

mod attributes;
pub mod broker;
mod brought;
pub mod checkpoint;
pub mod clone;
mod commit;
pub mod completion;
pub mod credential;
mod git_config;
mod gitlinks;
pub mod harvest;
mod lfs;
mod local_branch;
pub mod lock;
pub mod mirror;
mod push;
mod recovery;
mod remote;
mod repo_config;
mod secret_guard;
mod setup_changes;
mod size_limit;
pub mod socket_path;
mod special_files;
pub mod submodules;
mod sync;
pub mod transport;
mod unblock;

use std::path::{Path, PathBuf};

use crate::session_dir::SessionDirError;
use crate::wire::ErrorCode;

pub use broker::{Broker, BrokerServer};
pub use clone::{
    PreparedRepo, RepoSpec, credential_helper_command, current_exe_helper_command, prepare_repo,
    prepare_repo_async,
};
pub use credential::{
    IssuedTokens, credential_helper_with_io, read_cache_entry, record_issued_token,
    run_credential_helper,
};
pub use harvest::{HarvestJob, Harvester, RECOVERED_AT_BOOT};
pub use lock::{LockError, RootLock};
pub use setup_changes::SetupChanges;
pub use transport::{CredentialHelpers, HttpContext, RemoteRegistration, register_remote};

/// Why a workspace step failed. Messages name the value concerned (path,
/// branch, URL) and what to do; never a token or the boot secret.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// A file system operation failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was attempted, e.g. `write` or `create directory`.
        action: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A value failed its check (PROTOCOL.md section 5).
    #[error(transparent)]
    Invalid(#[from] crate::validate::CheckError),
    /// A file of the session directory could not be read or written.
    #[error(transparent)]
    SessionDir(#[from] SessionDirError),
    /// The session branch does not exist on the remote (PROTOCOL.md 3,
    /// `session_branch_missing`): the coordinator provisions it.
    #[error(
        "the session branch {branch:?} does not exist on {url}; the coordinator must create it before the sandbox boots"
    )]
    SessionBranchMissing {
        /// The session branch.
        branch: String,
        /// The remote (clone URL, no credential).
        url: String,
    },
    /// `repo/` exists but is not a clone of the session's remote.
    #[error(
        "{} exists but {found}, not a clone of the session remote {expected}; move it away (or empty it) and boot again",
        path.display()
    )]
    ForeignRepo {
        /// The `repo/` path.
        path: PathBuf,
        /// What was found there (`is not a git repository`, `its origin is …`).
        found: String,
        /// The session remote.
        expected: String,
    },
    /// Every attempt of the clone failed with a transport failure the retry
    /// rule retries (PROTOCOL.md section 2, the clone row).
    #[error(
        "the clone of {url} failed after {attempts} attempts (no response, reset, stall, 429 or 5xx each time); the last: {last}"
    )]
    CloneExhausted {
        /// The remote (clone URL, no credential).
        url: String,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's failure.
        last: Box<WorkspaceError>,
    },
    /// A git operation failed (transport errors included).
    #[error("git {action} of {url} failed: {message}")]
    Git {
        /// What was attempted (`fetch`, `checkout`, `configure`, …).
        action: &'static str,
        /// The remote URL or the repository path.
        url: String,
        /// libgit2's message (never holds a credential: the transport keeps
        /// tokens out of URLs and messages).
        message: String,
    },
}

impl WorkspaceError {
    /// The code a `failed` reason for this error starts with (PROTOCOL.md
    /// 2.2; `session_branch_missing` is section 3's).
    pub fn code(&self) -> ErrorCode {
        match self {
            WorkspaceError::Io { .. } => ErrorCode::WorkspaceIo,
            WorkspaceError::Invalid(_) => ErrorCode::InvalidValue,
            WorkspaceError::SessionDir(SessionDirError::Invalid(_)) => ErrorCode::InvalidValue,
            WorkspaceError::SessionDir(
                SessionDirError::Io { .. } | SessionDirError::Context { .. },
            ) => ErrorCode::WorkspaceIo,
            WorkspaceError::SessionBranchMissing { .. } => ErrorCode::SessionBranchMissing,
            WorkspaceError::ForeignRepo { .. } => ErrorCode::RepoConflict,
            WorkspaceError::Git { .. } | WorkspaceError::CloneExhausted { .. } => {
                ErrorCode::CloneFailed
            }
        }
    }

    pub(crate) fn io(action: &'static str, path: &Path, source: std::io::Error) -> Self {
        WorkspaceError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    }
}
