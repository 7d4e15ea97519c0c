//! The local session branch (PROTOCOL.md 4.5 step 3): its own commits saved
//! to a recovery branch before it moves (a commit is never dropped before
//! it was pushed somewhere), then the move to the remote's tip.

use std::collections::HashMap;

use git2::{Oid, Repository};

use super::recovery::{keep_ref, recovery_name, recovery_suffix};
use super::remote::{Failure, push_ref};
use super::secret_guard::{BLOCKED_PREFIX, PushGate};

/// What [`save_local_branch`] did with the local session branch's own
/// commits.
#[derive(Debug)]
pub(super) enum Saved {
    /// Nothing needed saving.
    Nothing,
    /// Pushed to this recovery branch.
    Pushed(String),
    /// They hold a secret: kept on the local ref `kept`, not pushed; `paths`
    /// (redacted) are what holds it.
    Blocked { paths: Vec<String>, kept: String },
}

/// Saves the local session branch before it is moved (PROTOCOL.md 4.5 step
/// 3: never drop a commit that was not pushed somewhere). When its tip is on
/// no remote branch (`heads`, those known here) and not in `seen` (commits
/// on the remote by now, or the tip the runner last saw there), it is pushed,
/// never forced, to `<branch>-recovered-<name>-branch` (`-2`, … when taken),
/// unless they hold a secret: then they are kept on
/// `refs/hosted-boot/blocked/<name>-branch`, never pushed.
pub(super) fn save_local_branch(
    repo: &Repository,
    url: &str,
    branch: &str,
    name: &str,
    heads: &HashMap<String, Oid>,
    seen: &[Oid],
    gate: &PushGate<'_>,
) -> Result<Saved, Failure> {
    let local_ref = format!("refs/heads/{branch}");
    let Ok(local) = repo.refname_to_id(&local_ref) else {
        return Ok(Saved::Nothing);
    };
    let contains = |a: Oid, b: Oid| super::brought::contains(repo, a, b);
    let held = heads
        .values()
        .chain(seen)
        .any(|t| repo.find_commit(*t).is_ok() && contains(*t, local));
    if held {
        return Ok(Saved::Nothing);
    }
    let suffix = format!("{}-branch", recovery_suffix(name));
    let found = gate
        .scan(repo, local, heads)
        .map_err(|e| Failure::Local(super::harvest::message(&e)))?;
    if found.any() {
        let kept = keep_ref(repo, BLOCKED_PREFIX, &suffix, local)
            .map_err(|e| Failure::Local(super::harvest::message(&e)))?;
        let paths = found.report(gate.redactor());
        tracing::warn!(kept = %kept, paths = ?paths, "the local session branch's own commits hold a secret; kept locally, not pushed");
        return Ok(Saved::Blocked { paths, kept });
    }
    let recovery = recovery_name(repo, branch, &suffix, heads, local).ok_or_else(|| {
        Failure::Verdict(format!(
            "no free recovery branch name for {branch}-recovered-{suffix}"
        ))
    })?;
    let target = format!("refs/heads/{recovery}");
    if heads.get(&target) != Some(&local) {
        push_ref(repo, url, &local_ref, &target, gate, heads)?;
    }
    tracing::warn!(recovery_branch = %recovery, commit = %local, "the local session branch held commits on no remote branch; pushed them to a recovery branch before moving it");
    Ok(Saved::Pushed(recovery))
}

/// Checks out `tip` and points the local session branch, its
/// remote-tracking branch and `HEAD` at it. The checkout is git's safe one:
/// a file left uncommitted (one over the size limit, say) is carried over
/// when `tip` does not change it, and the checkout fails, changing nothing,
/// when it would be overwritten; so does an ignored file `tip` would
/// overwrite (a tracked file of that name).
pub(super) fn bring_local_to(repo: &Repository, branch: &str, tip: Oid) -> Result<(), git2::Error> {
    // The remote-tracking branch is the runner's record of the remote's
    // tip (what the next sync tells a force push by), kept even when
    // nothing else moves.
    repo.reference(
        &format!("refs/remotes/origin/{branch}"),
        tip,
        true,
        "hosted-boot: harvest",
    )?;
    let local = format!("refs/heads/{branch}");
    let attached = repo
        .head()
        .ok()
        .and_then(|h| h.name().ok().map(str::to_string))
        .is_some_and(|n| n == local);
    let at_tip = repo.head().ok().and_then(|h| h.target()) == Some(tip);
    if attached && at_tip {
        return Ok(());
    }
    // Check out first, while HEAD still names the old commit: files of the
    // old commit that the tip does not have are removed, not left behind as
    // untracked files that the next harvest would commit again.
    let commit = repo.find_commit(tip)?;
    let mut checkout = git2::build::CheckoutBuilder::new();
    // git's safe checkout overwrites ignored files by default; an ignored
    // file is the agent's (never harvested), so the checkout fails instead.
    checkout.safe().overwrite_ignored(false);
    repo.checkout_tree(commit.as_object(), Some(&mut checkout))?;
    repo.reference(
        &local,
        tip,
        true,
        "hosted-boot: harvest: the remote's session branch",
    )?;
    repo.set_head(&local)?;
    tracing::info!(branch, commit = %tip, "harvest: local session branch brought to the remote's");
    Ok(())
}
