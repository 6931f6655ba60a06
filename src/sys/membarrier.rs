//! membarrier(2), the heavy half of an asymmetric barrier: one call makes every thread of
//! every registered process that is running pass a full memory barrier (the kernel sends them
//! an interrupt; a thread not running passes one when it is scheduled). A thread that issues
//! it pays about a microsecond; the threads it targets pay nothing in their code. nix does not
//! wrap it: `libc::syscall`.

use std::sync::OnceLock;

const CMD_QUERY: libc::c_int = 0;
const CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
const CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;

fn call(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes no pointers; an unknown command fails with EINVAL.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_uint,
            0 as libc::c_int,
        )
    }
}

/// Registers this process as a target of [`global_expedited`] (once per process). False if
/// the kernel does not have it or the call is refused (a seccomp filter, say).
pub(crate) fn register() -> bool {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        let supported = call(CMD_QUERY);
        let both = CMD_GLOBAL_EXPEDITED | CMD_REGISTER_GLOBAL_EXPEDITED;
        supported >= 0
            && supported as libc::c_int & both == both
            && call(CMD_REGISTER_GLOBAL_EXPEDITED) == 0
    })
}

/// A full barrier in every running thread of every registered process. False if it could not
/// be issued.
pub(crate) fn global_expedited() -> bool {
    call(CMD_GLOBAL_EXPEDITED) == 0
}
