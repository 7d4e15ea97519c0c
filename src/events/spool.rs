//! The run's event spool (PROTOCOL.md 2.6 and section 3):
//! `.orizu-run/{runId}/events.ndjson`, mode 0600, one event per line exactly
//! as it is sent (`{"seq":n,"type":…,"at":…,"data":…}`), appended before
//! anything is sent. The sender reads batches back from the file, so the
//! runner's memory does not grow with the backlog, and a runner restarted on
//! the same session continues the file where the killed one stopped.
//!
//! Each event gets the next `seq` under the writer's lock, so the file is in
//! `seq` order without gaps. A batch of events (one read of the agent's
//! output) is one `write`; the committed length is published only after it,
//! so the sender never reads half an event. A write that fails (disk full)
//! is undone (the file is cut back, the `seq`s are not used) and its events
//! are counted as dropped, which the turn reports as undelivered.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::Notify;

use super::event::{AgentEvent, RunnerEvent};
use crate::redact::Redactor;

/// The spool's file name in the run directory.
pub const SPOOL_FILE: &str = "events.ndjson";

/// Scratch buffers above this are given back after a write (one 1 MiB line
/// can make an event of several MiB; it should not stay allocated).
const KEEP_SCRATCH: usize = 256 * 1024;

/// Why the spool cannot be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} the event spool {}: {source}; check the disk and the permissions of the run directory", path.display())]
pub struct SpoolError {
    /// What was attempted.
    pub action: &'static str,
    /// The spool file.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: io::Error,
}

/// The writer side of a run's spool, shared by every producer of events.
pub struct Spool {
    path: PathBuf,
    redactor: Redactor,
    writer: Mutex<Writer>,
    /// Bytes of complete event lines in the file.
    committed: AtomicU64,
    /// Highest `seq` in the file (or the cursor the numbering continues from).
    last_seq: AtomicU64,
    /// Events that could not be written.
    dropped: AtomicU64,
    /// Wakes the sender after each append.
    pub(crate) appended: Notify,
    write_failed: AtomicBool,
}

struct Writer {
    file: File,
    len: u64,
    last_seq: u64,
    scratch: Vec<u8>,
}

/// What an existing spool held when it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Existing {
    /// Highest `seq` in the file (0 for a new or empty spool).
    pub last_seq: u64,
    /// Bytes of complete lines.
    pub len: u64,
    /// Bytes of a torn last line that were cut off (a runner killed while
    /// writing; those events were never sent).
    pub torn: u64,
}

#[derive(Serialize)]
struct EventRef<'a> {
    seq: u64,
    #[serde(rename = "type")]
    kind: &'a str,
    at: &'a str,
    data: &'a Value,
}

