//! Every core error reaches Python as the exception type the spec names, with
//! the core's message; and no error or panic of a function called from C
//! unwinds into its caller.

use std::panic::{catch_unwind, AssertUnwindSafe};

use dlbridge::Error;
use pyo3::exceptions::{PyBufferError, PyMemoryError, PyTypeError, PyValueError};
use pyo3::{PyErr, PyResult, Python};

/// The exception for a core error: BufferError when the data cannot be
/// exchanged as described, ValueError for a bad argument, TypeError for a
/// request of the wrong element type, MemoryError when an allocation failed.
pub fn to_py_err(err: Error) -> PyErr {
    let message = err.to_string();
    match exception_name(&err).to_bytes() {
        b"ValueError" => PyValueError::new_err(message),
        b"TypeError" => PyTypeError::new_err(message),
        b"MemoryError" => PyMemoryError::new_err(message),
        _ => PyBufferError::new_err(message),
    }
}

/// A device allocation that failed is a MemoryError too.
const CUDA_ERROR_OUT_OF_MEMORY: u32 = 2;

/// The name of the exception for a core error, for C callers such as the
/// exchange API's `SetError`.
pub fn exception_name(err: &Error) -> &'static core::ffi::CStr {
    match err {
        Error::UnknownDtypeName { .. }
        | Error::StridesLength { .. }
        | Error::OutOfBounds { .. }
        | Error::ElementCount { .. }
        | Error::RankMismatch { .. }
        | Error::InvalidStream { .. } => c"ValueError",
        Error::DtypeMismatch { .. } => c"TypeError",
        Error::AllocationFailed { .. } | Error::Cuda { code: CUDA_ERROR_OUT_OF_MEMORY, .. } => c"MemoryError",
        _ => c"BufferError",
    }
}

/// Runs `body` for a C caller that holds the GIL (attaching tells PyO3 so, and
/// takes the GIL for a caller that broke that rule rather than crashing): an
/// error becomes the Python exception and `failed` is returned; a panic too,
/// as the exception `on_panic` makes, so that no unwind crosses into C.
pub(crate) fn for_c_caller<R>(failed: R, on_panic: impl FnOnce() -> PyErr, body: impl FnOnce(Python<'_>) -> PyResult<R>) -> R {
    crate::python_calls::entered();
    Python::attach(|py| match catch_unwind(AssertUnwindSafe(|| body(py))) {
        Ok(Ok(value)) => value,
        Ok(Err(err)) => {
            err.restore(py);
            failed
        }
        Err(_) => {
            on_panic().restore(py);
            failed
        }
    })
}

/// `?`-friendly conversion of core results.
pub(crate) trait IntoPyResult<T> {
    fn py(self) -> pyo3::PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, Error> {
    fn py(self) -> pyo3::PyResult<T> {
        self.map_err(to_py_err)
    }
}
