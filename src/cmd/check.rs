//! `hosted-boot check`: for a person debugging a sandbox. With the sandbox's
//! environment it validates the contract (section 1), reaches the agent-token
//! route, the session and the env bundle (reading only: no repo token is
//! minted and no status is posted), and checks that `git` and the agent
//! program are present and runnable, that the root is a directory this user
//! can write (what `run` needs: PROTOCOL.md 3) and that the CA file, when
//! set, is usable, that no other runner holds the root's lock, and whether
//! the agent has a provider key or gets the placeholder (a warning). It
//! prints one line per check with a hint for each failure or warning,
//! never a secret, and exits 0 only when none failed.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::boot::config::RunArgs;
use crate::boot::config::{self, BootConfig};
use crate::boot::environment;
use crate::client::{Api, Policy};
use crate::redact::Redactor;
use crate::secret::Secret;

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckLine {
    /// What was checked.
    pub name: &'static str,
    /// `None`: passed; `Some(hint)`: failed.
    pub failure: Option<String>,
    /// A hint for a check that passed but needs a look (`warn`): `run`
    /// boots, yet the agent may not work (a placeholder provider key).
    pub warning: Option<String>,
    /// What was found (passed) or what went wrong (failed); redacted.
    pub detail: String,
}

impl CheckLine {
    fn pass(name: &'static str, detail: impl Into<String>) -> Self {
        CheckLine {
            name,
            failure: None,
            warning: None,
            detail: detail.into(),
        }
    }

    fn warn(name: &'static str, detail: impl Into<String>, hint: impl Into<String>) -> Self {
        CheckLine {
            name,
            failure: None,
            warning: Some(hint.into()),
            detail: detail.into(),
        }
    }

    fn fail(name: &'static str, detail: impl Into<String>, hint: impl Into<String>) -> Self {
        CheckLine {
            name,
            failure: Some(hint.into()),
            warning: None,
            detail: detail.into(),
        }
    }
}

/// Runs every check and prints the report; returns the exit code (0 when
/// all pass, 1 otherwise).
pub async fn run(
    env: BTreeMap<OsString, OsString>,
    args: RunArgs,
    boot_secret: Option<Secret>,
    rejected: Vec<String>,
) -> i32 {
    let redactor = Redactor::new();
    // A secret below the floor is refused by the environment check; added
    // here, it would redact the words of that refusal ("short" in
    // "shorter") and tell the value back.
    if let Some(s) = boot_secret
        .as_ref()
        .filter(|s| s.expose().len() >= config::BOOT_SECRET_MIN_LEN)
    {
        redactor.add(s, crate::redact::SecretKind::Credential);
    }
    let lines = checks(&env, &args, boot_secret, &rejected, &redactor).await;
    let width = lines.iter().map(|l| l.name.len()).max().unwrap_or(0);
    for line in &lines {
        let mark = match (&line.failure, &line.warning) {
            (Some(_), _) => "FAIL",
            (None, Some(_)) => "warn",
            (None, None) => "ok  ",
        };
        println!(
            "{mark}  {:<width$}  {}",
            line.name,
            redactor.redact(&line.detail)
        );
        if let Some(hint) = line.failure.as_ref().or(line.warning.as_ref()) {
            println!("      {:<width$}  hint: {}", "", redactor.redact(hint));
        }
    }
    let failed = lines.iter().filter(|l| l.failure.is_some()).count();
    let warned = lines.iter().filter(|l| l.warning.is_some()).count();
    if failed == 0 && warned > 0 {
        println!(
            "all {} checks passed, {warned} with a warning: `hosted-boot run` can boot; read the warnings",
            lines.len()
        );
        0
    } else if failed == 0 {
        println!(
            "all {} checks passed: `hosted-boot run` can boot",
            lines.len()
        );
        0
    } else {
        println!(
            "{failed} of {} checks failed: `hosted-boot run` would fail",
            lines.len()
        );
        1
    }
}

