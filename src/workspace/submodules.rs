//! The submodules of a fresh clone (PROTOCOL.md 3, "A complete
//! workspace"), checked out at the commits the session branch records, with
//! the `git` CLI through the repository's credential helper.
//!
//! One level at a time ([`plan`], then [`update`]): each entry of
//! `.gitmodules` is read and judged on its own (a malformed or unsafe one,
//! `update = none` or `!command`, is skipped with its reason; the others
//! go on); a relative URL resolves against the level's remote (the
//! session's repository for the first level); only a URL of the
//! session's scheme, host and port is fetched, after the caller has let the
//! credential helper answer for it ([`super::Broker::allow_submodule_remote`],
//! or the boot context's `submoduleRemotes`). Any other is skipped: nothing
//! of it is configured, it is never contacted, and the report says so.
//! git runs with the system and global configuration ignored, no hooks,
//! and only the `https` transport allowed (`http` too when the session's
//! remote is `http`): no `file://`, `ext::`, `ssh` or local path.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use url::Url;

use crate::redact::Redactor;

/// Nesting beyond this many levels is not followed.
pub const MAX_DEPTH: usize = 4;

/// One entry of a level's `.gitmodules` (or a gitlink it does not name):
/// its name, path (from the level's work tree), resolved URL, the commit
/// the level records, and why it is refused, if it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    /// `submodule.<name>` in `.gitmodules` (the path for a gitlink it does
    /// not name).
    pub name: String,
    /// Its path in the level's work tree, as `.gitmodules` writes it.
    pub path: String,
    /// Its URL, a relative one resolved against the level's remote as git
    /// does; `None` when it does not parse as a URL git and the runner read
    /// alike (a local path, `ext::…`).
    pub url: Option<Url>,
    /// The text of the URL (shown when it does not parse).
    pub url_text: String,
    /// The commit of the gitlink at `path` (40 hex digits; empty when none).
    pub commit: String,
    /// Why this entry is never fetched (malformed, unsafe, `update = none`
    /// or a command); `None` for one to check out if its URL is on the
    /// session's host.
    pub refused: Option<String>,
}

/// What became of a submodule, as the first turn's `hosted_boot.workspace`
/// event reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SubmoduleReport {
    /// Its path from `repo/`.
    pub path: String,
    /// Its URL (no user info).
    pub url: String,
    /// `checkedOut`, `skipped` or `failed`.
    pub outcome: &'static str,
    /// The commit checked out (`checkedOut`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Why it was skipped or failed (redacted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One level of submodules: the work tree that holds `.gitmodules`, the
/// remote its relative URLs resolve against, and its path from `repo/`.
#[derive(Clone, Debug)]
pub struct Level {
    /// The level's work tree.
    pub dir: PathBuf,
    /// The remote its relative URLs resolve against: the session's for
    /// `repo/`, the submodule's own URL for a nested level.
    pub remote: Url,
    /// Its path from `repo/` (empty for `repo/` itself).
    pub prefix: String,
    /// How deep it is (0 for `repo/`).
    pub depth: usize,
}

/// What the workspace's git commands share: the session's remote (its
/// scheme decides the transports allowed), the credential helper (given on
/// the command line: a submodule's own configuration has none), the
/// redactor for what git prints.
#[derive(Clone, Copy, Debug)]
pub struct GitRun<'a> {
    /// The session's remote.
    pub session: &'a Url,
    /// The `credential.helper` value of `repo/` ([`super::clone`]).
    pub helper: &'a str,
    /// The runner's redactor.
    pub redactor: &'a Redactor,
    /// Set when the completion's future is dropped (a stop signal during
    /// the clone step): the running `git` and its process group are
    /// killed at once instead of running on past the runner.
    pub cancelled: &'a AtomicBool,
    /// `--agent-user`: every `git` runs wholly as that user (real,
    /// effective and saved ids) in its `repo/`, as does the credential
    /// helper it starts (issue 31).
    pub owner: Option<&'a crate::agent_user::AgentUser>,
}

/// Whether `url` may be fetched with the session's credentials: the session
/// remote's scheme, host and port.
pub fn on_session_host(url: &Url, session: &Url) -> bool {
    url.scheme() == session.scheme()
        && url.host_str().map(str::to_ascii_lowercase)
            == session.host_str().map(str::to_ascii_lowercase)
        && url.port_or_known_default() == session.port_or_known_default()
        && url.username().is_empty()
        && url.password().is_none()
}

