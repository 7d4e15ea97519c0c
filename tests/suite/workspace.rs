//! The workspace against the reference coordinator: a real bare repository
//! served by `git http-backend` with Basic auth, the real credential helper
//! (the built `hosted-boot` binary), the git CLI for the agent's side.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hosted_boot::session_dir::SessionDir;
use hosted_boot::wire::ErrorCode;
use hosted_boot::workspace::{
    HttpContext, PreparedRepo, RepoSpec, WorkspaceError, credential_helper_command,
    credential_helper_with_io, prepare_repo, read_cache_entry,
};
use hosted_boot_coordinator::{Coordinator, CoordinatorOptions, Fault, Route, Target};
use pretty_assertions::assert_eq;

const EXE: &str = env!("CARGO_BIN_EXE_hosted-boot");

struct Env {
    coord: Coordinator,
    root: tempfile::TempDir,
    session: SessionDir,
    http: HttpContext,
    // Last: dropped after the coordinator, whose server runs on it.
    _rt: tokio::runtime::Runtime,
}

fn env_with(opts: CoordinatorOptions) -> Env {
    hosted_boot::tls::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let coord = rt.block_on(Coordinator::start(opts)).unwrap();
    let root = tempfile::tempdir().unwrap();
    let session = hosted_boot_test_support::file_mode_session(root.path(), &coord, 0.05);
    let http = HttpContext {
        client: hosted_boot::tls::http_client(None).unwrap(),
        runtime: rt.handle().clone(),
        request_timeout: Duration::from_secs(10),
        redactor: hosted_boot::redact::Redactor::new(),
        stall: Duration::from_secs(30),
        broker: None,
    };
    Env {
        coord,
        root,
        session,
        http,
        _rt: rt,
    }
}

fn env() -> Env {
    env_with(CoordinatorOptions::default())
}

impl Env {
    fn spec(&self, helper: String) -> RepoSpec {
        RepoSpec {
            root: self.root.path().to_path_buf(),
            remote_url: self.coord.clone_url(),
            branch: self.coord.branch(),
            credential_helper: helper,
            http: self.http.clone(),
            retry: hosted_boot::client::Policy::ONCE,
            owner: None,
            git_mirror: None,
        }
    }

    fn real_helper(&self) -> String {
        credential_helper_command(Path::new(EXE), &self.session.context_path()).unwrap()
    }

    fn repo(&self) -> PathBuf {
        self.root.path().join("repo")
    }

    fn git_requests(&self) -> Vec<(String, String, Option<u16>)> {
        self.coord
            .requests()
            .into_iter()
            .filter(|r| r.route == Target::Git)
            .map(|r| (r.method, r.path, r.response_status))
            .collect()
    }

    fn count(&self, route: Route) -> usize {
        self.coord
            .requests()
            .iter()
            .filter(|r| r.route == route)
            .count()
    }

    /// The session branch's tip in the bare repository.
    fn remote_tip(&self) -> String {
        let bare = git2::Repository::open_bare(self.coord.bare_repo()).unwrap();
        let r = bare
            .find_reference(&format!("refs/heads/{}", self.coord.branch()))
            .unwrap();
        r.target().unwrap().to_string()
    }

    /// Adds a commit on the session branch of the bare repository.
    fn advance_remote(&self, file: &str) -> String {
        let bare = git2::Repository::open_bare(self.coord.bare_repo()).unwrap();
        let refname = format!("refs/heads/{}", self.coord.branch());
        let parent = bare
            .find_reference(&refname)
            .unwrap()
            .peel_to_commit()
            .unwrap();
        let blob = bare.blob(b"more\n").unwrap();
        let mut tb = bare.treebuilder(Some(&parent.tree().unwrap())).unwrap();
        tb.insert(file, blob, 0o100644).unwrap();
        let tree = bare.find_tree(tb.write().unwrap()).unwrap();
        let sig = git2::Signature::now("t", "t@example.invalid").unwrap();
        bare.commit(Some(&refname), &sig, &sig, "advance", &tree, &[&parent])
            .unwrap()
            .to_string()
    }
}

