//! The subcommands other than `run` (whose runtime is [`crate::boot`]):
//! `check`, `supervise`, `demo` and `conformance`. Each takes its parsed arguments and
//! returns an exit code.

pub mod check;
pub mod conformance;
pub mod demo;
pub mod supervise;
