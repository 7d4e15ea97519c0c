//! The subcommands other than `run` (whose runtime is [`crate::boot`]):
//! `check`, `checkpoint`, `supervise` and the built-in demo agent (`demo-agent`). Each
//! takes its parsed arguments and returns an exit code. (`conformance` is a
//! binary of its own: crates/conformance.)

pub mod check;
pub mod checkpoint;
pub mod demo;
pub mod supervise;
