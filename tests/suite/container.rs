//! The image as a platform ships it (issue 36): built by `scripts/image`
//! with a real container engine from the Dockerfiles a user builds, and run
//! by that engine, PID 1 of its container, against the reference
//! coordinator on this machine's loopback (`--network host`). Where no
//! engine answers, or the images are missing or older than the checkout's
//! sources (their `hosted-boot.source-digest` label), each test fails
//! naming `scripts/image` (or skips, recorded, where the run allows it).
//! The on-host counterparts of these tests are `image.rs` and
//! `processes.rs`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use hosted_boot_coordinator::{CoordinatorOptions, Snapshot};
use tokio::io::AsyncReadExt;

use super::support::{IN_PID_NAMESPACE, Sandbox, WAIT};

/// The sandbox image (the Dockerfile's default target).
const IMAGE: &str = "hosted-boot";
/// `image/agent-cli.Dockerfile` on top of [`IMAGE`]: Claude Code.
const CLAUDE_IMAGE: &str = "hosted-boot-claude";
/// The image's agent user.
const AGENT_UID: &str = "1000";
/// The grace period of the Kubernetes examples (`terminationGracePeriodSeconds`).
const POD_GRACE_SECONDS: u64 = 35;
/// The image's `HOSTED_BOOT_ROOT`.
const ROOT: &str = "/workspace";
/// The session of the default coordinator.
const SESSION: &str = "s1";

fn checkout() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The podman settings the engine reads: the caller's `CONTAINERS_CONF`,
/// else the project's (as scripts/image does).
fn containers_conf() -> std::ffi::OsString {
    std::env::var_os("CONTAINERS_CONF")
        .unwrap_or_else(|| checkout().join("image/containers.conf").into_os_string())
}

/// The container engine `scripts/image` builds with: `HOSTED_BOOT_ENGINE`,
/// else the first of docker and podman whose `info` succeeds.
struct Engine {
    program: String,
}

impl Engine {
    /// The engine, when `images` were built from this checkout's sources;
    /// otherwise the test skips (it fails unless the run allows skipping).
    fn with_images(images: &[&str]) -> Option<Engine> {
        match Engine::find().and_then(|e| e.check_images(images).map(|()| e)) {
            Ok(e) => Some(e),
            Err(reason) => {
                hosted_boot_test_support::skip(reason);
                None
            }
        }
    }

