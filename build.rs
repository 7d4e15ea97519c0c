//! Links the runner's release build in the order of link/symbol-order.txt
//! (issue 44): the functions a session runs first and together.
//!
//! Most of the runner's resident set is its own clean file pages, which the
//! kernel maps 64 KiB around each fault. Unordered, the code a boot and a
//! turn run is spread over the whole text and nearly all of it ends up
//! mapped; ordered, it fills few windows (BENCHMARKS.md, "The boot's
//! targets"). `scripts/symbol-order` writes the file from a profiled session.
//!
//! Only where the linker is known to be lld, which reads the file: rustc's
//! own for x86_64-unknown-linux-gnu since Rust 1.90, unless RUSTFLAGS picks
//! another. Anywhere else the build is as before. Names in the file that no
//! longer exist are ignored, so a stale file costs layout, never a build.

use std::path::Path;
use std::process::Command;

const ORDER: &str = "link/symbol-order.txt";

fn main() {
    println!("cargo::rerun-if-changed={ORDER}");
    println!("cargo::rerun-if-env-changed=HOSTED_BOOT_NO_SYMBOL_ORDER");
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    let off = std::env::var_os("HOSTED_BOOT_NO_SYMBOL_ORDER").is_some_and(|v| !v.is_empty());
    if !release || off || !rust_lld_links() {
        return;
    }
    let Ok(dir) = std::env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let order = Path::new(&dir).join(ORDER);
    if order.is_file() {
        println!(
            "cargo::rustc-link-arg-bin=hosted-boot=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        println!("cargo::rustc-link-arg-bin=hosted-boot=-Wl,--no-warn-symbol-ordering");
    }
}

/// Whether this build links with rustc's own lld: the target is
/// x86_64-unknown-linux-gnu, rustc is 1.90 or later, and RUSTFLAGS chooses
/// no other linker.
fn rust_lld_links() -> bool {
    if std::env::var("TARGET").as_deref() != Ok("x86_64-unknown-linux-gnu") {
        return false;
    }
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    if ["linker", "fuse-ld", "link-self-contained"]
        .iter()
        .any(|f| flags.contains(f))
    {
        return false;
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let Ok(out) = Command::new(rustc).arg("--version").output() else {
        return false;
    };
    // "rustc 1.95.0 (59807616e 2026-04-14)"
    let version = String::from_utf8_lossy(&out.stdout);
    let minor = version
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok());
    matches!(minor, Some(m) if m >= 90)
}
