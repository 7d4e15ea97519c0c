//! The coordinator's git side (PROTOCOL.md section 6, "Git"): the bare
//! repository it serves, and `git http-backend` run as a CGI program behind
//! the `{base}/git/` routes.
//!
//! Repository setup uses the `git` CLI found on `PATH`, isolated from the
//! user's and the system's git configuration.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Identity and date of the sample repository's commit, fixed so that its
/// commit id is the same on every run.
const SAMPLE_NAME: &str = "hosted-boot sample";
const SAMPLE_EMAIL: &str = "sample@hosted-boot.invalid";
const SAMPLE_DATE: &str = "2024-01-01T00:00:00Z";

/// Environment variable through which the pre-receive hook learns the
/// session branch (set in the CGI environment, inherited by the hook).
const HOOK_BRANCH_VAR: &str = "HOSTED_BOOT_COORDINATOR_BRANCH";

/// Environment variable through which the pre-receive hook learns the file
/// size limit in bytes (unset: no limit).
const HOOK_MAX_FILE_SIZE_VAR: &str = "HOSTED_BOOT_COORDINATOR_MAX_FILE_SIZE";

/// The pre-receive hook: write tokens are scoped to the session branch and its
/// recovery branches (PROTOCOL.md 4.5, "Push policy"); with a file size limit,
/// a push that brings a larger blob is refused whole, as GitHub refuses files
/// over 100 MiB (PROTOCOL.md section 6).
const PRE_RECEIVE_HOOK: &str = r#"#!/bin/sh
# Installed by the hosted-boot reference coordinator: pushes may update only
# the session branch and its recovery branches (<branch>-recovered-<runId>),
# and bring no file larger than $HOSTED_BOOT_COORDINATOR_MAX_FILE_SIZE bytes
# when that is set.
status=0
zero=0000000000000000000000000000000000000000
max="${HOSTED_BOOT_COORDINATOR_MAX_FILE_SIZE:-}"
while read -r old new ref; do
  case "$ref" in
    "refs/heads/$HOSTED_BOOT_COORDINATOR_BRANCH" | "refs/heads/$HOSTED_BOOT_COORDINATOR_BRANCH"-recovered-*) ;;
    *)
      echo "hosted-boot-coordinator: push to $ref refused: tokens are scoped to refs/heads/$HOSTED_BOOT_COORDINATOR_BRANCH and its recovery branches" >&2
      status=1
      ;;
  esac
  if [ -n "$max" ] && [ "$new" != "$zero" ]; then
    # The objects this push brings: reachable from the new tip, not from
    # any ref the repository already has.
    big=$(git rev-list --objects "$new" --not --all |
      git cat-file --batch-check='%(objecttype) %(objectsize) %(rest)' |
      awk -v max="$max" '$1 == "blob" && $2 > max { printf " %s (%s bytes)", $3, $2 }')
    if [ -n "$big" ]; then
      echo "hosted-boot-coordinator: push to $ref refused: files over the limit of $max bytes:$big" >&2
      status=1
    fi
  fi
done
exit $status
"#;

