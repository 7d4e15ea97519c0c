//! `.ci/layers` (run by `.ci/run`) against upward imports planted in a
//! scratch copy of `src/`: every plant below is Rust that compiles and
//! reaches from `process` (layer "process and events") up into `turn`, so
//! the check must fail on each.

use std::path::Path;
use std::process::Command;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Runs `.ci/layers` on a copy of `src/` with each `(file, code)` of
/// `plants` appended to its file (relative to `src/`, created when absent);
/// returns its exit status and output.
fn check_with(plants: &[(&str, &str)]) -> (bool, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    copy_dir(&root.join("src"), &src);
    for (file, code) in plants {
        let path = src.join(file);
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push('\n');
        text.push_str(code);
        text.push('\n');
        std::fs::write(&path, text).unwrap();
    }
    let out = Command::new("python3")
        .arg(root.join(".ci/layers"))
        .arg(&src)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.success(), text)
}

fn assert_refused(file: &str, code: &str) {
    assert_refused_all(&[(file, code)]);
}

fn assert_refused_all(plants: &[(&str, &str)]) {
    let (ok, out) = check_with(plants);
    assert!(
        !ok,
        "`.ci/layers` passed an upward import:\n{plants:?}\n{out}"
    );
}

/// The control: the spelling the check knows is refused.
#[test]
fn layers_refuse_a_planted_crate_path() {
    assert_refused(
        "process/supervisor.rs",
        "fn _up() { let _ = crate::turn::watch::log_over_cap; }",
    );
}

/// A relative path names `turn` without the word `crate`.
#[test]
fn layers_refuse_an_upward_super_super_path() {
    assert_refused(
        "process/supervisor.rs",
        "fn _up() { let _ = super::super::turn::watch::log_over_cap; }",
    );
}

/// `crate` spelled another way Rust accepts: with spaces or a line break
/// around `::`, or renamed by `use crate as …` / `use crate::{self as …}`.
#[test]
fn layers_refuse_crate_spelled_otherwise() {
    for code in [
        "fn _up() { let _ = crate :: turn::watch::log_over_cap; }",
        "fn _up() { let _ = crate\n    ::turn::watch::log_over_cap; }",
        "use crate as root;\nfn _up() { let _ = root::turn::watch::log_over_cap; }",
        "use crate::{self as root};\nfn _up() { let _ = root::turn::watch::log_over_cap; }",
    ] {
        assert_refused("process/supervisor.rs", code);
    }
}

/// The comment stripper does not know string literals: a `//` in a URL
/// hides the rest of its line, and `"/*"` … `"*/"` (globs) hides every
/// line between them.
#[test]
fn layers_read_code_after_a_string_holding_comment_marks() {
    for code in [
        "fn _up() { let _ = (\"http://x\", crate::turn::watch::log_over_cap); }",
        "const _G: &str = \"refs/*\";\nuse crate::turn::watch as _w;\nconst _H: &str = \"*/\";",
    ] {
        assert_refused("process/supervisor.rs", code);
    }
}

/// The check gives a file the layer of the directory it is in, but
/// `#[path]` (or `include!`) mounts a file anywhere: a file under `turn/`
/// (which may name `agent`) mounted as a module of `process` makes
/// `process` name `agent`, a layer above it.
#[test]
fn layers_refuse_a_file_of_a_higher_layer_mounted_by_path() {
    let up = "pub fn _up() -> Option<crate::agent::AgentKind> { None }";
    assert_refused_all(&[
        ("turn/up.rs", up),
        ("process/mod.rs", "#[path = \"../turn/up.rs\"]\nmod up;"),
    ]);
    assert_refused_all(&[
        ("turn/up.rs", up),
        (
            "process/mod.rs",
            "mod up {\n    include!(\"../turn/up.rs\");\n}",
        ),
    ]);
}
