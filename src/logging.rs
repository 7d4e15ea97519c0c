//! The runner's own log: tracing to stderr, every line passed through the
//! redactor before it is written (PROTOCOL.md section 5), so a secret that
//! reaches a log field by mistake still never reaches the output.
//!
//! Lines are handed to a writer thread (tracing-appender) instead of being
//! written by the thread that logs: a reader that stops draining stderr
//! (a stalled log pipeline, a test that reads at the end) must not freeze
//! the runtime's workers, and with them the interrupt watch and the turn.
//! The buffer holds 4,096 lines (its slots are written when it is made, so
//! it is kept small: about a hundred turns of the runner's own lines);
//! beyond that logging waits rather than dropping lines.

use std::io::{self, IsTerminal, Write};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

use crate::redact::Redactor;

/// The log filter's variable (tracing's filter syntax, default `info`).
pub const LOG_FILTER_VAR: &str = "HOSTED_BOOT_LOG";

/// The target of a turn's summary line: on a terminal its sentence alone is
/// printed (its fields say the same again); JSON lines carry both.
pub const TURN_SUMMARY_TARGET: &str = "hosted_boot::turn_summary";

/// Flushes the log's writer thread when dropped: keep it until exit.
pub type LogGuard = Option<tracing_appender::non_blocking::WorkerGuard>;

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Whether `NO_COLOR` is set to a non-empty value (no-color.org).
pub fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

/// Log lines queued for stderr before a logging call waits for the writer
/// thread.
const LOG_QUEUE_LINES: usize = 4096;

/// Installs the global subscriber: the log (filtered by
/// [`LOG_FILTER_VAR`]) and, when traces are on, the exporter of spans
/// (`telemetry`: the runner's spans at `info` and above, whatever the log's
/// filter). `format` defaults to text on a terminal and JSON otherwise.
/// Calling it twice is harmless (the second is ignored and returns no
/// guard).
#[must_use = "the guard flushes the log at exit"]
pub fn init(
    format: Option<LogFormat>,
    redactor: Redactor,
    telemetry: Option<&crate::telemetry::Telemetry>,
) -> LogGuard {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = match std::env::var(LOG_FILTER_VAR) {
        Err(_) => EnvFilter::new("info"),
        Ok(text) => EnvFilter::try_new(&text).unwrap_or_else(|e| {
            eprintln!("hosted-boot: {LOG_FILTER_VAR} is not a valid filter ({e}); using `info`");
            EnvFilter::new("info")
        }),
    };
    let format = format.unwrap_or(if io::stderr().is_terminal() {
        LogFormat::Text
    } else {
        LogFormat::Json
    });
    // The queue's every slot is written when it is made (crossbeam's
    // bounded channel, 32 bytes a line): 16,384 lines were 512 KiB of the
    // runner's resident memory and 128 of its ~650 page faults before the
    // first request (BENCHMARKS.md, "Start-up"); 4,096 are 128 KiB. The
    // runner logs a few dozen lines a turn; a full queue waits for stderr
    // (`lossy(false)`), it drops none.
    let (stderr, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .finish(crate::status_line::LogWriter);
    let writer = RedactingMakeWriter { redactor, stderr };
    let log = tracing_subscriber::fmt::layer().with_writer(writer);
    let log = match format {
        // Colour only on a terminal, and never with `NO_COLOR` set
        // (no-color.org), as the demo's own output.
        LogFormat::Text => {
            let ansi = io::stderr().is_terminal() && !no_color();
            log.with_ansi(ansi)
                .event_format(PeopleFormat { ansi })
                .with_filter(filter)
                .boxed()
        }
        // The spans (boot: session id; turn: run id, ordinal; step) ride on
        // every line, so a log pipeline can index them.
        LogFormat::Json => log
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .with_filter(filter)
            .boxed(),
    };
    let spans = telemetry.and_then(|t| t.layer()).map(|layer| {
        layer.with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(env!("CARGO_CRATE_NAME"), tracing::Level::INFO),
        )
    });
    let installed = tracing_subscriber::registry()
        .with(log)
        .with(spans)
        .try_init();
    installed.ok().map(|()| guard)
}

/// Lines for people (issue 45): `17:18:13.042  message key=value …`, the time
/// of day in UTC, a level word only for what is not `info`, no target and
/// no spans (the JSON lines carry those for a log pipeline; on a terminal
/// they made every line's first 100 columns the same).
struct PeopleFormat {
    ansi: bool,
}

impl<S, N> FormatEvent<S, N> for PeopleFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let (time, level) = people_prefix(std::time::SystemTime::now(), *event.metadata().level());
        if self.ansi {
            let colour = match *event.metadata().level() {
                Level::ERROR => "31",
                Level::WARN => "33",
                _ => "2",
            };
            write!(writer, "\x1b[2m{time}\x1b[0m  \x1b[{colour}m{level}\x1b[0m")?;
        } else {
            write!(writer, "{time}  {level}")?;
        }
        let mut fields = PeopleFields {
            line: String::new(),
            message_only: event.metadata().target() == TURN_SUMMARY_TARGET,
        };
        event.record(&mut fields);
        writeln!(writer, "{}", fields.line)
    }
}

