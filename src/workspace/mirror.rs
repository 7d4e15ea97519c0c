//! The git mirror of `--git-mirror-dir` (PROTOCOL.md 3, "Git mirror"): a
//! fresh clone borrows the objects of a pre-warmed bare repository the image
//! or a volume provides, and fetches only what is new.
//!
//! The mirror of a clone URL ending `…/{owner}/{name}.git` is
//! `{dir}/{owner}/{name}.git` (what `git clone --mirror <url>
//! {dir}/{owner}/{name}.git` makes). A fresh clone copies the mirror's pack
//! files (each `.pack` with its `.idx`, regular files only) into
//! `repo/.git/objects/pack/`, offers the mirror's branch tips to the
//! server as `have`s (through refs under [`HAVE_REFS`], removed after the
//! fetch) and fetches the session branch at depth 1 as without a mirror:
//! the server sends only the objects the mirror lacks.
//!
//! Copied, not borrowed through `objects/info/alternates` (`--reference
//! --dissociate`, not `--reference`): the clone is complete on its own, so
//! a mirror that vanishes or changes later (a volume detached, an image
//! updated between a boot and its restart) never breaks `repo/`, the
//! harvest or the reuse at a restart; the agent user never needs to read
//! the mirror; the harvest's push sees an ordinary repository. Only the
//! runner reads the mirror, as files: nothing is written there, no git
//! runs there, no credential goes near it. Loose objects of the mirror are
//! not copied (run `git repack -a -d` after updating a mirror).
//!
//! A mirror that is absent is logged (`info`) and the clone is plain; one
//! that cannot be used (no branch, no pack, unreadable, its tips not in its
//! packs) is logged (`warn`) with the reason and the clone is plain; a
//! clone from a mirror that fails later (a corrupt pack found by the fetch
//! or the checkout, both of which verify every object they read) is removed
//! and done again plainly in the same attempt ([`falls_back`]).

use std::path::{Path, PathBuf};

use git2::{Oid, Repository};

use super::WorkspaceError;

/// Where the mirror's branch tips are while the fetch negotiates (libgit2
/// offers local refs as `have`s); removed after the fetch.
pub const HAVE_REFS: &str = "refs/hosted-boot/mirror/";

/// At most this many of the mirror's branch tips are offered.
const MAX_TIPS: usize = 32;

/// The mirror of `remote_url` in `dir`: `{dir}/{owner}/{name}.git`, from
/// the URL's last two path segments (`.git` added when the name lacks it).
/// `None` for a URL with fewer than two segments or a segment that is not
/// a plain name (`.`, `..`, empty).
pub fn mirror_path(dir: &Path, remote_url: &str) -> Option<PathBuf> {
    let url = reqwest::Url::parse(remote_url).ok()?;
    let mut segments = url.path_segments()?.filter(|s| !s.is_empty()).rev();
    let name = segments.next()?;
    let owner = segments.next()?;
    let plain = |s: &str| s != "." && s != ".." && !s.contains(['/', '\\', '\0']);
    if !plain(name) || !plain(owner) {
        return None;
    }
    let name = if name.ends_with(".git") {
        name.to_string()
    } else {
        format!("{name}.git")
    };
    Some(dir.join(owner).join(name))
}

/// The mirror a fresh clone of `remote_url` uses, if `dir` is set and holds
/// one; an absent one is logged.
pub fn for_clone(dir: Option<&Path>, remote_url: &str) -> Option<PathBuf> {
    let dir = dir?;
    let Some(path) = mirror_path(dir, remote_url) else {
        tracing::info!(dir = %dir.display(), "no git mirror for this clone URL: plain clone");
        return None;
    };
    if path.is_dir() {
        Some(path)
    } else {
        tracing::info!(mirror = %path.display(), "git mirror absent: plain clone");
        None
    }
}