async fn checks(
    env: &BTreeMap<OsString, OsString>,
    args: &RunArgs,
    boot_secret: Option<Secret>,
    rejected: &[String],
    redactor: &Redactor,
) -> Vec<CheckLine> {
    // A variable clap could not parse (`cli::Parsed::rejected`) fails the
    // environment check as a bad contract variable does.
    let loaded = match rejected.is_empty() {
        false => Err(config::ConfigError(rejected.join("; "))),
        true => config::root_base(args.root.as_deref())
            .and_then(|cwd| config::load(env, args, boot_secret, cwd)),
    };
    let config = match loaded {
        Ok(c) => c,
        Err(e) => {
            return vec![
                CheckLine::fail(
                    "environment",
                    e.to_string(),
                    "the coordinator injects ORIZU_*; the image sets HOSTED_BOOT_AGENT*",
                ),
                tool_line("git", Path::new("git"), env),
            ];
        }
    };
    let mut lines = vec![CheckLine::pass(
        "environment",
        format!(
            "session {} at {}",
            config.api.session_id, config.api.api_base
        ),
    )];
    let root = root_line(&config.root);
    let root_usable = root.failure.is_none();
    lines.push(root);
    if root_usable {
        lines.push(lock_line(&config.root));
    }
    if config.credential_mode == crate::session_dir::CredentialMode::Broker {
        lines.push(socket_line(&config.root, &config.api.session_id));
    }
    if let Some(ca) = &config.ca_file {
        lines.push(match crate::tls::http_client(Some(ca)) {
            Ok(_) => CheckLine::pass("ca file", format!("{} is a usable PEM file", ca.display())),
            Err(e) => CheckLine::fail(
                "ca file",
                format!("{e:#}"),
                "HOSTED_BOOT_CA_FILE (--ca-file) must name a PEM file of CA certificates",
            ),
        });
    }
    let (coordinator, connectors) = coordinator_lines(&config, redactor).await;
    lines.extend(coordinator);
    lines.push(tool_line("git", Path::new("git"), env));
    lines.push(tool_line(
        "agent program",
        Path::new(&config.agent.program),
        env,
    ));
    lines.extend(key_line(&config, &connectors));
    lines
}

/// The provider key (README, "Provider key placeholder"): with neither a
/// key variable (the image's environment, `--agent-env`, a connector of
/// the env bundle) nor the CLI's login file, `run` sets the key variable
/// to a placeholder that only an egress proxy injecting the real key makes
/// work. `None` for an agent that needs no key (`command`).
fn key_line(config: &BootConfig, connectors: &[String]) -> Option<CheckLine> {
    let mut env: BTreeMap<OsString, OsString> = config.base_env.iter().cloned().collect();
    for (k, v) in &config.agent.env {
        env.insert(k.into(), v.into());
    }
    for name in connectors {
        env.insert(name.into(), "set".into());
    }
    let kind = config.agent.kind;
    // Which key an ACP agent reads is its own business, as for `command`.
    if matches!(
        kind,
        crate::agent::AgentKind::Command | crate::agent::AgentKind::Acp
    ) {
        return None;
    }
    Some(match crate::agent::env::missing_key(kind, &env, None) {
        None => CheckLine::pass(
            "provider key",
            format!(
                "the {} agent has a key variable or a login file",
                kind.name()
            ),
        ),
        Some(var) => CheckLine::warn(
            "provider key",
            format!(
                "no {var} (nor another key variable or a login file) for the {} agent: `run` sets {var}={} (not a secret), which works only where the sandbox's egress proxy injects the real key",
                kind.name(),
                crate::agent::env::PLACEHOLDER_KEY
            ),
            format!(
                "set {var} in the image or as a connector of the session's env bundle, unless the egress proxy injects it"
            ),
        ),
    })
}

