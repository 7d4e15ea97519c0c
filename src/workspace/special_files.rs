//! Special files the agent can plant where the runner's git opens a file
//! (issue 31): libgit2 opens what it reads without `O_NONBLOCK`, so a FIFO
//! at such a place blocks the runner's git work in `open(2)`, which no
//! bound can cancel, with the lock on `repo/` held (the turn ended
//! `harvest_timeout` with nothing pushed, and the next turn never sealed).
//!
//! Before each of the runner's holds on `repo/` (no agent process runs
//! then), [`clear`] removes every FIFO, socket or device, or link to one:
//! - anywhere in `repo/.git`, through linked directories too (a linked
//!   `.git/refs/heads` holding a FIFO ref), however far they lead, each
//!   directory walked once;
//! - in the work tree, at the names git opens by name in every directory
//!   it visits (`.gitignore`, `.gitattributes`; `.gitmodules`): git never
//!   tracks a special file, so nothing the harvest would commit goes.
//!
//! A special file cannot hold the agent's work: it is a pipe, a socket or a
//! device. What cannot be removed (in a directory the runner may not
//! write, acting as the agent user) refuses the runner's git work, naming
//! it.

use std::collections::HashSet;
use std::fs::FileType;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The names git opens in each work tree directory it visits.
const OPENED_BY_NAME: &[&str] = &[".gitignore", ".gitattributes", ".gitmodules"];

/// Directories walked behind links in `.git` at most: a link to `/` is
/// refused, not walked.
const MAX_DIRS: usize = 50_000;

/// What a removed entry was, for the log.
pub fn kind_name(kind: FileType) -> &'static str {
    if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else {
        "a special file"
    }
}

/// Opens the FIFO `path` for reading and writing without blocking (Linux
/// opens a FIFO so at once), until the returned file is dropped: a reader
/// blocked opening it (a checkpoint's git, before its watcher gets to it)
/// returns, and one that opens it meanwhile does not block; once the FIFO
/// is unlinked and this is closed they read the end of the file. Unlinked
/// alone, no one could open its other end by name any more, and a reader
/// already waiting would wait for good, holding `repo/` (found by a
/// review).
fn hold_open(path: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .ok()
}

fn special(kind: FileType) -> bool {
    !(kind.is_file() || kind.is_dir() || kind.is_symlink())
}

/// Removes the special files of `repo_dir` that the runner's git would
/// open (see the module documentation); returns each one removed, with what
/// it was.
///
/// Errors: `.git` is not a directory, one cannot be removed, or `.git`
/// leads (through links) to more than 50,000 directories; the message
/// names the path and what to do.
pub fn clear(repo_dir: &Path) -> Result<Vec<(PathBuf, &'static str)>, Blocked> {
    clear_all(repo_dir).map_err(Blocked)
}

/// A special file or link in `repo/` that keeps the runner's git from
/// running (the message names it and what to do).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Blocked(pub String);

