//! The system layer: every Linux call shmflow makes, as safe functions. Nothing outside this
//! module makes a system call through `unsafe`; the calls go through `nix` where it wraps them
//! (the futex and membarrier, which nix does not wrap, go through `libc::syscall` here). Errors are plain
//! `io::Error`s: the layers above say which region and what they were doing.

// Under loom the regions live on the heap: most system calls go unused there.
#![cfg_attr(shmflow_loom, allow(dead_code))]

pub(crate) mod bell;
pub(crate) mod clock;
pub(crate) mod cpu;
pub(crate) mod fd;
pub(crate) mod fork;
pub(crate) mod futex;
pub(crate) mod lock;
pub(crate) mod mem;
pub(crate) mod membarrier;
pub(crate) mod shm;
#[cfg(feature = "net")]
pub(crate) mod sock;

/// A nix error as an `io::Error` (nix's `Errno` is the OS error number).
pub(crate) fn io(e: nix::errno::Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}
