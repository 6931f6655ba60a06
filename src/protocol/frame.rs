//! Record framing inside a segment.
//!
//! Every frame starts at an 8-byte aligned offset with an 8-byte header, little endian:
//! `len: u32` (payload bytes of this frame) then `kind: u32`. The payload follows; the next
//! frame starts at the next multiple of 8, so a reader can view a `Pod` payload in place.
//!
//! A record that fits in one segment (`8 + len <= segment_size`) is one `WHOLE` frame and never
//! spans: if it does not fit in what is left, the producer seals the segment and starts the
//! next. A larger record is a `FIRST` frame that fills its segment to the end, `MIDDLE` frames
//! that fill whole segments, and a `LAST` frame at the start of a segment. `ABORT` (at the start
//! of a segment, or in place of the frame that was being written) ends a spanning record that
//! the producer gave up; the reader reports [`crate::RecvError::RecordAborted`] for it.
//!
//! `EVENT` frames carry in-band events between records (see [`crate::Event`]). A `SEAL` frame
//! (length 0) ends a segment that the producer leaves before its end; a segment filled to its
//! last byte needs none.
//!
//! **The header is the commit.** A header word is never 0 (every kind is non-zero), and the
//! word just past the last published frame is always 0: the producer zeroes word 0 of a
//! segment before handing it over, and before each publication it zeroes the word at its
//! write position and then stores the header of the first frame not yet published with
//! Release. Frames written after that first one keep plain headers until then: the consumer
//! cannot reach them, because it stops at the first 0 it loads (with Acquire). So one Release
//! store publishes any number of frames, and a consumer waiting for the next frame polls the
//! very line it will read.
//!
//! Kinds carry a tag in their upper half so that garbage is unlikely to parse as a frame.

pub(crate) const HEADER: usize = crate::protocol::abi::FRAME_HEADER;

pub(crate) const WHOLE: u32 = 0x5346_0001;
pub(crate) const FIRST: u32 = 0x5346_0002;
pub(crate) const MIDDLE: u32 = 0x5346_0003;
pub(crate) const LAST: u32 = 0x5346_0004;
pub(crate) const ABORT: u32 = 0x5346_0005;
/// An in-band event: payload is `kind: u32`, 4 bytes of zero, then the event's own bytes. It
/// never spans and sits between records like a `WHOLE` frame.
pub(crate) const EVENT: u32 = 0x5346_0006;
/// Ends a segment before its last byte: the producer moved on to the next segment.
pub(crate) const SEAL: u32 = 0x5346_0007;

#[inline]
pub(crate) const fn align8(x: usize) -> usize {
    (x + 7) & !7
}

#[inline(always)]
const fn align8_u64(x: u64) -> u64 {
    (x + 7) & !7
}

#[inline]
pub(crate) fn encode(len: u32, kind: u32) -> u64 {
    ((kind as u64) << 32) | len as u64
}

/// `(len, kind)`.
#[inline]
pub(crate) fn decode(word: u64) -> (u32, u32) {
    (word as u32, (word >> 32) as u32)
}

/// Offset just past a frame of `len` payload bytes that starts at `at`.
#[inline]
pub(crate) const fn next_frame(at: usize, len: usize) -> usize {
    align8(at + HEADER + len)
}

/// The readers' fast check of the frame at `at` of a segment of `seg_size` bytes, whose header
/// word is `word`: `Some((len, next))` if it is a `WHOLE` frame of at most `max` payload bytes
/// that ends within the segment (`next`, just past it, is at most `seg_size`). Anything else is
/// `None`, for the full check (`parse`), which names what is wrong.
///
/// Needs `at` 8-aligned with `at + 8 <= seg_size`, and `seg_size` a multiple of 8 (a
/// `Geometry` is validated as a multiple of 64).
///
/// One subtraction tests the kind and the length together: the kind is the word's upper half,
/// so a word of any other kind lands at `2^32` or beyond (a larger kind) or wraps past `2^63`
/// (a smaller one), above every `max`; for a `WHOLE` word it leaves the length. And with both
/// `at + 8` and `seg_size` multiples of 8, `align8(at + 8 + len) <= seg_size` exactly when
/// `at + 8 + len <= seg_size`: the frame's end is tested on the next frame's offset, which the
/// reader needs anyway.
#[inline(always)]
pub(crate) fn whole_fast(
    word: u64,
    at: usize,
    seg_size: usize,
    max: u32,
) -> Option<(usize, usize)> {
    debug_assert!(at % 8 == 0 && at + HEADER <= seg_size && seg_size % 8 == 0);
    let len = word.wrapping_sub((WHOLE as u64) << 32);
    if len > max as u64 {
        return None;
    }
    // In `u64`, whatever `usize` is: no sum wraps (`at` < 2^30, `len` <= u32::MAX).
    let next = align8_u64(at as u64 + HEADER as u64 + len);
    if next > seg_size as u64 {
        return None;
    }
    // (Both within the segment now, so they fit a `usize`.)
    Some((len as usize, next as usize))
}

