//! What the setup script changed in tracked files (PROTOCOL.md 4.1 step 3,
//! "Setup"): not the agent's work, so the runner undoes it before the agent
//! starts and the harvest never commits it. Setup is for what git does not
//! track (dependencies, build caches, tools); the agent starts from the
//! session branch as the workspace sync left it.

use git2::{ResetType, Status, StatusOptions};

use super::harvest::{Harvester, message};

/// What [`Harvester::undo_setup_changes`] undid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetupChanges {
    /// Tracked paths setup modified, deleted, staged or added to the index,
    /// sorted.
    pub paths: Vec<String>,
    /// Whether setup had moved `HEAD` (a commit, a checkout): it is put
    /// back on the commit it started from.
    pub head_moved: bool,
}

impl SetupChanges {
    /// Whether setup left anything to undo.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty() && !self.head_moved
    }
}

impl Harvester {
    /// The commit `HEAD` is on, if any (local; `None` for an unborn or
    /// unreadable repository).
    pub async fn head_commit(&self) -> Option<String> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let hold = this.lock_repo();
            if hold.refused().is_some() {
                return None;
            }
            let repo = super::repo_config::open(&this.repo_dir).ok()?;
            let head = repo.head().ok()?.target()?;
            Some(head.to_string())
        })
        .await
        .ok()
        .flatten()
    }

    /// Puts `repo/`'s tracked files, index and `HEAD` back to `before` (the
    /// commit `HEAD` was on when setup started) when setup changed any of
    /// them; untracked and ignored files (what setup is for) stay.
    ///
    /// Errors: the repository cannot be opened or reset (the message says
    /// why); the caller fails the turn `setup_failed`, since the agent would
    /// otherwise start on work that is not the user's.
    pub async fn undo_setup_changes(
        &self,
        before: Option<String>,
    ) -> Result<SetupChanges, UndoFailed> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let hold = this.lock_repo();
            if let Some(why) = hold.refused() {
                return Err(why.to_string());
            }
            let repo = super::repo_config::open(&this.repo_dir).map_err(|e| message(&e))?;
            let mut options = StatusOptions::new();
            options.include_untracked(false).include_ignored(false);
            let statuses = repo.statuses(Some(&mut options)).map_err(|e| message(&e))?;
            let mut paths: Vec<String> = statuses
                .iter()
                .filter(|s| s.status() != Status::CURRENT && !s.status().is_ignored())
                .filter_map(|s| s.path().ok().map(str::to_string))
                .collect();
            paths.sort();
            paths.dedup();
            let head = repo.head().ok().and_then(|h| h.target());
            let before = match before.as_deref().map(git2::Oid::from_str) {
                Some(Ok(oid)) => Some(oid),
                _ => head,
            };
            let changes = SetupChanges {
                paths,
                head_moved: head != before,
            };
            if changes.is_empty() {
                return Ok(changes);
            }
            let Some(target) = before else {
                return Err("repo/ has no commit to put setup's changes back to".to_string());
            };
            let object = repo.find_object(target, None).map_err(|e| message(&e))?;
            repo.reset(&object, ResetType::Hard, None)
                .map_err(|e| message(&e))?;
            Ok(changes)
        })
        .await
        .map_err(|e| format!("the undo of setup's changes did not finish: {e}"))
        .and_then(|undone| undone)
        .map_err(UndoFailed)
    }
}

/// Setup's changes to tracked files could not be put back (the message
/// says why); the turn fails `setup_failed`.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UndoFailed(pub String);
