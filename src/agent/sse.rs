//! A server-sent events parser (the `opencode serve` event stream): bytes
//! in, the `data` of each complete event out. Comments, `event:`, `id:` and
//! `retry:` fields are ignored; multi-line data is joined with `\n`.

/// Incremental parser; feed it chunks as they arrive.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    data: Option<String>,
}

/// Longest line kept (16 MiB); a longer one is dropped, not buffered.
const MAX_LINE: usize = 16 * 1024 * 1024;

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds `chunk`; returns the data of every event it completed.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in chunk {
            if b == b'\n' {
                let mut line = std::mem::take(&mut self.line);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                self.line_done(&line, &mut out);
            } else if self.line.len() < MAX_LINE {
                self.line.push(b);
            }
        }
        out
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<String>) {
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                out.push(data);
            }
            return;
        }
        if line.starts_with(b":") {
            return;
        }
        let text = String::from_utf8_lossy(line);
        let (field, value) = match text.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (text.as_ref(), ""),
        };
        if field == "data" {
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks() {
        let mut p = SseParser::new();
        assert!(p.push(b": hi\ndata: {\"a\"").is_empty());
        assert_eq!(
            p.push(b":1}\r\n\r\nevent: x\ndata: b\ndata: c\n\n"),
            vec!["{\"a\":1}".to_string(), "b\nc".to_string()]
        );
        assert!(p.push(b"data: partial\n").is_empty());
    }
}
