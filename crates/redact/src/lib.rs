//! The redactor: every secret value the runner knows, replaced by
//! `[REDACTED]` in everything it sends, spools or logs (PROTOCOL.md
//! section 5).
//!
//! One [`Redactor`] is shared (cheap clones) by the event pipeline, the
//! logger and every error path; bearers and repo tokens are added as they are
//! minted, and [`Redactor::add_source`] lets a value minted in another
//! process (the credential helper's repo tokens) be picked up before the next
//! redaction rather than on a timer.
//!
//! What is replaced: the union of every occurrence of every pattern (an
//! overlapping aho-corasick search), each maximal run of overlapping or
//! touching occurrences becoming one `[REDACTED]`. So neither a secret that
//! contains another nor two overlapping secrets leak a tail, which a
//! leftmost-first or leftmost-longest scan would (`abcdef` and `defghi` in
//! `abcdefghi`: leftmost-longest replaces `abcdef` and leaves `ghi`).
//! aho-corasick's own stream API only does standard non-overlapping matching,
//! so the streaming carry ([`StreamRedactor`]) is ours; the property test in
//! this module holds it equal to redacting the whole input at once.
//!
//! Each value is matched in several forms: raw; JSON-escaped (as serde_json
//! and JavaScript write it, and with `\uXXXX` for non-ASCII as Python's
//! `json.dumps` does); form-encoded when it holds a space (`+`); base64 of
//! `x-access-token:<value>` (git's Basic auth); and the part of base64 that
//! depends only on the value at each of the three byte alignments, which
//! covers Basic auth with any user name and a value base64-encoded inside a
//! larger blob. Besides, every input is searched in its decoded view
//! ([`decoded`]): JSON and percent escapes undone, so any other spelling of
//! a value with escapes (`\/`, `\u0026`, upper-case hex, `%2F`) is found
//! too, in any output, and the literal forms above need not list them.

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use base64::Engine;
use serde_json::Value;

use hosted_boot_wire::secret::Secret;

mod decoded;
mod matcher;

use matcher::{Matcher, Pattern, matches_into};

/// The replacement text.
pub const REDACTED: &str = "[REDACTED]";

/// `[REDACTED]`s written by every redactor of the process: the runner's
/// metric of redactions applied (issue 40).
static APPLIED: AtomicU64 = AtomicU64::new(0);

/// How many `[REDACTED]`s this process has written so far.
pub fn applied() -> u64 {
    APPLIED.load(Ordering::Relaxed)
}

fn mask(out: &mut Vec<u8>) {
    APPLIED.fetch_add(1, Ordering::Relaxed);
    out.extend_from_slice(REDACTED.as_bytes());
}

/// Connector and `redactVars` values shorter than this (bytes) are not
/// redacted: they would shred ordinary text (PROTOCOL.md section 5). Also the
/// shortest base64 fragment matched.
pub const MIN_REDACTED_LEN: usize = 6;

/// Bytes [`Redactor::contains_read`] reads at a time.
pub const SCAN_READ: usize = 1 << 20;

/// How a value entered the redactor, which decides the length floor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretKind {
    /// Boot secret, bearers, repo tokens: always redacted.
    Credential,
    /// Connector and `redactVars` values: redacted from 6 bytes on.
    Configured,
}

/// A source of secrets minted outside the runner's own calls, polled by
/// [`Redactor::refresh`]: returns the values it has learnt since the last
/// poll, often none (polling must be cheap, a `stat` at most, since it runs
/// before every redaction).
pub type SecretSource = Box<dyn FnMut() -> Vec<Secret> + Send>;

/// Shared, growable set of secret values.
#[derive(Clone, Default)]
pub struct Redactor {
    shared: Arc<Shared>,
}

/// Shows how many patterns the redactor holds, never one of them.
impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = hosted_boot_wire::locks::read(&self.shared.state);
        f.debug_struct("Redactor")
            .field("patterns", &state.known.len())
            .field("compiled", &state.compiled)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Shared {
    state: RwLock<State>,
    /// Bumped each time the matcher changes; lets a [`StreamRedactor`] keep
    /// its copy without taking the lock on every read.
    generation: AtomicU64,
    /// Whether some pattern could be spelled partly by a `[REDACTED]`
    /// ([`overlaps_marker`], see [`Redactor::stream_output_is_final`]);
    /// only ever set.
    marker_spellable: std::sync::atomic::AtomicBool,
    sources: Mutex<Vec<SecretSource>>,
}

#[derive(Default)]
struct State {
    /// Every pattern held (each is in one level of the matcher).
    known: HashSet<Pattern>,
    matcher: Option<Arc<Matcher>>,
    /// Patterns compiled into automata since the redactor was made (the
    /// cost of the additions; the tests bound it).
    compiled: usize,
}

/// A generation no redactor of this process had: a line (the runner's
/// `process::lines::Line`) stamped by one redactor's stream never passes
/// another's [`Redactor::stream_output_is_final`].
fn next_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::SeqCst)
}

/// Whether `pattern` could be spelled partly by a `[REDACTED]` the stream
/// wrote: it holds a `[` or a `]` (a prefix or suffix of the marker), or
/// is a piece of the marker. Then only the pass by value finds it.
fn overlaps_marker(pattern: &[u8]) -> bool {
    pattern.iter().any(|&b| b == b'[' || b == b']')
        || REDACTED
            .as_bytes()
            .windows(pattern.len().max(1))
            .any(|w| w == pattern)
}

impl Shared {
    /// Called before the write lock is taken to add secrets: a line stamped
    /// with the generation before is no longer final
    /// ([`Redactor::stream_output_is_final`]) from here on, so its pass by
    /// value waits on the lock for the new set, as it did before the pass
    /// could be skipped (a break-it review's race).
    fn adding(&self) {
        self.generation.store(next_generation(), Ordering::SeqCst);
    }
}

/// A failed build of the redaction automaton, logged by [`Trouble::log`]
/// once the redactor's lock is released.
enum Trouble {
    /// The new patterns could not be compiled (forgotten; a later addition
    /// tries again).
    Build {
        error: aho_corasick::BuildError,
        patterns: usize,
        what: &'static str,
    },
    /// Two levels could not be merged.
    Merge(matcher::MergeFailure),
}

