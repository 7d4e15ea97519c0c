//! Links the runner's release build in the order of link/symbol-order.txt
//! (issue 44): the functions a session runs first and together.
//!
//! Most of the runner's resident set is its own clean file pages, which the
//! kernel maps 64 KiB around each fault. Unordered, the code a boot and a
//! turn run is spread over the whole text and nearly all of it ends up
//! mapped; ordered, it fills few windows (BENCHMARKS.md, "The boot's
//! targets"). `scripts/symbol-order` writes the file from a profiled session.
//!
//! Only where the linker takes the option: an empty program is linked with
//! it first, with this build's rustc, flags and linker (rustc's own lld
//! does for x86_64-unknown-linux-gnu since Rust 1.90; GNU ld, which a
//! distribution's rustc or a configured `gcc` linker uses, does not). Where
//! it does not, the build is as before, with a warning. The file's names
//! hash the build's settings (toolchain, profile, target, features): a
//! build with others links mostly unordered, never fails for it.
//! `HOSTED_BOOT_NO_SYMBOL_ORDER=1` (or true, yes, on) links unordered.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const ORDER: &str = "link/symbol-order.txt";

fn main() {
    let Ok(dir) = std::env::var("CARGO_MANIFEST_DIR") else {
        return;
    };
    let order = Path::new(&dir).join(ORDER);
    // Watching a path that does not exist would rebuild the crate on every
    // build: without the file, this script is what is watched.
    if order.is_file() {
        println!("cargo::rerun-if-changed={ORDER}");
    } else {
        println!("cargo::rerun-if-changed=build.rs");
    }
    println!("cargo::rerun-if-env-changed=HOSTED_BOOT_NO_SYMBOL_ORDER");
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    let off = std::env::var("HOSTED_BOOT_NO_SYMBOL_ORDER").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    });
    if !release || off || !order.is_file() {
        return;
    }
    if let Err(why) = linker_orders() {
        println!(
            "cargo::warning=the runner is linked unordered (BENCHMARKS.md, \"The boot's \
             targets\"): a program linked with --symbol-ordering-file failed ({why})"
        );
        return;
    }
    // Two arguments, not `-Wl,…`, which would split a path at its commas.
    let arg = |a: &str| println!("cargo::rustc-link-arg-bin=hosted-boot={a}");
    arg("-Xlinker");
    arg(&format!("--symbol-ordering-file={}", order.display()));
    arg("-Xlinker");
    arg("--no-warn-symbol-ordering");
}

/// Whether this build's link takes `--symbol-ordering-file`: an empty
/// program, linked by this build's rustc with its target, flags and
/// configured linker and the option, links. Err: the first line of what
/// rustc said (the linker's refusal, most likely).
fn linker_orders() -> Result<(), String> {
    let (Ok(rustc), Ok(out), Ok(target)) = (
        std::env::var("RUSTC"),
        std::env::var("OUT_DIR"),
        std::env::var("TARGET"),
    ) else {
        return Err("cargo set no RUSTC, OUT_DIR or TARGET".to_string());
    };
    let out = PathBuf::from(out);
    let source = out.join("symbol-order-probe.rs");
    let names = out.join("symbol-order-probe.txt");
    std::fs::write(&source, "//! A link probe.\nfn main() {}\n")
        .and_then(|()| std::fs::write(&names, ""))
        .map_err(|e| format!("cannot write the probe into {}: {e}", out.display()))?;
    let mut probe = Command::new(rustc);
    probe
        .arg("--edition=2021")
        .arg("--crate-type=bin")
        // The build's own lints (RUSTFLAGS' -D …) are not this probe's.
        .arg("--cap-lints=allow")
        .arg("--target")
        .arg(&target)
        .arg("-o")
        .arg(out.join("symbol-order-probe"))
        .args(["-C", "link-arg=-Xlinker", "-C"])
        .arg(format!(
            "link-arg=--symbol-ordering-file={}",
            names.display()
        ))
        .arg(&source);
    let flags = std::env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default();
    probe.args(flags.split('\u{1f}').filter(|f| !f.is_empty()));
    if let Ok(linker) = std::env::var("RUSTC_LINKER") {
        probe.arg("-C").arg(format!("linker={linker}"));
    }
    let output = probe
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run rustc: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&output.stderr);
    Err(said
        .lines()
        .find(|l| l.contains("error") || l.contains("unrecognized"))
        .unwrap_or("rustc failed")
        .trim()
        .to_string())
}
