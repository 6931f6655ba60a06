//! `shmflow.Partition`: one writer over several channels, with Flink's partitioners.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use shmflow::{Partitioner, SendTimeoutError, TrySendError};

use crate::errors::{raise, to_py};
use crate::producer::{alignment_of, bytes, Buf, PyProducer};
use crate::view;
use crate::wait::{self, Step};

/// How the partition picks a record's channel.
enum Route {
    RoundRobin,
    Broadcast,
    /// `key(record) % channels`, `key` a Python callable.
    Key(Py<PyAny>),
}

/// One writer over several channels (each a ``Producer`` given to it, often a channel of
/// another process's gate): each record goes to the channel the partitioner picks, and only
/// that channel's backpressure holds it up.
///
/// ``partitioner``: ``"round_robin"`` (Flink's rebalance), ``"broadcast"`` (every record to
/// every channel), or a callable ``key(record) -> int`` (Flink's keyBy: channel
/// ``key(record) % channels``; return a hash of the record's key). The producers given to it
/// belong to it from then on (using them raises ``Closed``).
///
/// As a context manager it closes every channel on a normal exit and fails every channel on
/// an exception.
#[pyclass(module = "shmflow", name = "Partition")]
pub(crate) struct PyPartition {
    part: Mutex<Option<shmflow::Partition>>,
    route: Route,
    channels: u32,
    name: String,
    /// The longest record that fits in one segment of every channel: longer ones are sent
    /// whole in one wait (a wait cut into slices would abort them at a slice's end).
    max_unspanned: usize,
}

fn lock(p: &Mutex<Option<shmflow::Partition>>) -> MutexGuard<'_, Option<shmflow::Partition>> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

impl PyPartition {
    fn closed(&self, py: Python<'_>) -> PyErr {
        raise(
            py,
            "Closed",
            format!("{}: this partition was closed", self.name),
        )
    }

    fn channel(&self, c: u32) -> PyResult<u32> {
        if c >= self.channels {
            return Err(PyIndexError::new_err(format!(
                "{}: channel {c} is not below its {} channels",
                self.name, self.channels
            )));
        }
        Ok(c)
    }

    /// Sends to each channel from the first in order, waiting up to `deadline`; `send(p, c,
    /// end)` sends to channel `c`. A wait cut into slices never sends twice to one channel.
    fn to_each(
        &self,
        py: Python<'_>,
        deadline: wait::Deadline,
        send: impl Fn(&mut shmflow::Partition, u32, std::time::Instant) -> Result<(), SendTimeoutError>
            + Sync,
    ) -> PyResult<()> {
        let next = AtomicUsize::new(0);
        let channels = self.channels as usize;
        wait::until(py, deadline, &self.name, |end| {
            let mut g = lock(&self.part);
            let Some(p) = g.as_mut() else {
                return Ok(Step::Closed);
            };
            loop {
                // Relaxed: only the waiting call touches it, one slice after another.
                let c = next.load(Ordering::Relaxed);
                if c == channels {
                    return Ok(Step::Done(()));
                }
                match send(p, c as u32, end) {
                    Ok(()) => next.store(c + 1, Ordering::Relaxed),
                    Err(SendTimeoutError::Timeout) => return Ok(Step::Again),
                    Err(e) => return Err(e.into()),
                }
            }
        })
    }

    /// Sends with `send(p, end)` (one channel), in slices up to `deadline`.
    fn to_one(
        &self,
        py: Python<'_>,
        deadline: wait::Deadline,
        send: impl Fn(&mut shmflow::Partition, std::time::Instant) -> Result<(), SendTimeoutError>
            + Sync,
    ) -> PyResult<()> {
        wait::until(py, deadline, &self.name, |end| {
            let mut g = lock(&self.part);
            let Some(p) = g.as_mut() else {
                return Ok(Step::Closed);
            };
            match send(p, end) {
                Ok(()) => Ok(Step::Done(())),
                Err(SendTimeoutError::Timeout) => Ok(Step::Again),
                Err(e) => Err(e.into()),
            }
        })
    }

    /// The channel of `key` (any Python int): `key % channels`, as Python computes it.
    fn channel_of_key(&self, key: &Bound<'_, PyAny>) -> PyResult<u32> {
        key.rem(self.channels)?.extract()
    }

