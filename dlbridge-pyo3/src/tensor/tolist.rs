//! `Tensor.tolist()`: the elements as nested Python lists.
//!
//! Every Python object is made with a C call whose NULL result (memory
//! exhausted) becomes the MemoryError CPython set, never a panic: a list of a
//! large tensor is where an interpreter runs out of memory first.

use dlbridge::{DataType, DataTypeCode, TensorView};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// A new reference from a CPython constructor, or the exception it set.
///
/// # Safety
/// `ptr` must be the result of a call that returns a new reference or NULL
/// with an exception set, made with the GIL held.
unsafe fn owned<'py>(py: Python<'py>, ptr: *mut ffi::PyObject) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: forwarded from the caller.
    unsafe { Bound::from_owned_ptr_or_err(py, ptr) }
}

/// One element at `ptr` as a Python object.
///
/// # Safety
/// `ptr` must point at a readable element of `dtype`.
unsafe fn read_scalar<'py>(py: Python<'py>, ptr: *const u8, dtype: DataType) -> PyResult<Bound<'py, PyAny>> {
    use DataTypeCode as C;
    // SAFETY: forwarded from the caller; every read is unaligned and of the
    // dtype's own size, checked by the match. Each constructor returns a new
    // reference or NULL with an exception set.
    unsafe {
        macro_rules! read {
            ($t:ty) => {
                ptr.cast::<$t>().read_unaligned()
            };
        }
        let int = |v: i64| ffi::PyLong_FromLongLong(v);
        let float = |v: f64| ffi::PyFloat_FromDouble(v);
        let raw = match (dtype.code, dtype.bits, dtype.lanes) {
            (C::BOOL, 8, 1) => ffi::PyBool_FromLong(i64::from(read!(u8) != 0) as core::ffi::c_long),
            (C::INT, 8, 1) => int(read!(i8).into()),
            (C::INT, 16, 1) => int(read!(i16).into()),
            (C::INT, 32, 1) => int(read!(i32).into()),
            (C::INT, 64, 1) => int(read!(i64)),
            (C::UINT, 8, 1) => int(read!(u8).into()),
            (C::UINT, 16, 1) => int(read!(u16).into()),
            (C::UINT, 32, 1) => int(read!(u32).into()),
            (C::UINT, 64, 1) => ffi::PyLong_FromUnsignedLongLong(read!(u64)),
            (C::FLOAT, 16, 1) => float(half::f16::from_bits(read!(u16)).to_f64()),
            (C::FLOAT, 32, 1) => float(read!(f32).into()),
            (C::FLOAT, 64, 1) => float(read!(f64)),
            (C::BFLOAT, 16, 1) => float(half::bf16::from_bits(read!(u16)).to_f64()),
            (C::COMPLEX, 64, 1) => {
                let [re, im] = read!([f32; 2]);
                ffi::PyComplex_FromDoubles(re.into(), im.into())
            }
            (C::COMPLEX, 128, 1) => {
                let [re, im] = read!([f64; 2]);
                ffi::PyComplex_FromDoubles(re, im)
            }
            _ => return Err(PyBufferError::new_err(format!("tolist() does not support dtype {dtype}"))),
        };
        owned(py, raw)
    }
}

/// A list of `n` items, each made by `item(i)`; MemoryError when the list
/// itself cannot be allocated.
fn list_of<'py>(py: Python<'py>, n: usize, mut item: impl FnMut(usize) -> PyResult<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
    let len = isize::try_from(n).map_err(|_| pyo3::exceptions::PyMemoryError::new_err(format!("a list of {n} items")))?;
    // SAFETY: PyList_New returns a new list of `len` NULL slots, or NULL with an exception set.
    let list = unsafe { owned(py, ffi::PyList_New(len))? };
    for i in 0..n {
        let value = item(i)?;
        // SAFETY: `list` is a fresh list of `len` slots and `i < len`; SET_ITEM
        // steals the reference, filling each slot once. A list dropped with
        // slots still NULL (on error) is freed correctly by CPython.
        unsafe { ffi::PyList_SET_ITEM(list.as_ptr(), i as isize, value.into_ptr()) };
    }
    Ok(list)
}

/// Nested lists of the elements reached from `ptr`.
///
/// # Safety
/// Every element the layout reaches from `ptr` must be readable.
unsafe fn build_list<'py>(py: Python<'py>, ptr: *const u8, shape: &[i64], strides: &[i64], dtype: DataType) -> PyResult<Bound<'py, PyAny>> {
    match shape.split_first() {
        // SAFETY: forwarded from the caller.
        None => unsafe { read_scalar(py, ptr, dtype) },
        Some((&n, rest)) => list_of(py, n as usize, |i| {
            // SAFETY: index i < n along this axis stays within the layout.
            unsafe { build_list(py, ptr.wrapping_offset(i as isize * strides[0] as isize), rest, &strides[1..], dtype) }
        }),
    }
}

fn empty_lists<'py>(py: Python<'py>, shape: &[i64]) -> PyResult<Bound<'py, PyAny>> {
    match shape.split_first() {
        Some((&0, _)) | None => list_of(py, 0, |_| Ok(py.None().into_bound(py))),
        Some((&n, rest)) => list_of(py, n as usize, |_| empty_lists(py, rest)),
    }
}

/// The elements of a host-readable view as nested lists.
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
    // SAFETY: the view was validated and is host-readable (checked by the
    // caller, who holds a read borrow); every index of its shape reaches a
    // readable element through these byte strides.
    unsafe { build_list(py, view.as_ptr().cast(), view.shape(), &strides, view.dtype()) }
}
