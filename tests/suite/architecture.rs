//! ARCHITECTURE.md read as a new contributor reads it, against the tree:
//! issue 11 asks for "the new layer diagram, every module", and
//! `.ci/layers` and `lib.rs` point to its "Layers" section.

use std::path::Path;

fn architecture() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md")).unwrap()
}

/// Whether `text` has `word` not inside a longer identifier or path.
fn names(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        !ident(before) && !ident(after)
    })
}

/// Every file path the codemap names (`dir/file.rs`, `file.rs`) exists
/// under `src/`; the recipes' paths from the repository's root (`src/…`,
/// `tests/…`) exist there (a `<placeholder>` is a file to create).
#[test]
fn architecture_names_no_stale_path() {
    let text = architecture();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let stale: Vec<&str> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|p| p.ends_with(".rs") && !p.contains(' '))
        .filter(|p| !p.contains('<'))
        .filter(|p| {
            let rooted = ["src/", "tests/", "crates/"]
                .iter()
                .any(|r| p.starts_with(r));
            !(if rooted { root.join(p) } else { src.join(p) }).exists()
        })
        .collect();
    assert!(
        stale.is_empty(),
        "ARCHITECTURE.md names paths that are not under src/: {stale:?}"
    );
}

/// Every top-level module of `lib.rs` is named, and the "Layers" section
/// `.ci/layers` and `lib.rs` refer to exists.
#[test]
fn architecture_names_every_module_and_its_layers() {
    let text = architecture();
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let missing: Vec<&str> = lib
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("pub mod ")
                .or_else(|| l.trim().strip_prefix("mod "))
        })
        .map(|m| m.trim_end_matches(';'))
        .filter(|m| !names(&text, m))
        .collect();
    assert!(
        missing.is_empty(),
        "modules ARCHITECTURE.md does not name: {missing:?}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with('#') && l.contains("Layers")),
        "ARCHITECTURE.md has no \"Layers\" section (.ci/layers: 'The layers (ARCHITECTURE.md, \"Layers\")')"
    );
}
