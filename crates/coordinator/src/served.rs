//! More than the session's repository (PROTOCOL.md section 6, "Git"):
//! further repositories served beside it (a submodule's), read-only to the
//! session's repo tokens, and a minimal Git LFS batch API (download only)
//! over objects held in memory, for every served repository.
//!
//! Added with [`super::Coordinator::add_repository`] and
//! [`super::Coordinator::add_lfs_object`] (or `POST dev/repos` and
//! `POST dev/lfs`); nothing is served until something is added.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::git::{self, BareRepo};

/// The content type of the LFS batch API.
const LFS_JSON: &str = "application/vnd.git-lfs+json";

/// What is served beside the session's repository; shared by every session
/// of a fleet (clones share one `Arc`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Served {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    /// `owner/name` → its bare repository.
    repos: HashMap<String, BareRepo>,
    /// sha256 (hex) → the object's bytes.
    lfs: HashMap<String, Bytes>,
}

impl Served {
    /// Serves a bare clone of `source` as `full_name` in `project_root`
    /// (beside the session's repository), read-only.
    ///
    /// Errors: an invalid or taken name, a failing `git`.
    pub(crate) fn add_repository(
        &self,
        project_root: &Path,
        full_name: &str,
        source: &Path,
    ) -> anyhow::Result<()> {
        let workdir = project_root
            .parent()
            .ok_or_else(|| anyhow::anyhow!("the git project root has no parent"))?;
        // The branch is only created when missing: `HEAD`'s is enough.
        let repo = git::prepare_bare_repo(workdir, source, full_name, "main", false)?;
        crate::lock(&self.inner)
            .repos
            .insert(full_name.to_string(), repo);
        Ok(())
    }

    /// Holds `content` as an LFS object; returns its oid (sha256, hex).
    pub(crate) fn add_lfs_object(&self, content: &[u8]) -> String {
        let digest = ring::digest::digest(&ring::digest::SHA256, content);
        let oid: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        crate::lock(&self.inner)
            .lfs
            .insert(oid.clone(), Bytes::copy_from_slice(content));
        oid
    }

    /// The served repository that `path_info` (below `/git`) is in, other
    /// than the session's.
    pub(crate) fn repository_of(&self, path_info: &str) -> Option<BareRepo> {
        let inner = crate::lock(&self.inner);
        inner
            .repos
            .iter()
            .find(|(name, _)| path_info.starts_with(&format!("/{name}.git/")))
            .map(|(_, repo)| repo.clone())
    }

    /// The LFS answer when `path_info` is an LFS route of the repository
    /// `full_name` (`info/lfs/objects/batch`, or an object's download
    /// `info/lfs/objects/<oid>`), else `None`. The caller has checked the
    /// repo token; the download hrefs carry the request's own
    /// `Authorization`.
    pub(crate) fn lfs_answer(
        &self,
        full_name: &str,
        method: &Method,
        path_info: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Option<Response> {
        let rest = path_info.strip_prefix(&format!("/{full_name}.git/info/lfs/objects/"))?;
        if rest == "batch" && method == Method::POST {
            return Some(self.batch(full_name, headers, body));
        }
        if method == Method::GET {
            let found = crate::lock(&self.inner).lfs.get(rest).cloned();
            return Some(match found {
                Some(bytes) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/octet-stream")],
                    bytes,
                )
                    .into_response(),
                None => (StatusCode::NOT_FOUND, "no such LFS object\n").into_response(),
            });
        }
        Some(
            (
                StatusCode::METHOD_NOT_ALLOWED,
                "use POST on batch, GET on an object\n",
            )
                .into_response(),
        )
    }

    /// `POST …/info/lfs/objects/batch`: `download` only (an `upload` is
    /// refused whole: the runner's harvest never pushes LFS objects).
    fn batch(&self, full_name: &str, headers: &HeaderMap, body: &[u8]) -> Response {
        let lfs_error = |status: StatusCode, message: &str| {
            (
                status,
                [(header::CONTENT_TYPE, LFS_JSON)],
                json!({"message": message}).to_string(),
            )
                .into_response()
        };
        let Ok(request) = serde_json::from_slice::<Value>(body) else {
            return lfs_error(
                StatusCode::UNPROCESSABLE_ENTITY,
                "the batch request is not JSON",
            );
        };
        if request["operation"] != "download" {
            return lfs_error(
                StatusCode::FORBIDDEN,
                "this coordinator serves LFS downloads only",
            );
        }
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("localhost");
        let auth = headers
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        let inner = crate::lock(&self.inner);
        let objects: Vec<Value> = request["objects"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|o| {
                let oid = o["oid"].as_str().unwrap_or_default();
                match inner.lfs.get(oid) {
                    Some(bytes) => json!({
                        "oid": oid,
                        "size": bytes.len(),
                        "authenticated": true,
                        "actions": {"download": {
                            "href": format!("http://{host}/git/{full_name}.git/info/lfs/objects/{oid}"),
                            "header": {"Authorization": auth},
                        }},
                    }),
                    None => json!({
                        "oid": oid,
                        "size": o["size"],
                        "error": {"code": 404, "message": "no such LFS object"},
                    }),
                }
            })
            .collect();
        let mut response = (
            StatusCode::OK,
            json!({"transfer": "basic", "objects": objects}).to_string(),
        )
            .into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(LFS_JSON));
        response
    }
}