impl Spool {
    /// Opens (creating it 0600 if needed) the spool in `run_dir`, and finds
    /// where an existing one ends. The runner's own events are redacted with
    /// `redactor` (by value) before they are written; the agent's were
    /// redacted when they were built ([`AgentEvent`]), with the same
    /// redactor ([`Spool::redactor`]).
    ///
    /// Errors: the file cannot be created, read or cut back.
    pub fn open(run_dir: &Path, redactor: Redactor) -> Result<(Spool, Existing), SpoolError> {
        let path = run_dir.join(SPOOL_FILE);
        let err = |action, source| SpoolError {
            action,
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| err("open", e))?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| err("set mode 0600 on", e))?;
        let size = file.metadata().map_err(|e| err("read", e))?.len();
        let scan = scan(&file, size).map_err(|e| err("read", e))?;
        if scan.len < size {
            file.set_len(scan.len)
                .map_err(|e| err("cut the torn end of", e))?;
        }
        let existing = Existing {
            last_seq: scan.last_seq,
            len: scan.len,
            torn: size - scan.len,
        };
        Ok((
            Spool {
                path,
                redactor,
                writer: Mutex::new(Writer {
                    file,
                    len: scan.len,
                    last_seq: scan.last_seq,
                    scratch: Vec::new(),
                }),
                committed: AtomicU64::new(scan.len),
                last_seq: AtomicU64::new(scan.last_seq),
                dropped: AtomicU64::new(0),
                appended: Notify::new(),
                write_failed: AtomicBool::new(false),
            },
            existing,
        ))
    }

    /// The spool file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The redactor of this run's events.
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Continues the numbering after `seq` if that is above the file's last
    /// event (the coordinator accepted events this spool no longer holds: a
    /// new `seq` at or below its cursor would be ignored).
    pub fn continue_after(&self, seq: u64) {
        let mut w = crate::concurrency::lock(&self.writer);
        if seq > w.last_seq {
            w.last_seq = seq;
            self.last_seq.store(seq, Ordering::SeqCst);
        }
    }

    /// Numbers and appends the agent's `events` (drained; redacted and
    /// checked when they were built, [`AgentEvent`]) with timestamp `at`, in
    /// one write. Returns the last `seq` written, or `None` when the write
    /// failed (the events are then counted as dropped).
    pub fn append(&self, events: &mut Vec<AgentEvent>, at: &str) -> Option<u64> {
        let seq = self.write(events.iter().map(|e| (e.kind(), e.data())), at);
        events.clear();
        seq
    }

    /// Redacts `data` by value (after polling the redactor's sources),
    /// numbers it and appends it as one of the runner's own events, with
    /// timestamp `at`. Returns the `seq`, or `None` as [`Spool::append`].
    pub fn append_runner(&self, kind: RunnerEvent, mut data: Value, at: &str) -> Option<u64> {
        self.redactor.refresh();
        self.redactor.redact_value(&mut data);
        self.write(std::iter::once((kind.kind(), &data)), at)
    }

    fn write<'a>(
        &self,
        events: impl ExactSizeIterator<Item = (&'a str, &'a Value)>,
        at: &str,
    ) -> Option<u64> {
        let count = events.len() as u64;
        if count == 0 {
            return Some(self.last_seq.load(Ordering::SeqCst));
        }
        let mut w = crate::concurrency::lock(&self.writer);
        let Writer {
            file,
            len,
            last_seq,
            scratch,
        } = &mut *w;
        scratch.clear();
        let mut seq = *last_seq;
        let mut last: Option<(&str, Option<&str>)> = None;
        for (kind, data) in events {
            seq += 1;
            // Redacted already: what the status line may show.
            last = Some((kind, data["text"].as_str().or(last.and_then(|l| l.1))));
            let event = EventRef {
                seq,
                kind,
                at,
                data,
            };
            // Serializing a `Value` into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *scratch, &event);
            scratch.push(b'\n');
        }
        let result = file.write_all(scratch);
        let written = scratch.len() as u64;
        if scratch.capacity() > KEEP_SCRATCH {
            *scratch = Vec::new();
        }
        match result {
            Ok(()) => {
                *len += written;
                *last_seq = seq;
                self.committed.store(*len, Ordering::SeqCst);
                self.last_seq.store(seq, Ordering::SeqCst);
                drop(w);
                self.appended.notify_one();
                if let Some((kind, line)) = last {
                    crate::status::event(kind, line);
                }
                Some(seq)
            }
            Err(e) => {
                // Undo a partial write so the file stays whole lines in order.
                let _ = file.set_len(*len);
                drop(w);
                self.dropped.fetch_add(count, Ordering::SeqCst);
                if !self.write_failed.swap(true, Ordering::SeqCst) {
                    tracing::error!(path = %self.path.display(), error = %e, events = count, "cannot append to the event spool; these events are dropped and reported as undelivered");
                }
                None
            }
        }
    }

    /// `(committed bytes, last seq)`: what the sender may read. The length
    /// is read after the `seq`, so it covers at least that event.
    pub fn committed(&self) -> (u64, u64) {
        let seq = self.last_seq.load(Ordering::SeqCst);
        (self.committed.load(Ordering::SeqCst), seq)
    }

    /// Events that could not be written.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }

    /// A reader of the file for the sender.
    ///
    /// Errors: the file cannot be opened.
    pub fn reader(&self) -> io::Result<SpoolReader> {
        Ok(SpoolReader {
            file: File::open(&self.path)?,
        })
    }
}

struct Scan {
    len: u64,
    last_seq: u64,
}

