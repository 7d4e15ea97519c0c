//! A Unix socket's path of any length (issue 31): `sun_path` holds 107
//! bytes and a NUL, and `<root>/.orizu-session/<id>/credential.sock` can be
//! longer (a session id may have 128 characters, a root any length). A
//! longer path is reached through its directory, opened first: the bind or
//! connect goes to `/proc/self/fd/<fd>/<name>`, which the kernel resolves
//! through the open directory, so the socket stays at its documented place.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// The longest path `sun_path` takes (108 bytes with the NUL).
pub const SUN_PATH_MAX: usize = 107;

/// A socket's path as `bind` and `connect` can take it; holds the
/// directory open while it is used.
pub struct SocketPath {
    path: PathBuf,
    _dir: Option<OwnedFd>,
}

impl SocketPath {
    /// `path` itself when it fits `sun_path`, else the same file through
    /// its directory, opened now.
    ///
    /// Errors: the directory cannot be opened, `/proc` (which the long path
    /// goes through) is not mounted, or the file name alone is too long; the
    /// message names the path and its length.
    pub fn new(path: &Path) -> io::Result<SocketPath> {
        let len = path.as_os_str().len();
        if len <= SUN_PATH_MAX {
            return Ok(SocketPath {
                path: path.to_path_buf(),
                _dir: None,
            });
        }
        let too_long = |why: String| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the socket path {} is {len} bytes, over the {SUN_PATH_MAX} a socket address holds, and {why}",
                    path.display()
                ),
            )
        };
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(too_long("it has no directory to go through".into()));
        };
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        let fd = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| too_long(format!("its directory cannot be opened ({e})")))?;
        let short = Path::new("/proc/self/fd")
            .join(fd.as_raw_fd().to_string())
            .join(name);
        if short.as_os_str().len() > SUN_PATH_MAX {
            return Err(too_long(format!(
                "its file name alone ({} bytes) does not fit",
                name.len()
            )));
        }
        if !proc_fds_mounted() {
            return Err(too_long(
                "/proc is not mounted, through which a longer path is reached; mount /proc or use a shorter root or session id".into(),
            ));
        }
        Ok(SocketPath {
            path: short,
            _dir: Some(fd),
        })
    }

    /// The path to give `bind` or `connect`.
    pub fn as_path(&self) -> &Path {
        &self.path
    }
}

/// Whether `/proc/self/fd` resolves (a procfs is mounted).
pub fn proc_fds_mounted() -> bool {
    Path::new("/proc/self/fd").is_dir()
}

/// What `check` reports of a socket at `path`: `None` when any process can
/// bind and connect it; else why not.
pub fn limit(path: &Path) -> Option<String> {
    let len = path.as_os_str().len();
    let name = path.file_name().map_or(0, OsStr::len);
    if len <= SUN_PATH_MAX {
        None
    } else if !proc_fds_mounted() {
        Some(format!(
            "the credential socket's path is {len} bytes (over {SUN_PATH_MAX}) and /proc is not mounted to reach it through its directory; mount /proc, or shorten HOSTED_BOOT_ROOT or the session id"
        ))
    } else if name + "/proc/self/fd/2147483647/".len() > SUN_PATH_MAX {
        Some(format!(
            "the credential socket's file name is {name} bytes, too long for a socket address"
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_over_sun_path_is_bound_and_connected_through_its_directory() {
        let base = tempfile::tempdir().unwrap();
        let mut dir = base.path().to_path_buf();
        while dir.as_os_str().len() < 200 {
            dir.push("a-directory-of-the-session");
        }
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("credential.sock");
        assert!(path.as_os_str().len() > SUN_PATH_MAX);
        assert!(std::os::unix::net::UnixListener::bind(&path).is_err());
        let bind = SocketPath::new(&path).unwrap();
        let listener = std::os::unix::net::UnixListener::bind(bind.as_path()).unwrap();
        drop(bind);
        assert!(path.exists(), "the socket is at its own path");
        let connect = SocketPath::new(&path).unwrap();
        let _client = std::os::unix::net::UnixStream::connect(connect.as_path()).unwrap();
        listener.accept().unwrap();
        assert_eq!(limit(&path), None);
        let short = base.path().join("s.sock");
        assert_eq!(SocketPath::new(&short).unwrap().as_path(), short);
    }
}
