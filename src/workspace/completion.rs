//! A complete workspace (PROTOCOL.md 3, "A complete workspace"): after a
//! fresh clone, its submodules ([`super::submodules`]) and its Git LFS
//! objects ([`super::lfs`]), reported as the first turn's
//! `hosted_boot.workspace` event when there is either.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;
use url::Url;

use super::lfs::{self, LfsReport};
use super::submodules::{self, GitRun, Level, SubmoduleReport};
use crate::redact::Redactor;

/// What the completion of a fresh clone did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Completion {
    /// Every submodule met, at every level, in order.
    pub submodules: Vec<SubmoduleReport>,
    /// The LFS files of the session branch, when it has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lfs: Option<LfsReport>,
}

impl Completion {
    /// Whether there is nothing to report (no submodule, no LFS file).
    pub fn is_empty(&self) -> bool {
        self.submodules.is_empty() && self.lfs.is_none()
    }

    /// The `hosted_boot.workspace` event's data.
    pub fn event_data(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Completes the fresh clone at `repo_dir`: every level of submodules
/// (`allow` is called with each URL on the session's host before it is
/// fetched, to let the credential helper answer for it), then LFS. Runs
/// the `git` CLI on tokio's blocking pool; never fails (what failed is in
/// the report).
pub async fn complete(
    repo_dir: PathBuf,
    session: Url,
    helper: String,
    redactor: Redactor,
    owner: Option<crate::agent_user::AgentUser>,
    allow: impl Fn(&Url),
) -> Completion {
    // Dropped with this future (a stop during the clone step): the git
    // command running on the blocking pool sees it and kills its group.
    let cancelled = Arc::new(AtomicBool::new(false));
    let _cancel_on_drop = CancelOnDrop(cancelled.clone());
    let mut done = Completion::default();
    let mut levels = vec![Level {
        dir: repo_dir.clone(),
        remote: session.clone(),
        prefix: String::new(),
        depth: 0,
    }];
    while let Some(level) = levels.pop() {
        let (s, h, r, l, c, o) = (
            session.clone(),
            helper.clone(),
            redactor.clone(),
            level.clone(),
            cancelled.clone(),
            owner.clone(),
        );
        let planned = tokio::task::spawn_blocking(move || {
            let run = GitRun {
                session: &s,
                helper: &h,
                redactor: &r,
                cancelled: &c,
                owner: o.as_ref(),
            };
            submodules::plan(&run, &l)
        })
        .await;
        let planned = match planned {
            Ok(Ok(planned)) => planned,
            Ok(Err(reason)) => {
                tracing::warn!(dir = %level.dir.display(), %reason, "the submodules could not be read");
                continue;
            }
            Err(_) => continue,
        };
        for p in &planned {
            if let Some(url) = &p.url
                && p.refused.is_none()
                && submodules::on_session_host(url, &session)
            {
                allow(url);
            }
        }
        let (s, h, r, c, o) = (
            session.clone(),
            helper.clone(),
            redactor.clone(),
            cancelled.clone(),
            owner.clone(),
        );
        let updated = tokio::task::spawn_blocking(move || {
            let run = GitRun {
                session: &s,
                helper: &h,
                redactor: &r,
                cancelled: &c,
                owner: o.as_ref(),
            };
            submodules::update(&run, &level, &planned)
        })
        .await;
        if let Ok((reports, next)) = updated {
            done.submodules.extend(reports);
            levels.extend(next.into_iter().rev());
        }
    }
    let marker_dir = repo_dir.clone();
    let (s, h, r, c, o) = (session, helper, redactor, cancelled.clone(), owner);
    done.lfs = tokio::task::spawn_blocking(move || {
        let run = GitRun {
            session: &s,
            helper: &h,
            redactor: &r,
            cancelled: &c,
            owner: o.as_ref(),
        };
        lfs::complete(&run, &repo_dir)
    })
    .await
    .ok()
    .flatten();
    if let Err(e) = std::fs::remove_file(repo_dir_marker(&marker_dir)) {
        tracing::warn!(error = %e, "cannot remove the marker of the pending completion");
    }
    done
}

/// The marker of a completion not finished yet: written before a fresh
/// clone's checkout, removed when [`complete`] has run to its end. A
/// restarted boot that finds `repo/` with it (a boot killed before its
/// first turn: the agent never had `repo/`) completes the workspace again
/// (PROTOCOL.md 3, "A complete workspace"). It lives in the root's runner
/// directory (`<root>/.hosted-boot/`, beside the lock), never in `repo/`:
/// `repo/` is the agent's once a turn ran, and a marker the agent could
/// plant there would make the next boot re-run the completion over the
/// agent's tree (deleting through its symlinks, running its git config).
pub(super) fn repo_dir_marker(repo_dir: &Path) -> PathBuf {
    repo_dir
        .parent()
        .unwrap_or(repo_dir)
        .join(super::lock::LOCK_DIR)
        .join(PENDING)
}

const PENDING: &str = "completion-pending";

/// Writes the marker of a pending completion for the clone at `repo_dir`.
///
/// Errors: the file cannot be written.
pub(super) fn mark_pending(repo_dir: &Path) -> std::io::Result<()> {
    let marker = repo_dir_marker(repo_dir);
    if let Some(dir) = marker.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(marker, b"")
}

/// Whether the clone at `repo_dir` has a completion still to run.
pub fn is_pending(repo_dir: &Path) -> bool {
    repo_dir_marker(repo_dir).is_file()
}

/// Sets its flag when dropped.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_is_never_in_the_work_tree_the_agent_gets() {
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join("repo");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        assert!(!is_pending(&repo));
        // A marker planted where an agent can write it counts for nothing.
        std::fs::write(repo.join(".git/hosted-boot-completion-pending"), b"").unwrap();
        std::fs::write(repo.join(".git").join(PENDING), b"").unwrap();
        assert!(!is_pending(&repo));
        mark_pending(&repo).unwrap();
        assert!(is_pending(&repo));
        let marker = repo_dir_marker(&repo);
        assert!(!marker.starts_with(&repo), "{}", marker.display());
        assert_eq!(marker, root.path().join(".hosted-boot/completion-pending"));
    }
}