    fn find() -> Result<Engine, String> {
        if let Some(program) = std::env::var("HOSTED_BOOT_ENGINE")
            .ok()
            .filter(|p| !p.is_empty())
        {
            return Ok(Engine { program });
        }
        ["docker", "podman"]
            .into_iter()
            .map(|p| Engine {
                program: p.to_string(),
            })
            .find(|e| {
                e.command()
                    .arg("info")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .ok_or_else(|| {
                "no container engine answers (neither `docker info` nor `podman info` succeeds): \
                 install podman and runc (apt-get install podman runc mmdebstrap), then run \
                 scripts/image"
                    .to_string()
            })
    }

    /// `Err` naming the image that is missing, or was built from other
    /// sources than the checkout's, and what to run.
    fn check_images(&self, images: &[&str]) -> Result<(), String> {
        let out = std::process::Command::new(checkout().join("scripts/image"))
            .arg("--digest")
            .current_dir(checkout())
            .output()
            .map_err(|e| format!("scripts/image --digest cannot run: {e}"))?;
        let digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if !out.status.success() || digest.is_empty() {
            return Err(format!(
                "scripts/image --digest failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        for image in images {
            let out = self
                .command()
                .args([
                    "image",
                    "inspect",
                    "--format",
                    "{{index .Config.Labels \"hosted-boot.source-digest\"}}",
                    image,
                ])
                .output()
                .map_err(|e| format!("{} cannot run: {e}", self.program))?;
            let label = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !out.status.success() {
                return Err(format!(
                    "the image {image} is not built ({} image inspect: {}); run scripts/image",
                    self.program,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            if label != digest {
                return Err(format!(
                    "the image {image} was built from other sources (label {label:?}, the \
                     checkout's {digest:?}); run scripts/image"
                ));
            }
        }
        Ok(())
    }

    /// The engine's command; podman reads the project's settings unless
    /// the caller set `CONTAINERS_CONF` (as scripts/image does).
    fn command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.program);
        cmd.env("CONTAINERS_CONF", containers_conf());
        cmd
    }

    /// Runs `args` to completion; returns the exit code and the output.
    /// Async: the coordinator the runner talks to runs on the test's own
    /// runtime, which a blocking wait would stall.
    async fn run(&self, args: &[&str]) -> (Option<i32>, String) {
        let out = tokio::process::Command::from(self.command())
            .args(args)
            .output()
            .await
            .unwrap();
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

/// A container of the test, removed (killed first) when dropped, so that
/// a failing test leaves none behind.
struct Container<'e> {
    engine: &'e Engine,
    name: String,
    child: Option<tokio::process::Child>,
}

impl<'e> Container<'e> {
    /// `engine run --name … --network host` + `options` + `image` + `args`,
    /// attached (its exit code is the container's), with the sandbox's
    /// environment passed by name (`-e NAME`, the value from the engine's
    /// own environment, so that no secret is an argument).
    fn run(
        engine: &'e Engine,
        env: &[(String, String)],
        options: &[&str],
        image: &str,
        args: &[&str],
    ) -> Container<'e> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "hosted-boot-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut cmd = tokio::process::Command::from(engine.command());
        // --rm too: a test process killed before its Drop leaves no
        // container behind once the container ends.
        cmd.args(["run", "--rm", "--name", &name, "--network", "host"]);
        for (k, v) in env {
            cmd.arg("-e").arg(k).env(k, v);
        }
        cmd.args(options)
            .arg(image)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = cmd.spawn().unwrap();
        Container {
            engine,
            name,
            child: Some(child),
        }
    }

    /// Waits (bounded by `within`) for the container to exit; returns its
    /// exit code and its output.
    async fn exit(&mut self, within: Duration) -> (Option<i32>, String) {
        let mut child = self.child.take().expect("waited for once");
        let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let read = async {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let _ = tokio::join!(stdout.read_to_end(&mut a), stderr.read_to_end(&mut b));
            let status = child.wait().await.unwrap();
            (
                status.code(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&a),
                    String::from_utf8_lossy(&b)
                ),
            )
        };
        match tokio::time::timeout(within, read).await {
            Ok(r) => r,
            Err(_) => {
                let logs = self.engine.run(&["logs", &self.name]).await.1;
                panic!(
                    "the container {} did not exit within {within:?}; its log:\n{logs}",
                    self.name
                )
            }
        }
    }

    /// Waits (bounded by `within`) until `run` is sealed; fails at once,
    /// with the container's output, when the container exits first.
    async fn sealed(&mut self, sb: &Sandbox, run: &str, within: Duration) -> Snapshot {
        let deadline = Instant::now() + within;
        loop {
            let snap = sb.coordinator.snapshot();
            if snap.run(run).is_some_and(|r| r.finish.is_some()) {
                return snap;
            }
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().unwrap().is_some());
            if exited || Instant::now() > deadline {
                let (code, output) = self.exit(WAIT).await;
                panic!(
                    "{run} was not sealed within {within:?} (the container exited: {code:?}):\n{output}\nthe run: {:?}",
                    snap.run(run).map(|r| r.status.as_str())
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `sh -c script` in the container, as root; its output.
    async fn exec(&self, script: &str) -> String {
        let (code, out) = self
            .engine
            .run(&["exec", &self.name, "sh", "-c", script])
            .await;
        assert_eq!(code, Some(0), "exec {script}: {out}");
        out
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self
            .engine
            .command()
            .args(["rm", "--force", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A sandbox whose agent is `body` (a shell script, `Sandbox::script`),
/// mounted read-only into the container at /probe/agent.sh; `$AGENT_OUT`
/// is /out, a directory of the test the agent user can write.
struct Probe {
    sb: Sandbox,
    script: PathBuf,
}

impl Probe {
    async fn start(body: &str) -> Probe {
        let sb = Sandbox::start(CoordinatorOptions::default()).await;
        let script = sb.script(body);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(sb.out(), std::fs::Permissions::from_mode(0o777)).unwrap();
        Probe { sb, script }
    }

    /// The container's environment: the sandbox's (its boot secret, URLs
    /// and session), the script as the agent, and `extra`.
    fn env(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut env = self.sb.coordinator.sandbox_env();
        for (k, v) in [
            ("HOSTED_BOOT_AGENT", "command"),
            ("HOSTED_BOOT_AGENT_COMMAND", "sh /probe/agent.sh"),
            ("AGENT_OUT", "/out"),
            // The script's preamble records its process group for a check
            // on this machine's process table, which the container's is not.
            (IN_PID_NAMESPACE, "1"),
        ]
        .into_iter()
        .chain(extra.iter().copied())
        {
            env.push((k.to_string(), v.to_string()));
        }
        env
    }

    /// The mounts of the script and the output directory.
    fn mounts(&self) -> Vec<String> {
        vec![
            "-v".to_string(),
            format!("{}:/probe/agent.sh:ro", self.script.display()),
            "-v".to_string(),
            format!("{}:/out", self.sb.out().display()),
        ]
    }

    /// Waits until the agent wrote `name` in `$AGENT_OUT`.
    async fn wait_out(&self, name: &str) {
        let deadline = Instant::now() + WAIT;
        while !self.sb.out().join(name).exists() {
            assert!(Instant::now() < deadline, "the agent never wrote {name}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The coordinator's printed `docker run …` line, run as printed (the
/// engine in place of `docker`, a name added for the cleanup), takes the
/// image through the demo's three turns: a commit the agent pushes, a
/// file the harvest commits and pushes, an interrupted turn whose work in
/// progress is pushed; the demo key is redacted from every event; the
/// container exits 0 when the session ends.
#[tokio::test]
async fn the_printed_docker_run_line_runs_the_image_through_three_turns() {
    let Some(engine) = Engine::with_images(&[IMAGE]) else {
        return;
    };
    let key = "demo-key-container-5d81e2";
    let sb = Sandbox::with_connectors(&[("DEMO_API_KEY", key)]).await;
    let text = sb
        .coordinator
        .startup_text(Path::new(env!("CARGO_BIN_EXE_hosted-boot")));
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("docker run "))
        .unwrap_or_else(|| panic!("no docker run line in:\n{text}"));
    let name = format!("hosted-boot-test-{}-printed", std::process::id());
    let line = line.replacen("docker run ", &format!("\"$ENGINE\" run --name {name} "), 1);
    let mut shell = tokio::process::Command::new("sh");
    shell
        .arg("-c")
        .arg(&line)
        .env("ENGINE", &engine.program)
        .env("IMAGE", IMAGE)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    shell.env("CONTAINERS_CONF", containers_conf());
    let mut container = Container {
        engine: &engine,
        name,
        child: Some(shell.spawn().unwrap()),
    };

    let turn = Duration::from_secs(60);
    let c = &sb.coordinator;
    container.sealed(&sb, "run-1", turn).await;
    assert_eq!(c.queue_turn("Now add a test", None), "run-2");
    container.sealed(&sb, "run-2", turn).await;
    assert_eq!(c.queue_turn("Run the full test suite", None), "run-3");
    c.wait_for(turn, |s| {
        s.run("run-3")
            .is_some_and(|r| r.events.iter().any(|e| e.data["text"] == "running test 3"))
    })
    .await
    .unwrap();
    c.interrupt(Some("run-3")).unwrap();
    let snap = container.sealed(&sb, "run-3", turn).await;
    c.end_session();
    let (code, output) = container.exit(Duration::from_secs(60)).await;
    assert_eq!(code, Some(0), "{output}");

    for (run, status) in [
        ("run-1", "succeeded"),
        ("run-2", "succeeded"),
        ("run-3", "interrupted"),
    ] {
        let r = snap.run(run).unwrap();
        assert_eq!(r.status, status, "{run}: {:?}", r.finish);
        let result = serde_json::to_value(&r.finish.as_ref().unwrap().result).unwrap();
        assert_eq!(result["pushed"], serde_json::json!(true), "{run}: {result}");
        let events = serde_json::to_string(&r.events).unwrap();
        super::support::assert_no_secret(run, &events, &sb.secrets(&[key]));
        assert!(
            events.contains("DEMO_API_KEY=[REDACTED]"),
            "{run}: the demo key's line is not in the events, redacted"
        );
    }
    for file in ["CONTRIBUTING.md", "NOTES.md", "TEST_REPORT.md"] {
        assert!(sb.remote_file(file).is_some(), "{file} was not pushed");
    }
}

/// As PID 1 of its container the runner reaps what the agent orphans, and
/// the engine's stop (SIGTERM, then SIGKILL after the Pod's grace) ends
/// the turn `interrupted` with its work pushed, the container exiting 143
/// by itself well within that grace.
#[tokio::test]
async fn the_image_as_pid_1_reaps_orphans_and_a_stop_seals_the_turn_with_its_work_pushed() {
    let Some(engine) = Engine::with_images(&[IMAGE]) else {
        return;
    };
    let p = Probe::start(
        r#"
echo "work in progress" > WIP.md
tr '\0' ' ' < /proc/1/cmdline > "$AGENT_OUT/pid1"
# Orphans: each shell exits at once, leaving its sleep to be reaped.
for i in 1 2 3 4 5 6 7 8; do sh -c 'sleep 0.2 &'; done
sleep 1.5
for s in /proc/[0-9]*/stat; do
  [ "$(sed 's/.*) //' "$s" 2>/dev/null | cut -c1)" = Z ] && echo "$s" >> "$AGENT_OUT/zombies"
done
touch "$AGENT_OUT/working"
while :; do sleep 0.1; done
"#,
    )
    .await;
    let mut ct = Container::run(&engine, &p.env(&[]), &strs(&p.mounts()), IMAGE, &[]);
    p.wait_out("working").await;
    assert!(
        p.sb.read_out("pid1")
            .starts_with("/usr/local/bin/hosted-boot"),
        "PID 1 is {:?}",
        p.sb.read_out("pid1")
    );
    assert_eq!(p.sb.read_out("zombies"), "", "zombies left unreaped");
    // The agent's orphans go to the worker (a subreaper); those of a
    // process `exec` started in the container go to PID 1 itself.
    for _ in 0..5 {
        ct.exec("sh -c 'sleep 0.2 &'").await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let zombies = ct
        .exec(
            "for s in /proc/[0-9]*/stat; do [ \"$(sed 's/.*) //' \"$s\" 2>/dev/null | cut -c1)\" = Z ] && echo \"$s\"; done; true",
        )
        .await;
    assert_eq!(zombies, "", "zombies left unreaped by PID 1");
    let grace = POD_GRACE_SECONDS.to_string();
    let started = Instant::now();
    let (code, out) = engine.run(&["stop", "-t", &grace, &ct.name]).await;
    let took = started.elapsed();
    assert_eq!(code, Some(0), "{out}");
    let (code, output) = ct.exit(WAIT).await;
    assert_eq!(code, Some(143), "{output}");
    assert!(
        took < Duration::from_secs(POD_GRACE_SECONDS / 2),
        "the stop took {took:?} of the {POD_GRACE_SECONDS} s grace"
    );
    let snap = p.sb.coordinator.snapshot();
    let run = snap.run("run-1").unwrap();
    assert_eq!(run.status, "interrupted", "{:?}\n{output}", run.finish);
    let result = serde_json::to_value(&run.finish.as_ref().unwrap().result).unwrap();
    assert_eq!(result["pushed"], serde_json::json!(true), "{result}");
    assert_eq!(
        p.sb.remote_file("WIP.md").as_deref(),
        Some("work in progress\n")
    );
}

/// What an agent tries in the probes below: its uid; every file it can
/// read under the root (the clone aside) and /tmp, and the session
/// directory's files by name (it cannot list that directory; those it
/// found are in `$AGENT_OUT/read`, `tried` lists what exists), copied to
/// `$AGENT_OUT/loot`; the memory, environment and maps of each runner
/// process (by its command line), recorded when they open; then a commit.
fn probe_script() -> String {
    let names = [
        hosted_boot::session_dir::BOOT_SECRET_FILE,
        hosted_boot::session_dir::BEARER_FILE,
        hosted_boot::session_dir::CONTEXT_FILE,
        hosted_boot::session_dir::CREDENTIAL_CACHE_FILE,
        hosted_boot::session_dir::ISSUED_TOKENS_FILE,
        hosted_boot::session_dir::TASK_FILE,
    ]
    .join(" ");
    format!(
        r#"
id -u > "$AGENT_OUT/uid"
mkdir -p "$AGENT_OUT/loot"
take() {{
  n=$(ls "$AGENT_OUT/loot" | wc -l)
  if cat "$1" > "$AGENT_OUT/loot/$n" 2> /dev/null; then echo "$1" >> "$AGENT_OUT/read"; else rm -f "$AGENT_OUT/loot/$n"; fi
}}
find {ROOT} /tmp -path {ROOT}/repo -prune -o -type f -print 2> /dev/null > "$AGENT_OUT/found"
while read -r f; do take "$f"; done < "$AGENT_OUT/found"
for f in {names}; do
  [ -e "{ROOT}/.orizu-session/{SESSION}/$f" ] && echo "$f" >> "$AGENT_OUT/tried" && take "{ROOT}/.orizu-session/{SESSION}/$f"
done
for p in /proc/[0-9]*; do
  # The runner (PID 1 and its worker) and the turn's guard
  # (`/proc/self/exe turn-guard …`).
  case "$(tr '\0' ' ' < "$p/cmdline" 2> /dev/null)" in
    /usr/local/bin/hosted-boot* | *" turn-guard "*) ;;
    *) continue ;;
  esac
  echo "$p" >> "$AGENT_OUT/runner-processes"
  for f in mem environ maps; do (exec 3< "$p/$f") 2> /dev/null && echo "$p/$f" >> "$AGENT_OUT/opened"; done
done
echo probe > PROBE.md && git add PROBE.md && git commit -q -m probe && touch "$AGENT_OUT/committed"
"#
    )
}

/// Runs [`probe_script`] through one turn in `IMAGE` with `options`;
/// returns the probe once the session ended with exit 0, the commit pushed.
async fn probe_turn(engine: &Engine, options: &[&str], volume: Option<&Path>) -> Probe {
    let p = Probe::start(&probe_script()).await;
    assert_eq!(p.sb.coordinator.session_id(), SESSION);
    let mut opts = p.mounts();
    if let Some(dir) = volume {
        opts.extend(["-v".to_string(), format!("{}:{ROOT}", dir.display())]);
    }
    opts.extend(options.iter().map(|o| o.to_string()));
    let mut ct = Container::run(engine, &p.env(&[]), &strs(&opts), IMAGE, &[]);
    let c = &p.sb.coordinator;
    let snap = ct.sealed(&p.sb, "run-1", Duration::from_secs(60)).await;
    c.end_session();
    let (code, output) = ct.exit(WAIT).await;
    assert_eq!(code, Some(0), "{output}");
    let run = snap.run("run-1").unwrap();
    assert_eq!(run.status, "succeeded", "{:?}\n{output}", run.finish);
    assert!(p.sb.out().join("committed").exists(), "{output}");
    assert_eq!(p.sb.remote_file("PROBE.md").as_deref(), Some("probe\n"));
    assert_eq!(p.sb.read_out("uid").trim(), AGENT_UID);
    // PID 1, the worker and the turn's guard.
    let runners = p.sb.read_out("runner-processes");
    assert!(
        runners.lines().count() >= 3,
        "the probe saw {runners:?}, not the runner's three processes"
    );
    assert_eq!(
        p.sb.read_out("opened"),
        "",
        "the agent opened a runner process's memory, environment or maps"
    );
    p
}

/// The security context of docs/kubernetes/pod.yaml.
const POD_SECURITY: [&str; 6] = [
    "--cap-drop",
    "ALL",
    "--cap-add",
    "CHOWN,DAC_OVERRIDE,SETUID,SETGID,KILL",
    "--security-opt",
    "no-new-privileges",
];

/// No file the agent can read holds the boot secret or a bearer.
fn assert_loot_clean(p: &Probe) {
    let mut secrets = vec![p.sb.coordinator.boot_secret()];
    secrets.extend(p.sb.coordinator.issued_bearers());
    for entry in std::fs::read_dir(p.sb.out().join("loot")).unwrap() {
        let text =
            String::from_utf8_lossy(&std::fs::read(entry.unwrap().path()).unwrap()).into_owned();
        super::support::assert_no_secret(
            &format!("a file the agent read (of {})", p.sb.read_out("read")),
            &text,
            &secrets,
        );
    }
    assert!(
        !p.sb.read_out("found").is_empty(),
        "the probe found no file to try"
    );
    // The agent's own files of the session directory exist, so the probe
    // reached it (the bearer file holds the turn's proxy token, not a bearer).
    let tried = p.sb.read_out("tried");
    for name in [
        hosted_boot::session_dir::BEARER_FILE,
        hosted_boot::session_dir::CONTEXT_FILE,
    ] {
        assert!(
            tried.lines().any(|l| l == name),
            "{name} not among {tried:?}"
        );
    }
}

/// The image's default (the runner root, the agent `agent`) under
/// pod.yaml's security context: the agent, uid 1000, reads neither the boot
/// secret nor a bearer in any file, nor the runner's memory or environment.
#[tokio::test]
async fn the_image_default_under_the_pod_security_context_keeps_the_agent_out() {
    let Some(engine) = Engine::with_images(&[IMAGE]) else {
        return;
    };
    let p = probe_turn(&engine, &POD_SECURITY, None).await;
    assert_loot_clean(&p);
}

/// The same with a read-only root file system and the writable paths
/// image/README.md lists: the root, /tmp and the agent's home.
#[tokio::test]
async fn the_image_default_runs_on_a_read_only_root_file_system() {
    let Some(engine) = Engine::with_images(&[IMAGE]) else {
        return;
    };
    let mut options = POD_SECURITY.to_vec();
    options.extend([
        "--read-only",
        "--tmpfs",
        // `exec`: an engine mounts a tmpfs noexec by default, and an agent
        // runs what it builds in the clone and in /tmp.
        "/workspace:exec,mode=0755",
        "--tmpfs",
        "/tmp:exec",
        "--tmpfs",
        // Sticky and world-writable, as a Kubernetes emptyDir is: podman
        // takes no uid= for a tmpfs (Docker does: uid=1000,gid=1000,mode=0700).
        "/home/agent:exec,mode=1777",
    ]);
    if engine.program == "podman" {
        // Podman's --read-only otherwise adds writable tmpfs mounts (/run,
        // /var/tmp, /dev/shm) that Docker's does not.
        options.push("--read-only-tmpfs=false");
    }
    let p = probe_turn(&engine, &options, None).await;
    assert_loot_clean(&p);
}

/// The non-root variant of image/README.md and pod-nonroot.yaml: uid 1000
/// with no capability, `HOSTED_BOOT_AGENT_USER` empty, the root a volume
/// of that uid. The agent is the runner's uid, yet the runner's memory
/// and environment stay closed to it (non-dumpable).
#[tokio::test]
async fn the_image_non_root_variant_runs_a_turn() {
    let Some(engine) = Engine::with_images(&[IMAGE]) else {
        return;
    };
    let workspace = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(workspace.path(), Some(1000), Some(1000)).unwrap();
    probe_turn(
        &engine,
        &[
            "--user",
            "1000:1000",
            "--cap-drop",
            "ALL",
            "--security-opt",
            "no-new-privileges",
            "-e",
            "HOSTED_BOOT_AGENT_USER=",
        ],
        Some(workspace.path()),
    )
    .await;
}

/// The image's HEALTHCHECK run in the container `name`: podman's own
/// `healthcheck run`; with docker, which has none, the check's command as
/// the image's configuration holds it. True when healthy (exit 0).
async fn healthy(engine: &Engine, name: &str) -> (bool, String) {
    let (code, out) = if engine.program == "podman" {
        engine.run(&["healthcheck", "run", name]).await
    } else {
        let (_, test) = engine
            .run(&[
                "inspect",
                "--format",
                "{{json .Config.Healthcheck.Test}}",
                name,
            ])
            .await;
        let test: Vec<String> = serde_json::from_str(test.trim())
            .unwrap_or_else(|e| panic!("the image has no HEALTHCHECK ({e}): {test}"));
        assert_eq!(test.first().map(String::as_str), Some("CMD"), "{test:?}");
        let mut args = vec!["exec", name];
        args.extend(test[1..].iter().map(String::as_str));
        engine.run(&args).await
    };
    (code == Some(0), out)
}

/// The HEALTHCHECK is healthy during a turn and between turns (when an
/// operator's git, as root, also works in the agent's clone), and
/// unhealthy once the worker (not PID 1, the reaper) is stopped and its
/// status file has aged past the stale bound (aged by the test: the bound
/// is 2 min); healthy again once the worker resumes and its heartbeat
/// rewrites the file.
#[tokio::test]
async fn the_image_healthcheck_tells_a_stuck_runner() {
    let Some(engine) = Engine::with_images(&[IMAGE]) else {
        return;
    };
    let p = Probe::start(
        r#"
touch "$AGENT_OUT/working"
while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.05; done
"#,
    )
    .await;
    let mut ct = Container::run(&engine, &p.env(&[]), &strs(&p.mounts()), IMAGE, &[]);
    p.wait_out("working").await;
    let (ok, out) = healthy(&engine, &ct.name).await;
    assert!(ok, "unhealthy during a turn: {out}");
    std::fs::write(p.sb.out().join("go"), "").unwrap();
    ct.sealed(&p.sb, "run-1", WAIT).await;
    let (ok, out) = healthy(&engine, &ct.name).await;
    assert!(ok, "unhealthy between turns: {out}");

    // An operator's git in the agent's clone, as root (`exec`): the
    // image's /etc/gitconfig marks it safe, so git does not refuse it.
    ct.exec(&format!("git -C {ROOT}/repo status --short")).await;

    let status = format!("{ROOT}/.hosted-boot/status.json");
    let json = ct.exec(&format!("cat {status}")).await;
    let status_json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let worker = status_json["pid"].as_u64().unwrap();
    assert_ne!(worker, 1, "the status file names PID 1, not the worker");
    ct.exec(&format!(
        "kill -STOP {worker} && touch -d \"@$(( $(date +%s) - 300 ))\" {status}"
    ))
    .await;
    let (ok, out) = healthy(&engine, &ct.name).await;
    assert!(!ok, "healthy with the worker stopped: {out}");
    // Resumed, the worker rewrites the aged file (within a second of a
    // change such as a coordinator poll, at the latest at its 30 s
    // heartbeat): healthy again, which the file's age alone would not
    // make it.
    ct.exec(&format!("kill -CONT {worker}")).await;
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (ok, out) = healthy(&engine, &ct.name).await;
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still unhealthy 40 s after the worker resumed: {out}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    p.sb.coordinator.end_session();
    let (code, output) = ct.exit(WAIT).await;
    assert_eq!(code, Some(0), "{output}");
}

/// The derived image of image/agent-cli.Dockerfile runs Claude Code, as
/// built there, through one turn against the fake model provider on the
/// host: the file the model asked for is written, committed and pushed.
#[tokio::test]
async fn the_agent_cli_image_runs_claude_code_through_a_turn() {
    let Some(engine) = Engine::with_images(&[IMAGE, CLAUDE_IMAGE]) else {
        return;
    };
    let sb = Sandbox::start(CoordinatorOptions {
        task: "write:from-the-image.txt".into(),
        model: Some(super::real_clis::model_of("claude").into()),
        ..CoordinatorOptions::default()
    })
    .await;
    let provider = super::real_clis::Provider::start(sb.dir.path());
    let mut env = sb.coordinator.sandbox_env();
    for (k, v) in [
        ("ANTHROPIC_API_KEY", "test-key"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("CLAUDE_CODE_MAX_RETRIES", "0"),
    ] {
        env.push((k.to_string(), v.to_string()));
    }
    let base_url = format!("ANTHROPIC_BASE_URL={}", provider.url());
    let mut ct = Container::run(
        &engine,
        &env,
        &[],
        CLAUDE_IMAGE,
        &[
            "run",
            "--agent-env",
            &base_url,
            "--agent-env",
            "DISABLE_TELEMETRY=1",
            "--agent-env",
            "DISABLE_AUTOUPDATER=1",
        ],
    );
    let snap = ct.sealed(&sb, "run-1", Duration::from_secs(180)).await;
    sb.coordinator.end_session();
    let (code, output) = ct.exit(WAIT).await;
    let run = snap.run("run-1").unwrap();
    assert_eq!(run.status, "succeeded", "{:?}\n{output}", run.finish);
    assert_eq!(code, Some(0), "{output}");
    assert_eq!(
        sb.remote_file("from-the-image.txt").as_deref(),
        Some("done")
    );
    assert!(
        !provider.turn_requests(0).is_empty(),
        "Claude Code sent the provider no request"
    );
}

/// `docs/kubernetes/session-job.yaml`'s Pod template as a Pod, made from
/// the template's text with the edits a test on this machine needs, each
/// asserted to apply (a template that drifts fails here): the image and
/// the built-in demo agent, the coordinator's URLs, the host's network, no
/// egress proxy (a closed loopback port as the canary), and the boot
/// secret's file by `hostPath`, root's and 0400: podman 4.3's `secret`
/// volume ignores `defaultMode` (0644, which the runner refuses) and keeps
/// its content in a named volume across plays.
fn session_pod(sb: &Sandbox, secret_file: &Path) -> String {
    let text =
        std::fs::read_to_string(checkout().join("docs/kubernetes/session-job.yaml")).unwrap();
    let job = text.split("\n---\n").next().unwrap();
    let (_, template) = job
        .split_once("\n  template:\n")
        .expect("the Job's template");
    let mut pod = String::from("apiVersion: v1\nkind: Pod\n");
    for line in template.lines() {
        pod.push_str(line.strip_prefix("    ").unwrap_or(line));
        pod.push('\n');
    }
    let env = sb.coordinator.sandbox_env();
    let var = |name: &str| env.iter().find(|(k, _)| k == name).unwrap().1.clone();
    let missing: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| k != "ORIZU_BOOT_SECRET" && !pod.contains(&format!("- name: {k}\n")))
        .cloned()
        .collect();
    let mut edit = |from: &str, to: &str| {
        assert!(pod.contains(from), "the template has no {from:?}:\n{pod}");
        pod = pod.replacen(from, to, 1);
    };
    edit(
        "metadata:\n  labels:",
        "metadata:\n  name: hosted-boot-session-s1\n  labels:",
    );
    edit(
        "spec:\n  restartPolicy: Never",
        "spec:\n  hostNetwork: true\n  restartPolicy: Never",
    );
    edit(
        "image: hosted-boot-claude:0.1.0",
        "image: localhost/hosted-boot:latest",
    );
    edit("value: claude", "value: demo");
    edit(
        "value: https://plane.example/api/cli/sessions/s1/agent-token",
        &format!("value: {}", var("ORIZU_AGENT_TOKEN_URL")),
    );
    edit(
        "value: https://plane.example",
        &format!("value: {}", var("ORIZU_API_BASE_URL")),
    );
    edit("value: example.com:443", "value: 127.0.0.1:9");
    for proxy in ["HTTPS_PROXY", "HTTP_PROXY"] {
        edit(
            &format!(
                "        - name: {proxy}\n          value: http://egress-proxy.egress-proxy.svc.cluster.local:3128\n"
            ),
            "",
        );
    }
    edit(
        "        - name: NO_PROXY\n          value: localhost,127.0.0.1\n",
        "",
    );
    // What the reference coordinator serves besides the template's: its
    // boot-status URL and its git server (the template's git host is the
    // runner's default).
    for (k, v) in &missing {
        let value = serde_json::to_string(v).unwrap();
        edit(
            "      env:\n",
            &format!("      env:\n        - name: {k}\n          value: {value}\n"),
        );
    }
    let key = "        - name: ANTHROPIC_API_KEY\n";
    let (before, after) = pod.split_once(key).expect("the provider key");
    let (_, rest) = after.split_once("optional: true\n").unwrap();
    pod = format!("{before}{rest}");
    let volume = pod
        .find("    - name: boot-secret\n      secret:")
        .expect("the secret volume");
    let end = pod[volume..].find("    - name: workspace").unwrap() + volume;
    pod.replace_range(
        volume..end,
        &format!(
            "    - name: boot-secret\n      hostPath:\n        path: {}\n        type: Directory\n",
            secret_file.parent().unwrap().display()
        ),
    );
    pod
}

/// The session template of docs/kubernetes/ runs one session under
/// `podman kube play` (a Pod: podman runs no Job) against the reference
/// coordinator: the boot secret from its 0400 file, the demo's commit
/// pushed, the container's exit 0 when the session ends.
#[tokio::test]
async fn the_kubernetes_session_template_runs_a_session_under_kube_play() {
    let Some(engine) = Engine::with_images(&[IMAGE]) else {
        return;
    };
    if engine.program != "podman" {
        hosted_boot_test_support::skip(format!(
            "{} has no `kube play`: the Kubernetes template runs under podman",
            engine.program
        ));
        return;
    }
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    assert_eq!(sb.coordinator.session_id(), SESSION);
    use std::os::unix::fs::PermissionsExt;
    let secret_dir = sb.dir.path().join("secret");
    std::fs::create_dir(&secret_dir).unwrap();
    let secret_file = secret_dir.join("boot-secret");
    std::fs::write(&secret_file, sb.coordinator.boot_secret()).unwrap();
    std::fs::set_permissions(&secret_file, std::fs::Permissions::from_mode(0o400)).unwrap();
    let yaml = sb.dir.path().join("session-pod.yaml");
    std::fs::write(&yaml, session_pod(&sb, &secret_file)).unwrap();
    let yaml = yaml.to_string_lossy().into_owned();
    let pod = "hosted-boot-session-s1";
    // A pod left by a test process killed before its cleanup.
    let _ = engine.run(&["pod", "rm", "--force", pod]).await;
    struct Down<'e>(&'e Engine, String);
    impl Drop for Down<'_> {
        fn drop(&mut self) {
            let _ = self.0.command().args(["kube", "down", &self.1]).output();
        }
    }
    let (code, out) = engine.run(&["kube", "play", &yaml]).await;
    let _down = Down(&engine, yaml.clone());
    assert_eq!(code, Some(0), "{out}");
    let container = format!("{pod}-sandbox");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let snap = sb.coordinator.snapshot();
        if snap.run("run-1").is_some_and(|r| r.finish.is_some()) {
            break;
        }
        if Instant::now() > deadline {
            let logs = engine.run(&["logs", &container]).await.1;
            panic!("run-1 was not sealed under kube play:\n{logs}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sb.coordinator.end_session();
    let (code, out) = engine.run(&["wait", &container]).await;
    let logs = engine.run(&["logs", &container]).await.1;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(out.trim(), "0", "the runner's exit code:\n{logs}");
    let snap = sb.coordinator.snapshot();
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded", "{logs}");
    assert!(sb.remote_file("CONTRIBUTING.md").is_some(), "{logs}");
    assert!(!logs.contains(&sb.coordinator.boot_secret()), "{logs}");
}
