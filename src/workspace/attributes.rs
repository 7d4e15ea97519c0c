//! The `filter` attribute of a path as git reads it, for the harvest's
//! commit (PROTOCOL.md 4.5): libgit2 runs no filter, so a path with one is
//! left out (LFS's, or another driver's: `git-crypt`, transcrypt).
//!
//! libgit2 answers for most of `.gitattributes`, but reads neither a
//! C-quoted pattern (`"*.env" filter=crypt`, `"my secret.txt" ...`, which
//! git reads since 2.x), nor `filter` set or unset as a driver-less value
//! correctly for this purpose (`-filter` and `filter` come back as
//! `[internal]__FALSE__`/`__TRUE__` strings): found by a review (issue 33),
//! the first pushed the plaintext a filter was meant to encrypt. The quoted
//! lines are read here, from the files git reads for the path (the
//! `.gitattributes` of the work tree's root and of each directory down to
//! the path, and `.git/info/attributes`), with macros (`[attr]name ...`)
//! defined at the root or in `info/attributes`. When libgit2 names no driver
//! and a quoted line that matches does, that driver counts: in doubt, a
//! file is left out (and named), never pushed in plaintext.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use git2::{AttrCheckFlags, AttrValue, Repository};

/// The filter git would run on `path` when it is added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Filter {
    /// None (no `filter`, or set or unset without a driver).
    None,
    /// Git LFS's (`filter=lfs`).
    Lfs,
    /// Another driver's.
    Other(String),
}

/// The filter of `path` (relative to `repo`'s work tree; see the module
/// documentation).
pub(super) fn filter_of(repo: &Repository, path: &Path) -> Filter {
    let named = match repo.get_attr_bytes(path, "filter", AttrCheckFlags::FILE_THEN_INDEX) {
        Ok(value) => match AttrValue::from_bytes(value) {
            AttrValue::String(s) => Some(s.as_bytes().to_vec()),
            AttrValue::Bytes(b) => Some(b.to_vec()),
            _ => None,
        },
        Err(_) => None,
    };
    let driver = named.or_else(|| repo.workdir().and_then(|w| quoted_driver(repo, w, path)));
    match driver {
        None => Filter::None,
        Some(d) if d == b"lfs" => Filter::Lfs,
        Some(d) => Filter::Other(String::from_utf8_lossy(&d).into_owned()),
    }
}

/// The driver a C-quoted pattern's line gives `path`, the last that
/// matches in git's order (the root's file, then each directory's down to
/// the path's, then `info/attributes`).
fn quoted_driver(repo: &Repository, workdir: &Path, path: &Path) -> Option<Vec<u8>> {
    let rel = path.as_os_str().as_bytes();
    let info = repo.path().join("info").join("attributes");
    let root_text = read_small(&workdir.join(".gitattributes"));
    let info_text = read_small(&info);
    let macros = macros_of(&[root_text.as_deref(), info_text.as_deref()]);
    // (directory of the file, relative to the root; its text)
    let mut files: Vec<(Vec<u8>, Option<Vec<u8>>)> = vec![(Vec::new(), root_text)];
    let parts: Vec<&[u8]> = rel.split(|b| *b == b'/').collect();
    for depth in 1..parts.len() {
        let dir = parts[..depth].join(&b'/');
        let text = read_small(&workdir.join(crate_path(&dir)).join(".gitattributes"));
        files.push((dir, text));
    }
    files.push((Vec::new(), info_text));
    let mut driver = None;
    for (dir, text) in files {
        let Some(text) = text else { continue };
        let below = if dir.is_empty() {
            rel
        } else {
            match rel.strip_prefix(dir.as_slice()) {
                Some(rest) if rest.first() == Some(&b'/') => &rest[1..],
                _ => continue,
            }
        };
        for line in text.split(|b| *b == b'\n') {
            let Some((pattern, attrs)) = quoted_line(line) else {
                continue;
            };
            if !matches_path(&pattern, below) {
                continue;
            }
            if let Some(d) = filter_in(attrs, &macros, 0) {
                driver = d;
            }
        }
    }
    driver
}

/// Reads an attributes file of at most 1 MiB (a larger one, a FIFO or a
/// device is not read: git's own limit is 100 MB, and libgit2 read it).
fn read_small(path: &Path) -> Option<Vec<u8>> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > 1 << 20 {
        return None;
    }
    std::fs::read(path).ok()
}

fn crate_path(bytes: &[u8]) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(bytes))
}

