//! The clone of the session branch (PROTOCOL.md 3, 4 step 5) against the
//! git CLI, and with a git mirror (`--git-mirror-dir`). Run with
//! `cargo bench --bench clone`; the figures go to BENCHMARKS.md ("Clone").
//!
//! A generated repository (5,000 commits, 20,000 files, made with
//! `git fast-import` and repacked, cached under `target/bench-clone/`) is
//! served by the reference coordinator on loopback. Pairwise, alternating
//! which goes first, [`TRIALS`] times:
//! - the runner's clone (`prepare_repo_async`, the step as the binary runs
//!   it: the real transport, the real credential helper in file mode) vs
//!   `git clone --depth 1 --single-branch --branch <session branch>` of the
//!   same URL with the same credential helper;
//! - the runner's clone with libgit2's checkout filters loaded for every
//!   file (as before they were skipped where none can apply) vs skipped;
//! - the runner's clone with a warm mirror (a `git clone --mirror` made 20
//!   commits before the session branch's tip) vs without (cold).
//!
//! Each line: best and median seconds, the median of the per-pair ratios,
//! and the bytes the coordinator's git answers carried (its request
//! record's `responseLen`, summed over the clone's git requests).
//!
//! Options (after `--`): `--pairs N` (default [`TRIALS`]; each pair is two
//! clones of 20,000 files, about a minute on a loaded 2-core machine),
//! `--no-mirror` (only the runner / git CLI pairs).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark set-up: a panic names what is missing"
)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hosted_boot::redact::Redactor;
use hosted_boot::session_dir::SessionDir;
use hosted_boot::workspace::{
    HttpContext, RepoSpec, credential_helper_command, prepare_repo_async,
};
use hosted_boot_coordinator::{Coordinator, CoordinatorOptions, Target};

/// Commits of the generated repository (the last [`NEW_COMMITS`] of them
/// are not in the mirror).
const COMMITS: usize = 5_000;
/// Files of the first commit (later commits change a few each).
const FILES: usize = 20_000;
/// Commits made after the mirror was taken.
const NEW_COMMITS: usize = 20;
/// Files each later commit changes.
const CHANGED_PER_COMMIT: usize = 4;
/// Pairs of each comparison unless `--pairs N` says otherwise.
const TRIALS: usize = 5;
/// Bump when the generator changes, so a stale cache is not reused.
const CACHE_VERSION: &str = "v1";

/// xorshift: the same repository on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

const WORDS: &[&str] = &[
    "fn", "let", "mut", "self", "return", "Ok(())", "impl", "{", "}", "=>", "match", "value",
    "error", "// why", "#[test]", "x + 1", "println!", "struct", "pub", "use", "crate::", "Vec",
    "String", "Option", "Some", "None", "if", "else", "for", "in", "while", "loop", "break",
];

/// Source-like text of about `len` bytes.
fn text(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        out.extend_from_slice(WORDS[rng.below(WORDS.len())].as_bytes());
        out.push(if rng.below(9) == 0 { b'\n' } else { b' ' });
    }
    out
}

fn path_of(i: usize) -> String {
    format!("src/m{:02}/d{:03}/f{i:05}.rs", i % 50, (i / 50) % 200)
}

fn data(out: &mut impl std::io::Write, bytes: &[u8]) {
    writeln!(out, "data {}", bytes.len()).unwrap();
    out.write_all(bytes).unwrap();
    writeln!(out).unwrap();
}

