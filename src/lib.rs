//! hosted-boot: the entrypoint of a cloud sandbox in which an AI coding agent
//! works on a user's repository. See `ARCHITECTURE.md` for the codemap and
//! the layers (each module imports only from layers below it, checked by
//! `.ci/layers`), and `docs/PROTOCOL.md` for the wire contract.

// Subcommands, apart from the runtime.
pub mod cli;
pub mod cmd;
pub mod coordinator;

// The runtime, top to bottom.
pub mod agent;
pub mod boot;
pub mod client;
pub mod events;
pub mod logging;
pub mod process;
pub mod redact;
pub mod status;
pub mod turn;
pub mod wire;
pub mod workspace;

// Foundations.
pub mod secret;
pub mod session_dir;
pub mod signals;
pub mod status_line;
pub mod timings;
pub mod tls;
pub mod validate;

// Primitives every layer shares (crate-internal).
mod sync;
mod text;
