//! The runner's own directories under the root (`.orizu-session`,
//! `.orizu-run` and what they hold, `.hosted-boot`), made and opened
//! without following a link (issue 31): an agent that could write the root
//! replaced `.orizu-run` with a link to a root-only directory, and the
//! runner made that directory 0711 and wrote the next run's files into it.
//! Whatever is at such a path and is not a directory of the runner's own
//! (a link, a file, a directory another uid made) is removed, its links not
//! followed, and a fresh directory made. With `--agent-user` the root
//! itself is made the runner's ([`crate::agent_user::AgentUser::secure_root`]),
//! so nothing the agent does can put a link there after the check.

use std::io;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

/// Makes `path` a directory of this process's effective uid with `mode`,
/// replacing what else is there (see the module documentation); its parent
/// must exist. The directory is checked and its mode set through a
/// descriptor opened without following a link.
///
/// Errors: the OS refused a call; the message is the OS's, the caller
/// names the path.
pub fn runner_dir(path: &Path, mode: u32) -> io::Result<()> {
    let mode = Mode::from_raw_mode(mode);
    let me = rustix::process::geteuid().as_raw();
    // Twice at most: a second foreign entry in the instant between the
    // removal and the mkdir is a writer racing the runner, and refused.
    for _ in 0..2 {
        match rustix::fs::mkdir(path, mode) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        match rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(dir) => {
                if rustix::fs::fstat(&dir)?.st_uid == me {
                    rustix::fs::fchmod(&dir, mode)?;
                    return Ok(());
                }
                tracing::warn!(path = %path.display(), "a directory of another uid where the runner keeps its own: removed");
                // std's remove_dir_all follows no link inside.
                std::fs::remove_dir_all(path)?;
            }
            // A link (to a directory or not) or a file: the entry itself
            // goes.
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                tracing::warn!(path = %path.display(), "a link or a file where the runner keeps its own directory: removed");
                std::fs::remove_file(path)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(io::Error::other(
        "something else keeps appearing there: another process writes where the runner keeps its own directory",
    ))
}

/// Sets `mode` on the directory `path` without following a link.
///
/// Errors: it is a link or not a directory (`ELOOP`, `ENOTDIR`), or the OS
/// refused.
pub fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    let dir = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn a_link_or_file_in_its_place_is_replaced_and_never_followed() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("elsewhere");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(target.join("kept"), "x").unwrap();
        let place = root.path().join(".orizu-run");
        std::os::unix::fs::symlink(&target, &place).unwrap();
        runner_dir(&place, 0o711).unwrap();
        assert!(std::fs::symlink_metadata(&place).unwrap().is_dir());
        assert_eq!(mode(&place), 0o711);
        assert_eq!(mode(&target), 0o700, "the link's target was changed");
        assert!(target.join("kept").exists());
        assert_eq!(std::fs::read_dir(&place).unwrap().count(), 0);
        // A file, and a dangling link.
        let file = root.path().join("f");
        std::fs::write(&file, "x").unwrap();
        runner_dir(&file, 0o700).unwrap();
        assert!(file.is_dir());
        let dangling = root.path().join("d");
        std::os::unix::fs::symlink(root.path().join("nowhere"), &dangling).unwrap();
        runner_dir(&dangling, 0o700).unwrap();
        assert!(std::fs::symlink_metadata(&dangling).unwrap().is_dir());
        assert!(!root.path().join("nowhere").exists());
        // Its own directory is kept with what it holds.
        std::fs::write(place.join("spool"), "events").unwrap();
        runner_dir(&place, 0o700).unwrap();
        assert!(place.join("spool").exists());
        assert_eq!(mode(&place), 0o700);
        assert!(set_mode(&dangling, 0o711).is_ok());
        std::fs::remove_dir(&dangling).unwrap();
        std::os::unix::fs::symlink(&target, &dangling).unwrap();
        assert!(set_mode(&dangling, 0o777).is_err());
        assert_eq!(mode(&target), 0o700);
    }

    #[test]
    fn a_directory_of_another_uid_is_replaced_with_what_it_held() {
        assert!(
            rustix::process::geteuid().is_root(),
            "this test needs root (to make a directory of another uid); CI runs as root"
        );
        let root = tempfile::tempdir().unwrap();
        let outside = root.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("kept"), "x").unwrap();
        let place = root.path().join(".orizu-session");
        std::fs::create_dir(&place).unwrap();
        std::os::unix::fs::symlink(&outside, place.join("s1")).unwrap();
        std::os::unix::fs::chown(&place, Some(65534), Some(65534)).unwrap();
        runner_dir(&place, 0o700).unwrap();
        let meta = std::fs::symlink_metadata(&place).unwrap();
        assert_eq!(meta.uid(), 0);
        assert_eq!(std::fs::read_dir(&place).unwrap().count(), 0);
        assert!(outside.join("kept").exists(), "a link inside was followed");
    }
}
