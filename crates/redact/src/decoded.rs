//! The decoded view of a byte stream (PROTOCOL.md section 5): the bytes as
//! a consumer reads them after undoing JSON string escapes and URL percent
//! escapes, so that a secret is found however a serializer chose to spell
//! it (`\u0061`, `\u0041` or `\u0061` in upper case, `\/`, Go's `\u0026`,
//! `%2F`, `%2f`, a surrogate pair for a character outside the BMP), without
//! one literal pattern per spelling.
//!
//! The view is defined on the whole stream, decoded left to right from its
//! first byte: at a `\` that starts a valid JSON escape (`\"` `\\` `\/` `\b`
//! `\f` `\n` `\r` `\t`, `\uXXXX` in either case, a `\uD8xx\uDCxx` surrogate
//! pair) the escape is one *unit* standing for the character it denotes; at
//! a `%` followed by two hex digits, the three bytes are one unit standing
//! for that byte; every other byte (a `\` or `%` that starts no escape
//! included) is a unit of its own. A match in the view is mapped back to
//! the original bytes of the units it covers, so what is replaced is always
//! whole escapes (a JSON string stays valid).
//!
//! Cheap where it does not matter: the view differs from the raw bytes only
//! at escapes, and a match in it can involve an escape only if the escape
//! stands for a byte that some pattern holds (`\n`, `\"`, `%20`, `\u00e9`
//! rarely do). So only around such *trigger* escapes is a window of the
//! view built (the escape plus the longest pattern on each side) and
//! searched; output without one costs a `memchr2` for `\` and `%`.
//!
//! Streaming: the redactor holds back, besides what the raw search holds, an
//! escape the end of a read cuts (`\u00`) and the decoded suffix that could
//! begin a pattern, and never resumes inside an escape; so the units of a
//! stream are the same whatever its reads, and streamed output equals
//! whole-input redaction (the property tests in `super::tests`).

use super::Matcher;

/// An escape of the view: `len` bytes from `start` standing for
/// `decoded[..dlen]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Escape {
    start: usize,
    // Small fields: a read full of `\n` holds 32 Ki of these.
    len: u8,
    dlen: u8,
    decoded: [u8; 4],
}

impl Escape {
    fn end(&self) -> usize {
        self.start + usize::from(self.len)
    }

    fn bytes(&self) -> &[u8] {
        &self.decoded[..usize::from(self.dlen)]
    }
}

enum Parsed {
    /// The byte is a unit of its own.
    Plain,
    Escape(Escape),
    /// The input ends inside what may be an escape.
    Incomplete,
}

fn hex(b: u8) -> Option<u32> {
    char::from(b).to_digit(16)
}

/// `len` hex digits at `hay[at..]` (all of them, or `Err(true)` when the
/// input ends first, `Err(false)` at a byte that is not one).
fn hex_at(hay: &[u8], at: usize, len: usize) -> Result<u32, bool> {
    let mut v = 0;
    for i in at..at + len {
        match hay.get(i) {
            None => return Err(true),
            Some(&b) => match hex(b) {
                Some(d) => v = v * 16 + d,
                None => return Err(false),
            },
        }
    }
    Ok(v)
}

fn escape(start: usize, len: u8, bytes: &[u8]) -> Parsed {
    let mut decoded = [0u8; 4];
    decoded[..bytes.len()].copy_from_slice(bytes);
    Parsed::Escape(Escape {
        start,
        len,
        dlen: bytes.len() as u8,
        decoded,
    })
}