/// A git CLI command in `dir`, isolated from the user's configuration.
fn git(dir: &Path, args: &[&str]) -> std::process::Output {
    let home = tempfile::tempdir().unwrap();
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("HOME", home.path())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("ORIZU_BOOT_SECRET")
        .output()
        .unwrap()
}

fn git_ok(dir: &Path, args: &[&str]) -> String {
    let out = git(dir, args);
    assert!(
        out.status.success(),
        "git {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim_end()
        .to_string()
}

/// A shell-script helper that logs each action to `log` and answers
/// `password` (PROTOCOL.md 3's helper protocol, without the coordinator).
fn script_helper(dir: &Path, password: &str) -> (String, PathBuf) {
    let log = dir.join("helper.log");
    let script = dir.join("helper.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncat >/dev/null\necho \"$1\" >> '{}'\nif [ \"$1\" = get ]; then echo username=x-access-token; echo password={password}; fi\n",
            log.display()
        ),
    )
    .unwrap();
    (format!("!sh '{}'", script.display()), log)
}

#[test]
fn clone_through_the_real_credential_helper() {
    let env = env();
    let prepared = prepare_repo(&env.spec(env.real_helper())).unwrap();
    let tip = env.remote_tip();
    assert_eq!(
        prepared,
        PreparedRepo {
            path: env.repo(),
            remote_head: tip.clone(),
            reused: false,
        }
    );

    let repo = git2::Repository::open(env.repo()).unwrap();
    assert!(repo.is_shallow(), "the clone is depth 1");
    let branch = env.coord.branch();
    assert_eq!(
        repo.head().unwrap().name().ok(),
        Some(format!("refs/heads/{branch}").as_str())
    );
    assert_eq!(repo.head().unwrap().target().unwrap().to_string(), tip);
    assert!(
        repo.statuses(None).unwrap().is_empty(),
        "checked out, clean"
    );
    let cfg = repo
        .config()
        .unwrap()
        .open_level(git2::ConfigLevel::Local)
        .unwrap();
    assert_eq!(
        cfg.get_string(&format!("branch.{branch}.remote")).unwrap(),
        "origin"
    );
    assert_eq!(
        cfg.get_string(&format!("branch.{branch}.merge")).unwrap(),
        format!("refs/heads/{branch}")
    );
    assert_eq!(cfg.get_string("user.name").unwrap(), "hosted-boot agent");
    assert_eq!(
        cfg.get_string("user.email").unwrap(),
        "agent@hosted-boot.invalid"
    );
    assert!(cfg.get_bool("credential.useHttpPath").unwrap());
    let helpers = git_ok(
        &env.repo(),
        &["config", "--local", "--get-all", "credential.helper"],
    );
    assert_eq!(
        helpers,
        format!(
            "\n!'{EXE}' credential --context '{}'",
            env.session.context_path().display()
        )
    );
    assert_eq!(
        git_ok(&env.repo(), &["config", "--get-all", "remote.origin.fetch"]),
        format!("+refs/heads/{branch}:refs/remotes/origin/{branch}")
    );

    // Preemptive credentials: the advertisement, then the negotiation
    // rounds (a shallow fetch takes two), all 200, no 401.
    let reqs = env.git_requests();
    assert_eq!(reqs[0].0, "GET", "{reqs:?}");
    assert!(reqs.len() >= 2, "{reqs:?}");
    assert!(reqs[1..].iter().all(|r| r.0 == "POST"), "{reqs:?}");
    assert!(reqs.iter().all(|r| r.2 == Some(200)), "{reqs:?}");
    assert_eq!(env.count(Route::RepoToken), 1);

    // The helper cached the token it minted, and it is one the coordinator issued.
    let cached = read_cache_entry(&env.session.credential_cache_path()).unwrap();
    let (token, expires) = (cached.token, cached.expires_at);
    assert!(
        env.coord
            .issued_secrets()
            .contains(&token.expose().to_string())
    );
    assert!(expires > std::time::SystemTime::now() + Duration::from_secs(600));

    // The agent's side: the git CLI fetches and pushes through the same helper.
    git_ok(&env.repo(), &["fetch"]);
    std::fs::write(env.repo().join("AGENT.md"), "work\n").unwrap();
    git_ok(&env.repo(), &["add", "AGENT.md"]);
    git_ok(&env.repo(), &["commit", "-q", "-m", "agent work"]);
    git_ok(&env.repo(), &["push", "-q"]);
    let pushed = git_ok(&env.repo(), &["rev-parse", "HEAD"]);
    assert_eq!(env.remote_tip(), pushed);
    // Cached: the CLI's calls minted no new token.
    assert_eq!(env.count(Route::RepoToken), 1);
}

