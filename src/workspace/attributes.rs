//! The `filter` attribute of the paths the harvest may commit, as git reads
//! it (PROTOCOL.md 4.5): libgit2 runs no filter, so a path with one is left
//! out (LFS's, or another driver's: `git-crypt`, transcrypt).
//!
//! git itself answers (`git check-attr --stdin -z filter`, once per harvest
//! for every changed path): libgit2's attributes differ from git's where it
//! matters, and each difference pushed plaintext a filter was meant to
//! encrypt (found by two reviews, issue 33: C-quoted patterns, which libgit2
//! does not read; `**` after a literal prefix; and, in a reader of our own
//! that tried to close those, POSIX classes, macro redefinitions, the lines
//! git ignores whole, and an exponential `**` search). git runs as the
//! runner's git work runs (the calling thread's identity: the agent user's
//! with `--agent-user`), with no system or global configuration and no
//! global attributes file, bounded by [`BOUND`]. When it cannot answer (no
//! git, a time-out, an answer that does not parse), libgit2's answer is
//! used, and the log says so.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use git2::{AttrCheckFlags, AttrValue, Repository};

/// How long `git check-attr` may take for one harvest: well within the
/// harvest's own bound (60 s; 10 s on a graceful stop), since a FIFO the
/// agent left where git reads an attributes file blocks it until then.
const BOUND: Duration = Duration::from_secs(3);

/// The filter git would run on a path when it is added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Filter {
    /// None (no `filter`, or set or unset without a driver).
    None,
    /// Git LFS's (`filter=lfs`).
    Lfs,
    /// Another driver's.
    Other(String),
}

impl Filter {
    fn of_driver(driver: Option<&[u8]>) -> Filter {
        match driver {
            None => Filter::None,
            Some(b"lfs") => Filter::Lfs,
            Some(d) => Filter::Other(String::from_utf8_lossy(d).into_owned()),
        }
    }
}

/// git's answers for the paths of one harvest.
pub(super) struct Filters {
    known: HashMap<Vec<u8>, Filter>,
}

impl Filters {
    /// Asks git once for `paths` (relative to `repo`'s work tree).
    pub(super) fn read(repo: &Repository, paths: &[&[u8]]) -> Filters {
        let known = match repo.workdir() {
            Some(_) if paths.is_empty() => HashMap::new(),
            None => HashMap::new(),
            Some(workdir) => match check_attr(workdir, repo.path(), paths) {
                Ok(known) => known,
                Err(e) => {
                    tracing::warn!(error = %e, "harvest: git check-attr gave no answer; libgit2's reading of the attributes is used (it misses quoted patterns)");
                    HashMap::new()
                }
            },
        };
        Filters { known }
    }

    /// The filter of `path`: git's answer, else libgit2's.
    pub(super) fn of(&self, repo: &Repository, path: &Path) -> Filter {
        if let Some(f) = self.known.get(path.as_os_str().as_bytes()) {
            return f.clone();
        }
        let value = repo
            .get_attr_bytes(path, "filter", AttrCheckFlags::FILE_THEN_INDEX)
            .ok()
            .flatten();
        match AttrValue::from_bytes(value) {
            AttrValue::String(s) => Filter::of_driver(Some(s.as_bytes())),
            AttrValue::Bytes(b) => Filter::of_driver(Some(b)),
            _ => Filter::None,
        }
    }
}

/// `git check-attr --stdin -z filter` for `paths` of the work tree
/// `workdir`, bounded. git reads the work tree's attributes files, the
/// index of `git_dir` (its fallback when a work tree lacks one) and a copy
/// of `git_dir`'s `info/attributes`, in a git directory of its own: not
/// the repository's configuration, which is the agent's (whatever it
/// includes or leads to, a FIFO say, PROTOCOL.md 4.5).
fn check_attr(
    workdir: &Path,
    git_dir: &Path,
    paths: &[&[u8]],
) -> Result<HashMap<Vec<u8>, Filter>, String> {
    let own = tempfile::tempdir().map_err(|e| format!("cannot make a git directory: {e}"))?;
    let made = (|| {
        std::fs::create_dir_all(own.path().join("objects"))?;
        std::fs::create_dir_all(own.path().join("refs"))?;
        std::fs::create_dir_all(own.path().join("info"))?;
        std::fs::write(own.path().join("HEAD"), "ref: refs/heads/main\n")?;
        std::fs::write(
            own.path().join("config"),
            "[core]\n\trepositoryformatversion = 0\n\tbare = false\n",
        )?;
        if let Some(text) = read_small(&git_dir.join("info").join("attributes")) {
            std::fs::write(own.path().join("info").join("attributes"), text)?;
        }
        std::io::Result::Ok(())
    })();
    made.map_err(|e| format!("cannot make a git directory: {e}"))?;
    let mut cmd = Command::new("git");
    cmd.arg("--git-dir")
        .arg(own.path())
        .arg("--work-tree")
        .arg(workdir)
        .arg("-C")
        .arg(workdir)
        // No attributes file of the user's outside the repository (the
        // runner's HOME is not the agent's; the agent's global file is not
        // the repository's contract).
        .args(["-c", "core.attributesFile=/dev/null"])
        .args(["check-attr", "--stdin", "-z", "filter"])
        .env("GIT_INDEX_FILE", git_dir.join("index"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0");
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_COMMON_DIR",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_ATTR_SOURCE",
        "GIT_ATTR_NOSYSTEM",
    ] {
        cmd.env_remove(var);
    }
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // A group of its own: a time-out kills it whole.
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| format!("cannot run git: {e}"))?;
    let mut stdin = child.stdin.take().ok_or("git check-attr has no stdin")?;
    let input: Vec<u8> = paths
        .iter()
        .flat_map(|p| p.iter().copied().chain(std::iter::once(0)))
        .collect();
    // Written while its answer is read: git answers as it reads, and a pipe
    // holds only so much. Its answer is bounded by what it is asked.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let output = super::submodules::wait_bounded(child, BOUND, &AtomicBool::new(false), u64::MAX)
        .map_err(|e| format!("git check-attr: {e}"));
    let _ = writer.join();
    let output = output?;
    if !output.status.success() {
        return Err(format!("git check-attr failed ({})", output.status));
    }
    let out = output.stdout;
    parse(&out, paths.len())
}

