//! The submodules of a fresh clone (PROTOCOL.md 3, "A complete
//! workspace"), checked out at the commits the session branch records, with
//! the `git` CLI through the repository's credential helper.
//!
//! One level at a time ([`plan`], then [`update`]): `git submodule init`
//! resolves each URL (a relative one against the superproject's remote,
//! the session's repository for the first level); only a URL of the
//! session's scheme, host and port is fetched, after the caller has let the
//! credential helper answer for it ([`super::Broker::allow_submodule_remote`],
//! or the boot context's `submoduleRemotes`). Any other is skipped: its
//! configuration is removed, it is never contacted, and the report says so.
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

/// One submodule to bring at one level: its name, path (from the level's
/// work tree) and resolved URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    /// `submodule.<name>` in `.gitmodules`.
    pub name: String,
    /// Its path in the level's work tree.
    pub path: String,
    /// Its URL, resolved by `git submodule init`; `None` when it does not
    /// parse as a URL (a local path, `ext::…`).
    pub url: Option<Url>,
    /// The text of the URL (shown when it does not parse).
    pub url_text: String,
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

/// The submodules of `level` (none without a `.gitmodules`), after `git
/// submodule init` has resolved their URLs.
///
/// Errors: a failing `git` (its redacted message).
pub fn plan(run: &GitRun<'_>, level: &Level) -> Result<Vec<Planned>, String> {
    if !level.dir.join(".gitmodules").is_file() {
        return Ok(Vec::new());
    }
    git(run, &level.dir, &["submodule", "init"])?;
    let listed = git(
        run,
        &level.dir,
        &["config", "--local", "--get-regexp", r"^submodule\..*\.url$"],
    )
    .unwrap_or_default();
    let mut out = Vec::new();
    for line in listed.lines() {
        // The URL has no space (one that has is refused below); a name may.
        let Some((key, url_text)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some(name) = key
            .strip_prefix("submodule.")
            .and_then(|k| k.strip_suffix(".url"))
        else {
            continue;
        };
        let path = git(
            run,
            &level.dir,
            &[
                "config",
                "--file",
                ".gitmodules",
                &format!("submodule.{name}.path"),
            ],
        )
        .unwrap_or_else(|_| name.to_string());
        out.push(Planned {
            name: name.to_string(),
            path: path.trim().to_string(),
            url: parse_as_git_reads(url_text.trim()),
            url_text: url_text.trim().to_string(),
        });
    }
    Ok(out)
}

/// Checks out each submodule of `planned` on the session's host (the caller
/// has let the credential helper answer for it) and skips the others;
/// returns the reports and the next levels (the submodules checked out).
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
        if !fetchable || level.depth >= MAX_DEPTH {
            let reason = if fetchable {
                format!("nested deeper than {MAX_DEPTH} levels")
            } else {
                "not on the session's host: fetched with no credentials, so not fetched at all"
                    .to_string()
            };
            tracing::warn!(path = %full_path, url = %shown, reason, "submodule skipped");
            let _ = git(
                run,
                &level.dir,
                &[
                    "config",
                    "--local",
                    "--remove-section",
                    &format!("submodule.{}", p.name),
                ],
            );
            reports.push(SubmoduleReport {
                path: full_path,
                url: shown,
                outcome: "skipped",
                commit: None,
                reason: Some(reason),
            });
            continue;
        }
        let result = git(
            run,
            &level.dir,
            &[
                "submodule",
                "update",
                "--init",
                "--no-recommend-shallow",
                "--",
                &p.path,
            ],
        )
        .and_then(|_| git(run, &level.dir.join(&p.path), &["rev-parse", "HEAD"]));
        match result {
            Ok(commit) => {
                tracing::info!(path = %full_path, url = %shown, commit = commit.trim(), "submodule checked out");
                next.push(Level {
                    dir: level.dir.join(&p.path),
                    prefix: full_path.clone(),
                    depth: level.depth + 1,
                });
                reports.push(SubmoduleReport {
                    path: full_path,
                    url: shown,
                    outcome: "checkedOut",
                    commit: Some(commit.trim().to_string()),
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
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork
    // and exec.
    unsafe {
        cmd.pre_exec(|| {
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
    let output = wait_bounded(child, GIT_BOUND, run.cancelled)
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
/// reads its output on threads of their own.
fn wait_bounded(
    mut child: std::process::Child,
    bound: Duration,
    cancelled: &AtomicBool,
) -> std::io::Result<std::process::Output> {
    use std::io::Read;
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        pipe.map(|mut p| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = p.by_ref().take(1 << 20).read_to_end(&mut buf);
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
    );
    let stderr = read(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
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
