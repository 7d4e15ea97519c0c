//! Git LFS in a fresh clone (PROTOCOL.md 3, "A complete workspace"): the
//! clone's checkout (libgit2, which runs no filter) leaves LFS pointer
//! files; where `git-lfs` is installed, the runner configures its filter in
//! `repo/.git/config` (no hooks) and runs `git lfs pull` through the
//! repository's credential helper, so the objects arrive with the session's
//! credentials and the agent's git sees them as LFS files. Where it is not,
//! the pointers stay and the report names them.
//!
//! The harvest never commits an LFS-tracked path (`filter=lfs` in the
//! repository's attributes): libgit2 would commit its content as a plain
//! blob ([`super::attributes`], git's own reading of the attributes).

use std::path::Path;

use git2::{ObjectType, Repository, TreeWalkMode, TreeWalkResult};
use serde::Serialize;

use super::submodules::{GitRun, git};

/// The first line of every LFS pointer file (the spec's v1).
const POINTER_PREFIX: &[u8] = b"version https://git-lfs.github.com/spec/v1\n";
/// A pointer file is smaller than this (the spec's bound).
const POINTER_MAX: usize = 1024;
/// At most this many paths are listed in the report.
const MAX_LISTED: usize = 100;

/// The LFS files of a fresh clone, as the first turn's `hosted_boot.workspace`
/// event reports them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LfsReport {
    /// Whether `git-lfs` was found (`git lfs version`).
    pub git_lfs: bool,
    /// How many files of the session branch are LFS pointers in git.
    pub files: usize,
    /// The files left as pointers in the work tree (all of them without
    /// `git-lfs`; those whose object could not be fetched with it), at most
    /// 100.
    pub pointers: Vec<String>,
    /// Why `git lfs pull` failed, redacted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_pointer(bytes: &[u8]) -> bool {
    bytes.len() < POINTER_MAX && bytes.starts_with(POINTER_PREFIX)
}

/// The paths of `HEAD`'s tree whose blob is an LFS pointer.
fn pointer_paths(repo: &Repository) -> Result<Vec<String>, git2::Error> {
    let tree = repo.head()?.peel_to_tree()?;
    let odb = repo.odb()?;
    let mut out = Vec::new();
    tree.walk(TreeWalkMode::PreOrder, |dir, entry| {
        if entry.kind() == Some(ObjectType::Blob)
            && let Ok((size, _)) = odb.read_header(entry.id())
            && size < POINTER_MAX
            && let Ok(blob) = repo.find_blob(entry.id())
            && is_pointer(blob.content())
        {
            out.push(format!("{dir}{}", entry.name().unwrap_or_default()));
        }
        TreeWalkResult::Ok
    })?;
    Ok(out)
}

/// Brings the LFS objects of the fresh clone at `repo_dir` (see the module
/// documentation); `None` when the session branch has no LFS file.
pub fn complete(run: &GitRun<'_>, repo_dir: &Path) -> Option<LfsReport> {
    let files = Repository::open(repo_dir)
        .and_then(|repo| pointer_paths(&repo))
        .unwrap_or_default();
    if files.is_empty() {
        return None;
    }
    let git_lfs = git(run, repo_dir, &["lfs", "version"]).is_ok();
    let mut error = None;
    if git_lfs {
        let configured = [
            ("filter.lfs.clean", "git-lfs clean -- %f"),
            ("filter.lfs.smudge", "git-lfs smudge -- %f"),
            ("filter.lfs.process", "git-lfs filter-process"),
            ("filter.lfs.required", "true"),
        ]
        .iter()
        .try_for_each(|(k, v)| git(run, repo_dir, &["config", "--local", k, v]).map(drop));
        // The session's own endpoint, whatever the repository's .lfsconfig
        // says (`lfs.url` there could name another host, ssh, or a local
        // store): command-line configuration wins over .lfsconfig.
        // Derived as git-lfs derives it from the remote (`….git/info/lfs`).
        let remote = run.session.as_str().trim_end_matches('/');
        let endpoint = if remote.ends_with(".git") {
            format!("lfs.url={remote}/info/lfs")
        } else {
            format!("lfs.url={remote}.git/info/lfs")
        };
        error = configured
            .and_then(|()| git(run, repo_dir, &["-c", &endpoint, "lfs", "pull"]).map(drop))
            .err();
    }
    let pointers: Vec<String> = files
        .iter()
        .filter(|p| {
            std::fs::read(repo_dir.join(p))
                .map(|b| is_pointer(&b))
                .unwrap_or(true)
        })
        .take(MAX_LISTED)
        .cloned()
        .collect();
    if git_lfs && pointers.is_empty() {
        tracing::info!(files = files.len(), "LFS objects checked out");
    } else {
        tracing::warn!(
            git_lfs,
            files = files.len(),
            pointers = pointers.len(),
            error = error.as_deref().unwrap_or(""),
            "LFS files left as pointers in repo/"
        );
    }
    Some(LfsReport {
        git_lfs,
        files: files.len(),
        pointers,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_are_told_from_content() {
        assert!(is_pointer(
            b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 3\n"
        ));
        assert!(!is_pointer(b"hello"));
        let mut big = POINTER_PREFIX.to_vec();
        big.resize(POINTER_MAX, b'x');
        assert!(!is_pointer(&big));
    }
}
