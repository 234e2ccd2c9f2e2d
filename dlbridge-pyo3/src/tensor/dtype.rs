//! `dlbridge.DType`: an element type that compares equal to its canonical name.

use dlbridge::DataType;
use pyo3::prelude::*;
use pyo3::types::PyString;


/// An element type: `str(dtype)` is the canonical name, and it compares equal
/// to that name.
#[pyclass(frozen, module = "dlbridge", name = "DType")]
#[derive(Clone, Copy)]
pub struct DType(pub DataType);

#[pymethods]
impl DType {
    /// Parses a canonical name such as `"float32"` or `"float32x4"`.
    #[new]
    fn py_new(name: &str) -> PyResult<Self> {
        crate::convert::parse_dtype_name(name).map(DType)
    }

    /// The DLPack type code.
    #[getter]
    fn code(&self) -> u8 {
        self.0.code.0
    }

    /// Bits of one lane.
    #[getter]
    fn bits(&self) -> u8 {
        self.0.bits
    }

    /// Lanes per element.
    #[getter]
    fn lanes(&self) -> u16 {
        self.0.lanes
    }

    /// Bytes per element, or None for packed sub-byte types.
    #[getter]
    fn itemsize(&self) -> Option<usize> {
        self.0.itemsize()
    }

    fn __str__(&self) -> String {
        self.0.to_string()
    }

    fn __repr__(&self) -> String {
        format!("dlbridge.DType('{}')", self.0)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        if let Ok(other) = other.cast::<DType>() {
            return other.get().0 == self.0;
        }
        // Only the canonical name: equal objects must hash alike, and the hash
        // is the canonical name's ("float32x1" names float32 but is not equal).
        if let Ok(name) = other.cast::<PyString>() {
            return name.to_str().is_ok_and(|n| n == self.0.to_string());
        }
        false
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        // Equal to the hash of the canonical name, since the two compare equal.
        PyString::new(py, &self.0.to_string()).hash()
    }
}
