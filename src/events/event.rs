//! Who may build a run event (PROTOCOL.md 4.6 and section 5).
//!
//! Two kinds of event reach the spool, and each has its own door:
//!
//! - [`AgentEvent`]: whatever the agent produced (a stdout line, a Codex
//!   JSON-RPC message, an opencode server event, a line of text). Its type
//!   comes from the agent, so it is built only here, by one rule for every
//!   adapter: the type and the data are redacted by value (a JSON parse
//!   unescapes strings, so `"\u0061cme-…"` in a line becomes a connector
//!   value that the redaction of the byte stream never saw), and a type in
//!   the runner's namespace ([`RUNNER_EVENT_PREFIX`]) or an empty one is
//!   refused: the event becomes a plain `output` event whose `text` is the
//!   agent's whole message as compact JSON (redacted too).
//! - [`RunnerEvent`]: the runner's own `hosted_boot.*` types, a closed list;
//!   their data is redacted by the spool ([`super::spool::Spool::append_runner`]).
//!
//! Nothing else can put a type on an event, so an agent cannot forge one of
//! the runner's events and no secret travels as an event type. The module
//! depends only on the redactor and JSON values.

use serde_json::{Map, Value, json};

use crate::redact::Redactor;

/// Prefix reserved for the runner's own event types (PROTOCOL.md 4.6).
/// Compared under Unicode case folding, after dropping default-ignorable
/// characters and leading whitespace (see [`is_reserved`]), so that a
/// consumer that folds case, strips invisible characters or trims cannot be
/// fooled either.
pub const RUNNER_EVENT_PREFIX: &str = "hosted_boot.";

/// The type a refused agent event takes, and that of stdout text.
pub const OUTPUT: &str = "output";
/// The type of the agent's stderr lines.
pub const STDERR: &str = "stderr";

/// Whether `kind` is in the runner's namespace as any consumer may read it:
/// its default-ignorable characters (zero-width spaces and joiners, soft
/// hyphen, bidi controls, variation selectors, tags) dropped and leading
/// whitespace trimmed, it starts with [`RUNNER_EVENT_PREFIX`] once lower-cased,
/// upper-cased, or upper- then lower-cased, the Unicode way (`ſ`, U+017F,
/// upper-cases to `S`; `ﬅ`, U+FB05, to `ST`).
pub fn is_reserved(kind: &str) -> bool {
    // Every character folds to at least one, so the prefix's 12 characters
    // come from at most 12 of the kind's.
    let head: String = kind
        .chars()
        .filter(|&c| !is_default_ignorable(c))
        .skip_while(|c| c.is_whitespace())
        .take(RUNNER_EVENT_PREFIX.len())
        .collect();
    let upper = head.to_uppercase();
    head.to_lowercase().starts_with(RUNNER_EVENT_PREFIX)
        || upper.starts_with(&RUNNER_EVENT_PREFIX.to_uppercase())
        || upper.to_lowercase().starts_with(RUNNER_EVENT_PREFIX)
}

/// Unicode's `Default_Ignorable_Code_Point` (DerivedCoreProperties.txt,
/// Unicode 16): characters a renderer shows as nothing and that text
/// processing may drop.
fn is_default_ignorable(c: char) -> bool {
    matches!(
        u32::from(c),
        0x00AD
            | 0x034F
            | 0x061C
            | 0x115F..=0x1160
            | 0x17B4..=0x17B5
            | 0x180B..=0x180F
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x206F
            | 0x3164
            | 0xFE00..=0xFE0F
            | 0xFEFF
            | 0xFFA0
            | 0xFFF0..=0xFFF8
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0000..=0xE0FFF
    )
}

