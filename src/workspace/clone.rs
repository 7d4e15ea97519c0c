//! `repo/`: the clone of the session branch (PROTOCOL.md 3 and 4 step 5).
//!
//! A fresh clone is `git init` (libgit2's built-in template: the system's
//! template hooks are not copied), then the configuration in one write of
//! `repo/.git/config` (first, so that a boot killed mid-clone leaves a
//! `repo/` the next boot recognises and reuses; the session branch's
//! upstream with it), then a depth-1 fetch of the session branch through
//! [`super::transport`], then the local session branch and a forced
//! checkout. An existing `repo/` whose `origin` is the session remote
//! is reused (configuration rewritten, session branch fetched, work tree
//! untouched; only one a killed clone left before its checkout, with an
//! unborn `HEAD` and no file, is checked out); anything else there is an
//! error. With a git mirror (`--git-mirror-dir`), a fresh clone first copies
//! the mirror's packs and offers its tips as `have`s ([`super::mirror`]); a
//! failure that may be the mirror's is done again without it.
//!
//! The clone is retried by the one retry engine of PROTOCOL.md section 2
//! ([`Policy::CLONE`]: 4 attempts, backoff 1 s doubling to 8 s; a transfer that
//! brings no byte for 30 s is aborted): only transport failures the rule
//! retries (no response, reset, timeout, stall, `429`, `5xx`) are repeated;
//! refused credentials, a `4xx` or a missing session branch are verdicts. A
//! fresh clone that fails is removed before the next attempt (and after the
//! last), so no partial clone is left; a reused `repo/` is only fetched
//! again, never removed (it may hold the agent's work).
//!
//! The configuration lets the agent's own `git fetch`/`git push` (the git
//! CLI) authenticate through the same credential helper.

use std::path::{Path, PathBuf};

use git2::{AutotagOption, ConfigLevel, Direction, FetchOptions, Repository};

use super::WorkspaceError;
use super::transport::{CredentialHelpers, HttpContext, register_remote};
use crate::client::retry::{self, Attempt, GaveUp, Pace, Policy};

/// Where a reused clone keeps the remote tip it last saw across the reuse
/// fetch, for the harvest at boot (PROTOCOL.md 4.5 "At boot").
pub const LAST_SEEN_REF: &str = "refs/hosted-boot/last-seen";

/// The agent's git identity (commits of the harvest too).
pub const GIT_USER_NAME: &str = "hosted-boot agent";
/// The agent's git e-mail address.
pub const GIT_USER_EMAIL: &str = "agent@hosted-boot.invalid";

/// What [`prepare_repo`] needs.
#[derive(Clone, Debug)]
pub struct RepoSpec {
    /// The root (`HOSTED_BOOT_ROOT`); the clone is `{root}/repo`.
    pub root: PathBuf,
    /// The clone URL, already checked by the caller (https, or http under
    /// PROTOCOL.md section 1); no user info.
    pub remote_url: String,
    /// The session branch (checked here again as a git value).
    pub branch: String,
    /// The `credential.helper` value to configure, normally
    /// [`credential_helper_command`] of the running binary.
    pub credential_helper: String,
    /// The HTTP client and runtime the fetch runs on.
    pub http: HttpContext,
    /// Attempts and backoff of [`prepare_repo_async`] ([`Policy::CLONE`],
    /// scaled by the boot's timings; [`prepare_repo`] makes one attempt).
    pub retry: Policy,
    /// The agent user (`--agent-user`): a `repo/` it owns (an earlier
    /// boot's) is reused acting as that user, never as root, since the
    /// agent may have planted anything in its `.git` (PROTOCOL.md 3).
    pub owner: Option<crate::agent_user::AgentUser>,
    /// `--git-mirror-dir`: a fresh clone copies the packs of the mirror of
    /// its URL there and fetches only what is new ([`super::mirror`]);
    /// `None`, or no usable mirror: a plain clone.
    pub git_mirror: Option<PathBuf>,
}

/// The result of [`prepare_repo`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedRepo {
    /// `{root}/repo`, absolute.
    pub path: PathBuf,
    /// The session branch's commit on the remote, as fetched (hex).
    pub remote_head: String,
    /// Whether an existing clone was reused (its work is the harvest's
    /// business, PROTOCOL.md 4.5) rather than cloned now.
    pub reused: bool,
}

/// The `credential.helper` value (PROTOCOL.md 3):
/// `!'<exe>' credential --context '<context>'`, both paths absolute and
/// shell-quoted.
///
/// Errors: a path that is not valid UTF-8 (git config values are text).
pub fn credential_helper_command(exe: &Path, context: &Path) -> Result<String, WorkspaceError> {
    let text = |what: &'static str, p: &Path| -> Result<String, WorkspaceError> {
        let abs = std::path::absolute(p).map_err(|e| WorkspaceError::io("resolve", p, e))?;
        abs.to_str()
            .map(str::to_string)
            .ok_or_else(|| WorkspaceError::Io {
                action: what,
                path: abs.clone(),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the path is not valid UTF-8",
                ),
            })
    };
    let exe = text("use as credential helper", exe)?;
    let context = text("use as credential context", context)?;
    Ok(format!(
        "!{} credential --context {}",
        crate::text::shell_quote(&exe),
        crate::text::shell_quote(&context)
    ))
}

