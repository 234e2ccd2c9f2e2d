//! Pickling and copying a `Tensor`: its bytes, C-contiguous, plus dtype, shape
//! and writability. With protocol 5 the bytes go out of band
//! (`pickle.PickleBuffer`), so transports that keep out-of-band buffers copy
//! nothing more; older protocols carry them in band. A non-contiguous tensor is
//! pickled as its contiguous copy (strides are not kept). A tensor over a
//! shared-memory segment (`dlbridge.share_memory`) is pickled as a handle to the
//! segment by the segment object itself.
//!
//! Writability survives every route: unknown stays unknown, read-only stays
//! read-only, writable stays writable. A writable or unknown tensor rebuilt over
//! read-only bytes (an in-band payload) is copied once into memory it may hand
//! to writers. `copy.copy` and `copy.deepcopy` give new memory (a new segment for
//! a shared tensor), never a second view of the same bytes.
//!
//! Every allocation a size controls is fallible (MemoryError), and so is every
//! Python object built here: PyO3's infallible constructors panic when Python
//! cannot allocate.

use core::ffi::c_void;

use dlbridge::export::{export_raw, RawLayout};
use dlbridge::ffi::{DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, DLPACK_FLAG_BITMASK_READ_ONLY};
use dlbridge::{to_contiguous, AlignedBuffer, DataType, Device, OwnedTensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::{ffi, intern};

use super::{Tensor, TensorObject};
use crate::any_owned::AnyOwned;
use crate::borrows::HeldRead;
use crate::convert::{parse_dtype, parse_pickled_shape};
use crate::errors::IntoPyResult;
use crate::owner::{open_buffer, PyOwner};
use crate::python_calls::{entered, Scalar};
use crate::writability::Writability;

/// The reads of a tensor's bytes that pickling and copying make, all of them:
/// the one place to guard against a writer of the same memory. Every host
/// read of dlbridge's goes through one of these or through [`bytes_view`]
/// (out-of-band pickles, `share_memory()`, Dask frames): `tolist()`
/// (`Tensor::host_read`), `copy()`, `copy.copy`/`deepcopy`, pickles of every
/// protocol, `from_dlpack(copy=True)` and copies to a device. (The buffer
/// protocol and the array interfaces hand the memory to Python code, whose
/// reads no borrow sees: README, "Borrows".)
mod read {
    use super::*;

    /// A C-contiguous copy of a CPU-accessible tensor, in fresh memory Rust owns.
    pub(super) fn contiguous_copy(py: Python<'_>, this: &Tensor) -> PyResult<OwnedTensor> {
        to_contiguous(this.host_read(py)?.view()).py()
    }

    /// A new `bytes` object holding a C-contiguous CPU tensor's bytes.
    pub(super) fn to_bytes<'py>(py: Python<'py>, this: &Tensor) -> PyResult<Bound<'py, PyAny>> {
        let read = this.host_read(py)?;
        if !read.view().is_c_contiguous() {
            return Err(PyValueError::new_err("only a C-contiguous tensor has one run of bytes"));
        }
        new::bytes(py, read.view().try_as_bytes().py()?)
    }
}

/// Python objects built fallibly: NULL (out of memory) is the exception Python
/// set, where PyO3's `PyBytes::new`, `PyTuple::new` and `into_pyobject` panic.
mod new {
    use super::*;

    fn owned(py: Python<'_>, ptr: *mut ffi::PyObject) -> PyResult<Bound<'_, PyAny>> {
        // SAFETY: `ptr` is a new reference, or NULL with an exception set.
        unsafe { Bound::from_owned_ptr_or_err(py, ptr) }
    }

    pub(super) fn bytes<'py>(py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        let len = ffi::Py_ssize_t::try_from(data.len()).map_err(|_| PyValueError::new_err("too many bytes for one bytes object"))?;
        // SAFETY: `data` is `len` readable bytes, copied before this returns.
        owned(py, unsafe { ffi::PyBytes_FromStringAndSize(data.as_ptr().cast(), len) })
    }

