//! The region layer: creating, opening, validating and mapping the shared-memory objects of
//! channels and gates, the typed view of a mapped region, the liveness locks of its ends and
//! the hand-off of anonymous regions to child processes.

#[cfg(any(feature = "tokio", shmflow_loom))]
pub(crate) mod bridge;
#[cfg(not(shmflow_loom))]
pub(crate) mod handoff;
#[cfg(shmflow_loom)]
pub(crate) mod heap;
#[cfg(shmflow_loom)]
pub(crate) mod heap_handoff;
// Under loom the handles are the heap regions'.
#[cfg(shmflow_loom)]
pub(crate) use heap_handoff as handoff;
pub(crate) mod liveness;
#[cfg(not(shmflow_loom))]
pub(crate) mod name;
#[cfg(not(shmflow_loom))]
pub(crate) mod object;
pub(crate) mod os;
pub(crate) mod view;
