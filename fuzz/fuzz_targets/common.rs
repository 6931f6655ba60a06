//! Helpers shared by the fuzz targets.

/// Every part of `r` that is there now, never waiting: a blocking read of a record whose
/// producer stalls half-way would wait for it, as documented (the `try_`/`_timeout` forms
/// bound it).
pub fn read_parts(mut r: shmflow::Record<'_>) {
    while let Ok(Some(part)) = r.try_next_part() {
        let _ = part.iter().map(|&b| u64::from(b)).sum::<u64>();
    }
}

/// Applies `patches`, a list of 10-byte `(offset u16 × 8, value u64)` patches, to `map`:
/// offsets are spread over the whole region, 8-byte aligned like every field.
pub fn apply_patches(map: &mut [u8], patches: &[u8]) {
    let len = map.len();
    for patch in patches.chunks_exact(10) {
        let off = (u16::from_le_bytes([patch[0], patch[1]]) as usize * 8) % (len - 8);
        map[off..off + 8].copy_from_slice(&patch[2..10]);
    }
}