    pub(super) fn str<'py>(py: Python<'py>, s: &str) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: `s` is valid UTF-8 of that length (a Rust str is at most isize::MAX bytes).
        owned(py, unsafe { ffi::PyUnicode_FromStringAndSize(s.as_ptr().cast(), s.len() as ffi::Py_ssize_t) })
    }

    pub(super) fn int(py: Python<'_>, value: i64) -> PyResult<Bound<'_, PyAny>> {
        // SAFETY: no precondition.
        owned(py, unsafe { ffi::PyLong_FromLongLong(value) })
    }

    pub(super) fn bool(py: Python<'_>, value: bool) -> Bound<'_, PyAny> {
        pyo3::types::PyBool::new(py, value).to_owned().into_any()
    }

    /// A tuple of exactly `len` items.
    pub(super) fn tuple<'py>(
        py: Python<'py>,
        len: usize,
        items: impl IntoIterator<Item = PyResult<Bound<'py, PyAny>>>,
    ) -> PyResult<Bound<'py, PyTuple>> {
        // SAFETY: a new reference or NULL; `len` is at most a few dozen.
        let tuple = owned(py, unsafe { ffi::PyTuple_New(len as ffi::Py_ssize_t) })?;
        let mut filled = 0;
        for item in items.into_iter().take(len) {
            // SAFETY: index `filled` < len of a new tuple nobody else sees; SET_ITEM steals the reference.
            unsafe { ffi::PyTuple_SET_ITEM(tuple.as_ptr(), filled as ffi::Py_ssize_t, item?.into_ptr()) };
            filled += 1;
        }
        if filled != len {
            // Never handed out with empty slots (dropping it is safe: slots are NULL-checked).
            return Err(pyo3::exceptions::PySystemError::new_err(format!("a tuple of {len} got {filled} items")));
        }
        // SAFETY: a tuple, just made and filled.
        Ok(unsafe { tuple.cast_into_unchecked() })
    }

    pub(super) fn shape<'py>(py: Python<'py>, shape: &[i64]) -> PyResult<Bound<'py, PyTuple>> {
        tuple(py, shape.len(), shape.iter().map(|&n| int(py, n)))
    }
}

/// Pickling and copying refuse device memory: the bytes would be read on the host.
fn check_cpu(this: &Tensor, what: &str) -> PyResult<()> {
    let device = this.view().device();
    if device.is_cpu_accessible() {
        return Ok(());
    }
    Err(PyTypeError::new_err(format!("cannot {what} a tensor on {device}: dlbridge pickles and copies CPU-accessible memory only")))
}

/// A one-dimensional `uint8` tensor over the bytes of a C-contiguous CPU
/// tensor, sharing them (and their writability): what a `PickleBuffer` wraps,
/// and what shared memory and transports copy from. Those read the bytes
/// after this returns, so it holds a shared borrow of them for as long as it
/// lives: refused while an extension holds them writable, and no extension
/// may write them meanwhile.
pub(super) fn bytes_view(slf: &Bound<'_, TensorObject>) -> PyResult<Tensor> {
    let this = slf.get();
    this.check_host_access()?;
    let view = this.view();
    if !view.is_c_contiguous() {
        return Err(PyValueError::new_err("only a C-contiguous tensor has one run of bytes"));
    }
    let held_read = HeldRead::take(slf.py(), view, || "tensor".to_owned())?;
    let nbytes = view.nbytes();
    let layout = RawLayout { dtype: DataType::UINT8, device: Device::CPU, shape: &[nbytes as i64], strides: None, byte_offset: 0 };
    // SAFETY: a validated C-contiguous CPU view occupies exactly `nbytes` bytes
    // from element 0, which the owner (the tensor object) keeps alive; they are
    // writable only if the tensor is (the flags say so otherwise).
    let owned: OwnedTensor =
        unsafe { export_raw(PyOwner::new(slf.as_any()), view.as_ptr().cast_mut(), layout, this.writability.flags()) }.py()?;
    let mut bytes = Tensor::with_writability(AnyOwned::Versioned(owned), this.writability);
    bytes.held_read = held_read;
    Ok(bytes)
}

/// `Tensor.__reduce_ex__(protocol)`.
pub(super) fn reduce_ex<'py>(slf: &Bound<'py, TensorObject>, protocol: i64) -> PyResult<Bound<'py, PyTuple>> {
    let py = slf.py();
    let this = slf.get();
    let view = this.view();
    let dtype = new::str(py, &view.dtype().to_string())?;
    let shape = new::shape(py, view.shape())?.into_any();
    let writability = new::str(py, this.writability.name())?;
    let padded = new::bool(py, view.is_subbyte_padded());
    if let Some(segment) = &this.origin {
        return super::shared::handle(py, segment, [dtype, shape, writability, padded]);
    }
    check_cpu(this, "pickle")?;
    let source = if view.is_c_contiguous() {
        this.wait_for_host()?;
        slf.clone()
    } else {
        Bound::new(py, TensorObject::from(Tensor::with_writability(read::contiguous_copy(py, this)?.into(), this.writability)))?
    };
    let payload = if protocol >= 5 {
        let bytes = Bound::new(py, TensorObject::from(bytes_view(&source)?))?;
        py.import(intern!(py, "pickle"))?.getattr(intern!(py, "PickleBuffer"))?.call1((bytes,))?
    } else {
        read::to_bytes(py, source.get())?
    };
    let rebuild = super::import_package(py, "dlbridge", "pickling")?.getattr(intern!(py, "_rebuild_tensor"))?;
    let args = new::tuple(py, 5, [Ok(payload), Ok(dtype), Ok(shape), Ok(writability), Ok(padded)])?.into_any();
    new::tuple(py, 2, [Ok(rebuild), Ok(args)])
}

