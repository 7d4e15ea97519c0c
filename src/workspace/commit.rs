//! The harvest's commit (PROTOCOL.md 4.5 step 1): what the agent left
//! uncommitted, tracked or new and not ignored, committed on `HEAD` with the
//! agent's git identity and a message naming the run and its outcome; files
//! over the size limit stay out of it ([`super::size_limit`]).

use std::cell::RefCell;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use git2::{ErrorCode, IndexAddOption, Oid, Repository, RepositoryState, Signature, StatusOptions};

use super::attributes::{Filter, Filters};
use super::brought::{as_path, update_mode, walk_tree};
use super::clone::{GIT_USER_EMAIL, GIT_USER_NAME};
use super::harvest::{HarvestJob, message};
use super::size_limit::{note_left_out, note_skipped, staged_over};
use crate::wire::{RunOutcome, SkipReason, SkippedFile};

pub(super) fn status_options() -> StatusOptions {
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .exclude_submodules(true);
    opts
}

fn commit_message(job: &HarvestJob) -> String {
    let name = &job.name;
    match job.outcome {
        Some(RunOutcome::Succeeded) => format!(
            "{name}: work the agent left uncommitted\n\nCommitted by hosted-boot after the turn succeeded (the harvest, PROTOCOL.md 4.5).\n"
        ),
        Some(outcome) => {
            let outcome = outcome.as_str();
            format!(
                "WIP {name}: work in progress (turn {outcome})\n\nCommitted by hosted-boot when the turn ended {outcome}, so that the work is not lost (the harvest, PROTOCOL.md 4.5).\n"
            )
        }
        None => format!(
            "WIP {name}: work found in repo/ when the runner restarted\n\nCommitted by hosted-boot at boot, so that the work is not lost (the harvest, PROTOCOL.md 4.5).\n"
        ),
    }
}

/// Commits every change of the work tree that git does not ignore on
/// `HEAD`, except files over `max` bytes (new or changed), which stay in the
/// work tree uncommitted and are noted in `skipped`. `None` when there is
/// nothing to commit.
pub(super) fn commit_uncommitted(
    repo: &Repository,
    job: &HarvestJob,
    max: Option<u64>,
    skipped: &mut Vec<SkippedFile>,
) -> Result<Option<Oid>, git2::Error> {
    // The agent's process group is gone by now: an index lock left behind is
    // a git command killed mid-way (an interrupt), which would otherwise
    // block every harvest from here on.
    let index_lock = repo.path().join("index.lock");
    if index_lock.exists() {
        tracing::warn!(path = %index_lock.display(), "harvest: removing the index lock a killed git command left");
        if let Err(e) = std::fs::remove_file(&index_lock) {
            tracing::warn!(path = %index_lock.display(), error = %e, "harvest: cannot remove the index lock");
        }
    }
    remove_ref_locks(repo);
    let Some(Staged { tree, parent }) = stage_uncommitted(repo, max, skipped)? else {
        return Ok(None);
    };
    if parent.as_ref().is_some_and(|p| p.tree_id() == tree) {
        return Ok(None);
    }
    let tree = repo.find_tree(tree)?;
    let sig = Signature::now(GIT_USER_NAME, GIT_USER_EMAIL)?;
    let oid = repo.commit(
        Some("HEAD"),
        &sig,
        &sig,
        &commit_message(job),
        &tree,
        &parent.iter().collect::<Vec<_>>(),
    )?;
    head_moved_to(repo, oid)?;
    if repo.state() != RepositoryState::Clean {
        // A merge or rebase the agent left half done: its commit is made,
        // the state files would only confuse the next turn.
        repo.cleanup_state()?;
    }
    tracing::info!(commit = %oid, name = %job.name, "harvest: committed what the agent left uncommitted");
    Ok(Some(oid))
}

