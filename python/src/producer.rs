//! `shmflow.Producer`: copies any buffer into a segment once, or lets the caller fill a
//! claimed part of a segment in place.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use shmflow::{Alignment, DetachedClaim, SendTimeoutError, TrySendError};

use crate::aio::{self, Bell, Busy, Pending};
use crate::errors::{raise, to_py};
use crate::view::{self, Keep, RawBuffer};
use crate::wait::{self, Step};

/// Records up to this size are copied with the interpreter held (releasing it costs more
/// than the copy); larger ones are copied with it released.
const COPY_HELD: usize = 16 << 10;

/// Buffers of a list taken per round of `send_many`.
const LIST_CHUNK: usize = 1024;

/// The producer, shared with the exporter of an open claim (which keeps the mapping alive).
pub(crate) struct ProducerCore {
    tx: Mutex<Option<shmflow::Producer>>,
    /// The stream is to end as failed when the last user of the core goes (asked for while
    /// views of a claim kept the producer alive).
    fail_on_drop: AtomicBool,
    /// An async send is under way (it holds `tx` between its polls).
    aio: Arc<AtomicBool>,
    /// What wakes an async send's coroutine; made by the first one.
    bell: OnceLock<Arc<Bell>>,
}

impl Drop for ProducerCore {
    fn drop(&mut self) {
        // Relaxed: the flag was set by a thread that had the core; dropping it ends every use.
        if self.fail_on_drop.load(Ordering::Relaxed) {
            if let Some(tx) = self.tx.get_mut().unwrap_or_else(|p| p.into_inner()).take() {
                tx.fail();
            }
        }
    }
}

/// A claim handed out as a writable memoryview, not committed yet.
struct OpenClaim {
    claim: DetachedClaim,
    exporter: Py<PyAny>,
    view: Py<PyAny>,
}

/// A buffer of a Python object, held for the length of a call (`PyBuffer_Release` on drop).
/// Boxed: an exporter may point `shape` into the `Py_buffer` itself.
pub(crate) struct Buf(Box<RawBuffer>);

impl Buf {
    pub(crate) fn get(obj: &Bound<'_, PyAny>, flags: std::ffi::c_int) -> PyResult<Buf> {
        // SAFETY: an all-zero `Py_buffer` is a valid blank for `PyObject_GetBuffer` to fill.
        let mut raw: Box<RawBuffer> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: GIL held (`obj` is bound); `raw` is a writable `Py_buffer`.
        if unsafe { view::PyObject_GetBuffer(obj.as_ptr(), &mut *raw, flags) } < 0 {
            let err = PyErr::fetch(obj.py());
            if err.is_instance_of::<pyo3::exceptions::PyBufferError>(obj.py())
                || err.is_instance_of::<PyTypeError>(obj.py())
            {
                return Err(PyTypeError::new_err(format!(
                    "a record must be a C-contiguous buffer (bytes, bytearray, memoryview, numpy \
                     array), not {}: {err}",
                    obj.get_type().name()?
                )));
            }
            return Err(err);
        }
        Ok(Buf(raw))
    }

    /// The bytes' address and length (read with the interpreter released: the export keeps
    /// them where they are until the `Buf` is dropped).
    pub(crate) fn span(&self) -> (usize, usize) {
        (self.0.buf as usize, self.0.len as usize)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: filled by a successful `PyObject_GetBuffer`; the GIL is held wherever a
        // `Buf` is dropped (they never leave the calls that made them).
        unsafe { view::PyBuffer_Release(&mut *self.0) };
    }
}

/// The bytes at `(ptr, len)` from [`Buf::span`].
///
/// # Safety
/// The `Buf` they came from must be alive.
pub(crate) unsafe fn bytes<'a>((ptr, len): (usize, usize)) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: the caller keeps the export alive, so the exporter's `len` bytes at `buf` stay
    // allocated. Another Python thread could write a bytearray while we copy it without the
    // GIL: a data race on plain bytes, which the buffer protocol leaves to the program (as
    // for every C extension that reads a buffer without the GIL); the copy is then torn.
    unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }
}