/// One event the agent produced, ready to be numbered and spooled: type and
/// data redacted by value, the type neither empty nor in the runner's
/// namespace. Built only by [`AgentEvent::typed`], [`AgentEvent::named`]
/// and [`AgentEvent::text`].
///
/// Each constructor redacts with the redactor as it stands: the caller
/// polls its sources ([`Redactor::refresh`]) once per batch of events
/// ([`super::EventSender::fresh_redactor`] does).
#[derive(Clone, Debug, PartialEq)]
pub struct AgentEvent {
    /// Borrowed for the runner's own `output` and `stderr` (no allocation
    /// per line of text).
    kind: std::borrow::Cow<'static, str>,
    data: Value,
}

/// Which of the agent's text streams a line of text came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextStream {
    /// Stdout: an `output` event.
    Stdout,
    /// Stderr: a `stderr` event.
    Stderr,
}

impl AgentEvent {
    /// A JSON object with a string `type` (a stdout line of `command`,
    /// Claude Code, `codex exec`, `opencode run`) as an event of that type
    /// whose data is the whole object; `None` when `object` has no string
    /// `type` (the caller sends the line as text). A refused type makes an
    /// `output` event of the object.
    pub fn typed(redactor: &Redactor, object: Map<String, Value>) -> Option<AgentEvent> {
        Self::typed_with(redactor, object, false)
    }

    /// [`AgentEvent::typed`] for an `object` parsed from a line of which
    /// [`Redactor::stream_output_is_final`] said `final_` (`true`: the pass
    /// by value, which would find nothing, is skipped).
    pub fn typed_with(
        redactor: &Redactor,
        object: Map<String, Value>,
        final_: bool,
    ) -> Option<AgentEvent> {
        let kind = match object.get("type") {
            Some(Value::String(kind)) => kind.clone(),
            _ => return None,
        };
        Some(Self::build(
            redactor,
            kind,
            Value::Object(object),
            |data| data,
            final_,
        ))
    }

    /// An event of type `kind` with payload `data` taken from a larger
    /// message (a Codex notification's method and params, an opencode
    /// server event's `type` and `properties`). A refused type makes an
    /// `output` event of `message()`, the agent's whole message.
    pub fn named(
        redactor: &Redactor,
        kind: String,
        data: Value,
        message: impl FnOnce() -> Value,
    ) -> AgentEvent {
        Self::build(redactor, kind, data, |_| message(), false)
    }

    /// A line of the agent's text: `{"text": text}` (with `"continued":
    /// true` for the second and later pieces of a line cut at 1 MiB), as
    /// `output` or `stderr`.
    pub fn text(
        redactor: &Redactor,
        stream: TextStream,
        text: String,
        continued: bool,
    ) -> AgentEvent {
        Self::text_with(redactor, stream, text, continued, false)
    }

    /// [`AgentEvent::text`] for the text of a line of which
    /// [`Redactor::stream_output_is_final`] said `final_` (`true`: the pass
    /// by value, which would find nothing, is skipped).
    pub fn text_with(
        redactor: &Redactor,
        stream: TextStream,
        text: String,
        continued: bool,
        final_: bool,
    ) -> AgentEvent {
        let kind = match stream {
            TextStream::Stdout => OUTPUT,
            TextStream::Stderr => STDERR,
        };
        let mut data = if continued {
            json!({"text": text, "continued": true})
        } else {
            json!({"text": text})
        };
        if !final_ {
            redactor.redact_value(&mut data);
        }
        AgentEvent {
            kind: kind.into(),
            data,
        }
    }

    /// The one rule (PROTOCOL.md 4.6): refuse an empty or reserved type
    /// (then the event is `output` with the message as text), redact the
    /// type and the data by value (unless `final_`, see
    /// [`AgentEvent::typed_with`]).
    fn build(
        redactor: &Redactor,
        kind: String,
        data: Value,
        message: impl FnOnce(Value) -> Value,
        final_: bool,
    ) -> AgentEvent {
        if kind.is_empty() || is_reserved(&kind) {
            // Serializing adds escapes the line did not have: by value.
            let text = message(data).to_string();
            return Self::text(redactor, TextStream::Stdout, text, false);
        }
        if final_ {
            return AgentEvent {
                kind: kind.into(),
                data,
            };
        }
        let mut kind = Value::String(kind);
        redactor.redact_value(&mut kind);
        let Value::String(kind) = kind else {
            unreachable!("redaction keeps a string a string")
        };
        let mut data = data;
        redactor.redact_value(&mut data);
        AgentEvent {
            kind: kind.into(),
            data,
        }
    }

