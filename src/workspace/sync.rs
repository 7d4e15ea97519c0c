//! The workspace sync before a turn (PROTOCOL.md 4.1 step 3, 4.5 "Before a
//! turn"): fetch the session branch and move `repo/` to its tip, so that the
//! turn starts from what the user pushed meanwhile. Local work the remote
//! lacks is pushed first (never forced), held back when it holds a secret
//! ([`super::secret_guard`]); commits a force push dropped are kept on a
//! local ref, never pushed back.

use std::time::{Duration, Instant};

use git2::Oid;

use super::harvest::{Harvester, message};
use super::local_branch::{Saved, bring_local_to, save_local_branch};
use super::recovery::{keep_discarded, recovery_name};
use super::remote::{RemoteError, fetch, push};
use super::secret_guard::{PushGate, hold_back};
use crate::client::retry::Policy;
use crate::wire::{SyncOutcome, SyncWarning, SyncWarningCode, WorkspaceSync, truncate_reason};

impl Harvester {
    /// Brings `repo/` to the remote's session branch before the turn
    /// `run_id` (PROTOCOL.md 4.1 step 3, 4.5 "Before a turn") on the
    /// blocking pool; the network part is bounded by `bound` (each request's
    /// timeout cut to what is left of it) and nothing in `repo/` is changed
    /// once it ran out, so the agent never starts while this still works on
    /// `repo/`. Never fails: a problem is the report's `warning`, and the
    /// turn then starts from the local `HEAD`.
    pub async fn sync_before_turn(&self, run_id: &str, bound: Duration) -> WorkspaceSync {
        let this = self.clone();
        let run = run_id.to_string();
        let deadline = Instant::now() + bound;
        let report =
            match tokio::task::spawn_blocking(move || this.sync_blocking(&run, deadline)).await {
                Ok(report) => report,
                Err(e) => {
                    let mut report = empty_sync(&self.branch);
                    report.warning = Some(SyncWarning {
                        code: SyncWarningCode::RepoUnreadable,
                        message: format!("the workspace sync task failed: {e}"),
                    });
                    report
                }
            };
        log_sync(&report);
        report
    }

