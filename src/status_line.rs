//! A one-line status on a terminal for long steps (the clone, waiting for a
//! turn, a turn running: its step, the events sent, the agent's last line),
//! with the elapsed time, redrawn every second on stderr. Off when stderr is
//! not a terminal or logs are JSON: a log pipeline wants lines, not carriage
//! returns.
//!
//! Every write to stderr while the line is on goes through one lock
//! ([`Screen`]): a log line is written as erase, the line, redraw, in one
//! piece, so the ticker's redraw can never land between an erase and the
//! log line it made room for (which glued the status onto the log line).

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Erase the terminal's current line and return to its first column.
const ERASE: &[u8] = b"\r\x1b[2K";

/// What the line shows.
#[derive(Clone, Debug, Default)]
struct Line {
    text: String,
    since: Option<Instant>,
    /// The turn's step (`agent`, `harvest`, `flush`).
    step: Option<&'static str>,
    /// Events of the turn the coordinator accepted.
    events_sent: u64,
    /// The agent's last output line (redacted).
    last: Option<String>,
}

/// A terminal's bottom line kept under the log: every write goes through
/// [`Screen::log`] or [`Screen::draw`], under one lock.
pub struct Screen<W: Write> {
    out: W,
    line: Option<Line>,
    drawn: bool,
    width: usize,
}

impl<W: Write> Screen<W> {
    /// A screen on `out`, `width` columns wide.
    pub fn new(out: W, width: usize) -> Self {
        Screen {
            out,
            line: None,
            drawn: false,
            width: width.max(20),
        }
    }

    /// Writes one log line (or several, whole lines) above the status line:
    /// erase, the log text, redraw, as one write.
    pub fn log(&mut self, text: &[u8]) {
        let mut buf = Vec::with_capacity(text.len() + 160);
        if self.drawn {
            buf.extend_from_slice(ERASE);
        }
        buf.extend_from_slice(text);
        self.drawn = false;
        if text.ends_with(b"\n")
            && let Some(rendered) = self.rendered()
        {
            buf.extend_from_slice(rendered.as_bytes());
            self.drawn = true;
        }
        let _ = self.out.write_all(&buf);
        let _ = self.out.flush();
    }

    /// Redraws the status line (the ticker, a change of text).
    pub fn draw(&mut self) {
        let rendered = self.rendered();
        if !self.drawn && rendered.is_none() {
            return;
        }
        let mut buf = ERASE.to_vec();
        self.drawn = rendered.is_some();
        if let Some(r) = rendered {
            buf.extend_from_slice(r.as_bytes());
        }
        let _ = self.out.write_all(&buf);
        let _ = self.out.flush();
    }

    fn rendered(&self) -> Option<String> {
        let l = self.line.as_ref()?;
        let mut text = render(&l.text, l.since.map_or(Duration::ZERO, |s| s.elapsed()));
        if let Some(step) = l.step {
            text.push_str(&format!(" · {step}"));
            text.push_str(&format!(" · {} events sent", l.events_sent));
        }
        if let Some(last) = &l.last {
            text.push_str(" · ");
            text.push_str(last);
        }
        Some(cut(&text, self.width.saturating_sub(1)))
    }

    /// The bytes written so far (tests).
    #[cfg(test)]
    pub fn into_inner(self) -> W {
        self.out
    }

    fn set(&mut self, text: String) {
        self.line = Some(Line {
            text,
            since: Some(Instant::now()),
            ..Line::default()
        });
    }
}

/// `text` cut to `width` terminal columns (an ellipsis marks the cut),
/// control characters replaced by spaces so that the line stays one line.
/// Columns, not characters: a wide character (CJK, most emoji) takes two,
/// and a line that wraps leaves a row the next erase does not clear.
pub fn cut(text: &str, width: usize) -> String {
    use unicode_width::UnicodeWidthChar;
    let clean: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let columns = |c: char| c.width().unwrap_or(0);
    if clean.chars().map(columns).sum::<usize>() <= width {
        return clean;
    }
    let room = width.saturating_sub(1);
    let mut used = 0;
    let mut out = String::new();
    for c in clean.chars() {
        used += columns(c);
        if used > room {
            break;
        }
        out.push(c);
    }
    out.push('…');
    out
}

static SCREEN: Mutex<Option<Screen<std::io::Stderr>>> = Mutex::new(None);

/// Enables the line when stderr is a terminal and `text_logs` is true, and
/// starts the redraw ticker. Call once, inside the runtime.
pub fn enable(text_logs: bool) {
    if !(text_logs && std::io::stderr().is_terminal()) {
        return;
    }
    if let Ok(mut screen) = SCREEN.lock() {
        *screen = Some(Screen::new(std::io::stderr(), terminal_width()));
    }
    tokio::spawn(async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            with(Screen::draw);
        }
    });
}

fn terminal_width() -> usize {
    // SAFETY: TIOCGWINSZ writes a `winsize` into the struct we own.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    if ok && size.ws_col > 0 {
        usize::from(size.ws_col)
    } else {
        80
    }
}

fn with(f: impl FnOnce(&mut Screen<std::io::Stderr>)) {
    if let Ok(mut screen) = SCREEN.lock()
        && let Some(s) = screen.as_mut()
    {
        f(s);
    }
}

/// Writes `text` (whole log lines) to stderr: above the status line when it
/// is on, as is otherwise. The log's writer thread writes through this.
pub fn write_log(text: &[u8]) {
    if let Ok(mut screen) = SCREEN.lock() {
        match screen.as_mut() {
            Some(s) => s.log(text),
            None => {
                drop(screen);
                let _ = std::io::stderr().lock().write_all(text);
            }
        }
    }
}

