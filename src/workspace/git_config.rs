//! Several settings of one git configuration file written at once: libgit2's
//! configuration transaction (`git_config_lock`, which git2 does not wrap).
//!
//! Each `git2::Config::set_*` rewrites the whole file (a `config.lock`, then
//! a rename over `config`); the clone step writes a dozen settings into
//! `repo/.git/config` (PROTOCOL.md 3), which made a dozen rewrites on the
//! boot's critical path (BENCHMARKS.md, "Time to first turn"). Under the
//! transaction libgit2 holds `config.lock` from the start, applies every
//! setting to its copy of the file in memory and writes and renames it once
//! on commit; a failed edit (or a panic) renames nothing, so the file holds
//! all of the settings or none of them.

use std::ffi::c_int;

use git2::{Binding, Config};

unsafe extern "C" {
    // libgit2 1.9 (`include/git2/config.h`): locks the highest-priority
    // writable backend of `cfg` and returns the transaction that commits
    // (writes) or, freed uncommitted, rolls back what was set meanwhile.
    fn git_config_lock(
        out: *mut *mut libgit2_sys::git_transaction,
        cfg: *mut libgit2_sys::git_config,
    ) -> c_int;
}

/// The transaction, freed (rolled back, unless committed) on drop.
struct Transaction(*mut libgit2_sys::git_transaction);

impl Drop for Transaction {
    fn drop(&mut self) {
        // SAFETY: a transaction `git_config_lock` returned, freed once; after
        // a commit free only releases it, before one it unlocks without
        // writing.
        unsafe { libgit2_sys::git_transaction_free(self.0) }
    }
}

/// Applies `edit` to `config` (one file: open it with
/// `Config::open_level`) and writes the file once, with every setting
/// `edit` made; reads inside `edit` see the file as it was before.
///
/// Errors: the file cannot be locked (another writer holds `config.lock`)
/// or written, or `edit`'s own error; either way the file is unchanged.
pub(crate) fn edit_at_once(
    config: &mut Config,
    edit: impl FnOnce(&mut Config) -> Result<(), git2::Error>,
) -> Result<(), git2::Error> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: `config.raw()` is a live `git_config` (borrowed for the whole
    // transaction); `raw` receives the transaction on success.
    let code = unsafe { git_config_lock(&mut raw, config.raw()) };
    if code < 0 {
        return Err(git2::Error::last_error(code));
    }
    let tx = Transaction(raw);
    edit(config)?;
    // SAFETY: the live transaction of `config`, committed once.
    let code = unsafe { libgit2_sys::git_transaction_commit(tx.0) };
    if code < 0 {
        return Err(git2::Error::last_error(code));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use git2::ConfigLevel;

    fn local(dir: &std::path::Path) -> Config {
        let repo = git2::Repository::init(dir).unwrap();
        repo.config()
            .unwrap()
            .open_level(ConfigLevel::Local)
            .unwrap()
    }

    fn inode(path: &std::path::Path) -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap())
    }

    /// Every setting lands, values git must quote included, in one rename
    /// of the file (its inode changes once, as for one `set_str`), and git
    /// reads them back from a fresh open.
    #[test]
    fn settings_are_written_together_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = local(dir.path());
        let path = dir.path().join(".git/config");
        let before = inode(&path);
        // `;` and `#` make git quote a value; `"` and `\` are escaped by
        // `set_str` (libgit2's `set_multivar` writes values unescaped).
        let helper = "!'/opt/a b' credential --context '/r/x;y#z'";
        let name = r#"a "quoted" \ name"#;
        edit_at_once(&mut config, |c| {
            c.set_str("remote.origin.url", "https://git.example/o/r.git")?;
            c.set_multivar("credential.helper", "^$", "")?;
            c.set_multivar("credential.helper", "^.+$", helper)?;
            c.set_bool("credential.useHttpPath", true)?;
            c.set_str("user.name", name)
        })
        .unwrap();
        assert_ne!(inode(&path), before, "written by a rename");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!dir.path().join(".git/config.lock").exists());
        let fresh = Config::open(&path).unwrap();
        assert_eq!(
            fresh.get_string("remote.origin.url").unwrap(),
            "https://git.example/o/r.git",
            "{text}"
        );
        let mut helpers = Vec::new();
        fresh
            .multivar("credential.helper", None)
            .unwrap()
            .for_each(|e| helpers.push(e.value().unwrap_or("").to_string()))
            .unwrap();
        assert_eq!(helpers, ["", helper], "{text}");
        assert!(fresh.get_bool("credential.useHttpPath").unwrap());
        assert_eq!(fresh.get_string("user.name").unwrap(), name);
        // What init wrote is kept.
        assert!(!fresh.get_bool("core.bare").unwrap());
    }

    /// An edit that fails writes nothing: the file is byte for byte what it
    /// was, and not locked afterwards.
    #[test]
    fn a_failed_edit_leaves_the_file_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = local(dir.path());
        let path = dir.path().join(".git/config");
        let before = std::fs::read(&path).unwrap();
        let result = edit_at_once(&mut config, |c| {
            c.set_str("user.name", "someone")?;
            Err(git2::Error::from_str("the edit failed"))
        });
        assert_eq!(result.unwrap_err().message(), "the edit failed");
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert!(!dir.path().join(".git/config.lock").exists());
        edit_at_once(&mut config, |c| c.set_str("user.name", "again")).unwrap();
        assert_eq!(
            Config::open(&path)
                .unwrap()
                .get_string("user.name")
                .unwrap(),
            "again"
        );
    }
}