/// What [`stage_uncommitted`] staged: the tree of the index, and the
/// commit at `HEAD` it goes on (`None`: an unborn `HEAD`).
pub(super) struct Staged<'r> {
    pub(super) tree: Oid,
    pub(super) parent: Option<git2::Commit<'r>>,
}

/// Stages in the repository's index (`repo.index()`: `.git/index`, or the
/// one a checkpoint set on its own handle) every change of the work tree
/// that git does not ignore, except files over `max` bytes (new or
/// changed), which are noted in `skipped`; writes the index and its tree.
/// `None` when the work tree has no change. Touches no ref.
// long: one index, filled by two paths (everything at once, else path
// by path) under the same size guard, then written.
pub(super) fn stage_uncommitted<'r>(
    repo: &'r Repository,
    max: Option<u64>,
    skipped: &mut Vec<SkippedFile>,
) -> Result<Option<Staged<'r>>, git2::Error> {
    // Entries outside a sparse checkout's cone (skip-worktree) are absent
    // from the work tree by design: libgit2 would stage their deletion
    // (found by a review: a `git sparse-checkout set` pushed the deletion
    // of every file outside the cone). They stay as the index has them.
    let sparse: std::collections::HashSet<Vec<u8>> = repo
        .index()?
        .iter()
        .filter(|e| e.flags_extended & SKIP_WORKTREE != 0)
        .map(|e| e.path)
        .collect();
    let statuses = repo.statuses(Some(&mut status_options()))?;
    // The status leaves submodules out, so a gitlink the agent removed from
    // the index (`git rm --cached sub`) is no change to it: looked for
    // apart, so that the removal is committed whether or not anything else
    // is (found by a review).
    if statuses.is_empty() && !removed_gitlink(repo)? {
        return Ok(None);
    }
    let workdir = repo.workdir().map(Path::to_path_buf);
    // The filter attribute of every changed path, from git at once.
    let filters = {
        let owned: Vec<Vec<u8>> = statuses
            .iter()
            .filter(|e| !e.status().is_wt_deleted())
            .map(|e| e.path_bytes().to_vec())
            .collect();
        let paths: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        Filters::read(repo, &paths)
    };
    // The size of a regular file of the work tree over the limit (a
    // symbolic link is its target's name, never large).
    let over = |path: &Path| -> Option<u64> {
        let max = max?;
        let meta = std::fs::symlink_metadata(workdir.as_ref()?.join(path)).ok()?;
        (meta.is_file() && meta.len() > max).then_some(meta.len())
    };
    let left_out: RefCell<Vec<(String, u64)>> = RefCell::new(Vec::new());
    let other_reasons: RefCell<Vec<(String, u64, SkipReason)>> = RefCell::new(Vec::new());
    // Left out whatever its size (issue 33): a directory with its own
    // `.git`, a file with an external clean filter.
    let left_out_for = |path: &Path| -> bool {
        let Some(reason) = workdir
            .as_deref()
            .and_then(|w| left_out_reason(repo, &filters, w, path))
        else {
            return false;
        };
        let bytes = workdir
            .as_ref()
            .and_then(|w| std::fs::symlink_metadata(w.join(path)).ok())
            .filter(|m| m.is_file())
            .map_or(0, |m| m.len());
        let text = path.to_string_lossy();
        other_reasons
            .borrow_mut()
            .push((text.trim_end_matches('/').to_string(), bytes, reason));
        true
    };
    let kept = kept_paths(repo)?;
    let keep = |path: &Path| -> bool {
        if sparse.contains(path.as_os_str().as_encoded_bytes()) {
            return true;
        }
        if kept.gitlinks.iter().any(|g| as_path(g) == path) {
            tracing::warn!(path = %path.display(), "harvest: a submodule is left as it is (PROTOCOL.md 4.5)");
            return true;
        }
        if filters.of(repo, path) != Filter::Lfs {
            return false;
        }
        // A new or changed LFS file is named, so that the coordinator
        // knows work stays in the sandbox (found by a review); a deleted
        // one is left as it is, as before.
        match workdir
            .as_ref()
            .and_then(|w| std::fs::symlink_metadata(w.join(path)).ok())
        {
            Some(meta) if meta.is_file() => other_reasons.borrow_mut().push((
                path.to_string_lossy().into_owned(),
                meta.len(),
                SkipReason::Lfs,
            )),
            _ => {
                tracing::warn!(path = %path.display(), "harvest: an LFS-tracked path is left as it is (PROTOCOL.md 4.5)");
            }
        }
        true
    };
    // Skipped before it is hashed: a file of gigabytes is never read.
    let mut guard = |path: &Path, _spec: &[u8]| -> i32 {
        if keep(path) || left_out_for(path) {
            return 1;
        }
        match over(path) {
            Some(bytes) => {
                left_out
                    .borrow_mut()
                    .push((path.to_string_lossy().into_owned(), bytes));
                1
            }
            None => 0,
        }
    };
    let mut index = repo.index()?;
    if let Err(e) = index
        .add_all(["*"], IndexAddOption::DEFAULT, Some(&mut guard))
        .and_then(|()| index.update_all(["*"], Some(&mut guard)))
    {
        // One path libgit2 cannot add (a nested repository, say) must not
        // keep the others from being saved: add them one by one.
        tracing::warn!(error = %message(&e), "harvest: adding everything failed; adding path by path");
        index.read(true)?;
        for entry in statuses.iter() {
            // By its bytes: a name that is not UTF-8 (`café` in Latin-1)
            // is the agent's work all the same (found by a review).
            let path = Path::new(std::ffi::OsStr::from_bytes(entry.path_bytes()));
            if keep(path) || left_out_for(path) {
                continue;
            }
            if let Some(bytes) = over(path) {
                left_out
                    .borrow_mut()
                    .push((path.to_string_lossy().into_owned(), bytes));
                continue;
            }
            let added = if repo.workdir().is_some_and(|w| w.join(path).exists()) {
                index.add_path(path)
            } else {
                index.remove_path(path)
            };
            if let Err(e) = added {
                tracing::warn!(path = %path.display(), error = %message(&e), "harvest: path left out of the commit");
            }
        }
    }
    for (path, bytes) in left_out.into_inner() {
        note_skipped(skipped, &path, bytes);
    }
    for (path, bytes, reason) in other_reasons.into_inner() {
        note_left_out(skipped, &path, bytes, reason);
    }
    // An unborn HEAD (`git checkout --orphan`): the work becomes a root
    // commit of that branch.
    let parent = match repo.head() {
        Ok(head) => Some(head.peel_to_commit()?),
        Err(e) if e.code() == ErrorCode::UnbornBranch => None,
        Err(e) => return Err(e),
    };
    if let Some(max) = max
        && let Some(parent) = &parent
    {
        // A large file the agent staged (`git add`) without committing is in
        // the index already: back to HEAD's version for those paths.
        let staged = staged_over(repo, &index, &parent.tree()?, max)?;
        if !staged.is_empty() {
            let paths: Vec<&[u8]> = staged.iter().map(|(p, _)| p.as_slice()).collect();
            back_to_head(repo, &mut index, Some(parent), &paths)?;
            for (path, bytes) in &staged {
                note_skipped(skipped, &String::from_utf8_lossy(path), *bytes);
            }
        }
    }
    // A conflict left on a path the harvest leaves out (over the size limit,
    // LFS-tracked, a gitlink) would fail the tree ("not fully merged") and
    // with it every later harvest: that path goes back to HEAD's version
    // (the work tree keeps the agent's), the rest is committed.
    let conflicted = conflicted_paths(&index)?;
    if !conflicted.is_empty() {
        tracing::warn!(paths = ?lossy(&conflicted), "harvest: conflicted paths the harvest leaves out stay as HEAD has them; the rest of the work is committed");
        for path in &conflicted {
            index.conflict_remove(as_path(path))?;
        }
        back_to_head(repo, &mut index, parent.as_ref(), &conflicted)?;
    }
    // A gitlink the agent staged (`git add sub` on a nested repository, or
    // a submodule moved to another commit) would record a commit the
    // sandbox alone may have: back to HEAD's (PROTOCOL.md 4.5).
    let moved = moved_gitlinks(repo, &index, parent.as_ref())?;
    if !moved.is_empty() {
        tracing::warn!(paths = ?lossy(&moved), "harvest: gitlinks the agent staged are left as HEAD has them (PROTOCOL.md 4.5)");
        back_to_head(repo, &mut index, parent.as_ref(), &moved)?;
    }
    // An intent-to-add entry (`git add -N`) still in the index is a path
    // the harvest left out: libgit2 would write it into the tree as an
    // empty file where git writes nothing (found by a review). It goes; the
    // file stays in the work tree, named.
    let intents: Vec<Vec<u8>> = index
        .iter()
        .filter(|e| e.flags_extended & INTENT_TO_ADD != 0)
        .map(|e| e.path)
        .collect();
    for path in &intents {
        index.remove_path(as_path(path))?;
    }
    index.write()?;
    let tree = index.write_tree()?;
    Ok(Some(Staged { tree, parent }))
}

