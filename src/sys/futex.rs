//! The futex, on a word in shared memory (not `FUTEX_PRIVATE`: the peer is another process
//! mapping the same object). nix does not wrap it, so this is the one `libc::syscall`.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleeps while `word` equals `expected` (checked by the kernel atomically with going to
/// sleep), until woken, a signal, or `timeout`. Spurious returns are allowed: callers re-check.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts;
    let ts_ptr = match timeout {
        Some(d) => {
            ts = libc::timespec {
                tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            };
            &ts as *const libc::timespec
        }
        None => std::ptr::null(),
    };
    // SAFETY: the address is a valid, aligned u32 that lives for the duration of the call (a
    // reference); the kernel only reads the word and the timespec, which outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            ts_ptr,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
    // EAGAIN (value changed), EINTR and ETIMEDOUT all mean "go and look again".
}

/// Wakes every process sleeping on `word`.
pub(crate) fn wake(word: &AtomicU32) {
    // SAFETY: as in `wait`; FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}
