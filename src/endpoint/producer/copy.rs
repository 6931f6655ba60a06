//! The copy of a record's bytes into its segment, tuned for small records.

/// Copies `src` to `dst`: up to 64 bytes inline, as two overlapping unaligned loads and stores
/// of the widest integer that fits. The length is often known only at run time here (an
/// async sender's future keeps it in memory), and a call into the C library's copy for a few
/// dozen bytes costs more than the copy.
///
/// # Safety
/// `dst` is valid for `src.len()` bytes of writes and does not overlap `src`.
#[inline(always)]
pub(super) unsafe fn copy_record(src: &[u8], dst: *mut u8) {
    /// Copies `[0, w)` and `[len - w, len)`, `w` being `T`'s size.
    ///
    /// # Safety
    /// `size_of::<T>() <= len`, and both buffers are valid for `len` bytes.
    #[inline(always)]
    unsafe fn ends<T: Copy>(src: *const u8, dst: *mut u8, len: usize) {
        let w = std::mem::size_of::<T>();
        // SAFETY: `w <= len` (the caller's contract), so both ranges are in bounds of both
        // buffers; unaligned reads and writes of plain integers.
        unsafe {
            let a = std::ptr::read_unaligned(src as *const T);
            let b = std::ptr::read_unaligned(src.add(len - w) as *const T);
            std::ptr::write_unaligned(dst as *mut T, a);
            std::ptr::write_unaligned(dst.add(len - w) as *mut T, b);
        }
    }
    let (s, len) = (src.as_ptr(), src.len());
    // SAFETY: each arm's width is at most `len`; the caller's contract covers `dst`.
    unsafe {
        match len {
            33..=64 => ends::<[u128; 2]>(s, dst, len),
            17..=32 => ends::<u128>(s, dst, len),
            8..=16 => ends::<u64>(s, dst, len),
            _ => std::ptr::copy_nonoverlapping(s, dst, len),
        }
    }
}

#[cfg(all(test, not(shmflow_loom)))]
mod copy_tests {
    /// Every length up to past the widest arm: the bytes land where they belong and nothing
    /// after them is touched.
    #[test]
    fn copy_record_copies_exactly_len_bytes() {
        for len in 0..=80usize {
            let src: Vec<u8> = (0..len).map(|i| i as u8 ^ 0xA5).collect();
            let mut dst = [0xEEu8; 96];
            // SAFETY: `dst` holds 96 >= `len` bytes and is not `src`.
            unsafe { super::copy_record(&src, dst.as_mut_ptr()) };
            assert_eq!(&dst[..len], &src[..], "length {len}");
            assert!(
                dst[len..].iter().all(|&b| b == 0xEE),
                "length {len}: wrote past the end"
            );
        }
    }
}