/// Whether `HEAD` is `oid` after the commit that was to move it there.
/// libgit2 (1.9) can return a commit's id with `HEAD` not moved: on a full
/// disk the ref's new value is not written and no error says so (found by
/// `suite::disk` once the turn file freed one page). The harvest would then
/// report the agent's work as pushed, with none of it on the remote.
///
/// Errors: `HEAD` is elsewhere; the message names the commit and says when
/// the disk holding `repo/` is full.
fn head_moved_to(repo: &Repository, oid: Oid) -> Result<(), git2::Error> {
    let head = repo.head()?.target();
    if head == Some(oid) {
        return Ok(());
    }
    let full = rustix::fs::statvfs(repo.path()).is_ok_and(|s| s.f_bavail == 0);
    Err(git2::Error::from_str(&format!(
        "the harvest's commit {oid} was made but HEAD did not move to it{}",
        if full {
            " (No space left on device: the disk holding repo/ is full)"
        } else {
            " (the branch's ref could not be written)"
        }
    )))
}

/// Why the harvest leaves `path` (of the work tree `workdir`) out whatever
/// its size (PROTOCOL.md 4.5): a directory holding its own `.git` (a
/// scaffolder's `git init`: libgit2 cannot add it, and its files are that
/// repository's), or a file whose attributes name a filter other than LFS
/// (`git-crypt`, transcrypt, nbstripout): libgit2 runs no external filter,
/// and would commit the plaintext.
fn left_out_reason(
    repo: &Repository,
    filters: &Filters,
    workdir: &Path,
    path: &Path,
) -> Option<SkipReason> {
    let full = workdir.join(path);
    let meta = std::fs::symlink_metadata(&full).ok()?;
    if meta.is_dir() {
        return std::fs::symlink_metadata(full.join(".git"))
            .is_ok()
            .then_some(SkipReason::NestedRepository);
    }
    // Any filter but LFS's, configured or not: where its clean command is
    // set (the repository's configuration, an `includeIf`, the agent's
    // global one: a review found each) is the agent's git's business, and
    // a wrong guess pushes plaintext. An agent that means the file
    // committed commits it with its own git, which runs the filter.
    match filters.of(repo, path) {
        Filter::Other(_) => Some(SkipReason::CleanFilter),
        Filter::None | Filter::Lfs => None,
    }
}

