//! The runner's start-up hardening (PROTOCOL.md section 3): core dumps off
//! (`RLIMIT_CORE` 0) and non-dumpable, both checked; a kernel (or a seccomp
//! policy) that refuses either keeps the runner from starting.

use std::os::unix::fs::MetadataExt;

use hosted_boot_coordinator::CoordinatorOptions;
use tokio::process::Command;

use super::support::{Sandbox, WAIT, assert_no_secret, finish};

/// `Max core file size` of `pid` as `/proc/<pid>/limits` shows it: (soft,
/// hard).
fn core_limits(pid: u32) -> (String, String) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("Max core file size"))
        .unwrap_or_else(|| panic!("no core limit in {text}"));
    let mut fields = line.split_whitespace().map(str::to_string);
    (fields.next().unwrap(), fields.next().unwrap())
}

/// Starts `cmd` with core dumps allowed up to the hard limit (a shell's
/// soft limit is often 0 already), so that the runner's own limit shows.
fn allow_core_dumps(cmd: &mut Command) {
    // SAFETY: getrlimit and setrlimit are async-signal-safe; nothing is
    // allocated between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            if libc::getrlimit(libc::RLIMIT_CORE, &mut limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_CORE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

const WAITING_AGENT: &str = r#"
echo $$ > "$AGENT_OUT/agent"
echo '{"type":"message","text":"ready"}'
while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.02; done
"#;

async fn wait_ready(sb: &Sandbox) {
    sb.coordinator
        .wait_for(WAIT, |s| {
            s.run("run-1")
                .is_some_and(|r| r.events.iter().any(|e| e.data["text"] == "ready"))
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn the_runner_and_its_agent_run_with_core_dumps_off() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(WAITING_AGENT);
    let mut cmd = sb.runner(&script);
    allow_core_dumps(&mut cmd);
    let child = cmd.spawn().unwrap();
    wait_ready(&sb).await;
    let runner = child.id().unwrap();
    let agent: u32 = sb.read_out("agent").trim().parse().unwrap();
    // Soft and hard: nothing in the runner's tree can raise it again.
    assert_eq!(core_limits(runner), ("0".into(), "0".into()), "the runner");
    assert_eq!(core_limits(agent), ("0".into(), "0".into()), "its agent");

    std::fs::write(sb.out().join("go"), "").unwrap();
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
}

/// The kernel's readback of the dumpable flag: the `/proc/<pid>` files of a
/// non-dumpable process belong to root, whatever its uid, those of a
/// dumpable one to its uid.
#[tokio::test]
async fn proc_shows_the_runner_non_dumpable() {
    if let Err(reason) = super::support::root_and_setpriv("running the runner as uid 65534") {
        hosted_boot_test_support::skip(reason);
        return;
    }
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(sb.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for p in [sb.dir.path(), &sb.root(), &sb.out()] {
        std::os::unix::fs::chown(p, Some(65534), Some(65534)).unwrap();
    }
    // The agent, of the runner's uid, tries the runner's environment and
    // memory (its parent), and its own as the control.
    let script = sb.script(&format!(
        r#"
for who in $PPID $$; do
  for f in environ mem; do
    if [ $who = $$ ]; then name=self-$f; else name=runner-$f; fi
    head -c 1 /proc/$who/$f > /dev/null 2> "$AGENT_OUT/$name.err"
    echo $? > "$AGENT_OUT/$name"
  done
done
{WAITING_AGENT}"#
    ));
    let setpriv = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ];
    let child = sb
        .wrapped_command(&setpriv, "run", &script)
        .spawn()
        .unwrap();
    wait_ready(&sb).await;
    let runner = child.id().unwrap();
    let agent: u32 = sb.read_out("agent").trim().parse().unwrap();
    let owner = |pid: u32| {
        std::fs::metadata(format!("/proc/{pid}/status"))
            .unwrap()
            .uid()
    };
    assert_eq!(owner(agent), 65534, "the control: a dumpable process");
    assert_eq!(owner(runner), 0, "the runner is dumpable");
    // A same-uid agent reads neither the runner's environment nor its
    // memory (PROTOCOL.md 3); its own environment it reads (its memory at
    // offset 0 is unmapped: EIO, not a permission error).
    for f in ["environ", "mem"] {
        assert_eq!(sb.read_out(&format!("runner-{f}")).trim(), "1", "{f}");
        let err = sb.read_out(&format!("runner-{f}.err"));
        assert!(err.contains("Permission denied"), "{f}: {err}");
    }
    assert_eq!(sb.read_out("self-environ").trim(), "0");
    assert!(
        !sb.read_out("self-mem.err").contains("Permission denied"),
        "{}",
        sb.read_out("self-mem.err")
    );

    std::fs::write(sb.out().join("go"), "").unwrap();
    sb.wait_sealed("run-1").await;
    sb.coordinator.end_session();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(0), "{output}");
}

/// Makes the kernel answer EPERM, in the process `cmd` starts, to each
/// system call `nr` whose argument `arg` is `value` (a seccomp filter
/// installed before exec).
fn refuse(cmd: &mut Command, rules: &[(libc::c_long, usize, u32)]) {
    use libc::{BPF_ABS, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W, sock_filter};
    let stmt = |code: u32, k: u32| sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |k: u32, jt: u8, jf: u8| sock_filter {
        code: (BPF_JMP | BPF_JEQ | BPF_K) as u16,
        jt,
        jf,
        k,
    };
    let load = |offset: usize| stmt(BPF_LD | BPF_W | BPF_ABS, offset as u32);
    // struct seccomp_data: nr at 0, args[i] at 16 + 8 i (the low half first
    // on a little-endian machine).
    let mut filter = Vec::new();
    for &(nr, arg, value) in rules {
        filter.push(load(0));
        filter.push(jump(nr as u32, 0, 3));
        filter.push(load(16 + 8 * arg));
        filter.push(jump(value, 0, 1));
        filter.push(stmt(
            BPF_RET | BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ));
    }
    filter.push(stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_ALLOW));
    // SAFETY: prctl and seccomp are system calls; the filter was built
    // before the fork, nothing is allocated after it.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let program = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_mut_ptr(),
            };
            if libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &program as *const libc::sock_fprog,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Starts the runner with `rules` refused and expects it to stop at once:
/// exit 2 (as for a configuration error), an error naming `named`, no
/// request to the coordinator, no secret in the output.
async fn refused_start(rules: &[(libc::c_long, usize, u32)], named: &str) {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(WAITING_AGENT);
    let mut cmd = sb.runner(&script);
    refuse(&mut cmd, rules);
    let child = cmd.spawn().unwrap();
    let (status, output) = finish(child).await;
    assert_eq!(status.code(), Some(2), "{output}");
    assert!(output.contains(named), "{output}");
    assert!(output.contains("refusing to start"), "{output}");
    assert_no_secret("output", &output, &sb.secrets(&[]));
    assert!(sb.coordinator.requests().is_empty(), "{output}");
}

#[tokio::test]
async fn a_refused_non_dumpable_call_keeps_the_runner_from_starting() {
    let rules = [(libc::SYS_prctl, 0, libc::PR_SET_DUMPABLE as u32)];
    refused_start(&rules, "PR_SET_DUMPABLE").await;
}

#[tokio::test]
async fn a_refused_core_limit_keeps_the_runner_from_starting() {
    #[allow(
        clippy::unnecessary_cast,
        reason = "RLIMIT_CORE is a u32 with glibc, an i32 with musl"
    )]
    let core = libc::RLIMIT_CORE as u32;
    // prlimit64(pid, resource, …) and setrlimit(resource, …).
    let rules = [
        (libc::SYS_prlimit64, 1, core),
        (libc::SYS_setrlimit, 0, core),
    ];
    refused_start(&rules, "RLIMIT_CORE").await;
}
