//! The harvest's size guard (`--harvest-max-file-size`, PROTOCOL.md 4.5):
//! the git host would refuse a push with a file over its limit, and every
//! later push with it. Files over the limit are left out of the harvest's
//! commit, and the agent's own commits that hold such files are replaced by
//! one commit without them (the originals kept on
//! `refs/hosted-boot/oversized/<name>`).

use std::collections::HashMap;

use git2::{Delta, ObjectType, Oid, Repository, Signature};

use super::brought::{as_path, brought_by, commits_to_push, update_mode, walk_tree};
use super::clone::{GIT_USER_EMAIL, GIT_USER_NAME};
use super::harvest::HarvestJob;
use super::recovery::keep_ref;
use super::remote::RemoteState;
use crate::wire::{HarvestResult, MAX_LISTED_COMMITS, SkipReason, SkippedFile};

/// Paths (bytes) whose blob in `index` is new against `tree` and over
/// `max` bytes.
pub(super) fn staged_over(
    repo: &Repository,
    index: &git2::Index,
    tree: &git2::Tree<'_>,
    max: u64,
) -> Result<Vec<(Vec<u8>, u64)>, git2::Error> {
    let odb = repo.odb()?;
    let diff = repo.diff_tree_to_index(Some(tree), Some(index), None)?;
    let mut out = Vec::new();
    for delta in diff.deltas() {
        if !matches!(
            delta.status(),
            Delta::Added | Delta::Modified | Delta::Typechange | Delta::Renamed | Delta::Copied
        ) {
            continue;
        }
        let file = delta.new_file();
        let Ok((bytes, ObjectType::Blob)) = odb.read_header(file.id()) else {
            continue;
        };
        if bytes as u64 > max
            && let Some(path) = file.path_bytes()
        {
            out.push((path.to_vec(), bytes as u64));
        }
    }
    Ok(out)
}

/// Records `path` (`bytes` long) as left out of the harvest, once.
pub(super) fn note_skipped(skipped: &mut Vec<SkippedFile>, path: &str, bytes: u64) {
    if !skipped.iter().any(|s| s.path == path) {
        tracing::warn!(
            path,
            bytes,
            "harvest: a file over the size limit is left out"
        );
        skipped.push(SkippedFile {
            path: path.to_string(),
            bytes,
            reason: None,
        });
    }
}

/// Records `path` as left out of the harvest for `reason`, once.
pub(super) fn note_left_out(
    skipped: &mut Vec<SkippedFile>,
    path: &str,
    bytes: u64,
    reason: SkipReason,
) {
    if !skipped.iter().any(|s| s.path == path) {
        tracing::warn!(path, bytes, reason = ?reason, "harvest: a path is left out (PROTOCOL.md 4.5)");
        skipped.push(SkippedFile {
            path: path.to_string(),
            bytes,
            reason: Some(reason),
        });
    }
}

/// A blob over the size limit that the commits to push bring.
pub(super) struct Oversized {
    /// Where a commit of the range added it.
    path: Vec<u8>,
    blob: Oid,
    bytes: u64,
}

/// The blobs over `max` bytes that the commits from `head` back to the
/// remote's branches (`heads`, those known here) bring, each once, whatever
/// the mode of their entry (a group-writable file, a symbolic link's blob,
/// any mode `git mktree` took: [`super::brought`]), except those the tree of
/// a remote branch's tip already holds: the host has them (its limit is
/// higher than the runner's), so they are no new object for it, and leaving
/// out a path that only moved such a file (a rename) would delete the file
/// from the branch.
pub(super) fn oversized_blobs(
    repo: &Repository,
    head: Oid,
    heads: &HashMap<String, Oid>,
    max: u64,
) -> Result<Vec<Oversized>, git2::Error> {
    let walk = commits_to_push(repo, head, heads)?;
    let odb = repo.odb()?;
    let mut found: Vec<Oversized> = Vec::new();
    for oid in walk {
        let commit = repo.find_commit(oid?)?;
        for entry in brought_by(repo, &commit)? {
            if !entry.is_blob() || found.iter().any(|f| f.blob == entry.id) {
                continue;
            }
            let Ok((bytes, ObjectType::Blob)) = odb.read_header(entry.id) else {
                continue;
            };
            let bytes = bytes as u64;
            if bytes > max {
                found.push(Oversized {
                    path: entry.path,
                    blob: entry.id,
                    bytes,
                });
            }
        }
    }
    if !found.is_empty() {
        let mut on_remote = std::collections::HashSet::new();
        for tip in heads.values() {
            let Ok(tree) = repo.find_commit(*tip).and_then(|c| c.tree()) else {
                continue;
            };
            walk_tree(repo, &tree, |_, entry| {
                if found.iter().any(|f| f.blob == entry.id()) {
                    on_remote.insert(entry.id());
                }
            })?;
        }
        found.retain(|f| !on_remote.contains(&f.blob));
    }
    Ok(found)
}

