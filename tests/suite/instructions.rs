//! The platform's instructions for the agent (PROTOCOL.md 3, "The
//! platform's instructions"; issue 14) with the `command` agent: the file
//! `ORIZU_INSTRUCTIONS_FILE` names, from the session or
//! `--instructions-file`, outside `repo/`, never committed, gone with the
//! run. The CLIs' own ways are tested against the real CLIs
//! (`real_clis.rs`, `four_turns`).

use hosted_boot_coordinator::CoordinatorOptions;
use pretty_assertions::assert_eq;

use super::support::{Runner, Sandbox};

/// An agent that copies the instructions file, records its path and
/// leaves work for the harvest.
const AGENT: &str = r#"
if [ -n "${ORIZU_INSTRUCTIONS_FILE:-}" ]; then
  cat "$ORIZU_INSTRUCTIONS_FILE" > "$AGENT_OUT/instructions"
  printf %s "$ORIZU_INSTRUCTIONS_FILE" > "$AGENT_OUT/instructions-path"
else
  echo unset > "$AGENT_OUT/instructions-path"
fi
echo work > notes.txt
"#;

const SESSION_TEXT: &str = "Session rule marker-5c2a: write tests first.\n";
const IMAGE_TEXT: &str = "Image rule marker-90be: keep diffs small.\n";

/// Everything the session branch's history holds (`git log -p`).
fn history(sb: &Sandbox) -> String {
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(sb.coordinator.bare_repo())
        .args(["log", "-p", "--all"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One turn with `cmd`'s settings; asserts the agent read `expected`, the
/// harvest committed its work but not the instructions, and no copy is
/// left under the root once the run is sealed.
async fn one_turn(sb: &Sandbox, mut cmd: tokio::process::Command, expected: &str) {
    let (_, output) = sb
        .end_after_seal("run-1", Runner::reading(cmd.spawn().unwrap()))
        .await;
    assert_eq!(sb.read_out("instructions"), expected, "{output}");
    let path = sb.read_out("instructions-path");
    assert!(
        path.contains("/.orizu-run/run-1/") && !path.contains("/repo/"),
        "the instructions file is not in the run directory: {path}"
    );
    let log = history(sb);
    assert!(
        log.contains("notes.txt"),
        "the agent's work was not harvested"
    );
    let marker = expected.split_whitespace().nth(2).unwrap();
    assert!(
        !log.contains(marker),
        "a harvest commit holds the instructions"
    );
    assert!(
        !std::path::Path::new(&path).exists(),
        "the instructions file outlived the run: {path}"
    );
    let grep = std::process::Command::new("grep")
        .args(["-rl", marker])
        .arg(sb.root())
        .output()
        .unwrap();
    assert!(
        grep.stdout.is_empty(),
        "a copy is left under the root: {}",
        String::from_utf8_lossy(&grep.stdout)
    );
}

#[tokio::test]
async fn the_sessions_instructions_reach_the_command_agent_and_win_over_the_image() {
    let sb = Sandbox::start(CoordinatorOptions {
        instructions: Some(SESSION_TEXT.into()),
        ..CoordinatorOptions::default()
    })
    .await;
    let image = sb.dir.path().join("image-instructions.md");
    std::fs::write(&image, IMAGE_TEXT).unwrap();
    let mut cmd = sb.runner(&sb.script(AGENT));
    cmd.env("HOSTED_BOOT_INSTRUCTIONS_FILE", &image);
    one_turn(&sb, cmd, SESSION_TEXT).await;
    assert_eq!(
        std::fs::read_to_string(&image).unwrap(),
        IMAGE_TEXT,
        "the image's file was changed"
    );
}

#[tokio::test]
async fn the_images_instructions_file_reaches_the_command_agent() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let image = sb.dir.path().join("image-instructions.md");
    std::fs::write(&image, IMAGE_TEXT).unwrap();
    let mut cmd = sb.runner(&sb.script(AGENT));
    cmd.arg("--instructions-file").arg(&image);
    one_turn(&sb, cmd, IMAGE_TEXT).await;
}

#[tokio::test]
async fn without_instructions_the_agent_gets_no_file() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = Runner::spawn(&sb, &sb.script(AGENT));
    let (_, output) = sb.end_after_seal("run-1", runner).await;
    assert_eq!(sb.read_out("instructions-path"), "unset\n", "{output}");
}