#[test]
fn wrong_credentials_fail_after_two_helper_calls() {
    let env = env();
    let (helper, log) = script_helper(env.root.path(), "wrong-token-123456");
    let err = prepare_repo(&env.spec(helper)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("the coordinator's git server refused the credentials twice"),
        "{text}"
    );
    assert!(!text.contains("wrong-token-123456"), "{text}");
    // The transport registered what the helper gave it for redaction.
    assert_eq!(
        env.http.redactor.redact("got wrong-token-123456."),
        "got [REDACTED]."
    );
    assert_eq!(err.code(), ErrorCode::CloneFailed);
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(calls, "get\nerase\nget\nerase\n");
    let statuses: Vec<_> = env.git_requests().into_iter().map(|r| r.2).collect();
    assert_eq!(statuses, vec![Some(401), Some(401)]);
}

#[test]
fn helper_without_credentials_is_a_clear_error() {
    let env = env();
    // The real helper with a context that no longer exists says quit=1.
    let helper =
        credential_helper_command(Path::new(EXE), &env.root.path().join("gone.json")).unwrap();
    let err = prepare_repo(&env.spec(helper)).unwrap_err().to_string();
    assert!(
        err.contains("credential helper gave no credentials"),
        "{err}"
    );
    assert!(err.contains("boot context"), "{err}");
    assert!(env.git_requests().is_empty());
}

#[test]
fn missing_session_branch() {
    let env = env_with(CoordinatorOptions {
        create_branch: false,
        ..CoordinatorOptions::default()
    });
    let err = prepare_repo(&env.spec(env.real_helper())).unwrap_err();
    match &err {
        WorkspaceError::SessionBranchMissing { branch, url } => {
            assert_eq!(branch, &env.coord.branch());
            assert_eq!(url, &env.coord.clone_url());
        }
        other => panic!("expected SessionBranchMissing, got {other}"),
    }
    assert_eq!(err.code(), ErrorCode::SessionBranchMissing);
    assert!(err.to_string().contains(&env.coord.branch()));
}

#[test]
fn a_failed_fresh_clone_leaves_no_partial_clone() {
    let env = env();
    env.coord
        .add_fault(Fault::status(Target::Git, 503).times(2))
        .unwrap();
    let err = prepare_repo(&env.spec(env.real_helper())).unwrap_err();
    assert!(err.to_string().contains("503"), "{err}");
    assert!(!env.repo().exists(), "a partial clone was left");
    // An empty repo/ that was there (a mounted volume) stays, empty.
    std::fs::create_dir_all(env.repo()).unwrap();
    let err = prepare_repo(&env.spec(env.real_helper())).unwrap_err();
    assert!(err.to_string().contains("503"), "{err}");
    assert_eq!(std::fs::read_dir(env.repo()).unwrap().count(), 0);
    // And the next attempt clones into it.
    prepare_repo(&env.spec(env.real_helper())).unwrap();
    assert!(env.repo().join("README.md").exists());
}