    /// [`Harvester::sync_before_turn`] on the calling thread: blocking,
    /// never from an async task.
    // 180 lines: the sync's steps in order (4.5 "Before a turn"), each of which
    // may end it with its own `kept_local` warning, over one `repo`, one fetch
    // and one report.
    pub fn sync_blocking(&self, run_id: &str, deadline: Instant) -> WorkspaceSync {
        let hold = self.lock_repo();
        let url = self.remote_url.as_str();
        let branch = self.branch.as_str();
        let mut s = empty_sync(branch);
        let warn = |mut s: WorkspaceSync, code, text: String| {
            s.outcome = SyncOutcome::KeptLocal;
            s.warning = Some(SyncWarning {
                code,
                message: truncate_reason(&text),
            });
            s
        };
        if let Some(why) = hold.refused() {
            return warn(s, SyncWarningCode::RepoUnreadable, why.to_string());
        }
        let repo = match super::repo_config::open(&self.repo_dir) {
            Ok(repo) => repo,
            Err(e) => {
                let text = format!("cannot open {}: {}", self.repo_dir.display(), message(&e));
                return warn(s, SyncWarningCode::RepoUnreadable, text);
            }
        };
        let head = match repo.head().and_then(|h| h.peel_to_commit()) {
            Ok(c) => c.id(),
            Err(e) => {
                let text = format!(
                    "cannot read the commit at HEAD in {} (none, or one libgit2 cannot parse): {}",
                    self.repo_dir.display(),
                    message(&e)
                );
                return warn(s, SyncWarningCode::RepoUnreadable, text);
            }
        };
        s.local_sha = Some(head.to_string());
        s.start_sha = Some(head.to_string());
        // The session branch's tip as the runner last saw it on the remote
        // (its clone, its last harvest), read before the fetch moves it.
        let known = repo
            .refname_to_id(&format!("refs/remotes/origin/{branch}"))
            .ok();

        let remote = match self.with_remote(
            deadline,
            "workspace sync fetch",
            Policy::WORKSPACE_SYNC,
            || fetch(&repo, url, branch),
        ) {
            Ok(remote) => remote,
            Err(e) => {
                let code = match e {
                    RemoteError::NoTime | RemoteError::OutOfTime { .. } => {
                        SyncWarningCode::SyncTimeout
                    }
                    _ => SyncWarningCode::FetchFailed,
                };
                let text = format!(
                    "{}; the turn starts from the local HEAD",
                    e.describe(&format!("the fetch of {branch} from {url}"))
                );
                return warn(s, code, text);
            }
        };
        let Some(tip) = remote.session_tip else {
            let text = format!(
                "the remote {url} has no branch {branch}; the turn starts from the local HEAD"
            );
            return warn(s, SyncWarningCode::BranchMissing, text);
        };
        s.remote_sha = Some(tip.to_string());

        let contains = |a: Oid, b: Oid| a == b || repo.graph_descendant_of(a, b).unwrap_or(false);
        let gate = PushGate::new(branch, &self.http.redactor);
        let mut head = head;
        let mut on_remote = remote.heads.values().any(|t| contains(*t, head));
        let known_pushed = known.is_some_and(|k| contains(k, head));
        if !on_remote && !known_pushed {
            // Local work about to be pushed that holds a secret: held back
            // as the harvest does, the files left in the work tree.
            let name = format!("before-{run_id}");
            let held = gate.scan(&repo, head, &remote.heads).and_then(|found| {
                if !found.any() {
                    return Ok(None);
                }
                let (new, kept) =
                    hold_back(&repo, head, Some(tip), &found, &name, gate.redactor())?;
                Ok(Some((new, kept, found.report(gate.redactor()))))
            });
            match held {
                Ok(None) => {}
                Ok(Some((new, kept, paths))) => {
                    head = new;
                    s.blocked_paths = paths;
                    s.blocked_ref = Some(kept);
                    on_remote = remote.heads.values().any(|t| contains(*t, head));
                }
                Err(e) => {
                    let text = format!(
                        "cannot look through the local work for secrets before pushing it: {}; the turn starts from the local HEAD",
                        message(&e)
                    );
                    return warn(s, SyncWarningCode::PushFailed, text);
                }
            }
        }
        let mut target = tip;
        let mut pushed = false;
        if !on_remote && !known_pushed {
            // Work that is on no remote branch (an earlier push failed): saved
            // before the workspace moves, never forced.
            if contains(head, tip) {
                let session_ref = format!("refs/heads/{branch}");
                if let Err(e) = self.with_remote(
                    deadline,
                    "workspace sync push",
                    Policy::WORKSPACE_SYNC,
                    || push(&repo, url, &session_ref, &gate, &remote.heads),
                ) {
                    let text = format!(
                        "{}; the turn starts from the local HEAD",
                        e.describe(&format!("the push of the local work to {branch}"))
                    );
                    return warn(s, SyncWarningCode::PushFailed, text);
                }
                target = head;
                pushed = true;
            } else {
                let name = format!("before-{run_id}");
                let Some(recovery) = recovery_name(&repo, branch, &name, &remote.heads, head)
                else {
                    let text = format!(
                        "no free recovery branch name for {branch}-recovered-{name}; the turn starts from the local HEAD"
                    );
                    return warn(s, SyncWarningCode::PushFailed, text);
                };
                let recovery_ref = format!("refs/heads/{recovery}");
                if remote.heads.get(&recovery_ref) != Some(&head)
                    && let Err(e) = self.with_remote(
                        deadline,
                        "workspace sync push",
                        Policy::WORKSPACE_SYNC,
                        || push(&repo, url, &recovery_ref, &gate, &remote.heads),
                    )
                {
                    let text = format!(
                        "{}; the turn starts from the local HEAD",
                        e.describe(&format!("the push of the local work to {recovery}"))
                    );
                    return warn(s, SyncWarningCode::PushFailed, text);
                }
                tracing::warn!(recovery_branch = %recovery, head = %head, "workspace sync: local work the remote lacked went to a recovery branch");
                s.recovery_branch = Some(recovery);
            }
        }

        // Commits the session branch no longer has (the user force-pushed):
        // the user's choice stands, they are not pushed back; repo/ keeps
        // them on a local ref.
        if let Some(known) = known
            && !contains(tip, known)
        {
            match keep_discarded(&repo, run_id, known, &remote.heads) {
                Ok(Some((name, commits, count))) => {
                    tracing::warn!(discarded_ref = %name, count, "workspace sync: the remote session branch dropped commits; kept locally, not pushed back");
                    s.discarded_ref = Some(name);
                    s.discarded_commits = commits;
                    s.discarded_count = Some(count);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %message(&e), "workspace sync: cannot keep the commits the remote dropped on a local ref");
                }
            }
        }