/// Stderr through [`write_log`]: the log's writer.
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        write_log(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Shows `text` (with the time since now) until the next call or `clear`.
pub fn set(text: impl Into<String>) {
    let text = text.into();
    with(|s| {
        s.set(text);
        s.draw();
    });
}

/// Shows the turn's step (`agent`, `harvest`, `flush`).
pub fn step(step: &'static str) {
    with(|s| {
        if let Some(l) = s.line.as_mut() {
            l.step = Some(step);
        }
    });
}

/// Records an event; `line` (redacted) is the agent's last line, if any.
pub fn event(line: Option<&str>) {
    if let Some(text) = line {
        with(|s| {
            if let Some(l) = s.line.as_mut() {
                l.last = Some(text.to_string());
            }
        });
    }
}

/// Records how many of the turn's events the coordinator accepted.
pub fn events_sent(n: u64) {
    with(|s| {
        if let Some(l) = s.line.as_mut() {
            l.events_sent = n;
        }
    });
}

/// Removes the line (at exit).
pub fn clear() {
    with(|s| {
        s.line = None;
        s.draw();
    });
}

/// `text (1m05s)`: the elapsed time in whole seconds.
pub fn render(text: &str, elapsed: Duration) -> String {
    let s = elapsed.as_secs();
    if s < 60 {
        format!("{text} ({s}s)")
    } else {
        format!("{text} ({}m{:02}s)", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn renders_elapsed_time() {
        assert_eq!(
            render("cloning", Duration::from_millis(3_400)),
            "cloning (3s)"
        );
        assert_eq!(
            render("turn run-2 running", Duration::from_secs(65)),
            "turn run-2 running (1m05s)"
        );
    }

    #[test]
    fn the_line_shows_step_events_and_the_agents_last_line_cut_to_the_width() {
        let mut screen = Screen::new(Vec::new(), 90);
        screen.set("turn run-1 running".into());
        if let Some(l) = screen.line.as_mut() {
            l.step = Some("agent");
            l.events_sent = 12;
            l.last = Some(format!("running test 42 {}", "x".repeat(100)));
        }
        let r = screen.rendered().unwrap();
        assert!(
            r.starts_with("turn run-1 running (0s) · agent · 12 events sent · running test 42 x"),
            "{r}"
        );
        assert_eq!(r.chars().count(), 89, "{r}");
        assert!(r.ends_with('…'));
        assert_eq!(cut("a\rb\x1b[2Kc", 80), "a b [2Kc");
    }

    /// The committed lines of a terminal that received `bytes`: `\r` goes to
    /// column 0, `ESC [2K` clears the line, `\n` ends it; what is left on the
    /// last line is returned apart.
    fn terminal(bytes: &[u8]) -> (Vec<String>, String) {
        let text = String::from_utf8_lossy(bytes);
        let mut lines = Vec::new();
        let mut cur: Vec<char> = Vec::new();
        let mut col = 0;
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\r' => col = 0,
                '\n' => {
                    lines.push(cur.iter().collect());
                    cur.clear();
                    col = 0;
                }
                '\x1b' => {
                    let seq: String = chars.by_ref().take(3).collect();
                    assert_eq!(seq, "[2K");
                    cur.clear();
                }
                c => {
                    if col < cur.len() {
                        cur[col] = c;
                    } else {
                        cur.push(c);
                    }
                    col += 1;
                }
            }
        }
        (lines, cur.iter().collect())
    }

    #[test]
    fn a_log_burst_never_glues_the_status_line_to_a_log_line() {
        let screen = Arc::new(Mutex::new(Screen::new(Vec::new(), 80)));
        screen.lock().unwrap().set("turn run-1 running".into());
        screen.lock().unwrap().draw();
        let drawer = {
            let screen = screen.clone();
            std::thread::spawn(move || {
                for i in 0..2000 {
                    let mut s = screen.lock().unwrap();
                    if i % 100 == 0
                        && let Some(l) = s.line.as_mut()
                    {
                        l.last = Some(format!("agent line {i}"));
                    }
                    s.draw();
                }
            })
        };
        let loggers: Vec<_> = (0..4)
            .map(|t| {
                let screen = screen.clone();
                std::thread::spawn(move || {
                    for i in 0..500 {
                        let line = format!("INFO hosted_boot: log {t}-{i}\n");
                        screen.lock().unwrap().log(line.as_bytes());
                    }
                })
            })
            .collect();
        for l in loggers {
            l.join().unwrap();
        }
        drawer.join().unwrap();
        let bytes = Arc::try_unwrap(screen)
            .ok()
            .unwrap()
            .into_inner()
            .unwrap()
            .into_inner();
        let (lines, last) = terminal(&bytes);
        assert_eq!(lines.len(), 2000);
        for line in &lines {
            assert!(
                line.starts_with("INFO hosted_boot: log ") && !line.contains("running"),
                "a status line glued to a log line: {line:?}"
            );
        }
        assert!(last.starts_with("turn run-1 running"), "{last:?}");
    }

    #[test]
    fn a_cut_counts_columns_so_wide_text_never_wraps() {
        use unicode_width::UnicodeWidthStr;
        let wide = "测试运行中的代理输出".repeat(8);
        let line = cut(&wide, 40);
        assert!(line.width() <= 40, "{line:?} is {} columns", line.width());
        assert!(line.ends_with('…'));
        assert_eq!(cut("short", 40), "short");
        assert_eq!(cut("ab\x1bc", 40), "ab c");
    }
}
