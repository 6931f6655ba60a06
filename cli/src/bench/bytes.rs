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