    /// The event's type.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The event's payload.
    pub fn data(&self) -> &Value {
        &self.data
    }
}

/// The runner's own events (PROTOCOL.md 4.6), the only ones with a
/// `hosted_boot.` type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunnerEvent {
    /// `hosted_boot.runner`: first in every run (versions, agent, program).
    Runner,
    /// `hosted_boot.agent_session`: the agent named its session.
    AgentSession,
    /// `hosted_boot.overload_continuation`: an overloaded turn continued.
    OverloadContinuation,
    /// `hosted_boot.agent_session_reset`: the CLI refused the resume and
    /// the turn runs in a fresh agent session.
    AgentSessionReset,
    /// `hosted_boot.spawn_failed`: the agent could not be started.
    SpawnFailed,
    /// `hosted_boot.wrap_up`: the wrap-up message was sent to the agent
    /// before the turn's time cap (4.1 step 4).
    WrapUp,
    /// `hosted_boot.harvest`: the turn's work as harvested (4.5).
    Harvest,
    /// `hosted_boot.workspace_sync`: the workspace brought to the remote's
    /// session branch before the agent starts (4.1 step 3, 4.5 "Before a
    /// turn").
    WorkspaceSync,
    /// `hosted_boot.setup`: the setup script started, succeeded, failed,
    /// was interrupted, or was skipped by the setup cache (4.1 "Setup").
    Setup,
    /// `hosted_boot.setup_output`: a line of the setup script's output,
    /// redacted like the agent's.
    SetupOutput,
    /// `hosted_boot.egress_canary`: the egress canary's result, before the
    /// first agent starts (4.1 step 3).
    EgressCanary,
    /// `hosted_boot.workspace`: a fresh clone's submodules and LFS files
    /// (3, "A complete workspace"), in the first turn when it has either.
    Workspace,
    /// `hosted_boot.agent_state`: the agent CLI's state restored before
    /// the boot's first agent, or saved after a turn's, or why not (2.7).
    AgentState,
    /// `hosted_boot.checkpoint`: a checkpoint on notice while the agent
    /// ran, and where its work went (4.5, "Checkpoint").
    Checkpoint,
}