/// Runs `git` with `args` (in `dir` when given) isolated from the user's and
/// system configuration; returns its trimmed stdout.
fn git(dir: Option<&Path>, args: &[&str]) -> anyhow::Result<String> {
    let mut cmd = Command::new("git");
    if let Some(dir) = dir {
        cmd.arg("-C").arg(dir);
    }
    cmd.args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null());
    let out = cmd
        .output()
        .with_context(|| format!("could not run git {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "git {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str()
        .with_context(|| format!("path {} is not UTF-8", p.display()))
}

/// Creates a small sample repository (a `README.md` and `src/greeting.txt`,
/// one commit on `main` with a fixed identity and date) at `dir`, which must
/// not exist or be empty. Returns the repository's path (`dir`, made
/// absolute).
///
/// Errors: `dir` is not empty, cannot be created, or a `git` command fails.
pub fn create_sample_repo(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("could not create {}", dir.display()))?;
    if std::fs::read_dir(dir)?.next().is_some() {
        bail!(
            "{} is not empty: the sample repository needs an empty directory",
            dir.display()
        );
    }
    let dir = std::path::absolute(dir)?;
    let d = Some(dir.as_path());
    git(None, &["init", "-q", "-b", "main", path_str(&dir)?])?;
    std::fs::write(
        dir.join("README.md"),
        "# Sample app\n\nA sample repository served by the hosted-boot reference coordinator.\n",
    )?;
    std::fs::create_dir_all(dir.join("src"))?;
    std::fs::write(dir.join("src/greeting.txt"), "Hello, world!\n")?;
    git(d, &["add", "-A"])?;
    sample_commit(&dir, "Initial commit")?;
    Ok(dir)
}

/// Commits what is staged in `dir` with the sample's fixed identity and
/// date, so that the sample's commit ids are the same on every machine.
fn sample_commit(dir: &Path, message: &str) -> anyhow::Result<()> {
    let mut cmd = Command::new("git");
    cmd.arg("-C")
        .arg(dir)
        .args(["-c", "commit.gpgsign=false", "commit", "-q", "-m", message])
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", SAMPLE_NAME)
        .env("GIT_AUTHOR_EMAIL", SAMPLE_EMAIL)
        .env("GIT_AUTHOR_DATE", SAMPLE_DATE)
        .env("GIT_COMMITTER_NAME", SAMPLE_NAME)
        .env("GIT_COMMITTER_EMAIL", SAMPLE_EMAIL)
        .env("GIT_COMMITTER_DATE", SAMPLE_DATE)
        .stdin(Stdio::null());
    let out = cmd.output().context("could not run git commit")?;
    if !out.status.success() {
        bail!(
            "git commit failed in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The content of the sample's LFS file (`assets/logo.bin`), which the
/// coordinator serves from its LFS batch API.
pub const SAMPLE_LFS_CONTENT: &[u8] = b"sample LFS object served by the reference coordinator\n";

/// The sample repository with a complete workspace's parts (PROTOCOL.md
/// 4.5, "A complete workspace"): creates a library repository in
/// `dir/lib` and the sample repository in `dir/app` with a second commit
/// that adds `lib` as the submodule `vendor/lib` (by the relative URL
/// `../lib.git`, so it resolves on the session's host) and `assets/logo.bin`
/// as an LFS pointer to [`SAMPLE_LFS_CONTENT`]. Returns `(app, lib)`.
///
/// Errors: `dir/app` or `dir/lib` is not empty, or a `git` command fails.
pub fn create_complete_sample_repos(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let lib = std::path::absolute(dir.join("lib"))?;
    std::fs::create_dir_all(&lib)?;
    git(None, &["init", "-q", "-b", "main", path_str(&lib)?])?;
    std::fs::write(lib.join("lib.txt"), "A library the sample app vendors.\n")?;
    git(Some(&lib), &["add", "-A"])?;
    sample_commit(&lib, "Library")?;
    let recorded = git(Some(&lib), &["rev-parse", "HEAD"])?;
    let app = create_sample_repo(&dir.join("app"))?;
    std::fs::write(
        app.join(".gitmodules"),
        "[submodule \"lib\"]\n\tpath = vendor/lib\n\turl = ../lib.git\n",
    )?;
    std::fs::write(
        app.join(".gitattributes"),
        "*.bin filter=lfs diff=lfs merge=lfs -text\n",
    )?;
    std::fs::create_dir_all(app.join("assets"))?;
    std::fs::write(
        app.join("assets/logo.bin"),
        super::lfs_pointer(SAMPLE_LFS_CONTENT),
    )?;
    // Staged before the gitlink: `add -A` would drop a gitlink whose
    // directory is absent (the sample is built offline, without a fetch).
    git(Some(&app), &["add", "-A"])?;
    git(
        Some(&app),
        &[
            "update-index",
            "--add",
            "--cacheinfo",
            &format!("160000,{recorded},vendor/lib"),
        ],
    )?;
    sample_commit(&app, "A submodule and an LFS file")?;
    Ok((app, lib))
}

/// Checks `owner/name`: two segments of `[A-Za-z0-9._-]`, neither starting
/// with `.` or `-`.
pub(crate) fn check_repo_full_name(name: &str) -> anyhow::Result<()> {
    let parts: Vec<&str> = name.split('/').collect();
    let ok = parts.len() == 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && !p.starts_with('.')
                && !p.starts_with('-')
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        });
    if !ok {
        bail!("invalid repository name {name:?}: expected owner/name of A-Z a-z 0-9 . _ -");
    }
    Ok(())
}

/// The bare repository the coordinator serves.
#[derive(Clone, Debug)]
pub(crate) struct BareRepo {
    /// `GIT_PROJECT_ROOT`: the directory that holds `{owner}/{name}.git`.
    pub project_root: PathBuf,
    /// The bare repository itself.
    pub path: PathBuf,
    /// The branch `HEAD` names (the source's current branch).
    pub default_branch: String,
}

/// Clones `source` bare into `{workdir}/git/{repo_full_name}.git`, points
/// `HEAD` at the default branch, creates `branch` from it when `create_branch`
/// is set, refuses deletions and non-fast-forward pushes, and installs the
/// pre-receive hook that scopes pushes to the session branch.
// long: the git commands that make the served repository, in the order
// git needs them (check the name, clone, find the default branch, create
// the session branch, configure, hook), each a few lines.
pub(crate) fn prepare_bare_repo(
    workdir: &Path,
    source: &Path,
    repo_full_name: &str,
    branch: &str,
    create_branch: bool,
) -> anyhow::Result<BareRepo> {
    check_repo_full_name(repo_full_name)?;
    // In `/`: the check needs no repository, and git refuses to start in a
    // working directory it cannot stat, which says nothing about the name.
    git(
        Some(Path::new("/")),
        &["check-ref-format", "--branch", branch],
    )
    .with_context(|| format!("invalid session branch {branch:?}"))?;
    let project_root = std::path::absolute(workdir.join("git"))?;
    let path = project_root.join(format!("{repo_full_name}.git"));
    if path.exists() {
        bail!(
            "{} already exists: use an empty working directory for the coordinator",
            path.display()
        );
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    git(
        None,
        &[
            "clone",
            "--bare",
            "--quiet",
            "--",
            path_str(source)?,
            path_str(&path)?,
        ],
    )
    .with_context(|| format!("could not clone {} bare", source.display()))?;
    let p = Some(path.as_path());
    let branches: Vec<String> = git(
        p,
        &["for-each-ref", "--format=%(refname:short)", "refs/heads/"],
    )?
    .lines()
    .map(str::to_string)
    .collect();
    if branches.is_empty() {
        bail!(
            "the source repository {} has no branch with a commit",
            source.display()
        );
    }
    let head = git(p, &["symbolic-ref", "--short", "HEAD"]).ok();
    let default_branch = match head {
        Some(h) if branches.contains(&h) => h,
        _ => ["main", "master"]
            .iter()
            .map(|s| s.to_string())
            .find(|b| branches.contains(b))
            .unwrap_or_else(|| branches[0].clone()),
    };
    git(
        p,
        &[
            "symbolic-ref",
            "HEAD",
            &format!("refs/heads/{default_branch}"),
        ],
    )?;
    if create_branch && !branches.iter().any(|b| b == branch) {
        git(
            p,
            &[
                "update-ref",
                &format!("refs/heads/{branch}"),
                &format!("refs/heads/{default_branch}"),
            ],
        )?;
    }
    for (key, value) in [
        ("receive.denyNonFastForwards", "true"),
        ("receive.denyDeletes", "true"),
        ("http.receivepack", "true"),
        ("uploadpack.allowFilter", "true"),
    ] {
        git(p, &["config", key, value])?;
    }
    let hook = path.join("hooks/pre-receive");
    std::fs::create_dir_all(path.join("hooks"))?;
    std::fs::write(&hook, PRE_RECEIVE_HOOK)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(BareRepo {
        project_root,
        path,
        default_branch,
    })
}

/// Creates `branch` in `repo` from its default branch (a session of a
/// fleet, [`super::fleet`]), unless it exists.
///
/// Errors: an invalid branch name, a failing `git`.
pub(crate) fn create_branch(repo: &BareRepo, branch: &str) -> anyhow::Result<()> {
    git(
        Some(Path::new("/")),
        &["check-ref-format", "--branch", branch],
    )
    .with_context(|| format!("invalid session branch {branch:?}"))?;
    let p = Some(repo.path.as_path());
    let name = format!("refs/heads/{branch}");
    if git(p, &["rev-parse", "--verify", "--quiet", &name]).is_err() {
        git(
            p,
            &[
                "update-ref",
                &name,
                &format!("refs/heads/{}", repo.default_branch),
            ],
        )?;
    }
    Ok(())
}

/// Whether a git smart-HTTP request is a push (`git-receive-pack`).
pub(crate) fn is_push(path: &str, query: &str) -> bool {
    path.ends_with("/git-receive-pack")
        || query.split('&').any(|kv| kv == "service=git-receive-pack")
}

/// One git smart-HTTP request for `git http-backend`: the served
/// repository and the rules its pre-receive hook applies, then the request
/// as it arrived.
#[derive(Clone, Copy)]
pub(crate) struct BackendRequest<'a> {
    /// The served bare repository.
    pub(crate) repo: &'a BareRepo,
    /// The session branch, the only one a push may update.
    pub(crate) branch: &'a str,
    /// Largest blob a push may add (bytes), or `None` for no limit.
    pub(crate) max_file_size: Option<u64>,
    /// The request's method.
    pub(crate) method: &'a Method,
    /// The path below `{base}/git` (starting with `/`), already checked to
    /// name the served repository.
    pub(crate) path_info: &'a str,
    /// The query string, without `?`.
    pub(crate) query: &'a str,
    /// The request's headers.
    pub(crate) headers: &'a HeaderMap,
}

/// Runs `git http-backend` for one request and streams its answer.
///
/// The request body is streamed to the CGI's stdin without a size limit;
/// the CGI's stdout is parsed for its headers (`Status:` gives the status
/// code) and its body is streamed back.
pub(crate) async fn http_backend(request: BackendRequest<'_>, body: Body) -> Response {
    match run_backend(request, body).await {
        Ok(resp) => resp,
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "coordinator: git http-backend failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "git http-backend failed\n",
            )
                .into_response()
        }
    }
}

