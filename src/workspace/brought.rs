//! What a commit brings to the remote: every entry of its trees that none of
//! its parents has at that place with the same id, found by walking the
//! trees themselves, for the checks every push passes (the secret guard,
//! the size guard, the unpublished gitlinks).
//!
//! Not a diff: libgit2's diff leaves out an entry of mode `0` (it calls it
//! unreadable) although its push sends the blob, and git2's
//! `DiffFile::mode` panics on a mode it does not know (`100600`, which `git
//! mktree` writes as given); both were ways past the guards found by a
//! review (issue 33). Here an entry is what its object is: anything but a
//! tree or a gitlink is a blob, as libgit2's pack builder reads it. Paths
//! are bytes: a name need not be UTF-8.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use git2::{FileMode, ObjectType, Oid, Repository};

/// The raw mode of a gitlink (a submodule's commit).
pub(super) const GITLINK: i32 = 0o160000;

/// Whether `commit` is in the history of `tip`: it is `tip`, or `tip`
/// descends from it (an unreadable graph counts as not). What "a branch
/// holds a commit" means to every push and sync check.
pub(super) fn contains(repo: &Repository, tip: Oid, commit: Oid) -> bool {
    tip == commit || repo.graph_descendant_of(tip, commit).unwrap_or(false)
}

/// One entry a commit brings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Brought {
    /// Its path from the root of the commit's tree.
    pub path: Vec<u8>,
    /// Its object.
    pub id: Oid,
    /// Its mode as the tree records it (any value `git mktree` took).
    pub mode: i32,
}

/// What a tree entry is, as libgit2 reads its mode (and sends it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Tree,
    Gitlink,
    Blob,
}

/// The kind of an entry of mode `raw`: the type bits of a directory, a
/// gitlink's (git's `S_ISGITLINK`), anything else a blob.
fn kind_of(raw: i32) -> Kind {
    match raw & 0o170000 {
        0o040000 => Kind::Tree,
        0o160000 => Kind::Gitlink,
        _ => Kind::Blob,
    }
}

impl Brought {
    fn kind(&self) -> Kind {
        kind_of(self.mode)
    }

    /// A subtree: walked into, its own entries brought too.
    pub fn is_tree(&self) -> bool {
        self.kind() == Kind::Tree
    }

    /// A gitlink: a commit of another repository, not sent with the push.
    pub fn is_gitlink(&self) -> bool {
        self.kind() == Kind::Gitlink
    }

    /// A blob the push sends: every entry that is neither (a regular file,
    /// an executable, a symbolic link, and any other mode).
    pub fn is_blob(&self) -> bool {
        self.kind() == Kind::Blob
    }
}

/// The commits a push of `head` brings: from `head` back to the remote's
/// branches (`heads`, those this repository has), which the remote has.
pub(super) fn commits_to_push<'r>(
    repo: &'r Repository,
    head: Oid,
    heads: &HashMap<String, Oid>,
) -> Result<git2::Revwalk<'r>, git2::Error> {
    let mut walk = repo.revwalk()?;
    walk.push(head)?;
    for tip in heads.values() {
        if repo.find_commit(*tip).is_ok() {
            walk.hide(*tip)?;
        }
    }
    Ok(walk)
}

/// The entries `commit` brings, at any depth, trees included; for a merge,
/// those that no parent has at their place with the same id. A subtree a
/// parent has unchanged is not walked. Iterative: a tree nested thousands
/// deep must not exhaust the stack.
pub(super) fn brought_by(
    repo: &Repository,
    commit: &git2::Commit<'_>,
) -> Result<Vec<Brought>, git2::Error> {
    let parents: Vec<Oid> = commit.parents().map(|p| p.tree_id()).collect();
    let mut out = Vec::new();
    let mut stack: Vec<(Oid, Vec<Oid>, Vec<u8>)> = vec![(commit.tree_id(), parents, Vec::new())];
    while let Some((tree_id, olds, prefix)) = stack.pop() {
        let tree = repo.find_tree(tree_id)?;
        // A parent's entry of that name that is not a tree has no entries.
        let old_trees: Vec<git2::Tree<'_>> = olds
            .iter()
            .filter_map(|o| repo.find_tree(*o).ok())
            .collect();
        for entry in tree.iter() {
            let name = entry.name_bytes();
            let found = Brought {
                path: joined(&prefix, name),
                id: entry.id(),
                mode: entry.filemode_raw(),
            };
            // The parents' entries of that name, as (id, kind).
            let olds: Vec<(Oid, Kind)> = old_trees
                .iter()
                .filter_map(|t| t.get_name_bytes(name))
                .map(|e| (e.id(), kind_of(e.filemode_raw())))
                .collect();
            // Unchanged only when a parent has the same object of the same
            // kind there: a gitlink's id is not sent with the push, so the
            // same id as a blob or a tree in the child is new (found by a
            // review: a blob holding a secret, first committed as a
            // gitlink's id, then as a file, passed every guard).
            if olds.contains(&(found.id, found.kind())) {
                continue;
            }
            if found.is_tree() {
                let old_ids = olds
                    .iter()
                    .filter(|(_, k)| *k == Kind::Tree)
                    .map(|(id, _)| *id)
                    .collect();
                stack.push((entry.id(), old_ids, found.path.clone()));
            }
            out.push(found);
        }
    }
    Ok(out)
}

