//! `repo/.git/config` is the agent's (issue 31): nothing in it may change
//! what the runner's git work contacts, runs or opens. libgit2 applies a
//! repository's configuration as it goes (`url.<x>.insteadOf` rewrote the
//! runner's push URL, and every later sync and harvest of the boot failed
//! `push_failed`; `core.excludesFile`, `core.attributesFile` and the
//! `http.*` settings name files and hosts), so the runner opens `repo/`
//! with [`open`]: as a bare repository (its `core.worktree` and
//! `core.bare` never read), `repo/` set as the work tree, and an empty
//! configuration in place of the agent's before any other work. The
//! runner's own values (its identity, its remote) are passed explicitly.
//!
//! libgit2 still reads the file as it opens the repository (its format
//! version), with the files it includes (`include.path`,
//! `includeIf.*.path`): [`check_includes`] refuses, before that, an include
//! that is a device or a regular file over 1 MiB (`/dev/zero` would fill the
//! runner's memory, a terminal could block its open). A FIFO is let through:
//! the watcher of the runner's git opens ([`super::unblock`]) unblocks it,
//! and it reads as empty, so the work goes on. What an included file says
//! is read, as the agent user, and unused.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use git2::{Config, Repository, RepositoryOpenFlags};

/// Largest file libgit2 may read as configuration for the runner.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Include depth libgit2 follows at most.
const MAX_DEPTH: usize = 10;

/// Opens `repo_dir` for the runner's git work (see the module
/// documentation).
///
/// Errors: libgit2's, when it cannot be opened.
pub fn open(repo_dir: &Path) -> Result<Repository, git2::Error> {
    let repo = open_bare(&repo_dir.join(".git"))?;
    repo.set_workdir(repo_dir, false)?;
    Ok(repo)
}

/// `git_dir` opened as a bare repository, found nowhere else, with an empty
/// configuration in place of its own.
fn open_bare(git_dir: &Path) -> Result<Repository, git2::Error> {
    let repo = Repository::open_ext(
        git_dir,
        RepositoryOpenFlags::NO_SEARCH | RepositoryOpenFlags::BARE,
        std::iter::empty::<&std::ffi::OsStr>(),
    )?;
    repo.set_config(&Config::new()?)?;
    Ok(repo)
}

/// Refuses a `repo/.git/config` whose includes libgit2 must not read (see
/// the module documentation), or that is itself too large.
///
/// Errors: the first such file, named, with what to do.
pub fn check_includes(repo_dir: &Path) -> Result<(), Refused> {
    check_config(repo_dir.join(".git").join("config")).map_err(Refused)
}

/// A repository configuration the runner's git does not read, or a git
/// directory it cannot open (the message names the file and what to do).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Opens the git directory `git_dir` of a repository inside `repo/` (a
/// submodule's, an embedded one's) to read its objects and refs, as
/// [`open`] opens `repo/`: its configuration checked first, then replaced
/// by an empty one, no work tree.
///
/// Errors: what [`check_includes`] refuses, or libgit2's message.
pub fn open_git_dir(git_dir: &Path) -> Result<Repository, Refused> {
    check_config(git_dir.join("config")).map_err(Refused)?;
    open_bare(git_dir).map_err(|e| Refused(super::harvest::message(&e)))
}

/// The `path` of every `[submodule "…"]` entry of a `.gitmodules` text,
/// read as [`include_paths`] reads a configuration.
pub fn gitmodules_paths(text: &str) -> Vec<String> {
    values_of(text, &["submodule"], "path")
}

/// [`check_includes`] from the configuration file `config`.
fn check_config(config: PathBuf) -> Result<(), String> {
    let mut pending = vec![(config, 0)];
    while let Some((file, depth)) = pending.pop() {
        let meta = match std::fs::metadata(&file) {
            Ok(m) => m,
            // libgit2 skips an include it cannot find.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(format!("cannot read {}: {e}", file.display())),
        };
        let kind = meta.file_type();
        // A FIFO (the watcher unblocks it: it reads as empty) or a socket
        // (its open fails at once) holds no include to follow.
        if kind.is_fifo() || kind.is_socket() {
            continue;
        }
        if !meta.is_file() || meta.len() > MAX_CONFIG_BYTES {
            let what = if meta.is_file() {
                format!("{} bytes", meta.len())
            } else {
                super::special_files::kind_name(kind).to_string()
            };
            return Err(format!(
                "{} is {what}, not a regular file of at most 1 MiB: the runner does not read it as git configuration (it could block or fill the runner's git); remove it, or the include that names it from repo/.git/config",
                file.display()
            ));
        }
        if depth == MAX_DEPTH {
            continue;
        }
        let text =
            std::fs::read(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let base = file.parent().unwrap_or(Path::new("/")).to_path_buf();
        for path in include_paths(&String::from_utf8_lossy(&text)) {
            pending.push((resolve(&base, &path), depth + 1));
        }
    }
    Ok(())
}

/// An include's path as libgit2 resolves it: `~/` in `HOME`, a relative
/// path from the including file's directory.
fn resolve(base: &Path, path: &str) -> PathBuf {
    match path.strip_prefix("~/") {
        Some(rest) => std::env::var_os("HOME")
            .map_or_else(|| PathBuf::from("/"), PathBuf::from)
            .join(rest),
        None => base.join(path),
    }
}

/// The `path` values of the `include` and `includeIf` sections of a git
/// configuration file, read as libgit2 reads them: a byte-order mark
/// skipped, a line ending in `\` continued on the next, several section
/// headers on one line, a key on its section's line, case, quotes and
/// escapes. Over-inclusive when in doubt: a value is checked, not trusted.
fn include_paths(text: &str) -> Vec<String> {
    values_of(text, &["include", "includeif"], "path")
}

/// The values of `key` in the sections named `sections` (lower case; a
/// subsection, quoted or after a dot, is ignored) of a configuration text,
/// read as [`include_paths`] says.
fn values_of(text: &str, sections: &[&str], key: &str) -> Vec<String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut out = Vec::new();
    let mut in_section = false;
    let mut lines = text.split('\n');
    while let Some(first) = lines.next() {
        let mut line = first.trim_end_matches('\r').to_string();
        // A continuation: an odd number of backslashes at the end.
        while (line.len() - line.trim_end_matches('\\').len()) % 2 == 1 {
            line.pop();
            match lines.next() {
                Some(next) => line.push_str(next.trim_end_matches('\r')),
                None => break,
            }
        }
        let mut rest = line.trim_start();
        while rest.starts_with('[') {
            let Some(end) = rest.find(']') else {
                in_section = false;
                rest = "";
                break;
            };
            let header = rest.get(1..end).unwrap_or("").trim_start();
            let name = header
                .split(|c: char| c.is_whitespace() || c == '"' || c == '.')
                .next()
                .unwrap_or("");
            in_section = sections.iter().any(|s| name.eq_ignore_ascii_case(s));
            rest = rest.get(end + 1..).unwrap_or("").trim_start();
        }
        if !in_section {
            continue;
        }
        let Some((name, value)) = rest.split_once('=') else {
            continue;
        };
        if name.trim().eq_ignore_ascii_case(key) {
            out.push(value_of(value));
        }
    }
    out
}

