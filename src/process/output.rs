//! The agent's output streams as redacted lines: each read of stdout or
//! stderr goes through the streaming redactor (so a secret split across
//! reads, or across the 1 MiB cut of a long line, is still found), then line
//! framing, and the lines go to a sink: [`ChannelSink`] hands them to the
//! adapter's task (`agent::drive`; for `command`,
//! `agent::command::lines_to_events` maps each line to an event, which is
//! redacted again by value unless the stream's redaction of it is final,
//! `Redactor::stream_output_is_final`, and appends the batch to the run's spool in one
//! write), [`LineSink`] to a callback (`hosted-boot supervise`).
//!
//! Nothing here waits for the coordinator: the reader keeps draining the
//! pipe whatever the sender is doing, so the agent is never blocked by a slow
//! or failing coordinator; the spool on disk absorbs the backlog. Memory per
//! stream is one read buffer, the redactor's carry (the longest secret form)
//! and one line of at most [`MAX_LINE_BYTES`].

use tokio::io::{AsyncRead, AsyncReadExt};

use super::lines::{Line, LineFramer, MAX_LINE_BYTES};
use super::supervisor::Stream;
use crate::redact::{Redactor, StreamRedactor};

/// Size of each read from a pipe (a Linux pipe holds 64 KiB).
pub const READ_BYTES: usize = 64 * 1024;

/// Where a pumped stream's bytes go.
pub trait OutputSink: Send + 'static {
    /// The bytes of one read.
    fn write(&mut self, bytes: &[u8]);
    /// The stream ended (EOF, an error, or the reader was cancelled). Called
    /// once; the sink hands on whatever it still holds.
    fn end(&mut self);
    /// Waits until what `write` or `end` queued has been handed on: the
    /// reader's backpressure (a sink that hands lines to a task through a
    /// bounded channel waits here; [`LineSink`] never does).
    fn ready(&mut self) -> impl std::future::Future<Output = ()> + Send {
        async {}
    }
}

/// Reads `reader` to EOF (or error), handing every read to `sink`, then
/// ends it. If the task running this is aborted (the supervisor closes
/// pipes a grandchild keeps open), the sink is dropped, and each sink's
/// drop ends it, so what it held is not lost.
pub async fn pump<R, S>(mut reader: R, mut sink: S)
where
    R: AsyncRead + Unpin,
    S: OutputSink,
{
    let mut buf = vec![0u8; READ_BYTES];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                sink.write(&buf[..n]);
                sink.ready().await;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "reading the agent's output failed; the stream is closed");
                break;
            }
        }
    }
    sink.end();
    sink.ready().await;
}

/// The part every sink shares: streaming redaction of the bytes, then line
/// framing. `write` and `end` hand each complete (redacted) line to
/// `on_line`; after `end` nothing more is accepted.
pub struct RedactedLines {
    redactor: StreamRedactor,
    framer: LineFramer,
    redacted: Vec<u8>,
    ended: bool,
}

impl RedactedLines {
    /// Lines redacted with `redactor`, cut at [`MAX_LINE_BYTES`].
    pub fn new(redactor: &Redactor) -> Self {
        RedactedLines {
            redactor: redactor.stream(),
            framer: LineFramer::new(MAX_LINE_BYTES),
            redacted: Vec::with_capacity(READ_BYTES),
            ended: false,
        }
    }

    /// The bytes of one read; complete lines go to `on_line`.
    pub fn write(&mut self, bytes: &[u8], mut on_line: impl FnMut(Line)) {
        if self.ended {
            return;
        }
        self.redactor.push(bytes, &mut self.redacted);
        self.framer.set_redacted_at(self.redactor.generation());
        self.framer.push(&self.redacted, &mut on_line);
        self.clear();
    }

    /// The end of the stream: what the redactor held back and the last,
    /// unterminated line go to `on_line`. Only the first call does anything.
    pub fn end(&mut self, mut on_line: impl FnMut(Line)) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.redactor.finish(&mut self.redacted);
        self.framer.set_redacted_at(self.redactor.generation());
        self.framer.push(&self.redacted, &mut on_line);
        self.framer.finish(&mut on_line);
        self.clear();
    }

    fn clear(&mut self) {
        self.redacted.clear();
        if self.redacted.capacity() > 4 * READ_BYTES {
            self.redacted = Vec::with_capacity(READ_BYTES);
        }
    }
}

/// One output stream of the agent handed on as redacted lines: redact the
/// bytes, frame lines, call `on_line` (for adapters that map lines
/// themselves, and for `hosted-boot supervise`).
pub struct LineSink<F: FnMut(Stream, Line) + Send + 'static> {
    stream: Stream,
    lines: RedactedLines,
    on_line: F,
}

impl<F: FnMut(Stream, Line) + Send + 'static> LineSink<F> {
    /// Lines of `stream`, redacted with `redactor`.
    pub fn new(stream: Stream, redactor: &Redactor, on_line: F) -> Self {
        LineSink {
            stream,
            lines: RedactedLines::new(redactor),
            on_line,
        }
    }
}