/// A line whose pattern is C-quoted: the pattern unquoted, and the rest.
fn quoted_line(line: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let start = line.iter().position(|b| !b" \t".contains(b))?;
    let rest = line.get(start..)?.strip_prefix(b"\"")?;
    let mut out = Vec::new();
    let mut i = 0;
    while i < rest.len() {
        match rest[i] {
            b'"' => return Some((out, &rest[i + 1..])),
            b'\\' => {
                let c = *rest.get(i + 1)?;
                i += 2;
                match c {
                    b'a' => out.push(7),
                    b'b' => out.push(8),
                    b'f' => out.push(12),
                    b'n' => out.push(b'\n'),
                    b'r' => out.push(b'\r'),
                    b't' => out.push(b'\t'),
                    b'v' => out.push(11),
                    b'0'..=b'3' => {
                        let digits = rest.get(i..i + 2)?;
                        if !digits.iter().all(|d| (b'0'..=b'7').contains(d)) {
                            return None;
                        }
                        out.push(
                            ((c - b'0') << 6) | ((digits[0] - b'0') << 3) | (digits[1] - b'0'),
                        );
                        i += 2;
                    }
                    other => out.push(other),
                }
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    None
}

/// The macros (`[attr]name attrs…`) of the files given.
fn macros_of(texts: &[Option<&[u8]>]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for text in texts.iter().flatten() {
        for line in text.split(|b| *b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let Some(rest) = trim_start(line).strip_prefix(b"[attr]") else {
                continue;
            };
            let mut words = rest.splitn(2, |b| b" \t".contains(b));
            if let (Some(name), Some(attrs)) = (words.next(), words.next()) {
                out.push((name.to_vec(), attrs.to_vec()));
            }
        }
    }
    out
}

/// What `attrs` (a line's attributes) say of `filter`: `Some(Some(driver))`
/// for `filter=driver`, `Some(None)` when set or unset without one, `None`
/// when they do not name it. A macro is expanded (four levels at most).
fn filter_in(attrs: &[u8], macros: &[(Vec<u8>, Vec<u8>)], depth: usize) -> Option<Option<Vec<u8>>> {
    let mut said = None;
    for word in attrs
        .split(|b| b" \t".contains(b))
        .filter(|w| !w.is_empty())
    {
        if word.first() == Some(&b'#') {
            break;
        }
        if let Some(driver) = word.strip_prefix(b"filter=") {
            said = Some(Some(driver.to_vec()));
        } else if matches!(word, b"filter" | b"-filter" | b"!filter") {
            said = Some(None);
        } else if depth < 4
            && let Some((_, expansion)) = macros.iter().find(|(name, _)| name == word)
            && let Some(d) = filter_in(expansion, macros, depth + 1)
        {
            said = Some(d);
        }
    }
    said
}

fn trim_start(line: &[u8]) -> &[u8] {
    let start = line
        .iter()
        .position(|b| !b" \t".contains(b))
        .unwrap_or(line.len());
    &line[start..]
}

/// Whether `pattern` (of an attributes file) matches `path` (relative to
/// that file's directory), as git matches it: a pattern without a slash
/// matches the last part of the path at any depth, one with a slash the
/// whole path from the file's directory (a leading slash dropped); `*` and
/// `?` do not match a slash, `**` between slashes (or at an end) matches any
/// number of parts. A pattern ending in a slash names directories, which
/// attributes do not apply to.
fn matches_path(pattern: &[u8], path: &[u8]) -> bool {
    if pattern.is_empty() || pattern.last() == Some(&b'/') {
        return false;
    }
    if pattern.contains(&b'/') {
        let pattern = pattern.strip_prefix(b"/").unwrap_or(pattern);
        wildmatch(pattern, path)
    } else {
        let name = path.rsplit(|b| *b == b'/').next().unwrap_or(path);
        wildmatch(pattern, name)
    }
}

/// git's wildmatch with `WM_PATHNAME` (iterative over `*`, recursive only
/// for `**`, whose count a pattern bounds).
fn wildmatch(p: &[u8], t: &[u8]) -> bool {
    let (mut pi, mut ti) = (0, 0);
    // Where to resume after a single `*`: (pattern index, text index).
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() || pi < p.len() {
        if pi < p.len() {
            match p[pi] {
                b'*' if p.get(pi + 1) == Some(&b'*') => {
                    let at_start = pi == 0 || p[pi - 1] == b'/';
                    let mut end = pi;
                    while p.get(end) == Some(&b'*') {
                        end += 1;
                    }
                    let at_end = end == p.len() || p[end] == b'/';
                    if at_start && at_end {
                        // `**/x`: x here or below any number of parts.
                        let rest = if end < p.len() {
                            &p[end + 1..]
                        } else {
                            &p[end..]
                        };
                        if end == p.len() {
                            return true;
                        }
                        let mut i = ti;
                        loop {
                            if wildmatch(rest, &t[i..]) {
                                return true;
                            }
                            match t[i..].iter().position(|b| *b == b'/') {
                                Some(slash) => i += slash + 1,
                                None => return false,
                            }
                        }
                    }
                    // Otherwise `**` is two `*`.
                    star = Some((end, ti));
                    pi = end;
                    continue;
                }
                b'*' => {
                    star = Some((pi + 1, ti));
                    pi += 1;
                    continue;
                }
                _ if ti < t.len() => {
                    if let Some(len) = one(&p[pi..], t[ti]) {
                        pi += len;
                        ti += 1;
                        continue;
                    }
                }
                _ => {}
            }
        }
        // A mismatch: let the last `*` take one more byte (never a slash).
        match star {
            Some((sp, st)) if st < t.len() && t[st] != b'/' => {
                star = Some((sp, st + 1));
                pi = sp;
                ti = st + 1;
            }
            _ => return false,
        }
    }
    true
}

/// Whether the pattern's first element (`?`, a class, an escaped or plain
/// byte) matches `c`; its length in the pattern when it does.
fn one(p: &[u8], c: u8) -> Option<usize> {
    match p[0] {
        b'?' => (c != b'/').then_some(1),
        b'\\' if p.len() > 1 => (p[1] == c).then_some(2),
        b'[' => class(p, c),
        b => (b == c).then_some(1),
    }
}

/// A bracket class at the start of `p` (`[abc]`, `[!a-z]`, `[^…]`, `]` first
/// taken literally); a `[` without its `]` is a plain byte.
fn class(p: &[u8], c: u8) -> Option<usize> {
    let mut i = 1;
    let negated = matches!(p.get(i), Some(b'!' | b'^'));
    if negated {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let b = *p.get(i)?;
        if b == b']' && !first {
            break;
        }
        first = false;
        let (lo, len) = match b {
            b'\\' => (*p.get(i + 1)?, 2),
            _ => (b, 1),
        };
        i += len;
        if p.get(i) == Some(&b'-') && p.get(i + 1).is_some_and(|h| *h != b']') {
            let hi = p[i + 1];
            i += 2;
            matched |= (lo..=hi).contains(&c);
        } else {
            matched |= lo == c;
        }
    }
    (matched != negated && c != b'/').then_some(i + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_git_matches_them() {
        let yes: &[(&str, &str)] = &[
            ("*.env", "prod.env"),
            ("*.env", "deep/er/prod.env"),
            ("my secret.txt", "my secret.txt"),
            ("/top.env", "top.env"),
            ("dir/*.env", "dir/a.env"),
            ("**/x.key", "x.key"),
            ("**/x.key", "a/b/x.key"),
            ("a/**/b", "a/b"),
            ("a/**/b", "a/x/y/b"),
            ("a/**", "a/x/y"),
            ("[a-c]?.txt", "b1.txt"),
            ("[!a]*", "bcd"),
            ("\\*lit", "*lit"),
        ];
        for (p, t) in yes {
            assert!(
                matches_path(p.as_bytes(), t.as_bytes()),
                "{p} should match {t}"
            );
        }
        let no: &[(&str, &str)] = &[
            ("*.env", "prod.env.bak"),
            ("/top.env", "deep/top.env"),
            ("dir/*.env", "dir/sub/a.env"),
            ("dir/*.env", "other/dir/a.env"),
            ("a/**/b", "a/x/c"),
            ("[!a]*", "abc"),
            ("secrets/", "secrets"),
            ("\\*lit", "xlit"),
        ];
        for (p, t) in no {
            assert!(
                !matches_path(p.as_bytes(), t.as_bytes()),
                "{p} should not match {t}"
            );
        }
    }

    #[test]
    fn quoted_lines_are_unquoted_and_their_filter_read() {
        let (p, rest) = quoted_line(b"  \"my secret.txt\" filter=crypt -diff\r").unwrap();
        assert_eq!(p, b"my secret.txt");
        assert_eq!(filter_in(rest, &[], 0), Some(Some(b"crypt".to_vec())));
        let (p, _) = quoted_line(b"\"caf\\351 \\\"q\\\".env\" x").unwrap();
        assert_eq!(p, b"caf\xe9 \"q\".env");
        assert_eq!(quoted_line(b"*.env filter=crypt"), None);
        assert_eq!(quoted_line(b"\"unterminated filter=crypt"), None);
        let macros = macros_of(&[Some(b"[attr]secret filter=crypt diff=crypt\n".as_slice())]);
        assert_eq!(
            filter_in(b"secret", &macros, 0),
            Some(Some(b"crypt".to_vec()))
        );
        assert_eq!(filter_in(b"-filter", &macros, 0), Some(None));
        assert_eq!(filter_in(b"text eol=lf", &macros, 0), None);
    }
}