/// Calls `visit` with the path and entry of every entry of `tree`, at any
/// depth (iterative; names as bytes, which git2's own walk cannot give when
/// one is not UTF-8).
pub(super) fn walk_tree(
    repo: &Repository,
    tree: &git2::Tree<'_>,
    mut visit: impl FnMut(&[u8], &git2::TreeEntry<'_>),
) -> Result<(), git2::Error> {
    let mut stack: Vec<(Oid, Vec<u8>)> = vec![(tree.id(), Vec::new())];
    while let Some((id, prefix)) = stack.pop() {
        let tree = repo.find_tree(id)?;
        for entry in tree.iter() {
            let path = joined(&prefix, entry.name_bytes());
            visit(&path, &entry);
            if entry.kind() == Some(ObjectType::Tree) {
                stack.push((entry.id(), path));
            }
        }
    }
    Ok(())
}

/// `path` as a [`Path`] (its bytes, whatever they are).
pub(super) fn as_path(path: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(path))
}

/// The [`FileMode`] a tree update writes for an entry recorded with `raw`:
/// git's own modes kept, any other blob mode written as a regular file's.
pub(super) fn update_mode(raw: i32) -> FileMode {
    match raw {
        0o100755 => FileMode::BlobExecutable,
        0o120000 => FileMode::Link,
        0o040000 => FileMode::Tree,
        GITLINK => FileMode::Commit,
        _ => FileMode::Blob,
    }
}

fn joined(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = prefix.to_vec();
    if !path.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig() -> git2::Signature<'static> {
        git2::Signature::now("t", "t@example.invalid").unwrap()
    }

    /// A commit of a tree of `entries` (name bytes, blob content, raw
    /// mode). libgit2 writes only git's own modes: the suite's agents write
    /// the others (`0`, `100600`, `100664`) with `git mktree`
    /// (tests/suite/harvest_edges.rs).
    fn commit_of(
        repo: &Repository,
        entries: &[(&[u8], &[u8], i32)],
        parent: Option<&git2::Commit<'_>>,
    ) -> Oid {
        let mut builder = repo.treebuilder(None).unwrap();
        for (name, content, mode) in entries {
            let blob = repo.blob(content).unwrap();
            builder.insert(as_path(name), blob, *mode).unwrap();
        }
        let tree = repo.find_tree(builder.write().unwrap()).unwrap();
        let parents: Vec<&git2::Commit<'_>> = parent.into_iter().collect();
        repo.commit(None, &sig(), &sig(), "m", &tree, &parents)
            .unwrap()
    }

    #[test]
    fn entries_of_any_mode_and_name_are_brought_and_unchanged_ones_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let first = commit_of(&repo, &[(b"same.txt", b"same", 0o100644)], None);
        let first = repo.find_commit(first).unwrap();
        let second = commit_of(
            &repo,
            &[
                (b"same.txt", b"same", 0o100644),
                (b"caf\xe9.bin", b"latin-1 name", 0o100644),
                (b"run.sh", b"executable", 0o100755),
                (b"link", b"target", 0o120000),
            ],
            Some(&first),
        );
        let brought = brought_by(&repo, &repo.find_commit(second).unwrap()).unwrap();
        let mut paths: Vec<(&[u8], bool)> = brought
            .iter()
            .map(|b| (b.path.as_slice(), b.is_blob()))
            .collect();
        paths.sort();
        assert_eq!(
            paths,
            vec![
                (&b"caf\xe9.bin"[..], true),
                (&b"link"[..], true),
                (&b"run.sh"[..], true),
            ]
        );
        assert!(brought.iter().any(|b| b.mode == 0o120000));
    }
}