/// What starts at `hay[i]`, a `\` or a `%`. At the end of the stream
/// (`at_end`) a cut escape is plain bytes.
fn parse(hay: &[u8], i: usize, at_end: bool) -> Parsed {
    let cut = if at_end {
        Parsed::Plain
    } else {
        Parsed::Incomplete
    };
    if hay[i] == b'%' {
        return match hex_at(hay, i + 1, 2) {
            Ok(v) => escape(i, 3, &[v as u8]),
            Err(true) => cut,
            Err(false) => Parsed::Plain,
        };
    }
    let Some(&c) = hay.get(i + 1) else {
        return cut;
    };
    let short = match c {
        b'"' => b'"',
        b'\\' => b'\\',
        b'/' => b'/',
        b'b' => 0x08,
        b'f' => 0x0c,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'u' => 0,
        _ => return Parsed::Plain,
    };
    if c != b'u' {
        return escape(i, 2, &[short]);
    }
    let unit = match hex_at(hay, i + 2, 4) {
        Ok(v) => v,
        Err(true) => return cut,
        Err(false) => return Parsed::Plain,
    };
    let code = match unit {
        0xd800..=0xdbff => {
            // A high surrogate means something only with its low half.
            match (hay.get(i + 6), hay.get(i + 7)) {
                (None, _) | (Some(b'\\'), None) => return cut,
                (Some(b'\\'), Some(b'u')) => {}
                _ => return Parsed::Plain,
            }
            match hex_at(hay, i + 8, 4) {
                Ok(low @ 0xdc00..=0xdfff) => 0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00),
                Ok(_) | Err(false) => return Parsed::Plain,
                Err(true) => return cut,
            }
        }
        0xdc00..=0xdfff => return Parsed::Plain,
        v => v,
    };
    let Some(ch) = char::from_u32(code) else {
        return Parsed::Plain;
    };
    let mut buf = [0u8; 4];
    let len = if code >= 0x10000 { 12 } else { 6 };
    escape(i, len, ch.encode_utf8(&mut buf).as_bytes())
}

/// Reusable buffers of the decoded search.
#[derive(Default)]
pub(super) struct Scratch {
    /// Every escape of the input, in order.
    pub escapes: Vec<Escape>,
    windows: Vec<(usize, usize)>,
    view: Vec<u8>,
    /// For each escape in `view`: where its bytes start in the view, and its
    /// index in `escapes`; the bytes between two are plain (one to one).
    marks: Vec<(usize, usize)>,
    found: Vec<(usize, usize)>,
}

impl Scratch {
    /// `pos` moved back to the start of the escape it falls inside, if any:
    /// a stream must resume on a unit boundary.
    pub fn unit_start(&self, pos: usize) -> usize {
        let i = self.escapes.partition_point(|e| e.start < pos);
        match i.checked_sub(1).map(|i| self.escapes[i]) {
            Some(e) if e.end() > pos => e.start,
            _ => pos,
        }
    }

    fn unit_end(&self, pos: usize) -> usize {
        let i = self.escapes.partition_point(|e| e.start < pos);
        match i.checked_sub(1).map(|i| self.escapes[i]) {
            Some(e) if e.end() > pos => e.end(),
            _ => pos,
        }
    }
}

/// Appends to `out` every match of `m` in the decoded view of `hay` that
/// involves an escape (as original byte ranges; unsorted), `hay[0]` being
/// a unit boundary. Unless `at_end`, returns the offset from which the
/// input must be held back for the view's sake: the start of an escape the
/// end of `hay` cuts, or of the decoded suffix that could begin a pattern.
/// `scratch.escapes` is left holding every escape of `hay`.
pub(super) fn matches(
    m: &Matcher,
    hay: &[u8],
    at_end: bool,
    scratch: &mut Scratch,
    out: &mut Vec<(usize, usize)>,
) -> Option<usize> {
    scratch.escapes.clear();
    scratch.windows.clear();
    let reach = m.longest.saturating_sub(1);
    // Every escape, and where the input cuts one.
    let mut cut = None;
    let mut i = 0;
    while let Some(j) = memchr::memchr2(b'\\', b'%', &hay[i..]) {
        let j = i + j;
        match parse(hay, j, at_end) {
            Parsed::Plain => i = j + 1,
            Parsed::Escape(e) => {
                i = e.end();
                if e.bytes().iter().any(|&b| m.bytes[usize::from(b)]) {
                    scratch
                        .windows
                        .push((j.saturating_sub(reach), e.end() + reach));
                }
                scratch.escapes.push(e);
            }
            Parsed::Incomplete => {
                cut = Some(j);
                break;
            }
        }
    }
    let complete = cut.unwrap_or(hay.len());
    if let Some(c) = cut {
        // What the cut escape will complete ends at `c` for now.
        scratch.windows.push((c.saturating_sub(reach), c));
    }
    if scratch.windows.is_empty() {
        return cut;
    }
    // Windows on unit boundaries, within the complete units, merged.
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(scratch.windows.len());
    for k in 0..scratch.windows.len() {
        let (s, e) = scratch.windows[k];
        let s = scratch.unit_start(s);
        let e = scratch.unit_end(e.min(complete)).min(complete);
        match merged.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => merged.push((s, e)),
        }
    }
    let mut hold = cut;
    for (ws, we) in merged {
        decode(hay, ws, we, scratch);
        super::matches_into(m, &scratch.view, &mut scratch.found);
        for &(ds, de) in &scratch.found {
            out.push((scratch.origin(ws, ds).0, scratch.origin(ws, de - 1).1));
        }
        if !at_end && we == complete {
            let pending = m.pending_prefix(&scratch.view);
            if pending > 0 {
                let from = scratch.origin(ws, scratch.view.len() - pending).0;
                hold = Some(hold.map_or(from, |h| h.min(from)));
            }
        }
    }
    hold
}

