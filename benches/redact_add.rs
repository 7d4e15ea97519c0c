//! Cost of adding one secret to a [`Redactor`] that already holds N (issue
//! 15, "Load": each turn adds its proxy token and rotated credentials, so an
//! addition's cost decides what a long session costs), for N = 10, 100,
//! 1,000 and 5,000 secrets of the shapes the runner sees (~40-byte tokens,
//! about 6 pattern forms each; PROTOCOL.md section 5).
//!
//! For each N: the first N secrets are added one `add` at a time (as a
//! session adds them; the sum is printed; for N = 5,000 in one `add_many`),
//! then `ADDS` more single additions
//! are timed one by one (best and median, in microseconds), and the process's
//! RSS (`/proc/self/status` VmRSS, MiB) is read after them. Run with
//! `cargo bench --bench redact_add`; the figures go to BENCHMARKS.md.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark set-up: a panic names what is missing"
)]

use std::time::{Duration, Instant};

use hosted_boot::redact::{Redactor, SecretKind};
use hosted_boot::secret::Secret;

const SIZES: &[usize] = &[10, 100, 1000, 5000];
const ADDS: usize = 20;

/// The `i`-th secret: `ghs_` and 36 hex digits (a repo token's shape), the
/// same on every run.
fn secret(i: u64) -> Secret {
    let h = u128::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835);
    Secret::new(format!("ghs_{:036x}", h >> 16))
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

fn main() {
    println!("hosted-boot redactor additions: one add with N secrets held, {ADDS} adds each");
    for &n in SIZES {
        let redactor = Redactor::new();
        let mut next = 0u64;
        let mut fresh = || {
            next += 1;
            secret(next)
        };
        // One by one up to 1,000 (what a session does; before the levels,
        // 5,000 one by one took many minutes), in one `add_many` beyond.
        let t0 = Instant::now();
        let one_by_one = n <= 1000;
        if one_by_one {
            for _ in 0..n {
                redactor.add(&fresh(), SecretKind::Credential);
            }
        } else {
            let batch: Vec<Secret> = (0..n).map(|_| fresh()).collect();
            redactor.add_many(&batch.iter().collect::<Vec<_>>(), SecretKind::Credential);
        }
        let fill = t0.elapsed();
        let mut times: Vec<Duration> = (0..ADDS)
            .map(|_| {
                let s = fresh();
                let t = Instant::now();
                redactor.add(&s, SecretKind::Credential);
                t.elapsed()
            })
            .collect();
        times.sort_unstable();
        // A search after the additions, so none of them is optimized away
        // and the figures hold for a redactor that still finds everything.
        assert_eq!(redactor.redact("nothing here"), "nothing here");
        println!(
            "N = {n:>5}: one add best {:>9.1} us, median {:>9.1} us, mean {:>9.1} us; the {n} before {} {:.2} s; RSS {:.1} MiB; {redactor:?}",
            times[0].as_secs_f64() * 1e6,
            times[ADDS / 2].as_secs_f64() * 1e6,
            times.iter().sum::<Duration>().as_secs_f64() * 1e6 / ADDS as f64,
            if one_by_one {
                "one by one"
            } else {
                "in one add_many"
            },
            fill.as_secs_f64(),
            rss_mib(),
        );
    }
}