/// The writing end of a channel.
///
/// ``send`` copies any C-contiguous buffer (bytes, bytearray, memoryview, numpy array) into
/// a segment once; ``claim(n)`` gives a writable memoryview of ``n`` bytes in a segment to
/// fill in place, sent by ``commit()``. A send waits while the consumer holds every segment
/// (backpressure): nothing is dropped, nothing is buffered without bound.
///
/// As a context manager it closes the stream on a normal exit (the consumer reads every
/// record, then the end) and fails it on an exception (the consumer gets
/// ``ProducerFailed``).
#[pyclass(module = "shmflow", name = "Producer")]
pub(crate) struct PyProducer {
    core: Arc<ProducerCore>,
    claim: Option<OpenClaim>,
    name: String,
    max_unspanned: usize,
}

fn lock(core: &ProducerCore) -> MutexGuard<'_, Option<shmflow::Producer>> {
    core.tx.lock().unwrap_or_else(|p| p.into_inner())
}

impl PyProducer {
    fn wrap(tx: shmflow::Producer) -> PyProducer {
        let name = tx.region_name().to_string();
        let max_unspanned = tx.max_unspanned_len();
        PyProducer {
            core: Arc::new(ProducerCore {
                tx: Mutex::new(Some(tx)),
                fail_on_drop: AtomicBool::new(false),
                aio: Arc::new(AtomicBool::new(false)),
                bell: OnceLock::new(),
            }),
            claim: None,
            name,
            max_unspanned,
        }
    }

    fn closed(&self, py: Python<'_>) -> PyErr {
        raise(
            py,
            "Closed",
            format!(
                "{}: this producer was closed or given to a Partition",
                self.name
            ),
        )
    }

    /// Raises unless the producer can be given to a partition: open, no claim, no async send,
    /// not failing once a claim's views go.
    pub(crate) fn check_free(&self, py: Python<'_>) -> PyResult<()> {
        self.no_claim(py)?;
        // Relaxed: set by a thread that had this object, which the caller now has.
        if self.core.fail_on_drop.load(Ordering::Relaxed) {
            return Err(raise(
                py,
                "Error",
                format!(
                    "{}: this producer fails once the views of its claim go",
                    self.name
                ),
            ));
        }
        match self.core.tx.try_lock() {
            Ok(g) if g.is_some() => Ok(()),
            Ok(_) => Err(self.closed(py)),
            Err(_) => Err(PyRuntimeError::new_err(format!(
                "{}: this producer is in use by another thread",
                self.name
            ))),
        }
    }

    /// The producer itself, for a partition: this object is closed from then on.
    pub(crate) fn take_inner(&mut self, py: Python<'_>) -> PyResult<shmflow::Producer> {
        self.no_claim(py)?;
        let tx = py.detach(|| lock(&self.core).take());
        tx.ok_or_else(|| self.closed(py))
    }

    /// Raises while an async send is under way.
    fn idle(&self) -> PyResult<()> {
        aio::check(&self.core.aio, &self.name)
    }

    fn no_claim(&self, py: Python<'_>) -> PyResult<()> {
        self.idle()?;
        if self.claim.is_some() {
            return Err(raise(
                py,
                "Error",
                format!(
                    "{}: a claim is open; commit() or abort_claim() it before any other call",
                    self.name
                ),
            ));
        }
        Ok(())
    }

