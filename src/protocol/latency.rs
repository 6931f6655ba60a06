//! Latency markers (Flink's `metrics.latency.interval`): how a marker is carried, and the table
//! of their ages that a consumer (or a gate) keeps in its region, per source, for other
//! processes to read (`shmflow stat`, `top`, `export`).
//!
//! **On the wire.** A marker is an `EVENT` frame whose kind word has [`TAG`] in its high half
//! (an ordinary event leaves it 0, a barrier has its own tag), then the emitter's wall clock
//! in nanoseconds (`CLOCK_REALTIME`, as Flink uses the wall clock: exact between processes of
//! one machine, off by the clocks' skew between machines), then the source's label, 0 to
//! [`MAX_LABEL`] bytes. It travels in band like a record, so whatever forwards events (the
//! network bridges) forwards markers unchanged.
//!
//! **The table.** [`SOURCES`] slots after the region's segments, each a source's label, its
//! count, sum and largest age, and a histogram of [`BUCKETS`] log-linear buckets (HdrHistogram's
//! layout with 32 sub-buckets per power of two: every bucket is at most 1/32 of its values
//! wide, from 1 ns up to 2^36 ns, about 69 s; longer ages count in the last bucket). The
//! consumer is its only writer (plain Relaxed stores); readers see each counter whole, and a
//! histogram and a count that may differ by the markers counted while they read (quantiles
//! are taken from the buckets' own total). A marker from a source beyond the first
//! `SOURCES - 1` counts in the last slot, labelled [`OTHERS`].

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The high half of a latency marker's kind word ("MRKR").
pub(crate) const TAG: u32 = 0x4d52_4b52;
/// The most bytes of a source's label.
pub(crate) const MAX_LABEL: usize = 32;
/// Bytes of a marker's body before its label: the emitter's wall clock.
pub(crate) const HEAD: usize = 8;
/// Slots of a latency table: sources told apart.
pub(crate) const SOURCES: usize = 8;
/// Buckets of each source's histogram.
pub(crate) const BUCKETS: usize = 1024;
/// The label of the last slot once every other slot is taken.
pub(crate) const OTHERS: &str = "(other sources)";
/// Sub-buckets per power of two: the histogram's precision (1/32 of a value).
const SUB: usize = 32;

/// A label as the table keeps it: zero-padded words.
pub(crate) type Label = [u64; MAX_LABEL / 8];

/// The kind word of a marker frame.
pub(crate) const fn marker_word() -> u64 {
    (TAG as u64) << 32
}

/// A marker's body (after the kind word): the wall clock, then the label.
pub(crate) fn encode(emitted_ns: u64, label: &[u8]) -> ([u8; HEAD + MAX_LABEL], usize) {
    let mut b = [0u8; HEAD + MAX_LABEL];
    let n = label.len().min(MAX_LABEL);
    b[..HEAD].copy_from_slice(&emitted_ns.to_le_bytes());
    b[HEAD..HEAD + n].copy_from_slice(&label[..n]);
    (b, HEAD + n)
}

/// A marker's body: the emitter's clock and the label, or `None` if it is not one.
pub(crate) fn decode(body: &[u8]) -> Option<(u64, &[u8])> {
    if body.len() < HEAD || body.len() > HEAD + MAX_LABEL {
        return None;
    }
    let emitted = u64::from_le_bytes(body[..HEAD].try_into().expect("8 bytes"));
    Some((emitted, &body[HEAD..]))
}

/// The bucket of an age of `ns` nanoseconds.
pub(crate) fn bucket(ns: u64) -> usize {
    if ns < SUB as u64 {
        return ns as usize;
    }
    // The power of two below `ns`, at least 2^5; its 32 sub-buckets are 2^(e-5) wide.
    let e = 63 - ns.leading_zeros() as usize;
    let i = SUB + (e - 5) * SUB + ((ns >> (e - 5)) as usize & (SUB - 1));
    i.min(BUCKETS - 1)
}

/// The smallest age in bucket `i`.
pub(crate) fn bucket_low(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let e = (i - SUB) / SUB + 5;
    let sub = ((i - SUB) % SUB) as u64;
    (SUB as u64 + sub) << (e - 5)
}