    /// The channel the key function gives `data`, if the partition is by key.
    fn key_of(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
        let Route::Key(f) = &self.route else {
            return Ok(None);
        };
        let k = f.call1(py, (data,))?;
        self.channel_of_key(k.bind(py)).map(Some)
    }

    /// Sends a record longer than a segment whole, without slices (as `Producer.send` does).
    fn send_whole(&self, py: Python<'_>, b: &[u8], to: Option<u32>) -> PyResult<()> {
        let channels = self.channels;
        let broadcast = matches!(self.route, Route::Broadcast);
        let r = py.detach(|| {
            let mut g = lock(&self.part);
            let p = g.as_mut()?;
            Some(match to {
                Some(c) => p.send_to(c, b),
                None if broadcast => (0..channels).try_for_each(|c| p.send_to(c, b)),
                None => p.send(b),
            })
        });
        match r {
            None => Err(self.closed(py)),
            Some(r) => r.map_err(|e| to_py(py, e)),
        }
    }
}

#[pymethods]
impl PyPartition {
    #[new]
    #[pyo3(signature = (outputs, partitioner = None))]
    fn new(
        py: Python<'_>,
        outputs: Vec<PyRefMut<'_, PyProducer>>,
        partitioner: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyPartition> {
        let route = match partitioner {
            None => Route::RoundRobin,
            Some(p) if p.is_callable() => Route::Key(p.clone().unbind()),
            Some(p) => match p.extract::<String>()?.as_str() {
                "round_robin" => Route::RoundRobin,
                "broadcast" => Route::Broadcast,
                other => {
                    return Err(PyValueError::new_err(format!(
                        "partitioner is \"round_robin\", \"broadcast\" or a key function, not \
                         {other:?}"
                    )))
                }
            },
        };
        if outputs.is_empty() {
            return Err(PyValueError::new_err(
                "a partition needs at least one producer",
            ));
        }
        let name = format!("partition of {} channels", outputs.len());
        // Every producer is checked before any is taken: a refusal leaves them all as they
        // were.
        for o in &outputs {
            o.check_free(py)?;
        }
        let mut taken = Vec::with_capacity(outputs.len());
        for mut o in outputs {
            taken.push(o.take_inner(py)?);
        }
        let channels = taken.len() as u32;
        let max_unspanned = taken
            .iter()
            .map(shmflow::Producer::max_unspanned_len)
            .min()
            .unwrap_or(0);
        // (Keyed records are routed here, with `send_keyed`.)
        let p = shmflow::Partition::new(
            taken,
            match route {
                Route::Broadcast => Partitioner::Broadcast,
                _ => Partitioner::RoundRobin,
            },
        )
        .map_err(|e| to_py(py, e))?;
        Ok(PyPartition {
            part: Mutex::new(Some(p)),
            route,
            channels,
            name,
            max_unspanned,
        })
    }

    /// Sends one record where the partitioner says, waiting up to ``timeout`` seconds while
    /// that channel (for broadcast: each channel in turn) has no free segment. A broadcast
    /// cut short (``Timeout``, Ctrl-C) has gone to the channels before the one that was full,
    /// and only to them; ``try_send`` broadcasts to every channel or to none.
    #[pyo3(signature = (data, timeout = None))]
    fn send(&self, py: Python<'_>, data: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        let key = self.key_of(py, data)?;
        let buf = Buf::get(data, view::PYBUF_SIMPLE)?;
        let span = buf.span();
        let deadline = wait::deadline(timeout)?;
        // SAFETY: `buf` holds the export for the call.
        let b = unsafe { bytes(span) };
        if b.len() > self.max_unspanned {
            return self.send_whole(py, b, key);
        }
        match (&self.route, key) {
            (_, Some(c)) => self.to_one(py, deadline, |p, end| p.send_to_deadline(c, b, end)),
            (Route::Broadcast, _) => {
                self.to_each(py, deadline, |p, c, end| p.send_to_deadline(c, b, end))
            }
            _ => self.to_one(py, deadline, |p, end| p.send_deadline(b, end)),
        }
    }

    /// Sends one record if its channel (for broadcast: every channel) has room now; returns
    /// whether it was sent (a broadcast goes to every channel or to none).
    fn try_send(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = self.key_of(py, data)?;
        let buf = Buf::get(data, view::PYBUF_SIMPLE)?;
        let span = buf.span();
        // The lock is waited for without the GIL (another thread's send may hold it).
        let r = py.detach(|| {
            // SAFETY: `buf` holds the export for the call.
            let b = unsafe { bytes(span) };
            let mut g = lock(&self.part);
            let p = g.as_mut()?;
            Some(match key {
                Some(c) => p.try_send_to(c, b),
                None => p.try_send(b),
            })
        });
        match r {
            None => Err(self.closed(py)),
            Some(Ok(())) => Ok(true),
            Some(Err(TrySendError::Full)) => Ok(false),
            Some(Err(e)) => Err(to_py(py, e)),
        }
    }

    /// Sends one record to the channel of ``key`` (``key % channels``, any int), whatever
    /// the partitioner.
    #[pyo3(signature = (key, data, timeout = None))]
    fn send_keyed(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let c = self.channel_of_key(key)?;
        self.send_to(py, c, data, timeout)
    }

    /// Sends one record to channel ``channel``, whatever the partitioner.
    #[pyo3(signature = (channel, data, timeout = None))]
    fn send_to(
        &self,
        py: Python<'_>,
        channel: u32,
        data: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let c = self.channel(channel)?;
        let buf = Buf::get(data, view::PYBUF_SIMPLE)?;
        // SAFETY: `buf` holds the export for the call.
        let b = unsafe { bytes(buf.span()) };
        if b.len() > self.max_unspanned {
            return self.send_whole(py, b, Some(c));
        }
        self.to_one(py, wait::deadline(timeout)?, |p, end| {
            p.send_to_deadline(c, b, end)
        })
    }

    /// Sends an event to every channel, in order with the records.
    #[pyo3(signature = (kind, payload = None, timeout = None))]
    fn send_event(
        &self,
        py: Python<'_>,
        kind: u32,
        payload: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let buf = payload
            .map(|p| Buf::get(p, view::PYBUF_SIMPLE))
            .transpose()?;
        let span = buf.as_ref().map_or((0, 0), Buf::span);
        self.to_each(py, wait::deadline(timeout)?, |p, c, end| {
            // SAFETY: `buf` holds the export for the call.
            p.output(c)
                .send_event_deadline(kind, unsafe { bytes(span) }, end)
        })
    }

    /// Sends checkpoint barrier ``id`` to every channel (``alignment`` as for
    /// ``Producer.send_barrier``). Sent again after a timeout, it goes only to the channels
    /// that lack it.
    #[pyo3(signature = (id, alignment = None, payload = None, timeout = None))]
    fn send_barrier(
        &self,
        py: Python<'_>,
        id: u64,
        alignment: Option<&Bound<'_, PyAny>>,
        payload: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        let alignment = alignment_of(alignment)?;
        let buf = payload
            .map(|p| Buf::get(p, view::PYBUF_SIMPLE))
            .transpose()?;
        let span = buf.as_ref().map_or((0, 0), Buf::span);
        self.to_one(py, wait::deadline(timeout)?, |p, end| {
            // SAFETY: `buf` holds the export for the call.
            p.send_barrier_deadline(id, alignment, unsafe { bytes(span) }, end)
        })
    }

    /// Makes everything sent visible on every channel.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let r = py.detach(|| lock(&self.part).as_mut().map(|p| p.flush()));
        match r {
            None => Err(self.closed(py)),
            Some(r) => r.map_err(|e| to_py(py, e)),
        }
    }

    /// Ends every channel's stream: each consumer reads every record sent, then the end.
    fn close(&self, py: Python<'_>) {
        let p = py.detach(|| lock(&self.part).take());
        if let Some(p) = p {
            py.detach(|| {
                p.into_outputs()
                    .into_iter()
                    .for_each(shmflow::Producer::close)
            });
        }
    }

    /// Ends every channel's stream as failed (each consumer gets ``ProducerFailed``).
    fn fail(&self, py: Python<'_>) {
        let p = py.detach(|| lock(&self.part).take());
        if let Some(p) = p {
            p.fail();
        }
    }

    /// The number of channels.
    #[getter]
    fn channels(&self) -> u32 {
        self.channels
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (exc_type, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        match exc_type {
            Some(t) if !t.is_none() => self.fail(py),
            _ => self.close(py),
        }
        false
    }

    fn __repr__(&self) -> String {
        let state = match self.part.try_lock() {
            Ok(g) if g.is_some() => "open",
            Ok(_) => "closed",
            Err(_) => "in use",
        };
        format!("<shmflow.Partition {} channels ({state})>", self.channels)
    }
}