/// `text` as a URL when git and curl would read the same host and port
/// from it as the `url` crate does; `None` otherwise (then never fetched).
/// The two differ on a `\` (WHATWG reads it as `/`, curl as part of the
/// user info, so `http://session\@other/` would reach `other`), on
/// control characters and spaces, and on an authority the crate rewrites
/// (percent-encoded or non-ASCII host, a default port written out).
fn parse_as_git_reads(text: &str) -> Option<Url> {
    if text
        .chars()
        .any(|c| c == '\\' || c.is_whitespace() || c.is_control())
    {
        return None;
    }
    let url = Url::parse(text).ok()?;
    let rest = text.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = url.host_str()?;
    let expected = match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_string(),
    };
    authority.eq_ignore_ascii_case(&expected).then_some(url)
}

/// A level's submodules could not be read (`git ls-files` failed; its
/// redacted message).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unreadable(pub String);

/// The entries of `level`'s `.gitmodules` and the gitlinks of its index
/// (none without a `.gitmodules`), each checked on its own: one that is
/// malformed or unsafe is refused with its reason ([`Planned::refused`])
/// and the others go on. `git submodule` is not used to read them: it
/// stops the whole level at one entry it refuses (`update = !command`).
///
/// Errors: `git ls-files` failing (its redacted message).
pub fn plan(run: &GitRun<'_>, level: &Level) -> Result<Vec<Planned>, Unreadable> {
    if !level.dir.join(".gitmodules").is_file() {
        return Ok(Vec::new());
    }
    let staged = git(run, &level.dir, &["ls-files", "--stage", "-z"]).map_err(Unreadable)?;
    let gitlinks: Vec<(String, String)> = staged
        .split('\0')
        .filter_map(|line| {
            let (meta, path) = line.split_once('\t')?;
            let mut meta = meta.split(' ');
            let (mode, commit) = (meta.next()?, meta.next()?);
            (mode == "160000").then(|| (path.to_string(), commit.to_string()))
        })
        .collect();
    let (entries, unreadable) = match git(
        run,
        &level.dir,
        &["config", "--file", ".gitmodules", "--null", "--list"],
    ) {
        Ok(listed) => (entries_of(&listed), None),
        Err(reason) => (
            Vec::new(),
            Some(format!(".gitmodules does not parse: {reason}")),
        ),
    };
    let mut out: Vec<Planned> = entries
        .iter()
        .map(|e| {
            let path = e.path.first().cloned().unwrap_or_default();
            let url_text = e.url.first().cloned().unwrap_or_default();
            let commit = gitlinks
                .iter()
                .find(|(p, _)| *p == path)
                .map(|(_, c)| c.clone())
                .unwrap_or_default();
            let refused = refusal(e, &commit).err();
            let url = if refused.is_none() {
                resolve(&url_text, &level.remote)
            } else {
                None
            };
            Planned {
                name: e.name.clone(),
                path,
                url,
                url_text,
                commit,
                refused,
            }
        })
        .collect();
    // Two entries for one path: which URL is meant is not for the runner
    // to guess.
    let paths: Vec<String> = out.iter().map(|p| p.path.clone()).collect();
    for p in &mut out {
        if p.refused.is_none() && paths.iter().filter(|q| **q == p.path).count() > 1 {
            p.refused = Some(format!(
                "two .gitmodules entries give the path {:?}",
                p.path
            ));
        }
    }
    for (path, commit) in gitlinks {
        if !out.iter().any(|p| p.path == path) {
            out.push(Planned {
                name: path.clone(),
                path,
                url: None,
                url_text: String::new(),
                commit,
                refused: Some(
                    unreadable
                        .clone()
                        .unwrap_or_else(|| "no entry of .gitmodules gives this path".to_string()),
                ),
            });
        }
    }
    Ok(out)
}

/// One `[submodule "name"]` of `.gitmodules`: every value of each key
/// (more than one is an entry defined twice).
#[derive(Debug, Default)]
struct Entry {
    name: String,
    path: Vec<String>,
    url: Vec<String>,
    update: Vec<String>,
}

/// The entries of `git config --null --list` output, in order.
fn entries_of(listed: &str) -> Vec<Entry> {
    let mut entries: Vec<Entry> = Vec::new();
    for item in listed.split('\0').filter(|i| !i.is_empty()) {
        let (key, value) = item.split_once('\n').unwrap_or((item, ""));
        let Some((name, var)) = key
            .strip_prefix("submodule.")
            .and_then(|k| k.rsplit_once('.'))
        else {
            continue;
        };
        let at = match entries.iter().position(|e| e.name == name) {
            Some(at) => at,
            None => {
                entries.push(Entry {
                    name: name.to_string(),
                    ..Entry::default()
                });
                entries.len() - 1
            }
        };
        let entry = &mut entries[at];
        match var {
            "path" => entry.path.push(value.to_string()),
            "url" => entry.url.push(value.to_string()),
            "update" => entry.update.push(value.to_string()),
            _ => {}
        }
    }
    entries
}

