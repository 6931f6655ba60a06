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
