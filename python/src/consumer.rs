//! `shmflow.Consumer`: records as read-only memoryviews of the segments they sit in.

use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use shmflow::{Record, RecvError, RecvTimeoutError, SegmentHold, TryRecvError};

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
}

impl ConsumerCore {
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
    }
}

/// A record taken from the consumer, before it becomes a Python object.
enum Got {
    /// In one segment: its bytes stay where they are while the hold lives.
    InPlace {
        ptr: usize,
        len: usize,
        hold: Option<SegmentHold>,
    },
    /// Spanning segments: copied out.
    Copied(Vec<u8>),
}

fn take(mut r: Record<'_>) -> Result<Got, RecvError> {
    if let Some(b) = r.as_bytes() {
        let (ptr, len) = (b.as_ptr() as usize, b.len());
        return Ok(Got::InPlace {
            ptr,
            len,
            hold: r.hold_segment(),
        });
    }
    Ok(Got::Copied(r.to_vec()?))
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
#[pyclass(module = "shmflow._shmflow", name = "Consumer")]
pub(crate) struct PyConsumer {
    core: Option<Arc<ConsumerCore>>,
    /// The views handed out by the last receive, with their exporters.
    out: Vec<(Py<PyAny>, Py<PyAny>)>,
    name: String,
    segments: usize,
    /// A record that `recv_batch(rows=…)` took but could not put in its array: the next
    /// receive returns it first.
    leftover: Option<Py<PyAny>>,
}

impl PyConsumer {
    fn wrap(rx: shmflow::Consumer) -> PyConsumer {
        let name = rx.region_name().to_string();
        let segments = rx.geometry().segment_count as usize;
        PyConsumer {
            core: Some(Arc::new(ConsumerCore {
                rx: Mutex::new(rx),
                released: Mutex::new(Vec::new()),
            })),
            out: Vec::new(),
            name,
            segments,
            leftover: None,
        }
    }

    fn core(&self, py: Python<'_>) -> PyResult<Arc<ConsumerCore>> {
        self.core.clone().ok_or_else(|| {
            raise(
                py,
                "Closed",
                format!("{}: this consumer was closed", self.name),
            )
        })
    }

    /// Releases the views of the last receive (see the type's documentation).
    fn retire(&mut self, py: Python<'_>) {
        for (exporter, mv) in self.out.drain(..) {
            view::retire(py, &exporter, &mv);
        }
    }

    /// A Python object for a record: a memoryview of it in place, or of its copy.
    fn hand_out(
        &mut self,
        py: Python<'_>,
        core: &Arc<ConsumerCore>,
        got: Got,
    ) -> PyResult<Py<PyAny>> {
        match got {
            Got::InPlace { ptr, len, hold } => {
                let pin = Pin {
                    hold,
                    core: core.clone(),
                };
                // SAFETY: the record's bytes are in a segment that `hold` keeps from the
                // producer (and the consumer, kept by `core`, keeps mapped) while the pin
                // lives; the view is read-only.
                let (exporter, mv) =
                    unsafe { view::new_view(py, ptr as *mut u8, len, true, Keep::Record(pin))? };
                self.out.push((exporter, mv.clone_ref(py)));
                Ok(mv)
            }
            Got::Copied(v) => {
                let b = PyBytes::new(py, &v);
                Ok(pyo3::types::PyMemoryView::from(&b)?.into_any().unbind())
            }
        }
    }

    /// One record, waiting up to `deadline`: `None` at the end of the stream.
    fn recv_one(&mut self, py: Python<'_>, deadline: Deadline) -> PyResult<Option<Got>> {
        let core = self.core(py)?;
        // Without letting go of the interpreter first: a record that is already there costs
        // no thread switch.
        if let Ok(mut rx) = core.rx.try_lock() {
            core.release_pending(&mut rx).map_err(|e| to_py(py, e))?;
            match rx.try_recv() {
                Ok(Some(r)) => return take(r).map(Some).map_err(|e| to_py(py, e)),
                Ok(None) => return Ok(None),
                Err(TryRecvError::Empty) => {}
                Err(e) => return Err(to_py(py, e)),
            }
        }
        let segments = self.segments;
        wait::until(py, deadline, &self.name, |slice_end| {
            let mut rx = core.lock();
            core.release_pending(&mut rx)?;
            let timed_out = match rx.recv_deadline(slice_end) {
                Ok(Some(r)) => return Ok(wait::Step::Done(Some(take(r)?))),
                Ok(None) => return Ok(wait::Step::Done(None)),
                Err(RecvTimeoutError::Timeout) => true,
                Err(e) => return Err(e.into()),
            };
            debug_assert!(timed_out);
            if rx.held_segments() >= segments {
                Ok(wait::Step::Stuck)
            } else {
                Ok(wait::Step::Again)
            }
        })
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
    /// descriptor in the parent once the child has it.
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
        self.retire(py);
        if let Some(l) = self.leftover.take() {
            return Ok(Some(l));
        }
        let deadline = wait::deadline(timeout)?;
        let core = self.core(py)?;
        match self.recv_one(py, deadline)? {
            Some(g) => self.hand_out(py, &core, g).map(Some),
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
        self.retire(py);
        if max == 0 {
            return Ok(PyList::empty(py).into_any().unbind());
        }
        if let Some(k) = rows {
            return self.recv_rows(py, max, timeout, k);
        }
        let list = PyList::empty(py);
        if let Some(l) = self.leftover.take() {
            list.append(l)?;
        } else {
            let deadline = wait::deadline(timeout)?;
            let core = self.core(py)?;
            match self.recv_one(py, deadline)? {
                Some(g) => list.append(self.hand_out(py, &core, g)?)?,
                None => return Ok(list.into_any().unbind()),
            }
        }
        let core = self.core(py)?;
        let mut got = Vec::new();
        {
            let mut rx = core.lock();
            let room = max - list.len();
            rx.try_drain(room, |r| {
                got.push(take(r)?);
                Ok::<_, RecvError>(())
            })
            .map_err(|e| to_py(py, e))?;
        }
        for g in got {
            list.append(self.hand_out(py, &core, g)?)?;
        }
        Ok(list.into_any().unbind())
    }

    /// Releases the views of the last receive now (they are released by the next receive
    /// anyway): their segments go back to the producer unless buffers made from them live.
    fn release(&mut self, py: Python<'_>) {
        self.retire(py);
    }

    /// Detaches: the producer's next call raises ``Closed``. Views still alive keep the
    /// shared memory mapped, and the consumer attached, until they go.
    fn close(&mut self, py: Python<'_>) {
        self.retire(py);
        self.leftover = None;
        self.core = None;
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

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&mut self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
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
        let mut block: Vec<u8> = Vec::with_capacity(max.min(1 << 20) * k);
        let mut n = 0usize;
        let mut odd: Option<Vec<u8>> = None;
        // The first record: waited for.
        if let Some(l) = self.leftover.take() {
            let b: Vec<u8> = l.bind(py).call_method0("tobytes")?.extract()?;
            if b.len() != k {
                self.leftover = Some(l);
                return Err(PyValueError::new_err(format!(
                    "the next record is {} bytes, not {k}: receive it with recv()",
                    b.len()
                )));
            }
            block.extend_from_slice(&b);
            n = 1;
        } else {
            let deadline = wait::deadline(timeout)?;
            match self.recv_one(py, deadline)? {
                Some(Got::InPlace { ptr, len, hold }) => {
                    // SAFETY: the hold (released just below, after the copy) keeps the bytes.
                    let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
                    if len == k {
                        block.extend_from_slice(bytes);
                        n = 1;
                    } else {
                        odd = Some(bytes.to_vec());
                    }
                    self.unhold(hold);
                }
                Some(Got::Copied(v)) if v.len() == k => {
                    block.extend_from_slice(&v);
                    n = 1;
                }
                Some(Got::Copied(v)) => odd = Some(v),
                None => {}
            }
        }
        if odd.is_none() && n > 0 && n < max {
            let core = self.core(py)?;
            let mut rx = core.lock();
            // The batch stops at the first record of another length (kept for the next
            // receive).
            let stopped = rx.try_drain(max - n, |r: Record<'_>| {
                match r.as_bytes() {
                    Some(b) if b.len() == k => {
                        block.extend_from_slice(b);
                        return Ok(());
                    }
                    Some(b) => odd = Some(b.to_vec()),
                    None => odd = Some(r.to_vec()?),
                }
                Err(Stop::Odd)
            });
            drop(rx);
            match stopped {
                Ok(_) | Err(Stop::Odd) => {}
                Err(Stop::Failed(e)) => return Err(to_py(py, e)),
            }
            n = block.len() / k;
        }
        if let Some(v) = odd {
            let b = PyBytes::new(py, &v);
            self.leftover = Some(pyo3::types::PyMemoryView::from(&b)?.into_any().unbind());
        }
        let bytes = PyBytes::new(py, &block);
        let mv = pyo3::types::PyMemoryView::from(&bytes)?;
        if n == 0 {
            // The end of the stream (memoryview cannot shape an empty block).
            return Ok(mv.into_any().unbind());
        }
        Ok(mv.call_method1("cast", ("B", (n, k)))?.unbind())
    }

    /// Gives a hold back at once (a record copied out needs no hold).
    fn unhold(&self, hold: Option<SegmentHold>) {
        if let (Some(h), Some(core)) = (hold, &self.core) {
            drop(Pin {
                hold: Some(h),
                core: core.clone(),
            });
        }
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