fn clear_all(repo_dir: &Path) -> Result<Vec<(PathBuf, &'static str)>, String> {
    let git = repo_dir.join(".git");
    match std::fs::symlink_metadata(&git) {
        Ok(m) if m.is_dir() => {}
        // No repository yet (a fresh clone makes it): nothing to clear.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Ok(_) => {
            return Err(format!(
                "{} is not a directory: the runner does not open it (the agent may have left it there to block git); make it the repository's directory again",
                git.display()
            ));
        }
        Err(e) => return Err(format!("cannot read {}: {e}", git.display())),
    }
    let mut removed = Vec::new();
    let mut remove = |path: &Path, kind: FileType| -> Result<(), String> {
        // Held open (both ends) until it is unlinked: see `hold_open`.
        let _held = kind.is_fifo().then(|| hold_open(path)).flatten();
        std::fs::remove_file(path).map_err(|e| {
            format!(
                "{} is {}, which would block the runner's git, and cannot be removed ({e}); remove it",
                path.display(),
                kind_name(kind)
            )
        })?;
        removed.push((path.to_path_buf(), kind_name(kind)));
        Ok(())
    };
    // All of .git, through linked directories, each directory once.
    let mut seen = HashSet::new();
    let mut stack = vec![git.clone()];
    while let Some(dir) = stack.pop() {
        let meta =
            std::fs::metadata(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        if !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        if seen.len() > MAX_DIRS {
            return Err(format!(
                "{} leads to more than {MAX_DIRS} directories (through links): the runner does not walk it; remove the links from repo/.git",
                git.display()
            ));
        }
        for (path, kind) in read_dir(&dir)? {
            let Some(target) = opened(&path, kind) else {
                continue;
            };
            if target.is_dir() {
                stack.push(path);
            } else if special(target) {
                remove(&path, target)?;
            }
        }
    }
    // The work tree, as git walks it: not into links, not into .git.
    let mut stack = vec![repo_dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for (path, kind) in read_dir(&dir)? {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if kind.is_dir() {
                if name != ".git" {
                    stack.push(path);
                }
                continue;
            }
            if !OPENED_BY_NAME.contains(&name) {
                continue;
            }
            let Some(target) = opened(&path, kind) else {
                continue;
            };
            if special(target) {
                remove(&path, target)?;
            }
        }
    }
    Ok(removed)
}

/// What opening `path` (an entry of type `kind`) would open: a link's
/// target; `None` for a dangling link, which opens nothing.
fn opened(path: &Path, kind: FileType) -> Option<FileType> {
    if kind.is_symlink() {
        std::fs::metadata(path).ok().map(|m| m.file_type())
    } else {
        Some(kind)
    }
}

/// The entries of `dir` with their own types (links not followed).
fn read_dir(dir: &Path) -> Result<Vec<(PathBuf, FileType)>, String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let kind = entry
            .file_type()
            .map_err(|e| format!("cannot read {}: {e}", entry.path().display()))?;
        out.push((entry.path(), kind));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fifo(path: &Path) {
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            path,
            rustix::fs::Mode::from_raw_mode(0o644),
        )
        .unwrap();
    }

    #[test]
    fn fifos_where_git_opens_files_go_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join("repo");
        let outside = root.path().join("heads");
        std::fs::create_dir_all(repo.join(".git/refs")).unwrap();
        std::fs::create_dir_all(repo.join("sub/deeper")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        fifo(&repo.join(".gitignore"));
        fifo(&repo.join("sub/deeper/.gitattributes"));
        fifo(&repo.join("sub/a-pipe-the-project-keeps"));
        fifo(&repo.join(".git/config"));
        fifo(&outside.join("stuck"));
        std::fs::write(outside.join("main"), "0000\n").unwrap();
        std::os::unix::fs::symlink(&outside, repo.join(".git/refs/heads")).unwrap();
        // A loop through links is walked once.
        std::os::unix::fs::symlink(repo.join(".git"), outside.join("loop")).unwrap();
        std::os::unix::fs::symlink(
            repo.join("sub/a-pipe-the-project-keeps"),
            repo.join("sub/.gitmodules"),
        )
        .unwrap();
        let mut removed: Vec<String> = clear(&repo)
            .unwrap()
            .into_iter()
            .map(|(p, k)| format!("{} {k}", p.strip_prefix(&repo).unwrap().display()))
            .collect();
        removed.sort();
        assert_eq!(
            removed,
            vec![
                ".git/config a FIFO",
                ".git/refs/heads/stuck a FIFO",
                ".gitignore a FIFO",
                "sub/.gitmodules a FIFO",
                "sub/deeper/.gitattributes a FIFO",
            ]
        );
        assert!(!outside.join("stuck").exists());
        assert!(outside.join("main").exists());
        // Git ignores it; the runner opens no such name.
        assert!(std::fs::symlink_metadata(repo.join("sub/a-pipe-the-project-keeps")).is_ok());
        assert_eq!(clear(&repo).unwrap(), Vec::new());
    }
}
