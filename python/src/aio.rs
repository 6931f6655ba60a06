//! asyncio: a receive or send that would wait becomes a [`Pending`] operation, which the
//! coroutine `shmflow._aio.drive` polls on the event loop's thread. The operation is one of
//! the library's async futures (`recv_async`, `send_async`, …), which need no particular
//! executor: where no tokio runtime runs them they sleep through the library's waker thread
//! (one per process for up to 127 waits at once), which watches every announced park word
//! with one `futex_waitv` and calls the future's waker (also every 40 ms, when the wait looks
//! at its peer's liveness). Here the waker writes to an eventfd, [`Bell`], that the event
//! loop watches (`loop.add_reader`), so a wait costs no thread of its own and the loop runs
//! other tasks meanwhile.

use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The eventfd that wakes an operation's coroutine: the waker writes to it from any thread,
/// without the GIL; the event loop sees it readable.
pub(crate) struct Bell {
    fd: OwnedFd,
    /// Set by every wake: a wake during a poll (the future yielding to the executor in its
    /// busy phase) makes the coroutine poll again after one turn of the loop rather than
    /// wait for the descriptor. Relaxed: a hint only; the descriptor carries the wake-up
    /// itself (a write the kernel orders before the loop's readiness).
    woken: AtomicBool,
}

impl Bell {
    pub(crate) fn new() -> std::io::Result<Arc<Bell>> {
        // SAFETY: eventfd takes no pointer; a non-negative result is a new descriptor that
        // this process owns from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Arc::new(Bell {
            // SAFETY: `fd` was just made and is owned by nothing else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            woken: AtomicBool::new(false),
        }))
    }

    /// The bell in `cell`, made there by the first caller.
    pub(crate) fn of(cell: &OnceLock<Arc<Bell>>) -> PyResult<Arc<Bell>> {
        if let Some(b) = cell.get() {
            return Ok(b.clone());
        }
        let b = Bell::new()?;
        Ok(cell.get_or_init(|| b).clone())
    }

    /// Takes the wakes so far (the descriptor reads as not ready until the next one).
    fn drain(&self) {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into `v`, which has them; a non-blocking eventfd with no
        // wake pending fails with EAGAIN, which is ignored (nothing to take).
        let _ = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                (&mut v as *mut u64).cast::<libc::c_void>(),
                8,
            )
        };
    }

    /// Wakes the coroutine of the operation under way, if any (a view given up while a
    /// receive waits, so that the receive gives its segment back).
    pub(crate) fn ring(&self) {
        self.woken.store(true, Ordering::Relaxed);
        let one = 1u64;
        // SAFETY: writes the 8 bytes of `one`. It cannot block (EFD_NONBLOCK) and fails
        // only when the counter would overflow, in which case the descriptor is already
        // readable: the wake is not lost.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                8,
            )
        };
    }
}

impl Wake for Bell {
    fn wake(self: Arc<Self>) {
        self.ring();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.ring();
    }
}

/// Marks an end as having an async operation under way for as long as it lives: the end's
/// other calls raise meanwhile (they would wait for the lock the operation holds, on the very
/// thread that has to poll it).
pub(crate) struct Busy(Arc<AtomicBool>);

impl Busy {
    /// Marks `flag`, or raises if an operation is under way already.
    pub(crate) fn take(flag: &Arc<AtomicBool>, what: &str) -> PyResult<Busy> {
        // Acquire/Release: pairs with the Release of the previous operation's drop, so that
        // this one sees the end as that one left it (all on one thread in practice: the
        // event loop's).
        if flag
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(busy_error(what));
        }
        Ok(Busy(flag.clone()))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        // Release: pairs with `take`'s and `check`'s Acquire.
        self.0.store(false, Ordering::Release);
    }
}

/// Raises if an async operation of the end is under way.
pub(crate) fn check(flag: &AtomicBool, what: &str) -> PyResult<()> {
    // Acquire: pairs with `Busy`'s Release on drop.
    if flag.load(Ordering::Acquire) {
        return Err(busy_error(what));
    }
    Ok(())
}

fn busy_error(what: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "{what}: an async operation of this end is under way; await it (or cancel it) before \
         calling the end again"
    ))
}

/// The future of an operation: its result as a Python object, made with the GIL (which the
/// poll holds).
pub(crate) type Op = Pin<Box<dyn Future<Output = PyResult<Py<PyAny>>>>>;

/// One async operation under way, polled by `shmflow._aio.drive`. Not `Send`: the future may
/// hold the end's lock, and is polled and dropped on the event loop's thread only.
#[pyclass(module = "shmflow._shmflow", name = "Pending", unsendable)]
pub(crate) struct Pending {
    /// Dropped first: it may borrow what the fields below keep.
    op: Option<Op>,
    bell: Arc<Bell>,
    waker: Waker,
}

impl Pending {
    pub(crate) fn new(op: Op, bell: Arc<Bell>) -> Pending {
        let waker = Waker::from(bell.clone());
        Pending {
            op: Some(op),
            bell,
            waker,
        }
    }

    /// Polls once where the operation is made: its result if it is done at once.
    pub(crate) fn poll_now(&mut self) -> PyResult<Option<Py<PyAny>>> {
        match self.poll()? {
            (DONE, v) => Ok(v),
            _ => Ok(None),
        }
    }
}

/// Raises unless this thread runs an asyncio event loop: an operation is polled on the
/// thread that made it (the loop's), so `recv_async()` and `send_async()` are called in a
/// coroutine of the loop that awaits them.
pub(crate) fn on_loop_thread(py: Python<'_>) -> PyResult<()> {
    py.import("asyncio")?
        .call_method0("get_running_loop")
        .map(|_| ())
        .map_err(|_| {
            PyRuntimeError::new_err(
                "an async call of shmflow is made on the thread of the asyncio event loop that \
                 awaits it (in a coroutine); from another thread, use the blocking calls",
            )
        })
}

/// Lets the executor run once: the first poll wakes the task and is pending, the second is
/// ready (the coroutine looks again after one turn of the loop).
pub(crate) async fn yield_once() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// What a poll came to, as `drive` reads it.
const DONE: u8 = 0;
const AGAIN: u8 = 1;
const WAIT: u8 = 2;

#[pymethods]
impl Pending {
    /// The descriptor to watch for readiness (`loop.add_reader`).
    #[getter]
    fn fd(&self) -> i32 {
        self.bell.fd.as_raw_fd()
    }

    /// Polls the operation once: ``(0, result)`` when it is done, ``(1, None)`` to poll again
    /// after one turn of the loop, ``(2, None)`` to poll again once ``fd`` is readable.
    fn poll(&mut self) -> PyResult<(u8, Option<Py<PyAny>>)> {
        let Some(op) = self.op.as_mut() else {
            return Err(PyRuntimeError::new_err("this operation has ended"));
        };
        self.bell.drain();
        self.bell.woken.store(false, Ordering::Relaxed);
        let mut cx = Context::from_waker(&self.waker);
        match op.as_mut().poll(&mut cx) {
            Poll::Ready(r) => {
                self.op = None;
                Ok((DONE, Some(r?)))
            }
            Poll::Pending if self.bell.woken.load(Ordering::Relaxed) => Ok((AGAIN, None)),
            Poll::Pending => Ok((WAIT, None)),
        }
    }

    /// Ends the operation if it is still under way (its coroutine was cancelled): the
    /// future is dropped, which withdraws its wait and loses nothing (a receive's record is
    /// read by the next receive; a send sent nothing).
    fn cancel(&mut self) {
        self.op = None;
    }
}
