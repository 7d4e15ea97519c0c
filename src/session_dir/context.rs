//! `boot-context.json` (PROTOCOL.md section 3): what the git credential
//! helper needs, and no secret value: in broker mode where the credential
//! broker's socket is; in file mode what it needs to mint repository tokens
//! itself (the boot secret is then in the `boot-secret` file it names).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{SessionDirError, write_secret_file};
use crate::timings::Timings;

/// How `hosted-boot credential` gets repo tokens (`--credential-mode`,
/// PROTOCOL.md section 3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CredentialMode {
    /// The helper asks the runner's credential broker over its Unix socket;
    /// `boot-secret` is never written (the default).
    #[default]
    Broker,
    /// The helper reads `boot-secret` and mints tokens itself, sharing them
    /// through `repo-credential-cache` (for sandboxes that cannot pass a
    /// socket).
    File,
}

fn file_mode() -> CredentialMode {
    // A context without the field was written before the broker existed.
    CredentialMode::File
}

/// The credential helper's context. Written by the boot (0600, atomic), read
/// by every `hosted-boot credential` process. JSON, `camelCase`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootContext {
    /// `ORIZU_API_BASE_URL` (with its trailing slash).
    pub api_base_url: String,
    /// `ORIZU_AGENT_TOKEN_URL`.
    pub agent_token_url: String,
    /// `ORIZU_SESSION_ID`.
    pub session_id: String,
    /// The clone URL of the session's repository (no credential in it): the
    /// helper answers only for this remote.
    pub remote_url: String,
    /// Submodule remotes on the session's host that the clone met
    /// (PROTOCOL.md 3, "A complete workspace"): the helper answers for them
    /// as for `remote_url`. Absent: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub submodule_remotes: Vec<String>,
    /// Broker or file (see [`CredentialMode`]).
    #[serde(default = "file_mode")]
    pub credential_mode: CredentialMode,
    /// Broker mode: absolute path of the broker's socket (`credential.sock`).
    #[serde(default)]
    pub credential_socket: Option<PathBuf>,
    /// File mode: absolute path of the `boot-secret` file (`None` in broker
    /// mode, where no such file exists).
    #[serde(default)]
    pub boot_secret_path: Option<PathBuf>,
    /// Absolute path of the `repo-credential-cache` file.
    pub credential_cache_path: PathBuf,
    /// Absolute path of the `repo-tokens-issued` file: every token the
    /// helper hands out is appended there before it is printed.
    pub issued_tokens_path: PathBuf,
    /// Absolute path of the `repo-credential-lock` file.
    pub credential_lock_path: PathBuf,
    /// `HOSTED_BOOT_CA_FILE`, when set: extra trust roots (PEM).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// `HOSTED_BOOT_INSECURE_HTTP=1`: plain http to non-loopback hosts.
    #[serde(default)]
    pub insecure_http: bool,
    /// `HOSTED_BOOT_TEST_TIME_SCALE` (1.0 in production): the helper uses
    /// `Timings::default().scaled(time_scale)` when it is not 1.
    #[serde(default = "one")]
    pub time_scale: f64,
}

fn one() -> f64 {
    1.0
}

impl BootContext {
    /// The contract's durations under this context's time scale.
    pub fn timings(&self) -> Timings {
        if self.time_scale.is_finite() && self.time_scale > 0.0 && self.time_scale != 1.0 {
            Timings::default().scaled(self.time_scale)
        } else {
            Timings::default()
        }
    }

    /// Writes the context to `path` (0600, atomic, trailing newline).
    ///
    /// Errors: [`SessionDirError::Io`], or [`SessionDirError::Context`] if it
    /// cannot be serialized.
    pub fn write(&self, path: &Path) -> Result<(), SessionDirError> {
        let json = serde_json::to_vec_pretty(self).map_err(|e| SessionDirError::Context {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        write_secret_file(path, &json)
    }

    /// Reads a context written by [`BootContext::write`].
    ///
    /// Errors: [`SessionDirError::Io`] (missing: the session has ended), or
    /// [`SessionDirError::Context`] when it is not the expected JSON.
    pub fn read(path: &Path) -> Result<BootContext, SessionDirError> {
        let bytes = std::fs::read(path).map_err(|e| SessionDirError::io("read", path, e))?;
        serde_json::from_slice(&bytes).map_err(|e| SessionDirError::Context {
            path: path.to_path_buf(),
            reason: format!("not the expected JSON ({e})"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_wire_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("boot-context.json");
        let ctx = BootContext {
            api_base_url: "http://127.0.0.1:1/".into(),
            agent_token_url: "http://127.0.0.1:1/t".into(),
            session_id: "s1".into(),
            remote_url: "http://127.0.0.1:1/git/o/r.git".into(),
            submodule_remotes: Vec::new(),
            credential_mode: CredentialMode::File,
            credential_socket: None,
            boot_secret_path: Some("/x/boot-secret".into()),
            credential_cache_path: "/x/repo-credential-cache".into(),
            issued_tokens_path: "/x/repo-tokens-issued".into(),
            credential_lock_path: "/x/repo-credential-lock".into(),
            ca_file: None,
            insecure_http: false,
            time_scale: 0.5,
        };
        ctx.write(&path).unwrap();
        let value: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        for key in [
            "apiBaseUrl",
            "agentTokenUrl",
            "sessionId",
            "remoteUrl",
            "bootSecretPath",
            "credentialCachePath",
            "caFile",
            "insecureHttp",
            "timeScale",
        ] {
            assert!(value.get(key).is_some(), "{key} missing");
        }
        assert_eq!(BootContext::read(&path).unwrap(), ctx);
        assert_eq!(value["credentialMode"], "file");
        // A context of an older runner (no mode) is file mode.
        let mut old = value.clone();
        old.as_object_mut().unwrap().remove("credentialMode");
        std::fs::write(&path, serde_json::to_vec(&old).unwrap()).unwrap();
        assert_eq!(
            BootContext::read(&path).unwrap().credential_mode,
            CredentialMode::File
        );
        assert_eq!(
            ctx.timings().request_timeout,
            std::time::Duration::from_secs(5)
        );
    }
}