/// Puts `paths` of `index` back as `parent` (HEAD) has them, present or
/// absent (with no parent, an unborn HEAD, absent), each path taken
/// literally: by its bytes (a name need not be UTF-8), never as a pattern
/// (`git reset`'s pathspec would read a file named `*` as every path, and
/// undo the whole harvest's commit).
fn back_to_head<P: AsRef<[u8]>>(
    repo: &Repository,
    index: &mut git2::Index,
    parent: Option<&git2::Commit<'_>>,
    paths: &[P],
) -> Result<(), git2::Error> {
    let tree = parent.map(git2::Commit::tree).transpose()?;
    for path in paths {
        let path = path.as_ref();
        index.remove_path(as_path(path))?;
        // A directory of the index at that path (the agent staged a file
        // where HEAD has one, or the other way round) goes too.
        index.remove_dir(as_path(path), 0)?;
        let Some(entry) = tree.as_ref().and_then(|t| t.get_path(as_path(path)).ok()) else {
            continue;
        };
        if entry.kind() == Some(git2::ObjectType::Tree) {
            let sub = repo.find_tree(entry.id())?;
            let mut found = Vec::new();
            walk_tree(repo, &sub, |rest, e| {
                if e.kind() != Some(git2::ObjectType::Tree) {
                    let mut full = path.to_vec();
                    full.push(b'/');
                    full.extend_from_slice(rest);
                    found.push((full, e.id(), e.filemode_raw()));
                }
            })?;
            for (full, id, mode) in found {
                index.add(&entry_of(full, id, mode))?;
            }
        } else {
            index.add(&entry_of(path.to_vec(), entry.id(), entry.filemode_raw()))?;
        }
    }
    Ok(())
}