/// Copies the mirror's packs into `repo` and adds its branch tips under
/// [`HAVE_REFS`]; returns whether the mirror is used. A mirror that cannot
/// be used is logged with the reason, and whatever was copied removed.
pub fn seed(repo: &Repository, mirror: &Path) -> bool {
    let mut copied = Vec::new();
    match try_seed(repo, mirror, &mut copied) {
        Ok((packs, bytes, tips)) => {
            tracing::info!(mirror = %mirror.display(), packs, bytes, tips, "git mirror used");
            true
        }
        Err(reason) => {
            for path in copied {
                let _ = std::fs::remove_file(path);
            }
            drop_have_refs(repo);
            tracing::warn!(mirror = %mirror.display(), reason = %reason, "git mirror unusable: plain clone");
            false
        }
    }
}

fn try_seed(
    repo: &Repository,
    mirror: &Path,
    copied: &mut Vec<PathBuf>,
) -> Result<(usize, u64, usize), String> {
    let tips = branch_tips(mirror)?;
    if tips.is_empty() {
        return Err("it has no branch".into());
    }
    let dest = repo.path().join("objects/pack");
    let (packs, bytes) = copy_packs(&mirror.join("objects/pack"), &dest, copied)?;
    if packs == 0 {
        return Err("it has no pack file (objects/pack/*.pack with its .idx)".into());
    }
    repo.odb()
        .and_then(|odb| odb.refresh())
        .map_err(|e| format!("its packs cannot be read: {}", e.message()))?;
    let mut offered = 0;
    for oid in tips {
        if repo.find_commit(oid).is_ok() {
            repo.reference(
                &format!("{HAVE_REFS}{offered}"),
                oid,
                true,
                "hosted-boot: a git mirror tip",
            )
            .map_err(|e| format!("cannot record its tips: {}", e.message()))?;
            offered += 1;
        }
    }
    if offered == 0 {
        return Err("none of its branch tips is in its packs".into());
    }
    Ok((packs, bytes, offered))
}

/// Removes the refs under [`HAVE_REFS`] (best effort: they only steer the
/// negotiation).
pub fn drop_have_refs(repo: &Repository) {
    let Ok(refs) = repo.references_glob(&format!("{HAVE_REFS}*")) else {
        return;
    };
    for mut r in refs.flatten() {
        let _ = r.delete();
    }
}

/// Whether a failed clone from a mirror is done again without it: not
/// when the server gave the verdict (no session branch) or the transport
/// failed in a way the retry rule repeats (the next attempt uses the
/// mirror again); otherwise the mirror may be the cause (a corrupt pack).
pub fn falls_back(error: &WorkspaceError, transient: bool) -> bool {
    !transient && !matches!(error, WorkspaceError::SessionBranchMissing { .. })
}

