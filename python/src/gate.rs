//! `shmflow.Gate`: one reader of many channels, each written by its own producer.

use std::sync::{Mutex, MutexGuard};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyMemoryView};
use shmflow::{GateGeometry, GateMessage, RecvTimeoutError, TryRecvError};

use crate::errors::{raise, to_py};
use crate::wait::{self, Step};

/// What a gate's receive found, before it becomes a Python object.
enum Item {
    /// A record (or one handed back by an unaligned barrier) and its channel.
    Record(u32, Vec<u8>),
    /// A channel's producer failed or died; the gate goes on with the others.
    Failed(u32, String),
    Dead(u32, String),
}

/// The next record or channel failure from `m`; `None` for what `recv` passes over (events,
/// ends of partitions, barriers, latency markers).
fn item(m: GateMessage<'_>) -> Result<Option<Item>, shmflow::RecvError> {
    Ok(match m {
        GateMessage::Record { channel, record }
        | GateMessage::InFlight {
            channel, record, ..
        } => Some(Item::Record(channel, record.to_vec()?)),
        GateMessage::ChannelFailed { channel, error } => {
            Some(Item::Failed(channel, error.to_string()))
        }
        GateMessage::ChannelDead { channel, error } => Some(Item::Dead(channel, error.to_string())),
        _ => None,
    })
}

/// The reading end of a gate: many producers (``Producer.open_channel(name, i)``), one
/// reader, round-robin over the channels, with Flink's exclusive segments per channel and
/// floating segments lent to the channels that ask.
///
/// ``recv`` returns ``(channel, record)``: the record as a read-only memoryview of a copy (a
/// gate lends its segments and takes them back itself, so its records are copied out, once).
/// Iterating gives the same pairs until every channel has ended. A channel whose producer
/// failed or died raises ``ProducerFailed`` or ``PeerDead`` with the channel in the
/// exception's ``channel`` attribute; the gate goes on with the others.
#[pyclass(module = "shmflow", name = "Gate")]
pub(crate) struct PyGate {
    gate: Mutex<Option<shmflow::Gate>>,
    name: String,
    channels: u32,
}

fn lock(g: &Mutex<Option<shmflow::Gate>>) -> MutexGuard<'_, Option<shmflow::Gate>> {
    g.lock().unwrap_or_else(|p| p.into_inner())
}

impl PyGate {
    fn hand_out(&self, py: Python<'_>, it: Item) -> PyResult<(u32, Py<PyAny>)> {
        let (kind, channel, msg) = match it {
            Item::Record(channel, bytes) => {
                let b = PyBytes::new(py, &bytes);
                return Ok((channel, PyMemoryView::from(&b)?.into_any().unbind()));
            }
            Item::Failed(c, m) => ("ProducerFailed", c, m),
            Item::Dead(c, m) => ("PeerDead", c, m),
        };
        let e = raise(py, kind, format!("channel {channel}: {msg}"));
        let _ = e.value(py).setattr("channel", channel);
        Err(e)
    }
}

#[pymethods]
impl PyGate {
    /// Creates the named gate ``name`` with ``channels`` channels; producers open channel
    /// ``i`` with ``Producer.open_channel(name, i)``. Each channel has ``exclusive`` segments
    /// of its own, and ``floating`` segments are lent to the channels that have a backlog.
    #[staticmethod]
    #[pyo3(signature = (name, channels, segment_size = 65536, exclusive = 2, floating = 8))]
    fn create(
        py: Python<'_>,
        name: &str,
        channels: u32,
        segment_size: u32,
        exclusive: u32,
        floating: u32,
    ) -> PyResult<PyGate> {
        let mut g = GateGeometry::new(channels);
        g.segment_size = segment_size;
        g.exclusive = exclusive;
        g.floating = floating;
        let gate = py
            .detach(|| shmflow::Gate::create(name, g))
            .map_err(|e| to_py(py, e))?;
        Ok(PyGate {
            name: gate.region_name().to_string(),
            channels: gate.channels(),
            gate: Mutex::new(Some(gate)),
        })
    }

    /// The next ``(channel, record)``, waiting up to ``timeout`` seconds (``None``: as long
    /// as it takes); ``None`` once every channel has ended. Events, barriers and the ends of
    /// single channels are passed over.
    #[pyo3(signature = (timeout = None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<(u32, Py<PyAny>)>> {
        let deadline = wait::deadline(timeout)?;
        // What is there already, without letting go of the interpreter.
        if let Ok(mut g) = self.gate.try_lock() {
            let gate = g.as_mut().ok_or_else(|| self.closed(py))?;
            loop {
                match gate.try_recv() {
                    Ok(Some(m)) => {
                        // A record over several segments is read whole without the GIL.
                        let it = if is_spanning(&m) {
                            py.detach(move || item(m))
                        } else {
                            item(m)
                        };
                        if let Some(it) = it.map_err(|e| to_py(py, e))? {
                            return self.hand_out(py, it).map(Some);
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Ok(None) => return Ok(None),
                    Err(e) => return Err(to_py(py, e)),
                }
            }
        }
        let got = wait::until(py, deadline, &self.name, |end| {
            let mut g = lock(&self.gate);
            let Some(gate) = g.as_mut() else {
                return Ok(Step::Closed);
            };
            loop {
                match gate.recv_deadline(end) {
                    Ok(Some(m)) => {
                        if let Some(it) = item(m)? {
                            return Ok(Step::Done(Some(it)));
                        }
                    }
                    Ok(None) => return Ok(Step::Done(None)),
                    Err(RecvTimeoutError::Timeout) => return Ok(Step::Again),
                    Err(e) => return Err(e.into()),
                }
            }
        })?;
        match got {
            Some(it) => self.hand_out(py, it).map(Some),
            None => Ok(None),
        }
    }

    /// Detaches from every channel: each producer's next blocking call raises ``Closed``.
    fn close(&self, py: Python<'_>) {
        let gate = py.detach(|| lock(&self.gate).take());
        drop(gate);
    }

    /// The gate's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The number of channels.
    #[getter]
    fn channels(&self) -> u32 {
        self.channels
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<(u32, Py<PyAny>)>> {
        self.recv(py, None)
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        format!("<shmflow.Gate {} ({} channels)>", self.name, self.channels)
    }
}

impl PyGate {
    fn closed(&self, py: Python<'_>) -> PyErr {
        raise(py, "Closed", format!("{}: this gate was closed", self.name))
    }
}

/// A record over several segments.
fn is_spanning(m: &GateMessage<'_>) -> bool {
    matches!(
        m,
        GateMessage::Record { record, .. } | GateMessage::InFlight { record, .. }
            if record.is_spanning()
    )
}