/// Whether the credential broker's socket can be bound and reached at its
/// place, however long its path (a socket address holds 107 bytes; a
/// longer path goes through `/proc/self/fd`).
fn socket_line(root: &Path, session_id: &str) -> CheckLine {
    let path = match crate::session_dir::SessionDir::path_for(root, session_id) {
        Ok(dir) => dir.join(crate::session_dir::CREDENTIAL_SOCKET_FILE),
        Err(e) => {
            return CheckLine::fail(
                "credential socket",
                e.to_string(),
                "set ORIZU_SESSION_ID to a path-safe id and HOSTED_BOOT_ROOT to a directory",
            );
        }
    };
    match crate::workspace::socket_path::limit(&path) {
        None => CheckLine::pass(
            "credential socket",
            format!(
                "{} ({} bytes) can be bound and reached",
                path.display(),
                path.as_os_str().len()
            ),
        ),
        Some(why) => CheckLine::fail(
            "credential socket",
            why,
            "mount /proc in the sandbox, or use the file credential mode (HOSTED_BOOT_CREDENTIAL_MODE=file)",
        ),
    }
}

/// The root's lock (PROTOCOL.md 3, one runner per root): `run` refuses a
/// root another runner holds. Taken and released at once, writing nothing.
/// Held by the live runner the root's status file names, it is information
/// (`check` beside a running sandbox), not a failure.
fn lock_line(root: &Path) -> CheckLine {
    let probe = crate::workspace::lock::probe(root);
    if let Err(crate::workspace::lock::LockError::Held { pid: Some(pid), .. }) = &probe
        && let Some(runner) = live_runner(root, *pid)
    {
        return CheckLine::pass(
            "root lock",
            format!(
                "held by this root's live runner (pid {pid}, {runner}): a second `run` here would be refused; this check only reads"
            ),
        );
    }
    match probe {
        Ok(()) => CheckLine::pass("root lock", "no other runner holds the root"),
        Err(e @ crate::workspace::lock::LockError::Held { .. }) => CheckLine::fail(
            "root lock",
            e.to_string(),
            "stop the runner that holds it (the pid above), or give this sandbox another HOSTED_BOOT_ROOT",
        ),
        Err(e) => CheckLine::fail(
            "root lock",
            e.to_string(),
            "set HOSTED_BOOT_ROOT (--root) to a directory this user can write",
        ),
    }
}

/// `phase P, session S` when the lock's holder `pid` is the runner the
/// root's status file names, alive and not exited: `check` run in another
/// shell beside it (README, "The first hour"). The pid file and the status
/// file are anyone's who can write the root: the kernel's lock owner
/// (`/proc/locks`) must be that pid, and its program this one.
fn live_runner(root: &Path, pid: u32) -> Option<String> {
    let status = crate::status::read(root).ok()?;
    (status.pid == pid
        && status.phase != crate::status::Phase::Exited
        && crate::status::process_exists(pid)
        && crate::workspace::lock::owner(root) == Some(pid)
        && same_program(pid))
    .then(|| {
        format!(
            "phase {}, session {}",
            status.phase.as_str(),
            status.session_id
        )
    })
}

/// Whether process `pid` runs this program (the same file: device and
/// inode of `/proc/<pid>/exe` and `/proc/self/exe`).
fn same_program(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |path: String| std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()));
    match (id(format!("/proc/{pid}/exe")), id("/proc/self/exe".into())) {
        (Some(theirs), Some(ours)) => theirs == ours,
        _ => false,
    }
}

/// The coordinator's routes, reading only; also the names of the env
/// bundle's connectors (empty when it was not read).
async fn coordinator_lines(
    config: &BootConfig,
    redactor: &Redactor,
) -> (Vec<CheckLine>, Vec<String>) {
    let mut names = Vec::new();
    let lines = coordinator_checks(config, redactor, &mut names).await;
    (lines, names)
}