    /// Sends the bytes of one export, waiting up to `deadline`.
    fn send_span(
        &self,
        py: Python<'_>,
        span: (usize, usize),
        deadline: wait::Deadline,
    ) -> PyResult<()> {
        let core = &*self.core;
        // (Not for a record that spans segments: `try_send` sends the parts of one larger than
        // the pool as far as they go, and aborts it where the pool runs dry.)
        if span.1 <= COPY_HELD.min(self.max_unspanned) {
            if let Ok(mut g) = core.tx.try_lock() {
                let tx = g.as_mut().ok_or_else(|| self.closed(py))?;
                // SAFETY: the caller holds the export.
                match tx.try_send(unsafe { bytes(span) }) {
                    Ok(()) => return Ok(()),
                    Err(TrySendError::Full) => {}
                    Err(e) => return Err(to_py(py, e)),
                }
            }
        }
        if span.1 > self.max_unspanned {
            // A record over several segments is sent whole in one wait (a wait cut short
            // would abort it half-way).
            let r = py.detach(|| {
                lock(core)
                    .as_mut()
                    // SAFETY: the caller holds the export.
                    .map(|tx| tx.send(unsafe { bytes(span) }))
            });
            return match r {
                None => Err(self.closed(py)),
                Some(r) => r.map_err(|e| to_py(py, e)),
            };
        }
        let r = wait::until(py, deadline, &self.name, |end| {
            let mut g = lock(core);
            let Some(tx) = g.as_mut() else {
                return Ok(Step::Closed);
            };
            // SAFETY: the caller holds the export.
            match tx.send_deadline(unsafe { bytes(span) }, end) {
                Ok(()) => Ok(Step::Done(())),
                Err(SendTimeoutError::Timeout) => Ok(Step::Again),
                Err(e) => Err(e.into()),
            }
        });
        r
    }

    /// Sends every span in order, waiting up to `deadline`; returns how many were sent
    /// (all, unless an error is raised).
    fn send_spans(
        &self,
        py: Python<'_>,
        spans: &[(usize, usize)],
        deadline: wait::Deadline,
    ) -> Result<usize, (usize, PyErr)> {
        let core = &*self.core;
        let next = AtomicUsize::new(0);
        let max_unspanned = self.max_unspanned;
        let r = wait::until(py, deadline, &self.name, |end| {
            let mut g = lock(core);
            let Some(tx) = g.as_mut() else {
                return Ok(Step::Closed);
            };
            loop {
                // Relaxed: only this thread touches it (the slices run one after another).
                let i = next.load(Ordering::Relaxed);
                let Some(&span) = spans.get(i) else {
                    return Ok(Step::Done(()));
                };
                // SAFETY: the caller holds the exports.
                let b = unsafe { bytes(span) };
                let sent = if b.len() > max_unspanned {
                    tx.send(b).map_err(shmflow::Error::from)
                } else {
                    match tx.send_deadline(b, end) {
                        Ok(()) => Ok(()),
                        Err(SendTimeoutError::Timeout) => return Ok(Step::Again),
                        Err(e) => Err(e.into()),
                    }
                };
                sent?;
                next.store(i + 1, Ordering::Relaxed);
            }
        });
        // Relaxed: read after the last slice, on this thread.
        let sent = next.load(Ordering::Relaxed);
        r.map(|()| sent).map_err(|e| (sent, e))
    }
}

/// A barrier's `alignment` argument: `"aligned"` (or `None`), `"unaligned"`, or seconds.
pub(crate) fn alignment_of(alignment: Option<&Bound<'_, PyAny>>) -> PyResult<Alignment> {
    let Some(a) = alignment else {
        return Ok(Alignment::Aligned);
    };
    match a.extract::<String>() {
        Ok(s) if s == "aligned" => Ok(Alignment::Aligned),
        Ok(s) if s == "unaligned" => Ok(Alignment::Unaligned),
        Ok(s) => Err(PyValueError::new_err(format!(
            "alignment is \"aligned\", \"unaligned\" or seconds, not {s:?}"
        ))),
        Err(_) => {
            let secs: f64 = a.extract()?;
            let d = std::time::Duration::try_from_secs_f64(secs).map_err(|_| {
                PyValueError::new_err(format!("alignment timeout {secs} is out of range"))
            })?;
            Ok(Alignment::AlignedWithTimeout(d))
        }
    }
}

/// `e` with the number of records sent before it, as its `sent` attribute.
fn with_sent(py: Python<'_>, e: PyErr, sent: usize) -> PyErr {
    // (An exception that takes no attributes is raised as it is.)
    let _ = e.value(py).setattr("sent", sent);
    e
}

