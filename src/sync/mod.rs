//! The one place that chooses between std and loom (the way tokio's `src/loom/` does).
//!
//! Everything concurrent in shmflow — ring cursors, frame headers, park words, spin
//! hints, the futex and the tracking of segment bytes — goes through this module, so the loom
//! models in `src/loom_models/` drive exactly the code that runs in production, over a region that
//! lives on the heap instead of in a mapping.

#[cfg(not(shmflow_loom))]
mod real;
#[cfg(not(shmflow_loom))]
pub(crate) use real::*;

#[cfg(shmflow_loom)]
mod model;
#[cfg(shmflow_loom)]
pub(crate) use model::*;

pub(crate) use core::sync::atomic::Ordering;
