//! `shmflow.Consumer`: records as read-only memoryviews of the segments they sit in.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::Poll;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use shmflow::{Alignment, Message, Record, RecvError, RecvTimeoutError, SegmentHold, TryRecvError};

use crate::aio::{self, Bell, Busy, Pending};
use crate::errors::{raise, to_py};
use crate::view::{self, Keep};
use crate::wait::{self, Deadline};

/// The consumer and the holds that views gave up, shared with every exporter of its records
/// (which keep it, and so the mapping, alive while they live).
pub(crate) struct ConsumerCore {
    rx: Mutex<shmflow::Consumer>,
    /// Holds of exporters that went away, released at the consumer's next call (an exporter
    /// can go at any time, in any thread, while a receive waits).
    released: Mutex<Vec<SegmentHold>>,
    /// An async receive is under way (it holds `rx` between its polls).
    aio: Arc<AtomicBool>,
    /// What wakes an async receive's coroutine; made by the first one.
    bell: OnceLock<Arc<Bell>>,
    /// An async receive was cancelled while it copied a record that spans segments: the rest
    /// of that record is gone, which the next receive says (`RecordAborted`).
    lost: AtomicBool,
}

impl ConsumerCore {
    fn has_released(&self) -> bool {
        !self
            .released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, shmflow::Consumer> {
        self.rx.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives back the segments whose last view went.
    fn release_pending(&self, rx: &mut shmflow::Consumer) -> Result<(), RecvError> {
        let holds = std::mem::take(&mut *self.released.lock().unwrap_or_else(|p| p.into_inner()));
        for h in holds {
            rx.release_hold(h)?;
        }
        Ok(())
    }
}

/// A hold on a record's segment, owned by the record's exporter: dropping it hands the hold
/// to the consumer for release.
pub(crate) struct Pin {
    hold: Option<SegmentHold>,
    core: Arc<ConsumerCore>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        let Some(h) = self.hold.take() else {
            return;
        };
        // At once if no receive is under way (a producer waiting for the segment gets it
        // without the reader calling again); otherwise the receive under way gives it back
        // within one wait slice.
        if let Ok(mut rx) = self.core.rx.try_lock() {
            // An error here is the channel's corruption, which the next call reports.
            let _ = rx.release_hold(h);
            return;
        }
        self.core
            .released
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(h);
        // An async receive waiting meanwhile holds the lock: woken, it gives the segment
        // back and waits on. Relaxed: a missed flag means no receive holds the lock past
        // this point but one that starts after, which releases the queue first.
        if self.core.aio.load(Ordering::Relaxed) {
            if let Some(b) = self.core.bell.get() {
                b.ring();
            }
        }
    }
}

/// A record taken from the consumer, before it becomes a Python object.
enum Got {
    /// In one segment: its bytes stay where they are while the pin (a hold on the segment)
    /// lives. Dropping it unused gives the hold back.
    InPlace { ptr: usize, len: usize, pin: Pin },
    /// Spanning segments: copied out.
    Copied(Vec<u8>),
    /// An event (`recv_message`).
    Event {
        kind: u32,
        payload: Vec<u8>,
        priority: bool,
    },
    /// A checkpoint barrier (`recv_message`).
    Barrier {
        id: u64,
        emitted_ns: u64,
        /// `Err(())` for unaligned, `Ok(None)` for aligned, `Ok(Some(secs))` for aligned
        /// with a timeout.
        alignment: Result<Option<f64>, ()>,
        payload: Vec<u8>,
        priority: bool,
    },
}

/// A message as `recv_message` hands it out; `None` for a latency marker (counted in the
/// consumer's figures, not handed out).
fn take_message(
    m: Message<'_>,
    core: &Arc<ConsumerCore>,
    whole: impl FnOnce(Record<'_>) -> Result<Vec<u8>, RecvError>,
) -> Result<Option<Got>, RecvError> {
    Ok(Some(match m {
        Message::Record(r) => take(r, core, whole)?,
        Message::Event(e) => Got::Event {
            kind: e.kind,
            payload: e.payload.to_vec(),
            priority: e.priority,
        },
        Message::Barrier(b) => Got::Barrier {
            id: b.id,
            emitted_ns: b.emitted_ns,
            alignment: match b.alignment {
                Alignment::Aligned => Ok(None),
                Alignment::AlignedWithTimeout(d) => Ok(Some(d.as_secs_f64())),
                _ => Err(()),
            },
            payload: b.payload.to_vec(),
            priority: b.priority,
        },
        _ => return Ok(None),
    }))
}

/// A record as a `Got`: in place, with a pin on its segment, or, for one that spans
/// segments, copied whole by `whole` (which waits for the parts still to come: a caller that
/// holds the GIL lets go of it there).
fn take(
    mut r: Record<'_>,
    core: &Arc<ConsumerCore>,
    whole: impl FnOnce(Record<'_>) -> Result<Vec<u8>, RecvError>,
) -> Result<Got, RecvError> {
    if let Some(b) = r.as_bytes() {
        let (ptr, len) = (b.as_ptr() as usize, b.len());
        return Ok(match r.hold_segment() {
            Some(hold) => Got::InPlace {
                ptr,
                len,
                pin: Pin {
                    hold: Some(hold),
                    core: core.clone(),
                },
            },
            // (A channel's own segment can always be held; copied if not.)
            None => Got::Copied(r.as_bytes().unwrap_or_default().to_vec()),
        });
    }
    Ok(Got::Copied(whole(r)?))
}

/// `whole` for a caller that has let go of the GIL.
fn to_vec(r: Record<'_>) -> Result<Vec<u8>, RecvError> {
    r.to_vec()
}

/// The reading end of a channel. Records come as read-only `memoryview`s of the shared
/// memory they sit in: no copy.
///
/// A view stays valid until the next receive on this consumer (``recv``, ``recv_batch``,
/// iteration) or ``release()``; then it is released, and using it raises ``ValueError``. A
/// buffer made from it before that (a slice, ``numpy.frombuffer``) keeps the record's segment
/// from the producer for as long as it lives, so it never sees the segment reused; copy
/// (``bytes(view)``) what you keep for long, as every segment held is one the producer
/// cannot fill.
///
/// Use it as an iterator (``for record in consumer:``, to the end of the stream) and as a
/// context manager (``with Consumer.open(name) as consumer:``).
#[pyclass(module = "shmflow", name = "Consumer")]
pub(crate) struct PyConsumer {
    core: Option<Arc<ConsumerCore>>,
    /// The views handed out by the last receive, with their exporters.
    out: Vec<(Py<PyAny>, Py<PyAny>)>,
    name: String,
    segments: usize,
    /// A record that `recv_batch(rows=…)` took but could not put in its array: the next
    /// receive returns it first.
    leftover: Option<Py<PyAny>>,
    /// A failure met by a batch after it had taken records: raised by the next receive.
    pending: Option<PyErr>,
}

impl PyConsumer {
    fn wrap(rx: shmflow::Consumer) -> PyConsumer {
        let name = rx.region_name().to_string();
        let segments = rx.geometry().segment_count as usize;
        PyConsumer {
            core: Some(Arc::new(ConsumerCore {
                rx: Mutex::new(rx),
                released: Mutex::new(Vec::new()),
                aio: Arc::new(AtomicBool::new(false)),
                bell: OnceLock::new(),
                lost: AtomicBool::new(false),
            })),
            out: Vec::new(),
            name,
            segments,
            leftover: None,
            pending: None,
        }
    }

    fn core(&self, py: Python<'_>) -> PyResult<Arc<ConsumerCore>> {
        let core = self.core.clone().ok_or_else(|| {
            raise(
                py,
                "Closed",
                format!("{}: this consumer was closed", self.name),
            )
        })?;
        aio::check(&core.aio, &self.name)?;
        Ok(core)
    }

    /// Raises `RecordAborted` once for a record that a cancelled async receive dropped
    /// half-read.
    fn raise_lost(&self, py: Python<'_>, core: &ConsumerCore) -> PyResult<()> {
        // Relaxed: set and taken on the threads that use the consumer, one at a time.
        if core.lost.swap(false, Ordering::Relaxed) {
            return Err(raise(
                py,
                "RecordAborted",
                format!(
                    "{}: a cancelled async receive dropped a record larger than a segment \
                     half-read; the next receive returns the record after it",
                    self.name
                ),
            ));
        }
        Ok(())
    }

    /// Raises if an async receive is under way (before a call changes anything).
    fn not_busy(&self) -> PyResult<()> {
        match &self.core {
            Some(c) => aio::check(&c.aio, &self.name),
            None => Ok(()),
        }
    }

    /// Raises the failure a batch met after it had taken records.
    fn raise_pending(&mut self) -> PyResult<()> {
        match self.pending.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Releases the views of the last receive (see the type's documentation).
    fn retire(&mut self, py: Python<'_>) {
        for (exporter, mv) in self.out.drain(..) {
            view::retire(py, &exporter, &mv);
        }
    }

    /// A Python object for a record: a memoryview of it in place, or of its copy.
    fn hand_out(&mut self, py: Python<'_>, got: Got) -> PyResult<Py<PyAny>> {
        match got {
            Got::InPlace { ptr, len, pin } => {
                // SAFETY: the record's bytes are in a segment that the pin's hold keeps from
                // the producer (and the consumer, kept by the pin's `core`, keeps mapped)
                // while the pin lives, which is as long as the exporter; the view is
                // read-only.
                let (exporter, mv) =
                    unsafe { view::new_view(py, ptr as *mut u8, len, true, Keep::Record(pin))? };
                self.out.push((exporter, mv.clone_ref(py)));
                Ok(mv)
            }
            Got::Copied(v) => {
                let b = PyBytes::new(py, &v);
                Ok(pyo3::types::PyMemoryView::from(&b)?.into_any().unbind())
            }
            Got::Event {
                kind,
                payload,
                priority,
            } => {
                let cls = py.import("shmflow._types")?.getattr("Event")?;
                Ok(cls
                    .call1((kind, PyBytes::new(py, &payload), priority))?
                    .unbind())
            }
            Got::Barrier {
                id,
                emitted_ns,
                alignment,
                payload,
                priority,
            } => {
                let cls = py.import("shmflow._types")?.getattr("Barrier")?;
                let alignment: Py<PyAny> = match alignment {
                    Ok(None) => "aligned".into_pyobject(py)?.into_any().unbind(),
                    Err(()) => "unaligned".into_pyobject(py)?.into_any().unbind(),
                    Ok(Some(t)) => t.into_pyobject(py)?.into_any().unbind(),
                };
                Ok(cls
                    .call1((
                        id,
                        emitted_ns,
                        alignment,
                        PyBytes::new(py, &payload),
                        priority,
                    ))?
                    .unbind())
            }
        }
    }

    /// One record (or, with `messages`, one record, event or barrier), waiting up to
    /// `deadline`: `None` at the end of the stream.
    fn recv_one(
        &mut self,
        py: Python<'_>,
        deadline: Deadline,
        messages: bool,
    ) -> PyResult<Option<Got>> {
        let core = self.core(py)?;
        self.raise_lost(py, &core)?;
        if let Some(done) = try_now(py, &core, messages)? {
            return Ok(done);
        }
        let segments = self.segments;
        let got = wait::until(py, deadline, &self.name, |slice_end| {
            let mut rx = core.lock();
            core.release_pending(&mut rx)?;
            let timed_out = if messages {
                match rx.recv_message_deadline(slice_end) {
                    Ok(Some(m)) => match take_message(m, &core, to_vec)? {
                        Some(g) => return Ok(wait::Step::Done(Some(g))),
                        None => return Ok(wait::Step::Again),
                    },
                    Ok(None) => return Ok(wait::Step::Done(None)),
                    Err(RecvTimeoutError::Timeout) => true,
                    Err(e) => return Err(e.into()),
                }
            } else {
                match rx.recv_deadline(slice_end) {
                    Ok(Some(r)) => return Ok(wait::Step::Done(Some(take(r, &core, to_vec)?))),
                    Ok(None) => return Ok(wait::Step::Done(None)),
                    Err(RecvTimeoutError::Timeout) => true,
                    Err(e) => return Err(e.into()),
                }
            };
            debug_assert!(timed_out);
            // Views that went during the slice give their segments back first.
            core.release_pending(&mut rx)?;
            if rx.held_segments() >= segments {
                Ok(wait::Step::Stuck)
            } else {
                Ok(wait::Step::Again)
            }
        });
        // Views dropped by other threads while this receive waited give their segments back
        // now, not at the next call.
        if let Ok(mut rx) = core.rx.try_lock() {
            core.release_pending(&mut rx).map_err(|e| to_py(py, e))?;
        }
        got
    }
}

#[pymethods]
impl PyConsumer {
    /// Opens the consumer end of the named channel ``name`` (``/name``), made by
    /// ``Producer.create``.
    #[staticmethod]
    fn open(py: Python<'_>, name: &str) -> PyResult<PyConsumer> {
        let rx = py
            .detach(|| shmflow::Consumer::open(name))
            .map_err(|e| to_py(py, e))?;
        Ok(PyConsumer::wrap(rx))
    }

    /// Creates the named channel ``name`` as its consumer; a producer opens it with
    /// ``Producer.open``.
    #[staticmethod]
    #[pyo3(signature = (name, segment_size = 65536, segment_count = 8))]
    fn create(
        py: Python<'_>,
        name: &str,
        segment_size: usize,
        segment_count: usize,
    ) -> PyResult<PyConsumer> {
        let g = crate::geometry(segment_size, segment_count)?;
        let rx = py
            .detach(|| shmflow::Consumer::create(name, g))
            .map_err(|e| to_py(py, e))?;
        Ok(PyConsumer::wrap(rx))
    }

    /// Creates an anonymous channel as its consumer. Returns the consumer and a file
    /// descriptor that a child process opens with ``Producer.from_fd`` (pass it with
    /// ``subprocess.Popen(..., pass_fds=[fd])``, or inherit it through ``fork``); close the
    /// descriptor in the parent once the child has it. Once every copy of it is closed and no
    /// producer attached (the child died first), waits for one raise ``PeerDead`` ("no producer
    /// ever attached").
    #[staticmethod]
    #[pyo3(signature = (segment_size = 65536, segment_count = 8))]
    fn create_anonymous(
        py: Python<'_>,
        segment_size: usize,
        segment_count: usize,
    ) -> PyResult<(PyConsumer, i32)> {
        let g = crate::geometry(segment_size, segment_count)?;
        let (rx, handle) = shmflow::Consumer::create_anonymous(g).map_err(|e| to_py(py, e))?;
        Ok((PyConsumer::wrap(rx), crate::handle_fd(handle)))
    }

    /// Opens the consumer end of an anonymous channel from the descriptor a parent passed.
    #[staticmethod]
    fn from_fd(py: Python<'_>, fd: i32) -> PyResult<PyConsumer> {
        let rx = crate::with_fd(py, fd, |b| shmflow::Consumer::from_fd(b))?;
        Ok(PyConsumer::wrap(rx))
    }

    /// The next record as a read-only memoryview, waiting for it up to ``timeout`` seconds
    /// (``None``: as long as it takes). Returns ``None`` at the end of the stream (the
    /// producer closed and every record was read). Releases the views of the previous
    /// receive.
    ///
    /// Raises ``Timeout`` when the time runs out, ``PeerDead`` when the producer died,
    /// ``ProducerFailed`` when it ended the stream as failed, ``ViewsHeld`` when views of
    /// earlier records hold every segment of the channel (the producer could send nothing).
    #[pyo3(signature = (timeout = None))]
    fn recv(&mut self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Py<PyAny>>> {
        self.not_busy()?;
        self.retire(py);
        if let Some(l) = self.leftover.take() {
            return Ok(Some(l));
        }
        self.raise_pending()?;
        let deadline = wait::deadline(timeout)?;
        match self.recv_one(py, deadline, false)? {
            Some(g) => self.hand_out(py, g).map(Some),
            None => Ok(None),
        }
    }

    /// The next message: a record (a memoryview, as ``recv`` gives), an ``Event`` (``kind``,
    /// ``payload``, ``priority``) or a ``Barrier`` (``id``, ``emitted_ns``, ``alignment``:
    /// ``"aligned"``, ``"unaligned"`` or the seconds after which it turns unaligned,
    /// ``payload``, ``priority``), in the order the channel delivers them (a priority event
    /// overtakes the records queued before it). ``None`` at the end of the stream. ``recv``
    /// skips events and barriers.
    #[pyo3(signature = (timeout = None))]
    fn recv_message(
        &mut self,
        py: Python<'_>,
        timeout: Option<f64>,
    ) -> PyResult<Option<Py<PyAny>>> {
        self.not_busy()?;
        self.retire(py);
        if let Some(l) = self.leftover.take() {
            return Ok(Some(l));
        }
        self.raise_pending()?;
        let deadline = wait::deadline(timeout)?;
        match self.recv_one(py, deadline, true)? {
            Some(g) => self.hand_out(py, g).map(Some),
            None => Ok(None),
        }
    }

    /// The next record if one is there now, else ``None``; raises ``EndOfStream`` at the end
    /// of the stream.
    fn try_recv(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        match self.recv(py, Some(0.0)) {
            Ok(Some(v)) => Ok(Some(v)),
            Ok(None) => Err(raise(
                py,
                "EndOfStream",
                format!("{}: the stream has ended", self.name),
            )),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyTimeoutError>(py) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Up to ``max`` records, waiting up to ``timeout`` seconds for the first and taking the
    /// others only if they are already there. An empty result means the end of the stream.
    ///
    /// Without ``rows``: a list of read-only memoryviews, as ``recv`` gives. With ``rows=k``:
    /// one memoryview of shape ``(n, k)`` holding ``n`` records of ``k`` bytes each, copied
    /// once into one block (``numpy.frombuffer(batch, dtype)`` reads it as an array); a
    /// record of another length ends the batch and is returned by the next receive.
    #[pyo3(signature = (max, timeout = None, rows = None))]
    fn recv_batch(
        &mut self,
        py: Python<'_>,
        max: usize,
        timeout: Option<f64>,
        rows: Option<usize>,
    ) -> PyResult<Py<PyAny>> {
        self.not_busy()?;
        self.retire(py);
        if max == 0 {
            return Ok(PyList::empty(py).into_any().unbind());
        }
        if let Some(k) = rows {
            return self.recv_rows(py, max, timeout, k);
        }
        self.raise_pending()?;
        let list = PyList::empty(py);
        if let Some(l) = self.leftover.take() {
            list.append(l)?;
        } else {
            let deadline = wait::deadline(timeout)?;
            match self.recv_one(py, deadline, false)? {
                Some(g) => list.append(self.hand_out(py, g)?)?,
                None => return Ok(list.into_any().unbind()),
            }
        }
        let core = self.core(py)?;
        let mut got = Vec::new();
        let failed = {
            let mut rx = core.lock();
            let room = max - list.len();
            rx.try_drain(room, |r| {
                got.push(take(r, &core, |r| py.detach(move || r.to_vec()))?);
                Ok::<_, RecvError>(())
            })
            .err()
        };
        for g in got {
            list.append(self.hand_out(py, g)?)?;
        }
        // The records taken before a failure are handed out; the failure comes with the
        // next receive.
        if let Some(e) = failed {
            self.pending = Some(to_py(py, e));
        }
        Ok(list.into_any().unbind())
    }

    /// Releases the views of the last receive now (they are released by the next receive
    /// anyway): their segments go back to the producer unless buffers made from them live.
    fn release(&mut self, py: Python<'_>) -> PyResult<()> {
        self.not_busy()?;
        self.retire(py);
        if let Some(core) = &self.core {
            if let Ok(mut rx) = core.rx.try_lock() {
                core.release_pending(&mut rx).map_err(|e| to_py(py, e))?;
            }
        }
        Ok(())
    }

    /// Detaches: the producer's next call raises ``Closed``. Views still alive keep the
    /// shared memory mapped, and the consumer attached, until they go.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        self.not_busy()?;
        self.retire(py);
        self.leftover = None;
        self.pending = None;
        self.core = None;
        Ok(())
    }

    /// True once this consumer has read every record and the producer closed the stream.
    #[getter]
    fn ended(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.core(py)?.lock().is_ended())
    }

    /// The channel's name (``/name``, or a generated one for an anonymous channel).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// Segments that views of records keep from the producer although this consumer has
    /// moved past them.
    #[getter]
    fn held_segments(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.core(py)?.lock().held_segments())
    }

    /// The channel's counters and Flink's figures, as a dict (see ``shmflow stat``).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.core(py)?.lock().metrics();
        crate::snapshot_dict(py, &s)
    }

    /// Sets how a waiting receive waits: ``"block"`` (the default: looks for a few
    /// microseconds, then sleeps), ``"park"`` (sleeps at once) or ``"busy-poll:200us"``
    /// (spins up to the given time first).
    fn set_wait(&self, py: Python<'_>, wait: &str) -> PyResult<()> {
        let w = crate::parse_wait(wait)?;
        self.core(py)?.lock().set_wait_strategy(w);
        Ok(())
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.recv(py, None)
    }

    /// ``await consumer.recv_async()``: as ``recv``, waiting in the asyncio event loop
    /// instead of blocking the thread: other tasks run meanwhile, and no thread waits for
    /// it (shmflow's waker thread watches up to 127 waits at once). Call it in a coroutine
    /// of the loop that awaits it. Returns the next record as a read-only memoryview, or
    /// ``None`` at the end of the stream; ``timeout`` raises ``Timeout``. Cancelling it
    /// (``asyncio.wait_for``, ``task.cancel()``) while it waits loses nothing: the record
    /// comes with the next receive. Cancelled while it copies a record larger than a
    /// segment, as its parts come, it drops that record, and the next receive raises
    /// ``RecordAborted`` once. While it is under way, the consumer's other calls raise
    /// ``RuntimeError``.
    #[pyo3(signature = (timeout = None))]
    fn recv_async(slf: &Bound<'_, Self>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        PyConsumer::begin_async(slf, timeout, false)
    }

    /// ``await consumer.recv_message_async()``: as ``recv_message`` (records, ``Event``,
    /// ``Barrier``), waiting in the event loop as ``recv_async`` does.
    #[pyo3(signature = (timeout = None))]
    fn recv_message_async(slf: &Bound<'_, Self>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        PyConsumer::begin_async(slf, timeout, true)
    }

    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// ``async for record in consumer:`` to the end of the stream.
    fn __anext__(slf: &Bound<'_, Self>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let next = PyConsumer::begin_async(slf, None, false)?;
        Ok(py
            .import("shmflow._aio")?
            .call_method1("until_end", (next,))?
            .unbind())
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        _exc: &Bound<'_, pyo3::types::PyTuple>,
    ) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self.core.is_some() {
            "open"
        } else {
            "closed"
        };
        format!("<shmflow.Consumer {} ({state})>", self.name)
    }
}

impl PyConsumer {
    fn recv_rows(
        &mut self,
        py: Python<'_>,
        max: usize,
        timeout: Option<f64>,
        k: usize,
    ) -> PyResult<Py<PyAny>> {
        if k == 0 {
            return Err(PyValueError::new_err("rows must be at least 1 byte"));
        }
        let mismatch = |len: usize| {
            PyValueError::new_err(format!(
                "the next record is {len} bytes, not {k}: receive it with recv()"
            ))
        };
        if let Some(l) = &self.leftover {
            return Err(mismatch(l.bind(py).len()?));
        }
        self.raise_pending()?;
        // Reserved up to 64 MiB; more grows as records come.
        let mut block: Vec<u8> = Vec::with_capacity(max.saturating_mul(k).min(64 << 20));
        let mut odd: Option<Vec<u8>> = None;
        let deadline = wait::deadline(timeout)?;
        match self.recv_one(py, deadline, false)? {
            Some(Got::InPlace { ptr, len, pin }) => {
                // SAFETY: the pin (dropped just below, after the copy) keeps the bytes.
                let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
                if len == k {
                    block.extend_from_slice(bytes);
                } else {
                    odd = Some(bytes.to_vec());
                }
                drop(pin);
            }
            Some(Got::Copied(v)) if v.len() == k => block.extend_from_slice(&v),
            Some(Got::Copied(v)) => odd = Some(v),
            // (`recv_one` without messages hands out records only.)
            Some(Got::Event { .. } | Got::Barrier { .. }) | None => {}
        }
        if odd.is_none() && block.len() == k && max > 1 {
            let core = self.core(py)?;
            let mut rx = core.lock();
            // The batch stops at the first record of another length (kept for the next
            // receive).
            let stopped = rx.try_drain(max - 1, |r: Record<'_>| {
                match r.as_bytes() {
                    Some(b) if b.len() == k => {
                        block.extend_from_slice(b);
                        return Ok(());
                    }
                    Some(b) => odd = Some(b.to_vec()),
                    None => odd = Some(py.detach(move || r.to_vec())?),
                }
                Err(Stop::Odd)
            });
            drop(rx);
            if let Err(Stop::Failed(e)) = stopped {
                // Handed out with the next receive, after the records taken.
                self.pending = Some(to_py(py, e));
            }
        }
        let n = block.len() / k;
        if let Some(v) = odd {
            let len = v.len();
            let b = PyBytes::new(py, &v);
            self.leftover = Some(pyo3::types::PyMemoryView::from(&b)?.into_any().unbind());
            if n == 0 {
                return Err(mismatch(len));
            }
        }
        let bytes = PyBytes::new(py, &block);
        let mv = pyo3::types::PyMemoryView::from(&bytes)?;
        if n == 0 {
            // The end of the stream (memoryview cannot shape an empty block).
            return Ok(mv.into_any().unbind());
        }
        Ok(mv.call_method1("cast", ("B", (n, k)))?.unbind())
    }
}

/// Why a batch of rows stopped early.
enum Stop {
    /// A record of another length (kept).
    Odd,
    Failed(RecvError),
}

impl From<RecvError> for Stop {
    fn from(e: RecvError) -> Stop {
        Stop::Failed(e)
    }
}

/// A record (or, with `messages`, a message) if one is there now, without letting go of the
/// interpreter first (a record already there costs no thread switch): `Some(Some(g))` a
/// record, `Some(None)` the end of the stream, `None` nothing yet (or the lock is taken).
fn try_now(
    py: Python<'_>,
    core: &Arc<ConsumerCore>,
    messages: bool,
) -> PyResult<Option<Option<Got>>> {
    let Ok(mut rx) = core.rx.try_lock() else {
        return Ok(None);
    };
    core.release_pending(&mut rx).map_err(|e| to_py(py, e))?;
    let got = if messages {
        match rx.try_recv_message() {
            Ok(Some(m)) => take_message(m, core, |r| py.detach(move || r.to_vec()))
                .map(|g| g.map(Some))
                .map_err(shmflow::Error::from),
            Ok(None) => Ok(Some(None)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(e) => Err(shmflow::Error::from(e)),
        }
    } else {
        match rx.try_recv() {
            Ok(Some(r)) => take(r, core, |r| py.detach(move || r.to_vec()))
                .map(|g| Some(Some(g)))
                .map_err(shmflow::Error::from),
            Ok(None) => Ok(Some(None)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(e) => Err(shmflow::Error::from(e)),
        }
    };
    got.map_err(|e| to_py(py, e))
}

/// A record as a `Got`, a spanning one copied as its parts come, in the executor.
async fn take_async(r: Record<'_>, core: &Arc<ConsumerCore>) -> Result<Got, RecvError> {
    if r.as_bytes().is_some() {
        return take(r, core, to_vec);
    }
    Ok(Got::Copied(r.to_vec_async().await?))
}

/// The next record (or message) in the executor; `taken` is set once one is under way (a
/// spanning record being copied), after which the wait must not be dropped.
async fn next_async(
    rx: &mut shmflow::Consumer,
    core: &Arc<ConsumerCore>,
    messages: bool,
    taken: &Cell<bool>,
) -> Result<Option<Got>, RecvError> {
    loop {
        if !messages {
            let Some(r) = rx.recv_async().await? else {
                return Ok(None);
            };
            taken.set(true);
            return take_async(r, core).await.map(Some);
        }
        let Some(m) = rx.recv_message_async().await? else {
            return Ok(None);
        };
        taken.set(true);
        if let Message::Record(r) = m {
            return take_async(r, core).await.map(Some);
        }
        // (An event or a barrier needs no wait; a latency marker is passed over.)
        match take_message(m, core, to_vec)? {
            Some(g) => return Ok(Some(g)),
            None => taken.set(false),
        }
    }
}

/// The wait of an async receive: holds the consumer until a record (or message) comes.
/// Views given up meanwhile ring the bell (`Pin::drop`): the wait, if nothing is under way,
/// is dropped (which withdraws it and loses nothing), their segments go back, and it starts
/// again. Raises `ViewsHeld` where the sync receive does.
///
/// The lock is held across the wait on purpose: the consumer's other calls refuse while
/// `aio` is set, and a view's release only tries it (`Pin::drop`), so nothing waits for it.
#[allow(clippy::await_holding_lock)]
async fn recv_wait(
    core: &Arc<ConsumerCore>,
    messages: bool,
    segments: usize,
    name: &str,
) -> PyResult<Option<Got>> {
    let py_err = |e: RecvError| Python::attach(|py| to_py(py, e));
    let mut rx = core.lock();
    loop {
        core.release_pending(&mut rx).map_err(py_err)?;
        if rx.held_segments() >= segments {
            return Err(Python::attach(|py| {
                raise(
                    py,
                    "ViewsHeld",
                    format!(
                        "{name}: views of received records (slices, numpy arrays) hold every \
                         segment of the channel, so the producer can send nothing more; \
                         release them (del) or copy them (bytes(view))"
                    ),
                )
            }));
        }
        let taken = Cell::new(false);
        // Dropped with the wait (a cancellation) once a record is under way: marks it lost.
        let mut guard = LostGuard {
            core,
            taken: &taken,
            armed: true,
        };
        let got = {
            let mut next = std::pin::pin!(next_async(&mut rx, core, messages, &taken));
            std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = next.as_mut().poll(cx) {
                    return Poll::Ready(Some(r));
                }
                if !taken.get() && core.has_released() {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await
        };
        guard.armed = false;
        if let Some(r) = got {
            return r.map_err(py_err);
        }
    }
}

/// Marks the consumer's record lost if dropped armed after the record was taken.
struct LostGuard<'a> {
    core: &'a ConsumerCore,
    taken: &'a Cell<bool>,
    armed: bool,
}

impl Drop for LostGuard<'_> {
    fn drop(&mut self) {
        if self.armed && self.taken.get() {
            // Relaxed: read by the next receive, on the thread that polls this one.
            self.core.lost.store(true, Ordering::Relaxed);
        }
    }
}

impl PyConsumer {
    /// `recv_async` and `recv_message_async`: an awaitable of the next record (or message).
    fn begin_async(
        slf: &Bound<'_, Self>,
        timeout: Option<f64>,
        messages: bool,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let driver = py.import("shmflow._aio")?;
        aio::on_loop_thread(py)?;
        let mut this = slf.try_borrow_mut()?;
        this.not_busy()?;
        if timeout.is_some_and(|t| !t.is_finite() || t < 0.0) {
            wait::deadline(timeout)?;
        }
        this.retire(py);
        if let Some(l) = this.leftover.take() {
            return Ok(driver.call_method1("ready", (l,))?.unbind());
        }
        this.raise_pending()?;
        let core = this.core(py)?;
        this.raise_lost(py, &core)?;
        let busy = Busy::take(&core.aio, &this.name)?;
        let bell = Bell::of(&core.bell)?;
        let (segments, name) = (this.segments, this.name.clone());
        drop(this);
        let owner: Py<PyConsumer> = slf.clone().unbind();
        let label = name.clone();
        let op: aio::Op = Box::pin(async move {
            let got = recv_wait(&core, messages, segments, &name).await;
            // The consumer is free again before the record is handed out.
            drop(busy);
            Python::attach(|py| {
                let got = got?;
                let mut c = owner.bind(py).try_borrow_mut()?;
                match got {
                    Some(g) => c.hand_out(py, g),
                    None => Ok(py.None()),
                }
            })
        });
        // Polled once now: a record already there (even one that spans segments, copied as
        // its parts come) is not a wait.
        let mut pending = Pending::new(op, bell);
        if let Some(v) = pending.poll_now()? {
            return Ok(driver.call_method1("ready", (v,))?.unbind());
        }
        Ok(driver
            .call_method1("drive", (pending, timeout, label))?
            .unbind())
    }
}
