//! The native part of the `shmflow` Python package (`shmflow._shmflow`): producers and
//! consumers of shmflow channels, records as memoryviews of shared memory. The package's
//! `__init__.py` re-exports it with the exception classes of `_errors.py`.

use std::os::fd::{BorrowedFd, IntoRawFd};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

mod aio;
mod consumer;
mod errors;
mod gate;
mod partition;
mod producer;
mod view;
mod wait;

/// A geometry from Python's arguments (checked again, with the library's message, when the
/// channel is made).
fn geometry(segment_size: usize, segment_count: usize) -> PyResult<shmflow::Geometry> {
    let size = u32::try_from(segment_size)
        .map_err(|_| PyValueError::new_err(format!("segment_size {segment_size} is too large")))?;
    let count = u32::try_from(segment_count).map_err(|_| {
        PyValueError::new_err(format!("segment_count {segment_count} is too large"))
    })?;
    Ok(shmflow::Geometry {
        segment_size: size,
        segment_count: count,
    })
}

/// The descriptor of an anonymous channel's handle, as a number Python owns.
fn handle_fd(handle: shmflow::PeerHandle) -> i32 {
    handle.into_fd().into_raw_fd()
}

/// Calls `open` with the descriptor `fd` (not taken over: the caller still owns it).
fn with_fd<T>(
    py: Python<'_>,
    fd: i32,
    open: impl FnOnce(BorrowedFd<'_>) -> Result<T, shmflow::OpenError>,
) -> PyResult<T> {
    if fd < 0 {
        return Err(PyValueError::new_err(format!(
            "{fd} is not a file descriptor"
        )));
    }
    // SAFETY: F_GETFD reads the descriptor's flags and changes nothing.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: the descriptor is only borrowed for the call; one that is not open, or not a
    // channel's region, makes `open` fail with an error and touch nothing else (the region
    // is checked before use: seals, magic, version, size).
    let b = unsafe { BorrowedFd::borrow_raw(fd) };
    open(b).map_err(|e| errors::to_py(py, e))
}

/// `"block"`, `"park"` or `"busy-poll:DURATION"` (`200us`, `1ms`, `0.5s`).
fn parse_wait(s: &str) -> PyResult<shmflow::WaitStrategy> {
    match s {
        "block" => return Ok(shmflow::WaitStrategy::Block),
        "park" => return Ok(shmflow::WaitStrategy::Park),
        _ => {}
    }
    let bad = || {
        PyValueError::new_err(format!(
            "wait must be \"block\", \"park\" or \"busy-poll:DURATION\" (200us, 1ms, 0.5s), not {s:?}"
        ))
    };
    let d = s.strip_prefix("busy-poll:").ok_or_else(bad)?;
    let (num, unit) = d
        .find(|c: char| c.is_ascii_alphabetic())
        .map(|i| d.split_at(i))
        .ok_or_else(bad)?;
    let v: f64 = num.parse().map_err(|_| bad())?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        _ => return Err(bad()),
    };
    let d = Duration::try_from_secs_f64(v * scale).map_err(|_| bad())?;
    Ok(shmflow::WaitStrategy::BusyPoll(d))
}

/// A metrics snapshot as a dict of its figures.
fn snapshot_dict<'py>(
    py: Python<'py>,
    s: &shmflow::metrics::Snapshot,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let figures: [(&str, u64); 22] = [
        ("at_ns", s.at_ns),
        ("segment_count", s.segment_count),
        ("segment_size", s.segment_size),
        ("records_written", s.records_written),
        ("bytes_written", s.bytes_written),
        ("segments_committed", s.segments_committed),
        ("segments_acquired", s.segments_acquired),
        ("producer_wakes", s.producer_wakes),
        ("backpressured_ns", s.backpressured_ns),
        ("records_read", s.records_read),
        ("bytes_read", s.bytes_read),
        ("segments_taken", s.segments_taken),
        ("segments_returned", s.segments_returned),
        ("consumer_wakes", s.consumer_wakes),
        ("idle_ns", s.idle_ns),
        ("segments_not_free", s.segments_not_free),
        ("segments_at_consumer", s.segments_at_consumer),
        ("segments_in_flight", s.segments_in_flight),
        ("segment_cap", s.segment_cap),
        ("segment_fill", s.segment_fill),
        ("producer_pid", u64::from(s.producer_pid)),
        ("consumer_pid", u64::from(s.consumer_pid)),
    ];
    for (k, v) in figures {
        d.set_item(k, v)?;
    }
    d.set_item("producer_state", s.producer_state.to_string())?;
    d.set_item("consumer_state", s.consumer_state.to_string())?;
    Ok(d)
}

/// shmflow channels between processes: records through shared memory with backpressure.
#[pymodule]
fn _shmflow(m: &Bound<'_, PyModule>) -> PyResult<()> {
    view::init_type(m.py())?;
    m.add_class::<producer::PyProducer>()?;
    m.add_class::<consumer::PyConsumer>()?;
    m.add_class::<gate::PyGate>()?;
    m.add_class::<partition::PyPartition>()?;
    m.add_class::<aio::Pending>()?;
    m.add("MAX_EVENT_PAYLOAD", shmflow::MAX_EVENT_PAYLOAD)?;
    m.add("MAX_BARRIER_PAYLOAD", shmflow::MAX_BARRIER_PAYLOAD)?;
    m.add("LAYOUT_VERSION", shmflow::LAYOUT_VERSION)?;
    Ok(())
}
