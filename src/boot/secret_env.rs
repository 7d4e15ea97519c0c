//! Taking the boot secret out of the process environment, before any
//! thread exists: out of the variables the process will read (returned as
//! a map without it) and out of the initial environment block the kernel
//! placed, so that `/proc/<pid>/environ` no longer shows it (PROTOCOL.md
//! section 3); and, before that, keeping it out of a core dump and out of
//! another process's reach ([`harden`]). The runner's `main` and the
//! conformance checker's call both first.

use std::collections::BTreeMap;
use std::ffi::{CStr, OsString, c_char};

use super::config::BOOT_SECRET_VAR;
use crate::secret::Secret;

/// Keeps the boot secret out of a core dump and out of the reach of a
/// process of the same user (`/proc/<pid>/mem`, ptrace; PROTOCOL.md section
/// 3): core dumps off (soft and hard `RLIMIT_CORE` 0, so nothing in the
/// runner's tree turns them back on), then non-dumpable. Before the secret
/// is read: it is in the initial environment block from the exec on.
///
/// Errors: which call the kernel refused and why, for `who` ("the runner")
/// to refuse to start (a process whose secret can be dumped is not started).
pub fn harden(who: &str) -> Result<(), HardenError> {
    use rustix::process::{DumpableBehavior, Resource, Rlimit};
    let off = Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    rustix::process::setrlimit(Resource::Core, off).map_err(|error| HardenError::CoreDumps {
        who: who.to_string(),
        error,
    })?;
    rustix::process::set_dumpable_behavior(DumpableBehavior::NotDumpable).map_err(|error| {
        HardenError::Dumpable {
            who: who.to_string(),
            error,
        }
    })
}

/// A call of [`harden`] the kernel refused: `who` refuses to start.
#[derive(Debug, thiserror::Error)]
pub enum HardenError {
    /// `setrlimit(RLIMIT_CORE, 0)`.
    #[error(
        "cannot turn core dumps off (setrlimit RLIMIT_CORE 0): {error}; a core dump would hold the boot secret, so {who} is refusing to start (does a seccomp policy of the sandbox forbid setrlimit/prlimit64?)"
    )]
    CoreDumps {
        /// Who refuses ("the runner").
        who: String,
        /// The kernel's answer.
        error: rustix::io::Errno,
    },
    /// `prctl(PR_SET_DUMPABLE, 0)`.
    #[error(
        "cannot mark the process non-dumpable (prctl PR_SET_DUMPABLE 0): {error}; a process of the same user could read the boot secret from /proc/<pid>/mem, so {who} is refusing to start (does a seccomp policy of the sandbox forbid prctl?)"
    )]
    Dumpable {
        /// Who refuses.
        who: String,
        /// The kernel's answer.
        error: rustix::io::Errno,
    },
}

unsafe extern "C" {
    static environ: *const *mut c_char;
}

/// Overwrites the boot secret's bytes in the initial environment block, so
/// that `/proc/<pid>/environ` no longer shows it (PROTOCOL.md section 3).
///
/// Safety: call before any other thread exists and before the environment
/// is modified; it writes inside strings the kernel placed for this process.
unsafe fn scrub_initial_environment() {
    let prefix = format!("{BOOT_SECRET_VAR}=");
    // SAFETY: `environ` is a NULL-terminated array of NUL-terminated strings
    // owned by this process; no other thread reads it yet.
    unsafe {
        let mut entry = environ;
        if entry.is_null() {
            return;
        }
        while !(*entry).is_null() {
            let text = CStr::from_ptr(*entry);
            let len = text.to_bytes().len();
            if text.to_bytes().starts_with(prefix.as_bytes()) {
                for i in prefix.len()..len {
                    *(*entry).add(i) = 0;
                }
            }
            entry = entry.add(1);
        }
    }
}

/// The process environment without the boot secret, and the secret.
///
/// # Safety
///
/// Call before any other thread exists and before the environment is read
/// or modified elsewhere: it edits the environment and writes inside the
/// strings of the initial environment block.
pub unsafe fn take_boot_secret() -> (BTreeMap<OsString, OsString>, Option<Secret>) {
    let mut env: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
    let secret = env.remove(&OsString::from(BOOT_SECRET_VAR)).map(secret_of);
    // SAFETY: single-threaded, as this function's contract requires.
    unsafe {
        scrub_initial_environment();
        std::env::remove_var(BOOT_SECRET_VAR);
    }
    (env, secret)
}

/// The boot secret as a [`Secret`], in the same buffer (valid UTF-8) or
/// with the copied bytes zeroized, so no copy outlives the `Secret`, which
/// zeroizes on drop (broker mode keeps it only in memory, PROTOCOL.md 3).
fn secret_of(value: OsString) -> Secret {
    use std::os::unix::ffi::OsStringExt;
    match String::from_utf8(value.into_vec()) {
        Ok(text) => Secret::new(text),
        Err(e) => {
            let mut bytes = e.into_bytes();
            let text = String::from_utf8_lossy(&bytes).into_owned();
            zeroize::Zeroize::zeroize(&mut bytes);
            Secret::new(text)
        }
    }
}