/// Streams commits `from..to` of the generated history into `git
/// fast-import` in `repo` (commit 0 adds every file; each later one changes
/// [`CHANGED_PER_COMMIT`] of them).
fn fast_import(repo: &Path, from: usize, to: usize) {
    let mut child = git_cmd(Some(repo))
        .args(["fast-import", "--quiet", "--done"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufWriter::new(child.stdin.take().unwrap());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Replay the generator up to `from` so the content matches a single run.
    for c in 0..to {
        let files: Vec<usize> = if c == 0 {
            (0..FILES).collect()
        } else {
            (0..CHANGED_PER_COMMIT).map(|_| rng.below(FILES)).collect()
        };
        let blobs: Vec<Vec<u8>> = files
            .iter()
            .map(|_| {
                let len = 200 + rng.below(2400);
                text(&mut rng, len)
            })
            .collect();
        if c < from {
            continue;
        }
        writeln!(out, "commit refs/heads/main").unwrap();
        writeln!(
            out,
            "committer Bench <bench@hosted-boot.invalid> {} +0000",
            1_700_000_000 + c * 60
        )
        .unwrap();
        data(&mut out, format!("commit {c}\n").as_bytes());
        if c > 0 && c == from {
            writeln!(out, "from refs/heads/main^0").unwrap();
        }
        for (i, blob) in files.iter().zip(&blobs) {
            writeln!(out, "M 100644 inline {}", path_of(*i)).unwrap();
            data(&mut out, blob);
        }
        writeln!(out).unwrap();
    }
    writeln!(out, "done").unwrap();
    drop(out);
    assert!(child.wait().unwrap().success(), "git fast-import failed");
}

fn git_cmd(dir: Option<&Path>) -> Command {
    let mut cmd = Command::new("git");
    if let Some(dir) = dir {
        cmd.arg("-C").arg(dir);
    }
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0");
    cmd
}

fn git(dir: Option<&Path>, args: &[&str]) {
    let status = git_cmd(dir).args(args).status().unwrap();
    assert!(status.success(), "git {args:?} failed");
}

/// The source repository (bare, `main` at commit [`COMMITS`]) and the
/// mirror (a `--mirror` clone of it [`NEW_COMMITS`] commits earlier), made
/// once and cached under `target/bench-clone/`.
fn repositories() -> (PathBuf, PathBuf) {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let cache = target.join("bench-clone").join(CACHE_VERSION);
    let (source, mirror) = (cache.join("source.git"), cache.join("mirror"));
    if cache.join("done").exists() {
        return (source, mirror);
    }
    let started = Instant::now();
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::create_dir_all(&cache).unwrap();
    git(
        None,
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            source.to_str().unwrap(),
        ],
    );
    fast_import(&source, 0, COMMITS - NEW_COMMITS);
    git(Some(&source), &["repack", "-a", "-d", "-q"]);
    // The mirror's layout: {dir}/{owner}/{name}.git, as the clone URL ends.
    let mirror_repo = mirror.join("acme/app.git");
    git(
        None,
        &[
            "clone",
            "-q",
            "--mirror",
            "--no-local",
            source.to_str().unwrap(),
            mirror_repo.to_str().unwrap(),
        ],
    );
    fast_import(&source, COMMITS - NEW_COMMITS, COMMITS);
    git(Some(&source), &["repack", "-a", "-d", "-q"]);
    std::fs::write(cache.join("done"), "").unwrap();
    eprintln!(
        "generated {COMMITS} commits, {FILES} files in {:.1} s (cached in {})",
        started.elapsed().as_secs_f64(),
        cache.display()
    );
    (source, mirror)
}

struct Sandbox {
    coord: Coordinator,
    _session: SessionDir,
    helper: String,
    http: HttpContext,
    root: tempfile::TempDir,
}

/// Bytes the coordinator's git answers carried since request `from`, and
/// how many git requests there were.
fn git_bytes(coord: &Coordinator, from: usize) -> (u64, usize) {
    let requests = coord.requests();
    let git: Vec<_> = requests
        .iter()
        .skip(from)
        .filter(|r| r.route == Target::Git)
        .collect();
    (git.iter().map(|r| r.response_len).sum(), git.len())
}

async fn sandbox(source: &Path) -> Sandbox {
    let root = tempfile::tempdir().unwrap();
    let coord = Coordinator::start(CoordinatorOptions {
        workdir: Some(root.path().join("coordinator")),
        source_repo: Some(source.to_path_buf()),
        ..CoordinatorOptions::default()
    })
    .await
    .unwrap();
    let session = hosted_boot_test_support::file_mode_session(root.path(), &coord, 1.0);
    let exe = Path::new(env!("CARGO_BIN_EXE_hosted-boot"));
    let helper = credential_helper_command(exe, &session.context_path()).unwrap();
    let http = HttpContext {
        client: hosted_boot::tls::http_client(None).unwrap(),
        runtime: tokio::runtime::Handle::current(),
        request_timeout: Duration::from_secs(120),
        redactor: Redactor::new(),
        stall: Duration::from_secs(120),
        broker: None,
    };
    Sandbox {
        coord,
        _session: session,
        helper,
        http,
        root,
    }
}

/// One measured clone: seconds and bytes (and git requests) transferred.
#[derive(Clone, Copy)]
struct Sample {
    secs: f64,
    bytes: u64,
    requests: usize,
}

async fn runner_clone(sb: &Sandbox, mirror: Option<&Path>) -> Sample {
    let root = tempfile::tempdir_in(sb.root.path()).unwrap();
    let from = sb.coord.requests().len();
    let started = Instant::now();
    let prepared = prepare_repo_async(RepoSpec {
        root: root.path().to_path_buf(),
        remote_url: sb.coord.clone_url(),
        branch: sb.coord.branch(),
        credential_helper: sb.helper.clone(),
        http: sb.http.clone(),
        retry: hosted_boot::client::Policy::ONCE,
        owner: None,
        git_mirror: mirror.map(Path::to_path_buf),
    })
    .await
    .unwrap();
    let secs = started.elapsed().as_secs_f64();
    assert!(!prepared.reused);
    let (bytes, requests) = git_bytes(&sb.coord, from);
    drop_tree(root);
    Sample {
        secs,
        bytes,
        requests,
    }
}

/// The runner's clone with libgit2's checkout filters loaded for every
/// file, as before the checkout skipped them where none can apply (main
/// before 2026-12-02's third session): an empty attributes file at the XDG
/// place (`$XDG_CONFIG_HOME/git/attributes`) is a place filters could come
/// from, so the runner loads them, and the attributes it finds are none,
/// as before. The variable is set only around this clone.
async fn runner_clone_with_filters(sb: &Sandbox) -> Sample {
    let xdg = sb.root.path().join("xdg");
    std::fs::create_dir_all(xdg.join("git")).unwrap();
    std::fs::write(xdg.join("git/attributes"), "").unwrap();
    let before = std::env::var_os("XDG_CONFIG_HOME");
    // SAFETY: the bench's other threads (the runtime's, the coordinator's)
    // read no environment variable while a clone runs; set back after it.
    unsafe { std::env::set_var("XDG_CONFIG_HOME", &xdg) };
    let sample = runner_clone(sb, None).await;
    match before {
        // SAFETY: as above.
        Some(v) => unsafe { std::env::set_var("XDG_CONFIG_HOME", v) },
        // SAFETY: as above.
        None => unsafe { std::env::remove_var("XDG_CONFIG_HOME") },
    }
    sample
}

async fn cli_clone(sb: &Sandbox) -> Sample {
    let root = tempfile::tempdir_in(sb.root.path()).unwrap();
    let home = tempfile::tempdir().unwrap();
    let from = sb.coord.requests().len();
    let started = Instant::now();
    let status = tokio::process::Command::new("git")
        .env("HOME", home.path())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .args(["-c", "credential.helper="])
        .arg("-c")
        .arg(format!("credential.helper={}", sb.helper))
        .args(["-c", "credential.useHttpPath=true"])
        .args(["clone", "-q", "--depth", "1", "--single-branch", "--branch"])
        .arg(sb.coord.branch())
        .arg(sb.coord.clone_url())
        .arg(root.path().join("repo"))
        .status()
        .await
        .unwrap();
    let secs = started.elapsed().as_secs_f64();
    assert!(status.success(), "git clone failed");
    let (bytes, requests) = git_bytes(&sb.coord, from);
    drop_tree(root);
    Sample {
        secs,
        bytes,
        requests,
    }
}

/// Removes a clone outside the measured time (and off the page cache's
/// dirty list, so the next trial does not pay this one's writeback).
fn drop_tree(dir: tempfile::TempDir) {
    drop(dir);
    let _ = Command::new("sync").status();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn line(name: &str, samples: &[Sample]) {
    let secs: Vec<f64> = samples.iter().map(|s| s.secs).collect();
    let best = secs.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "{name:<44} best {best:>6.2} s, median {:>6.2} s, {:>6.2} MB in {} git requests",
        median(secs.clone()),
        samples[0].bytes as f64 / 1e6,
        samples[0].requests
    );
}

/// What the command line asks for: pairs per comparison, and whether the
/// mirror comparison runs. Cargo's own `--bench` and anything unknown are
/// ignored.
struct Args {
    pairs: usize,
    mirror: bool,
}

fn args() -> Args {
    let mut out = Args {
        pairs: TRIALS,
        mirror: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--pairs" => {
                out.pairs = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| *n > 0)
                    .expect("--pairs takes a number of pairs, at least 1");
            }
            "--no-mirror" => out.mirror = false,
            _ => {}
        }
    }
    out
}

