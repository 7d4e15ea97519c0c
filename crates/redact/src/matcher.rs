//! The compiled pattern set of the redactor, grown by additions at an
//! amortised O(log n) pattern builds each (issue 15, "Load").
//!
//! A session adds secrets all along (each turn's agent-API proxy token,
//! rotated bearers, repo tokens; about 6 pattern forms a value), so one
//! automaton over every pattern, rebuilt at each addition, made a turn's cost
//! and a long session's total grow with the session (quadratically over the
//! 1,000-turn load row). The patterns are instead held in *levels*, as a
//! log-structured merge tree holds its runs: an addition compiles its new
//! patterns alone into a new, small level, and while the level before it is
//! less than twice as large as it, the two are merged into one (a binary
//! counter: each pattern is compiled again O(log n) times in all, and there
//! are at most log2(additions) + 1 levels, each at least twice the next).
//! Merged levels are shared (`Arc`) by every [`Matcher`] that holds them, so
//! a stream keeping an older matcher costs no copy.
//!
//! The search is the union over the levels, which is the old single-automaton
//! search exactly: every occurrence of every pattern (each pattern is in one
//! level), and the longest suffix that begins some pattern of any level. The
//! prefilter (the gram bitmap and gram list) is one for all levels, extended
//! at each addition by the new patterns' grams (a copy of the 8 KiB bitmap
//! and a merge of two sorted lists, no automaton), so the prefilter pass over
//! the input stays one pass; the levels' automata run only inside its
//! windows.

use std::sync::Arc;

use aho_corasick::automaton::Automaton;
use aho_corasick::nfa::contiguous::NFA as ContiguousNfa;
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, Anchored, BuildError, Input, MatchKind};

/// One pattern, shared by the deduplication set and its level.
pub(super) type Pattern = Arc<[u8]>;

/// The compiled pattern set: its levels and the prefilter over all of them.
pub(super) struct Matcher {
    /// Oldest (largest) first; each at least twice as large as the next.
    levels: Vec<Arc<Level>>,
    /// Where a pattern of any level may occur (see [`Prefilter`]): most
    /// output holds no secret, and the levels' searches run only in those
    /// windows.
    filter: Prefilter,
    /// Bytes that start some pattern.
    first: [bool; 256],
    /// Bytes that occur in some pattern: an escape standing for none of
    /// them cannot be part of a match (see `super::decoded`).
    pub(super) bytes: [bool; 256],
    /// Length in bytes of the longest pattern.
    pub(super) longest: usize,
}

/// Two levels that could not be merged (they stay apart: the same
/// redaction, one more pass).
pub(super) struct MergeFailure {
    pub(super) error: BuildError,
    /// The patterns the merged level would have held.
    pub(super) patterns: usize,
}

/// Some of the patterns, compiled.
struct Level {
    patterns: Vec<Pattern>,
    /// A contiguous NFA, searched anchored: whether the end of a read may
    /// be the start of a secret that the next read completes; and, in a
    /// fresh level, also the overlapping search for the occurrences.
    automaton: ContiguousNfa,
    /// The overlapping search of a merged level: aho-corasick's choice (a
    /// DFA up to 100 patterns), faster than the NFA (the drive path's JSON
    /// events ~1.4x, BENCHMARKS.md) but slower to build. A fresh level (one
    /// addition's patterns) has none: the DFA's build for the boot secret's
    /// forms was 56 % of the runner's start-up to its first request
    /// (BENCHMARKS.md "Start-up"); it is built when the level is merged.
    merged: Option<AhoCorasick>,
    /// Bytes that start a pattern of this level.
    first: [bool; 256],
    /// Length in bytes of this level's longest pattern.
    longest: usize,
}

impl Level {
    /// `merged`: the patterns of two levels (see [`Level::merged`]).
    fn build(patterns: Vec<Pattern>, merged: bool) -> Result<Level, BuildError> {
        // Standard semantics: the only kind that supports an overlapping
        // search, which the union of occurrences needs.
        let automaton = aho_corasick::nfa::contiguous::Builder::new()
            .match_kind(MatchKind::Standard)
            .build(&patterns)?;
        let merged = if merged {
            Some(
                AhoCorasickBuilder::new()
                    .match_kind(MatchKind::Standard)
                    .build(&patterns)?,
            )
        } else {
            None
        };
        let mut first = [false; 256];
        for p in &patterns {
            if let Some(&b) = p.first() {
                first[usize::from(b)] = true;
            }
        }
        Ok(Level {
            longest: patterns.iter().map(|p| p.len()).max().unwrap_or(0),
            patterns,
            automaton,
            merged,
            first,
        })
    }

    /// Whether `hay` holds an occurrence of a pattern of this level.
    fn is_match(&self, hay: &[u8]) -> bool {
        if let Some(ac) = &self.merged {
            return ac.is_match(hay);
        }
        // Cannot fail: an unanchored search of an automaton that has both
        // start states.
        matches!(self.automaton.try_find(&Input::new(hay)), Ok(Some(_)))
    }