        // The local session branch may hold commits HEAD does not (the agent
        // committed on it, then moved HEAD away): pushed before it moves.
        let mut seen = vec![head];
        seen.extend(known);
        match self.with_remote(
            deadline,
            "workspace sync push",
            Policy::WORKSPACE_SYNC,
            || {
                save_local_branch(
                    &repo,
                    url,
                    branch,
                    &format!("before-{run_id}"),
                    &remote.heads,
                    &seen,
                    &gate,
                )
            },
        ) {
            Ok(Saved::Pushed(name)) => s.local_branch_recovery = Some(name),
            Ok(Saved::Blocked { paths, kept }) => {
                for path in paths {
                    if !s.blocked_paths.contains(&path) {
                        s.blocked_paths.push(path);
                    }
                }
                s.blocked_ref.get_or_insert(kept);
            }
            Ok(Saved::Nothing) => {}
            Err(e) => {
                let text = format!(
                    "{}; the turn starts from the local HEAD",
                    e.describe(&format!(
                        "the push of the local {branch}'s own commits to a recovery branch"
                    ))
                );
                return warn(s, SyncWarningCode::PushFailed, text);
            }
        }

        if Instant::now() >= deadline {
            let text = "the workspace sync's time bound ran out before the checkout; the turn starts from the local HEAD".to_string();
            return warn(s, SyncWarningCode::SyncTimeout, text);
        }
        if let Err(e) = bring_local_to(&repo, branch, target) {
            let text = format!(
                "cannot check out {target} (the remote's {branch}): {}; the turn starts from the local HEAD",
                message(&e)
            );
            return warn(s, SyncWarningCode::CheckoutFailed, text);
        }
        s.start_sha = Some(target.to_string());
        s.outcome = if pushed {
            SyncOutcome::Pushed
        } else if s.recovery_branch.is_some() || s.discarded_ref.is_some() {
            SyncOutcome::Reset
        } else if head == tip {
            SyncOutcome::UpToDate
        } else {
            SyncOutcome::FastForward
        };
        s
    }
}

fn empty_sync(branch: &str) -> WorkspaceSync {
    WorkspaceSync {
        branch: branch.to_string(),
        ..WorkspaceSync::default()
    }
}

fn log_sync(s: &WorkspaceSync) {
    match &s.warning {
        None => tracing::info!(
            outcome = %crate::wire::wire_name(&s.outcome),
            local = s.local_sha.as_deref().unwrap_or(""),
            start = s.start_sha.as_deref().unwrap_or(""),
            recovery_branch = s.recovery_branch.as_deref().unwrap_or(""),
            discarded_ref = s.discarded_ref.as_deref().unwrap_or(""),
            "workspace synced to the remote's session branch"
        ),
        Some(w) => tracing::warn!(
            code = %crate::wire::wire_name(&w.code),
            error = %w.message,
            start = s.start_sha.as_deref().unwrap_or(""),
            "workspace sync: the turn starts from the local HEAD"
        ),
    }
}