/// An index entry for `path` at `id` with the tree's `mode` and no stat
/// data (the next status reads the file again).
fn entry_of(path: Vec<u8>, id: git2::Oid, mode: i32) -> git2::IndexEntry {
    let time = git2::IndexTime::new(0, 0);
    git2::IndexEntry {
        ctime: time,
        mtime: time,
        dev: 0,
        ino: 0,
        // An old or odd mode of HEAD's (`100664`, any `git mktree` took) is
        // written as git's own: libgit2's index refuses the others (found
        // by a review).
        mode: u32::from(update_mode(mode)),
        uid: 0,
        gid: 0,
        file_size: 0,
        id,
        // The name's length, capped as the index format caps it.
        flags: u16::try_from(path.len().min(0xfff)).unwrap_or(0xfff),
        flags_extended: 0,
        path,
    }
}

/// Paths for a log line.
fn lossy(paths: &[Vec<u8>]) -> Vec<String> {
    paths
        .iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

/// The skip-worktree bit of an index entry's extended flags.
const SKIP_WORKTREE: u16 = 1 << 14;

/// The intent-to-add bit of an index entry's extended flags.
const INTENT_TO_ADD: u16 = 1 << 13;

/// Whether the index lacks a gitlink `HEAD` has (a submodule the agent
/// removed from the index).
fn removed_gitlink(repo: &Repository) -> Result<bool, git2::Error> {
    let tree = match repo.head() {
        Ok(head) => head.peel_to_tree()?,
        Err(e) if e.code() == ErrorCode::UnbornBranch => return Ok(false),
        Err(e) => return Err(e),
    };
    let index = repo.index()?;
    let mut removed = false;
    walk_tree(repo, &tree, |path, entry| {
        removed |= u32::try_from(entry.filemode_raw()) == Ok(GITLINK_MODE)
            && index.get_path(as_path(path), 0).is_none();
    })?;
    Ok(removed)
}

/// Removes the lock files a git command killed mid-way left under
/// `.git/refs` (`refs/heads/<branch>.lock` after a killed `git commit`):
/// the agent's processes are gone, and such a lock failed every later
/// harvest (found by a review). The walk follows no link and stops 16
/// levels down.
fn remove_ref_locks(repo: &Repository) {
    let mut stack = vec![(repo.path().join("refs"), 0usize)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let path = entry.path();
            if kind.is_dir() && depth < 16 {
                stack.push((path, depth + 1));
            } else if kind.is_file() && path.extension().is_some_and(|e| e == "lock") {
                tracing::warn!(path = %path.display(), "harvest: removing a ref lock a killed git command left");
                if let Err(e) = std::fs::remove_file(&path) {
                    tracing::warn!(path = %path.display(), error = %e, "harvest: cannot remove the ref lock");
                }
            }
        }
    }
}