/// Finds the end of the last complete line and its `seq`.
fn scan(file: &File, size: u64) -> io::Result<Scan> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut pos = 0u64;
    let mut line_start = 0u64;
    let mut head: Vec<u8> = Vec::new();
    let mut last = Scan {
        len: 0,
        last_seq: 0,
    };
    while pos < size {
        let n = file.read_at(&mut buf, pos)?;
        if n == 0 {
            break;
        }
        for (i, &b) in buf[..n].iter().enumerate() {
            let at = pos + i as u64;
            if at == line_start {
                head.clear();
            }
            if head.len() < 32 && b != b'\n' {
                head.push(b);
            }
            if b == b'\n' {
                if let Some(seq) = seq_of(&head) {
                    last.last_seq = seq;
                }
                last.len = at + 1;
                line_start = at + 1;
                head.clear();
            }
        }
        pos += n as u64;
    }
    Ok(last)
}

/// The `seq` of a spool line, from its start (`{"seq":123,`).
pub(crate) fn seq_of(line: &[u8]) -> Option<u64> {
    let rest = line.strip_prefix(b"{\"seq\":")?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

/// Reads batches of events back from the spool.
pub struct SpoolReader {
    file: File,
}

/// Events read for one request.
#[derive(Debug, Default)]
pub struct Batch {
    /// The request body, `{"events":[…]}`.
    pub body: Vec<u8>,
    /// `(seq, offset just after its line)` of each event, in order.
    pub events: Vec<(u64, u64)>,
}

impl Batch {
    /// The `seq` of the last event (0 when empty).
    pub fn last_seq(&self) -> u64 {
        self.events.last().map_or(0, |e| e.0)
    }
}

impl SpoolReader {
    /// Reads the events in `[pos, end)` with `seq` above `after`, at most
    /// `max_events` of them and `max_bytes` of event JSON (but always the
    /// first one, whatever its size).
    ///
    /// Errors: a read error.
    pub fn read_batch(
        &self,
        pos: u64,
        end: u64,
        after: u64,
        max_events: usize,
        max_bytes: usize,
    ) -> io::Result<Batch> {
        let mut batch = Batch {
            body: b"{\"events\":[".to_vec(),
            events: Vec::new(),
        };
        let mut line: Vec<u8> = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut at = pos;
        let mut json_bytes = 0usize;
        'read: while at < end && batch.events.len() < max_events {
            let want = usize::try_from(end - at)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let n = self.file.read_at(&mut buf[..want], at)?;
            if n == 0 {
                break;
            }
            let mut consumed = 0;
            for chunk in buf[..n].split_inclusive(|&b| b == b'\n') {
                consumed += chunk.len();
                if chunk.last() != Some(&b'\n') {
                    line.extend_from_slice(chunk);
                    continue;
                }
                line.extend_from_slice(&chunk[..chunk.len() - 1]);
                let line_end = at + consumed as u64;
                let Some(seq) = seq_of(&line) else {
                    line.clear();
                    continue;
                };
                if seq > after {
                    if !batch.events.is_empty() && json_bytes + line.len() + 1 > max_bytes {
                        break 'read;
                    }
                    if !batch.events.is_empty() {
                        batch.body.push(b',');
                    }
                    json_bytes += line.len() + 1;
                    batch.body.extend_from_slice(&line);
                    batch.events.push((seq, line_end));
                    if batch.events.len() >= max_events {
                        break 'read;
                    }
                }
                line.clear();
            }
            at += n as u64;
        }
        batch.body.extend_from_slice(b"]}");
        Ok(batch)
    }

    /// The offset just after the line of event `seq` (or after the last line
    /// whose `seq` is below it), scanning `[0, end)`: where to resume once
    /// the coordinator has accepted through `seq`.
    ///
    /// Errors: a read error.
    pub fn offset_after(&self, seq: u64, end: u64) -> io::Result<u64> {
        let mut buf = vec![0u8; 64 * 1024];
        let mut at = 0u64;
        let mut line_start = 0u64;
        let mut head: Vec<u8> = Vec::new();
        let mut found = 0u64;
        while at < end {
            let want = usize::try_from(end - at)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let n = self.file.read_at(&mut buf[..want], at)?;
            if n == 0 {
                break;
            }
            for (i, &b) in buf[..n].iter().enumerate() {
                let here = at + i as u64;
                if here == line_start {
                    head.clear();
                }
                if b == b'\n' {
                    match seq_of(&head) {
                        Some(s) if s <= seq => found = here + 1,
                        Some(_) => return Ok(found),
                        None => {}
                    }
                    line_start = here + 1;
                } else if head.len() < 32 {
                    head.push(b);
                }
            }
            at += n as u64;
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::event::TextStream;
    use serde_json::json;

    fn events(n: usize, text: &str) -> Vec<AgentEvent> {
        let r = Redactor::new();
        (0..n)
            .map(|i| AgentEvent::text(&r, TextStream::Stdout, format!("{text} {i}"), false))
            .collect()
    }

    #[test]
    fn appends_numbered_lines_0600_and_reads_batches_back() {
        let dir = tempfile::tempdir().unwrap();
        let (spool, existing) = Spool::open(dir.path(), Redactor::new()).unwrap();
        assert_eq!(existing, Existing::default());
        assert_eq!(spool.append(&mut events(3, "a"), "t0"), Some(3));
        assert_eq!(spool.append(&mut events(2, "b"), "t1"), Some(5));
        let mode = std::fs::metadata(spool.path())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(spool.path()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(
            lines[3],
            json!({"seq": 4, "type": "output", "at": "t1", "data": {"text": "b 0"}})
        );
        let (end, last) = spool.committed();
        assert_eq!((end, last), (text.len() as u64, 5));

        let reader = spool.reader().unwrap();
        let batch = reader.read_batch(0, end, 0, 2, 1 << 20).unwrap();
        assert_eq!(
            batch.events.iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![1, 2]
        );
        let body: Value = serde_json::from_slice(&batch.body).unwrap();
        assert_eq!(body["events"][1]["seq"], 2);
        let next = reader
            .read_batch(batch.events[1].1, end, 2, 500, 1 << 20)
            .unwrap();
        assert_eq!(
            next.events.iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![3, 4, 5]
        );
        assert_eq!(next.events[2].1, end);
        // Byte cap: always the first event, then only what fits.
        let small = reader.read_batch(0, end, 0, 500, 10).unwrap();
        assert_eq!(small.events.len(), 1);
        // Skips what was accepted even when read from an earlier offset.
        let skip = reader.read_batch(0, end, 3, 500, 1 << 20).unwrap();
        assert_eq!(
            skip.events.iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![4, 5]
        );
        assert_eq!(
            reader.offset_after(3, end).unwrap(),
            batch.events[1].1 + {
                let l = text.lines().nth(2).unwrap().len() as u64;
                l + 1
            }
        );
        assert_eq!(reader.offset_after(0, end).unwrap(), 0);
        assert_eq!(reader.offset_after(99, end).unwrap(), end);
    }

    #[test]
    fn reopening_continues_the_numbering_and_cuts_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (spool, _) = Spool::open(dir.path(), Redactor::new()).unwrap();
            spool.append(&mut events(4, "a"), "t0");
        }
        let path = dir.path().join(SPOOL_FILE);
        let whole = std::fs::metadata(&path).unwrap().len();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        let torn = b"{\"seq\":5,\"type\":\"out";
        f.write_all(torn).unwrap();
        drop(f);
        let (spool, existing) = Spool::open(dir.path(), Redactor::new()).unwrap();
        assert_eq!(existing.last_seq, 4);
        assert_eq!(existing.len, whole);
        assert_eq!(existing.torn, torn.len() as u64);
        assert_eq!(spool.append(&mut events(1, "b"), "t1"), Some(5));
        spool.continue_after(9);
        assert_eq!(spool.append(&mut events(1, "c"), "t2"), Some(10));
        let seqs: Vec<u64> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| seq_of(l.as_bytes()).unwrap())
            .collect();
        assert_eq!(seqs, vec![1, 2, 3, 4, 5, 10]);
    }

    #[test]
    fn the_runners_events_are_redacted_before_they_reach_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let redactor = Redactor::new();
        redactor.add(
            &crate::secret::Secret::new("hunter2-secret".into()),
            crate::redact::SecretKind::Credential,
        );
        let (spool, _) = Spool::open(dir.path(), redactor).unwrap();
        spool.append_runner(
            RunnerEvent::Harvest,
            json!({"text": "pw hunter2-secret"}),
            "t",
        );
        let text = std::fs::read_to_string(spool.path()).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains(r#""type":"hosted_boot.harvest""#));
        assert!(text.contains("pw [REDACTED]"));
    }
}
