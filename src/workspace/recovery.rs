//! Where work goes that may not go to the session branch (PROTOCOL.md 4.5):
//! the names of recovery branches on the remote
//! (`<branch>-recovered-<runId>`, `-2`, … when taken), and the local refs in
//! `repo/` that keep commits never pushed back (`refs/hosted-boot/discarded/`,
//! `refs/hosted-boot/oversized/`).

use std::collections::HashMap;

use git2::{Oid, Repository};

use super::harvest::RECOVERED_AT_BOOT;
use crate::wire::MAX_LISTED_COMMITS;

/// Most `-N` suffixes tried when a recovery branch name is taken.
const MAX_RECOVERY_SUFFIX: u32 = 100;

pub(super) fn recovery_suffix(name: &str) -> &str {
    if name == RECOVERED_AT_BOOT {
        "at-boot"
    } else {
        name
    }
}

/// `<branch>-recovered-<runId>` (`<branch>-recovered-at-boot` at boot), or
/// the same with `-2`, `-3`, … when the remote has that branch and `head`
/// does not contain its tip.
pub(super) fn recovery_name(
    repo: &Repository,
    branch: &str,
    name: &str,
    heads: &HashMap<String, Oid>,
    head: Oid,
) -> Option<String> {
    let base = format!("{branch}-recovered-{}", recovery_suffix(name));
    (1..=MAX_RECOVERY_SUFFIX)
        .map(|n| {
            if n == 1 {
                base.clone()
            } else {
                format!("{base}-{n}")
            }
        })
        .filter(|candidate| git2::Reference::is_valid_name(&format!("refs/heads/{candidate}")))
        .find(
            |candidate| match heads.get(&format!("refs/heads/{candidate}")) {
                None => true,
                Some(tip) => super::brought::contains(repo, head, *tip),
            },
        )
}

/// Points `<prefix>/<name>` (or `-2`, `-3`, … when that name holds another
/// commit) at `target`; returns the ref's name.
pub(super) fn keep_ref(
    repo: &Repository,
    prefix: &str,
    name: &str,
    target: Oid,
) -> Result<String, git2::Error> {
    let base = format!("{prefix}/{name}");
    for n in 1..=MAX_RECOVERY_SUFFIX {
        let refname = if n == 1 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        match repo.refname_to_id(&refname) {
            Ok(there) if there == target => return Ok(refname),
            Ok(_) => continue,
            Err(_) => {
                repo.reference(&refname, target, false, "hosted-boot: kept")?;
                return Ok(refname);
            }
        }
    }
    Err(git2::Error::from_str(&format!(
        "no free ref name for {base}"
    )))
}

/// Keeps `known` (the session branch's tip as last seen on the remote) on
/// `refs/hosted-boot/discarded/<runId>` (`-2`, `-3`, … when taken by another
/// commit) when it has commits that no branch of the remote had at the
/// fetch (`heads`). Returns the ref, the commits (newest first, at most
/// [`MAX_LISTED_COMMITS`]) and their count; `None` when there are none.
pub(super) fn keep_discarded(
    repo: &Repository,
    run_id: &str,
    known: Oid,
    heads: &HashMap<String, Oid>,
) -> Result<Option<(String, Vec<String>, u64)>, git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(known)?;
    for tip in heads.values() {
        if repo.find_commit(*tip).is_ok() {
            walk.hide(*tip)?;
        }
    }
    let mut commits = Vec::new();
    let mut count = 0u64;
    for oid in walk {
        let oid = oid?;
        count += 1;
        if commits.len() < MAX_LISTED_COMMITS {
            commits.push(oid.to_string());
        }
    }
    if count == 0 {
        return Ok(None);
    }
    let name = keep_ref(repo, "refs/hosted-boot/discarded", run_id, known)?;
    Ok(Some((name, commits, count)))
}

#[cfg(test)]
mod tests {
    use git2::Signature;

    use super::*;

    #[test]
    fn recovery_names_skip_taken_branches() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let sig = Signature::now("t", "t@example.invalid").unwrap();
        let tree = repo
            .find_tree(repo.index().unwrap().write_tree().unwrap())
            .unwrap();
        let a = repo
            .commit(Some("HEAD"), &sig, &sig, "a", &tree, &[])
            .unwrap();
        let parent = repo.find_commit(a).unwrap();
        let b = repo
            .commit(Some("HEAD"), &sig, &sig, "b", &tree, &[&parent])
            .unwrap();
        let other = repo.commit(None, &sig, &sig, "other", &tree, &[]).unwrap();
        let mut heads = HashMap::new();
        assert_eq!(
            recovery_name(&repo, "s", "run-2", &heads, b).as_deref(),
            Some("s-recovered-run-2")
        );
        assert_eq!(
            recovery_name(&repo, "s", RECOVERED_AT_BOOT, &heads, b).as_deref(),
            Some("s-recovered-at-boot")
        );
        // Taken by an ancestor of HEAD: a fast-forward, same name.
        heads.insert("refs/heads/s-recovered-run-2".to_string(), a);
        assert_eq!(
            recovery_name(&repo, "s", "run-2", &heads, b).as_deref(),
            Some("s-recovered-run-2")
        );
        // Taken by unrelated work: the next free suffix.
        heads.insert("refs/heads/s-recovered-run-2".to_string(), other);
        heads.insert("refs/heads/s-recovered-run-2-2".to_string(), other);
        assert_eq!(
            recovery_name(&repo, "s", "run-2", &heads, b).as_deref(),
            Some("s-recovered-run-2-3")
        );
    }
}