/// A published frame header, checked against its place in the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Checked {
    pub(crate) len: usize,
    pub(crate) kind: u32,
}

/// Why a header cannot be where it is: the field, what was expected, what was found.
#[derive(Debug)]
pub(crate) struct Violation {
    pub(crate) field: &'static str,
    pub(crate) expected: String,
    pub(crate) found: u64,
}

fn violation(field: &'static str, expected: impl Into<String>, found: u64) -> Violation {
    Violation {
        field,
        expected: expected.into(),
        found,
    }
}

/// Checks the header `word` of a frame at offset `at` (8-aligned, `at + 8 <= seg_size`) of a
/// segment of `seg_size` bytes, `in_span` telling whether a spanning record is open: the
/// length fits in the segment, the kind is one of ours and may stand here. The one check of
/// every frame, whether it was read from shared memory or received from the network.
#[inline]
pub(crate) fn check(
    at: usize,
    word: u64,
    seg_size: usize,
    in_span: bool,
) -> Result<Checked, Violation> {
    // The common case inline (a whole record that fits, outside a spanning one: what
    // `check_all` accepts for it too); every other one, and every error, out of line.
    let (len, kind) = decode(word);
    if kind == WHOLE && !in_span && (len as usize) <= seg_size - at - HEADER {
        return Ok(Checked {
            len: len as usize,
            kind,
        });
    }
    check_all(at, word, seg_size, in_span)
}

#[inline(never)]
fn check_all(at: usize, word: u64, seg_size: usize, in_span: bool) -> Result<Checked, Violation> {
    let (len, kind) = decode(word);
    let len = len as usize;
    let avail = seg_size - at - HEADER;
    if len > avail {
        return Err(violation(
            "frame length",
            format!("at most {avail} (bytes left in the segment)"),
            len as u64,
        ));
    }
    let f = Checked { len, kind };
    let prio = crate::protocol::abi::PRIO_PAYLOAD;
    match kind {
        WHOLE | FIRST | EVENT if in_span => Err(violation(
            "frame kind",
            "MIDDLE, LAST or ABORT inside a spanning record",
            kind as u64,
        )),
        EVENT if len < 8 || len - 8 > prio => Err(violation(
            "event frame length",
            format!("8 to {} bytes", 8 + prio),
            len as u64,
        )),
        MIDDLE | LAST | ABORT if !in_span => Err(violation(
            "frame kind",
            "WHOLE or FIRST outside a spanning record",
            kind as u64,
        )),
        WHOLE | EVENT => Ok(f),
        FIRST | MIDDLE if kind == MIDDLE && at != 0 => Err(violation(
            "spanning part offset",
            "0 (a MIDDLE part starts its segment)",
            at as u64,
        )),
        FIRST | MIDDLE => {
            if next_frame(at, len) != seg_size {
                return Err(violation(
                    "spanning part end",
                    "the end of its segment",
                    next_frame(at, len) as u64,
                ));
            }
            Ok(f)
        }
        SEAL if in_span || len != 0 => Err(violation(
            "seal frame",
            "an empty SEAL outside a spanning record",
            len as u64,
        )),
        SEAL => Ok(f),
        LAST | ABORT if at != 0 => Err(violation(
            "spanning part offset",
            "0 (a LAST or ABORT part starts its segment)",
            at as u64,
        )),
        LAST | ABORT => Ok(f),
        _ => Err(violation(
            "frame kind",
            "a shmflow frame tag (0x5346000N)",
            kind as u64,
        )),
    }
}

/// Whether a spanning record is open after a frame of `kind`, given it was `in_span` before.
/// (Used by the network bridge, feature `net`.)
#[cfg_attr(any(not(feature = "net"), shmflow_loom), allow(dead_code))]
#[inline]
pub(crate) fn span_after(kind: u32, in_span: bool) -> bool {
    match kind {
        FIRST | MIDDLE => true,
        LAST | ABORT => false,
        _ => in_span,
    }
}

/// **The commit**, the one place that publishes frames (the producer's own and those a
/// receiving network bridge writes): `end`, the word just past the last frame written, gets a
/// 0 (the new end of the list; `None` when a SEAL or the segment's end ends it), then `first`,
/// the header slot of the first frame not yet published, gets its header `word` with Release.
///
/// SYNC POINT: this Release store pairs with the consumer's Acquire load of the same header
/// (`poll_frame`, `fast_whole`, `raw_poll`): every byte of every frame written before it, and
/// the 0 after them, is visible to a consumer that loads the header.
#[inline(always)]
pub(crate) fn commit(
    first: &crate::sync::AtomicU64,
    word: u64,
    end: Option<&crate::sync::AtomicU64>,
) {
    use crate::sync::Ordering;
    if let Some(end) = end {
        // Relaxed: ordered before the Release store below.
        end.store(0, Ordering::Relaxed);
    }
    #[cfg(not(shmflow_broken = "commit_relaxed"))]
    first.store(word, Ordering::Release);
    #[cfg(shmflow_broken = "commit_relaxed")]
    first.store(word, Ordering::Relaxed);
}

