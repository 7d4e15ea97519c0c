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
use super::remote::{Failure, RemoteState, fetch, push};
use super::secret_guard::{PushGate, hold_back};
use super::size_limit::{leave_out_oversized, oversized_blobs};
use crate::wire::HarvestResult;

impl Harvester {
    /// One attempt: fetch the session branch, push `head` where it may go,
    /// then bring the local session branch to the remote's (its own commits
    /// pushed first when no remote branch, `head`, nor `known`, the tip last
    /// seen on the remote, holds them). Retried whole: its steps ([`Attempt`])
    /// share the fetched remote state.
    pub(super) fn push_once(
        &self,
        repo: &Repository,
        head_at: &mut Oid,
        known: Option<Oid>,
        job: &HarvestJob,
        r: &mut HarvestResult,
        gate: &PushGate<'_>,
    ) -> Result<(), Failure> {
        let remote = fetch(repo, &self.remote_url, &self.branch)?;
        let attempt = Attempt {
            harvester: self,
            repo,
            remote,
            known,
            job,
            gate,
            checkpoint: false,
        };
        attempt.guard_size(head_at, r)?;
        attempt.hold_back_secrets(head_at, r)?;
        let head = *head_at;
        // Gitlinks the agent committed to commits others cannot fetch:
        // named, pushed as committed (PROTOCOL.md 4.5).
        r.unpublished_gitlinks =
            unpublished(repo, head, &attempt.remote.heads).unwrap_or_else(|e| {
                tracing::warn!(error = %message(&e), "harvest: cannot look through the gitlinks of the commits to push");
                Vec::new()
            });
        attempt.count_changes(head, r);
        let on_session = attempt.push_head(head, r)?;
        // The session branch's tip on the remote now.
        let remote_tip = if on_session {
            Some(head)
        } else {
            attempt.remote.session_tip
        };
        if let Some(remote_tip) = remote_tip {
            attempt.save_and_move_local_branch(head, remote_tip, r);
        }
        Ok(())
    }
}

impl Harvester {
    /// One attempt of a checkpoint's push ([`super::checkpoint`]): fetch
    /// the session branch, the same size limit and secret guard as the
    /// harvest's, then `head` to `<branch>-recovered-checkpoint-<runId>`
    /// (`-2`, … when that name holds other work), never forced, and nothing
    /// else: no local branch moves. Nothing is pushed when a branch of the
    /// remote holds `head` already. `previous` is the commit the run's last
    /// checkpoint pushed: when the checkpoint branch is still there and the
    /// commit to push does not hold it (a commit that replaced the agent's
    /// sits on the session branch's tip), a commit of the same tree on both
    /// keeps the branch a fast-forward.
    pub(super) fn push_checkpoint_once(
        &self,
        repo: &Repository,
        head_at: &mut Oid,
        previous: Option<Oid>,
        job: &HarvestJob,
        r: &mut HarvestResult,
        gate: &PushGate<'_>,
    ) -> Result<(), Failure> {
        let remote = fetch(repo, &self.remote_url, &self.branch)?;
        let attempt = Attempt {
            harvester: self,
            repo,
            remote,
            known: None,
            job,
            gate,
            checkpoint: true,
        };
        attempt.guard_size(head_at, r)?;
        attempt.hold_back_secrets(head_at, r)?;
        let branch = self.branch.as_str();
        let heads = &attempt.remote.heads;
        let own = format!("refs/heads/{branch}-recovered-{}", job.name);
        if let Some(previous) = previous
            && heads.get(&own) == Some(&previous)
            && !attempt.contains(*head_at, previous)
        {
            *head_at = on_previous(repo, *head_at, previous, &job.name)
                .map_err(|e| Failure::Local(message(&e)))?;
        }
        let head = *head_at;
        r.head_sha = Some(head.to_string());
        attempt.count_changes(head, r);
        if heads.values().any(|tip| attempt.contains(*tip, head)) {
            return Ok(());
        }
        let name = recovery_name(repo, branch, &job.name, heads, head).ok_or_else(|| {
            Failure::Verdict(format!(
                "no free branch name for {branch}-recovered-{}",
                job.name
            ))
        })?;
        let target = format!("refs/heads/{name}");
        super::remote::push_ref(
            repo,
            &self.remote_url,
            &head.to_string(),
            &target,
            gate,
            heads,
        )?;
        r.recovery_branch = Some(name);
        Ok(())
    }
}

