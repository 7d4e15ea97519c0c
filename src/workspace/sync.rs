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
use super::remote::{RemoteError, RemoteState, fetch, push};
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
        let report = match crate::concurrency::spawn_blocking_in_span(move || {
            this.sync_blocking(&run, deadline)
        })
        .await
        {
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
    /// never from an async task. The steps of 4.5 "Before a turn" in order
    /// ([`Sync`]); the first that cannot go on ends the sync with its
    /// warning (`kept_local`: the turn starts from the local `HEAD`), what
    /// the earlier ones found kept in the report.
    pub fn sync_blocking(&self, run_id: &str, deadline: Instant) -> WorkspaceSync {
        let hold = self.lock_repo();
        let mut s = empty_sync(&self.branch);
        let synced = match hold.refused() {
            Some(why) => Err((SyncWarningCode::RepoUnreadable, why.to_string())),
            None => self.sync_steps(&mut s, run_id, deadline),
        };
        if let Err((code, text)) = synced {
            s.outcome = SyncOutcome::KeptLocal;
            s.warning = Some(SyncWarning {
                code,
                message: truncate_reason(&text),
            });
        }
        s
    }

    fn sync_steps(
        &self,
        s: &mut WorkspaceSync,
        run_id: &str,
        deadline: Instant,
    ) -> Result<(), Warned> {
        let branch = self.branch.as_str();
        let (repo, head) = self.open_at_head()?;
        s.local_sha = Some(head.to_string());
        s.start_sha = Some(head.to_string());
        // The session branch's tip as the runner last saw it on the remote
        // (its clone, its last harvest), read before the fetch moves it.
        let known = repo
            .refname_to_id(&format!("refs/remotes/origin/{branch}"))
            .ok();
        let remote = self
            .with_remote(
                deadline,
                "workspace sync fetch",
                Policy::WORKSPACE_SYNC,
                || fetch(&repo, &self.remote_url, branch),
            )
            .map_err(|e| {
                let code = match e {
                    RemoteError::NoTime | RemoteError::OutOfTime { .. } => {
                        SyncWarningCode::SyncTimeout
                    }
                    _ => SyncWarningCode::FetchFailed,
                };
                let what = format!("the fetch of {branch} from {}", self.remote_url);
                (code, from_local_head(e.describe(&what)))
            })?;
        let Some(tip) = remote.session_tip else {
            return Err((
                SyncWarningCode::BranchMissing,
                from_local_head(format!(
                    "the remote {} has no branch {branch}",
                    self.remote_url
                )),
            ));
        };
        s.remote_sha = Some(tip.to_string());
        let sync = Sync {
            harvester: self,
            gate: PushGate::new(branch, &self.http.redactor),
            repo,
            remote,
            tip,
            run_id,
            deadline,
        };
        let mut head = head;
        let known_pushed = known.is_some_and(|k| sync.contains(k, head));
        let (target, pushed) = if sync.on_remote(head) || known_pushed {
            (tip, false)
        } else {
            if let Some(new) = sync.hold_back_secrets(s, head)? {
                head = new;
            }
            if sync.on_remote(head) {
                (tip, false)
            } else {
                sync.save_unpushed(s, head)?
            }
        };
        if let Some(known) = known {
            sync.keep_dropped(s, known);
        }
        sync.save_local_branch_commits(s, head, known)?;
        if Instant::now() >= deadline {
            return Err((
                SyncWarningCode::SyncTimeout,
                from_local_head(
                    "the workspace sync's time bound ran out before the checkout".to_string(),
                ),
            ));
        }
        bring_local_to(&sync.repo, branch, target).map_err(|e| {
            (
                SyncWarningCode::CheckoutFailed,
                from_local_head(format!(
                    "cannot check out {target} (the remote's {branch}): {}",
                    message(&e)
                )),
            )
        })?;
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
        Ok(())
    }

    /// `repo/` and the commit at its `HEAD`.
    fn open_at_head(&self) -> Result<(git2::Repository, Oid), Warned> {
        let repo = super::repo_config::open(&self.repo_dir).map_err(|e| {
            (
                SyncWarningCode::RepoUnreadable,
                format!("cannot open {}: {}", self.repo_dir.display(), message(&e)),
            )
        })?;
        let head = match repo.head().and_then(|h| h.peel_to_commit()) {
            Ok(c) => c.id(),
            Err(e) => {
                return Err((
                    SyncWarningCode::RepoUnreadable,
                    format!(
                        "cannot read the commit at HEAD in {} (none, or one libgit2 cannot parse): {}",
                        self.repo_dir.display(),
                        message(&e)
                    ),
                ));
            }
        };
        Ok((repo, head))
    }
}

/// Why a step ended the sync: the warning's code and text.
type Warned = (SyncWarningCode, String);

/// `what`, and that the turn starts from the local `HEAD` (every warning
/// that ends the sync after `repo/` was opened says so).
fn from_local_head(what: String) -> String {
    format!("{what}; the turn starts from the local HEAD")
}

/// One sync's steps after the fetch: the repository, the remote as fetched
/// and the gate every push passes.
struct Sync<'a> {
    harvester: &'a Harvester,
    gate: PushGate<'a>,
    repo: git2::Repository,
    remote: RemoteState,
    /// The remote session branch's tip.
    tip: Oid,
    run_id: &'a str,
    deadline: Instant,
}

