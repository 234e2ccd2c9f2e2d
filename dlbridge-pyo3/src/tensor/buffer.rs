//! What a `Tensor` offers to consumers that do not speak DLPack: the buffer
//! protocol and both array interfaces.

use core::ffi::{c_int, c_void};

use dlbridge::{DataType, TensorView};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use pyo3::ffi;

use super::{Tensor, TensorObject};

use ffi::{PyBUF_ANY_CONTIGUOUS, PyBUF_C_CONTIGUOUS, PyBUF_F_CONTIGUOUS};

/// Checks a buffer request against the tensor, and returns the struct format.
fn check_request(tensor: &Tensor, view: &TensorView<'_>, flags: c_int) -> PyResult<&'static core::ffi::CStr> {
    if flags & ffi::PyBUF_WRITABLE != 0 && tensor.readonly() {
        return Err(PyBufferError::new_err("tensor is read-only (or its producer could not say it is writable)"));
    }
    let dtype = view.dtype();
    let format = dtype
        .buffer_format()
        .ok_or_else(|| PyBufferError::new_err(format!("dtype {dtype} has no buffer-protocol (struct) format")))?;
    let wants = |bits: c_int| flags & bits == bits;
    let c_contig = view.is_c_contiguous();
    if (!wants(ffi::PyBUF_STRIDES) || wants(PyBUF_C_CONTIGUOUS)) && !c_contig {
        return Err(PyBufferError::new_err("tensor is not C-contiguous"));
    }
    if wants(PyBUF_F_CONTIGUOUS) && !view.is_f_contiguous() {
        return Err(PyBufferError::new_err("tensor is not Fortran-contiguous"));
    }
    if wants(PyBUF_ANY_CONTIGUOUS) && !c_contig && !view.is_f_contiguous() {
        return Err(PyBufferError::new_err("tensor is not contiguous"));
    }
    Ok(format)
}

/// `__getbuffer__`: fills `out` for a CPU-accessible tensor.
///
/// # Safety
/// `out` must be the writable `Py_buffer` CPython passes to `bf_getbuffer`.
pub(super) unsafe fn get_buffer(slf: Bound<'_, TensorObject>, out: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
    // SAFETY: CPython passes a writable Py_buffer; `obj` must be NULL on failure.
    unsafe { (*out).obj = core::ptr::null_mut() };
    let tensor = slf.get();
    tensor.check_host_access()?;
    let view = tensor.view();
    let format = check_request(tensor, view, flags)?;
    let itemsize = view.dtype().itemsize().unwrap_or(1);
    // The logical length, which a consumer may allocate and copy (`bytes(t)`):
    // a broadcast of few bytes can name more than an isize holds.
    let len = view.len().checked_mul(itemsize).and_then(|n| isize::try_from(n).ok()).ok_or_else(|| {
        PyBufferError::new_err(format!(
            "a tensor of {} elements of {} bytes is too large for the buffer protocol, whose length is a Py_ssize_t",
            view.len(),
            itemsize
        ))
    })?;
    let wants = |bits: c_int| flags & bits == bits;
    let ndim = view.ndim();
    // Shape then byte strides, kept in `internal` until `__releasebuffer__`.
    let mut dims: Box<Vec<isize>> = Box::new(Vec::with_capacity(2 * ndim));
    dims.extend(view.shape().iter().map(|&d| d as isize));
    dims.extend(dlbridge::layout::byte_strides(view.strides(), itemsize).map(|s| s as isize));
    let dims_ptr = dims.as_mut_ptr();
    // Without PyBUF_ND the consumer gets one run of bytes, as PyBuffer_FillInfo
    // describes it: ndim 1 with no shape (a consumer trusting ndim reads no
    // NULL shape), and unsigned bytes unless it asked for the format.
    let (out_ndim, out_itemsize) = if wants(ffi::PyBUF_ND) {
        (ndim, itemsize)
    } else {
        (1, if wants(ffi::PyBUF_FORMAT) { itemsize } else { 1 })
    };
    // SAFETY: `out` is writable. The data pointer and length describe the
    // validated, CPU-accessible view, whose memory `obj` (set below) keeps alive.
    unsafe {
        (*out).buf = view.as_ptr().cast_mut();
        (*out).len = len;
        (*out).readonly = c_int::from(tensor.readonly());
        (*out).itemsize = out_itemsize as isize;
        (*out).ndim = out_ndim as c_int;
        (*out).suboffsets = core::ptr::null_mut();
    }
    // SAFETY: `format` is a static C string, never written by consumers.
    unsafe { (*out).format = if wants(ffi::PyBUF_FORMAT) { format.as_ptr().cast_mut() } else { core::ptr::null_mut() } };
    // SAFETY: `dims_ptr` holds `2 * ndim` entries that live in `internal` until
    // `release_buffer` frees them, after the consumer's last use.
    unsafe {
        (*out).shape = if wants(ffi::PyBUF_ND) { dims_ptr } else { core::ptr::null_mut() };
        (*out).strides = if wants(ffi::PyBUF_STRIDES) { dims_ptr.add(ndim) } else { core::ptr::null_mut() };
        (*out).internal = Box::into_raw(dims).cast::<c_void>();
    }
    // SAFETY: `obj` takes a new strong reference, released by PyBuffer_Release.
    unsafe { (*out).obj = slf.into_any().into_ptr() };
    Ok(())
}

/// `__releasebuffer__`: frees the shape and strides of `get_buffer`.
///
/// # Safety
/// `view` must be a buffer filled by [`get_buffer`], released once.
pub(super) unsafe fn release_buffer(view: *mut ffi::Py_buffer) {
    // SAFETY: `internal` was set by `get_buffer` to a leaked Box<Vec<isize>>.
    unsafe {
        let internal = (*view).internal.cast::<Vec<isize>>();
        if !internal.is_null() {
            drop(Box::from_raw(internal));
            (*view).internal = core::ptr::null_mut();
        }
    }
}

/// The dict both array interfaces share (version 3).
pub(super) fn interface_dict<'py>(py: Python<'py>, tensor: &Tensor) -> PyResult<Bound<'py, PyDict>> {
    let view = tensor.view();
    let dtype: DataType = view.dtype();
    let typestr = dtype.typestr().ok_or_else(|| PyBufferError::new_err(format!("dtype {dtype} has no NumPy typestr")))?;
    let itemsize = dtype.itemsize().unwrap_or(1);
    let dict = PyDict::new(py);
    dict.set_item("shape", PyTuple::new(py, view.shape())?)?;
    dict.set_item("typestr", &typestr)?;
    dict.set_item("descr", PyList::new(py, [("", typestr.as_str())])?)?;
    let address = if view.is_empty() { 0 } else { view.as_ptr() as usize };
    dict.set_item("data", (address, tensor.readonly()))?;
    if view.is_c_contiguous() {
        dict.set_item("strides", py.None())?;
    } else {
        dict.set_item("strides", PyTuple::new(py, dlbridge::layout::byte_strides(view.strides(), itemsize))?)?;
    }
    dict.set_item("version", 3)?;
    Ok(dict)
}
