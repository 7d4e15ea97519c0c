//! A one-line status on a terminal for long steps (the clone, waiting for a
//! turn, a turn running), with the elapsed time, redrawn every second on
//! stderr. Off when stderr is not a terminal or logs are JSON: a log
//! pipeline wants lines, not carriage returns. Log lines clear it first and
//! it is redrawn at the next tick.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Line {
    text: String,
    since: Instant,
    drawn: bool,
}

static LINE: Mutex<Option<Line>> = Mutex::new(None);
static ENABLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Enables the line when stderr is a terminal and `text_logs` is true, and
/// starts the redraw ticker. Call once, inside the runtime.
pub fn enable(text_logs: bool) {
    if !(text_logs && std::io::stderr().is_terminal()) {
        return;
    }
    ENABLED.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::spawn(async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            draw();
        }
    });
}

fn enabled() -> bool {
    ENABLED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Shows `text` (with the time since now) until the next call or `clear`.
pub fn set(text: impl Into<String>) {
    if !enabled() {
        return;
    }
    if let Ok(mut line) = LINE.lock() {
        *line = Some(Line {
            text: text.into(),
            since: Instant::now(),
            drawn: false,
        });
    }
    draw();
}

/// Removes the line (at exit).
pub fn clear() {
    if !enabled() {
        return;
    }
    erase();
    if let Ok(mut line) = LINE.lock() {
        *line = None;
    }
}

/// Erases a drawn line so that a log line starts at column 0.
pub fn erase() {
    if !enabled() {
        return;
    }
    if let Ok(mut line) = LINE.lock()
        && let Some(l) = line.as_mut()
        && l.drawn
    {
        l.drawn = false;
        let _ = std::io::stderr().lock().write_all(b"\r\x1b[2K");
    }
}

fn draw() {
    if let Ok(mut line) = LINE.lock()
        && let Some(l) = line.as_mut()
    {
        let text = render(&l.text, l.since.elapsed());
        let _ = std::io::stderr()
            .lock()
            .write_all(format!("\r\x1b[2K{text}").as_bytes());
        l.drawn = true;
    }
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
}
