//! The DLPack 1.3 C exchange API, both directions.
//!
//! Producer: `dlbridge.Tensor.__dlpack_c_exchange_api__` is a `"dlpack_exchange_api"`
//! capsule pointing at [`EXCHANGE_API`], a static table whose five functions all
//! work: allocation, owning and non-owning export, import to a `Tensor`, and the
//! current work stream (always NULL: dlbridge queues no device work).
//!
//! Consumer: [`lookup`] finds a type's table (the 1.3 capsule, or the 1.2
//! integer `__c_dlpack_exchange_api__`), checks the major version and walks
//! `prev_api`, and caches the answer per type.

use core::cell::RefCell;
use core::ffi::{c_int, c_void, CStr};
use core::sync::atomic::{AtomicU64, Ordering};
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};

use dlbridge::ffi::{
    DLManagedTensorVersioned, DLPackExchangeAPI, DLPackExchangeAPIHeader, DLPackSetError, DLPackVersion, DLTensor,
    DLPACK_MAJOR_VERSION,
};
use dlbridge::{Device, DeviceType, ManagedTensor, MAX_NDIM};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::{ffi, intern, Borrowed};

use crate::errors::{exception_name, to_py_err};
use crate::tensor::Tensor;

/// The name of the capsule that carries a `DLPackExchangeAPI`.
pub const EXCHANGE_API_CAPSULE_NAME: &CStr = c"dlpack_exchange_api";

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
pub static CALLS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

fn count(index: usize) {
    CALLS[index].fetch_add(1, Ordering::Relaxed);
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
    Python::attach(|py| match catch_unwind(AssertUnwindSafe(|| body(py))) {
        Ok(Ok(())) => 0,
        Ok(Err(err)) => {
            err.restore(py);
            -1
        }
        Err(_) => {
            PyRuntimeError::new_err("dlbridge panicked in an exchange-API function").restore(py);
            -1
        }
    })
}

fn our_tensor<'a, 'py>(py: Python<'py>, object: *mut c_void) -> PyResult<Borrowed<'a, 'py, Tensor>> {
    if object.is_null() {
        return Err(PyTypeError::new_err("NULL Python object passed to dlbridge's exchange API"));
    }
    // SAFETY: a non-NULL Python object from a caller that holds the GIL.
    let any = unsafe { Borrowed::from_ptr(py, object.cast::<ffi::PyObject>()) };
    any.cast_exact::<Tensor>().map_err(|_| {
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
        let managed = Tensor::export_versioned(&tensor)?;
        if out.is_null() {
            return Err(PyTypeError::new_err("NULL out pointer"));
        }
        // SAFETY: non-NULL and writable, per the API.
        unsafe { *out = managed.into_raw() };
        Ok(())
    })
}

unsafe extern "C" fn managed_to_py_object(tensor: *mut DLManagedTensorVersioned, out: *mut *mut c_void) -> c_int {
    count(2);
    with_python(|py| {
        // SAFETY: the API hands us ownership of `tensor` ("steals" it); on error
        // `from_raw` has already called its deleter.
        let managed = unsafe { ManagedTensor::from_raw(tensor) }.map_err(to_py_err)?;
        let object = Bound::new(py, Tensor::new(managed))?;
        if out.is_null() {
            return Err(PyTypeError::new_err("NULL out pointer"));
        }
        // SAFETY: non-NULL and writable; the caller receives a new reference.
        unsafe { *out = object.into_ptr().cast() };
        Ok(())
    })
}

unsafe extern "C" fn dltensor_from_py_object(object: *mut c_void, out: *mut DLTensor) -> c_int {
    count(3);
    with_python(|py| {
        let tensor = our_tensor(py, object)?;
        let view = tensor.get().view();
        if out.is_null() {
            return Err(PyTypeError::new_err("NULL out pointer"));
        }
        let (shape, strides) = if view.ndim() == 0 {
            (core::ptr::null_mut(), core::ptr::null_mut())
        } else {
            (view.shape().as_ptr().cast_mut(), view.strides().as_ptr().cast_mut())
        };
        // SAFETY: `out` is non-NULL and writable. The pointers stay valid while the
        // tensor object lives, which the caller guarantees until control returns.
        unsafe {
            *out = DLTensor {
                data: if view.is_empty() { core::ptr::null_mut() } else { view.as_ptr().cast_mut() },
                device: view.device(),
                ndim: view.ndim() as i32,
                dtype: view.dtype(),
                shape,
                strides,
                byte_offset: 0,
            };
        }
        Ok(())
    })
}

unsafe extern "C" fn current_work_stream(_device_type: DeviceType, _device_id: i32, out: *mut *mut c_void) -> c_int {
    count(4);
    guarded(|| {
        if out.is_null() {
            return -1;
        }
        // SAFETY: non-NULL and writable. dlbridge queues no work on any stream.
        unsafe { *out = core::ptr::null_mut() };
        0
    })
}

/// The newest table in a chain whose major version this crate speaks.
///
/// # Safety
/// `header` must be NULL or point at a live table whose `prev_api` chain is
/// NULL-terminated; tables are static by the header's rules.
unsafe fn compatible(mut header: *const DLPackExchangeAPIHeader) -> Option<&'static DLPackExchangeAPI> {
    for _ in 0..16 {
        if header.is_null() {
            return None;
        }
        // SAFETY: forwarded from the caller.
        let h = unsafe { &*header };
        if h.version.major == DLPACK_MAJOR_VERSION {
            // SAFETY: a header with our major heads a `DLPackExchangeAPI` of our layout.
            return Some(unsafe { &*header.cast::<DLPackExchangeAPI>() });
        }
        header = h.prev_api;
    }
    None
}

