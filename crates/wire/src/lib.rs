//! The contract between the hosted-boot runner and its coordinator
//! (`docs/PROTOCOL.md`), shared by the runner, the reference coordinator
//! and the conformance checker so that they cannot drift: the wire types and
//! the route table ([`wire`]), the value checks of section 5 ([`validate`]),
//! the contract's durations ([`timings`]), the one type that holds a secret
//! ([`secret`]), text helpers for messages ([`text`]), where the runner's
//! peers find the runner binary ([`runner_binary`]), and the primitives
//! every crate of the workspace shares (locks that survive a panicked
//! holder, [`locks`]). It depends on no other crate of the workspace
//! (ARCHITECTURE.md, "Crates").

// The unit tests may panic on what the runtime must handle (a panic is the
// test's failure); clippy.toml does the same for unwrap_used/expect_used.
#![cfg_attr(
    test,
    allow(
        clippy::string_slice,
        clippy::cast_possible_wrap,
        clippy::unchecked_time_subtraction,
        reason = "test code: a panic is a test failure"
    )
)]

pub mod locks;
pub mod runner_binary;
pub mod secret;
pub mod text;
pub mod timings;
pub mod validate;
pub mod wire;