/// A regular file of at most 1 MiB (never a FIFO or a device the agent put
/// there), read.
fn read_small(path: &Path) -> Option<Vec<u8>> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    (meta.is_file() && meta.len() <= 1 << 20)
        .then(|| std::fs::read(path).ok())
        .flatten()
}

/// `<path> NUL filter NUL <value> NUL` for each path; the value is
/// `unspecified`, `set`, `unset` (no driver) or the driver's name.
fn parse(out: &[u8], expected: usize) -> Result<HashMap<Vec<u8>, Filter>, String> {
    let fields: Vec<&[u8]> = out.split(|b| *b == 0).collect();
    let mut known = HashMap::new();
    for triple in fields.chunks_exact(3) {
        let (path, value) = (triple[0], triple[2]);
        let driver = match value {
            b"unspecified" | b"set" | b"unset" => None,
            d => Some(d),
        };
        known.insert(path.to_vec(), Filter::of_driver(driver));
    }
    if known.len() < expected.min(1) {
        return Err("git check-attr's answer does not parse".to_string());
    }
    Ok(known)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let ok = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .status()
            .unwrap()
            .success();
        assert!(ok, "git {args:?}");
    }

    /// What libgit2 got wrong, and a reader of our own after it (issue 33's
    /// reviews), answered as git answers.
    #[test]
    fn filters_are_what_git_says() {
        let dir = tempfile::tempdir().unwrap();
        git(dir.path(), &["init", "-q"]);
        std::fs::write(
            dir.path().join(".gitattributes"),
            concat!(
                "\"*.env\" filter=crypt\n",
                "\"my secret.txt\" filter=crypt\n",
                "\"secret[[:digit:]].key\" filter=crypt\n",
                "config/keys**/*.pem filter=crypt\n",
                "*.psd filter=lfs\n",
                "small.psd -filter\n",
                "notes.txt filter\n",
                "\"x.env\" -filter # a comment makes git ignore the line\n",
                "[attr]sec -filter\n[attr]sec filter=crypt\n*.sec sec\n",
            ),
        )
        .unwrap();
        // Read from the repository's info/attributes too (copied).
        std::fs::write(
            dir.path().join(".git/info/attributes"),
            "*.info filter=crypt\n",
        )
        .unwrap();
        let repo = Repository::open(dir.path()).unwrap();
        let paths: Vec<&[u8]> = vec![
            b"prod.env",
            b"x.env",
            b"my secret.txt",
            b"secret1.key",
            b"config/keys/a/b.pem",
            b"big.psd",
            b"small.psd",
            b"notes.txt",
            b"a.sec",
            b"x.info",
            b"caf\xe9.txt",
            b"plain.md",
        ];
        let filters = Filters::read(&repo, &paths);
        let of = |p: &[u8]| filters.of(&repo, Path::new(std::ffi::OsStr::from_bytes(p)));
        let crypt = Filter::Other("crypt".into());
        for p in [
            &b"prod.env"[..],
            b"x.env",
            b"my secret.txt",
            b"secret1.key",
            b"config/keys/a/b.pem",
            b"a.sec",
            b"x.info",
        ] {
            assert_eq!(of(p), crypt, "{}", String::from_utf8_lossy(p));
        }
        assert_eq!(of(b"big.psd"), Filter::Lfs);
        for p in [&b"small.psd"[..], b"notes.txt", b"caf\xe9.txt", b"plain.md"] {
            assert_eq!(of(p), Filter::None, "{}", String::from_utf8_lossy(p));
        }
        // libgit2 alone (a path git was not asked about) misses the quoted
        // pattern: what the harvest falls back to without git.
        assert_eq!(of(b"other.env"), Filter::None);
    }
}