impl Trouble {
    fn log(self) {
        match self {
            Trouble::Build {
                error,
                patterns,
                what,
            } => {
                tracing::error!(error = %error, patterns, "cannot build the redaction automaton; the newest {what} not redacted")
            }
            Trouble::Merge(m) => {
                tracing::warn!(error = %m.error, patterns = m.patterns, "cannot merge two levels of the redaction automaton; they stay apart (the same redaction, one more pass)")
            }
        }
    }
}

impl State {
    /// Adds the `forms` not yet held, as a new level of the matcher (see
    /// [`matcher`]). `what` names the values in the error.
    ///
    /// Returns what went wrong, for the caller to log after it released
    /// the lock: the log writer redacts, which takes the read lock on this
    /// same thread (a deadlock, or a panic, under the write lock).
    #[must_use = "log the trouble once the lock is released"]
    fn insert(
        &mut self,
        forms: Vec<Vec<u8>>,
        shared: &Shared,
        what: &'static str,
    ) -> Option<Trouble> {
        let generation = &shared.generation;
        let mut fresh: Vec<Pattern> = Vec::new();
        for form in forms {
            let form: Pattern = form.into();
            if !self.known.contains(&form) {
                self.known.insert(form.clone());
                fresh.push(form);
            }
        }
        if fresh.is_empty() {
            return None;
        }
        match Matcher::extended(self.matcher.as_deref(), fresh.clone()) {
            Ok((matcher, compiled, merge_failure)) => {
                if fresh.iter().any(|p| overlaps_marker(p)) {
                    shared.marker_spellable.store(true, Ordering::SeqCst);
                }
                self.matcher = Some(Arc::new(matcher));
                self.compiled += compiled;
                generation.store(next_generation(), Ordering::SeqCst);
                merge_failure.map(Trouble::Merge)
            }
            Err(error) => {
                // Only a pattern set beyond the crate's size limits gets
                // here; keep the previous matcher and say so (no value). The
                // patterns are forgotten, so a later addition tries again.
                for form in &fresh {
                    self.known.remove(form);
                }
                Some(Trouble::Build {
                    error,
                    patterns: self.known.len(),
                    what,
                })
            }
        }
    }
}

impl Matcher {
    /// Whether `hay` holds an occurrence, raw or in its decoded view.
    fn may_match(&self, hay: &[u8]) -> bool {
        if self.is_match(hay) {
            return true;
        }
        if memchr::memchr2(b'\\', b'%', hay).is_none() {
            return false;
        }
        let mut found = Vec::new();
        decoded::matches(
            self,
            hay,
            true,
            &mut decoded::Scratch::default(),
            &mut found,
        );
        !found.is_empty()
    }
}

thread_local! {
    /// Set while this thread polls the sources, so that a source that logs
    /// (the logger redacts, which refreshes) does not recurse.
    static REFRESHING: Cell<bool> = const { Cell::new(false) };
}

impl Redactor {
    /// An empty redactor.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a secret. Returns `false` (and adds nothing) for a `Configured`
    /// value shorter than [`MIN_REDACTED_LEN`] bytes or an empty value; the
    /// caller logs that such a variable exists, without its value.
    ///
    /// The value is matched in each of the forms listed in the module
    /// documentation.
    pub fn add(&self, secret: &Secret, kind: SecretKind) -> bool {
        let value = secret.expose();
        if value.is_empty() || (kind == SecretKind::Configured && value.len() < MIN_REDACTED_LEN) {
            return false;
        }
        self.shared.adding();
        let trouble = hosted_boot_wire::locks::write(&self.shared.state).insert(
            value_forms(value),
            &self.shared,
            "secret is",
        );
        if let Some(t) = trouble {
            t.log();
        }
        true
    }

    /// [`Redactor::add`] for many secrets of one `kind` at once: the
    /// automaton is built once for all of them, not once per value (an env
    /// bundle of 10,000 connectors, PROTOCOL.md 2.3). Returns, for each
    /// secret in order, whether it is redacted (see [`Redactor::add`]).
    pub fn add_many(&self, secrets: &[&Secret], kind: SecretKind) -> Vec<bool> {
        let mut forms = Vec::new();
        let mut added = Vec::with_capacity(secrets.len());
        for secret in secrets {
            let value = secret.expose();
            if value.is_empty()
                || (kind == SecretKind::Configured && value.len() < MIN_REDACTED_LEN)
            {
                added.push(false);
                continue;
            }
            forms.extend(value_forms(value));
            added.push(true);
        }
        self.shared.adding();
        let trouble = hosted_boot_wire::locks::write(&self.shared.state).insert(
            forms,
            &self.shared,
            "secrets are",
        );
        if let Some(t) = trouble {
            t.log();
        }
        added
    }

    /// Registers a source polled before each redaction (see
    /// [`SecretSource`]); its values are added as [`SecretKind::Credential`].
    pub fn add_source(&self, source: SecretSource) {
        let mut sources = hosted_boot_wire::locks::lock(&self.shared.sources);
        sources.push(source);
    }

    /// Polls every source and adds what they return. Called by
    /// [`Redactor::redact`] and by [`StreamRedactor::push`]; a caller that
    /// redacts values with [`Redactor::redact_value`] calls it first.
    pub fn refresh(&self) {
        if REFRESHING.with(Cell::get) {
            return;
        }
        REFRESHING.with(|r| r.set(true));
        let fresh: Vec<Secret> = {
            let mut sources = hosted_boot_wire::locks::lock(&self.shared.sources);
            let fresh: Vec<Secret> = sources.iter_mut().flat_map(|s| s()).collect();
            if !fresh.is_empty() {
                // Before the values are added: a line another stream
                // stamped meanwhile is redacted by value.
                self.shared.adding();
            }
            fresh
        };
        for secret in &fresh {
            self.add(secret, SecretKind::Credential);
        }
        REFRESHING.with(|r| r.set(false));
    }

    fn current(&self) -> (u64, Option<Arc<Matcher>>) {
        let state = hosted_boot_wire::locks::read(&self.shared.state);
        (
            self.shared.generation.load(Ordering::SeqCst),
            state.matcher.clone(),
        )
    }