// long: the contract's three reads in order (agent token, session, env
// bundle), each a match from its answer to its check lines; the later two
// need the first one's bearer.
async fn coordinator_checks(
    config: &BootConfig,
    redactor: &Redactor,
    names: &mut Vec<String>,
) -> Vec<CheckLine> {
    let http = match crate::tls::http_client(config.ca_file.as_deref()) {
        Ok(h) => h,
        Err(e) => {
            return vec![CheckLine::fail(
                "agent token",
                format!("skipped: no TLS client ({e:#})"),
                "fix the CA file first",
            )];
        }
    };
    let api = Arc::new(
        Api::new(config.api.clone(), http, config.timings, redactor.clone())
            .with_bearer_refresh(Policy::ONCE),
    );
    let mut lines = Vec::new();
    match api.pull_bearer(Policy::ONCE).await {
        Ok(b) => lines.push(CheckLine::pass(
            "agent token",
            match b.lifetime {
                crate::client::bearer::Lifetime::Known(d) => format!(
                    "bearer received, expires in {}",
                    crate::status::format_age(d)
                ),
                _ => "bearer received (no expiry given)".to_string(),
            },
        )),
        Err(e) => {
            let hint = match e.verdict_status() {
                Some(401 | 403) => "the boot secret is not (or no longer) valid for this session",
                Some(_) => "check ORIZU_AGENT_TOKEN_URL and the session id",
                None => {
                    "the coordinator is unreachable from here: check the URL, DNS, proxy and CA"
                }
            };
            lines.push(CheckLine::fail("agent token", e.to_string(), hint));
            lines.push(CheckLine::fail("session", "skipped", "needs a bearer"));
            lines.push(CheckLine::fail("env bundle", "skipped", "needs a bearer"));
            return lines;
        }
    }
    match api.session(Policy::ONCE, false).await {
        Ok(s) => {
            let branch = crate::validate::git_branch("repoBranch", &s.repo_branch);
            // What `run` would run first (2.4): the pending turn, else the
            // initial task while its run is open.
            let pending = crate::boot::idle::select_turn(&s, true, &Default::default())
                .map_err(|e| e.to_string());
            match (branch, pending) {
                (Err(e), _) => lines.push(CheckLine::fail(
                    "session",
                    e.to_string(),
                    "the coordinator sent an unusable branch",
                )),
                (_, Err(e)) => lines.push(CheckLine::fail(
                    "session",
                    e,
                    "the coordinator sent a malformed pendingTurn",
                )),
                (Ok(()), Ok(p)) => lines.push(CheckLine::pass(
                    "session",
                    format!(
                        "status {}, branch {}, {} run{}, first turn: {}",
                        s.status.as_deref().unwrap_or("active"),
                        s.repo_branch,
                        s.runs.len(),
                        if s.runs.len() == 1 { "" } else { "s" },
                        first_turn(&s, p.as_ref())
                    ),
                )),
            }
        }
        Err(e) if e.is_too_large() => lines.push(CheckLine::fail(
            "session",
            crate::boot::idle::session_read_reason(&e),
            "shorten the prompt of the pending turn and queue it again",
        )),
        Err(e) => lines.push(CheckLine::fail(
            "session",
            e.to_string(),
            "check ORIZU_API_BASE_URL and ORIZU_SESSION_ID",
        )),
    }
    match api.env_bundle().await {
        Ok(bundle) => {
            let count = bundle.connectors.len();
            match environment::apply_bundle(bundle, &config.base_env, redactor) {
                Ok(applied) => {
                    names.extend(applied.connectors.into_iter().map(|(n, _)| n));
                    lines.push(CheckLine::pass("env bundle", format!("{count} connectors")));
                }
                Err(e) => lines.push(CheckLine::fail(
                    "env bundle",
                    environment::ReservedConnector::CODE.reason(e),
                    "rename the connector in the session's settings",
                )),
            }
        }
        Err(e) => lines.push(CheckLine::fail(
            "env bundle",
            e.to_string(),
            "check the coordinator's env-bundle route",
        )),
    }
    lines
}