/// A configuration value: blanks before it dropped, quotes removed (a
/// blank inside them kept), `\` escapes read, an unquoted comment dropped,
/// unquoted trailing blanks trimmed.
fn value_of(raw: &str) -> String {
    let mut out = String::new();
    // Bytes of `out` that must stay (up to the last quoted character).
    let mut kept = 0;
    let (mut quoted, mut chars) = (false, raw.trim_start().chars());
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                kept = out.len();
            }
            '\\' => {
                match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some('b') => out.push('\u{8}'),
                    Some(other) => out.push(other),
                    None => {}
                }
                kept = out.len();
            }
            '#' | ';' if !quoted => break,
            c => {
                out.push(c);
                if quoted || !c.is_whitespace() {
                    kept = out.len();
                }
            }
        }
    }
    out.truncate(kept);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn include_paths_are_found_however_written() {
        let text = "\u{feff}[core]\n\tpath = not-an-include\n[include]\n\tpath = a\n[INCLUDE] PATH = \"b c\" ; comment\n[includeIf \"gitdir:/x/\"]\n path=d\\\"e\n[remote \"origin\"]\n\tpath = no\n[core] [include] path = two-headers\n[include]\n\tpath = con\\\ntinued\n\tpath = \"quoted \" \n\tpath = tab\\t\r\n[ include ]\n\tpath = spaced\n";
        assert_eq!(
            include_paths(text),
            vec![
                "a",
                "b c",
                "d\"e",
                "two-headers",
                "continued",
                "quoted ",
                "tab\t",
                "spaced"
            ]
        );
    }

    #[test]
    fn gitmodules_paths_are_read_from_submodule_sections_only() {
        let text = "[submodule \"a\"]\n\tpath = lib/a\n\turl = ../a.git\n[SubModule \"b c\"] path = \"with space\" # note\n[core]\n\tpath = no\n[submodule.d]\n\tPATH=d\n";
        assert_eq!(gitmodules_paths(text), vec!["lib/a", "with space", "d"]);
    }

    #[test]
    fn an_include_that_is_a_device_or_too_large_is_refused_and_a_config_never_redirects() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        drop(repo);
        let config = dir.path().join(".git/config");
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str(
            "[url \"http://127.0.0.1:1/\"]\n\tinsteadOf = https://example.invalid/\n[include]\n\tpath = more\n",
        );
        std::fs::write(&config, &text).unwrap();
        std::fs::write(
            dir.path().join(".git/more"),
            "[include]\n\tpath = ../pipe\n",
        )
        .unwrap();
        check_includes(dir.path()).unwrap();
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            dir.path().join("pipe"),
            rustix::fs::Mode::from_raw_mode(0o644),
        )
        .unwrap();
        // A FIFO is the watcher's (it reads as empty); a device, through a
        // link, is refused.
        check_includes(dir.path()).unwrap();
        std::fs::remove_file(dir.path().join("pipe")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("pipe")).unwrap();
        let e = check_includes(dir.path()).unwrap_err();
        assert!(e.0.contains("pipe is a device"), "{e}");
        std::fs::remove_file(dir.path().join("pipe")).unwrap();
        let big = std::fs::File::create(dir.path().join("pipe")).unwrap();
        big.set_len(MAX_CONFIG_BYTES + 1).unwrap();
        assert!(check_includes(dir.path()).unwrap_err().0.contains("bytes"));
        std::fs::remove_file(dir.path().join("pipe")).unwrap();
        // Opened for the runner: no rewrite of a URL, the work tree repo/.
        let repo = open(dir.path()).unwrap();
        let remote = repo
            .remote_anonymous("https://example.invalid/o/r.git")
            .unwrap();
        assert_eq!(remote.url().unwrap(), "https://example.invalid/o/r.git");
        assert_eq!(repo.workdir(), Some(&*dir.path().join("")));
        // The plain open applies the agent's rewrite (what the runner avoids).
        let plain = Repository::open(dir.path()).unwrap();
        let rewritten = plain
            .remote_anonymous("https://example.invalid/o/r.git")
            .unwrap();
        assert_eq!(rewritten.url().unwrap(), "http://127.0.0.1:1/o/r.git");
    }
}