    /// `text` with every known secret replaced by `[REDACTED]`; overlapping
    /// or touching matches become one `[REDACTED]`. Polls the sources first.
    pub fn redact(&self, text: &str) -> String {
        // Patterns are whole UTF-8 strings, so a match starts and ends on
        // character boundaries; lossy is only a fallback.
        String::from_utf8(self.redact_bytes(text.as_bytes()))
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// [`Redactor::redact`] on bytes (which need not be UTF-8).
    pub fn redact_bytes(&self, input: &[u8]) -> Vec<u8> {
        self.refresh();
        let (_, matcher) = self.current();
        let mut out = Vec::with_capacity(input.len());
        match matcher {
            Some(m) if redact_whole(&m, input, &mut out) => out,
            _ => input.to_vec(),
        }
    }

    /// Whether `input` holds a known secret in any form [`Redactor::redact_bytes`]
    /// would replace (raw, the literal forms, the decoded view): the same
    /// matcher, so what this finds is exactly what redaction would replace.
    /// Polls the sources first. Says nothing of which secret it found.
    pub fn contains(&self, input: &[u8]) -> bool {
        self.refresh();
        match self.current() {
            (_, Some(m)) => m.may_match(input),
            (_, None) => false,
        }
    }

    /// [`Redactor::contains`] over everything `reader` yields, read in pieces
    /// of [`SCAN_READ`] bytes through the [`StreamRedactor`], so a secret cut
    /// by a read boundary is found and memory stays bounded whatever the
    /// input's length. Stops reading at the first secret.
    ///
    /// Errors: the reader's.
    pub fn contains_read(&self, reader: &mut impl std::io::Read) -> std::io::Result<bool> {
        let mut stream = self.stream();
        let mut buf = vec![0u8; SCAN_READ];
        let mut out = Vec::new();
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            stream.push(&buf[..n], &mut out);
            out.clear();
            if stream.found {
                return Ok(true);
            }
        }
        stream.finish(&mut out);
        Ok(stream.found)
    }

    /// Whether what is parsed out of `bytes` needs no redaction by value:
    /// `bytes` is output of a [`StreamRedactor`] of this redactor, every byte
    /// of it decided at `generation` ([`StreamRedactor::generation`]), the
    /// set has not changed since, and `bytes` holds no `\\`, so each string
    /// JSON parsing takes out of it (keys and values) is a piece of it, which
    /// holds no secret where the whole holds none. Also `false` when some
    /// pattern holds a `[` or `]` or is a piece of `[REDACTED]`: the stream
    /// does not search its own `[REDACTED]` again, the pass by value does.
    /// Generations are unique in the process, so a line of another
    /// redactor's stream is never final here. (PROTOCOL.md 4.6: the events are still
    /// redacted exactly as by value; this only skips a pass that would find
    /// nothing.)
    pub fn stream_output_is_final(&self, generation: u64, bytes: &[u8]) -> bool {
        // Atomics only, no lock: this runs once per line. The flag is set
        // before the generation moves, so an older generation's answer is
        // never mixed with a newer set's flag that it needs.
        self.shared.generation.load(Ordering::SeqCst) == generation
            && !self.shared.marker_spellable.load(Ordering::SeqCst)
            && memchr::memchr(b'\\', bytes).is_none()
    }

    /// Replaces every secret in the string leaves (and keys) of `value`. Does
    /// not poll the sources (it runs once per event; the caller refreshes once
    /// per batch).
    pub fn redact_value(&self, value: &mut Value) {
        let (_, matcher) = self.current();
        if let Some(m) = matcher {
            redact_value_with(&m, value);
        }
    }

    /// A streaming redactor over this set (values added later apply to the
    /// bytes it has not handed on yet).
    pub fn stream(&self) -> StreamRedactor {
        StreamRedactor {
            redactor: self.clone(),
            generation: u64::MAX,
            matcher: None,
            buf: Vec::new(),
            base: 0,
            emitted: 0,
            open: None,
            matches: Vec::new(),
            decoded: decoded::Scratch::default(),
            found: false,
        }
    }
}

/// The forms of `value` that are matched (see the module documentation).
/// The forms of `value` ([`forms`]) and, for a value of several lines (a
/// PEM key, a JSON document), the forms of each of its lines of at least
/// [`MIN_REDACTED_LEN`] bytes: output that prints one line of such a value
/// (a tool that logs line by line) shows none of it, as the GitHub Actions
/// runner masks each line of a multi-line secret.
fn value_forms(value: &str) -> Vec<Vec<u8>> {
    let mut out = forms(value);
    if value.contains('\n') {
        for line in value.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.len() >= MIN_REDACTED_LEN && line != value {
                out.extend(forms(line));
            }
        }
    }
    out
}

fn forms(value: &str) -> Vec<Vec<u8>> {
    let mut forms = vec![value.as_bytes().to_vec()];
    if let Ok(quoted) = serde_json::to_string(value)
        && let Some(escaped) = quoted.strip_prefix('"').and_then(|s| s.strip_suffix('"'))
    {
        forms.push(escaped.as_bytes().to_vec());
        if !escaped.is_ascii() {
            let mut ascii = String::with_capacity(escaped.len() * 2);
            for c in escaped.chars() {
                if c.is_ascii() {
                    ascii.push(c);
                } else {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        ascii.push_str(&format!("\\u{unit:04x}"));
                    }
                }
            }
            forms.push(ascii.into_bytes());
        }
    }
    if value.contains(' ') {
        // Form encoding (`application/x-www-form-urlencoded`) writes a space
        // as `+`, which the decoded view does not undo (a `+` is a `+` in a
        // URL's path and in most text); every other byte outside RFC 3986's
        // unreserved set as `%XX`, in upper and in lower case.
        for upper in [true, false] {
            let mut encoded = String::with_capacity(value.len() * 3);
            for &b in value.as_bytes() {
                match b {
                    b' ' => encoded.push('+'),
                    b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                        encoded.push(char::from(b));
                    }
                    _ if upper => encoded.push_str(&format!("%{b:02X}")),
                    _ => encoded.push_str(&format!("%{b:02x}")),
                }
            }
            forms.push(encoded.into_bytes());
        }
    }
    let b64 = &base64::engine::general_purpose::STANDARD;
    forms.push(b64.encode(format!("x-access-token:{value}")).into_bytes());
    // The characters of base64 that depend on the value's bits alone, for a
    // value starting at each byte alignment: value bits are [8k, 8k + 8n),
    // character j covers bits [6j, 6j + 6).
    let n = value.len();
    for k in 0..3usize {
        let mut bytes = vec![0u8; k];
        bytes.extend_from_slice(value.as_bytes());
        let encoded = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&bytes);
        let start = (8 * k).div_ceil(6);
        let end = (8 * k + 8 * n) / 6;
        if end > start && end - start >= MIN_REDACTED_LEN {
            forms.push(encoded.as_bytes()[start..end].to_vec());
        }
    }
    forms.retain(|f| !f.is_empty());
    forms.dedup();
    forms
}

