//! The `command` agent: any program. The prompt goes on stdin (then EOF),
//! each stdout line that is a JSON object with a string `type` becomes an
//! event of that type, any other line an `output` event, stderr lines
//! `stderr` events (PROTOCOL.md 4.6: types are redacted, and `hosted_boot.`
//! types refused, by [`AgentEvent`]). The CLI adapters share this line
//! mapping and [`JsonLines`].

use std::os::unix::process::ExitStatusExt;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use serde_json::Value;

use super::{
    Adapter, AdapterIo, Effects, ExitRule, Launch, Observation, StdinMode, TurnOutcome, TurnSpec,
};
use crate::events::event::{AgentEvent, TextStream};
use crate::process::lines::{Line, MAX_LINE_BYTES};
use crate::process::supervisor::{Exit, Stream};
use crate::redact::Redactor;
use crate::wire::ErrorCode;

/// Maps one output line to an event (PROTOCOL.md 4.6): a stdout line that
/// is a JSON object with a string `type` becomes an event of that type (the
/// object is its data), any other stdout line an `output` event and a
/// stderr line a `stderr` event, all through [`AgentEvent`]'s one rule
/// (redaction of type and data by value, the runner's namespace refused).
/// `redactor` has had its sources polled for this batch.
pub fn event_for_line(redactor: &Redactor, stream: Stream, line: &Line) -> AgentEvent {
    event_for_owned_line(redactor, stream, line.clone())
}

/// [`event_for_line`] taking the line, whose bytes become the event's text
/// without a copy when they are UTF-8.
pub fn event_for_owned_line(redactor: &Redactor, stream: Stream, line: Line) -> AgentEvent {
    let Line {
        bytes,
        continued,
        redacted_at,
    } = line;
    // Valid UTF-8 only: a lossy decoding is not a piece of the line.
    let (text, final_) = match String::from_utf8(bytes) {
        Ok(text) => {
            let final_ =
                redacted_at.is_some_and(|g| redactor.stream_output_is_final(g, text.as_bytes()));
            (text, final_)
        }
        Err(e) => (String::from_utf8_lossy(e.as_bytes()).into_owned(), false),
    };
    match stream {
        Stream::Stderr => {
            AgentEvent::text_with(redactor, TextStream::Stderr, text, continued, final_)
        }
        Stream::Stdout => {
            if !continued
                && text.trim_start().starts_with('{')
                && let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&text)
                && let Some(event) = AgentEvent::typed_with(redactor, map, final_)
            {
                return event;
            }
            AgentEvent::text_with(redactor, TextStream::Stdout, text, continued, final_)
        }
    }
}

/// The outcome of a `command` process: exit 0 → `succeeded`; anything else
/// → `failed` with `agent_crashed` (the runner decides `interrupted`).
pub fn outcome(exit: &Exit) -> TurnOutcome {
    match exit.status {
        Some(s) if s.success() => TurnOutcome::succeeded(),
        Some(s) => TurnOutcome::failed(
            ErrorCode::AgentCrashed,
            format!("the agent {}", describe_status(s)),
        ),
        None => TurnOutcome::failed(
            ErrorCode::AgentCrashed,
            "the agent's exit status could not be collected",
        ),
    }
}

/// The name of signal `sig` (`SIGKILL`), for the ones an agent meets.
fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

/// "exited with status N" or "was killed by signal N (SIGNAME)".
pub fn describe_status(s: std::process::ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => match signal_name(sig) {
            Some(name) => format!("was killed by signal {sig} ({name})"),
            None => format!("was killed by signal {sig}"),
        },
        (None, None) => "ended abnormally".to_string(),
    }
}

/// The `command` agent's adapter: the prompt on stdin, lines to events.
pub struct CommandAdapter {
    spec: TurnSpec,
}

impl CommandAdapter {
    /// For one turn.
    pub fn new(spec: TurnSpec) -> Self {
        CommandAdapter { spec }
    }
}

impl Adapter for CommandAdapter {
    fn launch(&self) -> Launch {
        Launch {
            args: self.spec.extra_args.clone(),
            env: Vec::new(),
            stdin: StdinMode::Bytes(self.spec.prompt.clone().into_bytes()),
            protocol_interrupt: false,
            server: false,
            exit_rule: ExitRule::Command,
            stop_signal: rustix::process::Signal::INT,
            wrap_up: false,
        }
    }

    fn run(self: Box<Self>, mut io: AdapterIo) -> BoxFuture<'static, Observation> {
        async move {
            lines_to_events(&mut io.lines, &io.events).await;
            Observation {
                effects: Effects::Unknown,
                ..Observation::default()
            }
        }
        .boxed()
    }
}

