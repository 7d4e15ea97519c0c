//! The network itself (issue 15, RELIABILITY.md row "The network itself"):
//! the runner on a sandbox host of its own (a network namespace joined to
//! the test's by a veth pair), the coordinator across that link, reached
//! through a small userspace proxy that adds delay. nftables in the
//! namespace drops a share of the runner's packets for the whole boot and
//! all of them for a while during the turn (a partition that heals). The
//! boot, the turn and its events complete once the path heals: every event
//! arrives, none twice. Needs root; elsewhere it skips with the reason.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use hosted_boot::wire::RunOutcome;
use hosted_boot_coordinator::{CoordinatorOptions, Route};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::reliability_log::record;
use super::support::{Runner, Sandbox, WAIT};

fn sh(args: &[&str]) -> Result<String, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A network namespace with a veth link to the test's namespace:
/// `host_ip` on this side, `ns_ip` inside. Removed on drop.
struct Link {
    ns: String,
    host_ip: Ipv4Addr,
}

impl Link {
    fn create() -> Result<Link, String> {
        hosted_boot_test_support::root("a network namespace")?;
        if sh(&["nft", "--version"]).is_err() {
            return Err("nft is not installed (apt-get install nftables)".into());
        }
        let id = std::process::id() % 250 + 1;
        let ns = format!("hbnet{}", std::process::id());
        let (va, vb) = (format!("hbv{id}a"), format!("hbv{id}b"));
        let host_ip = Ipv4Addr::new(10, 213, id as u8, 1);
        let ns_ip = format!("10.213.{id}.2/30");
        let link = Link { ns, host_ip };
        let ns = link.ns.as_str();
        sh(&["ip", "netns", "add", ns])?;
        sh(&[
            "ip", "link", "add", &va, "type", "veth", "peer", "name", &vb,
        ])?;
        sh(&["ip", "link", "set", &vb, "netns", ns])?;
        sh(&["ip", "addr", "add", &format!("{host_ip}/30"), "dev", &va])?;
        sh(&["ip", "link", "set", &va, "up"])?;
        sh(&["ip", "-n", ns, "addr", "add", &ns_ip, "dev", &vb])?;
        sh(&["ip", "-n", ns, "link", "set", &vb, "up"])?;
        sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
        link.nft(&["add", "table", "inet", "chaos"])?;
        link.nft(&[
            "add",
            "chain",
            "inet",
            "chaos",
            "out",
            "{ type filter hook output priority 0; policy accept; }",
        ])?;
        Ok(link)
    }

    fn nft(&self, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["ip", "netns", "exec", &self.ns, "nft"];
        all.extend_from_slice(args);
        sh(&all)
    }

    /// Drops `percent` % of the runner's packets to the host (100: a
    /// partition), counted.
    fn drop_share(&self, percent: u32) {
        let dst = self.host_ip.to_string();
        if percent >= 100 {
            self.nft(&[
                "add", "rule", "inet", "chaos", "out", "ip", "daddr", &dst, "counter", "drop",
            ])
            .unwrap();
        } else {
            let share = percent.to_string();
            self.nft(&[
                "add", "rule", "inet", "chaos", "out", "ip", "daddr", &dst, "numgen", "random",
                "mod", "100", "<", &share, "counter", "drop",
            ])
            .unwrap();
        }
    }

    /// Packets the rules dropped so far (read from their counters).
    fn dropped(&self) -> u64 {
        let text = self
            .nft(&["list", "chain", "inet", "chaos", "out"])
            .unwrap();
        text.split("packets ")
            .skip(1)
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    /// Removes the rules (the path heals).
    fn heal(&self) {
        self.nft(&["flush", "chain", "inet", "chaos", "out"])
            .unwrap();
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // The veth pair goes with the namespace.
        let _ = sh(&["ip", "netns", "del", &self.ns]);
    }
}

/// A TCP proxy on `listener` to `upstream` that holds each chunk `delay`
/// before passing it on, both ways.
fn delay_proxy(listener: tokio::net::TcpListener, upstream: SocketAddr, delay: Duration) {
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let pipe = |mut r: tokio::net::tcp::OwnedReadHalf,
                            mut w: tokio::net::tcp::OwnedWriteHalf| async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        match r.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                tokio::time::sleep(delay).await;
                                if w.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                    let _ = w.shutdown().await;
                };
                tokio::join!(pipe(cr, sw), pipe(sr, cw));
            });
        }
    });
}

