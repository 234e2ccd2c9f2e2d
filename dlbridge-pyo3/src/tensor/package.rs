//! One `dlbridge.Tensor` class for every extension in a process.
//!
//! Each extension that links dlbridge-pyo3 compiles its own copy of the
//! `Tensor` class. So that a tensor returned by any of them is an instance of
//! the `dlbridge` package's class (`isinstance(t, dlbridge.Tensor)`, and
//! pickling that needs the package), the package publishes a C function that
//! adopts a tensor into its class, `dlbridge._native._TENSOR_API`, as NumPy
//! publishes its array API to rust-numpy; other extensions hand what they
//! return to it. Without the package (or with one of an incompatible ABI), an
//! extension's tensors are instances of its own class, which works
//! everywhere DLPack does. The table also describes a package tensor in place
//! (memory, writability, readiness), so that another extension's arguments
//! read and write it without an export.

use core::ffi::{c_int, CStr};

use dlbridge::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLTensor};
use dlbridge::{Owned, OwnedLegacyTensor, OwnedTensor};
use pyo3::exceptions::{PyImportError, PySystemError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use pyo3::{ffi, intern, IntoPyObject};

use super::{Tensor, TensorObject};
use crate::any_owned::AnyOwned;
use crate::errors::{for_c_caller, IntoPyResult};
use crate::owner::PyOwner;
use crate::writability::Writability;

/// The capsule's name, and its attribute of `dlbridge._native`.
const CAPSULE: &CStr = c"dlbridge._native._TENSOR_API";
/// Changed only when a field's meaning changes; new fields are appended and counted by `size`.
const ABI_MAJOR: u32 = 1;

/// A tensor handed from one extension to the package's class.
#[repr(C)]
struct Handover {
    /// An owned versioned tensor; NULL when `legacy` is given.
    versioned: *mut DLManagedTensorVersioned,
    /// An owned legacy tensor (its writability unknown); NULL when `versioned` is given.
    legacy: *mut DLManagedTensor,
    /// 0 writable, 1 read-only, 2 unknown.
    writability: u8,
    /// Whether `ready` holds a stream value.
    has_ready: u8,
    /// The stream the data is ready on: 1 (CUDA's legacy default) or a ROCm stream value.
    ready: i64,
    /// A shared-memory segment kept alive with the tensor (a new reference), or NULL.
    origin: *mut ffi::PyObject,
}

/// A package tensor as another extension's argument sees it, in place.
#[repr(C)]
struct Described {
    /// Non-owning: data, shape and strides valid while the object lives.
    tensor: DLTensor,
    /// 0 writable, 1 read-only, 2 unknown.
    writability: u8,
    /// Whether sub-byte elements are padded to a byte each.
    padded: u8,
    /// Whether `ready` holds a stream value.
    has_ready: u8,
    /// The stream the data is ready on for the stream asked for.
    ready: i64,
}

/// The published table. Fields are only appended; `size` says how many a publisher filled.
#[repr(C)]
struct TensorApi {
    abi_major: u32,
    size: u32,
    /// Takes everything `*handover` owns (on success and on failure) and
    /// returns a new `dlbridge.Tensor`, or NULL with an exception set. The
    /// caller holds the GIL.
    adopt: unsafe extern "C" fn(handover: *mut Handover) -> *mut ffi::PyObject,
    /// Fills `*out` for `obj` if it is a package tensor and returns 0; 1 if it
    /// is not one; -1 with an exception set. `requested` (when `has_requested`)
    /// is the stream the caller will use. The caller holds the GIL.
    describe: unsafe extern "C" fn(obj: *mut ffi::PyObject, has_requested: u8, requested: i64, out: *mut Described) -> c_int,
}

static OWN: TensorApi = TensorApi { abi_major: ABI_MAJOR, size: core::mem::size_of::<TensorApi>() as u32, adopt, describe };

/// Publishes this module's class as the one `dlbridge.Tensor` (the package's
/// `_native` module calls this from `register`).
pub(crate) fn publish(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let own = core::ptr::addr_of!(OWN).cast_mut().cast();
    // SAFETY: a static table outlives the capsule; no destructor is needed.
    let capsule = unsafe { Bound::from_owned_ptr_or_err(module.py(), ffi::PyCapsule_New(own, CAPSULE.as_ptr(), None))? };
    module.add("_TENSOR_API", capsule)
}

/// Looks the package's table up now (an import, the first time), before an
/// argument's pointers are taken.
pub(crate) fn prepare_package_api(py: Python<'_>) {
    let _ = package(py);
}

/// The package as another extension finds it: its table, and its `Tensor`
/// class, so that arguments of any other type skip the call into it.
struct Package {
    api: &'static TensorApi,
    /// `dlbridge._native.Tensor`: only its exact instances are described.
    tensor_type: Py<PyType>,
}

/// The package, if it is installed, speaks this ABI, and is not this
/// extension itself. Looked up once per process.
fn package(py: Python<'_>) -> Option<&'static Package> {
    static PACKAGE: PyOnceLock<Option<Package>> = PyOnceLock::new();
    PACKAGE
        .get_or_init(py, || {
            let found = (|| -> PyResult<Option<Package>> {
                let module = py.import(intern!(py, "dlbridge._native"))?;
                let capsule = module.getattr(intern!(py, "_TENSOR_API"))?;
                // SAFETY: a name check on a live object; IsValid never raises.
                if unsafe { ffi::PyCapsule_IsValid(capsule.as_ptr(), CAPSULE.as_ptr()) } != 1 {
                    return Ok(None);
                }
                // SAFETY: a capsule of this name, just checked; no exception is possible.
                let table = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), CAPSULE.as_ptr()).cast::<TensorApi>() };
                // SAFETY: a valid capsule of this name holds a table that lives as
                // long as the process (extension modules are never unloaded) and
                // starts with its major and size, read before anything larger.
                let [major, size] = unsafe { table.cast::<[u32; 2]>().read() };
                if major != ABI_MAJOR || (size as usize) < core::mem::size_of::<TensorApi>() {
                    return Ok(None);
                }
                // SAFETY: as above; the table has every field this version reads.
                let api = unsafe { &*table };
                if core::ptr::eq(api, &OWN) {
                    return Ok(None);
                }
                // A rebound class only leaves `describe` unasked (its own check
                // decides); a missing one means no package to hand tensors to.
                let tensor_type = module.getattr(intern!(py, "Tensor"))?.cast_into::<PyType>()?.unbind();
                Ok(Some(Package { api, tensor_type }))
            })();
            found.unwrap_or_else(|err| {
                drop(err);
                None
            })
        })
        .as_ref()
}

