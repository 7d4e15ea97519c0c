//! The integration suite: one test binary, modules under `suite/`.
mod suite;
