//! dlbridge's exchange-API table: allocation, owning and non-owning export,
//! import to a `Tensor`, and the current work stream.
//!
//! `no_sync` in the header's names means the function does not order the
//! caller's stream after the producer's work: the caller launches on the
//! stream `current_work_stream` reports. dlbridge has no current stream of its
//! own, so it reports CUDA's legacy default stream (`CU_STREAM_LEGACY`, 1),
//! and its `no_sync` exports of a CUDA tensor whose data is ready on another
//! stream first make the legacy default stream wait for it: an event on the
//! GPU, never a host synchronisation. For ROCm it reports NULL and orders
//! nothing (dlbridge makes no HIP calls); CPU memory has no stream (NULL).

use core::ffi::{c_int, c_void, CStr};
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use dlbridge::ffi::{DLManagedTensorVersioned, DLPackExchangeAPI, DLPackExchangeAPIHeader, DLPackSetError, DLPackVersion, DLTensor};
use dlbridge::{Device, DeviceType, OwnedTensor, MAX_NDIM};
use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::{ffi, Borrowed};

use super::{Tensor, TensorObject};
use crate::errors::{exception_name, for_c_caller, to_py_err};
use crate::exchange::EXCHANGE_API_CAPSULE_NAME;

/// dlbridge's exchange-API table; it lives for the whole process, as the header requires.
pub static EXCHANGE_API: DLPackExchangeAPI = DLPackExchangeAPI {
    header: DLPackExchangeAPIHeader { version: DLPackVersion::CURRENT, prev_api: core::ptr::null_mut() },
    managed_tensor_allocator: Some(allocate),
    managed_tensor_from_py_object_no_sync: Some(managed_from_py_object),
    managed_tensor_to_py_object_no_sync: Some(managed_to_py_object),
    dltensor_from_py_object_no_sync: Some(dltensor_from_py_object),
    current_work_stream: Some(current_work_stream),
};

/// How often each function of [`EXCHANGE_API`] ran, for tests that must prove a
/// consumer took the fast path: allocate, owning export, import, non-owning
/// export, stream.
#[cfg(feature = "testing")]
pub(crate) static CALLS: [core::sync::atomic::AtomicU64; 5] = [const { core::sync::atomic::AtomicU64::new(0) }; 5];

#[inline]
fn count(_index: usize) {
    #[cfg(feature = "testing")]
    CALLS[_index].fetch_add(1, core::sync::atomic::Ordering::Relaxed);
}

/// The capsule that `Tensor.__dlpack_c_exchange_api__` holds.
pub(crate) fn exchange_api_capsule(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let table = core::ptr::addr_of!(EXCHANGE_API).cast_mut().cast::<c_void>();
    // SAFETY: the table is a static that outlives every capsule; consumers only
    // read it. No destructor is needed.
    unsafe {
        let capsule = ffi::PyCapsule_New(table, EXCHANGE_API_CAPSULE_NAME.as_ptr(), None);
        Ok(Bound::from_owned_ptr_or_err(py, capsule)?.unbind())
    }
}

/// Runs `body`, turning a panic into the failure code so that no unwind
/// crosses the C boundary.
fn guarded(body: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(-1)
}

