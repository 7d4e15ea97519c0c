//! The harvest's secret guard (PROTOCOL.md 4.5, "Secrets in the agent's
//! work"): the runner never pushes a value it keeps secret (the boot secret,
//! a bearer, a repo token, a connector or `redactVars` value), in any form
//! the redactor knows.
//!
//! Every push of the runner goes through [`PushGate::check`] (called by
//! [`super::remote::push_ref`], the one function that pushes): it refuses a
//! target other than the session branch and its recovery branches (the push
//! policy), and a push whose commits (from the pushed commit back to the
//! remote's branches, not only the final tree: a secret committed and then
//! deleted is still in history) add a blob, a path or a commit text that
//! holds a secret. The harvest and the sync look first ([`PushGate::scan`])
//! and, when something holds one, [`hold_back`] replaces the agent's commits
//! by one commit of their final tree with the offending paths as the remote
//! has them; the agent's commits stay on `refs/hosted-boot/blocked/<name>`,
//! a local ref no push of the runner names.
//!
//! The match is the redactor's own ([`Redactor::contains`],
//! [`Redactor::contains_read`]), so the guard and redaction cannot disagree
//! on what a secret is. Blobs are read from the object database, a large one
//! streamed in pieces (a secret cut by a piece boundary is still found), each
//! once per harvest.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use git2::{Odb, Oid, Repository, Signature};

use super::brought::{brought_by, commits_to_push, update_mode};
use super::clone::{GIT_USER_EMAIL, GIT_USER_NAME};
use super::recovery::keep_ref;
use crate::redact::{Redactor, SCAN_READ};
use crate::wire::MAX_LISTED_COMMITS;

/// Where the agent's commits that held a secret are kept in `repo/`.
pub(super) const BLOCKED_PREFIX: &str = "refs/hosted-boot/blocked";

/// What [`PushGate::scan`] found in the commits a push would bring.
#[derive(Debug, Default)]
pub(super) struct Findings {
    /// The paths whose blob (in some commit of the range) or whose name
    /// holds a secret, as git stores them, sorted.
    paths: BTreeSet<Vec<u8>>,
    /// A commit's own text (message, author, committer) holds one.
    in_commits: bool,
}

impl Findings {
    /// Whether anything holds a secret.
    pub(super) fn any(&self) -> bool {
        self.in_commits || !self.paths.is_empty()
    }

    /// The paths for a report: lossy UTF-8, and redacted (a path's name may
    /// be what holds the secret).
    pub(super) fn report(&self, redactor: &Redactor) -> Vec<String> {
        self.paths
            .iter()
            .map(|p| redactor.redact(&String::from_utf8_lossy(p)))
            .collect()
    }
}

/// The check every push of one harvest or sync passes: the push policy and
/// the secret scan, with the blobs found clean remembered so that the scan
/// before a push and the check at the push read each blob once.
pub(super) struct PushGate<'a> {
    branch: &'a str,
    redactor: &'a Redactor,
    clean: RefCell<HashSet<Oid>>,
}

impl<'a> PushGate<'a> {
    /// The gate for pushes of the session branch `branch`, scanning for what
    /// `redactor` holds.
    pub(super) fn new(branch: &'a str, redactor: &'a Redactor) -> Self {
        PushGate {
            branch,
            redactor,
            clean: RefCell::new(HashSet::new()),
        }
    }

    /// The redactor the scan matches with.
    pub(super) fn redactor(&self) -> &Redactor {
        self.redactor
    }

    /// Whether the runner may push to `target` (a full ref name): the
    /// session branch and its recovery branches only (4.5, "Push policy").
    pub(super) fn allows(&self, target: &str) -> bool {
        let Some(name) = target.strip_prefix("refs/heads/") else {
            return false;
        };
        name == self.branch
            || name
                .strip_prefix(self.branch)
                .is_some_and(|rest| rest.starts_with("-recovered-"))
    }

