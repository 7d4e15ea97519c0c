//! The runner protects itself (issue 15, RELIABILITY.md row "The runner
//! protects itself"; PROTOCOL.md 4.1 step 4): its own `oom_score_adj` is
//! low and the agent's the highest, so the kernel's OOM killer takes the
//! agent; an agent killed by SIGKILL from outside (what the OOM killer
//! sends) fails its turn `agent_crashed` naming the signal, and the next
//! turn runs.

use hosted_boot::wire::{ErrorCode, RunOutcome};
use hosted_boot_coordinator::CoordinatorOptions;

use super::reliability_log::record;
use super::support::{Runner, Sandbox, signal, wait_for_file};

fn oom_score_adj(pid: u32) -> i32 {
    std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn the_oom_killer_would_take_the_agent_not_the_runner() {
    // Lowering a score needs CAP_SYS_RESOURCE, which a container's root may
    // lack: a shell tries it once.
    let can_lower = std::process::Command::new("sh")
        .args(["-c", "echo -1 > /proc/self/oom_score_adj"])
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success();
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
cat /proc/self/oom_score_adj > "$AGENT_OUT/agent-oom"
sh -c 'cat /proc/self/oom_score_adj' > "$AGENT_OUT/tool-oom"
touch "$AGENT_OUT/measured"
while [ ! -e "$AGENT_OUT/go" ]; do sleep 0.02; done
echo '{"type":"message","text":"done"}'
"#,
    );
    let runner = Runner::spawn(&sb, &script);
    wait_for_file(&sb.out().join("measured")).await;
    let runner_score = oom_score_adj(runner.pid());
    let agent: i32 = sb.read_out("agent-oom").trim().parse().unwrap();
    let tool: i32 = sb.read_out("tool-oom").trim().parse().unwrap();
    std::fs::write(sb.out().join("go"), "").unwrap();
    let (_, output) = sb.end_after_seal("run-1", runner).await;
    assert_eq!(agent, 1000, "{output}");
    assert_eq!(tool, 1000, "the agent's children inherit its score");
    if can_lower {
        assert_eq!(runner_score, -900, "{output}");
    } else {
        eprintln!(
            "no CAP_SYS_RESOURCE here: the runner cannot lower its own oom_score_adj (kept {runner_score}); checked that it says so"
        );
        assert!(runner_score < agent);
        assert!(
            output.contains("cannot lower the runner's oom_score_adj"),
            "{output}"
        );
    }
    record(
        "the runner protects itself: oom_score_adj",
        "the runner's score is -900 (with CAP_SYS_RESOURCE; else kept and logged), the agent's and its children's 1000",
        "suite::self_protection::the_oom_killer_would_take_the_agent_not_the_runner",
        &[
            // The scores read: the agent's, its tool's and the runner's.
            ("inputs_tried", [agent, tool, runner_score].len() as u64),
            (
                "wrong_scores",
                u64::from(agent != 1000)
                    + u64::from(tool != 1000)
                    + u64::from(can_lower && runner_score != -900),
            ),
        ],
    );
}

#[tokio::test]
async fn an_agent_killed_from_outside_fails_agent_crashed_naming_sigkill_and_the_next_turn_runs() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let script = sb.script(
        r#"
if [ "$ORIZU_RUN_ID" = run-1 ]; then
  echo '{"type":"message","text":"working"}'
  echo $$ > "$AGENT_OUT/agent-pid.tmp"; mv "$AGENT_OUT/agent-pid.tmp" "$AGENT_OUT/agent-pid"
  while :; do sleep 0.05; done
fi
echo "{\"type\":\"message\",\"text\":\"done $ORIZU_RUN_ID\"}"
"#,
    );
    let runner = Runner::spawn(&sb, &script);
    let pid_file = sb.out().join("agent-pid");
    wait_for_file(&pid_file).await;
    sb.wait_text("run-1", "working").await;
    let pid: u32 = sb.read_out("agent-pid").trim().parse().unwrap();
    signal(pid, rustix::process::Signal::KILL);
    let (status, output) = runner.finish().await;
    // A failed turn is fatal (PROTOCOL.md 4.1 step 7): the sandbox ends.
    assert_eq!(status.code(), Some(1), "{output}");
    let run = sb.coordinator.run("run-1").unwrap();
    let fin = run.finish.as_ref().unwrap();
    assert_eq!(fin.status, RunOutcome::Failed);
    let error = fin.error.as_ref().unwrap();
    assert_eq!(error.code, ErrorCode::AgentCrashed, "{output}");
    assert!(
        error.message.contains("signal 9") && error.message.contains("SIGKILL"),
        "{}",
        error.message
    );
    assert!(run.events.iter().any(|e| e.data["text"] == "working"));

    // The next turn, in the next sandbox on the same root, runs.
    let run2 = sb.coordinator.queue_turn("next", None);
    let next = Runner::spawn(&sb, &script);
    let snap = sb.wait_sealed(&run2).await;
    sb.coordinator.end_session();
    let (status, output2) = next.finish().await;
    assert_eq!(status.code(), Some(0), "{output2}");
    let r2 = snap.run(&run2).unwrap();
    assert_eq!(r2.finish.as_ref().unwrap().status, RunOutcome::Succeeded);
    assert!(
        r2.events
            .iter()
            .any(|e| e.data["text"] == format!("done {run2}"))
    );
    record(
        "the runner protects itself: the agent killed by SIGKILL from outside",
        "the turn fails agent_crashed naming SIGKILL; the next turn runs",
        "suite::self_protection::an_agent_killed_from_outside_fails_agent_crashed_naming_sigkill_and_the_next_turn_runs",
        &[
            ("faults_injected", 1),
            (
                "turns_run_after",
                u64::from(r2.finish.as_ref().unwrap().status == RunOutcome::Succeeded),
            ),
        ],
    );
}