/// The mirror's branch tips: `packed-refs` lines under `refs/heads/`, then
/// loose refs under `refs/heads/` (which win), at most [`MAX_TIPS`].
fn branch_tips(mirror: &Path) -> Result<Vec<Oid>, String> {
    let mut tips: Vec<(String, Oid)> = Vec::new();
    match read_ref_file(&mirror.join("packed-refs"), MAX_PACKED_REFS) {
        Ok(text) => {
            for line in text.lines() {
                if line.starts_with('#') || line.starts_with('^') {
                    continue;
                }
                if let Some((oid, name)) = line.split_once(' ')
                    && name.starts_with("refs/heads/")
                    && let Ok(oid) = Oid::from_str(oid)
                {
                    tips.push((name.to_string(), oid));
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read its packed-refs: {e}")),
    }
    loose_refs(&mirror.join("refs/heads"), "refs/heads", &mut tips, 0)?;
    // A loose ref replaces its packed value (git's rule).
    let mut seen = std::collections::HashMap::new();
    for (name, oid) in tips {
        seen.insert(name, oid);
    }
    let mut oids: Vec<Oid> = seen.into_values().collect();
    oids.sort();
    oids.dedup();
    oids.truncate(MAX_TIPS);
    Ok(oids)
}

/// Bound on a mirror's `packed-refs`, in bytes (64 MiB: millions of refs).
const MAX_PACKED_REFS: u64 = 64 << 20;
/// Bound on a loose ref file, in bytes (an id, or `ref: …`, and a newline).
const MAX_LOOSE_REF: u64 = 4096;

/// The text of a ref file of the mirror: a regular file (no link followed,
/// so a FIFO or `/dev/zero` behind a link cannot block or fill the runner)
/// of at most `cap` bytes.
///
/// Errors: not a regular file, over `cap`, or unreadable (`NotFound` when
/// absent).
fn read_ref_file(path: &Path, cap: u64) -> std::io::Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    if meta.len() > cap {
        return Err(std::io::Error::other(format!("over {cap} bytes")));
    }
    let mut text = String::new();
    file.take(cap).read_to_string(&mut text)?;
    Ok(text)
}

fn loose_refs(
    dir: &Path,
    prefix: &str,
    out: &mut Vec<(String, Oid)>,
    depth: usize,
) -> Result<(), String> {
    if depth > 8 {
        return Ok(());
    }
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let name = entry.file_name().to_string_lossy().into_owned();
        let full = format!("{prefix}/{name}");
        if kind.is_dir() {
            loose_refs(&entry.path(), &full, out, depth + 1)?;
        } else if kind.is_file()
            && let Ok(text) = read_ref_file(&entry.path(), MAX_LOOSE_REF)
            && let Ok(oid) = Oid::from_str(text.trim())
        {
            out.push((full, oid));
        }
    }
    Ok(())
}

/// Copies each `*.pack` of `from` that has its `*.idx` (both regular
/// files, no link followed) into `to`: the pack first, then its index
/// (libgit2 finds packs by their index), each through a temporary name.
/// Returns the packs and bytes copied; `copied` lists what is in `to`.
fn copy_packs(from: &Path, to: &Path, copied: &mut Vec<PathBuf>) -> Result<(usize, u64), String> {
    let entries =
        std::fs::read_dir(from).map_err(|e| format!("cannot read {}: {e}", from.display()))?;
    let regular = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file());
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".pack") && !n.starts_with('.'))
        .collect();
    names.sort();
    let (mut packs, mut bytes) = (0, 0);
    for pack in names {
        let stem = pack.trim_end_matches(".pack");
        let idx = format!("{stem}.idx");
        if !regular(&from.join(&pack)) || !regular(&from.join(&idx)) {
            continue;
        }
        for file in [&pack, &idx] {
            let tmp = to.join(format!("tmp_mirror_{file}"));
            copied.push(tmp.clone());
            bytes += std::fs::copy(from.join(file), &tmp)
                .map_err(|e| format!("cannot copy {}: {e}", from.join(file).display()))?;
            let target = to.join(file);
            std::fs::rename(&tmp, &target)
                .map_err(|e| format!("cannot copy {}: {e}", from.join(file).display()))?;
            copied.push(target);
        }
        packs += 1;
    }
    Ok((packs, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tester's break: a `packed-refs` linked to `/dev/zero` filled the
    /// runner's memory, and one that is a FIFO hung the clone. Both are
    /// refused at once now, as is one over its cap.
    #[test]
    fn a_packed_refs_that_is_a_link_a_fifo_or_too_large_is_refused_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let m = tmp.path();
        std::os::unix::fs::symlink("/dev/zero", m.join("packed-refs")).unwrap();
        assert!(branch_tips(m).is_err());
        std::fs::remove_file(m.join("packed-refs")).unwrap();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            m.join("packed-refs"),
            rustix::fs::Mode::RUSR,
        )
        .unwrap();
        assert!(branch_tips(m).is_err());
        std::fs::remove_file(m.join("packed-refs")).unwrap();
        let f = std::fs::File::create(m.join("packed-refs")).unwrap();
        f.set_len(MAX_PACKED_REFS + 1).unwrap();
        assert!(branch_tips(m).is_err());
    }

    #[test]
    fn the_mirror_is_named_after_the_clone_urls_last_two_segments() {
        let dir = Path::new("/m");
        let p = |u: &str| mirror_path(dir, u);
        assert_eq!(
            p("https://github.com/acme/app.git"),
            Some(PathBuf::from("/m/acme/app.git"))
        );
        assert_eq!(
            p("http://127.0.0.1:8080/git/acme/app.git"),
            Some(PathBuf::from("/m/acme/app.git"))
        );
        assert_eq!(
            p("https://git.example/acme/app"),
            Some(PathBuf::from("/m/acme/app.git"))
        );
        assert_eq!(p("https://git.example/app.git"), None);
        assert_eq!(p("https://git.example/%2e%2e/app.git"), None);
        assert_eq!(p("not a url"), None);
    }
}
