//! Every core error reaches Python as the exception type the spec names, with
//! the core's message.

use dlbridge::Error;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::PyErr;

/// The exception for a core error: BufferError when the data cannot be
/// exchanged as described, ValueError for a bad argument, TypeError for a
/// request of the wrong element type.
pub fn to_py_err(err: Error) -> PyErr {
    let message = err.to_string();
    match err {
        Error::UnknownDtypeName { .. }
        | Error::StridesLength { .. }
        | Error::OutOfBounds { .. }
        | Error::RankMismatch { .. } => PyValueError::new_err(message),
        Error::DtypeMismatch { .. } => PyTypeError::new_err(message),
        _ => PyBufferError::new_err(message),
    }
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