/// [`credential_helper_command`] for the running binary
/// (`std::env::current_exe()`).
///
/// Errors: the executable's path cannot be found or is not UTF-8.
pub fn current_exe_helper_command(context: &Path) -> Result<String, WorkspaceError> {
    let exe = std::env::current_exe()
        .map_err(|e| WorkspaceError::io("find", Path::new("/proc/self/exe"), e))?;
    credential_helper_command(&exe, context)
}

fn git_error<'a>(
    action: &'static str,
    url: &'a str,
) -> impl Fn(git2::Error) -> WorkspaceError + 'a {
    move |e| WorkspaceError::Git {
        action,
        url: url.to_string(),
        message: e.message().replace('\0', ""),
    }
}

/// A URL as it may be shown: user info removed (an `origin` found on disk
/// could hold a credential).
fn displayable_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_password(None);
            let _ = u.set_username("");
            u.to_string()
        }
        Err(_) if !url.contains('@') => url.to_string(),
        Err(_) => "(an unparsable URL)".to_string(),
    }
}

fn same_url(a: &str, b: &str) -> bool {
    match (reqwest::Url::parse(a), reqwest::Url::parse(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Clones the session branch into `{root}/repo`, or reuses the clone that is
/// there (PROTOCOL.md 3, 4 step 5): one attempt, no retry. A fresh clone
/// that fails is removed (an empty `repo/` that was there before is kept,
/// emptied). Blocking: call it from `tokio::task::spawn_blocking` or a plain
/// thread, never from an async task (see [`super::transport`]), or use
/// [`prepare_repo_async`], which retries.
///
/// Errors:
/// - [`WorkspaceError::Invalid`]: the branch or URL fails its check;
/// - [`WorkspaceError::ForeignRepo`]: `repo/` exists and is not a clone of
///   the session remote (not a git repository, no `origin`, another
///   `origin`);
/// - [`WorkspaceError::SessionBranchMissing`]: the remote has no such branch;
/// - [`WorkspaceError::Git`]: configuration, fetch (transport,
///   authentication: "refused the credentials twice") or checkout failed;
/// - [`WorkspaceError::Io`]: the root cannot be resolved or `repo/` read.
pub fn prepare_repo(spec: &RepoSpec) -> Result<PreparedRepo, WorkspaceError> {
    attempt(spec).map_err(|f| f.error)
}

/// A failed attempt, whether the retry rule repeats it, and the server's
/// `Retry-After`.
struct AttemptFailure {
    error: WorkspaceError,
    transient: bool,
    retry_after: Option<std::time::Duration>,
}

impl From<WorkspaceError> for AttemptFailure {
    fn from(error: WorkspaceError) -> Self {
        AttemptFailure {
            error,
            transient: false,
            retry_after: None,
        }
    }
}

fn attempt(spec: &RepoSpec) -> Result<PreparedRepo, AttemptFailure> {
    crate::validate::git_branch("session branch", &spec.branch).map_err(WorkspaceError::from)?;
    crate::validate::url("clone URL", &spec.remote_url, true).map_err(WorkspaceError::from)?;
    let root = std::path::absolute(&spec.root)
        .map_err(|e| WorkspaceError::io("resolve", &spec.root, e))?;
    let path = root.join("repo");
    let url = spec.remote_url.as_str();

    let existed = path.exists();
    // Dropped at the end of this attempt, after every git call on `repo`.
    let _acting = act_as_owner_of(spec.owner.as_ref(), &path)?;
    // A reused repo/ may lead libgit2 to a FIFO the checks below miss.
    let _holder = super::unblock::Holder::enter();
    // A reused repo/ is the agent's: nothing it planted may block git.
    super::harvest::ready_for_git(&path).map_err(|why| WorkspaceError::ForeignRepo {
        path: path.clone(),
        found: why,
        expected: url.to_string(),
    })?;
    let (mut repo, reused) = open_or_init(&path, url)?;
    let mirror = if reused {
        None
    } else {
        super::mirror::for_clone(spec.git_mirror.as_deref(), url)
    };
    let mut registration = None;
    let mut result = finish_repo(spec, &repo, reused, mirror.as_deref(), &mut registration);
    if let (Some(mirror), Err(error)) = (&mirror, &result) {
        let transient = registration
            .as_ref()
            .is_some_and(super::RemoteRegistration::saw_transient_failure);
        if super::mirror::falls_back(error, transient) {
            tracing::warn!(mirror = %mirror.display(), error = %error, "the clone from the git mirror failed: plain clone");
            drop(registration.take());
            drop(repo);
            remove_partial_clone(&path, existed);
            repo = open_or_init(&path, url)?.0;
            result = finish_repo(spec, &repo, false, None, &mut registration);
        }
    }
    let transient = registration
        .as_ref()
        .is_some_and(super::RemoteRegistration::saw_transient_failure);
    let retry_after = registration
        .as_ref()
        .and_then(super::RemoteRegistration::retry_after);
    drop(registration);
    drop(repo);
    match result {
        Ok(oid) => {
            tracing::info!(
                path = %path.display(),
                branch = %spec.branch,
                commit = %oid,
                reused,
                "session branch ready"
            );
            Ok(PreparedRepo {
                path,
                remote_head: oid.to_string(),
                reused,
            })
        }
        Err(error) => {
            if !reused {
                remove_partial_clone(&path, existed);
            }
            Err(AttemptFailure {
                error,
                transient,
                retry_after,
            })
        }
    }
}

/// Configures, fetches and (for a fresh or unborn clone) checks out;
/// `registration` keeps the transport's registration for the caller to ask
/// how a failure went.
fn finish_repo(
    spec: &RepoSpec,
    repo: &Repository,
    reused: bool,
    mirror: Option<&Path>,
    registration: &mut Option<super::RemoteRegistration>,
) -> Result<git2::Oid, WorkspaceError> {
    let url = spec.remote_url.as_str();
    let half_made = reused && half_made(repo);
    let upstream = !reused || half_made;
    let settings = Settings {
        remote_url: url,
        branch: &spec.branch,
        credential_helper: &spec.credential_helper,
        upstream,
    };
    configure(repo, &settings).map_err(git_error("configuration", url))?;
    let local = repo
        .config()
        .and_then(|c| c.open_level(ConfigLevel::Local))
        .and_then(|c| CredentialHelpers::from_config(&c))
        .map_err(git_error("configuration", url))?;
    if reused {
        // The agent's configuration is written to, never applied: no
        // `insteadOf`, `http.*` or excludes file of its changes what the
        // runner's fetch contacts or opens (issue 31).
        git2::Config::new()
            .and_then(|clean| repo.set_config(&clean))
            .map_err(git_error("configuration", url))?;
    }
    *registration =
        Some(register_remote(url, spec.http.clone(), local).map_err(git_error("fetch", url))?);

    if reused && !half_made {
        keep_last_seen(repo, &spec.branch).map_err(git_error("fetch", url))?;
    }
    // Only a fresh clone borrows from a mirror: a reused repo/ has its own.
    let seeded = match mirror {
        Some(mirror) if !reused => super::mirror::seed(repo, mirror),
        _ => false,
    };
    let fetched = fetch_branch(repo, url, &spec.branch, !reused || half_made);
    // A killed boot's half-made clone may still hold them too.
    if seeded || half_made {
        super::mirror::drop_have_refs(repo);
    }
    let oid = fetched?;
    if !reused || half_made {
        // Before the checkout: a boot killed from here to the end of the
        // completion leaves the marker for the next boot.
        let work_tree = repo.workdir().unwrap_or(repo.path());
        super::completion::mark_pending(work_tree).map_err(|e| {
            WorkspaceError::io("write", &super::completion::repo_dir_marker(work_tree), e)
        })?;
        check_out(repo, &spec.branch, oid).map_err(git_error("checkout", url))?;
    }
    Ok(oid)
}

/// Whether a reused `repo/` is a clone a killed boot left before its
/// checkout (PROTOCOL.md 3), to be finished like a fresh clone: `HEAD`
/// unborn, an empty index and nothing in the work tree but `.git`. An
/// unborn `HEAD` alone is not enough: `git checkout --orphan` leaves one
/// over the agent's work tree and index, which are work for the harvest at
/// boot, never to be checked out over.
fn half_made(repo: &Repository) -> bool {
    let unborn = matches!(repo.head(), Err(e) if e.code() == git2::ErrorCode::UnbornBranch);
    let index_empty = repo.index().is_ok_and(|i| i.is_empty());
    let tree_empty = repo.workdir().is_some_and(|dir| {
        std::fs::read_dir(dir)
            .is_ok_and(|mut entries| entries.all(|e| e.is_ok_and(|e| e.file_name() == ".git")))
    });
    unborn && index_empty && tree_empty
}

/// Removes what a failed fresh clone made of `repo/`: the directory, or,
/// when it was there before (an empty mounted volume), its contents.
fn remove_partial_clone(path: &Path, existed: bool) {
    let result = if existed {
        std::fs::read_dir(path).and_then(|entries| {
            for entry in entries {
                let entry = entry?;
                if entry.file_type()?.is_dir() {
                    std::fs::remove_dir_all(entry.path())?;
                } else {
                    std::fs::remove_file(entry.path())?;
                }
            }
            Ok(())
        })
    } else {
        std::fs::remove_dir_all(path)
    };
    if let Err(e) = result {
        tracing::warn!(path = %path.display(), error = %e, "cannot remove the partial clone");
    }
}

/// [`prepare_repo`] on tokio's blocking pool, retried by the engine
/// ([`retry::run`]) under `spec.retry` (PROTOCOL.md section 2, the clone
/// row): a failure is repeated only when
/// the transport saw one the retry rule retries, after the rule's backoff;
/// each fresh attempt starts from a clean `repo/`. The waits are async, so
/// a stop signal between attempts starts no new one.
///
/// Errors: as [`prepare_repo`] for a verdict;
/// [`WorkspaceError::CloneExhausted`] when every attempt failed; a panic of
/// the blocking task is a [`WorkspaceError::Git`].
pub async fn prepare_repo_async(spec: RepoSpec) -> Result<PreparedRepo, WorkspaceError> {
    let policy = spec.retry;
    let url = spec.remote_url.clone();
    let spec = std::sync::Arc::new(spec);
    let attempt_on_pool = || {
        let one = spec.clone();
        let url = url.clone();
        async move {
            match crate::concurrency::spawn_blocking_in_span(move || attempt(&one)).await {
                Ok(result) => result,
                Err(e) => Err(AttemptFailure::from(WorkspaceError::Git {
                    action: "clone",
                    url,
                    message: format!("the clone task failed: {e}"),
                })),
            }
        }
    };
    retried(&url, policy, &retry::REAL, attempt_on_pool).await
}

/// The clone row's loop: `attempt` run by the engine under `policy`, a
/// failure repeated only when the transport saw one the rule retries.
async fn retried<Fut>(
    url: &str,
    policy: Policy,
    pace: &dyn Pace,
    mut attempt: impl FnMut() -> Fut,
) -> Result<PreparedRepo, WorkspaceError>
where
    Fut: std::future::Future<Output = Result<PreparedRepo, AttemptFailure>>,
{
    let result = retry::run("clone", policy, pace, || {
        let one = attempt();
        async move {
            match one.await {
                Ok(prepared) => Attempt::Done(Ok(prepared)),
                Err(failure) if !failure.transient => Attempt::Done(Err(failure.error)),
                Err(failure) => Attempt::Retry {
                    error: failure.error,
                    retry_after: failure.retry_after,
                },
            }
        }
    })
    .await;
    match result {
        Ok(done) => done,
        Err(GaveUp::Exhausted { attempts, last } | GaveUp::OutOfTime { attempts, last }) => {
            Err(WorkspaceError::CloneExhausted {
                url: url.to_string(),
                attempts,
                last: Box::new(last),
            })
        }
    }
}

/// Acts as `owner` on this thread when it owns `path` (a `repo/` the agent
/// has had in its hands); a fresh clone, or one the agent never owned, is
/// made as the runner.
///
/// Errors: the thread cannot act as the agent user (the reuse is refused
/// rather than done as root).
fn act_as_owner_of(
    owner: Option<&crate::agent_user::AgentUser>,
    path: &Path,
) -> Result<Option<crate::agent_user::ActingAs>, WorkspaceError> {
    use std::os::unix::fs::MetadataExt;
    let Some(owner) = owner else { return Ok(None) };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.uid() == owner.uid => owner
            .act_as()
            .map(Some)
            .map_err(|e| WorkspaceError::io("act as the agent user to reuse", path, e)),
        _ => Ok(None),
    }
}

fn open_or_init(path: &Path, url: &str) -> Result<(Repository, bool), WorkspaceError> {
    let empty_dir = match std::fs::read_dir(path) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        // Not a directory, or unreadable: let `open` below say what it is.
        Err(_) => false,
    };
    if empty_dir {
        // Absent, or an empty directory (a mounted volume): clone into it,
        // with libgit2's built-in template (`hooks/README.sample`, `info/exclude`,
        // `description`), not the system's (`/usr/share/git-core/templates`,
        // `init.templateDir`): copying its files was a tenth of the boot's
        // critical path, and the runner runs no hook (PROTOCOL.md 3).
        let mut options = git2::RepositoryInitOptions::new();
        options.external_template(false);
        let repo = Repository::init_opts(path, &options).map_err(git_error("init", url))?;
        return Ok((repo, false));
    }
    let foreign = |found: String| WorkspaceError::ForeignRepo {
        path: path.to_path_buf(),
        found,
        expected: url.to_string(),
    };
    let repo = Repository::open(path).map_err(|e| match e.code() {
        // Owned by another user (a volume mounted from elsewhere): say so.
        git2::ErrorCode::Owner => foreign(format!(
            "cannot be opened as a git repository ({})",
            e.message().replace('\0', "")
        )),
        _ => foreign("is not a git repository".to_string()),
    })?;
    // The value as written: `find_remote` would apply the agent's
    // `url.<x>.insteadOf` (issue 31).
    let origin = match repo
        .config()
        .and_then(|mut c| c.snapshot())
        .and_then(|c| c.get_bytes("remote.origin.url").map(<[u8]>::to_vec))
    {
        Ok(bytes) => String::from_utf8(bytes).ok(),
        Err(_) => return Err(foreign("has no origin remote".to_string())),
    };
    match origin {
        Some(found) if same_url(&found, url) => Ok((repo, true)),
        Some(found) => Err(foreign(format!(
            "its origin is {}",
            displayable_url(&found)
        ))),
        None => Err(foreign("its origin URL is not valid UTF-8".to_string())),
    }
}

fn refspec(branch: &str) -> String {
    format!("+refs/heads/{branch}:refs/remotes/origin/{branch}")
}

/// Removes every value of a (multi-valued) key; absent is fine.
fn unset_all(config: &mut git2::Config, name: &str) -> Result<(), git2::Error> {
    match config.remove_multivar(name, ".*") {
        Ok(()) => Ok(()),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// What [`configure`] writes.
struct Settings<'a> {
    remote_url: &'a str,
    branch: &'a str,
    credential_helper: &'a str,
    /// A clone to be checked out: `origin/<branch>` is the local session
    /// branch's upstream.
    upstream: bool,
}

/// Writes the repository's local configuration, in one write of
/// `repo/.git/config` ([`super::git_config::edit_at_once`]): `origin`
/// fetching only the session branch, the credential helper (after an empty
/// entry, which makes git ignore helpers of the global and system
/// configuration), the HTTP path in credential requests, proactive Basic
/// auth (git ≥ 2.46; older versions ignore it), the agent's identity, and
/// the session branch's upstream when [`Settings::upstream`].
fn configure(repo: &Repository, settings: &Settings<'_>) -> Result<(), git2::Error> {
    let mut config = repo.config()?.open_level(ConfigLevel::Local)?;
    super::git_config::edit_at_once(&mut config, |config| set_all(config, settings))
}

fn set_all(config: &mut git2::Config, spec: &Settings<'_>) -> Result<(), git2::Error> {
    unset_all(config, "remote.origin.fetch")?;
    config.set_str("remote.origin.url", spec.remote_url)?;
    config.set_multivar("remote.origin.fetch", "^$", &refspec(spec.branch))?;
    unset_all(config, "credential.helper")?;
    // With no value left, each call appends (the pattern matches nothing).
    config.set_multivar("credential.helper", "^$", "")?;
    config.set_multivar("credential.helper", "^.+$", spec.credential_helper)?;
    config.set_bool("credential.useHttpPath", true)?;
    config.set_str("http.proactiveAuth", "basic")?;
    config.set_str("user.name", GIT_USER_NAME)?;
    config.set_str("user.email", GIT_USER_EMAIL)?;
    if spec.upstream {
        // What `git branch --set-upstream-to origin/<branch>` writes; the
        // branch itself is made by the checkout.
        let branch = spec.branch;
        config.set_str(&format!("branch.{branch}.remote"), "origin")?;
        config.set_str(
            &format!("branch.{branch}.merge"),
            &format!("refs/heads/{branch}"),
        )?;
    }
    Ok(())
}

/// Copies `refs/remotes/origin/<branch>` (the runner's record of the
/// session branch's tip as it last saw it on the remote) to
/// [`LAST_SEEN_REF`] before the reuse fetch moves it, unless that is there
/// already (a boot killed before its harvest at boot): the harvest at boot
/// reads it to tell what a force push discarded meanwhile, then removes it
/// (PROTOCOL.md 4.5 "At boot").
fn keep_last_seen(repo: &Repository, branch: &str) -> Result<(), git2::Error> {
    if repo.find_reference(LAST_SEEN_REF).is_ok() {
        return Ok(());
    }
    match repo.refname_to_id(&format!("refs/remotes/origin/{branch}")) {
        Ok(oid) => repo
            .reference(
                LAST_SEEN_REF,
                oid,
                false,
                "hosted-boot: last seen remote tip",
            )
            .map(drop),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Connects, checks that the session branch exists, downloads it (depth 1
/// when `shallow`) and updates `refs/remotes/origin/<branch>`.
fn fetch_branch(
    repo: &Repository,
    url: &str,
    branch: &str,
    shallow: bool,
) -> Result<git2::Oid, WorkspaceError> {
    let fetch_err = git_error("fetch", url);
    // The runner's own URL, not `origin` as configured: no `insteadOf` of
    // the agent's reaches this fetch (issue 31).
    let mut remote = repo.remote_anonymous(url).map_err(&fetch_err)?;
    let mut connection = remote
        .connect_auth(Direction::Fetch, None, None)
        .map_err(&fetch_err)?;
    let wanted = format!("refs/heads/{branch}");
    let oid = connection
        .list()
        .map_err(&fetch_err)?
        .iter()
        .find(|head| head.name() == wanted)
        .map(|head| head.oid())
        .ok_or_else(|| WorkspaceError::SessionBranchMissing {
            branch: branch.to_string(),
            url: url.to_string(),
        })?;
    let mut options = FetchOptions::new();
    options.download_tags(AutotagOption::None);
    if shallow {
        options.depth(1);
    }
    let remote = connection.remote();
    remote
        .download(&[refspec(branch)], Some(&mut options))
        .map_err(&fetch_err)?;
    remote.disconnect().map_err(&fetch_err)?;
    repo.reference(
        &format!("refs/remotes/origin/{branch}"),
        oid,
        true,
        "hosted-boot: fetch the session branch",
    )
    .map_err(&fetch_err)?;
    Ok(oid)
}

/// Creates the local session branch at `oid` (its upstream, `origin/<branch>`,
/// is in the configuration already: [`configure`]), makes it `HEAD` and
/// checks it out (forced), with libgit2's filters off when none can apply
/// ([`filters_can_apply`]).
fn check_out(repo: &Repository, branch: &str, oid: git2::Oid) -> Result<(), git2::Error> {
    let commit = repo.find_commit(oid)?;
    repo.branch(branch, &commit, true)?;
    repo.set_head(&format!("refs/heads/{branch}"))?;
    let mut checkout = git2::build::CheckoutBuilder::new();
    checkout.force();
    let tree = commit.tree()?;
    let no_filters = !filters_can_apply(repo, &tree)?;
    checkout.disable_filters(no_filters);
    if tree.get_name(GITMODULES).is_none() {
        return repo.checkout_head(Some(&mut checkout));
    }
    // libgit2 parses the work tree's .gitmodules when it makes a gitlink's
    // directory and fails the whole checkout on one entry it refuses
    // (`update = !command`): the rest first, with no .gitmodules in the
    // work tree yet, then .gitmodules alone. The completion
    // ([`super::submodules`]) judges each entry on its own.
    checkout.path(format!("!{GITMODULES}")).path("*");
    repo.checkout_head(Some(&mut checkout))?;
    let mut gitmodules = git2::build::CheckoutBuilder::new();
    gitmodules
        .force()
        .disable_filters(no_filters)
        .disable_pathspec_match(true)
        .path(GITMODULES);
    repo.checkout_head(Some(&mut gitmodules))
}

/// The superproject's submodule list, read by libgit2's checkout.
const GITMODULES: &str = ".gitmodules";

/// Whether a checkout of `tree` in `repo` may run one of libgit2's filters
/// (`crlf` for `text`, `eol`, `crlf` or `core.autocrlf`, `ident`; libgit2
/// runs no other, not even `filter=lfs`, see [`super::lfs`]): when it
/// cannot, the checkout skips loading each file's filters, which is two
/// attribute look-ups per file, each a `realpath(3)` of its directory (one
/// `readlink` per path component) and a `stat` of every `.gitattributes`
/// above it: 16 system calls or more per file, most of the checkout's
/// own work on a tree of 20,000 files (BENCHMARKS.md, "Clone"). They can
/// apply when any attributes file exists that libgit2 reads (a
/// `.gitattributes` anywhere in the tree, `.git/info/attributes`,
/// `core.attributesFile` or its XDG default, the system's
/// `gitattributes`), or when `core.autocrlf` is `true` or `core.eol` is
/// `crlf`; any doubt (a value that does not parse) counts as "may".
///
/// Errors: the tree cannot be walked (a missing object).
fn filters_can_apply(repo: &Repository, tree: &git2::Tree<'_>) -> Result<bool, git2::Error> {
    let config = repo.config()?.snapshot()?;
    match config.get_bool("core.autocrlf") {
        Ok(false) => {}
        Err(e) if e.code() == git2::ErrorCode::NotFound => {}
        // `true`, or `input` (no effect on a checkout, but not worth telling
        // apart), or unparsable.
        _ => return Ok(true),
    }
    match config.get_str("core.eol") {
        Ok(eol) if !eol.eq_ignore_ascii_case("crlf") => {}
        Err(e) if e.code() == git2::ErrorCode::NotFound => {}
        _ => return Ok(true),
    }
    let attributes_file = match config.get_path("core.attributesFile") {
        Ok(path) => Some(path),
        Err(e) if e.code() == git2::ErrorCode::NotFound => xdg_attributes(),
        Err(_) => return Ok(true),
    };
    let outside = [
        Some(repo.path().join("info/attributes")),
        attributes_file,
        Some(PathBuf::from("/etc/gitattributes")),
    ];
    // `exists` is false for a file that cannot be stat'ed: libgit2 could
    // not read it either.
    if outside.iter().flatten().any(|p| p.exists()) {
        return Ok(true);
    }
    let mut in_tree = false;
    tree.walk(git2::TreeWalkMode::PreOrder, |_, entry| {
        if entry.name_bytes() == b".gitattributes" {
            in_tree = true;
            git2::TreeWalkResult::Abort
        } else {
            git2::TreeWalkResult::Ok
        }
    })
    .or_else(|e| if in_tree { Ok(()) } else { Err(e) })?;
    Ok(in_tree)
}

/// Where git (and libgit2) look for attributes when `core.attributesFile`
/// is unset: `$XDG_CONFIG_HOME/git/attributes`, else
/// `$HOME/.config/git/attributes`.
fn xdg_attributes() -> Option<PathBuf> {
    let non_empty = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    non_empty("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| non_empty("HOME").map(|home| Path::new(&home).join(".config")))
        .map(|dir| dir.join("git/attributes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_command_shape() {
        let cmd = credential_helper_command(
            Path::new("/opt/hosted-boot"),
            Path::new("/r/.orizu-session/s1/boot-context.json"),
        )
        .unwrap();
        assert_eq!(
            cmd,
            "!'/opt/hosted-boot' credential --context '/r/.orizu-session/s1/boot-context.json'"
        );
    }

    /// The clone step's configuration is one write of `repo/.git/config`
    /// (one rename onto it), not one per setting, and every setting is in
    /// it; a fresh `repo/` gets libgit2's built-in template, none of the
    /// system template's hook samples.
    #[test]
    fn a_fresh_repo_is_configured_in_one_write_without_the_system_template() {
        use rustix::fs::inotify;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("repo");
        let url = "https://git.example/o/r.git";
        let (repo, reused) = open_or_init(&path, url).unwrap();
        assert!(!reused);
        let hooks: Vec<_> = std::fs::read_dir(path.join(".git/hooks"))
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        // libgit2's own template has a README there, the system's (git's)
        // thirteen hook samples.
        assert_eq!(hooks, ["README.sample"]);
        let watch =
            inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC).unwrap();
        // The lock file's creation too: the kernel merges an event into an
        // identical one unread before it (two renames in a row would count
        // one).
        let flags = inotify::WatchFlags::CREATE | inotify::WatchFlags::MOVED_TO;
        inotify::add_watch(&watch, path.join(".git"), flags).unwrap();
        let settings = Settings {
            remote_url: url,
            branch: "feature/x",
            credential_helper: "!'/opt/hb' credential --context '/r/c.json'",
            upstream: true,
        };
        configure(&repo, &settings).unwrap();
        let mut buf = [std::mem::MaybeUninit::uninit(); 4096];
        let mut events = inotify::Reader::new(&watch, &mut buf);
        let mut renames = 0;
        while let Ok(event) = events.next() {
            if event.events().contains(inotify::ReadFlags::MOVED_TO)
                && event.file_name().is_some_and(|n| n.to_bytes() == b"config")
            {
                renames += 1;
            }
        }
        assert_eq!(renames, 1, "renames onto .git/config");
        let config = Repository::open(&path).unwrap().config().unwrap();
        let config = config.open_level(ConfigLevel::Local).unwrap();
        for (key, value) in [
            ("remote.origin.url", url),
            (
                "remote.origin.fetch",
                "+refs/heads/feature/x:refs/remotes/origin/feature/x",
            ),
            ("branch.feature/x.remote", "origin"),
            ("branch.feature/x.merge", "refs/heads/feature/x"),
            ("http.proactiveAuth", "basic"),
            ("user.name", GIT_USER_NAME),
            ("user.email", GIT_USER_EMAIL),
        ] {
            assert_eq!(config.get_string(key).unwrap(), value, "{key}");
        }
        assert!(config.get_bool("credential.useHttpPath").unwrap());
    }

    #[test]
    fn urls_shown_without_user_info() {
        assert_eq!(
            displayable_url("https://x-access-token:tok@github.com/o/r.git"),
            "https://github.com/o/r.git"
        );
        assert_eq!(displayable_url("not a url@host"), "(an unparsable URL)");
        assert!(same_url(
            "https://github.com/o/r.git",
            "https://GITHUB.com/o/r.git"
        ));
        assert!(!same_url(
            "https://github.com/o/r.git",
            "https://github.com/o/x.git"
        ));
    }

    /// A tree of `files` (path, content) in a fresh repository, and the
    /// repository.
    fn repo_with(files: &[(&str, &str)]) -> (tempfile::TempDir, Repository, git2::Oid) {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let mut index = repo.index().unwrap();
        for (path, content) in files {
            let blob = repo.blob(content.as_bytes()).unwrap();
            let mut entry = git2::IndexEntry {
                ctime: git2::IndexTime::new(0, 0),
                mtime: git2::IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode: 0o100644,
                uid: 0,
                gid: 0,
                file_size: 0,
                id: blob,
                flags: 0,
                flags_extended: 0,
                path: path.as_bytes().to_vec(),
            };
            entry.file_size = content.len() as u32;
            index.add(&entry).unwrap();
        }
        let tree = index.write_tree_to(&repo).unwrap();
        (dir, repo, tree)
    }

    /// The checkout skips libgit2's filters only where none can apply: an
    /// attributes file in the tree at any depth, `.git/info/attributes`, or
    /// `core.autocrlf` / `core.eol` make it load them (the suite's
    /// `a_fresh_clone_is_checked_out_as_its_attributes_say` checks the files
    /// that result).
    #[test]
    fn filters_are_skipped_only_where_none_can_apply() {
        let outside = [Some(PathBuf::from("/etc/gitattributes")), xdg_attributes()];
        if outside.iter().flatten().any(|p| p.exists()) {
            hosted_boot_test_support::skip(
                "this machine has a global attributes file (/etc/gitattributes or git's XDG one): move it aside",
            );
            return;
        }
        let can_apply = |repo: &Repository, tree| {
            filters_can_apply(repo, &repo.find_tree(tree).unwrap()).unwrap()
        };
        let plain = [("a.txt", "a\n"), ("src/m/b.rs", "b\n")];
        let (_dir, repo, tree) = repo_with(&plain);
        assert!(!can_apply(&repo, tree), "no attributes anywhere");

        for attributes in [
            ".gitattributes",
            "src/.gitattributes",
            "src/m/.gitattributes",
        ] {
            let mut files = plain.to_vec();
            files.push((attributes, "*.txt eol=crlf\n"));
            let (_dir, repo, tree) = repo_with(&files);
            assert!(can_apply(&repo, tree), "{attributes}");
        }

        std::fs::create_dir_all(repo.path().join("info")).unwrap();
        std::fs::write(repo.path().join("info/attributes"), "* ident\n").unwrap();
        assert!(can_apply(&repo, tree), "info/attributes");
        std::fs::remove_file(repo.path().join("info/attributes")).unwrap();
        assert!(!can_apply(&repo, tree));

        let mut config = repo
            .config()
            .unwrap()
            .open_level(ConfigLevel::Local)
            .unwrap();
        for (key, value, applies) in [
            ("core.autocrlf", "false", false),
            ("core.autocrlf", "true", true),
            ("core.autocrlf", "input", true),
            ("core.autocrlf", "false", false),
            ("core.eol", "lf", false),
            ("core.eol", "crlf", true),
        ] {
            config.set_str(key, value).unwrap();
            assert_eq!(can_apply(&repo, tree), applies, "{key}={value}");
        }
    }

    /// The clone row of PROTOCOL.md section 2's retry table: 4 attempts,
    /// 1 s doubling to 8 s, through the clone's own loop with its attempts
    /// scripted (which failures the transport marks retryable, no response,
    /// stall, `429`, `5xx`, is its own test; the boot's tests clone for
    /// real). Waits recorded, not slept.
    #[tokio::test]
    async fn row_the_clone_of_the_session_branch_4_attempts_1s_doubling_to_8s() {
        use crate::client::retry::Recorder;
        use std::collections::VecDeque;
        use std::time::Duration;

        let url = "https://git.example/o/r.git";
        let failure = |transient, retry_after| AttemptFailure {
            error: WorkspaceError::Git {
                action: "fetch",
                url: url.into(),
                message: "HTTP 503".into(),
            },
            transient,
            retry_after,
        };
        let done = || PreparedRepo {
            path: PathBuf::from("/r/repo"),
            remote_head: "ab".repeat(20),
            reused: false,
        };
        let run = |script: Vec<Result<PreparedRepo, AttemptFailure>>, draw| async move {
            let pace = Recorder::new(draw);
            let mut script = VecDeque::from(script);
            let mut made = 0;
            let result = retried(url, Policy::CLONE, &*pace, || {
                made += 1;
                let next = script.pop_front().unwrap_or_else(|| Ok(done()));
                async move { next }
            })
            .await;
            (result, made, pace.take_ms())
        };

        // Every attempt fails in a way the rule retries: exactly 4, then the
        // give-up, with the backoff (and jitter never past the cap).
        for (draw, waits) in [(0.5, [1000, 2000, 4000]), (1.0, [1200, 2400, 4800])] {
            let failing = (0..4).map(|_| Err(failure(true, None))).collect();
            let (result, made, recorded) = run(failing, draw).await;
            match result {
                Err(WorkspaceError::CloneExhausted { attempts: 4, .. }) => {}
                other => panic!("{other:?}"),
            }
            assert_eq!((made, recorded), (4, waits.to_vec()));
        }

        // Retry-After (429/503) replaces the backoff, up to the cap.
        let script = vec![
            Err(failure(true, Some(Duration::from_secs(3)))),
            Err(failure(true, Some(Duration::from_secs(3600)))),
            Err(failure(true, None)),
        ];
        let (result, made, recorded) = run(script, 0.5).await;
        assert_eq!(result.unwrap(), done());
        assert_eq!((made, recorded), (4, vec![3000, 8000, 4000]));

        // A verdict (refused credentials, another 4xx, not smart HTTP, no
        // session branch) is returned as is after one attempt.
        let (result, made, recorded) = run(vec![Err(failure(false, None))], 0.5).await;
        assert!(
            matches!(result, Err(WorkspaceError::Git { .. })),
            "{result:?}"
        );
        assert_eq!((made, recorded), (1, vec![]));
    }
}