/// Runs `a` and `b` `pairs` times, alternating which goes first.
async fn pairwise<FA, FB, A, B>(pairs: usize, mut a: FA, mut b: FB) -> (Vec<Sample>, Vec<Sample>)
where
    FA: FnMut() -> A,
    FB: FnMut() -> B,
    A: std::future::Future<Output = Sample>,
    B: std::future::Future<Output = Sample>,
{
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for trial in 0..pairs {
        if trial % 2 == 0 {
            xs.push(a().await);
            ys.push(b().await);
        } else {
            ys.push(b().await);
            xs.push(a().await);
        }
    }
    (xs, ys)
}

fn ratio(name: &str, xs: &[Sample], ys: &[Sample]) {
    let ratios: Vec<f64> = xs.iter().zip(ys).map(|(x, y)| x.secs / y.secs).collect();
    println!(
        "{name:<44} median ratio {:.2} (per pair: {})",
        median(ratios.clone()),
        ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

fn main() {
    hosted_boot::tls::install_crypto_provider();
    let args = args();
    let (source, mirror) = repositories();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let sb = sandbox(&source).await;
        // One untimed clone of each kind warms the page cache and the
        // server's side alike.
        runner_clone(&sb, None).await;
        cli_clone(&sb).await;

        let (runner, cli) =
            pairwise(args.pairs, || runner_clone(&sb, None), || cli_clone(&sb)).await;
        line("runner's clone (depth 1)", &runner);
        line("git clone --depth 1 --single-branch", &cli);
        ratio("runner / git CLI", &runner, &cli);

        let (filtered, plain) = pairwise(
            args.pairs,
            || runner_clone_with_filters(&sb),
            || runner_clone(&sb, None),
        )
        .await;
        line("runner's clone, filters loaded (main's)", &filtered);
        line("runner's clone, filters skipped", &plain);
        ratio("filters loaded / skipped", &filtered, &plain);

        if !args.mirror {
            sb.coord.shutdown().await;
            return;
        }
        let (warm, cold) = pairwise(
            args.pairs,
            || runner_clone(&sb, Some(&mirror)),
            || runner_clone(&sb, None),
        )
        .await;
        line("runner's clone, warm mirror", &warm);
        line("runner's clone, no mirror (cold)", &cold);
        ratio("warm / cold", &warm, &cold);
        sb.coord.shutdown().await;
    });
}