#[pymethods]
impl PyProducer {
    /// Creates the named channel ``name`` (``/name``, mode 0600) as its producer, with a
    /// pool of ``segment_count`` segments of ``segment_size`` bytes; a consumer opens it
    /// with ``Consumer.open(name)``.
    #[staticmethod]
    #[pyo3(signature = (name, segment_size = 65536, segment_count = 8))]
    fn create(
        py: Python<'_>,
        name: &str,
        segment_size: usize,
        segment_count: usize,
    ) -> PyResult<PyProducer> {
        let g = crate::geometry(segment_size, segment_count)?;
        let tx = py
            .detach(|| shmflow::Producer::create(name, g))
            .map_err(|e| to_py(py, e))?;
        Ok(PyProducer::wrap(tx))
    }

    /// Opens the producer end of the named channel ``name``, made by ``Consumer.create``.
    #[staticmethod]
    fn open(py: Python<'_>, name: &str) -> PyResult<PyProducer> {
        let tx = py
            .detach(|| shmflow::Producer::open(name))
            .map_err(|e| to_py(py, e))?;
        Ok(PyProducer::wrap(tx))
    }

    /// Creates an anonymous channel as its producer. Returns the producer and a file
    /// descriptor that a child process opens with ``Consumer.from_fd`` (pass it with
    /// ``subprocess.Popen(..., pass_fds=[fd])``, or inherit it through ``fork``); close the
    /// descriptor in the parent once the child has it. Once every copy of it is closed and no
    /// consumer attached (the child died first), waits for one raise ``PeerDead`` ("no consumer
    /// ever attached").
    #[staticmethod]
    #[pyo3(signature = (segment_size = 65536, segment_count = 8))]
    fn create_anonymous(
        py: Python<'_>,
        segment_size: usize,
        segment_count: usize,
    ) -> PyResult<(PyProducer, i32)> {
        let g = crate::geometry(segment_size, segment_count)?;
        let (tx, handle) = shmflow::Producer::create_anonymous(g).map_err(|e| to_py(py, e))?;
        Ok((PyProducer::wrap(tx), crate::handle_fd(handle)))
    }

    /// Opens the producer end of an anonymous channel from the descriptor a parent passed.
    #[staticmethod]
    fn from_fd(py: Python<'_>, fd: i32) -> PyResult<PyProducer> {
        let tx = crate::with_fd(py, fd, |b| shmflow::Producer::from_fd(b))?;
        Ok(PyProducer::wrap(tx))
    }

    /// Opens channel ``channel`` of the named gate ``name`` (made by ``Gate.create``) as its
    /// producer.
    #[staticmethod]
    fn open_channel(py: Python<'_>, name: &str, channel: u32) -> PyResult<PyProducer> {
        let tx = py
            .detach(|| shmflow::Producer::open_channel(name, channel))
            .map_err(|e| to_py(py, e))?;
        Ok(PyProducer::wrap(tx))
    }

    /// Sends one record: the bytes of ``data`` (any C-contiguous buffer), copied once into
    /// a segment. Waits up to ``timeout`` seconds (``None``: as long as it takes) for a free
    /// segment while the consumer is behind.
    ///
    /// Raises ``Timeout``, ``Closed`` (the consumer left), ``PeerDead`` (it died).
    #[pyo3(signature = (data, timeout = None))]
    fn send(&self, py: Python<'_>, data: &Bound<'_, PyAny>, timeout: Option<f64>) -> PyResult<()> {
        self.no_claim(py)?;
        let buf = Buf::get(data, view::PYBUF_SIMPLE)?;
        self.send_span(py, buf.span(), wait::deadline(timeout)?)
    }