/// An event's message, then its fields as `key=value`, every control
/// character escaped (`text::printable`): values come from the agent (its
/// session id, its result text), the repository (file and ref names) and
/// the coordinator, and on a terminal an ESC among them would move the
/// cursor, retitle the window or forge a line. Strings are quoted as Rust
/// writes them (which escapes them too). A turn's summary is its message
/// alone.
struct PeopleFields {
    line: String,
    message_only: bool,
}

impl PeopleFields {
    fn push(&mut self, name: &str, value: &str) {
        if name == "message" {
            let fields = std::mem::take(&mut self.line);
            self.line = crate::text::printable(value).into_owned();
            if !fields.is_empty() {
                self.line.push(' ');
                self.line.push_str(&fields);
            }
        } else if !self.message_only {
            if !self.line.is_empty() {
                self.line.push(' ');
            }
            self.line.push_str(name);
            self.line.push('=');
            self.line.push_str(&crate::text::printable(value));
        }
    }
}

impl tracing::field::Visit for PeopleFields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.push("message", value);
        } else {
            self.push(field.name(), &format!("{value:?}"));
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.push(field.name(), &format!("{value:?}"));
    }
}

/// A line's time of day (UTC, `HH:MM:SS.mmm`: the demo reads how long an
/// interrupt took from it) and its level word (`warning: `, `error: `,
/// nothing for `info`).
fn people_prefix(now: std::time::SystemTime, level: Level) -> (String, &'static str) {
    let ms = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
        % 86_400_000;
    let secs = ms / 1000;
    let time = format!(
        "{:02}:{:02}:{:02}.{:03}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        ms % 1000
    );
    let word = match level {
        Level::ERROR => "error: ",
        Level::WARN => "warning: ",
        Level::INFO => "",
        Level::DEBUG => "debug: ",
        Level::TRACE => "trace: ",
    };
    (time, word)
}

/// Gives each log event a buffer that is redacted and written to stderr in
/// one `write` when the event is complete.
#[derive(Clone)]
pub struct RedactingMakeWriter {
    redactor: Redactor,
    stderr: tracing_appender::non_blocking::NonBlocking,
}

impl<'a> MakeWriter<'a> for RedactingMakeWriter {
    type Writer = RedactingWriter;

    fn make_writer(&'a self) -> Self::Writer {
        RedactingWriter {
            redactor: self.redactor.clone(),
            stderr: self.stderr.clone(),
            buffer: Vec::new(),
        }
    }
}

/// One log event's buffer; flushed (redacted) on drop.
pub struct RedactingWriter {
    redactor: Redactor,
    stderr: tracing_appender::non_blocking::NonBlocking,
    buffer: Vec<u8>,
}

impl Write for RedactingWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for RedactingWriter {
    fn drop(&mut self) {
        if self.buffer.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.buffer);
        let redacted = self.redactor.redact(&text);
        // The writer thread writes it through the status line's lock
        // (crate::status_line::LogWriter), never glued to the line.
        let _ = self.stderr.write_all(redacted.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// The lines `PeopleFormat` writes for what `log` logs.
    fn people_lines(log: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl Write for Buffer {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                crate::concurrency::lock(&self.0).extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let out = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .event_format(PeopleFormat { ansi: false })
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let bytes = crate::concurrency::lock(&buffer.0).clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_line_for_people_is_the_time_the_message_and_its_fields_escaped() {
        let id = "s\x1b]0;TITLE\x07\x1b[41mRED\rFAKE";
        let text = people_lines(|| {
            tracing::info!(agent_session_id = %id, count = 3, "agent session");
            tracing::warn!(path = %"a\x1b[2Jb", "harvest: {}", "x\x1b[Hy");
            tracing::info!(target: TURN_SUMMARY_TARGET, run_id = "r", "turn 1 (r) succeeded\x1b[2J");
        });
        assert!(
            !text.contains('\x1b') && !text.contains('\x07') && !text.contains('\r'),
            "{text:?}"
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text:?}");
        for line in &lines {
            assert_eq!(
                (&line[2..3], &line[5..6], &line[8..9]),
                (":", ":", "."),
                "{line:?}"
            );
            assert_eq!(&line[12..14], "  ", "{line:?}");
        }
        let lines: Vec<&str> = lines.iter().map(|l| &l[4..]).collect();
        assert_eq!(
            &lines[0][10..],
            "agent session agent_session_id=s\\u{1b}]0;TITLE\\u{7}\\u{1b}[41mRED\\u{d}FAKE count=3"
        );
        assert_eq!(
            &lines[1][10..],
            "warning: harvest: x\\u{1b}[Hy path=a\\u{1b}[2Jb"
        );
        assert_eq!(&lines[2][10..], "turn 1 (r) succeeded\\u{1b}[2J");
    }
}