/// A module of the `dlbridge` Python package, for what only the package
/// provides (pickling, shared memory, `numpy()`); without the package, an
/// ImportError that says what needs it.
pub(crate) fn import<'py>(py: Python<'py>, module: &str, what: &str) -> PyResult<Bound<'py, PyAny>> {
    crate::python_calls::import(py, &pyo3::types::PyString::new(py, module)).map_err(|err| {
        if err.is_instance_of::<PyImportError>(py) {
            PyImportError::new_err(format!(
                "{what} needs the dlbridge Python package, which is not installed (pip install dlbridge): \
                 this tensor came from an extension that links dlbridge-pyo3 on its own ({err})"
            ))
        } else {
            err
        }
    })
}

impl<'py> IntoPyObject<'py> for Tensor {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    /// An instance of the `dlbridge` package's `Tensor` class when the package
    /// is there, else of this extension's own.
    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match package(py) {
            Some(package) => hand_over(py, package.api, self),
            None => Ok(Bound::new(py, TensorObject(self))?.into_any()),
        }
    }
}

/// Hands `tensor` to the package's class: its memory, writability, readiness
/// (an event kept here becomes an order on the legacy stream, which both
/// extensions' drivers share) and shared-memory origin.
fn hand_over<'py>(py: Python<'py>, api: &TensorApi, tensor: Tensor) -> PyResult<Bound<'py, PyAny>> {
    let ready = tensor.stream_for(None)?;
    let Tensor { owned, writability, origin, ready: _ } = tensor;
    let owned = owned.into_inner();
    let flags = owned.flags();
    let (versioned, legacy) = match owned {
        AnyOwned::Versioned(t) => (t.into_raw(), core::ptr::null_mut()),
        AnyOwned::Legacy(t) => (core::ptr::null_mut(), t.into_raw()),
        AnyOwned::Object(t) => {
            let view = t.detached_view();
            // SAFETY: the object's memory, validated, stays valid while its owner
            // (moved into the export) lives; writable only without READ_ONLY.
            let exported: OwnedTensor = unsafe { dlbridge::export::export_view(t, &view, view.device(), flags) }.py()?;
            (exported.into_raw(), core::ptr::null_mut())
        }
    };
    let mut handover = Handover {
        versioned,
        legacy,
        writability: writability_code(writability),
        has_ready: u8::from(ready.is_some()),
        ready: ready.unwrap_or(0),
        origin: origin.map_or(core::ptr::null_mut(), PyOwner::into_ptr),
    };
    // SAFETY: the package's function with a complete handover, which it takes
    // over entirely; the GIL is held.
    unsafe { Bound::from_owned_ptr_or_err(py, (api.adopt)(&mut handover)) }
}