/// Most lines mapped and spooled in one write by [`lines_to_events`].
pub const LINE_BATCH: usize = 512;

/// Maps every line of `lines` to an event and spools them, taking whatever
/// lines are already queued together (up to [`LINE_BATCH`]) so that a burst
/// of short lines costs one spool write (and one poll of the redactor's
/// sources), not one per line. Returns when the channel closes.
pub async fn lines_to_events(
    lines: &mut crate::process::output::LineReceiver,
    events: &crate::events::EventSender,
) {
    let mut batch = Vec::with_capacity(LINE_BATCH);
    while let Some((stream, line)) = lines.recv().await {
        let redactor = events.fresh_redactor();
        batch.push(event_for_owned_line(redactor, stream, line));
        while batch.len() < LINE_BATCH {
            match lines.try_recv() {
                Some((stream, line)) => batch.push(event_for_owned_line(redactor, stream, line)),
                None => break,
            }
        }
        events.append_agent(&mut batch, &crate::events::now_rfc3339());
        batch.clear();
    }
}

/// Longest JSON line a CLI adapter reassembles from the pieces of
/// [`MAX_LINE_BYTES`] the line framing hands on (32 MiB).
pub const MAX_JSON_LINE: usize = 32 * 1024 * 1024;

/// Reads JSON objects from a CLI's stdout lines, reassembling a line the
/// framing cut into pieces (its events are still sent as those pieces).
/// Lines that do not start with `{` (debug output) are skipped.
#[derive(Debug, Default)]
pub struct JsonLines {
    buf: Vec<u8>,
    active: bool,
}

impl JsonLines {
    /// A reader at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// The JSON object `line` completes, if any.
    pub fn push(&mut self, line: &Line) -> Option<serde_json::Map<String, Value>> {
        if !line.continued {
            self.buf.clear();
            self.active = false;
        } else if !self.active {
            return None;
        }
        // Pieces are cut at exactly MAX_LINE_BYTES; a shorter one ends the line.
        let full_piece = line.bytes.len() >= MAX_LINE_BYTES;
        if full_piece || line.continued {
            if self.buf.len() + line.bytes.len() > MAX_JSON_LINE {
                self.buf.clear();
                self.active = false;
                return None;
            }
            self.buf.extend_from_slice(&line.bytes);
            self.active = full_piece;
            if full_piece {
                return None;
            }
            let bytes = std::mem::take(&mut self.buf);
            return parse_object(&bytes);
        }
        parse_object(&line.bytes)
    }
}