    /// Every occurrence, overlapping, of a pattern of this level in `hay`,
    /// as `(start, end)` plus `offset`.
    fn occurrences(&self, hay: &[u8], offset: usize, out: &mut Vec<(usize, usize)>) {
        if let Some(ac) = &self.merged {
            out.extend(
                ac.find_overlapping_iter(hay)
                    .map(|m| (offset + m.start(), offset + m.end())),
            );
            return;
        }
        // Cannot fail: standard match semantics and an unanchored search.
        if let Ok(found) = self.automaton.try_find_overlapping_iter(Input::new(hay)) {
            out.extend(found.map(|m| (offset + m.start(), offset + m.end())));
        }
    }

    /// Whether `suffix` is the beginning (or the whole) of a pattern here.
    /// `Err` when the anchored search cannot run.
    fn begins_a_pattern(&self, suffix: &[u8]) -> Result<bool, ()> {
        if suffix.len() > self.longest || !self.first[usize::from(suffix[0])] {
            return Ok(false);
        }
        let nfa = &self.automaton;
        let mut sid = nfa.start_state(Anchored::Yes).map_err(|_| ())?;
        Ok(suffix.iter().all(|&b| {
            sid = nfa.next_state(Anchored::Yes, sid, b);
            !nfa.is_dead(sid)
        }))
    }
}

/// Length of the grams the prefilter indexes.
const GRAM: usize = 4;
/// The prefilter looks at every `STRIDE`-th position; every pattern of at
/// least `GRAM + STRIDE - 1` bytes has one of its first `STRIDE` grams at
/// such a position.
const STRIDE: usize = 3;
/// Shortest pattern the gram index covers; shorter ones are found by a
/// small automaton.
const INDEXED_LEN: usize = GRAM + STRIDE - 1;

/// A q-gram prefilter: the grams starting at offsets `0..STRIDE` of every
/// pattern, checked at every `STRIDE`-th position of the input (a bit in an
/// L1-sized bitmap, then the exact gram). An occurrence `[a, b)` of a
/// pattern contains, at the one position `p` in `a..a + STRIDE` that is a
/// multiple of `STRIDE`, a gram of that pattern, so it lies in the window
/// `[p - (STRIDE - 1), p + longest)`. This looks at a third of the bytes
/// with a few instructions each, several times faster than any automaton
/// over hundreds of patterns (aho-corasick's DFA reached ~500 MB/s here,
/// this ~2 GB/s; see BENCHMARKS.md).
#[derive(Clone)]
struct Prefilter {
    bits: Vec<u64>,
    /// Sorted, without duplicates.
    grams: Vec<u32>,
    /// Patterns shorter than [`INDEXED_LEN`] (short credentials, rare), and
    /// their automaton, rebuilt only when one is added.
    short_patterns: Vec<Pattern>,
    short: Option<Arc<AhoCorasick>>,
}

const BITMAP_BITS: usize = 1 << 16;

fn gram_at(hay: &[u8], p: usize) -> u32 {
    u32::from_le_bytes([hay[p], hay[p + 1], hay[p + 2], hay[p + 3]])
}

fn gram_bit(gram: u32) -> usize {
    (gram.wrapping_mul(0x9E37_79B1) >> 16) as usize
}

impl Default for Prefilter {
    fn default() -> Self {
        Prefilter {
            bits: vec![0u64; BITMAP_BITS / 64],
            grams: Vec::new(),
            short_patterns: Vec::new(),
            short: None,
        }
    }
}

impl Prefilter {
    /// This prefilter and `patterns` besides.
    fn extended(&self, patterns: &[Pattern]) -> Result<Prefilter, BuildError> {
        let mut next = self.clone();
        let mut short = false;
        for p in patterns {
            if p.len() < INDEXED_LEN {
                next.short_patterns.push(p.clone());
                short = true;
                continue;
            }
            for o in 0..STRIDE {
                let g = gram_at(p, o);
                next.grams.push(g);
                let b = gram_bit(g);
                next.bits[b / 64] |= 1 << (b % 64);
            }
        }
        // Two sorted runs (the old grams, the new ones once sorted): the
        // stable sort merges them in linear time.
        let old = self.grams.len();
        next.grams[old..].sort_unstable();
        next.grams.sort();
        next.grams.dedup();
        if short {
            next.short = Some(Arc::new(
                AhoCorasickBuilder::new()
                    .match_kind(MatchKind::LeftmostFirst)
                    .build(&next.short_patterns)?,
            ));
        }
        Ok(next)
    }