/// The view of `hay[ws..we]` (whole units) into `scratch.view`, with a mark
/// per escape (plain runs are copied whole: the view costs little more than
/// a copy).
fn decode(hay: &[u8], ws: usize, we: usize, scratch: &mut Scratch) {
    scratch.view.clear();
    scratch.marks.clear();
    let first = scratch.escapes.partition_point(|e| e.start < ws);
    let mut at = ws;
    for (k, e) in scratch.escapes[first..]
        .iter()
        .enumerate()
        .take_while(|(_, e)| e.start < we)
    {
        scratch.view.extend_from_slice(&hay[at..e.start]);
        scratch.marks.push((scratch.view.len(), first + k));
        scratch.view.extend_from_slice(e.bytes());
        at = e.end();
    }
    scratch.view.extend_from_slice(&hay[at..we]);
}

impl Scratch {
    /// The original range of the unit that byte `d` of the view (of the
    /// window starting at `ws`) comes from.
    fn origin(&self, ws: usize, d: usize) -> (usize, usize) {
        let i = self.marks.partition_point(|&(v, _)| v <= d);
        let Some(&(v, k)) = i.checked_sub(1).map(|i| &self.marks[i]) else {
            return (ws + d, ws + d + 1);
        };
        let e = self.escapes[k];
        let after = v + e.bytes().len();
        if d < after {
            (e.start, e.end())
        } else {
            let p = e.end() + (d - after);
            (p, p + 1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each escape as (start, length, what it stands for).
    type Units = Vec<(usize, usize, Vec<u8>)>;

    fn units(s: &str, at_end: bool) -> (Units, Option<usize>) {
        let hay = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while let Some(j) = memchr::memchr2(b'\\', b'%', &hay[i..]) {
            let j = i + j;
            match parse(hay, j, at_end) {
                Parsed::Plain => i = j + 1,
                Parsed::Escape(e) => {
                    out.push((e.start, e.end() - e.start, e.bytes().to_vec()));
                    i = e.end();
                }
                Parsed::Incomplete => return (out, Some(j)),
            }
        }
        (out, None)
    }

    #[test]
    fn escapes_are_read_left_to_right_as_a_json_parser_reads_them() {
        assert_eq!(units(r#"a\"b"#, true).0, vec![(1, 2, b"\"".to_vec())]);
        // `\\` is one escape, so the `u` after it is a plain letter.
        assert_eq!(units(r"\\u0041", true).0, vec![(0, 2, b"\\".to_vec())]);
        assert_eq!(
            units(r"\u00E9\u00e9\/", true).0,
            vec![
                (0, 6, "é".as_bytes().to_vec()),
                (6, 6, "é".as_bytes().to_vec()),
                (12, 2, b"/".to_vec())
            ]
        );
        assert_eq!(
            units(r"\ud83d\ude00", true).0,
            vec![(0, 12, "😀".as_bytes().to_vec())]
        );
        // A lone surrogate, an unknown escape, a bad hex digit: plain.
        assert!(units(r"\ud83dx \ude00 \x \u00g1 %2g", true).0.is_empty());
        assert_eq!(
            units("%2F%2f%%41", true).0,
            vec![
                (0, 3, b"/".to_vec()),
                (3, 3, b"/".to_vec()),
                (7, 3, b"A".to_vec())
            ]
        );
    }

    #[test]
    fn an_escape_cut_by_the_end_of_a_read_is_undecided() {
        for (s, at) in [
            ("ab\\", 2),
            ("ab\\u00", 2),
            ("ab%4", 2),
            ("ab\\ud83d", 2),
            ("ab\\ud83d\\", 2),
            ("ab\\ud83d\\ude0", 2),
        ] {
            assert_eq!(units(s, false).1, Some(at), "{s}");
            assert_eq!(units(s, true).1, None, "{s}");
        }
        assert_eq!(units("ab\\ud83d\\n", false).1, None);
    }
}