/// `head`'s tree on `head` and `previous` (the run's last checkpoint, on
/// the remote): the checkpoint branch fast-forwards to it; `previous`
/// itself when it has that tree already.
fn on_previous(
    repo: &Repository,
    head: Oid,
    previous: Oid,
    name: &str,
) -> Result<Oid, git2::Error> {
    let head = repo.find_commit(head)?;
    let previous = repo.find_commit(previous)?;
    if previous.tree_id() == head.tree_id() {
        return Ok(previous.id());
    }
    let sig = git2::Signature::now(super::clone::GIT_USER_NAME, super::clone::GIT_USER_EMAIL)?;
    let text = format!(
        "WIP {name}: the work in progress at a checkpoint\n\nCommitted by hosted-boot at a checkpoint notice, on the run's previous checkpoint so that its branch fast-forwards (PROTOCOL.md 4.5, \"Checkpoint\").\n"
    );
    repo.commit(None, &sig, &sig, &text, &head.tree()?, &[&head, &previous])
}

/// One push attempt's steps after the fetch.
struct Attempt<'a> {
    harvester: &'a Harvester,
    repo: &'a Repository,
    remote: RemoteState,
    /// The session branch's tip as last seen on the remote.
    known: Option<Oid>,
    job: &'a HarvestJob,
    gate: &'a PushGate<'a>,
    /// A checkpoint's attempt: `HEAD` is never moved.
    checkpoint: bool,
}

