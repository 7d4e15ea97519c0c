//! hosted-boot: the entrypoint of a cloud sandbox in which an AI coding agent
//! works on a user's repository. See `ARCHITECTURE.md` for the codemap and
//! the layers (each module imports only from layers below it, checked by
//! `.ci/layers`), and `docs/PROTOCOL.md` for the wire contract.

// The unit tests may panic on what the runtime must handle (a panic is the
// test's failure); clippy.toml does the same for unwrap_used/expect_used.
// The non-test build of the library is still checked (`--all-targets`).
#![cfg_attr(
    test,
    allow(
        clippy::string_slice,
        clippy::cast_possible_wrap,
        clippy::unchecked_time_subtraction,
        reason = "test code: a panic is a test failure"
    )
)]

// Subcommands, apart from the runtime.
pub mod cli;
pub mod cmd;
// The fuzz targets of every parser of outside input (tests only).
#[cfg(test)]
mod fuzz;

// The runtime, top to bottom (the layers of ARCHITECTURE.md).
pub mod boot;

pub(crate) mod turn;

pub mod agent;
pub mod agent_api;
pub mod egress;
pub mod workspace;

pub mod events;
pub mod process;

pub mod client;

pub mod logging;
pub mod status;
// The exporters of traces and metrics (below the log, which feeds its
// layer).
pub mod telemetry;

pub mod session_dir;

// Foundations.
pub mod agent_user;
// Public for the conformance checker, which stops its runner as a sandbox does.
pub mod signals;
pub(crate) mod status_line;
pub mod tls;

// Primitives every layer shares (crate-internal).
mod concurrency;

// The contract, a crate of its own (issue 34): re-exported under the names
// the runner's modules use, so that `crate::wire`, `crate::secret`, … read
// as before. The layers of ARCHITECTURE.md keep them at the bottom.
pub use hosted_boot_wire::{secret, text, timings, validate, wire};

// The redactor, a crate of its own (issue 34): a change to it rebuilds and
// tests that crate alone.
pub use hosted_boot_redact as redact;
