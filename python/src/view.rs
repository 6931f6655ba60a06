//! The object behind every `memoryview` the module hands out: a buffer exporter over bytes in
//! a channel's shared memory (a received record, or a claim being filled).
//!
//! PyO3 offers the buffer protocol only for Python 3.11's stable ABI; this module is built
//! for the stable ABI of 3.9, so the exporter is a type made with `PyType_FromSpec` and the
//! two buffer slots, which CPython honours from 3.9 on, with `Py_buffer` declared here as it
//! has been laid out in every CPython 3 (3.11 made that layout part of the stable ABI).
//!
//! An exporter counts the buffers it has exported. The consumer hands out a memoryview of
//! it; before it receives again it releases that memoryview and, if no other buffer of the
//! exporter is left (no slice, no numpy array over it), invalidates the exporter: it forgets
//! the pointer and lets the segment go back to the producer. If buffers are left, the
//! exporter lives on with them and keeps the segment held (`Keep`), so a live view never
//! reads a segment the producer reuses.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;

/// CPython's `Py_buffer`, field for field.
#[repr(C)]
pub(crate) struct RawBuffer {
    pub(crate) buf: *mut c_void,
    pub(crate) obj: *mut ffi::PyObject,
    pub(crate) len: ffi::Py_ssize_t,
    pub(crate) itemsize: ffi::Py_ssize_t,
    pub(crate) readonly: c_int,
    pub(crate) ndim: c_int,
    pub(crate) format: *mut c_char,
    pub(crate) shape: *mut ffi::Py_ssize_t,
    pub(crate) strides: *mut ffi::Py_ssize_t,
    pub(crate) suboffsets: *mut ffi::Py_ssize_t,
    pub(crate) internal: *mut c_void,
}

pub(crate) const PYBUF_SIMPLE: c_int = 0;
pub(crate) const PYBUF_FORMAT: c_int = 0x0004;
/// `PyBUF_C_CONTIGUOUS` (which implies `PyBUF_STRIDES` and `PyBUF_ND`): shape and strides,
/// and a refusal of memory that is not one C-ordered block.
pub(crate) const PYBUF_C_CONTIGUOUS: c_int = 0x0020 | 0x0010 | 0x0008;
const PY_BF_GETBUFFER: c_int = 1;
const PY_BF_RELEASEBUFFER: c_int = 2;

extern "C" {
    pub(crate) fn PyObject_GetBuffer(
        obj: *mut ffi::PyObject,
        view: *mut RawBuffer,
        flags: c_int,
    ) -> c_int;
    pub(crate) fn PyBuffer_Release(view: *mut RawBuffer);
    fn PyBuffer_FillInfo(
        view: *mut RawBuffer,
        obj: *mut ffi::PyObject,
        buf: *mut c_void,
        len: ffi::Py_ssize_t,
        readonly: c_int,
        flags: c_int,
    ) -> c_int;
}