impl Attempt<'_> {
    fn contains(&self, a: Oid, b: Oid) -> bool {
        super::brought::contains(self.repo, a, b)
    }

    /// A harvest's `HEAD` goes to the commit that replaced the agent's
    /// (the work tree keeps what it left out); a checkpoint's stays where
    /// the agent has it.
    fn move_head(&self, to: Oid) -> Result<(), Failure> {
        if self.checkpoint {
            return Ok(());
        }
        super::harvest::move_head(self.repo, to).map_err(|e| Failure::Local(message(&e)))
    }

    /// Files over the size limit in the agent's own commits: the git host
    /// would refuse the whole push, this one and every later one.
    fn guard_size(&self, head_at: &mut Oid, r: &mut HarvestResult) -> Result<(), Failure> {
        let Some(max) = self.harvester.max_file_size else {
            return Ok(());
        };
        let found = oversized_blobs(self.repo, *head_at, &self.remote.heads, max)
            .map_err(|e| Failure::Local(message(&e)))?;
        if !found.is_empty() {
            *head_at =
                leave_out_oversized(self.repo, *head_at, &self.remote, &found, self.job, max, r)
                    .map_err(|e| Failure::Local(message(&e)))?;
            self.move_head(*head_at)?;
        }
        Ok(())
    }

    /// A secret in what the agent committed (anywhere in the range, a file
    /// deleted again included): the agent's commits are held back, the rest
    /// of the work goes (PROTOCOL.md 4.5).
    fn hold_back_secrets(&self, head_at: &mut Oid, r: &mut HarvestResult) -> Result<(), Failure> {
        let gate = self.gate;
        let found = gate
            .scan(self.repo, *head_at, &self.remote.heads)
            .map_err(|e| Failure::Local(message(&e)))?;
        if !found.any() {
            return Ok(());
        }
        let (new, kept) = hold_back(
            self.repo,
            *head_at,
            self.remote.session_tip,
            &found,
            &self.job.name,
            gate.redactor(),
        )
        .map_err(|e| Failure::Local(message(&e)))?;
        *head_at = new;
        self.move_head(new)?;
        for path in found.report(gate.redactor()) {
            if !r.blocked_paths.contains(&path) {
                r.blocked_paths.push(path);
            }
        }
        r.blocked_ref = Some(kept);
        // The harvest's own commit, if any, is folded into the new head.
        r.harvest_commit = None;
        r.head_sha = Some(new.to_string());
        Ok(())
    }

    /// The turn's commits and diff statistics, from where it started (or
    /// the remote's tip) to `head`; a failure is logged, not fatal.
    fn count_changes(&self, head: Oid, r: &mut HarvestResult) {
        let base = self
            .job
            .start
            .as_deref()
            .and_then(|s| Oid::from_str(s).ok())
            .filter(|oid| self.repo.find_commit(*oid).is_ok())
            .or(self.remote.session_tip)
            .unwrap_or(head);
        match statistics(self.repo, base, head) {
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
    }

    /// `head` to the session branch when that fast-forwards it, else to a
    /// recovery branch (at boot, commits a force push dropped are kept
    /// locally instead); whether it is on the session branch now.
    fn push_head(&self, head: Oid, r: &mut HarvestResult) -> Result<bool, Failure> {
        let url = self.harvester.remote_url.as_str();
        let branch = self.harvester.branch.as_str();
        let heads = &self.remote.heads;
        let tip = self.remote.session_tip;
        let mut on_session = false;
        match tip {
            // Everything in HEAD is on the remote already.
            Some(tip) if self.contains(tip, head) => {}
            Some(tip) if self.contains(head, tip) => {
                match push(
                    self.repo,
                    url,
                    &format!("refs/heads/{branch}"),
                    self.gate,
                    heads,
                ) {
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
        let is_recovery = !on_session && !tip.is_some_and(|t| self.contains(t, head));
        if is_recovery && !self.keep_dropped_at_boot(head, r) {
            let name =
                recovery_name(self.repo, branch, &self.job.name, heads, head).ok_or_else(|| {
                    Failure::Verdict(format!(
                        "no free recovery branch name for {branch}-recovered-{}",
                        recovery_suffix(&self.job.name)
                    ))
                })?;
            let recovery_ref = format!("refs/heads/{name}");
            if heads.get(&recovery_ref) != Some(&head) {
                push(self.repo, url, &recovery_ref, self.gate, heads)?;
            }
            tracing::warn!(recovery_branch = %name, head = %head, "harvest: the session branch moved on; the work went to a recovery branch");
            r.recovery_branch = Some(name);
        }
        Ok(on_session)
    }

    /// At boot, a `head` wholly on the session branch as last seen, which
    /// the remote no longer has: a force push while the runner was down
    /// dropped it, the user's choice (as in the sync before a turn); kept on
    /// a local ref, not pushed back. Whether it was kept (if not, it goes
    /// to a recovery branch).
    fn keep_dropped_at_boot(&self, head: Oid, r: &mut HarvestResult) -> bool {
        let Some(known) = self.known else {
            return false;
        };
        if self.job.name != RECOVERED_AT_BOOT
            || self.remote.session_tip.is_none()
            || !self.contains(known, head)
        {
            return false;
        }
        match keep_discarded(self.repo, &self.job.name, known, &self.remote.heads) {
            Ok(Some((name, _, count))) => {
                tracing::warn!(discarded_ref = %name, count, "harvest at boot: the remote session branch dropped commits; kept locally, not pushed back");
                r.discarded_ref = Some(name);
                true
            }
            Ok(None) => true,
            Err(e) => {
                // Not kept locally: pushed to a recovery branch instead.
                tracing::warn!(error = %message(&e), "harvest at boot: cannot keep the commits the remote dropped on a local ref");
                false
            }
        }
    }

    /// The local session branch may hold commits `head` does not (the agent
    /// committed on it, then moved `HEAD` away): pushed before it moves to
    /// `remote_tip`. A failure is logged: the next harvest tries again.
    fn save_and_move_local_branch(&self, head: Oid, remote_tip: Oid, r: &mut HarvestResult) {
        let branch = self.harvester.branch.as_str();
        let mut seen = vec![head];
        seen.extend(self.known);
        let saving = save_local_branch(
            self.repo,
            &self.harvester.remote_url,
            branch,
            &self.job.name,
            &self.remote.heads,
            &seen,
            self.gate,
        );
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
                return;
            }
        }
        if let Err(e) = bring_local_to(self.repo, branch, remote_tip) {
            // The work is on the remote; the next harvest tries again.
            tracing::warn!(error = %message(&e), "harvest: cannot bring the local session branch to the remote's");
        }
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
