//! The endpoint layer: what users hold. The producer and consumer of a channel, records,
//! events, the gate over many channels, partitioned output, read-only monitors and metrics.

pub(crate) mod builder;
pub(crate) mod consumer;
pub(crate) mod event;
#[cfg(not(shmflow_loom))]
pub(crate) mod flusher;
pub(crate) mod gate;
pub(crate) mod gate_stats;
pub(crate) mod markers;
pub(crate) mod metrics;
#[cfg(not(shmflow_loom))]
pub(crate) mod monitor;
#[cfg(all(feature = "net", not(shmflow_loom)))]
pub(crate) mod owed;
pub(crate) mod partition;
pub(crate) mod producer;
#[cfg(all(feature = "net", not(shmflow_loom)))]
pub(crate) mod remote;
#[cfg(any(feature = "tokio", shmflow_loom))]
pub(crate) mod waiting;

/// A number no other end of this process has had: what a hold or a detached claim names its
/// end by (an address could be reused by a later end).
pub(crate) fn next_end_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    // Relaxed: only uniqueness is asked for; nothing is published through it.
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
