//! Buffer-protocol import: bytes, bytearray, memoryview, array.array, mmap,
//! ctypes arrays and scalars, NumPy scalars. Zero-copy; the buffer stays open
//! until the tensor is freed.

use dlbridge::export::RawLayout;
use dlbridge::layout::element_strides_from_bytes;
use dlbridge::{DataType, Device};
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::any_owned::AnyOwned;
use crate::errors::IntoPyResult;
use crate::owner::open_buffer;

/// The element type of a filled view; a NULL format means unsigned bytes.
fn buffer_dtype(view: &ffi::Py_buffer) -> PyResult<DataType> {
    let format = if view.format.is_null() {
        "B".into()
    } else {
        // SAFETY: a filled view's non-NULL `format` is a C string that lives as long as the view.
        unsafe { core::ffi::CStr::from_ptr(view.format) }.to_string_lossy()
    };
    let dtype = DataType::from_buffer_format(&format).ok_or_else(|| {
        PyBufferError::new_err(format!("buffer format {format:?} has no DLPack dtype (or is not in native byte order)"))
    })?;
    if dtype.itemsize() != usize::try_from(view.itemsize).ok() {
        return Err(PyBufferError::new_err(format!("buffer itemsize {} does not match format {format:?}", view.itemsize)));
    }
    Ok(dtype)
}

/// Shape and element strides of a filled view. Exporters may leave `strides`
/// NULL for C-contiguous data (ctypes does), and `shape` NULL for 1-d bytes;
/// `ndim == 0` is a scalar.
fn buffer_layout(view: &ffi::Py_buffer, itemsize: usize) -> PyResult<(Vec<i64>, Option<Vec<i64>>)> {
    let ndim = usize::try_from(view.ndim)
        .ok()
        .filter(|&n| n <= dlbridge::MAX_NDIM)
        .ok_or_else(|| PyBufferError::new_err(format!("buffer ndim {} is out of range", view.ndim)))?;
    if ndim == 0 {
        return Ok((Vec::new(), None));
    }
    if view.shape.is_null() {
        let len = usize::try_from(view.len).map_err(|_| PyBufferError::new_err("negative buffer length"))?;
        return Ok((vec![(len / itemsize.max(1)) as i64], None));
    }
    // SAFETY: a non-NULL `shape` has `ndim` entries that live as long as the view.
    let shape: Vec<i64> = unsafe { core::slice::from_raw_parts(view.shape, ndim) }.iter().map(|&d| d as i64).collect();
    if view.strides.is_null() {
        return Ok((shape, None));
    }
    // SAFETY: as for `shape`.
    let byte_strides: Vec<i64> = unsafe { core::slice::from_raw_parts(view.strides, ndim) }.iter().map(|&s| s as i64).collect();
    let strides = element_strides_from_bytes(&byte_strides, &shape, itemsize).py()?;
    Ok((shape, Some(strides)))
}

/// Imports a buffer-protocol exporter without copying; the result is marked
/// aliased (read it with [`AnyOwned::read`]).
pub fn import_buffer(obj: &Bound<'_, PyAny>) -> PyResult<AnyOwned> {
    // Strides and format; read-only buffers too.
    let owner = open_buffer(obj, ffi::PyBUF_RECORDS_RO)?;
    let view = owner.view();
    let dtype = buffer_dtype(view)?;
    if !view.suboffsets.is_null() {
        return Err(PyBufferError::new_err("buffers with suboffsets (PIL-style arrays) cannot be described by DLPack"));
    }
    let (shape, strides) = buffer_layout(view, dtype.itemsize().unwrap_or(1))?;
    let flags = if view.readonly != 0 { dlbridge::ffi::DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 };
    let data = view.buf;
    let layout = RawLayout { dtype, device: Device::CPU, shape: &shape, strides: strides.as_deref(), byte_offset: 0 };
    // SAFETY: the exporter guarantees `buf` with this shape and these strides
    // (row-major when NULL) stays valid until the buffer is released, which
    // happens when `owner` drops.
    unsafe { super::python_memory(owner, data, layout, flags) }
}
