//! Pickling a `Tensor`: its bytes, C-contiguous, plus dtype, shape and
//! writability. With protocol 5 the bytes go out of band (`pickle.PickleBuffer`),
//! so transports that keep out-of-band buffers copy nothing more; older
//! protocols carry them in band. A non-contiguous tensor is pickled as its
//! contiguous copy (strides are not kept). A tensor over a shared-memory
//! segment (`dlbridge.share_memory`) is pickled as a handle to the segment by
//! the segment object itself.

use core::ffi::c_void;

use dlbridge::export::{export_raw, RawLayout};
use dlbridge::ffi::{DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, DLPACK_FLAG_BITMASK_READ_ONLY};
use dlbridge::{to_contiguous, AlignedBuffer, DataType, Device, OwnedTensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use pyo3::{ffi, intern};

use super::Tensor;
use crate::capsule::AnyOwned;
use crate::convert::parse_dtype;
use crate::errors::IntoPyResult;
use crate::import::open_buffer;
use crate::owner::PyOwner;
use crate::writability::Writability;

/// A one-dimensional `uint8` tensor over the bytes of a C-contiguous CPU
/// tensor, sharing them (and their writability): what a `PickleBuffer` wraps.
pub(super) fn bytes_view(slf: &Bound<'_, Tensor>) -> PyResult<Tensor> {
    let this = slf.get();
    this.check_host_access()?;
    let view = this.view();
    if !view.is_c_contiguous() {
        return Err(PyValueError::new_err("only a C-contiguous tensor has one run of bytes"));
    }
    let nbytes = view.nbytes();
    let layout = RawLayout { dtype: DataType::UINT8, device: Device::CPU, shape: &[nbytes as i64], strides: None, byte_offset: 0 };
    // SAFETY: a validated C-contiguous CPU view occupies exactly `nbytes` bytes
    // from element 0, which the owner (the tensor object) keeps alive; they are
    // writable only if the tensor is (the flags say so otherwise).
    let owned: OwnedTensor =
        unsafe { export_raw(PyOwner::new(slf.as_any()), view.as_ptr().cast_mut(), layout, this.writability.flags()) }.py()?;
    Ok(Tensor::with_writability(AnyOwned::Versioned(owned), this.writability))
}

/// `Tensor.__reduce_ex__(protocol)`.
pub(super) fn reduce_ex<'py>(slf: &Bound<'py, Tensor>, protocol: i64) -> PyResult<Bound<'py, PyTuple>> {
    let py = slf.py();
    let this = slf.get();
    let view = this.view();
    if let Some(origin) = &this.origin {
        let args = (view.dtype().to_string(), PyTuple::new(py, view.shape())?, this.writability.name(), view.is_subbyte_padded());
        return Ok(origin.bind(py).call_method1(intern!(py, "tensor_reduce"), args)?.cast_into::<PyTuple>()?);
    }
    if !view.device().is_cpu_accessible() {
        return Err(PyTypeError::new_err(format!(
            "cannot pickle a tensor on {}: dlbridge pickles CPU-accessible memory only",
            view.device()
        )));
    }
    this.wait_for_host()?;
    let source = if view.is_c_contiguous() {
        slf.clone()
    } else {
        let copied: OwnedTensor = to_contiguous(this.read()?.view()).py()?;
        Bound::new(py, Tensor::with_writability(copied.into(), this.writability))?
    };
    let bytes = Bound::new(py, bytes_view(&source)?)?;
    let payload = if protocol >= 5 {
        py.import(intern!(py, "pickle"))?.getattr(intern!(py, "PickleBuffer"))?.call1((bytes,))?
    } else {
        // A live contiguous uint8 tensor: its view's bytes (none when empty, where the pointer is NULL).
        let read = bytes.get().read()?;
        PyBytes::new(py, read.view().try_as_bytes().py()?).into_any()
    };
    let dtype = view.dtype().to_string();
    let shape = PyTuple::new(py, view.shape())?;
    let rebuild = py.import(intern!(py, "dlbridge"))?.getattr(intern!(py, "_rebuild_tensor"))?;
    let args = (payload, dtype, shape, this.writability.name(), view.is_subbyte_padded());
    PyTuple::new(py, [rebuild, args.into_pyobject(py)?.into_any()])
}

/// `_rebuild_tensor(payload, dtype, shape, writability, padded, origin=None)`:
/// the tensor a pickle describes, over `payload`'s bytes (any C-contiguous
/// buffer) without copying, unless the tensor was writable and the payload is
/// not, when the bytes are copied once. `origin` (a shared-memory segment) is
/// kept alive with the tensor and pickles it again.
#[pyfunction]
#[pyo3(signature = (payload, dtype, shape, writability, padded, origin=None))]
pub(crate) fn _rebuild_tensor(
    payload: &Bound<'_, PyAny>,
    dtype: &Bound<'_, PyAny>,
    shape: Vec<i64>,
    writability: &str,
    padded: bool,
    origin: Option<Py<PyAny>>,
) -> PyResult<Tensor> {
    let malformed = |why: String| PyValueError::new_err(format!("malformed dlbridge pickle: {why}"));
    let dtype = parse_dtype(dtype).map_err(|e| malformed(e.value(payload.py()).to_string()))?;
    let writability = Writability::from_name(writability).ok_or_else(|| malformed(format!("writability {writability:?}")))?;
    let numel = dlbridge::layout::element_count(&shape).map_err(|e| malformed(e.to_string()))?;
    let padded = padded && dtype.is_sub_byte();
    let needed = dtype
        .storage_bytes(numel as u64, padded)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| malformed(format!("shape {shape:?} of {dtype} does not fit in memory")))?;
    let owner = open_buffer(payload, ffi::PyBUF_C_CONTIGUOUS)?;
    let buffer = owner.view();
    if usize::try_from(buffer.len).ok() != Some(needed) {
        return Err(malformed(format!("the payload holds {} bytes; shape {shape:?} of {dtype} needs {needed}", buffer.len)));
    }
    let mut flags = if padded { DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED } else { 0 };
    let layout = RawLayout { dtype, device: Device::CPU, shape: &shape, strides: None, byte_offset: 0 };
    let owned: OwnedTensor = if writability.is_writable() && buffer.readonly != 0 {
        let mut copy = AlignedBuffer::zeroed(needed).py()?;
        if needed > 0 {
            // SAFETY: the buffer view holds `needed` readable bytes (checked above), so its
            // pointer is not NULL.
            copy.as_mut_slice().copy_from_slice(unsafe { core::slice::from_raw_parts(buffer.buf.cast::<u8>(), needed) });
        }
        drop(owner);
        let data = copy.as_mut_slice().as_mut_ptr().cast::<c_void>();
        // SAFETY: the aligned buffer holds `needed` bytes, the row-major layout's
        // whole extent, and is the owner; its heap memory does not move with it.
        unsafe { export_raw(copy, data, layout, flags) }.py()?
    } else {
        if buffer.readonly != 0 || !writability.is_writable() {
            flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
        }
        let data = buffer.buf;
        // SAFETY: a C-contiguous buffer of exactly `needed` bytes, the layout's
        // whole extent, kept open by `owner` until the tensor is freed; written
        // only if the buffer is writable (READ_ONLY otherwise).
        unsafe { export_raw(owner, data, layout, flags) }.py()?
    };
    let mut tensor = Tensor::with_writability(owned.into(), writability);
    tensor.origin = origin;
    Ok(tensor)
}