/// Why `entry` (whose path's gitlink records `commit`, empty when there is
/// none) is not checked out, or `Ok` when it may be (its URL is checked
/// after).
fn refusal(entry: &Entry, commit: &str) -> Result<(), String> {
    let name = &entry.name;
    if name.is_empty() || name.split(['/', '\\']).any(|c| c == "..") {
        return Err(format!("the submodule name {name:?} is not a safe name"));
    }
    if entry.path.len() > 1 || entry.url.len() > 1 || entry.update.len() > 1 {
        return Err(format!(
            "the submodule {name:?} is defined more than once in .gitmodules"
        ));
    }
    let Some(path) = entry.path.first() else {
        return Err(format!("the submodule {name:?} has no path in .gitmodules"));
    };
    if path.starts_with('/')
        || path.starts_with('-')
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == ".." || c.eq_ignore_ascii_case(".git"))
    {
        return Err(format!(
            "the path {path:?} is not a path inside the work tree (empty, '.', '..', '.git' or an option)"
        ));
    }
    if commit.is_empty() {
        return Err(format!("no gitlink of the tree is at {path:?}"));
    }
    let Some(url) = entry.url.first().filter(|u| !u.trim().is_empty()) else {
        return Err(format!("the submodule {name:?} has no url in .gitmodules"));
    };
    if url.starts_with('-') {
        return Err("its url starts with '-' (it would read as an option)".to_string());
    }
    match entry.update.first().map(String::as_str) {
        None | Some("checkout" | "rebase" | "merge") => Ok(()),
        Some("none") => {
            Err("update = none in .gitmodules: left empty, as git leaves it".to_string())
        }
        Some(cmd) if cmd.starts_with('!') => Err(
            "update = !command in .gitmodules: the command is never run, the submodule left empty"
                .to_string(),
        ),
        Some(other) => Err(format!("unknown update = {other:?} in .gitmodules")),
    }
}

/// `text` as git reads a submodule's URL: `./…` and `../…` against
/// `remote` (each `../` drops one component of the remote's path, as git
/// does), anything else as it is; `None` when the result is not a URL git
/// and the runner read alike ([`parse_as_git_reads`]).
fn resolve(text: &str, remote: &Url) -> Option<Url> {
    let text = text.trim();
    if text.starts_with("./") || text.starts_with("../") {
        let mut base = remote.clone();
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        return parse_as_git_reads(base.join(text).ok()?.as_str());
    }
    parse_as_git_reads(text)
}

/// Checks out each submodule of `planned` that is not refused and is on
/// the session's host (the caller has let the credential helper answer for
/// it): `git clone --no-checkout`, then the recorded commit detached (a
/// fresh checkout, as git does for a submodule it has just cloned, whatever
/// `update` of checkout, rebase or merge says), and records its URL in the
/// level's configuration as `git submodule init` does; skips the others.
/// Returns the reports and the next levels (the submodules checked out).
pub fn update(
    run: &GitRun<'_>,
    level: &Level,
    planned: &[Planned],
) -> (Vec<SubmoduleReport>, Vec<Level>) {
    let session = run.session;
    let mut reports = Vec::new();
    let mut next = Vec::new();
    for p in planned {
        let full_path = if level.prefix.is_empty() {
            p.path.clone()
        } else {
            format!("{}/{}", level.prefix, p.path)
        };
        let shown = p
            .url
            .as_ref()
            .map(displayable)
            .unwrap_or_else(|| "(not a URL)".to_string());
        let fetchable = p.url.as_ref().is_some_and(|u| on_session_host(u, session));
        let skip = match &p.refused {
            Some(reason) => Some(reason.clone()),
            None if !fetchable => Some(
                "not on the session's host: fetched with no credentials, so not fetched at all"
                    .to_string(),
            ),
            None if level.depth >= MAX_DEPTH => {
                Some(format!("nested deeper than {MAX_DEPTH} levels"))
            }
            None => None,
        };
        let (Some(url), None) = (&p.url, &skip) else {
            let reason = run.redactor.redact(&skip.unwrap_or_default());
            tracing::warn!(path = %full_path, url = %shown, reason, "submodule skipped");
            reports.push(SubmoduleReport {
                path: full_path,
                url: shown,
                outcome: "skipped",
                commit: None,
                reason: Some(reason),
            });
            continue;
        };
        match check_out(run, level, p, url) {
            Ok(()) => {
                tracing::info!(path = %full_path, url = %shown, commit = %p.commit, "submodule checked out");
                next.push(Level {
                    dir: level.dir.join(&p.path),
                    remote: url.clone(),
                    prefix: full_path.clone(),
                    depth: level.depth + 1,
                });
                reports.push(SubmoduleReport {
                    path: full_path,
                    url: shown,
                    outcome: "checkedOut",
                    commit: Some(p.commit.clone()),
                    reason: None,
                });
            }
            Err(reason) => {
                tracing::warn!(path = %full_path, url = %shown, reason, "submodule not checked out");
                reports.push(SubmoduleReport {
                    path: full_path,
                    url: shown,
                    outcome: "failed",
                    commit: None,
                    reason: Some(reason),
                });
            }
        }
    }
    (reports, next)
}