    /// Refuses a push of `source` (a commit) to `target` that the policy
    /// does not allow or whose commits hold a secret; `heads` are the
    /// remote's branches (their commits are on the remote already).
    pub(super) fn check(
        &self,
        repo: &Repository,
        source: Oid,
        target: &str,
        heads: &HashMap<String, Oid>,
    ) -> Result<(), Refusal> {
        if !self.allows(target) {
            return Err(Refusal::Policy(format!(
                "the runner pushes only refs/heads/{branch} and refs/heads/{branch}-recovered-*, not {target}",
                branch = self.branch
            )));
        }
        let found = self
            .scan(repo, source, heads)
            .map_err(|e| Refusal::Unreadable(super::harvest::message(&e)))?;
        if found.any() {
            let mut what = found.report(self.redactor);
            if found.in_commits {
                what.push("a commit message or author".to_string());
            }
            return Err(Refusal::Secret(what.join(", ")));
        }
        Ok(())
    }

    /// Looks through every commit from `head` back to the remote's branches
    /// (`heads`, those present here) for a secret: in each blob a commit adds
    /// or changes (against every parent: a merge's blob taken unchanged from
    /// one parent is that parent's), in the paths of those blobs, and in the
    /// commit's own text.
    pub(super) fn scan(
        &self,
        repo: &Repository,
        head: Oid,
        heads: &HashMap<String, Oid>,
    ) -> Result<Findings, git2::Error> {
        let walk = commits_to_push(repo, head, heads)?;
        let odb = repo.odb()?;
        let mut found = Findings::default();
        for oid in walk {
            let oid = oid?;
            if self.redactor.contains(odb.read(oid)?.data()) {
                found.in_commits = true;
            }
            let commit = repo.find_commit(oid)?;
            // Every entry the commit brings, whatever its mode
            // (super::brought): its path (a tree's too: an empty directory
            // built with `git mktree` adds no blob, issue 33), and a blob's
            // content (a mode-0 entry's included: libgit2 sends it).
            for entry in brought_by(repo, &commit)? {
                if found.paths.contains(&entry.path) {
                    continue;
                }
                if self.redactor.contains(&entry.path)
                    || (entry.is_blob() && self.blob_holds(&odb, entry.id)?)
                {
                    found.paths.insert(entry.path);
                }
            }
        }
        Ok(found)
    }

    /// Whether blob `blob` holds a secret: read whole when small, else
    /// streamed (libgit2 streams loose objects; a packed one is read whole).
    fn blob_holds(&self, odb: &Odb<'_>, blob: Oid) -> Result<bool, git2::Error> {
        if self.clean.borrow().contains(&blob) {
            return Ok(false);
        }
        let (size, _) = odb.read_header(blob)?;
        let holds = if size <= SCAN_READ {
            self.redactor.contains(odb.read(blob)?.data())
        } else {
            match odb.reader(blob) {
                Ok((mut reader, _, _)) => self
                    .redactor
                    .contains_read(&mut reader)
                    .map_err(|e| git2::Error::from_str(&format!("cannot read blob {blob}: {e}")))?,
                Err(_) => self.redactor.contains(odb.read(blob)?.data()),
            }
        };
        if !holds {
            self.clean.borrow_mut().insert(blob);
        }
        Ok(holds)
    }
}

/// Why [`PushGate::check`] refused a push.
#[derive(Debug)]
pub(super) enum Refusal {
    /// The target is not the session branch or one of its recovery branches.
    Policy(String),
    /// Something the push would bring holds a secret: what (paths, redacted).
    Secret(String),
    /// The commits to push could not be read.
    Unreadable(String),
}