/// The paths with conflict entries (stages 1–3) in `index`.
fn conflicted_paths(index: &git2::Index) -> Result<Vec<Vec<u8>>, git2::Error> {
    if !index.has_conflicts() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for conflict in index.conflicts()? {
        let conflict = conflict?;
        if let Some(entry) = conflict.our.or(conflict.their).or(conflict.ancestor) {
            out.push(entry.path);
        }
    }
    Ok(out)
}

/// The paths where `index` has a gitlink HEAD (`parent`'s tree) does not
/// have there: a submodule the agent added or moved in the index. Only a
/// gitlink that points somewhere new: removing a submodule (or making its
/// files plain ones) brings no sandbox-only commit, and undoing half of it
/// (`.gitmodules` goes, the gitlink stays) would break the branch (found by
/// a review).
fn moved_gitlinks(
    repo: &Repository,
    index: &git2::Index,
    parent: Option<&git2::Commit<'_>>,
) -> Result<Vec<Vec<u8>>, git2::Error> {
    let tree = parent.map(|p| p.tree()).transpose()?;
    let diff = repo.diff_tree_to_index(tree.as_ref(), Some(index), None)?;
    let mut out = Vec::new();
    for delta in diff.deltas() {
        if !matches!(
            delta.status(),
            git2::Delta::Added | git2::Delta::Modified | git2::Delta::Typechange
        ) {
            continue;
        }
        // The mode from the index entry itself: git2's `DiffFile::mode`
        // panics on a mode it does not know.
        let Some(path) = delta.new_file().path_bytes() else {
            continue;
        };
        if index
            .get_path(as_path(path), 0)
            .is_some_and(|e| e.mode == GITLINK_MODE)
        {
            out.push(path.to_vec());
        }
    }
    Ok(out)
}

/// The index mode of a gitlink.
const GITLINK_MODE: u32 = 0o160000;

/// What the harvest's commit never takes from the work tree (PROTOCOL.md
/// 4.5, "Submodules and LFS").
struct Kept {
    /// The index's gitlinks (submodules): never moved by the harvest, and
    /// nothing inside them committed.
    gitlinks: Vec<Vec<u8>>,
}

fn kept_paths(repo: &Repository) -> Result<Kept, git2::Error> {
    let index = repo.index()?;
    let gitlinks = index
        .iter()
        .filter(|e| e.mode == GITLINK_MODE)
        .map(|e| e.path)
        .collect();
    Ok(Kept { gitlinks })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::workspace::harvest::RECOVERED_AT_BOOT;

    fn job(name: &str, outcome: Option<RunOutcome>) -> HarvestJob {
        HarvestJob {
            name: name.to_string(),
            outcome,
            start: None,
            bound: Duration::from_secs(1),
        }
    }

    #[test]
    fn commit_messages_name_the_run_and_the_outcome() {
        let m = commit_message(&job("run-2", Some(RunOutcome::Succeeded)));
        assert!(
            m.starts_with("run-2: work the agent left uncommitted\n\n"),
            "{m}"
        );
        let m = commit_message(&job("run-3", Some(RunOutcome::Interrupted)));
        assert!(
            m.starts_with("WIP run-3: work in progress (turn interrupted)\n"),
            "{m}"
        );
        let m = commit_message(&job("run-4", Some(RunOutcome::Failed)));
        assert!(
            m.starts_with("WIP run-4: work in progress (turn failed)\n"),
            "{m}"
        );
        let m = commit_message(&job(RECOVERED_AT_BOOT, None));
        assert!(
            m.starts_with("WIP recovered-at-boot: work found in repo/"),
            "{m}"
        );
    }
}