/// Clones `p` from `url` into its path, checks out its recorded commit
/// (fetched by id when no branch of the remote holds it) and records it in
/// the level's configuration (`submodule.<name>.url`, `.active`).
fn check_out(run: &GitRun<'_>, level: &Level, p: &Planned, url: &Url) -> Result<(), String> {
    let dest = level.dir.join(&p.path);
    // What a killed boot's completion left there (the agent never had
    // repo/ before the completion's end): cloned again from nothing.
    if std::fs::read_dir(&dest).is_ok_and(|mut entries| entries.next().is_some()) {
        std::fs::remove_dir_all(&dest)
            .map_err(|e| format!("cannot empty {} for its clone: {e}", dest.display()))?;
    }
    git(
        run,
        &level.dir,
        &[
            "clone",
            "--quiet",
            "--no-checkout",
            "--",
            url.as_str(),
            &p.path,
        ],
    )?;
    let detach = ["checkout", "--quiet", "--detach", p.commit.as_str()];
    if git(run, &dest, &detach).is_err() {
        git(run, &dest, &["fetch", "--quiet", "origin", &p.commit])?;
        git(run, &dest, &detach)?;
    }
    let head = git(run, &dest, &["rev-parse", "HEAD"])?;
    if head.trim() != p.commit {
        return Err(format!(
            "checked out {} instead of the recorded {}",
            head.trim(),
            p.commit
        ));
    }
    for (key, value) in [("url", url.as_str()), ("active", "true")] {
        git(
            run,
            &level.dir,
            &[
                "config",
                "--local",
                &format!("submodule.{}.{key}", p.name),
                value,
            ],
        )?;
    }
    Ok(())
}

fn displayable(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_password(None);
    let _ = u.set_username("");
    u.to_string()
}

/// How long one `git` command of the workspace's completion may take.
const GIT_BOUND: Duration = Duration::from_secs(600);

