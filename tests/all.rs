//! The integration suite: one test binary, modules under `suite/`.

// A test fails with a panic, and an unwrap's message is the value that
// broke it. clippy.toml's allow-*-in-tests covers only `#[test]` functions,
// not the suite's helpers (support.rs, fakes), so the crate allows them.
// Pids from the kernel fit an i32, and the texts sliced are the suite's own.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::cast_possible_wrap,
    clippy::string_slice,
    reason = "test code: a panic is a test failure (see above)"
)]
mod suite;