/// The turn `run` would start with, in words.
fn first_turn(s: &crate::wire::Session, turn: Option<&crate::turn::TurnInput>) -> String {
    let pending = s.pending_turn().ok().flatten();
    match turn {
        _ if !s.is_active() => "none (the session has ended: the runner would exit 0)".into(),
        None => "none yet (the runner would post ready and wait for one)".into(),
        Some(t) if pending.is_some_and(|p| p.run_id == t.run_id) => format!(
            "{} (pending turn {}, runs at once)",
            t.run_id,
            t.ordinal.map_or_else(|| "?".to_string(), |o| o.to_string())
        ),
        Some(t) => format!("{} (the initial task, runs at once)", t.run_id),
    }
}

/// The root (PROTOCOL.md 3): `run` locks it and writes `.hosted-boot/`,
/// `.orizu-session/`, `.orizu-run/` and `repo/` in it, so it must be an
/// existing directory this user can write.
fn root_line(root: &Path) -> CheckLine {
    let uid = rustix::process::getuid().as_raw();
    let hint = "set HOSTED_BOOT_ROOT (--root) to a directory this user can write (the image uses /workspace)";
    match std::fs::metadata(root) {
        Err(e) => {
            return CheckLine::fail(
                "root",
                format!(
                    "the root {} cannot be read by uid {uid} ({e})",
                    root.display()
                ),
                hint,
            );
        }
        Ok(m) if !m.is_dir() => {
            return CheckLine::fail(
                "root",
                format!("the root {} is a file, not a directory", root.display()),
                hint,
            );
        }
        Ok(_) => {}
    }
    match tempfile::Builder::new()
        .prefix(".hosted-boot-check-")
        .tempfile_in(root)
    {
        Ok(_) => CheckLine::pass(
            "root",
            format!("{} is a directory uid {uid} can write", root.display()),
        ),
        Err(e) => CheckLine::fail(
            "root",
            format!(
                "the root {} is not writable by uid {uid} ({e})",
                root.display()
            ),
            hint,
        ),
    }
}

/// Finds `program` the way `execvp` would, with the environment's `PATH`.
fn find_program(program: &Path, env: &BTreeMap<OsString, OsString>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.components().count() > 1 {
        return executable(program).then(|| program.to_path_buf());
    }
    let path = env.get(&OsString::from("PATH"))?;
    std::env::split_paths(path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
}

/// The interpreter a `#!` line names, if `program` starts with one.
fn interpreter(program: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program).ok()?.read(&mut head).ok()?;
    let head = head.get(..n)?;
    let rest = head.strip_prefix(b"#!")?;
    let line = rest.split(|b| *b == b'\n').next()?;
    let text = String::from_utf8_lossy(line);
    text.split_whitespace().next().map(PathBuf::from)
}

fn tool_line(name: &'static str, program: &Path, env: &BTreeMap<OsString, OsString>) -> CheckLine {
    let Some(found) = find_program(program, env) else {
        return CheckLine::fail(
            name,
            format!("{} not found on PATH", program.display()),
            "install it in the image, or fix PATH / HOSTED_BOOT_AGENT_COMMAND",
        );
    };
    if name == "git" {
        match std::process::Command::new(&found).arg("--version").output() {
            Ok(o) if o.status.success() => {
                CheckLine::pass(name, String::from_utf8_lossy(&o.stdout).trim().to_string())
            }
            Ok(o) => CheckLine::fail(
                name,
                format!("`git --version` exited with {}", o.status),
                "reinstall git",
            ),
            Err(e) => CheckLine::fail(
                name,
                format!("cannot run {}: {e}", found.display()),
                "reinstall git",
            ),
        }
    } else {
        // The agent is not started here (it would begin working); an
        // executable file whose `#!` interpreter exists is what `run` needs
        // to spawn it.
        match interpreter(&found) {
            Some(interp) if !interp.is_file() => CheckLine::fail(
                name,
                format!(
                    "{} is a script whose interpreter {} does not exist",
                    found.display(),
                    interp.display()
                ),
                "install the interpreter in the image, or fix the script's #! line",
            ),
            _ => CheckLine::pass(name, format!("{} is executable", found.display())),
        }
    }
}