#[tokio::test]
async fn a_lossy_slow_link_and_a_partition_that_heals_lose_no_event() {
    let link = match Link::create() {
        Ok(l) => l,
        Err(why) => {
            hosted_boot_test_support::skip(why);
            return;
        }
    };
    let proxy = tokio::net::TcpListener::bind(SocketAddr::new(IpAddr::V4(link.host_ip), 0))
        .await
        .unwrap();
    let advertised = format!("http://{}/", proxy.local_addr().unwrap());
    let sb = Sandbox::start(CoordinatorOptions {
        listen: SocketAddr::new(IpAddr::V4(link.host_ip), 0),
        advertise_url: Some(advertised.parse().unwrap()),
        ..CoordinatorOptions::default()
    })
    .await;
    delay_proxy(
        proxy,
        sb.coordinator.local_addr(),
        Duration::from_millis(20),
    );

    // Ten events, the partition, ten more.
    let script = sb.script(
        r#"
i=0
while [ $i -lt 10 ]; do echo "{\"type\":\"message\",\"text\":\"before $i\"}"; i=$((i + 1)); done
touch "$AGENT_OUT/half"
while [ ! -e "$AGENT_OUT/healed" ]; do sleep 0.02; done
i=0
while [ $i -lt 10 ]; do echo "{\"type\":\"message\",\"text\":\"after $i\"}"; i=$((i + 1)); done
"#,
    );
    link.drop_share(10);
    let mut cmd = sb.wrapped_command(&["ip", "netns", "exec", &link.ns], "run", &script);
    // Slower than the suite's scale: a per-attempt timeout of 2 s outlasts
    // a SYN retransmission. Plain http to the test host (not loopback).
    cmd.env("HOSTED_BOOT_TEST_TIME_SCALE", "0.2")
        .env("HOSTED_BOOT_INSECURE_HTTP", "1");
    let runner = Runner::reading(cmd.spawn().unwrap());
    let half = sb.out().join("half");
    let started = tokio::time::timeout(Duration::from_secs(60), async {
        while !half.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if started.is_err() {
        panic!("the agent never started\n{}", runner.kill().await);
    }
    // The partition, until it has dropped a few of the runner's packets.
    link.drop_share(100);
    let cut = tokio::time::timeout(WAIT, async {
        while link.dropped() < 20 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let dropped = link.dropped();
    link.heal();
    link.drop_share(10);
    std::fs::write(sb.out().join("healed"), "").unwrap();
    assert!(cut.is_ok(), "the partition dropped only {dropped} packets");
    let sealed = sb
        .coordinator
        .wait_for(Duration::from_secs(90), |s| {
            s.run("run-1").is_some_and(|r| r.finish.is_some())
        })
        .await;
    if sealed.is_err() {
        panic!("run-1 was never sealed\n{}", runner.kill().await);
    }
    let dropped = dropped.max(link.dropped());
    link.heal();
    sb.coordinator.end_session();
    let (status, output) = runner.finish().await;
    assert_eq!(status.code(), Some(0), "{output}");

    let snap = sb.coordinator.snapshot();
    let run = snap.run("run-1").unwrap();
    assert_eq!(
        run.finish.as_ref().unwrap().status,
        RunOutcome::Succeeded,
        "{output}"
    );
    let texts: Vec<String> = run
        .events
        .iter()
        .filter_map(|e| e.data["text"].as_str().map(str::to_string))
        .collect();
    let expected: Vec<String> = (0..10)
        .map(|i| format!("before {i}"))
        .chain((0..10).map(|i| format!("after {i}")))
        .collect();
    let lost: Vec<&String> = expected.iter().filter(|t| !texts.contains(t)).collect();
    assert!(lost.is_empty(), "lost: {lost:?}\n{output}");
    let seqs: Vec<u64> = run.events.iter().map(|e| e.seq).collect();
    let contiguous = seqs.iter().enumerate().all(|(i, s)| *s == i as u64 + 1);
    assert!(contiguous, "accepted seqs {seqs:?}");
    // Events posted again after the coordinator had acknowledged them: a
    // batch whose answer was lost is resent (the cursor then decides), so
    // this is counted, not required to be zero.
    let mut posted = std::collections::BTreeMap::<u64, u64>::new();
    for r in snap.requests.iter().filter(|r| r.route == Route::Events) {
        for e in r.body["events"].as_array().into_iter().flatten() {
            if let Some(seq) = e["seq"].as_u64() {
                *posted.entry(seq).or_default() += 1;
            }
        }
    }
    let resent = posted.values().filter(|n| **n > 1).count();
    record(
        "the network: 10 % loss, 20 ms delay per chunk, a partition that heals",
        "the boot, the turn and its events complete once the path heals; nothing lost, none accepted twice",
        "suite::network::a_lossy_slow_link_and_a_partition_that_heals_lose_no_event",
        &[
            ("faults_injected", dropped),
            ("events_lost", lost.len() as u64),
            ("events_resent", resent as u64),
            ("events_accepted", seqs.len() as u64),
        ],
    );
}