/// A type's table: the 1.3 `"dlpack_exchange_api"` capsule, else the 1.2 integer.
fn find(ty: &Bound<'_, pyo3::types::PyType>) -> Option<&'static DLPackExchangeAPI> {
    let py = ty.py();
    if let Ok(value) = ty.getattr(intern!(py, "__dlpack_c_exchange_api__")) {
        // SAFETY: a name check on a live object; IsValid never raises.
        if unsafe { ffi::PyCapsule_IsValid(value.as_ptr(), EXCHANGE_API_CAPSULE_NAME.as_ptr()) } == 1 {
            // SAFETY: validated capsule; its pointer is a process-lifetime table.
            let ptr = unsafe { ffi::PyCapsule_GetPointer(value.as_ptr(), EXCHANGE_API_CAPSULE_NAME.as_ptr()) };
            // SAFETY: as above.
            return unsafe { compatible(ptr.cast()) };
        }
    }
    if let Ok(value) = ty.getattr(intern!(py, "__c_dlpack_exchange_api__")) {
        if let Ok(address) = value.extract::<usize>() {
            // SAFETY: the 1.2 protocol publishes the table's address as an int;
            // the producer promises a live, static table.
            return unsafe { compatible(address as *const DLPackExchangeAPIHeader) };
        }
    }
    None
}

thread_local! {
    /// (type, table) pairs; the types are kept alive (one leaked reference each)
    /// so that a freed type's address can never be mistaken for a cached one.
    static CACHE: RefCell<Vec<(usize, Option<&'static DLPackExchangeAPI>)>> = const { RefCell::new(Vec::new()) };
}

const CACHE_CAPACITY: usize = 32;

/// The exchange-API table of `obj`'s type, cached per type.
pub fn lookup(obj: &Bound<'_, PyAny>) -> Option<&'static DLPackExchangeAPI> {
    // SAFETY: reading the type pointer of a live object; no reference is taken.
    let key = unsafe { ffi::Py_TYPE(obj.as_ptr()) } as usize;
    if let Some(hit) = CACHE.with_borrow(|cache| cache.iter().find(|(k, _)| *k == key).map(|(_, api)| *api)) {
        return hit;
    }
    let ty = obj.get_type();
    let api = find(&ty);
    CACHE.with_borrow_mut(|cache| {
        if cache.len() < CACHE_CAPACITY {
            // Keep the type alive for as long as the cache names it.
            core::mem::forget(ty.clone());
            cache.push((key, api));
        }
    });
    api
}

/// Owning import through a producer's table. `Ok(None)` means "use `__dlpack__`
/// instead": there is no usable function, the producer raised BufferError, or
/// the tensor is on a device with streams, where this unsynchronised path would
/// race with pending work.
pub(crate) fn import_owned(obj: &Bound<'_, PyAny>, api: &DLPackExchangeAPI) -> PyResult<Option<ManagedTensor>> {
    let Some(export) = api.managed_tensor_from_py_object_no_sync else { return Ok(None) };
    let mut out: *mut DLManagedTensorVersioned = core::ptr::null_mut();
    // SAFETY: the producer's function, called with an object of the type it was
    // found on and a writable out pointer; the GIL is held.
    let rc = unsafe { export(obj.as_ptr().cast(), &mut out) };
    if rc != 0 || out.is_null() {
        let err = PyErr::take(obj.py())
            .unwrap_or_else(|| pyo3::exceptions::PyBufferError::new_err("exchange-API export failed without an exception"));
        return if err.is_instance_of::<pyo3::exceptions::PyBufferError>(obj.py()) { Ok(None) } else { Err(err) };
    }
    // SAFETY: an owning export we now own; `from_raw` validates it and deletes it on error.
    let managed = unsafe { ManagedTensor::from_raw(out) }.map_err(to_py_err)?;
    if managed.view().device().device_type.has_streams() {
        return Ok(None);
    }
    Ok(Some(managed))
}

/// Non-owning fill through a producer's table, for a tensor borrowed during a call.
pub(crate) fn fill_borrowed(obj: &Bound<'_, PyAny>, api: &DLPackExchangeAPI) -> PyResult<Option<DLTensor>> {
    let Some(fill) = api.dltensor_from_py_object_no_sync else { return Ok(None) };
    // SAFETY: DLTensor is plain data; the producer fills it.
    let mut out: DLTensor = unsafe { core::mem::zeroed() };
    // SAFETY: the producer's function, with an object of its type and a writable DLTensor.
    if unsafe { fill(obj.as_ptr().cast(), &mut out) } != 0 {
        return match PyErr::take(obj.py()) {
            Some(err) if !err.is_instance_of::<pyo3::exceptions::PyBufferError>(obj.py()) => Err(err),
            _ => Ok(None),
        };
    }
    Ok(Some(out))
}

/// The producer's current stream for `device`, or NULL when it has none to report.
pub fn work_stream(api: &DLPackExchangeAPI, device: Device) -> *mut c_void {
    let mut stream: *mut c_void = core::ptr::null_mut();
    if let Some(query) = api.current_work_stream {
        // SAFETY: the producer's function with a writable out pointer.
        if unsafe { query(device.device_type, device.device_id, &mut stream) } != 0 {
            return core::ptr::null_mut();
        }
    }
    stream
}