/// The agent's commits replaced: one commit of `head`'s tree with each path
/// of `found` as the remote has it (the version of the base, or absent), on
/// the remote's session tip when `head` contains it, else on their merge
/// base (the push then goes to a recovery branch). No commit when that tree
/// is the base's: the base is the new head. `HEAD` is not moved: a harvest
/// moves it there ([`super::harvest::move_head`]: the work tree keeps the
/// files, now uncommitted, for the next turn), a checkpoint does not; the
/// agent's commits stay on `refs/hosted-boot/blocked/<name>` (`-2`, … when
/// taken). Returns the new head and that ref.
pub(super) fn hold_back(
    repo: &Repository,
    head: Oid,
    session_tip: Option<Oid>,
    found: &Findings,
    name: &str,
    redactor: &Redactor,
) -> Result<(Oid, String), git2::Error> {
    let base = match session_tip {
        Some(tip) if super::brought::contains(repo, head, tip) => Some(tip),
        Some(tip) => repo.merge_base(head, tip).ok(),
        None => None,
    };
    let head_tree = repo.find_commit(head)?.tree()?;
    let base_commit = base.map(|b| repo.find_commit(b)).transpose()?;
    let base_tree = base_commit.as_ref().map(|c| c.tree()).transpose()?;
    let mut update = git2::build::TreeUpdateBuilder::new();
    // A path under another found one goes with it (a directory whose name
    // holds a secret, and its files): one update may not touch both.
    let under_another = |path: &[u8]| {
        found.paths.iter().any(|other| {
            path.len() > other.len() && path.starts_with(other) && path[other.len()] == b'/'
        })
    };
    for path in found.paths.iter().filter(|p| !under_another(p)) {
        let at = Path::new(OsStr::from_bytes(path));
        match base_tree.as_ref().and_then(|t| t.get_path(at).ok()) {
            Some(entry) => {
                update.upsert(path.clone(), entry.id(), update_mode(entry.filemode_raw()));
            }
            None if head_tree.get_path(at).is_ok() => {
                update.remove(path.clone());
            }
            None => {}
        }
    }
    let tree = repo.find_tree(update.create_updated(repo, &head_tree)?)?;
    let kept = keep_ref(repo, BLOCKED_PREFIX, name, head)?;
    let new = match &base_commit {
        Some(b) if b.tree_id() == tree.id() => b.id(),
        _ => {
            let text = message(repo, name, head, base, found, &kept, redactor)?;
            let sig = Signature::now(GIT_USER_NAME, GIT_USER_EMAIL)?;
            let parents: Vec<&git2::Commit<'_>> = base_commit.iter().collect();
            repo.commit(None, &sig, &sig, &text, &tree, &parents)?
        }
    };
    tracing::warn!(
        commit = %new,
        kept = %kept,
        paths = ?found.report(redactor),
        in_commits = found.in_commits,
        "harvest: the agent's commits hold a secret; they are not pushed, the rest of the work is"
    );
    Ok((new, kept))
}

/// The replacement commit's message: what was held back and where the
/// agent's commits are (never a value: paths redacted, no subject of the
/// agent's, which may hold one).
fn message(
    repo: &Repository,
    name: &str,
    head: Oid,
    base: Option<Oid>,
    found: &Findings,
    kept: &str,
    redactor: &Redactor,
) -> Result<String, git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(head)?;
    if let Some(b) = base {
        walk.hide(b)?;
    }
    let commits: Vec<String> = walk
        .take(MAX_LISTED_COMMITS)
        .map(|oid| oid.map(|o| format!("  {o}")))
        .collect::<Result<_, _>>()?;
    let mut paths: Vec<String> = found
        .report(redactor)
        .into_iter()
        .map(|p| format!("  {p}"))
        .collect();
    if found.in_commits {
        paths.push("  (and the text of a commit: message or author)".to_string());
    }
    Ok(format!(
        "{name}: the agent's work without what holds a secret\n\n\
         Committed by hosted-boot (the harvest, PROTOCOL.md 4.5): the agent's commits hold a value\n\
         the runner keeps secret (a credential, a connector value), so they are not pushed.\n\
         Held back (left as they are on the remote; the files stay in the work tree, uncommitted):\n\
         {paths}\n\n\
         The agent's commits, kept in repo/ at {kept} (never pushed):\n{commits}\n",
        paths = paths.join("\n"),
        commits = commits.join("\n"),
    ))
}

