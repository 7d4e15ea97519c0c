//! Line framing of an agent's output on bytes, with a cap: an over-long line
//! is cut into pieces (the later ones flagged `continued`) and non-UTF-8
//! bytes pass through, so reading never stops early and the agent is never
//! left blocked on a full pipe.

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// Longest line handed on in one piece (1 MiB).
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// One framed line: its bytes without the newline, and whether it continues
/// a line that was cut at the cap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// The bytes, without `\n` (and without a trailing `\r`).
    pub bytes: Vec<u8>,
    /// `true` for the second and later pieces of an over-long line.
    pub continued: bool,
}

impl Line {
    /// The text, decoded lossily.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Reads `reader` to EOF (or error), calling `on_line` for each line of at
/// most `max` bytes. A last line without a newline is handed on too.
pub async fn read_lines<R, F>(reader: R, max: usize, mut on_line: F)
where
    R: AsyncRead + Unpin,
    F: FnMut(Line),
{
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let mut current = Vec::new();
    let mut continued = false;
    while let Ok(buf) = reader.fill_buf().await {
        if buf.is_empty() {
            break;
        }
        let (take, newline) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        let room = max.saturating_sub(current.len());
        let used = take.min(room);
        current.extend_from_slice(&buf[..used]);
        if used < take {
            // The cap is reached inside this line: hand on a piece.
            reader.consume(used);
            on_line(Line {
                bytes: std::mem::take(&mut current),
                continued,
            });
            continued = true;
            continue;
        }
        reader.consume(take + usize::from(newline));
        if newline {
            if current.last() == Some(&b'\r') {
                current.pop();
            }
            on_line(Line {
                bytes: std::mem::take(&mut current),
                continued,
            });
            continued = false;
        }
    }
    if !current.is_empty() {
        on_line(Line {
            bytes: current,
            continued,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn frame(input: &[u8], max: usize) -> Vec<Line> {
        let mut out = Vec::new();
        read_lines(input, max, |l| out.push(l)).await;
        out
    }

    #[tokio::test]
    async fn frames_lines_and_keeps_the_last_unterminated_one() {
        let lines = frame(b"a\r\nbb\n\nccc", 100).await;
        let texts: Vec<String> = lines.iter().map(Line::text).collect();
        assert_eq!(texts, vec!["a", "bb", "", "ccc"]);
    }

    #[tokio::test]
    async fn cuts_long_lines_and_goes_on() {
        let lines = frame(b"0123456789\nok\n", 4).await;
        let got: Vec<(String, bool)> = lines.iter().map(|l| (l.text(), l.continued)).collect();
        assert_eq!(
            got,
            vec![
                ("0123".into(), false),
                ("4567".into(), true),
                ("89".into(), true),
                ("ok".into(), false)
            ]
        );
    }

    #[tokio::test]
    async fn non_utf8_passes_through() {
        let lines = frame(b"\xff\xfeok\nnext\n", 100).await;
        assert_eq!(lines[0].bytes, b"\xff\xfeok");
        assert_eq!(lines[1].text(), "next");
    }
}
