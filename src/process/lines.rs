//! Line framing of an agent's output on bytes, with a cap: an over-long line
//! is cut into pieces (the later ones flagged `continued`) and non-UTF-8
//! bytes pass through, so reading never stops early and the agent is never
//! left blocked on a full pipe. The framer is fed whatever each read
//! returned (already redacted, see `turn::output`).

/// Longest line handed on in one piece (1 MiB).
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// One framed line: its bytes without the newline, whether it continues
/// a line that was cut at the cap, and the redactor generation its bytes
/// were stream-redacted at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// The bytes, without `\n` (and without a trailing `\r`).
    pub bytes: Vec<u8>,
    /// `true` for the second and later pieces of an over-long line.
    pub continued: bool,
    /// The generation of the redactor ([`crate::redact::StreamRedactor::generation`])
    /// at which the stream decided this line's first byte, so every byte
    /// of it at that generation or a later one; `None` when the framer was
    /// not told (the line is then redacted by value as any other).
    pub redacted_at: Option<u64>,
}

impl Line {
    /// The text, decoded lossily.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Splits a byte stream into [`Line`]s of at most `max` bytes.
#[derive(Debug)]
pub struct LineFramer {
    max: usize,
    current: Vec<u8>,
    continued: bool,
    /// What the next [`LineFramer::push`]'s bytes were redacted at.
    redacted_at: Option<u64>,
    /// What the current line's first byte was redacted at.
    started_at: Option<u64>,
}

impl LineFramer {
    /// A framer cutting lines at `max` bytes (at least 4, so that a cut can
    /// always keep a UTF-8 character whole).
    pub fn new(max: usize) -> Self {
        LineFramer {
            max: max.max(4),
            current: Vec::new(),
            continued: false,
            redacted_at: None,
            started_at: None,
        }
    }

    /// The redactor generation the bytes of the next pushes were stream-
    /// redacted at (see [`Line::redacted_at`]): a line takes the one of
    /// the push that brought its first byte, the oldest of its bytes'.
    pub fn set_redacted_at(&mut self, generation: u64) {
        self.redacted_at = Some(generation);
    }

    /// Frames the next bytes of the stream, handing each complete line (or
    /// piece of an over-long one) to `on_line`.
    pub fn push(&mut self, mut input: &[u8], on_line: &mut impl FnMut(Line)) {
        while !input.is_empty() {
            if self.current.is_empty() && self.started_at.is_none() {
                self.started_at = self.redacted_at;
            }
            let (take, newline) = match memchr::memchr(b'\n', input) {
                Some(i) => (i, true),
                None => (input.len(), false),
            };
            let room = self.max - self.current.len();
            if take > room {
                // The cap is reached inside this line: hand on a piece,
                // cut before a UTF-8 character that would not fit whole
                // (its first bytes start the next piece).
                self.current.extend_from_slice(&input[..room]);
                input = &input[room..];
                let keep = utf8_cut(&self.current);
                let carry = self.current.split_off(keep);
                // The carry came no earlier than the piece's first byte.
                let started_at = self.started_at;
                self.emit(on_line);
                self.current = carry;
                self.started_at = started_at;
                self.continued = true;
                continue;
            }
            self.current.extend_from_slice(&input[..take]);
            if newline {
                input = &input[take + 1..];
                if self.current.last() == Some(&b'\r') {
                    self.current.pop();
                }
                self.emit(on_line);
                self.continued = false;
            } else {
                input = &input[take..];
            }
        }
    }

    /// Ends the stream: hands on a last line that had no newline.
    pub fn finish(&mut self, on_line: &mut impl FnMut(Line)) {
        if !self.current.is_empty() {
            self.emit(on_line);
        }
        self.continued = false;
        self.started_at = None;
    }

    fn emit(&mut self, on_line: &mut impl FnMut(Line)) {
        let bytes = std::mem::take(&mut self.current);
        on_line(Line {
            bytes,
            continued: self.continued,
            redacted_at: self.started_at.take(),
        });
    }
}

/// Where to cut `bytes` (which is exactly full) so that a UTF-8 character
/// that started near the end is not split: the length to keep. Only a valid
/// but incomplete sequence at the end moves the cut; other bytes are cut
/// where they are.
fn utf8_cut(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=3.min(len) {
        let b = bytes[len - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back
        }
        let need = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => return len, // ASCII or invalid: cut here
        };
        return if need > back { len - back } else { len };
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(input: &[u8], max: usize, reads: usize) -> Vec<Line> {
        let mut out = Vec::new();
        let mut f = LineFramer::new(max);
        for chunk in input.chunks(reads.max(1)) {
            f.push(chunk, &mut |l| out.push(l));
        }
        f.finish(&mut |l| out.push(l));
        out
    }

    #[test]
    fn frames_lines_and_keeps_the_last_unterminated_one() {
        for reads in [1, 2, 100] {
            let lines = frame(b"a\r\nbb\n\nccc", 100, reads);
            let texts: Vec<String> = lines.iter().map(Line::text).collect();
            assert_eq!(texts, vec!["a", "bb", "", "ccc"]);
        }
    }

    #[test]
    fn cuts_long_lines_and_goes_on() {
        for reads in [1, 3, 100] {
            let lines = frame(b"0123456789\nok\n", 4, reads);
            let got: Vec<(String, bool)> = lines.iter().map(|l| (l.text(), l.continued)).collect();
            assert_eq!(
                got,
                vec![
                    ("0123".into(), false),
                    ("4567".into(), true),
                    ("89".into(), true),
                    ("ok".into(), false)
                ],
                "reads of {reads}"
            );
        }
    }

    #[test]
    fn a_cut_keeps_utf8_characters_whole() {
        // "aé" + "€": the cap of 4 falls inside "€" (3 bytes).
        let lines = frame("aé€b\n".as_bytes(), 4, 100);
        let texts: Vec<String> = lines.iter().map(Line::text).collect();
        assert_eq!(texts, vec!["aé", "€b"]);
    }

    #[test]
    fn non_utf8_passes_through() {
        let lines = frame(b"\xff\xfeok\nnext\n", 100, 100);
        assert_eq!(lines[0].bytes, b"\xff\xfeok");
        assert_eq!(lines[1].text(), "next");
    }
}
