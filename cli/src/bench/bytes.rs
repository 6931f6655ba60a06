//! What a stream's two sides do with a record's bytes, shared by `shmflow bench` and the raw
//! ring's own binary (`src/bin/shmflow-raw-ring.rs` includes this file): the record a sending
//! loop copies, starting on a cache line, and the sum a reading loop takes of every byte. One
//! source for both, so that the floor and shmflow's streams copy and read alike.

/// `len` bytes of 0x5A starting on a cache line: where a copy's source starts within a line
/// changes what the copy costs (a load that crosses a line), so every sending loop copies
/// from the same place in a line, whatever the heap put before it.
pub(crate) struct LineBuf {
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl LineBuf {
    pub(crate) fn new(len: usize) -> LineBuf {
        let buf = vec![0x5Au8; len + 63];
        let at = (64 - buf.as_ptr() as usize % 64) % 64;
        LineBuf { buf, at, len }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.len]
    }
}

/// The wrapping sum of `b`'s 8-byte words (and of its last bytes): every byte read.
pub(crate) fn touch(b: &[u8]) -> u64 {
    let mut s = 0u64;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        s = s.wrapping_add(u64::from_le_bytes(c.try_into().unwrap()));
    }
    for &x in chunks.remainder() {
        s = s.wrapping_add(x as u64);
    }
    s
}

/// A fingerprint of the raw ring's sources (its binary's file and this one), computed into
/// both `shmflow` and `shmflow-raw-ring` (which prints it: `shmflow-raw-ring source`), so that
/// the bench refuses a ring built from other sources — one an older build left beside a newer
/// `shmflow` — rather than hold its streams against it. (A different compiler is not seen.)
pub(crate) const RING_SOURCES: u64 = fnv1a(
    include_bytes!("../bin/shmflow-raw-ring.rs"),
    fnv1a(include_bytes!("bytes.rs"), 0xcbf2_9ce4_8422_2325),
);

/// 64-bit FNV-1a of `bytes`, from `hash`.
const fn fnv1a(bytes: &[u8], mut hash: u64) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}