impl<F: FnMut(Stream, Line) + Send + 'static> OutputSink for LineSink<F> {
    fn write(&mut self, bytes: &[u8]) {
        let (stream, on_line) = (self.stream, &mut self.on_line);
        self.lines.write(bytes, |line| on_line(stream, line));
    }

    fn end(&mut self) {
        let (stream, on_line) = (self.stream, &mut self.on_line);
        self.lines.end(|line| on_line(stream, line));
    }
}

impl<F: FnMut(Stream, Line) + Send + 'static> Drop for LineSink<F> {
    fn drop(&mut self) {
        self.end();
    }
}

/// One output stream of the agent handed to a task as redacted lines over a
/// bounded channel (one message per read): the reader waits when the task
/// falls behind, so memory stays bounded whatever the agent prints (the task spools to disk, so the
/// agent still never waits for the coordinator).
pub struct ChannelSink<F: FnMut(Stream, &Line) + Send + 'static> {
    stream: Stream,
    lines: RedactedLines,
    observe: F,
    tx: tokio::sync::mpsc::Sender<(Stream, Vec<Line>)>,
    queued: Vec<Line>,
}

/// The receiving end of [`ChannelSink`]s: lines one at a time, although
/// they travel one read's worth per message (a message per line made short
/// lines cost a cross-thread wake-up each). `recv` is cancel-safe.
pub struct LineReceiver {
    rx: tokio::sync::mpsc::Receiver<(Stream, Vec<Line>)>,
    current: std::collections::VecDeque<(Stream, Line)>,
}

impl LineReceiver {
    /// Wraps the channel the sinks send on.
    pub fn new(rx: tokio::sync::mpsc::Receiver<(Stream, Vec<Line>)>) -> Self {
        LineReceiver {
            rx,
            current: std::collections::VecDeque::new(),
        }
    }

    /// The next line, or `None` once every sink is gone and all was read.
    pub async fn recv(&mut self) -> Option<(Stream, Line)> {
        loop {
            if let Some(line) = self.current.pop_front() {
                return Some(line);
            }
            let (stream, lines) = self.rx.recv().await?;
            self.current.extend(lines.into_iter().map(|l| (stream, l)));
        }
    }

    /// Puts `lines` (read from this receiver) back before everything not
    /// read yet, in their order: [`recv`](Self::recv) returns them again.
    pub fn unread(&mut self, lines: Vec<(Stream, Line)>) {
        for line in lines.into_iter().rev() {
            self.current.push_front(line);
        }
    }

    /// The next line if one is already here.
    pub fn try_recv(&mut self) -> Option<(Stream, Line)> {
        if self.current.is_empty()
            && let Ok((stream, lines)) = self.rx.try_recv()
        {
            self.current.extend(lines.into_iter().map(|l| (stream, l)));
        }
        self.current.pop_front()
    }
}

impl<F: FnMut(Stream, &Line) + Send + 'static> ChannelSink<F> {
    /// Lines of `stream`, redacted with `redactor`, each shown to `observe`
    /// (activity, a stderr tail) and then sent on `tx`.
    pub fn new(
        stream: Stream,
        redactor: &Redactor,
        observe: F,
        tx: tokio::sync::mpsc::Sender<(Stream, Vec<Line>)>,
    ) -> Self {
        ChannelSink {
            stream,
            lines: RedactedLines::new(redactor),
            observe,
            tx,
            queued: Vec::new(),
        }
    }
}

impl<F: FnMut(Stream, &Line) + Send + 'static> OutputSink for ChannelSink<F> {
    fn write(&mut self, bytes: &[u8]) {
        let queued = &mut self.queued;
        self.lines.write(bytes, |line| queued.push(line));
    }

    fn end(&mut self) {
        let queued = &mut self.queued;
        self.lines.end(|line| queued.push(line));
    }

    async fn ready(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        let lines = std::mem::take(&mut self.queued);
        for line in &lines {
            (self.observe)(self.stream, line);
        }
        let _ = self.tx.send((self.stream, lines)).await;
    }
}

impl<F: FnMut(Stream, &Line) + Send + 'static> Drop for ChannelSink<F> {
    // A reader aborted at the drain bound: hand on what fits, without waiting.
    fn drop(&mut self) {
        self.end();
        let lines = std::mem::take(&mut self.queued);
        if !lines.is_empty() {
            for line in &lines {
                (self.observe)(self.stream, line);
            }
            let _ = self.tx.try_send((self.stream, lines));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> Line {
        Line {
            bytes: text.as_bytes().to_vec(),
            continued: false,
            redacted_at: None,
        }
    }

    #[tokio::test]
    async fn lines_put_back_come_again_before_the_rest_in_their_order() {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut lines = LineReceiver::new(rx);
        tx.send((Stream::Stdout, vec![line("a"), line("b"), line("c")]))
            .await
            .unwrap();
        tx.send((Stream::Stderr, vec![line("d")])).await.unwrap();
        drop(tx);
        let read = vec![lines.recv().await.unwrap(), lines.recv().await.unwrap()];
        lines.unread(read);
        let mut seen = Vec::new();
        while let Some((stream, l)) = lines.recv().await {
            seen.push((stream, l.text()));
        }
        let expected = [
            (Stream::Stdout, "a"),
            (Stream::Stdout, "b"),
            (Stream::Stdout, "c"),
            (Stream::Stderr, "d"),
        ];
        assert_eq!(seen, expected.map(|(s, t)| (s, t.to_string())).to_vec());
    }
}
