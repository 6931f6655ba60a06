//! shmflow's errors as Python exceptions: one class per kind, all under `shmflow.Error`
//! (defined in `shmflow/_errors.py`, where they carry their docstrings and extra bases such
//! as `TimeoutError` or `FileNotFoundError`).

use pyo3::prelude::*;
use pyo3::types::PyString;
use shmflow::{Error, OpenError};

/// An exception of class `kind` (a name in `shmflow._errors`) with `message`.
pub(crate) fn raise(py: Python<'_>, kind: &str, message: String) -> PyErr {
    match py
        .import("shmflow._errors")
        .and_then(|m| m.getattr(kind))
        .and_then(|cls| cls.call1((PyString::new(py, &message),)))
    {
        Ok(e) => PyErr::from_value(e),
        Err(e) => e,
    }
}

/// The exception for a shmflow error.
pub(crate) fn to_py(py: Python<'_>, e: impl Into<Error>) -> PyErr {
    let e = e.into();
    let kind = match &e {
        Error::Open(o) => match **o {
            OpenError::NotFound { .. } => "NotFound",
            OpenError::AlreadyExists { .. } => "AlreadyExists",
            OpenError::InvalidConfig(_) => "ConfigError",
            OpenError::Corrupt(_) => "Corrupt",
            _ => "OpenError",
        },
        Error::InvalidConfig(_) => "ConfigError",
        Error::WouldBlock => "WouldBlock",
        Error::Timeout => "Timeout",
        Error::Closed(_) => "Closed",
        Error::PeerDead(_) => "PeerDead",
        Error::ProducerFailed(_) => "ProducerFailed",
        Error::Corrupt(_) => "Corrupt",
        Error::RecordTooLarge(_) => "RecordTooLarge",
        Error::RecordAborted(_) => "RecordAborted",
        Error::Io(_) => "IoError",
        _ => "Error",
    };
    let message = match &e {
        Error::WouldBlock => "nothing can be done without waiting".to_string(),
        Error::Timeout => "the wait ran out of time".to_string(),
        other => other.to_string(),
    };
    raise(py, kind, message)
}