/// Replaces the agent's commits from `head` back to the remote with one
/// commit of `head`'s tree without the blobs in `found` (a path whose blob
/// is left out keeps the base's version, or is removed), on the remote's
/// session tip when `head` contains it, else on their merge base. `HEAD`
/// is not moved (a harvest moves it, [`super::harvest::move_head`]; a
/// checkpoint does not); the agent's commits stay on
/// `refs/hosted-boot/oversized/<name>`. Returns the new commit.
// long: one replacement commit: its tree and its message (what was left
// out, which commits it replaces), from the same walk.
pub(super) fn leave_out_oversized(
    repo: &Repository,
    head: Oid,
    remote: &RemoteState,
    found: &[Oversized],
    job: &HarvestJob,
    max: u64,
    r: &mut HarvestResult,
) -> Result<Oid, git2::Error> {
    let base = match remote.session_tip {
        Some(tip) if super::brought::contains(repo, head, tip) => Some(tip),
        Some(tip) => repo.merge_base(head, tip).ok(),
        None => None,
    };
    let head_commit = repo.find_commit(head)?;
    let head_tree = head_commit.tree()?;
    let base_commit = base.map(|b| repo.find_commit(b)).transpose()?;
    let base_tree = base_commit.as_ref().map(|c| c.tree()).transpose()?;

    // Every path of HEAD's tree that holds one of those blobs (by its
    // bytes: a name that is not UTF-8 was kept, found by a review).
    let mut paths: Vec<(Vec<u8>, u64)> = Vec::new();
    walk_tree(repo, &head_tree, |path, entry| {
        if entry.kind() != Some(ObjectType::Tree)
            && let Some(f) = found.iter().find(|f| f.blob == entry.id())
        {
            paths.push((path.to_vec(), f.bytes));
        }
    })?;
    let mut update = git2::build::TreeUpdateBuilder::new();
    for (path, _) in &paths {
        match base_tree
            .as_ref()
            .and_then(|t| t.get_path(as_path(path)).ok())
        {
            Some(entry) if entry.kind() == Some(ObjectType::Blob) => {
                update.upsert(path.clone(), entry.id(), update_mode(entry.filemode_raw()));
            }
            _ => {
                update.remove(path.clone());
            }
        }
    }
    let tree = repo.find_tree(update.create_updated(repo, &head_tree)?)?;

    let kept = keep_ref(repo, "refs/hosted-boot/oversized", &job.name, head)?;
    let mut listed: Vec<String> = paths
        .iter()
        .map(|(p, b)| format!("  {} ({b} bytes)", String::from_utf8_lossy(p)))
        .collect();
    // Blobs a later commit of the agent removed again: left out all the same.
    for f in found {
        if !paths.iter().any(|(p, _)| *p == f.path) {
            listed.push(format!(
                "  {} ({} bytes, removed again by the agent)",
                String::from_utf8_lossy(&f.path),
                f.bytes
            ));
        }
    }
    let mut subjects = Vec::new();
    let mut walk = repo.revwalk()?;
    walk.push(head)?;
    if let Some(b) = base {
        walk.hide(b)?;
    }
    for oid in walk.take(MAX_LISTED_COMMITS) {
        let c = repo.find_commit(oid?)?;
        subjects.push(format!(
            "  {:.12} {}",
            c.id(),
            c.summary().ok().flatten().unwrap_or("")
        ));
    }
    let text = format!(
        "{name}: the agent's commits without the files over the size limit\n\n\
         Committed by hosted-boot (the harvest, PROTOCOL.md 4.5): the git host would refuse\n\
         files over {max} bytes, and with them every later push. Left out (kept in the work tree\n\
         when still there):\n{files}\n\n\
         The agent's commits, kept in repo/ at {kept} ({head}):\n{subjects}\n",
        name = job.name,
        files = listed.join("\n"),
        subjects = subjects.join("\n"),
    );
    let sig = Signature::now(GIT_USER_NAME, GIT_USER_EMAIL)?;
    let parents: Vec<&git2::Commit> = base_commit.iter().collect();
    let new = repo.commit(None, &sig, &sig, &text, &tree, &parents)?;
    tracing::warn!(commit = %new, kept = %kept, "harvest: the agent's commits held files over the size limit; pushing them without those files");

    for f in found {
        let path = paths
            .iter()
            .find(|(p, _)| *p == f.path)
            .map_or(f.path.as_slice(), |(p, _)| p.as_slice());
        note_skipped(
            &mut r.skipped_files,
            &String::from_utf8_lossy(path),
            f.bytes,
        );
    }
    // The harvest's own commit, if any, is folded into the new one.
    r.harvest_commit = None;
    r.head_sha = Some(new.to_string());
    r.oversized_ref = Some(kept);
    Ok(new)
}
