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

/// How a [`waitv`] ended.
#[cfg(feature = "tokio")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waitv {
    /// Woken, a word differed from its expected value, a signal, or the timeout: look again.
    Returned,
    /// The call cannot be made (no `futex_waitv` before Linux 5.16, a seccomp filter refusing
    /// it): wait another way.
    Unsupported,
}

/// Most words one `futex_waitv` call can wait on (`FUTEX_WAITV_MAX`).
#[cfg(feature = "tokio")]
const WAITV_MAX: usize = 128;

/// `struct futex_waitv` of `<linux/futex.h>`.
#[cfg(feature = "tokio")]
#[repr(C)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

/// `FUTEX2_SIZE_U32`, and no `FUTEX2_PRIVATE`: the words are keyed as `FUTEX_WAIT` keys them
/// (shared), so a `wake` on any of them wakes this wait.
#[cfg(feature = "tokio")]
const FUTEX2_SIZE_U32: u32 = 0x02;

/// Sleeps until one of `words` (addresses of u32s) is woken, or differs from its expected
/// value when the kernel looks (atomically with going to sleep), or `timeout` passes. At most
/// [`WAITV_MAX`] words (those after are not waited on). Spurious returns are allowed: callers
/// re-check every word.
///
/// The addresses are only handed to the kernel, never dereferenced here: one whose memory was
/// unmapped makes the call fail (`EFAULT`, a spurious return), and one that was mapped again
/// to something else is merely compared, so that at worst the caller sleeps until another word
/// wakes it or the timeout.
#[cfg(feature = "tokio")]
pub(crate) fn waitv(words: &[(*const AtomicU32, u32)], timeout: Option<Duration>) -> Waitv {
    let list: Vec<FutexWaitv> = words
        .iter()
        .take(WAITV_MAX)
        .map(|(w, v)| FutexWaitv {
            val: *v as u64,
            uaddr: *w as usize as u64,
            flags: FUTEX2_SIZE_U32,
            reserved: 0,
        })
        .collect();
    // futex_waitv takes an absolute CLOCK_MONOTONIC time.
    let ts;
    let ts_ptr = match timeout.and_then(|d| {
        let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).ok()?;
        let secs = (now.tv_sec() as u64).checked_add(d.as_secs())?;
        let mut nanos = now.tv_nsec() as u64 + d.subsec_nanos() as u64;
        let secs = secs.checked_add(nanos / 1_000_000_000)?;
        nanos %= 1_000_000_000;
        Some((secs.min(i64::MAX as u64), nanos))
    }) {
        Some((secs, nanos)) => {
            ts = libc::timespec {
                tv_sec: secs as libc::time_t,
                tv_nsec: nanos as libc::c_long,
            };
            &ts as *const libc::timespec
        }
        None => std::ptr::null(),
    };
    // SAFETY: `list` holds `list.len()` initialized `futex_waitv` entries and outlives the
    // call, as does the timespec; the kernel reads the words at their addresses itself and
    // fails cleanly on one that is not mapped (see above): nothing in this process is written.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex_waitv,
            list.as_ptr(),
            list.len() as libc::c_uint,
            0u32,
            ts_ptr,
            libc::CLOCK_MONOTONIC,
        )
    };
    if r >= 0 {
        return Waitv::Returned;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        // A value differed, a signal, the timeout, or an address whose mapping went away
        // (the caller drops such a word before it calls again): "look again".
        Some(libc::EAGAIN | libc::EINTR | libc::ETIMEDOUT | libc::EFAULT) => Waitv::Returned,
        // ENOSYS (before Linux 5.16), EPERM (a seccomp filter), or anything else that would
        // fail again at once: the caller must not call it in a loop.
        _ => Waitv::Unsupported,
    }
}