/// Redacts `input` whole into `out`; returns whether anything matched (when
/// not, `out` is left empty).
fn redact_whole(m: &Matcher, input: &[u8], out: &mut Vec<u8>) -> bool {
    let mut ranges = Vec::new();
    matches_into(m, input, &mut ranges);
    if memchr::memchr2(b'\\', b'%', input).is_some() {
        decoded::matches(
            m,
            input,
            true,
            &mut decoded::Scratch::default(),
            &mut ranges,
        );
        ranges.sort_unstable();
    }
    let Some(&first) = ranges.first() else {
        return false;
    };
    out.reserve(input.len());
    let mut last = 0;
    let mut current = first;
    for &(start, end) in &ranges[1..] {
        if start <= current.1 {
            current.1 = current.1.max(end);
        } else {
            out.extend_from_slice(&input[last..current.0]);
            mask(out);
            last = current.1;
            current = (start, end);
        }
    }
    out.extend_from_slice(&input[last..current.0]);
    mask(out);
    out.extend_from_slice(&input[current.1..]);
    true
}

fn redact_str_with(m: &Matcher, s: &str) -> Option<String> {
    // Allocated only for a string that holds a secret (most do not).
    let mut out = Vec::new();
    if !redact_whole(m, s.as_bytes(), &mut out) {
        return None;
    }
    Some(
        String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
    )
}