#[cfg(test)]
mod tests {
    use git2::ObjectType;

    use super::*;
    use crate::redact::SecretKind;
    use crate::secret::Secret;

    const VALUE: &str = "acme-connector-value-42";

    fn commit(repo: &Repository, files: &[(&str, &[u8])], remove: &[&str]) -> Oid {
        let sig = Signature::now("t", "t@example.invalid").unwrap();
        let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
        let mut update = git2::build::TreeUpdateBuilder::new();
        for (path, data) in files {
            update.upsert(*path, repo.blob(data).unwrap(), git2::FileMode::Blob);
        }
        for path in remove {
            update.remove(*path);
        }
        let base = match &parent {
            Some(p) => p.tree().unwrap(),
            None => repo
                .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
                .unwrap(),
        };
        let tree = repo
            .find_tree(update.create_updated(repo, &base).unwrap())
            .unwrap();
        repo.commit(
            Some("HEAD"),
            &sig,
            &sig,
            "c",
            &tree,
            &parent.iter().collect::<Vec<_>>(),
        )
        .unwrap()
    }

    fn redactor() -> Redactor {
        let r = Redactor::new();
        r.add(&Secret::new(VALUE.into()), SecretKind::Configured);
        r
    }

    /// Issue 33: a name only a tree carries (an empty directory built with
    /// `git mktree`) is checked, and so is a directory's own name; the held
    /// back tree has neither.
    #[test]
    fn names_that_only_trees_carry_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let base = commit(&repo, &[("README.md", b"hello\n")], &[]);
        let mut heads = HashMap::new();
        heads.insert("refs/heads/main".to_string(), base);
        let named_dir = commit(&repo, &[(&format!("{VALUE}/a.txt"), b"a\n")], &[]);
        // `git mktree` with an empty tree named with the secret, under
        // `deep/`: no file delta names it.
        let empty = repo.treebuilder(None).unwrap().write().unwrap();
        let mut deep = repo.treebuilder(None).unwrap();
        deep.insert(VALUE, empty, 0o040000).unwrap();
        let deep = deep.write().unwrap();
        let head_tree = repo.find_commit(named_dir).unwrap().tree().unwrap();
        let mut top = repo.treebuilder(Some(&head_tree)).unwrap();
        top.insert("deep", deep, 0o040000).unwrap();
        let tree = repo.find_tree(top.write().unwrap()).unwrap();
        let sig = Signature::now("t", "t@example.invalid").unwrap();
        let parent = repo.find_commit(named_dir).unwrap();
        let head = repo
            .commit(Some("HEAD"), &sig, &sig, "c", &tree, &[&parent])
            .unwrap();
        let r = redactor();
        let gate = PushGate::new("main", &r);
        let found = gate.scan(&repo, head, &heads).unwrap();
        assert_eq!(
            found.report(&r),
            vec!["[REDACTED]", "[REDACTED]/a.txt", "deep/[REDACTED]"]
        );
        let (new, _) = hold_back(&repo, head, Some(base), &found, "run-1", &r).unwrap();
        crate::workspace::harvest::move_head(&repo, new).unwrap();
        let tree = repo.find_commit(new).unwrap().tree().unwrap();
        let mut names = Vec::new();
        tree.walk(git2::TreeWalkMode::PreOrder, |root, e| {
            names.push(format!("{root}{}", e.name().unwrap()));
            git2::TreeWalkResult::Ok
        })
        .unwrap();
        // `deep/` is empty without it: git keeps no empty tree.
        assert_eq!(names, vec!["README.md"]);
        // Unchanged trees are not descended again: a later commit that
        // touches another file finds nothing new.
        let mut heads = HashMap::new();
        heads.insert("refs/heads/main".to_string(), new);
        let later = commit(&repo, &[("README.md", b"more\n")], &[]);
        assert!(!gate.scan(&repo, later, &heads).unwrap().any());
    }

    #[test]
    fn history_is_scanned_and_the_held_back_tree_is_the_remotes_for_those_paths() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let base = commit(
            &repo,
            &[("README.md", b"hello\n"), ("conf.env", b"x=1\n")],
            &[],
        );
        let mut heads = HashMap::new();
        heads.insert("refs/heads/main".to_string(), base);
        commit(
            &repo,
            &[("conf.env", format!("x={VALUE}\n").as_bytes())],
            &[],
        );
        commit(&repo, &[("gone.txt", VALUE.as_bytes())], &[]);
        commit(&repo, &[("ok.md", b"fine\n")], &["gone.txt"]);
        let head = commit(&repo, &[(&format!("dir/{VALUE}.txt"), b"named\n")], &[]);
        let r = redactor();
        let gate = PushGate::new("main", &r);
        let found = gate.scan(&repo, head, &heads).unwrap();
        assert_eq!(
            found.report(&r),
            vec!["conf.env", "dir/[REDACTED].txt", "gone.txt"]
        );
        assert!(!found.in_commits);
        assert!(matches!(
            gate.check(&repo, head, "refs/heads/main", &heads),
            Err(Refusal::Secret(_))
        ));
        assert!(matches!(
            gate.check(&repo, head, "refs/heads/other", &heads),
            Err(Refusal::Policy(_))
        ));

        let (new, kept) = hold_back(&repo, head, Some(base), &found, "run-1", &r).unwrap();
        assert_eq!(repo.head().unwrap().target(), Some(head), "HEAD moved");
        crate::workspace::harvest::move_head(&repo, new).unwrap();
        assert_eq!(kept, "refs/hosted-boot/blocked/run-1");
        assert_eq!(repo.refname_to_id(&kept).unwrap(), head);
        let c = repo.find_commit(new).unwrap();
        assert_eq!(c.parent_id(0).unwrap(), base);
        let tree = c.tree().unwrap();
        let mut names = Vec::new();
        tree.walk(git2::TreeWalkMode::PreOrder, |root, e| {
            if e.kind() == Some(ObjectType::Blob) {
                names.push(format!("{root}{}", e.name().unwrap()));
            }
            git2::TreeWalkResult::Ok
        })
        .unwrap();
        assert_eq!(names, vec!["README.md", "conf.env", "ok.md"]);
        let conf = tree.get_path(Path::new("conf.env")).unwrap();
        assert_eq!(repo.find_blob(conf.id()).unwrap().content(), b"x=1\n");
        assert!(!c.message().unwrap().contains(VALUE));
        assert!(gate.scan(&repo, new, &heads).unwrap().paths.is_empty());
        gate.check(&repo, new, "refs/heads/main-recovered-run-1", &heads)
            .unwrap();
        assert_eq!(repo.head().unwrap().target(), Some(new));
    }

    #[test]
    fn a_commit_message_a_merge_and_a_tree_equal_to_the_base() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let base = commit(&repo, &[("a", b"a\n")], &[]);
        let mut heads = HashMap::new();
        heads.insert("refs/heads/main".to_string(), base);
        let sig = Signature::now("t", "t@example.invalid").unwrap();
        let parent = repo.find_commit(base).unwrap();
        let tree = parent.tree().unwrap();
        let said = repo
            .commit(
                Some("HEAD"),
                &sig,
                &sig,
                &format!("token {VALUE}"),
                &tree,
                &[&parent],
            )
            .unwrap();
        let r = redactor();
        let gate = PushGate::new("main", &r);
        let found = gate.scan(&repo, said, &heads).unwrap();
        assert!(found.any() && found.in_commits && found.paths.is_empty());
        // Nothing but the message: the base is the new head, no commit.
        let (new, _) = hold_back(&repo, said, Some(base), &found, "run-1", &r).unwrap();
        assert_eq!(new, base);
        assert!(!gate.scan(&repo, new, &heads).unwrap().any());
    }
}
