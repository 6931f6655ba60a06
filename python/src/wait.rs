//! Waiting without holding the interpreter: every wait is cut into slices of at most
//! `SLICE`, each waited for with the GIL released; between slices the wait looks at the
//! interpreter's signals, so Ctrl-C interrupts a blocked call within a slice.

use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::{raise, to_py};

/// The longest a wait goes without looking at signals.
pub(crate) const SLICE: Duration = Duration::from_millis(50);

/// When a wait gives up: `None` waits as long as it takes.
pub(crate) type Deadline = Option<Instant>;

/// The deadline of a `timeout` in seconds (`None`: no deadline).
pub(crate) fn deadline(timeout: Option<f64>) -> PyResult<Deadline> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => {
            let d = Duration::try_from_secs_f64(t)
                .map_err(|_| PyValueError::new_err(format!("timeout {t} is out of range")))?;
            // A timeout past what the clock can hold waits as long as it takes.
            Ok(Instant::now().checked_add(d))
        }
        Some(t) => Err(PyValueError::new_err(format!(
            "timeout must be a number of seconds >= 0 or None, not {t}"
        ))),
    }
}

/// What one slice of a wait came to.
pub(crate) enum Step<T> {
    Done(T),
    /// Nothing yet: wait on.
    Again,
    /// Nothing can come: views of received records hold every segment of the channel.
    Stuck,
    /// This end was closed (by another thread).
    Closed,
}

/// Calls `slice(end)` with the GIL released until it is done, the deadline passes
/// (`shmflow.Timeout`) or a signal handler raises (`KeyboardInterrupt` for Ctrl-C).
pub(crate) fn until<T, F>(py: Python<'_>, deadline: Deadline, name: &str, slice: F) -> PyResult<T>
where
    T: Send,
    F: Fn(Instant) -> Result<Step<T>, shmflow::Error> + Sync,
{
    loop {
        let now = Instant::now();
        let end = match deadline {
            Some(d) => d.min(now + SLICE),
            None => now + SLICE,
        };
        match py.detach(|| slice(end)) {
            Ok(Step::Done(v)) => return Ok(v),
            Ok(Step::Again) => {}
            Ok(Step::Stuck) => {
                return Err(raise(
                    py,
                    "ViewsHeld",
                    format!(
                        "{name}: views of received records (slices, numpy arrays) hold every \
                         segment of the channel, so the producer can send nothing more; \
                         release them (del) or copy them (bytes(view))"
                    ),
                ))
            }
            Ok(Step::Closed) => {
                return Err(raise(py, "Closed", format!("{name}: this end was closed")))
            }
            Err(e) => return Err(to_py(py, e)),
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(to_py(py, shmflow::Error::Timeout));
        }
        py.check_signals()?;
    }
}
