//! Handlers that run around `fork` (`pthread_atfork`): a lock a background thread takes must
//! not be copied into a child while held, and a child has no copy of the parent's threads.

use std::io;

/// Registers `prepare` (run in the forking thread before the fork), `parent` (in the parent
/// after it) and `child` (in the child after it, its only thread). They run at every `fork`
/// of the process from then on, including a language runtime's (Python's `os.fork`), and
/// cannot be removed; not at `vfork`, `posix_spawn` (Rust's `Command`), `clone` or `_Fork`. `child` must do only what is safe in a child of a threaded process
/// (atomic stores, unlocking what `prepare` locked).
pub(crate) fn at_fork(
    prepare: extern "C" fn(),
    parent: extern "C" fn(),
    child: extern "C" fn(),
) -> io::Result<()> {
    // SAFETY: the three are plain `extern "C"` functions of no arguments, valid for the
    // process's lifetime (they are `fn` items); `pthread_atfork` only records them.
    let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}