fn redact_value_with(m: &Matcher, value: &mut Value) {
    match value {
        Value::String(s) => {
            if let Some(r) = redact_str_with(m, s) {
                *s = r;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| redact_value_with(m, v)),
        Value::Object(map) => {
            let keys: Vec<String> = map
                .keys()
                .filter(|k| m.may_match(k.as_bytes()))
                .cloned()
                .collect();
            for key in keys {
                if let Some(v) = map.remove(&key) {
                    let redacted = redact_str_with(m, &key).unwrap_or(key);
                    map.insert(redacted, v);
                }
            }
            map.values_mut().for_each(|v| redact_value_with(m, v));
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Redacts a byte stream handed over in reads of any size: the output,
/// concatenated, equals [`Redactor::redact_bytes`] of the whole input (for a
/// fixed set of secrets).
///
/// It holds back only the end of the input that could begin a secret (at
/// most the longest form minus one byte, or, spelled with escapes in the
/// decoded view, their original bytes: at most 6 per byte, plus an escape
/// the read cuts; usually nothing at the end of a line, so output is not
/// delayed): bytes covered by a redaction are
/// replaced once, when the redaction starts, and a redaction that keeps
/// growing across reads costs no memory. The sources are polled
/// before each read is redacted, so a value minted in another process before
/// the agent printed it is in the set when that output is redacted.
pub struct StreamRedactor {
    redactor: Redactor,
    generation: u64,
    matcher: Option<Arc<Matcher>>,
    /// Input not yet decided, plus look-behind for matches that may still
    /// end later; `buf[0]` is stream offset `base`.
    buf: Vec<u8>,
    base: u64,
    /// Output is decided for stream offsets below this.
    emitted: u64,
    /// End of the last `[REDACTED]` written while a later match could still
    /// extend it (no plain byte was written after it).
    open: Option<u64>,
    matches: Vec<(usize, usize)>,
    decoded: decoded::Scratch,
    /// Whether a redaction was written since the stream began (kept across
    /// [`StreamRedactor::finish`]; [`Redactor::contains_read`] reads it).
    found: bool,
}

impl StreamRedactor {
    /// The redactor's generation that the last [`StreamRedactor::push`] or
    /// [`StreamRedactor::finish`] redacted with: every byte either appended
    /// was decided at it (or, held back from before, at a later one).
    /// Compared by [`Redactor::stream_output_is_final`].
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Redacts the next read of the stream, appending what is decided to
    /// `out` (possibly nothing yet).
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        self.redactor.refresh();
        self.buf.extend_from_slice(input);
        self.process(out, false);
    }

    /// Ends the stream: appends everything still held back. The redactor can
    /// then be used for a new stream.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.redactor.refresh();
        self.process(out, true);
        self.buf.clear();
        self.base = 0;
        self.emitted = 0;
        self.open = None;
    }

    /// Bytes currently held back (the tests of the memory bound).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.buf.len()
    }

    fn process(&mut self, out: &mut Vec<u8>, last: bool) {
        let generation = self.redactor.shared.generation.load(Ordering::SeqCst);
        if generation != self.generation {
            let (g, m) = self.redactor.current();
            self.generation = g;
            self.matcher = m;
        }
        let total = self.base + self.buf.len() as u64;
        let mut limit = total;
        if let Some(m) = self.matcher.clone() {
            // A match not yet seen ends after `total`, so what of it is
            // already here is a suffix of the input that begins a pattern
            // (raw, or in the decoded view): it starts at or after `limit`,
            // and bytes before `limit` can be decided now. The next read
            // resumes on a unit boundary of the decoded view.
            matches_into(&m, &self.buf, &mut self.matches);
            let mut held_from = self.buf.len();
            if !last {
                held_from -= m.pending_prefix(&self.buf);
            }
            if memchr::memchr2(b'\\', b'%', &self.buf).is_some() {
                let view =
                    decoded::matches(&m, &self.buf, last, &mut self.decoded, &mut self.matches);
                self.matches.sort_unstable();
                if let Some(from) = view {
                    held_from = held_from.min(from);
                }
                held_from = self.decoded.unit_start(held_from);
            }
            limit = self.base + held_from as u64;
            for i in 0..self.matches.len() {
                let (s, e) = self.matches[i];
                let (s, e) = (self.base + s as u64, self.base + e as u64);
                if let Some(end) = self.open
                    && s <= end
                {
                    // Overlaps or touches the redaction already written.
                    let end = end.max(e);
                    self.found = true;
                    self.open = Some(end);
                    self.emitted = self.emitted.max(end);
                    continue;
                }
                if s >= limit {
                    // A match not yet seen could start before this one and
                    // merge with it: undecided until more input comes.
                    break;
                }
                // A new redaction whose start is final. (`s >= emitted`: the
                // held-back bytes before `emitted` are all inside `open`.)
                self.plain(s, out);
                mask(out);
                self.found = true;
                self.open = Some(e);
                self.emitted = e;
            }
        }
        if self.emitted < limit {
            self.plain(limit, out);
            self.open = None;
        }
        // Keep what a later match may still start in.
        let drop = usize::try_from(limit - self.base).unwrap_or(self.buf.len());
        self.buf.drain(..drop.min(self.buf.len()));
        self.base = limit;
    }

    /// Writes the input bytes from `emitted` up to stream offset `to`.
    fn plain(&mut self, to: u64, out: &mut Vec<u8>) {
        if to > self.emitted {
            let from = (self.emitted - self.base) as usize;
            let to_i = (to - self.base) as usize;
            out.extend_from_slice(&self.buf[from..to_i]);
            self.emitted = to;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_line_is_not_final_while_a_secret_is_being_added() {
        // A break-it review's race: the set is being built on another
        // thread (write lock held) when the event of a line streamed
        // before is built; the pass by value must wait for the new set.
        let r = r(&["sk-first-0123456789"]);
        let line = b"{\"type\":\"x\",\"v\":\"ghs_minted0123456789abcdef\"}\n";
        let mut s = r.stream();
        let mut out = Vec::new();
        s.push(line, &mut out);
        let at = s.generation();
        assert!(r.stream_output_is_final(at, &out));
        let adder = r.clone();
        let adding = std::thread::spawn(move || {
            let mut many: Vec<Secret> = (0..20_000)
                .map(|i| Secret::new(format!("filler-secret-{i:08}-xyz")))
                .collect();
            many.push(Secret::new("ghs_minted0123456789abcdef".into()));
            let refs: Vec<&Secret> = many.iter().collect();
            adder.add_many(&refs, SecretKind::Credential);
        });
        while r.shared.state.try_read().is_ok() && !adding.is_finished() {
            std::hint::spin_loop();
        }
        assert!(!r.stream_output_is_final(at, &out));
        adding.join().unwrap();
        assert!(!r.stream_output_is_final(at, &out));
        // Another redactor's stream, at a generation equal in number to
        // nothing here, is never final for this one.
        let other = Redactor::new();
        assert!(!other.stream_output_is_final(at, &out));
    }

    fn r(values: &[&str]) -> Redactor {
        let r = Redactor::new();
        for v in values {
            assert!(r.add(&Secret::new(v.to_string()), SecretKind::Credential));
        }
        r
    }

    fn chunked(r: &Redactor, input: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut s = r.stream();
        let mut out = Vec::new();
        let mut at = 0;
        for &c in cuts {
            let c = c.clamp(at, input.len());
            s.push(&input[at..c], &mut out);
            at = c;
        }
        s.push(&input[at..], &mut out);
        s.finish(&mut out);
        out
    }

    /// Yields its input `step` bytes a read.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn contains_finds_what_redaction_replaces_in_every_form_and_across_reads() {
        let value = "acme-connector-value-42";
        let r = r(&[value]);
        let b64 = &base64::engine::general_purpose::STANDARD;
        let inputs = [
            format!("key={value}\n"),
            b64.encode(format!("user:{value}")),
            b64.encode(value),
            r"\u0061cme-connector-value-42".to_string(),
            "acme%2Dconnector-value-42".to_string(),
        ];
        for input in &inputs {
            assert!(r.contains(input.as_bytes()), "{input}");
            assert_ne!(r.redact(input), *input, "{input}");
            for step in [1, 7, SCAN_READ] {
                let mut t = Trickle {
                    data: input.as_bytes(),
                    step,
                };
                assert!(r.contains_read(&mut t).unwrap(), "{input}, {step} a read");
            }
        }
        for clean in ["acme-connector-value-4", "nothing here", ""] {
            assert!(!r.contains(clean.as_bytes()), "{clean}");
            let mut t = Trickle {
                data: clean.as_bytes(),
                step: 3,
            };
            assert!(!r.contains_read(&mut t).unwrap(), "{clean}");
        }
        assert!(!Redactor::new().contains(value.as_bytes()));
        // Split across the boundary of two reads of a large input.
        let mut big = vec![b'a'; SCAN_READ - 5];
        big.extend_from_slice(value.as_bytes());
        big.extend(std::iter::repeat_n(b'b', SCAN_READ));
        let mut t = Trickle {
            data: &big,
            step: SCAN_READ,
        };
        assert!(r.contains_read(&mut t).unwrap());
    }

    #[test]
    fn each_line_of_a_multi_line_value_is_redacted_alone() {
        let r = r(&["line-one-secret\nsecretline2abcdef\r\nab"]);
        assert_eq!(
            r.redact("printed: secretline2abcdef and line-one-secret, ab"),
            "printed: [REDACTED] and [REDACTED], ab"
        );
    }

    #[test]
    fn replaces_every_occurrence() {
        let r = r(&["s3cr3t-value"]);
        assert_eq!(
            r.redact("a s3cr3t-value b s3cr3t-value"),
            "a [REDACTED] b [REDACTED]"
        );
    }

    #[test]
    fn longest_match_wins_and_overlaps_merge() {
        let r = r(&["abcdef", "abcdefghij", "ghijkl"]);
        assert_eq!(r.redact("xx abcdefghij yy"), "xx [REDACTED] yy");
        assert_eq!(r.redact("xx abcdefghijkl yy"), "xx [REDACTED] yy");
        assert_eq!(r.redact("abcdefghijkl"), "[REDACTED]");
        assert_eq!(r.redact("abcdefghijkl-ghijkl"), "[REDACTED]-[REDACTED]");
        assert_eq!(r.redact("abcdefabcdef"), "[REDACTED]");
        let nested = super::tests::r(&["cdxx", "ab-cdxx-yz", "zz-q1"]);
        assert_eq!(
            nested.redact("0ab-cdxx-yz1 cdxx zz-q1"),
            "0[REDACTED]1 [REDACTED] [REDACTED]"
        );
    }

    #[test]
    fn json_escaped_forms_are_matched() {
        let r = r(&["p\"a\\ss/wörd"]);
        let line = serde_json::json!({"text": "token is p\"a\\ss/wörd"}).to_string();
        let redacted = r.redact(&line);
        assert_eq!(redacted, r#"{"text":"token is [REDACTED]"}"#);
        // Python's json.dumps escapes non-ASCII as \uXXXX.
        let python = r#"{"text": "token is p\"a\\ss/w\u00f6rd"}"#;
        assert_eq!(r.redact(python), r#"{"text": "token is [REDACTED]"}"#);
    }

    #[test]
    fn basic_auth_forms_are_matched() {
        let r = r(&["ghs_token123"]);
        let b64 = &base64::engine::general_purpose::STANDARD;
        let git = b64.encode("x-access-token:ghs_token123");
        assert_eq!(
            r.redact(&format!("Authorization: Basic {git}")),
            "Authorization: Basic [REDACTED]"
        );
        // Any user name, at any alignment: no character that depends on the
        // value's bits alone is left.
        for user in ["u", "ab", "oauth2", "x-token-auth"] {
            let header = b64.encode(format!("{user}:ghs_token123"));
            let redacted = r.redact(&header);
            assert!(redacted.contains(REDACTED), "{user}: {redacted}");
            let left = redacted.replace(REDACTED, "");
            assert!(left.len() <= header.len() - 12, "{user}: {redacted}");
        }
    }

    #[test]
    fn short_configured_values_are_skipped() {
        let r = Redactor::new();
        assert!(!r.add(&Secret::new("abc".into()), SecretKind::Configured));
        assert!(r.add(&Secret::new("abc".into()), SecretKind::Credential));
        assert_eq!(r.redact("xabcx"), "x[REDACTED]x");
    }

    #[test]
    fn non_utf8_bytes_pass_through_and_are_still_redacted() {
        let r = r(&["tok-123456"]);
        assert_eq!(
            r.redact_bytes(b"\xff\xfetok-123456\xff"),
            b"\xff\xfe[REDACTED]\xff"
        );
        assert_eq!(
            chunked(&r, b"\xff\xfetok-123456\xff", &[3, 7]),
            b"\xff\xfe[REDACTED]\xff"
        );
    }

    #[test]
    fn a_secret_split_across_two_three_and_n_reads() {
        let r = r(&["0123456789abcdef"]);
        let input = b"before 0123456789abcdef after";
        let expected = b"before [REDACTED] after".to_vec();
        assert_eq!(chunked(&r, input, &[12]), expected);
        assert_eq!(chunked(&r, input, &[9, 15]), expected);
        let every_byte: Vec<usize> = (1..input.len()).collect();
        assert_eq!(chunked(&r, input, &every_byte), expected);
    }

    #[test]
    fn only_what_could_begin_a_secret_is_held_back() {
        let r = r(&["0123456789abcdef"]);
        let mut s = r.stream();
        let mut out = Vec::new();
        s.push(b"a whole line\n", &mut out);
        assert_eq!(out, b"a whole line\n");
        assert_eq!(s.held(), 0);
        s.push(b"partial 01234", &mut out);
        assert_eq!(out, b"a whole line\npartial ");
        assert_eq!(s.held(), 5);
        s.push(b"5x", &mut out);
        assert_eq!(out, b"a whole line\npartial 012345x");
        assert_eq!(s.held(), 0);
    }

    #[test]
    fn a_secret_at_the_very_start_and_end_of_the_stream() {
        let r = r(&["0123456789abcdef"]);
        assert_eq!(
            chunked(&r, b"0123456789abcdef middle 0123456789abcdef", &[3, 30]),
            b"[REDACTED] middle [REDACTED]"
        );
        assert_eq!(chunked(&r, b"0123456789abcdef", &[8]), b"[REDACTED]");
    }

    /// `input`, `x` + overlapping secrets + `y`, becomes `x[REDACTED]y`
    /// whole and cut at several reads (one a byte).
    fn one_redaction_whatever_the_reads(r: &Redactor, input: &[u8]) {
        for cuts in [vec![], vec![4], vec![2, 5, 7], (1..input.len()).collect()] {
            assert_eq!(chunked(r, input, &cuts), b"x[REDACTED]y", "{cuts:?}");
        }
    }

    #[test]
    fn overlapping_secrets_across_reads_become_one_redaction() {
        let r = r(&["abcdef", "defghi"]);
        one_redaction_whatever_the_reads(&r, b"xabcdefghiy");
        // A chain of touching occurrences grows one redaction without
        // holding its bytes: at most the longest form (here the git
        // Basic-auth form, 28 bytes) minus one is held back.
        let mut s = r.stream();
        let mut out = Vec::new();
        s.push(b"<", &mut out);
        for _ in 0..1000 {
            s.push(b"abcdef", &mut out);
            assert!(s.held() < 28, "{}", s.held());
        }
        s.push(b">", &mut out);
        s.finish(&mut out);
        assert_eq!(out, b"<[REDACTED]>");
    }

    /// The number of levels of `r`'s matcher.
    fn levels(r: &Redactor) -> usize {
        let state = hosted_boot_wire::locks::read(&r.shared.state);
        state.matcher.as_ref().map_or(0, |m| m.levels())
    }

    #[test]
    fn an_addition_compiles_a_logarithmic_share_of_the_patterns() {
        // 1,000 additions of one credential each, as a long session makes
        // them: each pattern is compiled again at most log2(1,000) = 10
        // times (levels merged as a binary counter); one automaton rebuilt
        // over everything at each addition compiled 500 times as many.
        let r = Redactor::new();
        let n = 1000;
        for i in 0..n {
            assert!(r.add(
                &Secret::new(format!("ghs_{i:04}-0123456789abcdefghij")),
                SecretKind::Credential
            ));
        }
        let (known, compiled) = {
            let state = hosted_boot_wire::locks::read(&r.shared.state);
            (state.known.len(), state.compiled)
        };
        assert!(
            compiled <= known * 11,
            "{compiled} patterns compiled for {known} held over {n} additions"
        );
        assert!(levels(&r) <= 11, "{} levels", levels(&r));
        // Every value is still found, from the oldest level to the newest.
        for i in [0, 1, 511, 512, 998, 999] {
            let v = format!("ghs_{i:04}-0123456789abcdefghij");
            assert_eq!(r.redact(&format!("a {v} b")), "a [REDACTED] b");
            assert_eq!(
                chunked(&r, format!("a {v} b").as_bytes(), &[5, 9]),
                b"a [REDACTED] b"
            );
        }
    }

    #[test]
    fn overlapping_secrets_in_different_levels_become_one_redaction() {
        // Added apart, so each is in a level of its own (or merged): the
        // union of occurrences and the stream's held-back prefix span levels.
        let r = r(&["abcdef", "defghi", "ghijkl-mn"]);
        assert!(levels(&r) >= 2, "{} levels", levels(&r));
        one_redaction_whatever_the_reads(&r, b"xabcdefghijkl-mny");
        let mut s = r.stream();
        let mut out = Vec::new();
        s.push(b"x ghijkl-", &mut out);
        assert_eq!(out, b"x ");
        s.push(b"mn!", &mut out);
        assert_eq!(out, b"x [REDACTED]!");
    }

    #[test]
    fn a_value_added_mid_stream_applies_to_what_is_not_yet_out() {
        let r = r(&["0123456789abcdef"]);
        let mut s = r.stream();
        let mut out = Vec::new();
        s.push(b"one ", &mut out);
        r.add(&Secret::new("late-token".into()), SecretKind::Credential);
        s.push(b"late-token two", &mut out);
        s.finish(&mut out);
        assert_eq!(out, b"one [REDACTED] two");
    }

    #[test]
    fn a_source_is_polled_before_redacting() {
        let r = Redactor::new();
        let pending = Arc::new(Mutex::new(Vec::<String>::new()));
        let p = pending.clone();
        r.add_source(Box::new(move || {
            p.lock().unwrap().drain(..).map(Secret::new).collect()
        }));
        let mut s = r.stream();
        let mut out = Vec::new();
        s.push(b"nothing yet ", &mut out);
        // Several values learnt between two polls are all added.
        pending
            .lock()
            .unwrap()
            .extend(["minted-elsewhere".into(), "minted-too".into()]);
        s.push(b"minted-elsewhere! minted-too", &mut out);
        s.finish(&mut out);
        assert_eq!(out, b"nothing yet [REDACTED]! [REDACTED]");
        assert_eq!(r.redact("minted-elsewhere"), REDACTED);
    }

    #[test]
    fn values_are_redacted_in_keys_and_leaves() {
        let r = r(&["tok-123456"]);
        let mut v = serde_json::json!({"a": ["x tok-123456"], "tok-123456": 1, "n": 2});
        r.redact_value(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a": ["x [REDACTED]"], "[REDACTED]": 1, "n": 2})
        );
    }

    #[test]
    fn any_json_or_percent_spelling_is_matched_in_any_text() {
        let slashy = "wJalrXUtnFEMI/K7MDENG&bPx+RfiCYKEY";
        let r = r(&[slashy, "acme-0123456789", "p\"a\\ss/wörd😀"]);
        for spelled in [
            // PHP's json_encode, Go's encoding/json, every byte as \u00XX in
            // either case, RFC 3986 in upper and lower case, Python's quote
            // (which keeps `/`), a mix.
            r"wJalrXUtnFEMI\/K7MDENG&bPx+RfiCYKEY",
            r"wJalrXUtnFEMI/K7MDENG\u0026bPx+RfiCYKEY",
            r"\u0061\u0063\u006D\u0065-0123456789",
            r"\u0061\u0063\u006d\u0065-0123456789",
            "wJalrXUtnFEMI%2FK7MDENG%26bPx%2BRfiCYKEY",
            "wJalrXUtnFEMI%2fK7MDENG%26bPx%2bRfiCYKEY",
            "wJalrXUtnFEMI/K7MDENG%26bPx%2BRfiCYKEY",
            r"w%4AalrXUtnFEMI\/K7MDENG\u0026bPx+RfiCYKEY",
            r#"p\"a\\ss\/w\u00F6rd\ud83d\ude00"#,
        ] {
            for (before, after) in [("", ""), ("{\"k\":\"", "\"}"), ("url=", "@host")] {
                let line = format!("{before}{spelled}{after}");
                assert_eq!(
                    r.redact(&line),
                    format!("{before}{REDACTED}{after}"),
                    "{line}"
                );
                let cuts: Vec<usize> = (1..line.len()).collect();
                assert_eq!(
                    chunked(&r, line.as_bytes(), &cuts),
                    format!("{before}{REDACTED}{after}").into_bytes(),
                    "{line}, a byte a read"
                );
            }
        }
        // What a JSON parser reads is what counts: after `\\` the `u` is a
        // letter, so no secret is spelled.
        let text = r"\\u0061cme-0123456789";
        assert_eq!(r.redact(text), text);
        // A string value decoded from JSON that still spells one (a JSON
        // document inside a JSON string) is redacted by value too.
        let mut v = serde_json::json!({"inner": r#"{"k":"\u0061cme-0123456789"}"#});
        r.redact_value(&mut v);
        assert_eq!(v, serde_json::json!({"inner": r#"{"k":"[REDACTED]"}"#}));
    }

    #[test]
    fn form_encoding_with_plus_for_space_is_matched() {
        let r = r(&["pass word/1"]);
        assert_eq!(r.redact("pw=pass+word%2F1&x"), "pw=[REDACTED]&x");
        assert_eq!(r.redact("pw=pass+word%2f1&x"), "pw=[REDACTED]&x");
        assert_eq!(r.redact("pw=pass%20word%2F1&x"), "pw=[REDACTED]&x");
    }

    #[test]
    fn an_escape_cut_at_the_end_of_a_read_is_held_only_until_decided() {
        let r = r(&["acme-0123456789"]);
        let mut s = r.stream();
        let mut out = Vec::new();
        s.push(b"x \\u00", &mut out);
        assert_eq!(out, b"x ");
        s.push(b"61cme-0123456789 y", &mut out);
        s.push(b" 100%", &mut out);
        assert_eq!(out, b"x [REDACTED] y 100");
        s.push(b"\n", &mut out);
        assert_eq!(out, b"x [REDACTED] y 100%\n");
        assert_eq!(s.held(), 0);
    }

    /// `value` spelled by `picks`: each byte raw, as `\u00XX` (upper or
    /// lower hex), as its short JSON escape when it has one, or as `%XX`.
    fn spell(value: &str, picks: &[u8]) -> String {
        let mut out = String::new();
        for (i, c) in value.chars().enumerate() {
            let pick = picks.get(i).copied().unwrap_or(0) % 6;
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '/' => Some("\\/"),
                _ => None,
            };
            let mut buf = [0u8; 4];
            let bytes = c.encode_utf8(&mut buf).as_bytes();
            match (pick, short) {
                (1, _) if c.is_ascii() => out.push_str(&format!("\\u{:04x}", c as u32)),
                (2, _) if c.is_ascii() => out.push_str(&format!("\\u{:04X}", c as u32)),
                (3, Some(s)) => out.push_str(s),
                (4, _) => bytes
                    .iter()
                    .for_each(|b| out.push_str(&format!("%{b:02X}"))),
                (5, _) => bytes
                    .iter()
                    .for_each(|b| out.push_str(&format!("%{b:02x}"))),
                // Raw, a `\\`, `"` or `%` would start (or end) an escape.
                _ if c == '\\' || c == '"' => out.push_str(short.unwrap_or_default()),
                _ if c == '%' => out.push_str("%25"),
                _ => out.push(c),
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Secrets spelled with random JSON and percent escapes, in filler
        /// made of escape fragments (`\\`, `\u0`, `%2`, hex digits), cut at
        /// random reads: streamed output equals whole-input redaction, and a
        /// spelled secret after a newline (a unit boundary) is redacted.
        #[test]
        fn chunked_equals_whole_with_escapes(
            secrets in prop::collection::vec("[abc\"\\\\/%&]{6,16}", 1..4),
            filler in prop::collection::vec("[abx\\\\u0%2fFD\n]{0,12}", 1..10),
            picks in prop::collection::vec((any::<prop::sample::Index>(), prop::collection::vec(any::<u8>(), 16)), 1..10),
            cuts in prop::collection::vec(0usize..600, 0..30),
        ) {
            let r = Redactor::new();
            for s in &secrets {
                r.add(&Secret::new(s.clone()), SecretKind::Credential);
            }
            let mut text = String::new();
            let mut spelled = Vec::new();
            for (i, f) in filler.iter().enumerate() {
                text.push_str(f);
                if let Some((p, how)) = picks.get(i) {
                    let s = spell(p.get(&secrets[..]).as_str(), how);
                    text.push('\n');
                    text.push_str(&s);
                    text.push('\n');
                    spelled.push(s);
                }
            }
            let mut cuts = cuts;
            cuts.sort_unstable();
            let whole = r.redact_bytes(text.as_bytes());
            let streamed = chunked(&r, text.as_bytes(), &cuts);
            prop_assert_eq!(&streamed, &whole);
            let out = String::from_utf8(streamed).unwrap();
            for line in out.lines() {
                prop_assert!(!spelled.iter().any(|s| s == line), "{:?} left in {:?}", line, out);
            }
        }

        /// Secrets added in many separate additions (so held in several
        /// levels) redact exactly as the same secrets added at once (one
        /// level, one automaton), whole and cut at random reads, raw and
        /// spelled with escapes.
        #[test]
        fn levels_redact_as_one_automaton(
            secrets in prop::collection::vec("[abc\"\\\\/%]{1,12}", 2..40),
            filler in prop::collection::vec("[abcx\\\\u0%2\n]{0,16}", 1..16),
            picks in prop::collection::vec((any::<prop::sample::Index>(), prop::collection::vec(any::<u8>(), 12)), 1..16),
            cuts in prop::collection::vec(0usize..800, 0..30),
        ) {
            let apart = Redactor::new();
            for s in &secrets {
                apart.add(&Secret::new(s.clone()), SecretKind::Credential);
            }
            let values: Vec<Secret> = secrets.iter().cloned().map(Secret::new).collect();
            let together = Redactor::new();
            together.add_many(&values.iter().collect::<Vec<_>>(), SecretKind::Credential);
            prop_assert_eq!(levels(&together), 1);
            let mut text = String::new();
            for (i, f) in filler.iter().enumerate() {
                text.push_str(f);
                if let Some((p, how)) = picks.get(i) {
                    text.push_str(&spell(p.get(&secrets[..]).as_str(), how));
                }
            }
            let mut cuts = cuts;
            cuts.sort_unstable();
            let whole = together.redact_bytes(text.as_bytes());
            prop_assert_eq!(&apart.redact_bytes(text.as_bytes()), &whole);
            prop_assert_eq!(&chunked(&apart, text.as_bytes(), &cuts), &whole);
            prop_assert_eq!(apart.contains(text.as_bytes()), together.contains(text.as_bytes()));
        }

        /// Random text over a small alphabet (so secrets overlap and recur)
        /// with random secrets inserted, cut at random read boundaries: the
        /// streamed output equals redacting the whole text at once, and no
        /// raw secret is left.
        #[test]
        fn chunked_equals_whole(
            secrets in prop::collection::vec("[abc\"\\\\]{1,24}", 1..6),
            filler in prop::collection::vec("[abcx\\n]{0,20}", 1..12),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 1..12),
            cuts in prop::collection::vec(0usize..400, 0..20),
        ) {
            let r = Redactor::new();
            for s in &secrets {
                r.add(&Secret::new(s.clone()), SecretKind::Credential);
            }
            let mut text = String::new();
            for (i, f) in filler.iter().enumerate() {
                text.push_str(f);
                if let Some(p) = picks.get(i) {
                    text.push_str(p.get(&secrets[..]).as_str());
                }
            }
            let mut cuts = cuts;
            cuts.sort_unstable();
            let whole = r.redact_bytes(text.as_bytes());
            let streamed = chunked(&r, text.as_bytes(), &cuts);
            prop_assert_eq!(&streamed, &whole);
            let out = String::from_utf8(streamed).unwrap();
            // What is left outside the replacements holds no secret (the
            // replacement's own letters could combine with a secret made of
            // them, so look only at the text between replacements).
            for part in out.split(REDACTED) {
                for s in &secrets {
                    prop_assert!(!part.contains(s.as_str()), "{:?} left in {:?}", s, out);
                }
            }
        }
    }
}