/// What keeps an exporter's bytes valid while it lives: a hold on a received record's
/// segment, or the producer whose claim it shows (either keeps the mapping alive too).
pub(crate) enum Keep {
    Record(#[allow(dead_code)] crate::consumer::Pin),
    Claim(#[allow(dead_code)] std::sync::Arc<crate::producer::ProducerCore>),
    // (Both are kept for what their drop does: release the hold, unmap last.)
}

/// The exporter's instance layout.
#[repr(C)]
struct ViewObject {
    ob_base: ffi::PyObject,
    /// Null once the exporter is invalidated.
    ptr: *mut u8,
    len: ffi::Py_ssize_t,
    readonly: c_int,
    /// Buffers exported and not released.
    exports: ffi::Py_ssize_t,
    /// A `Box<Keep>`, or null once invalidated.
    keep: *mut Keep,
}

static VIEW_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(ptr::null_mut());

unsafe extern "C" fn getbuffer(
    obj: *mut ffi::PyObject,
    view: *mut RawBuffer,
    flags: c_int,
) -> c_int {
    let v = obj as *mut ViewObject;
    // SAFETY: CPython calls this slot only on instances of the type, with the GIL held and a
    // `view` to fill.
    unsafe {
        if (*v).ptr.is_null() {
            (*view).obj = ptr::null_mut();
            ffi::PyErr_SetString(
                ffi::PyExc_ValueError,
                c"this record's segment went back to the producer: the view was released \
                  by the next receive (copy it with bytes(view) to keep it)"
                    .as_ptr(),
            );
            return -1;
        }
        // Fills a one-dimensional view of bytes, refuses a writable request on a read-only
        // exporter (BufferError), and takes a reference to `obj` for the view.
        if PyBuffer_FillInfo(
            view,
            obj,
            (*v).ptr as *mut c_void,
            (*v).len,
            (*v).readonly,
            flags,
        ) < 0
        {
            (*view).obj = ptr::null_mut();
            return -1;
        }
        (*v).exports += 1;
    }
    0
}

unsafe extern "C" fn releasebuffer(obj: *mut ffi::PyObject, _view: *mut RawBuffer) {
    // SAFETY: called by CPython, GIL held, on an instance of the type, once per buffer that
    // `getbuffer` filled.
    unsafe { (*(obj as *mut ViewObject)).exports -= 1 };
}

unsafe extern "C" fn dealloc(obj: *mut ffi::PyObject) {
    // SAFETY: called once, GIL held, when the last reference goes; `keep` is a `Box` from
    // `new_view` or null. The instance was allocated by the type's `tp_alloc`, so its
    // `tp_free` frees it; a heap type's instance holds a reference to the type.
    unsafe {
        let v = obj as *mut ViewObject;
        let keep = std::mem::replace(&mut (*v).keep, ptr::null_mut());
        if !keep.is_null() {
            drop(Box::from_raw(keep));
        }
        let tp = ffi::Py_TYPE(obj);
        let free: ffi::freefunc = std::mem::transmute(ffi::PyType_GetSlot(tp, ffi::Py_tp_free));
        free(obj as *mut c_void);
        ffi::Py_DECREF(tp as *mut ffi::PyObject);
    }
}

/// Makes the exporter type (once, at module import).
pub(crate) fn init_type(py: Python<'_>) -> PyResult<()> {
    if !VIEW_TYPE.load(Ordering::Acquire).is_null() {
        return Ok(());
    }
    let mut slots = [
        ffi::PyType_Slot {
            slot: PY_BF_GETBUFFER,
            pfunc: getbuffer as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: PY_BF_RELEASEBUFFER,
            pfunc: releasebuffer as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_dealloc,
            pfunc: dealloc as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_doc,
            pfunc: c"Bytes in a shmflow channel's shared memory, exported as a buffer.".as_ptr()
                as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: 0,
            pfunc: ptr::null_mut(),
        },
    ];
    let mut spec = ffi::PyType_Spec {
        name: c"shmflow._shmflow.SharedBytes".as_ptr(),
        basicsize: std::mem::size_of::<ViewObject>() as c_int,
        itemsize: 0,
        flags: ffi::Py_TPFLAGS_DEFAULT as _,
        slots: slots.as_mut_ptr(),
    };
    // SAFETY: the spec and slots are complete (zero-terminated) and live through the call,
    // which copies what it keeps; the GIL is held (`py`).
    let tp = unsafe { ffi::PyType_FromSpec(&mut spec) };
    if tp.is_null() {
        return Err(PyErr::fetch(py));
    }
    // The type lives as long as the process (the reference is never given up).
    VIEW_TYPE.store(tp as *mut ffi::PyTypeObject, Ordering::Release);
    Ok(())
}

/// A new exporter over `len` bytes at `ptr`, kept valid by `keep`, and a memoryview of it.
///
/// # Safety
/// `ptr..ptr+len` must stay valid (and, if `!readonly`, writable by this view alone) while
/// `keep` lives.
pub(crate) unsafe fn new_view(
    py: Python<'_>,
    ptr: *mut u8,
    len: usize,
    readonly: bool,
    keep: Keep,
) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    let tp = VIEW_TYPE.load(Ordering::Acquire);
    if tp.is_null() {
        return Err(PyRuntimeError::new_err(
            "shmflow's module is not initialised",
        ));
    }
    // SAFETY: `tp` is the exporter type (a live heap type); GIL held. `PyType_GenericAlloc`
    // zeroes the instance and sets its type and reference count.
    unsafe {
        let obj = ffi::PyType_GenericAlloc(tp, 0);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        let v = obj as *mut ViewObject;
        (*v).ptr = ptr;
        (*v).len = len as ffi::Py_ssize_t;
        (*v).readonly = readonly as c_int;
        (*v).exports = 0;
        (*v).keep = Box::into_raw(Box::new(keep));
        let exporter = Py::<PyAny>::from_owned_ptr(py, obj);
        let mv = ffi::PyMemoryView_FromObject(obj);
        if mv.is_null() {
            return Err(PyErr::fetch(py));
        }
        Ok((exporter, Py::from_owned_ptr(py, mv)))
    }
}

/// Releases the memoryview handed out and, if no other buffer of the exporter is left,
/// invalidates it (the pointer is forgotten and what kept the bytes is dropped now). Returns
/// whether it was invalidated; if not, buffers made from the view (slices, arrays) are still
/// alive, and the exporter keeps the bytes until they go.
pub(crate) fn retire(py: Python<'_>, exporter: &Py<PyAny>, view: &Py<PyAny>) -> bool {
    // SAFETY: reads the type of a live object (we hold a reference); GIL held.
    let tp = unsafe { ffi::Py_TYPE(exporter.as_ptr()) };
    if tp != VIEW_TYPE.load(Ordering::Acquire) {
        return false;
    }
    // A memoryview with buffers exported from it refuses (BufferError): it stays usable and
    // keeps the exporter.
    if view.call_method0(py, "release").is_err() {
        return false;
    }
    let obj = exporter.as_ptr() as *mut ViewObject;
    // SAFETY: `exporter` is an instance of the exporter type (checked above), alive (we hold
    // a reference); GIL held.
    unsafe {
        if (*obj).exports != 0 {
            return false;
        }
        (*obj).ptr = ptr::null_mut();
        let keep = std::mem::replace(&mut (*obj).keep, ptr::null_mut());
        if !keep.is_null() {
            drop(Box::from_raw(keep));
        }
    }
    true
}