/// The largest age in the bucket whose smallest age is `low`.
pub(crate) fn bucket_high(low: u64) -> u64 {
    let i = bucket(low);
    if i + 1 >= BUCKETS {
        return u64::MAX;
    }
    bucket_low(i + 1) - 1
}

/// One source's figures.
#[repr(C)]
pub(crate) struct Slot {
    /// The label, zero-padded; all zero: the slot is free.
    pub(crate) label: [AtomicU64; MAX_LABEL / 8],
    pub(crate) count: AtomicU64,
    pub(crate) sum_ns: AtomicU64,
    pub(crate) max_ns: AtomicU64,
    /// The age of the last marker.
    pub(crate) last_ns: AtomicU64,
    pub(crate) buckets: [AtomicU32; BUCKETS],
}

/// The latency table of a region (see the module docs).
#[repr(C)]
pub(crate) struct Table {
    pub(crate) slots: [Slot; SOURCES],
}

/// Bytes the table takes in a region: whole pages.
pub(crate) const TABLE_BYTES: usize = std::mem::size_of::<Table>().div_ceil(4096) * 4096;

/// What one slot says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Read {
    pub(crate) label: Vec<u8>,
    pub(crate) count: u64,
    pub(crate) sum_ns: u64,
    pub(crate) max_ns: u64,
    pub(crate) last_ns: u64,
    /// `(the smallest age of the bucket, markers in it)` for every bucket that has any.
    pub(crate) buckets: Vec<(u64, u64)>,
}

fn padded(label: &[u8]) -> Label {
    let mut b = [0u8; MAX_LABEL];
    let n = label.len().min(MAX_LABEL);
    b[..n].copy_from_slice(&label[..n]);
    let mut w: Label = [0; MAX_LABEL / 8];
    for (i, word) in w.iter_mut().enumerate() {
        *word = u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    }
    w
}

impl Slot {
    fn label_words(&self) -> Label {
        // Relaxed: a statistic (see `Table::record`).
        std::array::from_fn(|i| self.label[i].load(Ordering::Relaxed))
    }

    fn read(&self) -> Read {
        let words = self.label_words();
        let mut label: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        while label.last() == Some(&0) {
            label.pop();
        }
        Read {
            label,
            count: self.count.load(Ordering::Relaxed),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
            max_ns: self.max_ns.load(Ordering::Relaxed),
            last_ns: self.last_ns.load(Ordering::Relaxed),
            buckets: self
                .buckets
                .iter()
                .enumerate()
                .filter_map(|(i, b)| {
                    let n = b.load(Ordering::Relaxed);
                    (n > 0).then(|| (bucket_low(i), n as u64))
                })
                .collect(),
        }
    }
}

impl Table {
    /// The consumer (the table's only writer): the slot of `label`, taken if it is new (the
    /// last slot takes every source once the others are taken). `cache`: the consumer's own
    /// record of the labels it gave slots, so that the table is read only for a new source.
    pub(crate) fn slot_of(&self, label: &[u8], cache: &mut Vec<Label>) -> usize {
        let words = padded(label);
        if let Some(i) = cache.iter().position(|w| *w == words) {
            return i;
        }
        // A table this consumer did not fill (none of its own yet: a fresh region) or one it
        // filled: its slots are the cache's, in order.
        let i = cache.len();
        if i + 1 >= SOURCES {
            if i + 1 == SOURCES {
                let others = padded(OTHERS.as_bytes());
                for (w, v) in self.slots[SOURCES - 1].label.iter().zip(others) {
                    // Relaxed: a statistic, written by this end alone.
                    w.store(v, Ordering::Relaxed);
                }
                cache.push(others);
            }
            return SOURCES - 1;
        }
        for (w, v) in self.slots[i].label.iter().zip(words) {
            // Relaxed: as above.
            w.store(v, Ordering::Relaxed);
        }
        cache.push(words);
        i
    }