// long: one CGI exchange with `git http-backend` in order: its
// environment, the request body fed while its output is read, its headers
// parsed, the rest streamed; the child lives with the stream it feeds.
async fn run_backend(request: BackendRequest<'_>, body: Body) -> anyhow::Result<Response> {
    let BackendRequest {
        repo,
        branch,
        max_file_size,
        method,
        path_info,
        query,
        headers,
    } = request;
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        )
        .env("HOME", &repo.project_root)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_PROJECT_ROOT", &repo.project_root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", method.as_str())
        .env("PATH_INFO", path_info)
        .env("QUERY_STRING", query)
        .env("REMOTE_USER", "x-access-token")
        .env("REMOTE_ADDR", "127.0.0.1")
        .env(HOOK_BRANCH_VAR, branch)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(max) = max_file_size {
        cmd.env(HOOK_MAX_FILE_SIZE_VAR, max.to_string());
    }
    for (var, name) in [
        ("CONTENT_TYPE", "content-type"),
        ("CONTENT_LENGTH", "content-length"),
        ("GIT_PROTOCOL", "git-protocol"),
        ("HTTP_CONTENT_ENCODING", "content-encoding"),
    ] {
        if let Some(v) = header(name) {
            cmd.env(var, v);
        }
    }
    let mut child = cmd.spawn().context("could not start git http-backend")?;
    let mut stdin = child.stdin.take().context("no stdin")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut stderr = child.stderr.take().context("no stderr")?;

    // Request body → stdin, concurrently with reading stdout.
    tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else { break };
            if stdin.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = stdin.shutdown().await;
    });
    tokio::spawn(async move {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text).await;
        let text = text.trim();
        if !text.is_empty() {
            tracing::debug!(stderr = %text, "coordinator: git http-backend");
        }
    });

    let mut reader = BufReader::new(stdout);
    let mut status = StatusCode::OK;
    let mut out_headers = HeaderMap::new();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).await?;
        if n == 0 {
            bail!("git http-backend ended before its headers were complete");
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            bail!("malformed CGI header line {line:?}");
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().unwrap_or("");
            status = code
                .parse::<u16>()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .with_context(|| format!("bad CGI status {value:?}"))?;
        } else if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value),
        ) {
            out_headers.append(n, v);
        }
    }

    // The rest of stdout is the body; the child lives with the stream, and is
    // waited for (not killed) once stdout ends.
    let state = Some((reader, child));
    let stream = futures_util::stream::unfold(state, |state| async move {
        let (mut reader, mut child) = state?;
        let mut buf = vec![0u8; 32 * 1024];
        match reader.read(&mut buf).await {
            Ok(0) => {
                tokio::spawn(async move {
                    let _ = child.wait().await;
                });
                None
            }
            Ok(n) => {
                buf.truncate(n);
                Some((
                    Ok::<Bytes, std::io::Error>(Bytes::from(buf)),
                    Some((reader, child)),
                ))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = status;
    *resp.headers_mut() = out_headers;
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_repo_has_a_fixed_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let a = create_sample_repo(&tmp.path().join("a")).unwrap();
        let b = create_sample_repo(&tmp.path().join("b")).unwrap();
        let head_a = git(Some(&a), &["rev-parse", "HEAD"]).unwrap();
        let head_b = git(Some(&b), &["rev-parse", "HEAD"]).unwrap();
        assert_eq!(head_a, head_b);
        assert!(a.join("README.md").is_file());
        assert!(
            create_sample_repo(&a).is_err(),
            "a non-empty directory is refused"
        );
    }

    #[test]
    fn bare_repo_gets_the_session_branch_and_head() {
        let tmp = tempfile::tempdir().unwrap();
        let src = create_sample_repo(&tmp.path().join("src")).unwrap();
        let repo = prepare_bare_repo(
            &tmp.path().join("w"),
            &src,
            "acme/app",
            "orizu/session-1",
            true,
        )
        .unwrap();
        assert!(repo.path.ends_with("git/acme/app.git"));
        assert_eq!(repo.default_branch, "main");
        let p = Some(repo.path.as_path());
        assert_eq!(
            git(p, &["symbolic-ref", "HEAD"]).unwrap(),
            "refs/heads/main"
        );
        assert_eq!(
            git(p, &["rev-parse", "refs/heads/orizu/session-1"]).unwrap(),
            git(p, &["rev-parse", "refs/heads/main"]).unwrap()
        );

        let repo2 = prepare_bare_repo(
            &tmp.path().join("w2"),
            &src,
            "acme/app",
            "orizu/session-1",
            false,
        )
        .unwrap();
        assert!(
            git(
                Some(&repo2.path),
                &["rev-parse", "--verify", "refs/heads/orizu/session-1"]
            )
            .is_err()
        );
        assert!(prepare_bare_repo(&tmp.path().join("w3"), &src, "acme", "b", true).is_err());
        assert!(
            prepare_bare_repo(
                &tmp.path().join("w4"),
                &src,
                "acme/app",
                "bad..branch",
                true
            )
            .is_err()
        );
    }

    #[test]
    fn push_detection() {
        assert!(is_push(
            "/acme/app.git/info/refs",
            "service=git-receive-pack"
        ));
        assert!(is_push("/acme/app.git/git-receive-pack", ""));
        assert!(!is_push(
            "/acme/app.git/info/refs",
            "service=git-upload-pack"
        ));
        assert!(!is_push("/acme/app.git/git-upload-pack", ""));
    }
}