#[test]
fn a_failed_fetch_of_a_reused_clone_keeps_it() {
    let env = env();
    let prepared = prepare_repo(&env.spec(env.real_helper())).unwrap();
    std::fs::write(prepared.path.join("WORK.md"), "the agent's work\n").unwrap();
    env.coord.add_fault(Fault::reset(Target::Git)).unwrap();
    prepare_repo(&env.spec(env.real_helper())).unwrap_err();
    assert_eq!(
        std::fs::read_to_string(prepared.path.join("WORK.md")).unwrap(),
        "the agent's work\n"
    );
}

#[test]
fn foreign_repo_is_refused() {
    let env = env();
    let repo = env.repo();
    // Not a git repository.
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("notes.txt"), "mine\n").unwrap();
    let err = prepare_repo(&env.spec(env.real_helper())).unwrap_err();
    assert_eq!(err.code(), ErrorCode::RepoConflict);
    let text = err.to_string();
    assert!(text.contains(&repo.display().to_string()), "{text}");
    assert!(text.contains("is not a git repository"), "{text}");

    // A clone of another remote (whose URL holds a credential).
    std::fs::remove_dir_all(&repo).unwrap();
    let other = git2::Repository::init(&repo).unwrap();
    other
        .remote("origin", "https://user:s3cret-tok@example.com/other.git")
        .unwrap();
    let text = prepare_repo(&env.spec(env.real_helper()))
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("its origin is https://example.com/other.git"),
        "{text}"
    );
    assert!(!text.contains("s3cret-tok"), "{text}");
    assert!(text.contains(&env.coord.clone_url()), "{text}");
    // Nothing was fetched, nothing rewritten.
    assert!(env.git_requests().is_empty());
    let cfg = git2::Repository::open(&repo).unwrap().config().unwrap();
    assert!(cfg.get_string("credential.helper").is_err());
}

#[test]
fn reused_repo_is_fetched_not_recloned() {
    let env = env();
    let first = prepare_repo(&env.spec(env.real_helper())).unwrap();
    let marker = env.repo().join("UNTRACKED.txt");
    std::fs::write(&marker, "agent's work\n").unwrap();
    let ino =
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(env.repo().join(".git")).unwrap());
    let advanced = env.advance_remote("NEW.txt");

    let second = prepare_repo(&env.spec(env.real_helper())).unwrap();
    assert!(second.reused);
    assert_eq!(second.remote_head, advanced);
    let repo = git2::Repository::open(env.repo()).unwrap();
    let tracking = repo
        .find_reference(&format!("refs/remotes/origin/{}", env.coord.branch()))
        .unwrap();
    assert_eq!(tracking.target().unwrap().to_string(), advanced);
    // The work tree and the local branch are left alone (the harvest's job).
    assert_eq!(
        repo.head().unwrap().target().unwrap().to_string(),
        first.remote_head
    );
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "agent's work\n");
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(env.repo().join(".git")).unwrap()),
        ino
    );
    // The second fetch used the cached token: still one repo token.
    assert_eq!(env.count(Route::RepoToken), 1);
}

/// The clone's checkout runs libgit2's filters when the tree has
/// attributes (it skips them only where none can apply, for speed): an
/// `eol=crlf` of the root's `.gitattributes` and an `ident` of a nested one
/// are applied, other files are written as committed, and nothing shows as
/// modified to the agent's git afterwards.
#[test]
fn a_fresh_clone_is_checked_out_as_its_attributes_say() {
    let env = env();
    let work = tempfile::tempdir().unwrap();
    let bare = env.coord.bare_repo();
    git_ok(work.path(), &["clone", "-q", bare.to_str().unwrap(), "w"]);
    let w = work.path().join("w");
    std::fs::create_dir_all(w.join("src/deep")).unwrap();
    for (path, content) in [
        (".gitattributes", "*.txt eol=crlf\n"),
        ("notes.txt", "one\ntwo\n"),
        ("plain.md", "one\ntwo\n"),
        ("src/.gitattributes", "*.c ident\n"),
        ("src/deep/id.c", "/* $Id$ */\n"),
    ] {
        std::fs::write(w.join(path), content).unwrap();
    }
    git_ok(&w, &["add", "-A"]);
    git_ok(
        &w,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.invalid",
            "commit",
            "-q",
            "-m",
            "attributes",
        ],
    );
    // Into the bare repository directly: its pre-receive hook takes only
    // the session's pushes.
    let into = format!("+HEAD:refs/heads/{}", env.coord.branch());
    let from = w.to_str().unwrap();
    git_ok(&bare, &["fetch", "-q", "--update-head-ok", from, &into]);
    let blob = git_ok(&w, &["rev-parse", "HEAD:src/deep/id.c"]);

    prepare_repo(&env.spec(env.real_helper())).unwrap();
    let read = |p: &str| std::fs::read_to_string(env.repo().join(p)).unwrap();
    assert_eq!(read("notes.txt"), "one\r\ntwo\r\n", "eol=crlf");
    assert_eq!(read("plain.md"), "one\ntwo\n");
    assert_eq!(
        read("src/deep/id.c"),
        format!("/* $Id: {blob} $ */\n"),
        "ident"
    );
    assert_eq!(git_ok(&env.repo(), &["status", "--porcelain"]), "");
}