/// Runs `body` with the GIL, turning an error or a panic into a Python
/// exception and -1. Callers should hold the GIL already, as the API requires;
/// one that does not gets it taken for it rather than a crash.
fn with_python(body: impl FnOnce(Python<'_>) -> PyResult<()>) -> c_int {
    let on_panic = || PyRuntimeError::new_err("dlbridge panicked in an exchange-API function");
    for_c_caller(-1, on_panic, |py| body(py).map(|()| 0))
}

fn our_tensor<'a, 'py>(py: Python<'py>, object: *mut c_void) -> PyResult<Borrowed<'a, 'py, TensorObject>> {
    if object.is_null() {
        return Err(PyTypeError::new_err("NULL Python object passed to dlbridge's exchange API"));
    }
    // SAFETY: a non-NULL Python object from a caller that holds the GIL.
    let any = unsafe { Borrowed::from_ptr(py, object.cast::<ffi::PyObject>()) };
    any.cast_exact::<TensorObject>().map_err(|_| {
        PyTypeError::new_err("dlbridge's exchange API was called with an object that is not a dlbridge.Tensor")
    })
}

unsafe extern "C" fn allocate(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<DLPackSetError>,
) -> c_int {
    count(0);
    guarded(|| {
        let fail = |kind: &CStr, message: String| {
            if let Some(set_error) = set_error {
                let message = CString::new(message).unwrap_or_default();
                // SAFETY: the caller's callback, with its own context and two C strings.
                unsafe { set_error(error_ctx, kind.as_ptr(), message.as_ptr()) };
            }
            -1
        };
        if prototype.is_null() || out.is_null() {
            return fail(c"ValueError", "NULL prototype or out pointer".into());
        }
        // SAFETY: a non-NULL prototype from the caller; only dtype, ndim, shape and
        // device are read, shape for `ndim` entries once ndim is checked.
        let proto = unsafe { &*prototype };
        if proto.device != Device::CPU {
            return fail(c"BufferError", format!("dlbridge allocates CPU memory only, not {}", proto.device));
        }
        let ndim = match usize::try_from(proto.ndim) {
            Ok(n) if n <= MAX_NDIM && (n == 0 || !proto.shape.is_null()) => n,
            _ => return fail(c"ValueError", format!("bad prototype: ndim {} with shape {:?}", proto.ndim, proto.shape)),
        };
        // SAFETY: checked non-NULL with `ndim` entries, as the prototype promises.
        let shape = if ndim == 0 { &[][..] } else { unsafe { core::slice::from_raw_parts(proto.shape, ndim) } };
        match dlbridge::zeros::<DLManagedTensorVersioned>(proto.dtype, shape) {
            Ok(tensor) => {
                // SAFETY: `out` is non-NULL and writable, per the API.
                unsafe { *out = tensor.into_raw() };
                0
            }
            Err(err) => fail(exception_name(&err), err.to_string()),
        }
    })
}

unsafe extern "C" fn managed_from_py_object(object: *mut c_void, out: *mut *mut DLManagedTensorVersioned) -> c_int {
    count(1);
    with_python(|py| {
        let tensor = our_tensor(py, object)?;
        if out.is_null() {
            return Err(PyValueError::new_err("NULL out pointer"));
        }
        tensor.get().order_default_stream()?;
        let exported = Tensor::export_versioned(&tensor)?;
        // SAFETY: non-NULL and writable, per the API, which hands the caller ownership.
        unsafe { *out = exported.as_ptr() };
        Ok(())
    })
}

unsafe extern "C" fn managed_to_py_object(tensor: *mut DLManagedTensorVersioned, out: *mut *mut c_void) -> c_int {
    count(2);
    with_python(|py| {
        // SAFETY: the API hands us ownership of `tensor` ("steals" it); on error
        // `from_raw` has already called its deleter.
        let owned = unsafe { OwnedTensor::from_raw(tensor) }.map_err(to_py_err)?;
        if out.is_null() {
            return Err(PyValueError::new_err("NULL out pointer"));
        }
        let object = Bound::new(py, TensorObject::from(Tensor::new(owned)))?;
        // SAFETY: non-NULL and writable; the caller receives a new reference.
        unsafe { *out = object.into_ptr().cast() };
        Ok(())
    })
}

unsafe extern "C" fn dltensor_from_py_object(object: *mut c_void, out: *mut DLTensor) -> c_int {
    count(3);
    with_python(|py| {
        let tensor = our_tensor(py, object)?;
        if out.is_null() {
            return Err(PyValueError::new_err("NULL out pointer"));
        }
        if tensor.get().view().is_subbyte_padded() {
            // A bare DLTensor cannot say its elements are padded: the caller would
            // read them as packed. Refused, so that it asks for a versioned export.
            return Err(PyBufferError::new_err("a padded sub-byte tensor needs a versioned DLPack tensor to say so"));
        }
        tensor.get().order_default_stream()?;
        // SAFETY: `out` is non-NULL and writable. Its pointers stay valid while the
        // tensor object lives, which the caller guarantees until control returns.
        unsafe { *out = tensor.get().borrowed_dltensor() };
        Ok(())
    })
}

/// `CU_STREAM_LEGACY`, the handle of CUDA's legacy default stream.
const CUDA_LEGACY_STREAM: usize = 1;

unsafe extern "C" fn current_work_stream(device_type: DeviceType, _device_id: i32, out: *mut *mut c_void) -> c_int {
    count(4);
    if out.is_null() {
        // -1 means "with a Python exception set", as the header says.
        return with_python(|_| Err(PyValueError::new_err("current_work_stream: NULL out pointer")));
    }
    let stream = match device_type {
        DeviceType::CUDA | DeviceType::CUDA_MANAGED => CUDA_LEGACY_STREAM,
        _ => 0,
    };
    // SAFETY: non-NULL and writable. A stream handle is an opaque number.
    unsafe { *out = core::ptr::without_provenance_mut(stream) };
    0
}