/// Runs `git args` in `dir` as the runner's own git work: no system or
/// global configuration, no hooks, no prompt, only the session's transport
/// allowed; returns stdout, or the redacted tail of stderr.
pub(super) fn git(run: &GitRun<'_>, dir: &Path, args: &[&str]) -> Result<String, String> {
    let session = run.session;
    let mut cmd = Command::new("git");
    cmd.arg("-C").arg(dir);
    cmd.arg("-c").arg("credential.helper=");
    cmd.arg("-c")
        .arg(format!("credential.helper={}", run.helper));
    for setting in [
        "protocol.allow=never",
        "protocol.https.allow=always",
        "core.hooksPath=/dev/null",
        "submodule.recurse=false",
        "credential.useHttpPath=true",
        // A server that stops sending fails the transfer after 30 s (the
        // stall bound of PROTOCOL.md section 2), not after GIT_BOUND.
        "http.lowSpeedLimit=1",
        "http.lowSpeedTime=30",
    ] {
        cmd.arg("-c").arg(setting);
    }
    if session.scheme() == "http" {
        cmd.arg("-c").arg("protocol.http.allow=always");
    }
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_INDEX_FILE",
        "GIT_CONFIG_PARAMETERS",
        "GIT_CONFIG_COUNT",
        "GIT_ALLOW_PROTOCOL",
    ] {
        cmd.env_remove(var);
    }
    cmd.args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_PROTOCOL_FROM_USER", "0")
        // A submodule's path from .gitmodules is passed as a pathspec: no
        // glob or `:(exclude)` magic may widen it to the skipped ones.
        .env("GIT_LITERAL_PATHSPECS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A group of its own, so that a time-out or a stop kills git with the
    // remote helpers and git-lfs it started; and killed with the runner if
    // the runner dies before it can (no orphan holds a token's transfer).
    cmd.process_group(0);
    let become_owner = run.owner.map(|o| o.become_in_child());
    if let Some(owner) = run.owner {
        // The runner's HOME is root's, which the agent user cannot read.
        cmd.env("HOME", &owner.home).env_remove("XDG_CONFIG_HOME");
    }
    // SAFETY: prctl and the raw identity calls of `Become::now` are
    // async-signal-safe and allocate nothing; nothing else runs between
    // fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // First: a change of identity clears the parent-death signal.
            if let Some(b) = &become_owner {
                b.now()?;
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    if run.cancelled.load(Ordering::Relaxed) {
        return Err(format!("git {}: the runner is stopping", args.join(" ")));
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot run git {}: {e}", args.join(" ")))?;
    let started = Instant::now();
    let output = wait_bounded(child, GIT_BOUND, run.cancelled, 1 << 20)
        .map_err(|e| format!("git {}: {e}", args.join(" ")))?;
    tracing::debug!(args = ?args, elapsed_ms = started.elapsed().as_millis() as u64, status = %output.status, "workspace git");
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(4).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(run.redactor.redact(&format!(
        "git {} exited with {}: {}",
        args.first().unwrap_or(&""),
        output.status,
        tail.join(" / ")
    )))
}

/// Waits for `child` (the leader of its own process group) for at most
/// `bound`, or until `cancelled` is set, killing its whole group then;
/// reads its output on threads of their own, keeping at most `max_stdout`
/// bytes of stdout and 1 MiB of stderr (the rest is read and dropped).
pub(super) fn wait_bounded(
    mut child: std::process::Child,
    bound: Duration,
    cancelled: &AtomicBool,
    max_stdout: u64,
) -> std::io::Result<std::process::Output> {
    use std::io::Read;
    let read = |pipe: Option<Box<dyn Read + Send>>, max: u64| {
        pipe.map(|mut p| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = p.by_ref().take(max).read_to_end(&mut buf);
                let _ = std::io::copy(&mut p, &mut std::io::sink());
                buf
            })
        })
    };
    let stdout = read(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        max_stdout,
    );
    let stderr = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
        1 << 20,
    );
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        let stopping = cancelled.load(Ordering::Relaxed);
        if stopping || started.elapsed() >= bound {
            // The group's id is the leader's pid (process_group(0)).
            let pgid = libc::pid_t::try_from(child.id()).unwrap_or(libc::pid_t::MAX);
            // SAFETY: plain syscall on a group this function created.
            unsafe { libc::killpg(pgid, libc::SIGKILL) };
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                if stopping {
                    "stopped: the runner is stopping".to_string()
                } else {
                    format!("did not finish within {} s", bound.as_secs())
                },
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.and_then(|t| t.join().ok()).unwrap_or_default(),
        stderr: stderr.and_then(|t| t.join().ok()).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_git_reads_differently_is_not_parsed() {
        for bad in [
            "http://127.0.0.1:8797\\@127.0.0.1:9999/evil.git",
            "http://127.0.0.1%3a9999/x.git",
            "http://127.0.0.1:80/x.git",
            "http://a b/x.git",
            "http://u@127.0.0.1/x.git",
        ] {
            assert!(parse_as_git_reads(bad).is_none(), "{bad}");
        }
        for good in [
            "http://127.0.0.1:8797/git/acme/lib.git",
            "https://Example.com/a/b.git",
        ] {
            assert!(parse_as_git_reads(good).is_some(), "{good}");
        }
    }

    #[test]
    fn only_the_sessions_scheme_host_and_port_get_credentials() {
        let session = Url::parse("https://git.example/acme/app.git").unwrap();
        let yes = [
            "https://git.example/acme/lib.git",
            "https://GIT.example:443/x/y",
        ];
        let no = [
            "http://git.example/acme/lib.git",
            "https://other.example/acme/lib.git",
            "https://git.example:8443/acme/lib.git",
            "https://user:pw@git.example/acme/lib.git",
            "file:///srv/acme/lib.git",
        ];
        for u in yes {
            assert!(on_session_host(&Url::parse(u).unwrap(), &session), "{u}");
        }
        for u in no {
            assert!(!on_session_host(&Url::parse(u).unwrap(), &session), "{u}");
        }
    }
}