unsafe extern "C" fn adopt(handover: *mut Handover) -> *mut ffi::PyObject {
    // SAFETY: the caller passes a complete handover and holds the GIL.
    let handover = unsafe { handover.read() };
    let on_panic = || PySystemError::new_err("dlbridge panicked while adopting a tensor from another extension");
    for_c_caller(core::ptr::null_mut(), on_panic, |py| adopted(py, handover).map(Bound::into_ptr))
}

fn adopted(py: Python<'_>, h: Handover) -> PyResult<Bound<'_, PyAny>> {
    // SAFETY: a new reference handed over, or NULL.
    let origin = core::ptr::NonNull::new(h.origin).map(|origin| unsafe { PyOwner::from_owned_ptr(origin) });
    let owned = if h.versioned.is_null() {
        // SAFETY: an owned legacy tensor handed over; validated here, deleted on error.
        AnyOwned::Legacy(unsafe { OwnedLegacyTensor::from_raw(h.legacy) }.py()?)
    } else {
        // SAFETY: as above, versioned.
        AnyOwned::Versioned(unsafe { Owned::<DLManagedTensorVersioned>::from_raw(h.versioned) }.py()?)
    };
    let writability = writability_of(h.writability);
    let mut tensor = Tensor::with_writability(owned, writability).ready_on(if h.has_ready != 0 { Some(h.ready) } else { None })?;
    tensor.origin = origin;
    Ok(Bound::new(py, TensorObject(tensor))?.into_any())
}

/// A tensor of the package's class, as another extension sees it in place.
pub(crate) struct PackageTensor {
    /// Non-owning: valid while the object lives.
    pub(crate) tensor: DLTensor,
    pub(crate) writability: Writability,
    /// Sub-byte elements padded to a byte each.
    pub(crate) padded: bool,
    /// The stream the data is ready on for the one asked for.
    pub(crate) ready: Option<i64>,
}

/// `obj` described in place if it is a tensor of the package's class; `None`
/// for anything else, or without the package.
pub(crate) fn describe_package_tensor(obj: &Bound<'_, PyAny>, requested: Option<i64>) -> PyResult<Option<PackageTensor>> {
    let py = obj.py();
    let Some(Package { api, tensor_type }) = package(py) else { return Ok(None) };
    // SAFETY: reading the type of a live object.
    if unsafe { ffi::Py_TYPE(obj.as_ptr()) } != tensor_type.as_ptr().cast() {
        return Ok(None);
    }
    let mut out = core::mem::MaybeUninit::<Described>::uninit();
    // SAFETY: the package's function, with a live object, a writable out
    // struct and the GIL held.
    match unsafe { (api.describe)(obj.as_ptr(), u8::from(requested.is_some()), requested.unwrap_or(0), out.as_mut_ptr()) } {
        0 => {}
        1 => return Ok(None),
        _ => return Err(PyErr::fetch(py)),
    }
    // SAFETY: filled on success.
    let d = unsafe { out.assume_init() };
    let ready = (d.has_ready != 0).then_some(d.ready);
    Ok(Some(PackageTensor { tensor: d.tensor, writability: writability_of(d.writability), padded: d.padded != 0, ready }))
}

fn writability_of(code: u8) -> Writability {
    match code {
        0 => Writability::Writable,
        1 => Writability::ReadOnly,
        _ => Writability::Unknown,
    }
}

fn writability_code(writability: Writability) -> u8 {
    match writability {
        Writability::Writable => 0,
        Writability::ReadOnly => 1,
        Writability::Unknown => 2,
    }
}

unsafe extern "C" fn describe(obj: *mut ffi::PyObject, has_requested: u8, requested: i64, out: *mut Described) -> c_int {
    let on_panic = || PySystemError::new_err("dlbridge panicked while describing a tensor to another extension");
    for_c_caller(-1, on_panic, |py| {
        // SAFETY: a live object, borrowed for the call (the caller's contract).
        let obj = unsafe { pyo3::Borrowed::from_ptr(py, obj) };
        let Ok(tensor) = obj.cast_exact::<TensorObject>() else { return Ok(1) };
        let tensor = tensor.get();
        let ready = tensor.lend_stream((has_requested != 0).then_some(requested))?;
        let described = Described {
            tensor: tensor.borrowed_dltensor(),
            writability: writability_code(tensor.writability()),
            padded: u8::from(tensor.view().is_subbyte_padded()),
            has_ready: u8::from(ready.is_some()),
            ready: ready.unwrap_or(0),
        };
        // SAFETY: the caller's writable out struct.
        unsafe { out.write(described) };
        Ok(0)
    })
}
