//! The checkpoint on notice (PROTOCOL.md 4.5, "Checkpoint"): while the agent
//! runs, the work as it stands now goes to the remote without touching what
//! the agent is in the middle of. The agent's `HEAD`, index, work tree, a
//! merge or rebase in progress and its locks (`index.lock`) stay as they
//! are:
//!
//! 1. a copy of `.git/index` (the agent's staged changes) in a directory of
//!    its own, set as the index of a repository handle of the checkpoint's
//!    own, takes every change of the work tree as the harvest's commit would
//!    ([`super::commit::stage_uncommitted`]: the same size limit, LFS,
//!    nested repositories and filters left out);
//! 2. a commit of that tree on `HEAD` (and on the run's previous checkpoint,
//!    when `HEAD` does not hold it: every checkpoint of a run is a
//!    fast-forward of the one before) is written, with no ref moved;
//! 3. it is pushed to `<branch>-recovered-checkpoint-<runId>` through the
//!    harvest's size limit and secret guard, never forced
//!    ([`Harvester::push_checkpoint_once`]).
//!
//! The turn's own harvest at its end is unchanged.

use std::path::Path;
use std::time::{Duration, Instant};

use git2::{Index, Oid, Repository, Signature};

use super::clone::{GIT_USER_EMAIL, GIT_USER_NAME};
use super::commit::{Staged, stage_uncommitted};
use super::harvest::{HarvestJob, Harvester, message};
use super::remote::RemoteError;
use super::secret_guard::PushGate;
use crate::client::retry::Policy;
use crate::wire::{HarvestResult, PushError, PushErrorCode};

/// The prefix of a checkpoint's name (`checkpoint-<runId>`), which names
/// its branch: `<branch>-recovered-checkpoint-<runId>`.
pub const CHECKPOINT_PREFIX: &str = "checkpoint-";

/// One checkpoint of a running turn.
#[derive(Clone, Debug)]
pub struct CheckpointJob {
    /// The running turn's run id.
    pub run_id: String,
    /// The commit the run's previous checkpoint pushed, if any.
    pub previous: Option<String>,
    /// The commit the turn started from (the workspace sync's), the base of
    /// the report's counts; `None`: the remote's session branch.
    pub start: Option<String>,
    /// The time bound.
    pub bound: Duration,
}

