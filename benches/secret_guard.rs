//! Cost of the harvest's secret guard (PROTOCOL.md 4.5, "Secrets in the
//! agent's work") on a large push: 1,000 new files of 50 KB (50 MB) left in
//! `repo/`, harvested (committed, looked through, pushed over smart HTTP to
//! the reference coordinator on loopback) with 100 secrets registered, and
//! with none (the guard then walks the commits and reads each blob but
//! matches nothing), best and median of 3 runs each; and the matcher alone
//! (`Redactor::contains`) over the same 50 MB. Run with
//! `cargo bench --bench secret_guard`; the figures go to BENCHMARKS.md.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark set-up: a panic names what is missing"
)]

use std::path::Path;
use std::time::{Duration, Instant};

use hosted_boot::redact::{Redactor, SecretKind};
use hosted_boot::secret::Secret;
use hosted_boot::workspace::{
    HarvestJob, Harvester, HttpContext, RepoSpec, credential_helper_command, prepare_repo_async,
};
use hosted_boot_coordinator::{Coordinator, CoordinatorOptions};

const FILES: usize = 1000;
const FILE_BYTES: usize = 50_000;
const SECRETS: usize = 100;
const RUNS: usize = 3;

/// xorshift: the same content on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn token(&mut self, len: usize) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
        (0..len)
            .map(|_| ALPHABET[(self.next() % ALPHABET.len() as u64) as usize] as char)
            .collect()
    }
}

const WORDS: &[&str] = &[
    "fn",
    "let",
    "mut",
    "self",
    "return",
    "Ok(())",
    "\"\\n\"",
    "100%",
    "src/main.rs",
    "impl",
    "{",
    "}",
    "=>",
    "match",
    "value",
    "error",
    "// why",
    "#[test]",
    "x + 1",
    "println!",
];

/// Source-like text (escapes and `%` included, so the decoded view runs).
fn file(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(FILE_BYTES + 64);
    while out.len() < FILE_BYTES {
        let w = WORDS[(rng.next() % WORDS.len() as u64) as usize];
        out.extend_from_slice(w.as_bytes());
        out.push(if rng.next().is_multiple_of(9) {
            b'\n'
        } else {
            b' '
        });
    }
    out.truncate(FILE_BYTES);
    out
}

fn secrets(redactor: &Redactor) {
    let mut rng = Rng(0x5eed);
    for i in 0..SECRETS {
        let value = match i % 3 {
            0 => format!("ghs_{}", rng.token(36)),
            1 => format!("sk-{}", rng.token(44)),
            _ => rng.token(12 + i % 20),
        };
        redactor.add(&Secret::new(value), SecretKind::Configured);
    }
}

/// One harvest of the 50 MB in a fresh sandbox; returns its duration.
async fn harvest_once(with_secrets: bool) -> Duration {
    let root = tempfile::tempdir().unwrap();
    let coord = Coordinator::start(CoordinatorOptions {
        workdir: Some(root.path().join("coordinator")),
        ..CoordinatorOptions::default()
    })
    .await
    .unwrap();
    let session = hosted_boot_test_support::file_mode_session(root.path(), &coord, 1.0);
    let exe = Path::new(env!("CARGO_BIN_EXE_hosted-boot"));
    let helper = credential_helper_command(exe, &session.context_path()).unwrap();
    let redactor = Redactor::new();
    if with_secrets {
        secrets(&redactor);
    }
    let http = HttpContext {
        client: hosted_boot::tls::http_client(None).unwrap(),
        runtime: tokio::runtime::Handle::current(),
        request_timeout: Duration::from_secs(120),
        redactor,
        stall: Duration::from_secs(120),
        broker: None,
    };
    let prepared = prepare_repo_async(RepoSpec {
        root: root.path().to_path_buf(),
        remote_url: coord.clone_url(),
        branch: coord.branch(),
        credential_helper: helper.clone(),
        http: http.clone(),
        retry: hosted_boot::client::Policy::ONCE,
        owner: None,
        git_mirror: None,
    })
    .await
    .unwrap();
    let mut rng = Rng(42);
    for i in 0..FILES {
        let dir = prepared.path.join(format!("d{}", i % 20));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("f{i}.rs")), file(&mut rng)).unwrap();
    }
    let harvester = Harvester {
        repo_dir: prepared.path.clone(),
        remote_url: coord.clone_url(),
        branch: coord.branch(),
        credential_helper: helper,
        http,
        time_scale: 1.0,
        max_file_size: None,
        owner: None,
    };
    let started = Instant::now();
    let result = harvester
        .harvest(HarvestJob {
            name: "run-1".into(),
            outcome: None,
            start: None,
            bound: Duration::from_secs(600),
        })
        .await;
    let took = started.elapsed();
    assert!(result.pushed, "{result:?}");
    assert!(result.blocked_paths.is_empty(), "{result:?}");
    coord.shutdown().await;
    took
}

fn report(name: &str, mut runs: Vec<Duration>) {
    runs.sort();
    println!(
        "{name:<48} best {:>7.2} s, median {:>7.2} s",
        runs[0].as_secs_f64(),
        runs[runs.len() / 2].as_secs_f64()
    );
}

fn main() {
    hosted_boot::tls::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut with = Vec::new();
    let mut without = Vec::new();
    for _ in 0..RUNS {
        without.push(runtime.block_on(harvest_once(false)));
        with.push(runtime.block_on(harvest_once(true)));
    }
    report("harvest of 50 MB, no secret registered", without);
    report("harvest of 50 MB, 100 secrets registered", with);

    let redactor = Redactor::new();
    secrets(&redactor);
    let mut rng = Rng(42);
    let files: Vec<Vec<u8>> = (0..FILES).map(|_| file(&mut rng)).collect();
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        let started = Instant::now();
        let found = files.iter().filter(|f| redactor.contains(f)).count();
        runs.push(started.elapsed());
        assert_eq!(found, 0);
    }
    report("Redactor::contains over the 50 MB, 100 secrets", runs);
}
