//! The egress canary (PROTOCOL.md 4.1 step 3, "The egress canary"; issue
//! 14): reachable, no agent runs and the first turn fails
//! `egress_policy_missing`; refused, unroutable or an untrusted TLS peer,
//! the turn runs. The real binary, the reference coordinator, and for the
//! unreachable cases a network namespace of the test's own.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::Stdio;

use hosted_boot_coordinator::{CoordinatorOptions, Snapshot};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::support::{Exits, RECORD_GROUP, Runner, Sandbox, finish};

/// An agent that records that it started.
const AGENT: &str = r#"echo started > "$AGENT_OUT/started"
echo '{"type":"message","text":"hello"}'"#;

/// The `hosted_boot.egress_canary` events of run `run_id`.
fn canary_events(snap: &Snapshot, run_id: &str) -> Vec<Value> {
    snap.run(run_id)
        .map(|r| {
            r.events
                .iter()
                .filter(|e| e.kind == "hosted_boot.egress_canary")
                .map(|e| e.data.clone())
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts that the boot failed closed on a reachable canary: no agent, the
/// first turn `failed` with `egress_policy_missing`, `turn_failed` naming it.
fn assert_failed_closed(sb: &Sandbox, status: std::process::ExitStatus, output: &str) -> Value {
    assert_eq!(status.code(), Some(1), "{output}");
    assert_eq!(sb.read_out("started"), "", "the agent was started");
    let snap = sb.coordinator.snapshot();
    assert_eq!(
        snap.status_names(),
        vec!["turn_started", "turn_completed", "turn_failed"]
    );
    let run = snap.run("run-1").unwrap();
    assert_eq!(run.status, "failed");
    let error = run.finish.as_ref().unwrap().error.as_ref().unwrap();
    assert_eq!(
        serde_json::to_value(error.code).unwrap(),
        json!("egress_policy_missing")
    );
    assert!(!error.retryable);
    assert!(error.message.contains("egress canary"), "{}", error.message);
    let reason = snap.statuses.last().unwrap().reason.clone().unwrap();
    assert!(reason.contains("egress canary"), "{reason}");
    let events = canary_events(&snap, "run-1");
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["reachable"], true);
    events[0].clone()
}

/// Asserts that the canary passed and the turn ran; returns its event.
async fn assert_passed(sb: &Sandbox, runner: impl Exits) -> (Value, String) {
    let (snap, output) = sb.end_after_seal("run-1", runner).await;
    assert_eq!(sb.read_out("started"), "started\n", "{output}");
    assert_eq!(snap.run("run-1").unwrap().status, "succeeded", "{output}");
    let events = canary_events(&snap, "run-1");
    assert_eq!(events.len(), 1, "{events:?}\n{output}");
    assert_eq!(events[0]["reachable"], false, "{output}");
    (events[0].clone(), output)
}

#[tokio::test]
async fn a_reachable_tcp_canary_fails_the_first_turn_closed() {
    // The blocked host: a listener on loopback (the kernel completes the
    // handshake from its backlog).
    let blocked = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = blocked.local_addr().unwrap();
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let mut cmd = sb.runner(&sb.script(AGENT));
    cmd.env("HOSTED_BOOT_EGRESS_CANARY", addr.to_string());
    let (status, output) = finish(cmd.spawn().unwrap()).await;
    let event = assert_failed_closed(&sb, status, &output);
    assert_eq!(event["canary"], addr.to_string());
    assert!(
        output.contains("egress canary reachable"),
        "the log does not say so: {output}"
    );
}

#[tokio::test]
async fn the_session_egress_canary_wins_over_the_flag() {
    let blocked = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = closed_loopback_port();
    let sb = Sandbox::start(CoordinatorOptions {
        egress_canary: Some(blocked.local_addr().unwrap().to_string()),
        ..CoordinatorOptions::default()
    })
    .await;
    let mut cmd = sb.runner(&sb.script(AGENT));
    cmd.env("HOSTED_BOOT_EGRESS_CANARY", closed.to_string());
    let (status, output) = finish(cmd.spawn().unwrap()).await;
    let event = assert_failed_closed(&sb, status, &output);
    assert_eq!(event["canary"], blocked.local_addr().unwrap().to_string());
}

#[tokio::test]
async fn without_a_canary_no_check_runs() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let runner = Runner::spawn(&sb, &sb.script(AGENT));
    let (snap, output) = sb.end_after_seal("run-1", runner).await;
    assert_eq!(sb.read_out("started"), "started\n", "{output}");
    assert!(canary_events(&snap, "run-1").is_empty());
}

/// A loopback port nothing listens on (bound, then closed).
fn closed_loopback_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

/// A network namespace of the test's own, joined to the test's by a veth
/// pair: `host` (10.213.N.1) outside, `inside` (10.213.N.2) in it, and no
/// other route, so any other address is unroutable from inside. Deleted on
/// drop (which removes the pair).
struct Netns {
    name: String,
    host: Ipv4Addr,
}

impl Netns {
    /// `None` (the test skipped, or failed unless the run allows skipping)
    /// where the test cannot make one.
    fn create(n: u8) -> Option<Netns> {
        if let Err(reason) = hosted_boot_test_support::root("a network namespace") {
            hosted_boot_test_support::skip(reason);
            return None;
        }
        let id = (std::process::id() % 200) as u8;
        let name = format!("hb-egress-{}-{n}", std::process::id());
        let outer = format!("hbe{}{n}a", std::process::id() % 100_000);
        let inner = format!("hbe{}{n}b", std::process::id() % 100_000);
        let host = Ipv4Addr::new(10, 213, id.wrapping_add(n.wrapping_mul(53)), 1);
        let inside = Ipv4Addr::new(host.octets()[0], host.octets()[1], host.octets()[2], 2);
        let ns = Netns {
            name: name.clone(),
            host,
        };
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), name.clone()],
            vec![
                "link".into(),
                "add".into(),
                outer.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                inner.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                inner.clone(),
                "netns".into(),
                name.clone(),
            ],
            vec![
                "addr".into(),
                "add".into(),
                format!("{host}/30"),
                "dev".into(),
                outer.clone(),
            ],
            vec!["link".into(), "set".into(), outer.clone(), "up".into()],
        ];
        let inside_steps: Vec<Vec<String>> = vec![
            vec![
                "addr".into(),
                "add".into(),
                format!("{inside}/30"),
                "dev".into(),
                inner.clone(),
            ],
            vec!["link".into(), "set".into(), inner.clone(), "up".into()],
            vec!["link".into(), "set".into(), "lo".into(), "up".into()],
        ];
        let run = |args: &[String]| {
            std::process::Command::new("ip")
                .args(args)
                .stdout(Stdio::null())
                .output()
        };
        for step in &steps {
            match run(step) {
                Ok(o) if o.status.success() => {}
                Ok(o) => {
                    hosted_boot_test_support::skip(format!(
                        "`ip {}` failed: {} (iproute2, with network namespaces)",
                        step.join(" "),
                        String::from_utf8_lossy(&o.stderr).trim()
                    ));
                    return None;
                }
                Err(e) => {
                    hosted_boot_test_support::skip(format!(
                        "cannot run ip: {e} (apt-get install iproute2)"
                    ));
                    return None;
                }
            }
        }
        for step in &inside_steps {
            let mut args = vec![
                "netns".to_string(),
                "exec".into(),
                name.clone(),
                "ip".into(),
            ];
            args.extend(step.iter().cloned());
            let o = run(&args).unwrap();
            assert!(
                o.status.success(),
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Some(ns)
    }

    /// A sandbox whose coordinator listens on the host side of the pair.
    async fn sandbox(&self) -> Sandbox {
        Sandbox::start(CoordinatorOptions {
            listen: SocketAddr::new(IpAddr::V4(self.host), 0),
            ..CoordinatorOptions::default()
        })
        .await
    }

    /// The runner on `script`, inside the namespace (the coordinator is not
    /// on its loopback, so plain http needs HOSTED_BOOT_INSECURE_HTTP).
    fn runner(&self, sb: &Sandbox, script: &Path, canary: &str) -> Runner {
        let mut cmd = sb.wrapped_command(&["ip", "netns", "exec", &self.name], "run", script);
        cmd.env("HOSTED_BOOT_INSECURE_HTTP", "1")
            .env("HOSTED_BOOT_EGRESS_CANARY", canary);
        Runner::reading(cmd.spawn().unwrap())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

#[tokio::test]
async fn a_refused_canary_in_a_namespace_of_our_own_lets_the_turn_run() {
    let Some(ns) = Netns::create(1) else { return };
    let sb = ns.sandbox().await;
    // Port 1 of the host side: nothing listens, the host answers RST.
    let canary = format!("{}:1", ns.host);
    let runner = ns.runner(&sb, &sb.script(AGENT), &canary);
    let (event, output) = assert_passed(&sb, runner).await;
    assert_eq!(
        event["detail"].as_str().unwrap().split(" (").next(),
        Some("connection refused"),
        "{event}"
    );
    assert!(
        output.contains("egress canary not reachable"),
        "the log does not say so: {output}"
    );
}

#[tokio::test]
async fn an_unroutable_canary_in_a_namespace_of_our_own_lets_the_turn_run() {
    let Some(ns) = Netns::create(2) else { return };
    let sb = ns.sandbox().await;
    // TEST-NET-1: the namespace has a route to its veth pair's /30 only.
    let runner = ns.runner(&sb, &sb.script(AGENT), "192.0.2.1:443");
    let (event, _) = assert_passed(&sb, runner).await;
    assert!(
        event["detail"]
            .as_str()
            .unwrap()
            .starts_with("network unreachable"),
        "{event}"
    );
}

/// A TLS server on loopback for `localhost`, with a certificate of a CA of
/// its own: `(port, CA file, server)`. `None` without openssl.
async fn tls_server(dir: &Path) -> Option<(u16, std::path::PathBuf, tokio::process::Child)> {
    let sh = |script: &str| {
        std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .output()
    };
    let made = sh(r#"set -e
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=hb-canary-test-ca
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout leaf.key -out leaf.csr -subj /CN=localhost
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' > leaf.ext
openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem -days 2 -extfile leaf.ext"#);
    match made {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            hosted_boot_test_support::skip(format!(
                "openssl failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
            return None;
        }
        Err(e) => {
            hosted_boot_test_support::skip(format!(
                "cannot run openssl: {e} (apt-get install openssl)"
            ));
            return None;
        }
    }
    let server = r#"
import socket, ssl, sys, threading
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("leaf.pem", "leaf.key")
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
def serve(c):
    try:
        t = ctx.wrap_socket(c, server_side=True)
        t.recv(65536)
        t.sendall(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
        t.close()
    except Exception:
        pass
    finally:
        c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;
    let mut child = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(server)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .await
        .unwrap();
    Some((line.trim().parse().unwrap(), dir.join("ca.pem"), child))
}

#[tokio::test]
async fn a_tls_canary_counts_only_a_handshake_the_runner_trusts() {
    let certs = tempfile::tempdir().unwrap();
    let Some((port, ca, _server)) = tls_server(certs.path()).await else {
        return;
    };
    let canary = format!("https://localhost:{port}/");

    // A peer that accepts the connection but presents a certificate the
    // runner does not trust (an intercepting middlebox would): passes.
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let mut cmd = sb.runner(&sb.script(AGENT));
    cmd.env("HOSTED_BOOT_EGRESS_CANARY", &canary);
    let (event, _) = assert_passed(&sb, Runner::reading(cmd.spawn().unwrap())).await;
    assert!(
        event["detail"]
            .as_str()
            .unwrap()
            .starts_with("the certificate is not trusted"),
        "{event}"
    );

    // The same peer with its CA among the runner's roots: a verified
    // handshake, so the egress is open: fails closed.
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let mut cmd = sb.runner(&sb.script(AGENT));
    cmd.env("HOSTED_BOOT_EGRESS_CANARY", &canary)
        .env("HOSTED_BOOT_CA_FILE", &ca);
    let (status, output) = finish(cmd.spawn().unwrap()).await;
    let event = assert_failed_closed(&sb, status, &output);
    assert!(
        event["detail"].as_str().unwrap().contains("HTTP 204"),
        "{event}"
    );
}

#[tokio::test]
async fn the_dev_api_sets_the_sessions_canary_and_instructions() {
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let url = format!("{}dev/around-agent", sb.coordinator.base_url());
    let http = reqwest::Client::new();
    let set = json!({"egressCanary": "blocked.example:443", "instructions": "be brief"});
    let resp = http.post(&url).json(&set).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.json::<Value>().await.unwrap(), set);
    let got: Value = http.get(&url).send().await.unwrap().json().await.unwrap();
    assert_eq!(got, set);
    let session = sb.coordinator.snapshot().session;
    assert_eq!(
        session.egress_canary.as_deref(),
        Some("blocked.example:443")
    );
    assert_eq!(session.instructions.as_deref(), Some("be brief"));
    // An unknown member is refused, naming it.
    let resp = http
        .post(&url)
        .json(&json!({"egressCanry": "x:1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
}

/// The canary comes after the setup script (4.1 step 3), which may need the
/// network the policy closes after it: the blocked host is reachable until
/// setup closes it (it kills the listener), so a check before setup would
/// fail closed, and the check after it lets the turn run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_setup_script_the_canary_is_checked_after_setup() {
    let mut listener = tokio::process::Command::new("python3")
        .args([
            "-c",
            "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',0))\ns.listen()\nprint(s.getsockname()[1],flush=True)\ntime.sleep(120)",
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(listener.stdout.take().unwrap())
        .read_line(&mut line)
        .await
        .unwrap();
    let port: u16 = line.trim().parse().unwrap();
    let pid = listener.id().unwrap();
    let sb = Sandbox::start(CoordinatorOptions::default()).await;
    let setup = sb.dir.path().join("setup.sh");
    std::fs::write(
        &setup,
        format!(
            "{RECORD_GROUP} >> \"$AGENT_OUT/.agent-pgids\"\nkill {pid}\npython3 -c \"\nimport socket,time\nwhile True:\n    try:\n        socket.create_connection(('127.0.0.1',{port}),1).close()\n    except OSError:\n        break\n    time.sleep(0.02)\n\"\n"
        ),
    )
    .unwrap();
    let mut cmd = sb.runner(&sb.script(AGENT));
    cmd.env("HOSTED_BOOT_EGRESS_CANARY", format!("127.0.0.1:{port}"))
        .env("HOSTED_BOOT_SETUP_SCRIPT", &setup);
    let (event, _) = assert_passed(&sb, Runner::reading(cmd.spawn().unwrap())).await;
    assert_eq!(event["canary"], format!("127.0.0.1:{port}"));
    let _ = listener.wait().await;
}