impl Sync<'_> {
    fn contains(&self, a: Oid, b: Oid) -> bool {
        super::brought::contains(&self.repo, a, b)
    }

    /// Whether a remote branch holds `commit`.
    fn on_remote(&self, commit: Oid) -> bool {
        self.remote
            .heads
            .values()
            .any(|t| self.contains(*t, commit))
    }

    /// A push, bounded by the sync's deadline.
    fn push(&self, refname: &str) -> Result<(), RemoteError> {
        self.harvester.with_remote(
            self.deadline,
            "workspace sync push",
            Policy::WORKSPACE_SYNC,
            || {
                push(
                    &self.repo,
                    &self.harvester.remote_url,
                    refname,
                    &self.gate,
                    &self.remote.heads,
                )
            },
        )
    }

    /// Local work about to be pushed that holds a secret: held back as the
    /// harvest does, the files left in the work tree; the new `HEAD`.
    fn hold_back_secrets(&self, s: &mut WorkspaceSync, head: Oid) -> Result<Option<Oid>, Warned> {
        let name = format!("before-{}", self.run_id);
        let held = self
            .gate
            .scan(&self.repo, head, &self.remote.heads)
            .and_then(|found| {
                if !found.any() {
                    return Ok(None);
                }
                let (new, kept) = hold_back(
                    &self.repo,
                    head,
                    Some(self.tip),
                    &found,
                    &name,
                    self.gate.redactor(),
                )?;
                super::harvest::move_head(&self.repo, new)?;
                Ok(Some((new, kept, found.report(self.gate.redactor()))))
            })
            .map_err(|e| {
                (
                    SyncWarningCode::PushFailed,
                    from_local_head(format!(
                        "cannot look through the local work for secrets before pushing it: {}",
                        message(&e)
                    )),
                )
            })?;
        Ok(held.map(|(new, kept, paths)| {
            s.blocked_paths = paths;
            s.blocked_ref = Some(kept);
            new
        }))
    }

    /// Work that is on no remote branch (an earlier push failed): saved
    /// before the workspace moves, never forced: pushed to the session
    /// branch when it fast-forwards it (the target is then `head`), else to
    /// a recovery branch. The target and whether it was pushed.
    fn save_unpushed(&self, s: &mut WorkspaceSync, head: Oid) -> Result<(Oid, bool), Warned> {
        let branch = self.harvester.branch.as_str();
        if self.contains(head, self.tip) {
            self.push(&format!("refs/heads/{branch}")).map_err(|e| {
                let what = format!("the push of the local work to {branch}");
                (
                    SyncWarningCode::PushFailed,
                    from_local_head(e.describe(&what)),
                )
            })?;
            return Ok((head, true));
        }
        let name = format!("before-{}", self.run_id);
        let Some(recovery) = recovery_name(&self.repo, branch, &name, &self.remote.heads, head)
        else {
            return Err((
                SyncWarningCode::PushFailed,
                from_local_head(format!(
                    "no free recovery branch name for {branch}-recovered-{name}"
                )),
            ));
        };
        let recovery_ref = format!("refs/heads/{recovery}");
        if self.remote.heads.get(&recovery_ref) != Some(&head) {
            self.push(&recovery_ref).map_err(|e| {
                let what = format!("the push of the local work to {recovery}");
                (
                    SyncWarningCode::PushFailed,
                    from_local_head(e.describe(&what)),
                )
            })?;
        }
        tracing::warn!(recovery_branch = %recovery, head = %head, "workspace sync: local work the remote lacked went to a recovery branch");
        s.recovery_branch = Some(recovery);
        Ok((self.tip, false))
    }

    /// Commits the session branch no longer has (the user force-pushed):
    /// the user's choice stands, they are not pushed back; `repo/` keeps
    /// them on a local ref. Never ends the sync.
    fn keep_dropped(&self, s: &mut WorkspaceSync, known: Oid) {
        if self.contains(self.tip, known) {
            return;
        }
        match keep_discarded(&self.repo, self.run_id, known, &self.remote.heads) {
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

    /// The local session branch may hold commits `HEAD` does not (the agent
    /// committed on it, then moved `HEAD` away): pushed to a recovery
    /// branch before it moves, or held back when they hold a secret.
    fn save_local_branch_commits(
        &self,
        s: &mut WorkspaceSync,
        head: Oid,
        known: Option<Oid>,
    ) -> Result<(), Warned> {
        let branch = self.harvester.branch.as_str();
        let mut seen = vec![head];
        seen.extend(known);
        let saved = self.harvester.with_remote(
            self.deadline,
            "workspace sync push",
            Policy::WORKSPACE_SYNC,
            || {
                save_local_branch(
                    &self.repo,
                    &self.harvester.remote_url,
                    branch,
                    &format!("before-{}", self.run_id),
                    &self.remote.heads,
                    &seen,
                    &self.gate,
                )
            },
        );
        match saved {
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
                let what =
                    format!("the push of the local {branch}'s own commits to a recovery branch");
                return Err((
                    SyncWarningCode::PushFailed,
                    from_local_head(e.describe(&what)),
                ));
            }
        }
        Ok(())
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
