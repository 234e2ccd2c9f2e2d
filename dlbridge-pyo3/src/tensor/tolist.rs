//! `Tensor.tolist()`: the elements as nested Python lists.

use dlbridge::{DataType, DataTypeCode, TensorView};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyComplex, PyList};
use pyo3::IntoPyObjectExt;

/// One element at `ptr` as a Python object.
///
/// # Safety
/// `ptr` must point at a readable element of `dtype`.
unsafe fn read_scalar<'py>(py: Python<'py>, ptr: *const u8, dtype: DataType) -> PyResult<Bound<'py, PyAny>> {
    use DataTypeCode as C;
    // SAFETY: forwarded from the caller; every read is unaligned and of the
    // dtype's own size, checked by the match.
    unsafe {
        macro_rules! read {
            ($t:ty) => {
                ptr.cast::<$t>().read_unaligned()
            };
        }
        let value = match (dtype.code, dtype.bits, dtype.lanes) {
            (C::BOOL, 8, 1) => (read!(u8) != 0).into_bound_py_any(py)?,
            (C::INT, 8, 1) => read!(i8).into_bound_py_any(py)?,
            (C::INT, 16, 1) => read!(i16).into_bound_py_any(py)?,
            (C::INT, 32, 1) => read!(i32).into_bound_py_any(py)?,
            (C::INT, 64, 1) => read!(i64).into_bound_py_any(py)?,
            (C::UINT, 8, 1) => read!(u8).into_bound_py_any(py)?,
            (C::UINT, 16, 1) => read!(u16).into_bound_py_any(py)?,
            (C::UINT, 32, 1) => read!(u32).into_bound_py_any(py)?,
            (C::UINT, 64, 1) => read!(u64).into_bound_py_any(py)?,
            (C::FLOAT, 16, 1) => half::f16::from_bits(read!(u16)).to_f64().into_bound_py_any(py)?,
            (C::FLOAT, 32, 1) => f64::from(read!(f32)).into_bound_py_any(py)?,
            (C::FLOAT, 64, 1) => read!(f64).into_bound_py_any(py)?,
            (C::BFLOAT, 16, 1) => f64::from(half::bf16::from_bits(read!(u16)).to_f32()).into_bound_py_any(py)?,
            (C::COMPLEX, 64, 1) => {
                let [re, im] = read!([f32; 2]);
                PyComplex::from_doubles(py, re.into(), im.into()).into_any()
            }
            (C::COMPLEX, 128, 1) => {
                let [re, im] = read!([f64; 2]);
                PyComplex::from_doubles(py, re, im).into_any()
            }
            _ => return Err(PyBufferError::new_err(format!("tolist() does not support dtype {dtype}"))),
        };
        Ok(value)
    }
}

/// Nested lists of the elements reached from `ptr`.
///
/// # Safety
/// Every element the layout reaches from `ptr` must be readable.
unsafe fn build_list<'py>(py: Python<'py>, ptr: *const u8, shape: &[i64], strides: &[i64], dtype: DataType) -> PyResult<Bound<'py, PyAny>> {
    match shape.split_first() {
        // SAFETY: forwarded from the caller.
        None => unsafe { read_scalar(py, ptr, dtype) },
        Some((&n, rest)) => {
            let list = PyList::empty(py);
            for i in 0..n as isize {
                // SAFETY: index i < n along this axis stays within the layout.
                list.append(unsafe { build_list(py, ptr.wrapping_offset(i * strides[0] as isize), rest, &strides[1..], dtype)? })?;
            }
            Ok(list.into_any())
        }
    }
}

fn empty_lists<'py>(py: Python<'py>, shape: &[i64]) -> PyResult<Bound<'py, PyAny>> {
    match shape.split_first() {
        Some((&0, _)) | None => Ok(PyList::empty(py).into_any()),
        Some((&n, rest)) => {
            let list = PyList::empty(py);
            for _ in 0..n {
                list.append(empty_lists(py, rest)?)?;
            }
            Ok(list.into_any())
        }
    }
}

/// The elements of a CPU-accessible view as nested lists.
pub(super) fn tolist<'py>(py: Python<'py>, view: &TensorView<'_>) -> PyResult<Bound<'py, PyAny>> {
    let itemsize = view
        .dtype()
        .itemsize()
        .ok_or_else(|| PyBufferError::new_err(format!("tolist() does not support dtype {}", view.dtype())))?;
    if view.is_empty() {
        // Nothing is read: nested empty lists down to the first zero extent.
        return empty_lists(py, view.shape());
    }
    let strides: Vec<i64> = dlbridge::layout::byte_strides(view.strides(), itemsize).collect();
    // SAFETY: the view was validated and is CPU-accessible (checked by the
    // caller); every index of its shape reaches a readable element through
    // these byte strides.
    unsafe { build_list(py, view.as_ptr().cast(), view.shape(), &strides, view.dtype()) }
}