/// `copy.copy(t)` and `copy.deepcopy(t)`: the same dtype, shape, values and
/// writability in new memory, C-contiguous; in a new segment for a shared tensor.
pub(super) fn copy<'py>(slf: &Bound<'py, TensorObject>) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    let this = slf.get();
    check_cpu(this, "copy")?;
    if this.origin.is_some() {
        let share = super::import_package(py, "dlbridge._shared", "copying a shared tensor")?.getattr(intern!(py, "share_memory"))?;
        return crate::python_calls::call1(&share, slf.as_any());
    }
    let copied = read::contiguous_copy(py, this)?;
    Ok(Bound::new(py, TensorObject::from(Tensor::with_writability(copied.into(), this.writability)))?.into_any())
}

/// `_rebuild_tensor(payload, dtype, shape, writability, padded)`:
/// the tensor a pickle describes, over `payload`'s bytes (any C-contiguous
/// buffer) without copying, unless the tensor may be handed to writers
/// (writable or unknown) and the payload is read-only, when the bytes are
/// copied once.
#[pyfunction]
pub(crate) fn _rebuild_tensor(
    payload: &Bound<'_, PyAny>,
    dtype: &Bound<'_, PyAny>,
    shape: &Bound<'_, PyAny>,
    writability: &str,
    padded: Scalar<bool>,
) -> PyResult<Tensor> {
    entered();
    let padded = padded.0;
    let malformed = |why: String| PyValueError::new_err(format!("malformed dlbridge pickle: {why}"));
    let dtype = parse_dtype(dtype).map_err(|e| malformed(e.value(payload.py()).to_string()))?;
    let writability = Writability::from_name(writability).ok_or_else(|| malformed(format!("writability {writability:?}")))?;
    let shape = parse_pickled_shape(shape).map_err(|e| malformed(e.value(payload.py()).to_string()))?;
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
    // A writable or unknown tensor may reach writers (a legacy export of an
    // unknown one): never over memory that is read-only.
    let owned: OwnedTensor = if writability != Writability::ReadOnly && buffer.readonly != 0 {
        let bytes = if needed == 0 {
            &[][..]
        } else {
            // SAFETY: the buffer view holds `needed` readable bytes (checked above), so
            // its pointer is not NULL.
            unsafe { core::slice::from_raw_parts(buffer.buf.cast::<u8>(), needed) }
        };
        let mut copy = AlignedBuffer::copy_of(bytes).py()?;
        drop(owner);
        let data = copy.as_mut_slice().as_mut_ptr().cast::<c_void>();
        // SAFETY: the aligned buffer holds `needed` bytes, the row-major layout's
        // whole extent, and is the owner; its heap memory does not move with it.
        unsafe { export_raw(copy, data, layout, flags) }.py()?
    } else {
        if buffer.readonly != 0 || writability == Writability::ReadOnly {
            flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
        }
        // Unpickled in this process over the tensor's own bytes (out of band):
        // the new tensor reads and writes them under borrows of its own, so the
        // payload's hold on them ends (else the tensor could never be written).
        // SAFETY: the exporter the buffer names is live while the buffer is open.
        let exporter = unsafe { pyo3::Borrowed::from_ptr_or_opt(payload.py(), buffer.obj) };
        if let Some(bytes) = exporter.and_then(|e| bytes_tensor_under(&e)) {
            bytes.get().held_read.end(payload.py());
        }
        let data = buffer.buf;
        // SAFETY: a C-contiguous buffer of exactly `needed` bytes, the layout's
        // whole extent, kept open by `owner` until the tensor is freed; written
        // only if the buffer is writable (READ_ONLY otherwise).
        unsafe { export_raw(owner, data, layout, flags) }.py()?
    };
    // Writable memory, marked down to the pickled writability (unknown included).
    Ok(Tensor::with_writability(owned.into(), writability))
}

/// The `_bytes()` tensor a payload's buffer comes from: the exporter itself,
/// or what the memoryviews it is made of view (distributed slices frames into
/// memoryviews), a few levels down at most.
fn bytes_tensor_under<'py>(exporter: &Bound<'py, PyAny>) -> Option<Bound<'py, TensorObject>> {
    let mut object = exporter.clone();
    for _ in 0..4 {
        if let Ok(tensor) = object.cast_exact::<TensorObject>() {
            return Some(tensor.clone());
        }
        // SAFETY: a type check on a live object.
        if unsafe { ffi::PyMemoryView_Check(object.as_ptr()) } == 0 {
            return None;
        }
        object = object.getattr(intern!(object.py(), "obj")).ok()?;
    }
    None
}
