//! The agent's processes: spawn in a session of its own, interrupt, grace,
//! sweep, drain (PROTOCOL.md 4.1, 4.4), and the framing of their output.
//!
//! - [`supervisor`]: one process tree from spawn to the last reap.
//! - [`tree`]: the tree beyond the group (subreaper, /proc scan, sweep).
//! - [`cgroup`]: the per-turn cgroup v2, where allowed.
//! - [`user_kill`]: `--agent-user`: every process of that user at once.
//! - [`guard`]: `hosted-boot turn-guard`, which kills the tree when the
//!   runner dies.
//! - [`output`]: one output stream: streaming redaction, then lines.
//! - [`lines`]: byte line framing with a cap.
//! - [`oom`]: the runner's and the agent's `oom_score_adj`.
//! - [`reaper`]: PID 1: re-exec as the worker and reap.

pub mod cgroup;
pub mod guard;
pub mod lines;
pub mod oom;
pub mod output;
pub mod reaper;
pub mod supervisor;
pub mod tree;
pub mod user_kill;