fn parse_object(bytes: &[u8]) -> Option<serde_json::Map<String, Value>> {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace())?;
    if bytes[start] != b'{' {
        return None;
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(text: &str) -> Line {
        Line {
            bytes: text.as_bytes().to_vec(),
            continued: false,
            redacted_at: None,
        }
    }

    fn map(text: &str) -> (String, Value) {
        let e = event_for_line(&Redactor::new(), Stream::Stdout, &line(text));
        (e.kind().to_string(), e.data().clone())
    }

    #[test]
    fn json_lines_with_a_type_become_events() {
        let (kind, data) = map(r#"{"type":"message","text":"hi"}"#);
        assert_eq!(kind, "message");
        assert_eq!(data, json!({"type": "message", "text": "hi"}));
    }

    #[test]
    fn json_lines_are_reassembled_from_pieces_and_debug_lines_skipped() {
        let mut j = JsonLines::new();
        assert!(j.push(&line("[SandboxDebug] hi")).is_none());
        assert_eq!(j.push(&line(r#"{"a":1}"#)).unwrap()["a"], json!(1));
        let big = format!(
            r#"{{"type":"result","text":"{}"}}"#,
            "x".repeat(MAX_LINE_BYTES)
        );
        let bytes = big.as_bytes();
        let first = Line {
            bytes: bytes[..MAX_LINE_BYTES].to_vec(),
            continued: false,
            redacted_at: None,
        };
        let rest = Line {
            bytes: bytes[MAX_LINE_BYTES..].to_vec(),
            continued: true,
            redacted_at: None,
        };
        assert!(j.push(&first).is_none());
        assert_eq!(j.push(&rest).unwrap()["type"], json!("result"));
    }

    #[test]
    fn other_lines_are_output_and_runner_types_cannot_be_forged() {
        for text in [
            r#"{"type":"hosted_boot.harvest"}"#,
            r#"{"type":""}"#,
            r#"{"type":3}"#,
            "[1]",
            "plain",
            r#"{"x":1}"#,
        ] {
            let (kind, data) = map(text);
            assert_eq!(kind, "output", "{text}");
            assert_eq!(data, json!({"text": text}));
        }
        let e = event_for_line(
            &Redactor::new(),
            Stream::Stderr,
            &line(r#"{"type":"message"}"#),
        );
        assert_eq!(e.kind(), "stderr");
    }

    /// Each line of `reads` through the runner's stream redaction and
    /// framing, mapped twice: as the runner maps it (the pass by value
    /// skipped when the stream's redaction is final) and with the pass by
    /// value forced. `add` runs after each read (a secret minted while the
    /// agent prints).
    fn both_ways(
        redactor: &Redactor,
        reads: &[&[u8]],
        mut add: impl FnMut(usize),
    ) -> Vec<(AgentEvent, AgentEvent, bool)> {
        let mut lines = Vec::new();
        let mut out = crate::process::output::RedactedLines::new(redactor);
        for (i, read) in reads.iter().enumerate() {
            out.write(read, |l| lines.push(l));
            add(i);
        }
        out.end(|l| lines.push(l));
        lines
            .into_iter()
            .map(|l| {
                let fast = event_for_line(redactor, Stream::Stdout, &l);
                let skipped = l.redacted_at.is_some_and(|g| {
                    std::str::from_utf8(&l.bytes).is_ok()
                        && redactor.stream_output_is_final(g, &l.bytes)
                });
                let forced = Line {
                    redacted_at: None,
                    ..l
                };
                (
                    fast,
                    event_for_line(redactor, Stream::Stdout, &forced),
                    skipped,
                )
            })
            .collect()
    }

    fn secret(r: &Redactor, value: &str) {
        use crate::redact::SecretKind;
        r.add(
            &crate::secret::Secret::new(value.into()),
            SecretKind::Credential,
        );
    }

    #[test]
    fn a_line_streamed_before_a_secret_was_added_is_redacted_by_value() {
        let r = Redactor::new();
        secret(&r, "sk-first-0123456789");
        let minted = "ghs_minted0123456789abcdef";
        let line = format!(r#"{{"type":"x","v":"sk-first-0123456789 {minted}"}}"#);
        let (got, _, skipped) = both_ways(&r, &[line.as_bytes(), b"\n"], |i| {
            if i == 0 {
                secret(&r, minted);
            }
        })
        .remove(0);
        assert!(!skipped, "the set changed after the line's first byte");
        let text = serde_json::to_string(got.data()).unwrap();
        assert!(
            !text.contains(minted) && !text.contains("sk-first"),
            "{text}"
        );
        // The same line streamed after both were known skips the pass.
        let again = both_ways(&r, &[line.as_bytes(), b"\n"], |_| {});
        assert!(
            again[0].2,
            "nothing changed: the stream's redaction is final"
        );
        assert_eq!(again[0].0.data(), got.data());
    }

    #[test]
    fn a_secret_that_redaction_itself_spells_is_redacted_by_value() {
        // The stream writes `[REDACTED]` for the first secret; with `zz..`
        // after it that spells the second, which only a second pass finds.
        let r = Redactor::new();
        secret(&r, "sk-first-0123456789");
        secret(&r, "[REDACTED]zz-0123456789");
        let events = both_ways(
            &r,
            &[b"{\"type\":\"x\",\"v\":\"sk-first-0123456789zz-0123456789\"}\n"],
            |_| {},
        );
        let (fast, forced, skipped) = &events[0];
        assert!(!skipped);
        assert_eq!(fast.data(), forced.data());
        assert_eq!(fast.data()["v"], "[REDACTED]");
    }

    #[test]
    fn secrets_the_marker_helps_spell_are_redacted_by_value() {
        // A break-it review's cases: a secret starting with the marker's
        // tail (`CTED]...`), and one inside it (`REDACTED`).
        for (second, read) in [
            (
                "CTED]tail-abcdef",
                &b"{\"type\":\"x\",\"v\":\"sk-first-0123456789tail-abcdef\"}\n"[..],
            ),
            ("REDACTED", &b"plain sk-first-0123456789 text\n"[..]),
        ] {
            let r = Redactor::new();
            secret(&r, "sk-first-0123456789");
            secret(&r, second);
            let (fast, forced, skipped) = both_ways(&r, &[read], |_| {}).remove(0);
            assert!(!skipped, "{second}");
            assert_eq!(fast.data(), forced.data(), "{second}");
        }
    }

    proptest::proptest! {
        /// Whatever the lines hold (JSON or text, escapes, secrets whole,
        /// escaped or cut across reads) and whenever secrets are added,
        /// skipping the pass by value changes no event.
        #[test]
        fn skipping_the_pass_by_value_changes_no_event(
            pieces in proptest::collection::vec((0usize..8, 0usize..4), 1..40),
            cuts in proptest::collection::vec(1usize..64, 1..12),
            late in proptest::option::of(0usize..12),
        ) {
            const SECRETS: [&str; 4] = [
                "sk-0123456789abcdef",
                "ghs_AbCdEf0123456789",
                "pa\"ss word/é-0123",
                "token-late-987654321",
            ];
            let r = Redactor::new();
            for s in &SECRETS[..3] {
                secret(&r, s);
            }
            let mut text = String::new();
            for (kind, which) in pieces {
                let value = SECRETS[which];
                let quoted = serde_json::to_string(value).unwrap();
                text.push_str(match kind {
                    0 => "plain words ",
                    1 => r#"{"type":"message","text":""#,
                    2 => r#""}"#,
                    3 => "\n",
                    4 => r"\u0073k-",
                    5 => " {\"type\":\"t\",\"k\":",
                    6 => value,
                    _ => &quoted[1..quoted.len() - 1],
                });
                if kind == 5 {
                    text.push_str(&quoted);
                    text.push_str("}\n");
                }
            }
            let bytes = text.as_bytes();
            let mut reads = Vec::new();
            let mut at = 0;
            for (i, cut) in cuts.iter().cycle().enumerate() {
                if at >= bytes.len() || i > 400 {
                    break;
                }
                let end = (at + cut).min(bytes.len());
                reads.push(&bytes[at..end]);
                at = end;
            }
            if at < bytes.len() {
                reads.push(&bytes[at..]);
            }
            for (fast, forced, _) in both_ways(&r, &reads, |i| {
                if Some(i) == late {
                    secret(&r, SECRETS[3]);
                }
            }) {
                proptest::prop_assert_eq!(fast.kind(), forced.kind());
                proptest::prop_assert_eq!(fast.data(), forced.data());
            }
        }
    }

    fn spooled(path: &std::path::Path) -> Vec<Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The runner's path for agent output (`agent::drive` with the `command`
    /// adapter): the reader's `ChannelSink`, then [`lines_to_events`] into the
    /// run's spool.
    #[tokio::test]
    async fn a_secret_across_reads_and_a_long_line_cut_never_reaches_the_spool() {
        use crate::events::EventSender;
        use crate::events::spool::Spool;
        use crate::process::output::{ChannelSink, LineReceiver, OutputSink};
        use crate::redact::SecretKind;
        use crate::secret::Secret;

        let dir = tempfile::tempdir().unwrap();
        let redactor = Redactor::new();
        redactor.add(&Secret::new("sk-0123456789".into()), SecretKind::Credential);
        let (spool, _) = Spool::open(dir.path(), redactor.clone()).unwrap();
        let path = spool.path().to_path_buf();
        let events = EventSender::detached(spool);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let adapter = tokio::spawn(async move {
            lines_to_events(&mut LineReceiver::new(rx), &events).await;
        });
        let mut out = ChannelSink::new(Stream::Stdout, &redactor, |_: Stream, _: &Line| {}, tx);
        // A line of exactly MAX_LINE_BYTES - 5 bytes then the secret: the
        // cut falls inside the secret.
        let mut input = vec![b'x'; MAX_LINE_BYTES - 5];
        input.extend_from_slice(
            b"sk-0123456789 end\n{\"type\":\"message\",\"text\":\"k=sk-0123456789\"}\n",
        );
        for chunk in input.chunks(4093) {
            out.write(chunk);
            out.ready().await;
        }
        out.write(b"tail sk-01234");
        out.ready().await;
        // Ends the stream as the reader does: the carry and the last line are kept.
        out.end();
        out.ready().await;
        drop(out);
        adapter.await.unwrap();
        let lines = spooled(&path);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("sk-0123456789"));
        let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
        assert_eq!(seqs, vec![1, 2, 3, 4]);
        assert_eq!(lines[1]["data"]["continued"], true);
        let joined = format!(
            "{}{}",
            lines[0]["data"]["text"].as_str().unwrap(),
            lines[1]["data"]["text"].as_str().unwrap()
        );
        assert!(
            joined.ends_with("x[REDACTED] end"),
            "{}",
            &joined[joined.len() - 30..]
        );
        assert_eq!(lines[2]["type"], "message");
        assert_eq!(lines[2]["data"]["text"], "k=[REDACTED]");
        assert_eq!(lines[3]["data"]["text"], "tail sk-01234");
    }
}