/// The consumer's half of the commit: the header word at a frame's place, 0 if nothing is
/// published there yet. SYNC POINT: Acquire, pairs with the Release store in [`commit`]: a
/// header that reads non-zero brings every byte of its frame (and the frames before it).
#[inline(always)]
pub(crate) fn load(slot: &crate::sync::AtomicU64) -> u64 {
    slot.load(crate::sync::Ordering::Acquire)
}

/// Empties a segment the producer takes: a 0 in its first header slot ends its (empty) list
/// of frames. Relaxed: published by the Release push of the segment's index on the data ring.
#[inline(always)]
pub(crate) fn clear(first: &crate::sync::AtomicU64) {
    first.store(0, crate::sync::Ordering::Relaxed);
}

/// Writes the header of a frame after the first one not yet published. Relaxed: no consumer
/// reads past the 0 in that first slot until the commit's Release store publishes them all.
#[inline(always)]
pub(crate) fn write_unpublished(slot: &crate::sync::AtomicU64, word: u64) {
    slot.store(word, crate::sync::Ordering::Relaxed);
}

/// Records and payload bytes in a run of frames, counted as they are checked (the figures a
/// producer adds to its counters when it publishes them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(not(feature = "net"), allow(dead_code))]
pub(crate) struct Tally {
    /// Records whose last frame is in the run (`WHOLE` or `LAST`).
    pub(crate) records: u64,
    /// Payload bytes of record frames (events, aborts and seals carry none).
    pub(crate) payload: u64,
}

#[cfg_attr(not(feature = "net"), allow(dead_code))]
impl Tally {
    /// Counts one checked frame.
    #[inline]
    pub(crate) fn add(&mut self, kind: u32, len: usize) {
        match kind {
            WHOLE | LAST => {
                self.records += 1;
                self.payload += len as u64;
            }
            FIRST | MIDDLE => self.payload += len as u64,
            _ => {}
        }
    }

    /// Both runs' counts.
    pub(crate) fn merge(&mut self, other: Tally) {
        self.records += other.records;
        self.payload += other.payload;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_counts_record_ends_and_payload() {
        let mut t = Tally::default();
        for (kind, len) in [(WHOLE, 3), (EVENT, 8), (FIRST, 10), (SEAL, 0)] {
            t.add(kind, len);
        }
        assert_eq!(
            t,
            Tally {
                records: 1,
                payload: 13
            }
        );
        let mut last = Tally::default();
        last.add(LAST, 5);
        t.merge(last);
        assert_eq!(
            t,
            Tally {
                records: 2,
                payload: 18
            }
        );
    }

    /// The check `whole_fast` stands for, term by term: a `WHOLE` kind, a length within
    /// `max`, a frame that ends within the segment.
    fn whole_by_terms(word: u64, at: usize, seg_size: usize, max: u32) -> Option<(usize, usize)> {
        let (len, kind) = decode(word);
        let len = len as usize;
        if kind != WHOLE || len > seg_size - at - HEADER || len > max as usize {
            return None;
        }
        Some((len, next_frame(at, len)))
    }

    #[test]
    fn the_fast_whole_check_accepts_exactly_what_its_terms_accept() {
        let kinds = [
            0,
            1,
            WHOLE - 1,
            WHOLE,
            WHOLE + 1,
            FIRST,
            MIDDLE,
            LAST,
            ABORT,
            EVENT,
            SEAL,
            0x8000_0000,
            u32::MAX,
        ];
        let mut accepted = 0;
        for seg_size in [64usize, 128, 4096] {
            for at in (0..=seg_size - HEADER).step_by(8) {
                let room = (seg_size - at - HEADER) as u32;
                let lens = [
                    0,
                    1,
                    7,
                    8,
                    room.saturating_sub(1),
                    room,
                    room + 1,
                    room + 8,
                    0x7fff_ffff,
                    u32::MAX - 7,
                    u32::MAX,
                ];
                for max in [0u32, 1, 8, room, room + 1, 1 << 20, u32::MAX] {
                    for kind in kinds {
                        for len in lens {
                            let word = encode(len, kind);
                            let fast = whole_fast(word, at, seg_size, max);
                            assert_eq!(
                                fast,
                                whole_by_terms(word, at, seg_size, max),
                                "kind {kind:#x} len {len} at {at} of {seg_size}, max {max}"
                            );
                            accepted += fast.is_some() as usize;
                        }
                    }
                }
            }
        }
        // (Not a vacuous match: many words pass.)
        assert!(accepted > 1000, "{accepted}");
    }

    #[test]
    fn header_round_trip_and_alignment() {
        for len in [0u32, 1, 7, 8, 9, 4087, 4088, u32::MAX] {
            for kind in [WHOLE, FIRST, MIDDLE, LAST, ABORT, EVENT, SEAL] {
                assert_eq!(decode(encode(len, kind)), (len, kind));
            }
        }
        assert_eq!(next_frame(0, 0), 8);
        assert_eq!(next_frame(0, 1), 16);
        assert_eq!(next_frame(8, 8), 24);
        assert_eq!(next_frame(16, 4072), 4096);
    }
}
