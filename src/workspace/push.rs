//! One attempt of the harvest's push (PROTOCOL.md 4.5 steps 2 and 3): fetch
//! the session branch, leave files over the size limit out of the agent's
//! commits, hold back the agent's commits when they hold a secret
//! ([`super::secret_guard`]), count the turn's changes, push `HEAD` to the session branch when
//! that is a fast-forward or else to a recovery branch (at boot, commits a
//! force push dropped are kept locally instead), then bring the local
//! session branch to the remote's.

use git2::{Oid, Repository};

use super::gitlinks::unpublished;
use super::harvest::{HarvestJob, Harvester, RECOVERED_AT_BOOT, message};
use super::local_branch::{Saved, bring_local_to, save_local_branch};
use super::recovery::{keep_discarded, recovery_name, recovery_suffix};
use super::remote::{Failure, fetch, push};
use super::secret_guard::{PushGate, hold_back};
use super::size_limit::{leave_out_oversized, oversized_blobs};
use crate::wire::HarvestResult;

impl Harvester {
    /// One attempt: fetch the session branch, push `head` where it may go,
    /// then bring the local session branch to the remote's (its own commits
    /// pushed first when no remote branch, `head`, nor `known`, the tip last
    /// seen on the remote, holds them).
    // 130 lines: one attempt is retried whole (fetch, size guard, push, local
    // branch), and its parts share the fetched remote state, `head` and the
    // report; split, each would take them all.
    pub(super) fn push_once(
        &self,
        repo: &Repository,
        head_at: &mut Oid,
        known: Option<Oid>,
        job: &HarvestJob,
        r: &mut HarvestResult,
        gate: &PushGate<'_>,
    ) -> Result<(), Failure> {
        let url = self.remote_url.as_str();
        let branch = self.branch.as_str();
        let remote = fetch(repo, url, branch)?;

        // Files over the size limit in the agent's own commits: the git host
        // would refuse the whole push, this one and every later one.
        if let Some(max) = self.max_file_size {
            let found = oversized_blobs(repo, *head_at, &remote.heads, max)
                .map_err(|e| Failure::Local(message(&e)))?;
            if !found.is_empty() {
                *head_at = leave_out_oversized(repo, *head_at, &remote, &found, job, max, r)
                    .map_err(|e| Failure::Local(message(&e)))?;
            }
        }
        // A secret in what the agent committed (anywhere in the range, a
        // file deleted again included): the agent's commits are held back,
        // the rest of the work goes (PROTOCOL.md 4.5).
        let found = gate
            .scan(repo, *head_at, &remote.heads)
            .map_err(|e| Failure::Local(message(&e)))?;
        if found.any() {
            let (new, kept) = hold_back(
                repo,
                *head_at,
                remote.session_tip,
                &found,
                &job.name,
                gate.redactor(),
            )
            .map_err(|e| Failure::Local(message(&e)))?;
            *head_at = new;
            for path in found.report(gate.redactor()) {
                if !r.blocked_paths.contains(&path) {
                    r.blocked_paths.push(path);
                }
            }
            r.blocked_ref = Some(kept);
            // The harvest's own commit, if any, is folded into the new head.
            r.harvest_commit = None;
            r.head_sha = Some(new.to_string());
        }
        let head = *head_at;
        // Gitlinks the agent committed to commits others cannot fetch:
        // named, pushed as committed (PROTOCOL.md 4.5).
        r.unpublished_gitlinks = unpublished(repo, head, &remote.heads).unwrap_or_else(|e| {
            tracing::warn!(error = %message(&e), "harvest: cannot look through the gitlinks of the commits to push");
            Vec::new()
        });

        let base = job
            .start
            .as_deref()
            .and_then(|s| Oid::from_str(s).ok())
            .filter(|oid| repo.find_commit(*oid).is_ok())
            .or(remote.session_tip)
            .unwrap_or(head);
        match statistics(repo, base, head) {
            Ok((commits, files, insertions, deletions)) => {
                r.commits = commits;
                r.files_changed = files;
                r.insertions = insertions;
                r.deletions = deletions;
            }
            Err(e) => {
                tracing::warn!(error = %message(&e), "harvest: cannot count the turn's changes")
            }
        }

        let contains = |a: Oid, b: Oid| a == b || repo.graph_descendant_of(a, b).unwrap_or(false);
        let tip = remote.session_tip;
        let session_ref = format!("refs/heads/{branch}");
        let mut on_session = false;
        match tip {
            // Everything in HEAD is on the remote already.
            Some(tip) if contains(tip, head) => {}
            Some(tip) if contains(head, tip) => {
                match push(repo, url, &session_ref, gate, &remote.heads) {
                    Ok(()) => on_session = true,
                    Err(Failure::RefRejected(text)) => {
                        tracing::warn!(error = %text, "harvest: the session branch refused the push; using a recovery branch");
                    }
                    Err(other) => return Err(other),
                }
            }
            // The remote moved on (or lost the session branch): recovery.
            _ => {}
        }
        let is_recovery = !on_session && !tip.is_some_and(|t| contains(t, head));
        // At boot, a HEAD wholly on the session branch as last seen, which
        // the remote no longer has: a force push while the runner was down
        // dropped it, the user's choice (as in the sync before a turn); kept
        // on a local ref, not pushed back.
        let mut discarded = is_recovery
            && job.name == RECOVERED_AT_BOOT
            && tip.is_some()
            && known.is_some_and(|k| contains(k, head));
        if discarded && let Some(known) = known {
            match keep_discarded(repo, &job.name, known, &remote.heads) {
                Ok(Some((name, _, count))) => {
                    tracing::warn!(discarded_ref = %name, count, "harvest at boot: the remote session branch dropped commits; kept locally, not pushed back");
                    r.discarded_ref = Some(name);
                }
                Ok(None) => {}
                Err(e) => {
                    // Not kept locally: pushed to a recovery branch instead.
                    tracing::warn!(error = %message(&e), "harvest at boot: cannot keep the commits the remote dropped on a local ref");
                    discarded = false;
                }
            }
        }
        if is_recovery && !discarded {
            let name =
                recovery_name(repo, branch, &job.name, &remote.heads, head).ok_or_else(|| {
                    Failure::Verdict(format!(
                        "no free recovery branch name for {branch}-recovered-{}",
                        recovery_suffix(&job.name)
                    ))
                })?;
            let there = remote.heads.get(&format!("refs/heads/{name}"));
            if there != Some(&head) {
                push(
                    repo,
                    url,
                    &format!("refs/heads/{name}"),
                    gate,
                    &remote.heads,
                )?;
            }
            tracing::warn!(recovery_branch = %name, head = %head, "harvest: the session branch moved on; the work went to a recovery branch");
            r.recovery_branch = Some(name);
        }

        // The session branch's tip on the remote now.
        let remote_tip = if on_session { Some(head) } else { tip };
        let Some(remote_tip) = remote_tip else {
            return Ok(());
        };
        // The local session branch may hold commits HEAD does not (the agent
        // committed on it, then moved HEAD away): pushed before it moves.
        let mut seen = vec![head];
        seen.extend(known);
        let saving = save_local_branch(repo, url, branch, &job.name, &remote.heads, &seen, gate);
        match saving {
            Ok(Saved::Pushed(name)) => r.local_branch_recovery = Some(name),
            Ok(Saved::Blocked { paths, kept }) => {
                for path in paths {
                    if !r.blocked_paths.contains(&path) {
                        r.blocked_paths.push(path);
                    }
                }
                r.blocked_ref.get_or_insert(kept);
            }
            Ok(Saved::Nothing) => {}
            Err(
                Failure::Transport(text)
                | Failure::RefRejected(text)
                | Failure::Verdict(text)
                | Failure::Local(text)
                | Failure::Blocked(text),
            ) => {
                // HEAD is on the remote; the branch stays where it is (its
                // commits kept on it) and the next harvest tries again.
                tracing::warn!(error = %text, "harvest: cannot push the local session branch's own commits; it is not moved");
                return Ok(());
            }
        }
        if let Err(e) = bring_local_to(repo, branch, remote_tip) {
            // The work is on the remote; the next harvest tries again.
            tracing::warn!(error = %message(&e), "harvest: cannot bring the local session branch to the remote's");
        }
        Ok(())
    }
}

/// `commits` from `base` to `head`, and the diff statistics from their
/// merge base to `head`.
fn statistics(
    repo: &Repository,
    base: Oid,
    head: Oid,
) -> Result<(u64, u64, u64, u64), git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(head)?;
    walk.hide(base)?;
    let commits = walk.filter(Result::is_ok).count() as u64;
    let from = repo.merge_base(base, head).unwrap_or(base);
    let from_tree = repo.find_commit(from)?.tree()?;
    let head_tree = repo.find_commit(head)?.tree()?;
    let stats = repo
        .diff_tree_to_tree(Some(&from_tree), Some(&head_tree), None)?
        .stats()?;
    Ok((
        commits,
        stats.files_changed() as u64,
        stats.insertions() as u64,
        stats.deletions() as u64,
    ))
}
