//! The protocol layer: the shared-memory ABI (every `repr(C)` structure of a region), record
//! framing, the ends' attach states, the SPSC ring, park/wake, the priority lane, the counters,
//! the header's figures (their typed writers and readers) and the floating-segment pool. No OS
//! dependency: atomics and the futex word come from `crate::sync`, which the loom models swap
//! for loom's, and every wait or wake-up that needs the operating system goes through the
//! `sync::Os` it is given (`region::os::Host`).

pub(crate) mod abi;
pub(crate) mod barrier;
pub(crate) mod counters;
pub(crate) mod debloat;
pub(crate) mod ends;
pub(crate) mod figures;
pub(crate) mod flush_signal;
pub(crate) mod frame;
pub(crate) mod lane;
pub(crate) mod latency;
pub(crate) mod park;
pub(crate) mod pool;
pub(crate) mod ring;