    /// Appends the windows of `hay` where an occurrence may be (unsorted,
    /// possibly overlapping); an occurrence is always inside one.
    fn windows(&self, hay: &[u8], longest: usize, out: &mut Vec<(usize, usize)>) {
        let n = hay.len();
        let mut p = 0;
        while p + GRAM <= n {
            let g = gram_at(hay, p);
            let b = gram_bit(g);
            if self.bits[b / 64] & (1 << (b % 64)) != 0 && self.grams.binary_search(&g).is_ok() {
                out.push((p.saturating_sub(STRIDE - 1), n.min(p + longest)));
            }
            p += STRIDE;
        }
        if let Some(short) = &self.short {
            // Leftmost-first from each end on: an occurrence starts at a
            // reported start, inside a reported match (and ends before its
            // end - 1 + longest), or at a later report.
            out.extend(
                short
                    .find_iter(hay)
                    .map(|m| (m.start(), n.min(m.end() - 1 + longest))),
            );
        }
    }
}

impl Matcher {
    /// This matcher and `patterns` (none of which it holds) besides: a new
    /// level for them, merged with the levels before it while the one
    /// before is less than twice as large. Returns the matcher and how many
    /// patterns were compiled (the cost, for the tests).
    ///
    /// Errors: only a level beyond the aho-corasick crate's size limits;
    /// a merge that fails leaves the levels unmerged (the same search) and
    /// is returned beside the matcher, for the caller to log once it has
    /// released the redactor's lock (the log writer redacts).
    pub(super) fn extended(
        old: Option<&Matcher>,
        patterns: Vec<Pattern>,
    ) -> Result<(Matcher, usize, Option<MergeFailure>), BuildError> {
        let (mut levels, filter, mut first, mut bytes, longest) = match old {
            Some(m) => (
                m.levels.clone(),
                m.filter.extended(&patterns)?,
                m.first,
                m.bytes,
                m.longest,
            ),
            None => (
                Vec::new(),
                Prefilter::default().extended(&patterns)?,
                [false; 256],
                [false; 256],
                0,
            ),
        };
        for p in &patterns {
            if let Some(&b) = p.first() {
                first[usize::from(b)] = true;
            }
            for &b in p.iter() {
                bytes[usize::from(b)] = true;
            }
        }
        let longest = longest.max(patterns.iter().map(|p| p.len()).max().unwrap_or(0));
        let mut compiled = patterns.len();
        let mut merge_failure = None;
        levels.push(Arc::new(Level::build(patterns, false)?));
        while let [.., before, last] = levels.as_slice()
            && before.patterns.len() < 2 * last.patterns.len()
        {
            let merged: Vec<Pattern> = before
                .patterns
                .iter()
                .chain(&last.patterns)
                .cloned()
                .collect();
            let size = merged.len();
            match Level::build(merged, true) {
                Ok(level) => {
                    levels.truncate(levels.len() - 2);
                    levels.push(Arc::new(level));
                    compiled += size;
                }
                Err(error) => {
                    merge_failure = Some(MergeFailure {
                        error,
                        patterns: size,
                    });
                    break;
                }
            }
        }
        Ok((
            Matcher {
                levels,
                filter,
                first,
                bytes,
                longest,
            },
            compiled,
            merge_failure,
        ))
    }

    /// How many levels there are (the tests).
    #[cfg(test)]
    pub(super) fn levels(&self) -> usize {
        self.levels.len()
    }

    /// The windows of `hay` where an occurrence may be, sorted and merged.
    fn merged_windows(&self, hay: &[u8]) -> Vec<(usize, usize)> {
        let mut windows = Vec::new();
        self.filter.windows(hay, self.longest, &mut windows);
        if windows.is_empty() {
            return windows;
        }
        windows.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(windows.len());
        for (s, e) in windows {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        merged
    }

    /// Whether `hay` holds an occurrence of a pattern (raw bytes only).
    pub(super) fn is_match(&self, hay: &[u8]) -> bool {
        self.merged_windows(hay)
            .into_iter()
            .any(|(ws, we)| self.levels.iter().any(|l| l.is_match(&hay[ws..we])))
    }

    /// Length of the longest suffix of `buf` (shorter than the longest
    /// pattern) that is the beginning of some pattern: the bytes a stream
    /// must hold back, since the next read may complete a secret there. At
    /// the end of a line this is almost always 0, so output is not delayed.
    pub(super) fn pending_prefix(&self, buf: &[u8]) -> usize {
        let window = buf.len().min(self.longest.saturating_sub(1));
        for p in buf.len() - window..buf.len() {
            if !self.first[usize::from(buf[p])] {
                continue;
            }
            for level in &self.levels {
                match level.begins_a_pattern(&buf[p..]) {
                    Ok(false) => {}
                    Ok(true) => return buf.len() - p,
                    Err(()) => return window, // cannot check: hold the whole window
                }
            }
        }
        0
    }
}

/// Every match of `m` in `hay`, as `(start, end)` sorted by start.
pub(super) fn matches_into(m: &Matcher, hay: &[u8], out: &mut Vec<(usize, usize)>) {
    out.clear();
    for (ws, we) in m.merged_windows(hay) {
        for level in &m.levels {
            level.occurrences(&hay[ws..we], ws, out);
        }
    }
    out.sort_unstable();
}
