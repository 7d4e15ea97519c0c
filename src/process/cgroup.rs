//! The per-turn cgroup (v2), where the sandbox lets the runner create one:
//! the agent joins it before its program starts, so everything it forks is
//! in it whatever its process group or session, and `cgroup.kill` kills all
//! of it at once (the kernel also catches what forks during the kill).
//!
//! The cgroup is `hosted-boot-<runner pid>-<n>` under the runner's own
//! cgroup (`/proc/self/cgroup`, `0::` line) in the cgroup2 mount found in
//! `/proc/self/mountinfo`. A sandbox with a read-only cgroup file system, no
//! cgroup2, or a kernel without `cgroup.kill` (before 5.14) has none: the
//! subreaper and the `/proc` sweep (`tree.rs`) do the work alone.

use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Whether turns get a cgroup (`--turn-cgroup`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CgroupMode {
    /// A per-turn cgroup when the sandbox allows one (the default).
    #[default]
    Auto,
    /// Never: the `/proc` sweep alone.
    Off,
}

/// Why a turn gets no cgroup.
#[derive(Debug, thiserror::Error)]
pub enum NoCgroup {
    /// A file of `/proc/self` could not be read.
    #[error("cannot read {file}: {error}")]
    Read {
        /// The file.
        file: &'static str,
        /// The read's error.
        error: io::Error,
    },
    /// The runner is in no cgroup v2.
    #[error("no cgroup v2 membership in /proc/self/cgroup")]
    NoMembership,
    /// No cgroup2 file system is mounted.
    #[error("no cgroup2 file system mounted")]
    NoMount,
    /// The runner's cgroup is not under the mount.
    #[error("the runner's cgroup is outside the mounted cgroup2 subtree")]
    OutsideMount,
    /// The cgroup directory could not be made (a read-only mount).
    #[error("cannot create {}: {error}", dir.display())]
    Create {
        /// The directory.
        dir: PathBuf,
        /// mkdir's error.
        error: io::Error,
    },
    /// A kernel before 5.14.
    #[error("the kernel has no cgroup.kill (Linux 5.14 or later)")]
    NoKill,
    /// `cgroup.procs` could not be opened for writing.
    #[error("cannot open {}/cgroup.procs: {error}", dir.display())]
    OpenProcs {
        /// The directory.
        dir: PathBuf,
        /// open's error.
        error: rustix::io::Errno,
    },
}

/// A turn's cgroup, removed by [`TurnCgroup::remove`].
#[derive(Debug)]
pub struct TurnCgroup {
    dir: PathBuf,
    procs: OwnedFd,
}

impl TurnCgroup {
    /// Creates the next turn cgroup of this runner.
    ///
    /// Errors: why there is none (no cgroup2 mount, not writable, no
    /// `cgroup.kill`), for a log line.
    pub fn create() -> Result<TurnCgroup, NoCgroup> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let parent = own_cgroup_dir()?;
        let name = format!(
            "hosted-boot-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let dir = parent.join(name);
        fs::create_dir(&dir).map_err(|error| NoCgroup::Create {
            dir: dir.clone(),
            error,
        })?;
        let opened = (|| {
            if !dir.join("cgroup.kill").exists() {
                return Err(NoCgroup::NoKill);
            }
            let procs = rustix::fs::open(
                dir.join("cgroup.procs"),
                rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|error| NoCgroup::OpenProcs {
                dir: dir.clone(),
                error,
            })?;
            Ok(procs)
        })();
        match opened {
            Ok(procs) => Ok(TurnCgroup { dir, procs }),
            Err(e) => {
                let _ = fs::remove_dir(&dir);
                Err(e)
            }
        }
    }

    /// The cgroup's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// `cgroup.procs` open for writing: a child writes `0` to it between
    /// fork and exec to join ([`join_from_child`]).
    pub fn procs_fd(&self) -> BorrowedFd<'_> {
        self.procs.as_fd()
    }

    /// The processes in the cgroup now.
    pub fn pids(&self) -> Vec<i32> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|t| {
                t.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// SIGKILL to every process in the cgroup.
    ///
    /// Errors: `cgroup.kill` could not be written.
    pub fn kill(&self) -> io::Result<()> {
        kill_dir(&self.dir)
    }

    /// Whether a live process is in the cgroup (zombies do not count).
    pub fn populated(&self) -> bool {
        populated(&self.dir)
    }

    /// What the cgroup's processes used, while they ran: CPU time
    /// (`cpu.stat` `usage_usec`) and the peak memory (`memory.peak`, with
    /// the memory controller enabled; Linux 5.19 or later). `None` when
    /// either cannot be read.
    pub fn usage(&self) -> Option<super::supervisor::Usage> {
        let cpu = fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
        let usec: u64 = cpu
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec "))?
            .trim()
            .parse()
            .ok()?;
        let peak: u64 = fs::read_to_string(self.dir.join("memory.peak"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        Some(super::supervisor::Usage {
            cpu: Duration::from_micros(usec),
            peak_rss_bytes: peak,
            source: super::supervisor::UsageSource::Cgroup,
        })
    }

    /// Waits (at most `bound`) until the cgroup is empty, then removes it.
    /// A cgroup that cannot be removed is logged and left behind.
    pub async fn remove(self, bound: Duration) {
        let deadline = Instant::now() + bound;
        while self.populated() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(self.procs);
        if let Err(e) = fs::remove_dir(&self.dir) {
            tracing::warn!(cgroup = %self.dir.display(), error = %e, "cannot remove the turn's cgroup");
        }
    }
}

/// Joins the cgroup whose `cgroup.procs` is `procs`: for a child between
/// fork and exec (one `write`, async-signal-safe). Errors are ignored: the
/// `/proc` sweep still covers a child that could not join.
pub fn join_from_child(procs: BorrowedFd<'_>) {
    let _ = rustix::io::write(procs, b"0");
}

/// SIGKILL to every process of the cgroup at `dir` (used by the guard).
///
/// Errors: `cgroup.kill` could not be written.
pub fn kill_dir(dir: &Path) -> io::Result<()> {
    fs::write(dir.join("cgroup.kill"), b"1")
}

/// Whether the cgroup at `dir` has a live process (`cgroup.events`).
pub fn populated(dir: &Path) -> bool {
    fs::read_to_string(dir.join("cgroup.events"))
        .map(|t| t.lines().any(|l| l.trim() == "populated 1"))
        .unwrap_or(false)
}

/// The directory of this process's cgroup v2.
fn own_cgroup_dir() -> Result<PathBuf, NoCgroup> {
    let read = |file: &'static str| {
        fs::read_to_string(file).map_err(|error| NoCgroup::Read { file, error })
    };
    let cgroups = read("/proc/self/cgroup")?;
    let path = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or(NoCgroup::NoMembership)?;
    let mountinfo = read("/proc/self/mountinfo")?;
    let (root, mount_point) = cgroup2_mount(&mountinfo).ok_or(NoCgroup::NoMount)?;
    let relative = if root == "/" {
        path
    } else {
        path.strip_prefix(root.as_str())
            .filter(|r| r.is_empty() || r.starts_with('/'))
            .ok_or(NoCgroup::OutsideMount)?
    };
    Ok(PathBuf::from(mount_point).join(relative.trim_start_matches('/')))
}

/// The root and mount point of the first cgroup2 mount in `mountinfo`.
fn cgroup2_mount(mountinfo: &str) -> Option<(String, String)> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let fields: Vec<&str> = left.split_whitespace().collect();
        Some((unescape(fields.get(3)?), unescape(fields.get(4)?)))
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|_| bytes[i] == b'\\')
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        if let Some(v) = octal {
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cgroup2_mount_is_found_in_mountinfo() {
        let text = "\
30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 25 0:31 / /sys/fs/cgroup/uni\\040fied rw,relatime shared:9 - cgroup2 cgroup2 rw
";
        assert_eq!(
            cgroup2_mount(text),
            Some(("/".to_string(), "/sys/fs/cgroup/uni fied".to_string()))
        );
        assert_eq!(
            cgroup2_mount("30 25 0:26 / /x rw - ext4 /dev/sda rw\n"),
            None
        );
        assert_eq!(unescape("a\\"), "a\\");
    }
}