#[test]
fn half_made_repo_is_finished() {
    // A boot killed after `git init` and the configuration, before checkout.
    let env = env();
    let repo = git2::Repository::init(env.repo()).unwrap();
    repo.remote("origin", &env.coord.clone_url()).unwrap();
    let prepared = prepare_repo(&env.spec(env.real_helper())).unwrap();
    assert!(prepared.reused);
    let repo = git2::Repository::open(env.repo()).unwrap();
    assert_eq!(
        repo.head().unwrap().target().unwrap().to_string(),
        prepared.remote_head
    );
    assert!(repo.path().join("shallow").exists());
}

fn helper_io(ctx: &Path, action: &str, input: &str) -> (String, String) {
    let mut out = Vec::new();
    let mut err = Vec::new();
    let code = credential_helper_with_io(action, ctx, input.as_bytes(), &mut out, &mut err);
    assert_eq!(code, 0);
    (
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

#[test]
fn credential_helper_mints_caches_and_erases() {
    let env = env();
    let url = reqwest::Url::parse(&env.coord.clone_url()).unwrap();
    let request = format!(
        "protocol=http\nhost={}:{}\npath={}\nusername=x-access-token\n\n",
        url.host_str().unwrap(),
        url.port().unwrap(),
        url.path().trim_start_matches('/')
    );
    let ctx = env.session.context_path();

    let (out, _) = helper_io(&ctx, "get", &request);
    let token = out
        .strip_prefix("username=x-access-token\npassword=")
        .and_then(|t| t.strip_suffix('\n'))
        .unwrap_or_else(|| panic!("unexpected answer {out:?}"))
        .to_string();
    assert!(env.coord.issued_secrets().contains(&token));
    assert_eq!(
        read_cache_entry(&env.session.credential_cache_path())
            .unwrap()
            .token
            .expose(),
        token
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(env.session.credential_cache_path())
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    // The mint asked for write access.
    let minted: Vec<_> = env
        .coord
        .requests()
        .into_iter()
        .filter(|r| r.route == Route::RepoToken)
        .collect();
    assert_eq!(minted.len(), 1);
    assert_eq!(minted[0].body, serde_json::json!({"access": "write"}));

    // Second get: from the cache.
    let (again, _) = helper_io(&ctx, "get", &request);
    assert_eq!(again, out);
    assert_eq!(env.count(Route::RepoToken), 1);

    // Another remote: no answer at all.
    let (none, _) = helper_io(
        &ctx,
        "get",
        "protocol=https\nhost=github.com\npath=o/r.git\n\n",
    );
    assert_eq!(none, "");

    // Both answers were recorded for the runner's redactor before they were
    // printed (PROTOCOL.md 3).
    assert_eq!(
        std::fs::read_to_string(env.session.issued_tokens_path()).unwrap(),
        format!("\n{token}\n{token}\n")
    );

    // store does nothing; erase of another token (one a concurrent helper
    // replaced already) keeps the cache; erase of the cached one empties it.
    helper_io(&ctx, "store", &format!("{request}password={token}\n"));
    assert!(read_cache_entry(&env.session.credential_cache_path()).is_some());
    let with_password = |p: &str| format!("{}\npassword={p}\n\n", request.trim_end());
    helper_io(&ctx, "erase", &with_password(&format!("not-{token}")));
    assert!(read_cache_entry(&env.session.credential_cache_path()).is_some());
    helper_io(&ctx, "erase", &with_password(&token));
    assert!(read_cache_entry(&env.session.credential_cache_path()).is_none());
    assert_eq!(
        std::fs::read_to_string(env.session.credential_cache_path()).unwrap(),
        "\n"
    );

    // The coordinator refuses the boot secret: quit=1, a reason, no secret.
    env.coord
        .add_fault(Fault::status(Route::AgentToken, 401).times(3))
        .unwrap();
    let (out, err) = helper_io(&ctx, "get", &request);
    assert_eq!(out, "quit=1\n");
    assert!(err.contains("agent-token") && err.contains("401"), "{err}");
    for secret in env.coord.issued_secrets() {
        assert!(!err.contains(&secret), "secret in {err}");
    }
}

#[test]
fn real_binary_answers_git() {
    // The same helper through the binary's command line, as git runs it.
    let env = env();
    let url = reqwest::Url::parse(&env.coord.clone_url()).unwrap();
    let request = format!(
        "protocol=http\nhost={}:{}\npath={}\n\n",
        url.host_str().unwrap(),
        url.port().unwrap(),
        url.path().trim_start_matches('/')
    );
    let mut child = Command::new(EXE)
        .args(["credential", "get", "--context"])
        .arg(env.session.context_path())
        .env_remove("ORIZU_BOOT_SECRET")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.starts_with("username=x-access-token\npassword="),
        "{stdout:?}"
    );
}

#[test]
fn git2_push_goes_through_the_transport() {
    let env = env();
    prepare_repo(&env.spec(env.real_helper())).unwrap();
    let repo = git2::Repository::open(env.repo()).unwrap();
    std::fs::write(env.repo().join("PUSHED.md"), "pushed by git2\n").unwrap();
    let mut index = repo.index().unwrap();
    index.add_path(Path::new("PUSHED.md")).unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let parent = repo.head().unwrap().peel_to_commit().unwrap();
    let sig = repo.signature().unwrap();
    let commit = repo
        .commit(Some("HEAD"), &sig, &sig, "git2 push", &tree, &[&parent])
        .unwrap();

    let local = repo
        .config()
        .unwrap()
        .open_level(git2::ConfigLevel::Local)
        .unwrap();
    let helpers = hosted_boot::workspace::CredentialHelpers::from_config(&local).unwrap();
    let _registration =
        hosted_boot::workspace::register_remote(&env.coord.clone_url(), env.http.clone(), helpers)
            .unwrap();
    let mut refused = Vec::new();
    {
        let mut callbacks = git2::RemoteCallbacks::new();
        callbacks.push_update_reference(|name, status| {
            if let Some(s) = status {
                refused.push(format!("{name}: {s}"));
            }
            Ok(())
        });
        let mut options = git2::PushOptions::new();
        options.remote_callbacks(callbacks);
        let branch = env.coord.branch();
        repo.find_remote("origin")
            .unwrap()
            .push(
                &[format!("refs/heads/{branch}:refs/heads/{branch}")],
                Some(&mut options),
            )
            .unwrap();
    }
    assert!(refused.is_empty(), "{refused:?}");
    assert_eq!(env.remote_tip(), commit.to_string());
    let methods: Vec<_> = env
        .coord
        .requests()
        .into_iter()
        .filter(|r| r.route == Target::Git && r.path.contains("receive-pack"))
        .map(|r| (r.method, r.response_status))
        .collect();
    assert_eq!(
        methods,
        vec![
            ("GET".to_string(), Some(200)),
            ("POST".to_string(), Some(200))
        ]
    );
}
