//! Where the runner's peers find the runner binary: the reference
//! coordinator (`hosted-boot-coordinator`, whose demo boots it and whose
//! `serve` prints a line that does) and the conformance checker
//! (`hosted-boot-conformance`, which runs one real turn with it). Each is a
//! binary of its own (issue 34) and runs the runner as a child, never links
//! it.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

/// The runner binary's file name.
pub const NAME: &str = "hosted-boot";

/// Why no runner was found; the message says where it looked and what to
/// pass.
#[derive(Debug, thiserror::Error)]
pub enum NotFound {
    /// `--runner` named something that is not an executable file.
    #[error(
        "the runner {} is not an executable file; pass --runner the path of the `{NAME}` binary",
        .0.display()
    )]
    NotExecutable(PathBuf),
    /// Neither beside this binary nor on `PATH`.
    #[error(
        "the runner binary `{NAME}` is neither beside this binary ({}) nor on PATH; build both (`cargo build --release` builds every binary of the workspace), put `{NAME}` on PATH, or pass --runner PATH",
        .beside.as_ref().map_or_else(|| "its own path is unknown".to_string(), |p| p.display().to_string())
    )]
    Nowhere {
        /// Where it would be beside this binary.
        beside: Option<PathBuf>,
    },
}

/// The runner binary, as an absolute path: `given` (a `--runner` flag)
/// when it names an executable file; else `hosted-boot` beside this binary
/// (as `cargo build` leaves them, and as a sandbox image that carries both
/// has them), else on `PATH`.
///
/// Absolute because the path is used where the working directory is
/// another (the runner starts its agent, this binary again, in `repo/`; a
/// printed line is pasted elsewhere) and because `Command::new` looks a bare
/// name up on `PATH`: a relative `hosted-boot` checked here in the working
/// directory would run another binary, one on `PATH`, given the boot secret.
/// Not canonical: a symbolic link given stays the link.
///
/// Errors: see [`NotFound`].
pub fn find(given: Option<&Path>) -> Result<PathBuf, NotFound> {
    if let Some(path) = given {
        return match std::path::absolute(path) {
            Ok(path) if executable(&path) => Ok(path),
            _ => Err(NotFound::NotExecutable(path.to_path_buf())),
        };
    }
    let beside = std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name(NAME));
    if let Some(path) = beside.as_deref().filter(|p| executable(p)) {
        return Ok(path.to_path_buf());
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        // An empty entry is the working directory, as `.` is.
        .filter_map(|dir| std::path::absolute(dir.join(NAME)).ok())
        .find(|p| executable(p))
        .ok_or(NotFound::Nowhere { beside })
}

fn executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A relative `--runner` comes back absolute, against the working
    /// directory it was checked in (a bare name is not looked up on PATH).
    #[test]
    fn a_relative_runner_is_made_absolute() {
        let cwd = std::env::current_dir().unwrap();
        let dir = tempfile::tempdir_in(&cwd).unwrap();
        let runner = dir.path().join(NAME);
        std::fs::write(&runner, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o755)).unwrap();
        let relative = runner.strip_prefix(&cwd).unwrap();
        assert!(relative.is_relative());
        let found = find(Some(relative)).unwrap();
        assert!(found.is_absolute(), "{}", found.display());
        assert_eq!(found, runner);
        let missing = find(Some(Path::new("no-such-dir/hosted-boot"))).unwrap_err();
        assert!(
            missing
                .to_string()
                .contains("the runner no-such-dir/hosted-boot is not an executable file"),
            "{missing}"
        );
    }
}