impl Harvester {
    /// Checkpoints `repo/` (see the module documentation) on the blocking
    /// pool, within `job.bound`. Never fails: the report is a harvest's,
    /// named `checkpoint-<runId>`, whose `pushError` says what went wrong;
    /// `headSha` is the commit on the remote when `pushed`.
    pub async fn checkpoint(&self, job: CheckpointJob) -> HarvestResult {
        let name = format!("{CHECKPOINT_PREFIX}{}", job.run_id);
        let bound = job.bound;
        let this = self.clone();
        let task = {
            let name = name.clone();
            crate::concurrency::spawn_blocking_in_span(move || {
                this.checkpoint_blocking(&name, &job, Instant::now() + bound)
            })
        };
        let failed = |code, text: String| HarvestResult {
            name: name.clone(),
            branch: self.branch.clone(),
            push_error: Some(PushError {
                code,
                message: text,
            }),
            ..HarvestResult::default()
        };
        match tokio::time::timeout(bound, task).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => failed(
                PushErrorCode::HarvestFailed,
                format!("the checkpoint task failed: {e}"),
            ),
            Err(_) => failed(
                PushErrorCode::HarvestTimeout,
                format!(
                    "the checkpoint did not finish within its bound of {} ms",
                    bound.as_millis()
                ),
            ),
        }
    }

    fn checkpoint_blocking(
        &self,
        name: &str,
        job: &CheckpointJob,
        deadline: Instant,
    ) -> HarvestResult {
        let mut r = HarvestResult {
            name: name.to_string(),
            branch: self.branch.clone(),
            ..HarvestResult::default()
        };
        let fail = |mut r: HarvestResult, code, text: String| {
            r.pushed = false;
            r.push_error = Some(PushError {
                code,
                message: text,
            });
            r
        };
        let hold = self.lock_repo_as_found();
        if let Some(why) = hold.refused() {
            return fail(r, PushErrorCode::HarvestFailed, why.to_string());
        }
        let harvest_job = HarvestJob {
            name: name.to_string(),
            outcome: None,
            start: job.start.clone(),
            bound: job.bound,
        };
        let mut uncommitted = None;
        let mut head = match self.checkpoint_commit(name, job, &mut r, &mut uncommitted) {
            Ok(Some(head)) => head,
            Ok(None) => return r,
            Err(text) => return fail(r, PushErrorCode::HarvestFailed, text),
        };
        let repo = match super::repo_config::open(&self.repo_dir) {
            Ok(repo) => repo,
            Err(e) => return fail(r, PushErrorCode::HarvestFailed, message(&e)),
        };
        let gate = PushGate::new(&self.branch, &self.http.redactor);
        let previous = job.previous.as_deref().and_then(|p| Oid::from_str(p).ok());
        let outcome = self.with_remote(deadline, "checkpoint push", Policy::HARVEST_PUSH, || {
            self.push_checkpoint_once(&repo, &mut head, previous, &harvest_job, &mut r, &gate)
        });
        drop(hold);
        let url = &self.remote_url;
        match outcome {
            Ok(()) => {
                r.pushed = true;
                r.push_error = uncommitted.map(|text| PushError {
                    code: PushErrorCode::HarvestFailed,
                    message: text,
                });
                r
            }
            Err(e @ (RemoteError::NoTime | RemoteError::OutOfTime { .. })) => fail(
                r,
                PushErrorCode::HarvestTimeout,
                e.describe("the checkpoint's push"),
            ),
            Err(e @ RemoteError::Refused(_)) => fail(
                r,
                PushErrorCode::PushRejected,
                e.describe(&format!("the checkpoint's push to {url}")),
            ),
            Err(e @ RemoteError::Local(_)) => fail(
                r,
                PushErrorCode::HarvestFailed,
                e.describe("the checkpoint's push"),
            ),
            Err(e @ (RemoteError::Setup(_) | RemoteError::Exhausted { .. })) => fail(
                r,
                PushErrorCode::PushFailed,
                e.describe(&format!("the checkpoint's push to {url}")),
            ),
        }
    }

    /// Steps 1 and 2: the commit to push (a new one, or `HEAD` itself when
    /// the work tree has nothing more), noted in `r`; `None` when there is
    /// nothing at all (an unborn `HEAD` and no change).
    fn checkpoint_commit(
        &self,
        name: &str,
        job: &CheckpointJob,
        r: &mut HarvestResult,
        uncommitted: &mut Option<String>,
    ) -> Result<Option<Oid>, String> {
        let dir = &self.repo_dir;
        let cannot = |what: &str, e: git2::Error| {
            format!(
                "the checkpoint cannot {what} in {}: {}",
                dir.display(),
                message(&e)
            )
        };
        // A handle of its own: the index set on it is the checkpoint's
        // alone, never the agent's `.git/index`.
        let repo = super::repo_config::open(dir).map_err(|e| cannot("open the repository", e))?;
        let scratch = tempfile::Builder::new()
            .prefix("hosted-boot-checkpoint-")
            .tempdir()
            .map_err(|e| format!("the checkpoint cannot create its scratch directory: {e}"))?;
        let staged = match scratch_index(&repo, scratch.path()) {
            Ok(Some(mut index)) => {
                repo.set_index(&mut index)
                    .map_err(|e| cannot("use its index", e))?;
                stage_uncommitted(&repo, self.max_file_size, &mut r.skipped_files)
                    .map_err(|e| cannot("stage the work tree", e))?
            }
            Ok(None) => {
                // As the harvest does with such an index: the agent's
                // commits go, the report says what did not (a tree from
                // HEAD would drop a sparse checkout's files outside its
                // cone, and the staged work).
                *uncommitted = Some(format!(
                    "the checkpoint cannot read the agent's index in {} (a split or sparse index, or not a regular file); the agent's commits are in it, the work it left uncommitted is not (the turn's harvest saves that)",
                    dir.display()
                ));
                None
            }
            Err(e) => return Err(cannot("read HEAD", e)),
        };
        let head = match repo.head() {
            Ok(h) => Some(h.peel_to_commit().map_err(|e| cannot("read HEAD", e))?),
            Err(e) if e.code() == git2::ErrorCode::UnbornBranch => None,
            Err(e) => return Err(cannot("read HEAD", e)),
        };
        let tree = match (staged, &head) {
            (Some(Staged { tree, .. }), _) => tree,
            (None, Some(head)) => head.tree_id(),
            (None, None) => return Ok(None),
        };
        let previous = job
            .previous
            .as_deref()
            .and_then(|p| Oid::from_str(p).ok())
            .and_then(|p| repo.find_commit(p).ok())
            .filter(|p| {
                head.as_ref()
                    .is_none_or(|h| !super::brought::contains(&repo, h.id(), p.id()))
            });
        // The run's last checkpoint holds this already: nothing new (no
        // commit per notice when nothing changed).
        if let Some(p) = &previous
            && p.tree_id() == tree
            && head
                .as_ref()
                .is_none_or(|h| super::brought::contains(&repo, p.id(), h.id()))
        {
            return Ok(Some(p.id()));
        }
        let parents: Vec<&git2::Commit<'_>> = head.iter().chain(previous.iter()).collect();
        if let ([only], None) = (parents.as_slice(), &previous)
            && only.tree_id() == tree
        {
            return Ok(Some(only.id()));
        }
        let tree = repo
            .find_tree(tree)
            .map_err(|e| cannot("read its tree", e))?;
        let sig = Signature::now(GIT_USER_NAME, GIT_USER_EMAIL)
            .map_err(|e| cannot("sign its commit", e))?;
        let text = format!(
            "WIP {name}: the work in progress at a checkpoint\n\nCommitted by hosted-boot at a checkpoint notice while the agent ran, its HEAD, index and work tree untouched (PROTOCOL.md 4.5, \"Checkpoint\").\n"
        );
        let oid = repo
            .commit(None, &sig, &sig, &text, &tree, &parents)
            .map_err(|e| cannot("write its commit", e))?;
        r.harvest_commit = Some(oid.to_string());
        Ok(Some(oid))
    }
}

/// The checkpoint's index, in `dir`: a copy of the agent's `.git/index`
/// (read once, never through a link, only when it is a regular file), or,
/// when there is none, `HEAD`'s tree (as git reads a missing index);
/// `None` when there is one the checkpoint cannot use (a split or sparse
/// index libgit2 cannot read, a link, a FIFO).
fn scratch_index(repo: &Repository, dir: &Path) -> Result<Option<Index>, git2::Error> {
    let path = dir.join("index");
    match copy_regular(&repo.path().join("index"), &path) {
        Ok(()) => return Ok(Index::open(&path).ok()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(_) => return Ok(None),
    }
    let mut index = Index::open(&path)?;
    match repo.head() {
        Ok(head) => index.read_tree(&head.peel_to_tree()?)?,
        Err(e) if e.code() == git2::ErrorCode::UnbornBranch => {}
        Err(e) => return Err(e),
    }
    index.write()?;
    Ok(Some(index))
}

/// Copies `from` to `to` when `from` is a regular file (opened without
/// following a link or blocking on a FIFO).
fn copy_regular(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut source = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(from)?;
    if !source.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut target = std::fs::File::create_new(to)?;
    std::io::copy(&mut source, &mut target)?;
    Ok(())
}
