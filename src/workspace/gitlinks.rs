//! The gitlinks the agent committed itself that others cannot fetch
//! (PROTOCOL.md 4.5, "Submodules and LFS files", issue 33): named in
//! `finish.result.unpublishedGitlinks`, pushed as the agent committed them.
//!
//! The harvest never moves a gitlink (its own commit puts a staged one back
//! as `HEAD` has it, [`super::commit`]); the agent's own commits are
//! pushed as they are, and an agent that updates a submodule pushes the
//! submodule first. When it did not, the session branch records a commit
//! nobody else can check out. The runner tells, without a request, as
//! `git push --recurse-submodules=check` does: a commit the submodule's
//! repository in the sandbox holds that none of its remote-tracking
//! branches contains was not pushed. A commit the sandbox does not hold,
//! or a submodule not checked out, is not judged (git does not either).
//! A gitlink no `.gitmodules` entry names (an embedded repository the agent
//! committed with `git add`) is named whatever it points to.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use git2::{ObjectType, Oid, Repository};

use super::brought::{GITLINK, as_path, brought_by, commits_to_push};
use super::repo_config::{gitmodules_paths, open_git_dir};
use crate::wire::{GitlinkReason, UnpublishedGitlink};

/// The gitlinks of `head`'s tree that the commits from `head` back to the
/// remote's branches (`heads`) added or moved, and that no remote branch's
/// tip records alike, whose commit others cannot fetch (see the module
/// documentation), in path order.
///
/// Errors: libgit2's, reading the superproject (a submodule that cannot be
/// read is not judged).
pub(super) fn unpublished(
    repo: &Repository,
    head: Oid,
    heads: &HashMap<String, Oid>,
) -> Result<Vec<UnpublishedGitlink>, git2::Error> {
    let walk = commits_to_push(repo, head, heads)?;
    let mut touched = BTreeSet::new();
    for oid in walk {
        let commit = repo.find_commit(oid?)?;
        for entry in brought_by(repo, &commit)? {
            if entry.is_gitlink() {
                touched.insert(entry.path);
            }
        }
    }
    if touched.is_empty() {
        return Ok(Vec::new());
    }
    let head_tree = repo.find_commit(head)?.tree()?;
    let registered = gitmodules_of(repo, &head_tree);
    let remote_trees: Vec<git2::Tree<'_>> = heads
        .values()
        .filter_map(|tip| repo.find_commit(*tip).and_then(|c| c.tree()).ok())
        .collect();
    let mut out = Vec::new();
    for path in touched {
        let path = as_path(&path);
        let Ok(entry) = head_tree.get_path(path) else {
            continue;
        };
        if entry.filemode_raw() != GITLINK {
            continue;
        }
        let commit = entry.id();
        // The remote records it alike already: nothing new for anyone.
        if remote_trees.iter().any(|t| {
            t.get_path(path)
                .is_ok_and(|e| e.id() == commit && e.filemode_raw() == GITLINK)
        }) {
            continue;
        }
        let text = path.to_string_lossy().into_owned();
        let reason = if !registered.contains(&text) {
            Some(GitlinkReason::NoGitmodulesEntry)
        } else {
            repo.workdir()
                .and_then(|w| not_pushed(&w.join(path), commit))
                .filter(|&unpushed| unpushed)
                .map(|_| GitlinkReason::SubmoduleNotPushed)
        };
        if let Some(reason) = reason {
            tracing::warn!(path = %text, commit = %commit, reason = ?reason, "harvest: the agent committed a gitlink whose commit others cannot fetch; pushed as committed (PROTOCOL.md 4.5)");
            out.push(UnpublishedGitlink {
                path: text,
                commit: commit.to_string(),
                reason,
            });
        }
    }
    Ok(out)
}

/// The paths `tree`'s `.gitmodules` gives (none when it has none or it is
/// not a blob).
fn gitmodules_of(repo: &Repository, tree: &git2::Tree<'_>) -> BTreeSet<String> {
    let Ok(entry) = tree.get_path(Path::new(".gitmodules")) else {
        return BTreeSet::new();
    };
    if entry.kind() != Some(ObjectType::Blob) {
        return BTreeSet::new();
    }
    repo.find_blob(entry.id())
        .map(|b| {
            gitmodules_paths(&String::from_utf8_lossy(b.content()))
                .into_iter()
                .map(|p| p.trim_end_matches('/').to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `commit`, which the repository checked out at `dir` holds, is on
/// none of its remote-tracking branches; `None` when that cannot be told
/// (no repository there, the commit not in it).
fn not_pushed(dir: &Path, commit: Oid) -> Option<bool> {
    let git_dir = git_dir_of(dir)?;
    let sub = match open_git_dir(&git_dir) {
        Ok(sub) => sub,
        Err(e) => {
            tracing::warn!(dir = %git_dir.display(), error = %e, "harvest: cannot read a submodule's repository; its gitlink is not judged");
            return None;
        }
    };
    sub.find_commit(commit).ok()?;
    let refs = sub.references_glob("refs/remotes/*").ok()?;
    let on_remote = refs.flatten().any(|r| {
        r.peel_to_commit()
            .is_ok_and(|tip| super::brought::contains(&sub, tip.id(), commit))
    });
    Some(!on_remote)
}

/// The git directory of the work tree `dir`: `dir/.git` when a directory,
/// or where its `gitdir:` line points when a file (a submodule's, in
/// `repo/.git/modules/`).
fn git_dir_of(dir: &Path) -> Option<PathBuf> {
    let dot_git = dir.join(".git");
    let meta = std::fs::symlink_metadata(&dot_git).ok()?;
    if meta.is_dir() {
        return Some(dot_git);
    }
    if !meta.is_file() || meta.len() > 4096 {
        return None;
    }
    let text = std::fs::read_to_string(&dot_git).ok()?;
    let target = text.strip_prefix("gitdir:")?.trim();
    Some(dir.join(target))
}
