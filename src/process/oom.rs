//! The kernel's choice when the sandbox runs out of memory (PROTOCOL.md 4.1
//! step 4, "The runner protects itself"): the runner lowers its own
//! `oom_score_adj` at boot (the turn's guard, forked by the agent's child
//! before it raises its own, keeps the runner's), and each agent starts
//! with the highest, so the OOM killer takes the agent, whose turn then
//! fails `agent_crashed` naming SIGKILL, and not the runner, which holds
//! the only record of the turn.

use std::io;

/// The runner's own `oom_score_adj`: the OOM killer's last choice short of
/// `-1000` (never), so a runner that is itself the leak can still go.
pub const RUNNER: i32 = -900;

/// The agent's `oom_score_adj`: the OOM killer's first choice.
pub const AGENT: i32 = 1000;

/// Lowers this process's `oom_score_adj` to [`RUNNER`].
///
/// Errors: `/proc/self/oom_score_adj` cannot be written (lowering needs
/// `CAP_SYS_RESOURCE`: a runner that is not root keeps its score).
pub fn protect_runner() -> io::Result<()> {
    std::fs::write("/proc/self/oom_score_adj", format!("{RUNNER}\n"))
}

/// The current process's `oom_score_adj`, if readable.
pub fn current() -> Option<i32> {
    std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Raises the calling process's `oom_score_adj` to [`AGENT`]; for the
/// agent's child between fork and exec. Raising needs no privilege; a
/// failure (no `/proc`) is ignored: the agent then keeps the runner's score.
///
/// Safety (async-signal-safety): only `open`, `write` and `close` as raw
/// system calls on static data; nothing allocates.
pub fn raise_in_child() {
    const PATH: &std::ffi::CStr = c"/proc/self/oom_score_adj";
    const VALUE: &[u8] = b"1000\n";
    // SAFETY: a static NUL-terminated path, a static buffer, and a
    // descriptor this function alone owns and closes.
    unsafe {
        let fd = libc::open(PATH.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            let _ = libc::write(fd, VALUE.as_ptr().cast(), VALUE.len());
            libc::close(fd);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_agent_value_is_the_one_written_in_the_child() {
        assert_eq!(format!("{}\n", super::AGENT), "1000\n");
    }
}