    /// Sends one record if a segment has room now; returns whether it was sent.
    fn try_send(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<bool> {
        match self.send(py, data, Some(0.0)) {
            Ok(()) => Ok(true),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyTimeoutError>(py) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// ``await producer.send_async(data)``: as ``send``, waiting for a free segment in the
    /// asyncio event loop instead of blocking the thread: other tasks run meanwhile, and no
    /// thread waits for it (shmflow's waker thread watches up to 127 waits at once). Call it
    /// in a coroutine of the loop that awaits it. ``timeout`` raises ``Timeout``. Cancelling it sends nothing, except for a record
    /// larger than the channel's segments, which goes out part by part: cancelled half-way,
    /// the consumer is told it was aborted (``RecordAborted``). Keep ``data`` unchanged
    /// until it is done (it is read when a segment is free). While it is under way, the
    /// producer's other calls raise ``RuntimeError``.
    #[pyo3(signature = (data, timeout = None))]
    fn send_async(
        slf: &Bound<'_, Self>,
        data: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let driver = py.import("shmflow._aio")?;
        aio::on_loop_thread(py)?;
        let this = slf.try_borrow()?;
        this.no_claim(py)?;
        if timeout.is_some_and(|t| !t.is_finite() || t < 0.0) {
            wait::deadline(timeout)?;
        }
        let buf = Buf::get(data, view::PYBUF_SIMPLE)?;
        let span = buf.span();
        let core = this.core.clone();
        // (A record that spans segments goes to `send_async`: see `send_span`.)
        let fast = span.1 <= this.max_unspanned;
        if let Some(mut g) = core.tx.try_lock().ok().filter(|_| fast) {
            let tx = g.as_mut().ok_or_else(|| this.closed(py))?;
            let sent = if span.1 <= COPY_HELD {
                // SAFETY: `buf` holds the export.
                tx.try_send(unsafe { bytes(span) })
            } else {
                // SAFETY: `buf` holds the export (past the call).
                py.detach(|| tx.try_send(unsafe { bytes(span) }))
            };
            match sent {
                Ok(()) => return Ok(driver.call_method1("ready", (py.None(),))?.unbind()),
                Err(TrySendError::Full) => {}
                Err(e) => return Err(to_py(py, e)),
            }
        }
        let busy = Busy::take(&core.aio, &this.name)?;
        let bell = Bell::of(&core.bell)?;
        let name = this.name.clone();
        drop(this);
        // The lock is held across the wait on purpose: the producer's other calls refuse
        // while `aio` is set. It is tried, not waited for: another thread's blocking call may
        // hold it (a record sent whole), and the loop must not wait for that with the GIL.
        #[allow(clippy::await_holding_lock)]
        let op: aio::Op = Box::pin(async move {
            let sent = {
                let mut g = loop {
                    match core.tx.try_lock() {
                        Ok(g) => break g,
                        Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                        Err(std::sync::TryLockError::WouldBlock) => aio::yield_once().await,
                    }
                };
                match g.as_mut() {
                    None => None,
                    // SAFETY: `buf`, moved into this future, holds the export for as long
                    // as the future lives (it is dropped after the send).
                    Some(tx) => Some(tx.send_async(unsafe { bytes(span) }).await),
                }
            };
            drop(busy);
            // Dropped here, with the GIL (the future is polled and dropped only with it).
            drop(buf);
            Python::attach(|py| match sent {
                None => Err(raise(
                    py,
                    "Closed",
                    format!("{name}: this producer was closed"),
                )),
                Some(r) => r.map(|()| py.None()).map_err(|e| to_py(py, e)),
            })
        });
        let label = slf.try_borrow()?.name.clone();
        let mut pending = Pending::new(op, bell);
        if let Some(v) = pending.poll_now()? {
            return Ok(driver.call_method1("ready", (v,))?.unbind());
        }
        Ok(driver
            .call_method1("drive", (pending, timeout, label))?
            .unbind())
    }

    /// Sends many records in one call: ``records`` is a list or tuple of buffers (one record
    /// each), or one C-contiguous buffer with a shape, such as a numpy array, sent as one
    /// record per row (``a[i]`` for each ``i``: a structured array's elements, a 2-D
    /// array's rows). Returns the number of records sent.
    #[pyo3(signature = (records, timeout = None))]
    fn send_many(
        &self,
        py: Python<'_>,
        records: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<usize> {
        self.no_claim(py)?;
        let deadline = wait::deadline(timeout)?;
        if records.is_instance_of::<pyo3::types::PyBytes>()
            || records.is_instance_of::<pyo3::types::PyByteArray>()
        {
            return Err(PyTypeError::new_err(
                "send_many of one bytes object would send a record per byte: use send(), or \
                 pass a list of records",
            ));
        }
        if records.is_instance_of::<PyList>() || records.is_instance_of::<PyTuple>() {
            let items: Vec<Bound<'_, PyAny>> = records.try_iter()?.collect::<PyResult<_>>()?;
            let mut sent = 0;
            for chunk in items.chunks(LIST_CHUNK) {
                let bufs = chunk
                    .iter()
                    .map(|o| Buf::get(o, view::PYBUF_SIMPLE))
                    .collect::<PyResult<Vec<Buf>>>()?;
                let spans: Vec<_> = bufs.iter().map(Buf::span).collect();
                let before = sent;
                sent += self
                    .send_spans(py, &spans, deadline)
                    .map_err(|(k, e)| with_sent(py, e, before + k))?;
            }
            return Ok(sent);
        }
        let buf = Buf::get(records, view::PYBUF_C_CONTIGUOUS | view::PYBUF_FORMAT)?;
        let raw = &*buf.0;
        if raw.ndim < 1 || raw.shape.is_null() {
            return Err(PyTypeError::new_err(
                "send_many takes a list of buffers or an array with at least one dimension",
            ));
        }
        // SAFETY: `ndim >= 1` and a C-contiguous request fills `shape` with `ndim` entries.
        let rows = unsafe { *raw.shape } as usize;
        if rows == 0 {
            return Ok(0);
        }
        let (base, len) = buf.span();
        let row = len / rows;
        let spans: Vec<_> = (0..rows).map(|i| (base + i * row, row)).collect();
        self.send_spans(py, &spans, deadline)
            .map_err(|(k, e)| with_sent(py, e, k))
    }

    /// Claims ``n`` bytes in a segment and returns them as a writable memoryview, to fill in
    /// place (``numpy.frombuffer(view, dtype)`` writes through it); ``commit()`` sends them,
    /// ``abort_claim()`` drops them. No other call on this producer is allowed until then.
    #[pyo3(signature = (n, timeout = None))]
    fn claim(&mut self, py: Python<'_>, n: usize, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        self.no_claim(py)?;
        if n > self.max_unspanned {
            return Err(raise(
                py,
                "RecordTooLarge",
                format!(
                    "{}: a claim is at most {} bytes (one segment less its frame header), not {n}",
                    self.name, self.max_unspanned
                ),
            ));
        }
        let core = &*self.core;
        let got = wait::until(py, wait::deadline(timeout)?, &self.name, |end| {
            let mut g = lock(core);
            let Some(tx) = g.as_mut() else {
                return Ok(Step::Closed);
            };
            match tx.claim_deadline(n, end) {
                Ok(c) => {
                    let (claim, ptr) = c.detach();
                    Ok(Step::Done((claim, ptr.as_ptr() as usize)))
                }
                Err(SendTimeoutError::Timeout) => Ok(Step::Again),
                Err(e) => Err(e.into()),
            }
        });
        let (claim, ptr) = got?;
        // SAFETY: the claimed bytes are the producer's alone until the claim is committed or
        // dropped, and every other call is refused meanwhile (`no_claim`); `Keep::Claim`
        // keeps the core alive while the view lives, and the producer stays in it (and the
        // mapping with it) because `close` and `fail` take it out only after the claim's
        // views are gone (`fail` otherwise leaves it to the core's drop).
        let (exporter, mv) = unsafe {
            view::new_view(py, ptr as *mut u8, n, false, Keep::Claim(self.core.clone()))?
        };
        self.claim = Some(OpenClaim {
            claim,
            exporter,
            view: mv.clone_ref(py),
        });
        Ok(mv)
    }

    /// Sends the open claim with its first ``length`` bytes (all of them by default). The
    /// claim's memoryview is released; buffers made from it must be released first.
    #[pyo3(signature = (length = None))]
    fn commit(&mut self, py: Python<'_>, length: Option<usize>) -> PyResult<()> {
        if let (Some(open), Some(len)) = (&self.claim, length) {
            if len > open.claim.len() {
                return Err(PyValueError::new_err(format!(
                    "commit({len}) is more than the {} bytes claimed (the claim stays open)",
                    open.claim.len()
                )));
            }
        }
        let c = self.end_claim(py)?;
        let len = length.unwrap_or(c.len());
        let mut g = lock(&self.core);
        let tx = g.as_mut().ok_or_else(|| self.closed(py))?;
        tx.commit_detached(c, len)
            .map_err(|e| raise(py, "StaleClaim", e.to_string()))
    }

    /// Drops the open claim: nothing is sent.
    fn abort_claim(&mut self, py: Python<'_>) -> PyResult<()> {
        self.end_claim(py).map(drop)
    }

    /// Publishes what was committed and wakes the consumer (with the default flush policy
    /// every record is published as it is sent; this matters after ``claim``).
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.no_claim(py)?;
        let core = &*self.core;
        let r = wait::until(py, None, &self.name, |end| {
            let mut g = lock(core);
            let Some(tx) = g.as_mut() else {
                return Ok(Step::Closed);
            };
            match tx.flush_deadline(end) {
                Ok(()) => Ok(Step::Done(())),
                Err(SendTimeoutError::Timeout) => Ok(Step::Again),
                Err(e) => Err(e.into()),
            }
        });
        r
    }

    /// Sends an event: ``kind`` (a number the application defines) and a small ``payload``
    /// (at most ``shmflow.MAX_EVENT_PAYLOAD`` bytes), in order with the records, or ahead of
    /// the records queued before it with ``priority=True``. The consumer gets it from
    /// ``recv_message``.
    #[pyo3(signature = (kind, payload = None, priority = false, timeout = None))]
    fn send_event(
        &self,
        py: Python<'_>,
        kind: u32,
        payload: Option<&Bound<'_, PyAny>>,
        priority: bool,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        self.no_claim(py)?;
        let buf = payload
            .map(|p| Buf::get(p, view::PYBUF_SIMPLE))
            .transpose()?;
        let span = buf.as_ref().map_or((0, 0), Buf::span);
        let core = &*self.core;
        let r = wait::until(py, wait::deadline(timeout)?, &self.name, |end| {
            let mut g = lock(core);
            let Some(tx) = g.as_mut() else {
                return Ok(Step::Closed);
            };
            // SAFETY: `buf` holds the export for the call.
            let p = unsafe { bytes(span) };
            let r = if priority {
                tx.send_priority_event_deadline(kind, p, end)
            } else {
                tx.send_event_deadline(kind, p, end)
            };
            match r {
                Ok(()) => Ok(Step::Done(())),
                Err(SendTimeoutError::Timeout) => Ok(Step::Again),
                Err(e) => Err(e.into()),
            }
        });
        r
    }

    /// Sends checkpoint barrier ``id`` with a small ``payload`` (at most
    /// ``shmflow.MAX_BARRIER_PAYLOAD`` bytes). ``alignment``: ``"aligned"`` (a gate holds each
    /// channel whose barrier came until it came on all), ``"unaligned"`` (announced ahead of
    /// the queued records, which it hands back as in-flight data), or a number of seconds
    /// after which an aligned barrier turns unaligned.
    #[pyo3(signature = (id, alignment = None, payload = None, timeout = None))]
    fn send_barrier(
        &self,
        py: Python<'_>,
        id: u64,
        alignment: Option<&Bound<'_, PyAny>>,
        payload: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<()> {
        self.no_claim(py)?;
        let alignment = alignment_of(alignment)?;
        let buf = payload
            .map(|p| Buf::get(p, view::PYBUF_SIMPLE))
            .transpose()?;
        let span = buf.as_ref().map_or((0, 0), Buf::span);
        let core = &*self.core;
        wait::until(py, wait::deadline(timeout)?, &self.name, |end| {
            let mut g = lock(core);
            let Some(tx) = g.as_mut() else {
                return Ok(Step::Closed);
            };
            // SAFETY: `buf` holds the export for the call.
            match tx.send_barrier_deadline(id, alignment, unsafe { bytes(span) }, end) {
                Ok(()) => Ok(Step::Done(())),
                Err(SendTimeoutError::Timeout) => Ok(Step::Again),
                Err(e) => Err(e.into()),
            }
        })
    }

    /// Ends the stream: the consumer reads every record sent, then the end. With ``timeout``
    /// (seconds), waits until the consumer has read everything, raising ``Timeout`` if it
    /// has not by then (the stream is ended either way).
    #[pyo3(signature = (timeout = None))]
    fn close(&mut self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        self.idle()?;
        if self.claim.is_some() {
            self.abort_claim(py)?;
        }
        let Some(tx) = lock(&self.core).take() else {
            return Ok(());
        };
        match timeout {
            None => {
                py.detach(|| tx.close());
                Ok(())
            }
            Some(t) => {
                let d = wait::deadline(Some(t))?.expect("a timeout gives a deadline");
                py.detach(|| tx.close_deadline(d)).map_err(|e| to_py(py, e))
            }
        }
    }

    /// Ends the stream as failed: the consumer gets ``ProducerFailed`` after the records
    /// sent before.
    fn fail(&mut self, py: Python<'_>) -> PyResult<()> {
        self.idle()?;
        if self.claim.is_some() && self.abort_claim(py).is_err() {
            // Views of the claim still reach into the segment: the producer (and the
            // mapping) stays until they go, and fails then.
            self.claim = None;
            self.core.fail_on_drop.store(true, Ordering::Relaxed);
            return Ok(());
        }
        let tx = py.detach(|| lock(&self.core).take());
        if let Some(tx) = tx {
            tx.fail();
        }
        Ok(())
    }

    /// The channel's counters and Flink's figures, as a dict (see ``shmflow stat``).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.idle()?;
        // The lock is waited for without the GIL: a send may hold it while it waits.
        let snap = py.detach(|| lock(&self.core).as_ref().map(|tx| tx.metrics()));
        crate::snapshot_dict(py, &snap.ok_or_else(|| self.closed(py))?)
    }

    /// Sets how a waiting send waits: ``"block"`` (the default), ``"park"`` or
    /// ``"busy-poll:200us"`` (see ``Consumer.set_wait``).
    fn set_wait(&self, py: Python<'_>, wait: &str) -> PyResult<()> {
        self.idle()?;
        let w = crate::parse_wait(wait)?;
        let set = py.detach(|| lock(&self.core).as_mut().map(|tx| tx.set_wait_strategy(w)));
        set.ok_or_else(|| self.closed(py))
    }

    /// The channel's name.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The longest record that fits in one segment (longer ones span segments and are
    /// received as a copy).
    #[getter]
    fn max_unspanned_len(&self) -> usize {
        self.max_unspanned
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (exc_type, _exc = None, _tb = None))]
    fn __exit__(
        &mut self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if exc_type.is_some_and(|t| !t.is_none()) {
            self.fail(py)?;
        } else {
            self.close(py, None)?;
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = match self.core.tx.try_lock() {
            Ok(g) if g.is_some() => "open",
            Ok(_) => "closed",
            Err(_) => "in use",
        };
        format!("<shmflow.Producer {} ({state})>", self.name)
    }
}

impl PyProducer {
    /// Takes the open claim after releasing its memoryview.
    fn end_claim(&mut self, py: Python<'_>) -> PyResult<DetachedClaim> {
        let Some(open) = self.claim.take() else {
            return Err(raise(
                py,
                "Error",
                format!("{}: no claim is open", self.name),
            ));
        };
        if !view::retire(py, &open.exporter, &open.view) {
            self.claim = Some(open);
            return Err(raise(
                py,
                "ViewsHeld",
                format!(
                    "{}: buffers made from the claim's memoryview (slices, numpy arrays) are \
                     still alive; release them before commit() or abort_claim()",
                    self.name
                ),
            ));
        }
        Ok(open.claim)
    }
}