impl RunnerEvent {
    /// The event type.
    pub const fn kind(self) -> &'static str {
        match self {
            RunnerEvent::Runner => "hosted_boot.runner",
            RunnerEvent::AgentSession => "hosted_boot.agent_session",
            RunnerEvent::OverloadContinuation => "hosted_boot.overload_continuation",
            RunnerEvent::AgentSessionReset => "hosted_boot.agent_session_reset",
            RunnerEvent::SpawnFailed => "hosted_boot.spawn_failed",
            RunnerEvent::WrapUp => "hosted_boot.wrap_up",
            RunnerEvent::Harvest => "hosted_boot.harvest",
            RunnerEvent::WorkspaceSync => "hosted_boot.workspace_sync",
            RunnerEvent::Setup => "hosted_boot.setup",
            RunnerEvent::SetupOutput => "hosted_boot.setup_output",
            RunnerEvent::EgressCanary => "hosted_boot.egress_canary",
            RunnerEvent::Workspace => "hosted_boot.workspace",
            RunnerEvent::AgentState => "hosted_boot.agent_state",
            RunnerEvent::Checkpoint => "hosted_boot.checkpoint",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redact::SecretKind;
    use crate::secret::Secret;

    fn redactor() -> Redactor {
        let r = Redactor::new();
        r.add(
            &Secret::new("acme-0123456789".into()),
            SecretKind::Configured,
        );
        r
    }

    fn object(text: &str) -> Map<String, Value> {
        match serde_json::from_str(text).unwrap() {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn a_type_that_holds_a_secret_is_redacted_like_the_data() {
        let r = redactor();
        let e = AgentEvent::typed(
            &r,
            object(r#"{"type":"tool-\u0061cme-0123456789","k":"\u0061cme-0123456789"}"#),
        )
        .unwrap();
        assert_eq!(e.kind(), "tool-[REDACTED]");
        assert_eq!(
            e.data(),
            &json!({"type": "tool-[REDACTED]", "k": "[REDACTED]"})
        );
        let e = AgentEvent::named(&r, "acme-0123456789".into(), json!({"n": 1}), || {
            Value::Null
        });
        assert_eq!((e.kind(), e.data()), ("[REDACTED]", &json!({"n": 1})));
    }

    #[test]
    fn reserved_or_empty_types_become_output_of_the_whole_message() {
        let r = redactor();
        for text in [
            r#"{"type":"hosted_boot.harvest","x":1}"#,
            r#"{"type":"Hosted_Boot.runner"}"#,
            r#"{"type":"hosted_boot.\u0061cme-0123456789"}"#,
            r#"{"type":""}"#,
        ] {
            let e = AgentEvent::typed(&r, object(text)).unwrap();
            assert_eq!(e.kind(), OUTPUT, "{text}");
            let inner: Value = serde_json::from_str(e.data()["text"].as_str().unwrap()).unwrap();
            let mut expected = Value::Object(object(text));
            r.redact_value(&mut expected);
            assert_eq!(inner, expected, "{text}");
            assert!(!e.data().to_string().contains("acme-0123456789"));
        }
        let e = AgentEvent::named(
            &r,
            "hosted_boot.harvest".into(),
            json!({"a": 1}),
            || json!({"method": "hosted_boot.harvest", "params": {"a": "acme-0123456789"}}),
        );
        assert_eq!(e.kind(), OUTPUT);
        assert_eq!(
            e.data(),
            &json!({"text": r#"{"method":"hosted_boot.harvest","params":{"a":"[REDACTED]"}}"#})
        );
        assert!(AgentEvent::typed(&r, object(r#"{"type":3}"#)).is_none());
        assert!(!is_reserved("hosted_boot"));
        assert!(is_reserved("HOSTED_BOOT.x"));
    }

    #[test]
    fn the_namespace_is_refused_however_a_consumer_folds_it() {
        for kind in [
            "ho\u{17f}ted_boot.harvest",
            "HO\u{17f}TED_BOOT.runner",
            "ho\u{fb05}ed_boot.harvest",
            "\u{200b}hosted_boot.harvest",
            "ho\u{200d}sted_boot.harvest",
            "\u{feff} hosted_boot.runner",
            " \thosted_boot.runner",
            "hosted_boot\u{ad}.runner",
            "hosted_boot.",
        ] {
            assert!(is_reserved(kind), "{kind:?}");
        }
        for kind in [
            "hosted_boot",
            "hosted-boot.runner",
            "xhosted_boot.runner",
            "assistant",
            "",
            "\u{17f}",
        ] {
            assert!(!is_reserved(kind), "{kind:?}");
        }
    }

    #[test]
    fn runner_types_are_all_in_the_reserved_namespace() {
        for kind in [
            RunnerEvent::Runner,
            RunnerEvent::AgentSession,
            RunnerEvent::OverloadContinuation,
            RunnerEvent::AgentSessionReset,
            RunnerEvent::SpawnFailed,
            RunnerEvent::Harvest,
            RunnerEvent::Setup,
            RunnerEvent::SetupOutput,
            RunnerEvent::AgentState,
        ] {
            assert!(is_reserved(kind.kind()), "{kind:?}");
        }
    }
}