    /// The consumer: a marker of age `age_ns` from the source of slot `i`.
    pub(crate) fn record(&self, i: usize, age_ns: u64) {
        let s = &self.slots[i.min(SOURCES - 1)];
        // Relaxed loads and stores, no read-modify-write: this end is the only writer, and the
        // figures order nothing (readers take them as statistics).
        let b = &s.buckets[bucket(age_ns)];
        b.store(
            b.load(Ordering::Relaxed).saturating_add(1),
            Ordering::Relaxed,
        );
        let bump = |a: &AtomicU64, v: u64| {
            a.store(a.load(Ordering::Relaxed).wrapping_add(v), Ordering::Relaxed)
        };
        bump(&s.sum_ns, age_ns);
        if age_ns > s.max_ns.load(Ordering::Relaxed) {
            s.max_ns.store(age_ns, Ordering::Relaxed);
        }
        s.last_ns.store(age_ns, Ordering::Relaxed);
        bump(&s.count, 1);
    }

    /// Every slot in use, as it stands (Relaxed: statistics).
    pub(crate) fn read(&self) -> Vec<Read> {
        self.slots
            .iter()
            .filter(|s| {
                s.label_words() != [0; MAX_LABEL / 8] || s.count.load(Ordering::Relaxed) > 0
            })
            .map(Slot::read)
            .collect()
    }
}

#[cfg(all(test, not(shmflow_loom)))]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_at_most_a_32nd_of_their_values_wide_and_in_order() {
        let mut last = 0;
        for i in 0..BUCKETS {
            let low = bucket_low(i);
            assert_eq!(bucket(low), i, "bucket {i} starts at {low}");
            if i > 0 {
                assert!(low > last);
                let width = low - last;
                assert!(
                    width * 32 <= last.max(32),
                    "bucket {} is {width} wide at {last}",
                    i - 1
                );
            }
            last = low;
        }
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(31), 31);
        assert_eq!(bucket(1_000_000), bucket(1_000_000 + 1_000_000 / 64));
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert!(
            bucket_low(BUCKETS - 1) > 60_000_000_000,
            "reaches past a minute"
        );
    }

    #[test]
    fn a_marker_round_trips_and_bad_bodies_are_refused() {
        let (b, n) = encode(123_456, b"read-0");
        assert_eq!(decode(&b[..n]), Some((123_456, &b"read-0"[..])));
        let (b, n) = encode(7, &[b'x'; 40]);
        assert_eq!(n, HEAD + MAX_LABEL, "a long label is cut");
        assert_eq!(decode(&b[..n]).unwrap().1.len(), MAX_LABEL);
        assert_eq!(decode(&[0; 7]), None);
        assert_eq!(decode(&[0; HEAD + MAX_LABEL + 1]), None);
    }

    #[test]
    fn sources_get_slots_and_the_last_one_takes_the_rest() {
        let t: Box<Table> = Box::new(zeroed_table());
        let mut cache = Vec::new();
        for s in 0..SOURCES + 3 {
            let i = t.slot_of(format!("source-{s}").as_bytes(), &mut cache);
            assert_eq!(i, s.min(SOURCES - 1));
            t.record(i, 1_000 * (s as u64 + 1));
        }
        assert_eq!(
            t.slot_of(b"source-2", &mut cache),
            2,
            "known: the same slot"
        );
        let read = t.read();
        assert_eq!(read.len(), SOURCES);
        assert_eq!(read[2].label, b"source-2");
        assert_eq!(
            (read[2].count, read[2].sum_ns, read[2].max_ns),
            (1, 3_000, 3_000)
        );
        assert_eq!(read[SOURCES - 1].label, OTHERS.as_bytes());
        assert_eq!(
            read[SOURCES - 1].count,
            4,
            "the eighth source and three more"
        );
        assert_eq!(read[0].buckets, vec![(bucket_low(bucket(1_000)), 1)]);
    }

    /// A zeroed table, as a fresh region holds one.
    fn zeroed_table() -> Table {
        // SAFETY: every field is an atomic integer, for which all-zero bytes are valid.
        unsafe { std::mem::zeroed() }
    }
}
