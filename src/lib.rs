//! hosted-boot: the entrypoint of a cloud sandbox in which an AI coding agent
//! works on a user's repository. See `ARCHITECTURE.md` for the codemap and
//! `docs/PROTOCOL.md` for the wire contract.

pub mod agent;
pub mod boot;
pub mod check;
pub mod checks;
pub mod cli;
pub mod client;
pub mod config;
pub mod coordinator;
pub mod demo;
pub mod environment;
pub mod idle;
pub mod logging;
pub mod reaper;
pub mod redact;
pub mod secret;
pub mod signals;
pub mod status;
pub mod status_line;
pub mod supervise;
pub mod timings;
pub mod tls;
pub mod turn;
pub mod wire;
pub mod workspace;
