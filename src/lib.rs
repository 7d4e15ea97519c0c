//! hosted-boot: the entrypoint of a cloud sandbox in which an AI coding agent
//! works on a user's repository. See `ARCHITECTURE.md` for the codemap and
//! `docs/PROTOCOL.md` for the wire contract.

pub mod checks;
pub mod coordinator;
pub mod secret;
pub mod timings;
pub mod wire;
pub mod client;
pub mod redact;
pub mod tls;
pub mod workspace;
