//! One `dlbridge.Tensor` class for every extension in a process.
//!
//! Each extension that links dlbridge-pyo3 compiles its own copy of the
//! `Tensor` class. So that a tensor returned by any of them is an instance of
//! the `dlbridge` package's class (`isinstance(t, dlbridge.Tensor)`, and
//! pickling that needs the package), the package publishes a C function that
//! adopts a tensor into its class, as NumPy publishes its array API to
//! rust-numpy; other extensions hand what they return to it. The table lives
//! in the interpreter's state dict, where only C code puts anything (see
//! `trust.rs`), not in a module attribute Python code could rebind to another
//! build's table. Without the package (or with one of another ABI), an
//! extension's tensors are instances of its own class, which works
//! everywhere DLPack does. The table also describes a package tensor in place
//! (memory, writability, readiness), so that another extension's arguments
//! read and write it without an export.
//!
//! Each struct passed through the table comes with its size: fields are only
//! appended (`Described` and `Handover` only together with a field of the
//! table, so that a table at least as large as the caller's fills all the
//! caller knows), a callee reads or writes no more than the caller has, and a
//! change to an existing field is a new major (pinned by the tests below).

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
use crate::abi_structs::{read_prefix, write_prefix};
use crate::errors::{for_c_caller, IntoPyResult};
use crate::borrows::HeldRead;
use crate::writability::Writability;

/// The capsule's name, and its key in the interpreter's dict: never changes.
const KEY: &CStr = c"dlbridge.package_tensor_api";
/// Changed whenever a field's meaning, of the table or of a struct passed
/// through it, changes; new fields are appended. (2: `Described` lost
/// `copied`; the structs come with their size.)
const ABI_MAJOR: u32 = 2;

/// A tensor handed from one extension to the package's class.
#[repr(C)]
#[derive(Clone, Copy)]
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
    /// A shared borrow the tensor holds for as long as it lives (its id in
    /// the registry, handed over with it), or 0.
    held_read: u64,
}

/// A package tensor as another extension's argument sees it, in place.
#[repr(C)]
#[derive(Clone, Copy)]
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
    /// Takes everything `*handover` (`handover_size` bytes) owns, on success
    /// and on failure, and returns a new `dlbridge.Tensor`, or NULL with an
    /// exception set. The caller is attached (holds the GIL, with one).
    adopt: unsafe extern "C" fn(handover: *const Handover, handover_size: usize) -> *mut ffi::PyObject,
    /// Fills at most `out_size` bytes of `*out` for `obj` if it is a package
    /// tensor and returns 0; 1 if it is not one; -1 with an exception set.
    /// `requested` (when `has_requested`) is the stream the caller will use.
    /// The caller is attached.
    describe: unsafe extern "C" fn(obj: *mut ffi::PyObject, has_requested: u8, requested: i64, out: *mut Described, out_size: usize) -> c_int,
}

static OWN: TensorApi = TensorApi { abi_major: ABI_MAJOR, size: core::mem::size_of::<TensorApi>() as u32, adopt, describe };

/// Publishes this module's class as the one `dlbridge.Tensor` (the package's
/// `_native` module calls this from `register`); the first package of the
/// interpreter stays the one.
pub(crate) fn publish(module: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = module.py();
    let own = core::ptr::addr_of!(OWN).cast_mut().cast();
    // SAFETY: a static table outlives the capsule; no destructor is needed.
    let capsule = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyCapsule_New(own, KEY.as_ptr(), None))? };
    crate::trust::publish_for_interpreter(py, KEY, &capsule).map(drop).ok_or_else(|| PySystemError::new_err("the package's tensor table could not be published"))
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
/// extension itself. Looked up once per process: in the interpreter's dict,
/// after importing `dlbridge._native` (which publishes it) if it is not there yet.
fn package(py: Python<'_>) -> Option<&'static Package> {
    static PACKAGE: PyOnceLock<Option<Package>> = PyOnceLock::new();
    PACKAGE
        .get_or_init(py, || {
            let found = (|| -> PyResult<Option<Package>> {
                let module = py.import(intern!(py, "dlbridge._native"))?;
                let Some(entry) = crate::trust::interpreter_entry(py, KEY) else { return Ok(None) };
                let Ok(table) = crate::trust::table_of(&entry, KEY, ABI_MAJOR, core::mem::size_of::<TensorApi>()) else { return Ok(None) };
                // SAFETY: a table of this major and size, which lives as long as the process.
                let api = unsafe { &*table.cast::<TensorApi>() };
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
    // A shared-memory origin stays with the export (it owns the mapping); only
    // the package makes shared tensors, so none comes from another extension.
    let Tensor { owned, writability, origin: _, ready: _, held_read } = tensor;
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
    let handover = Handover {
        versioned,
        legacy,
        writability: writability_code(writability),
        has_ready: u8::from(ready.is_some()),
        ready: ready.unwrap_or(0),
        held_read: held_read.into_id(),
    };
    // SAFETY: the package's function with a complete handover of the size
    // passed, which it takes over entirely; the thread is attached.
    unsafe { Bound::from_owned_ptr_or_err(py, (api.adopt)(&handover, core::mem::size_of::<Handover>())) }
}

unsafe extern "C" fn adopt(handover: *const Handover, handover_size: usize) -> *mut ffi::PyObject {
    // SAFETY: the caller passes a handover of `handover_size` bytes and is attached.
    let handover = unsafe { read_prefix(handover, handover_size) };
    let on_panic = || PySystemError::new_err("dlbridge panicked while adopting a tensor from another extension");
    for_c_caller(core::ptr::null_mut(), on_panic, |py| adopted(py, handover).map(Bound::into_ptr))
}

fn adopted(py: Python<'_>, h: Handover) -> PyResult<Bound<'_, PyAny>> {
    let owned = if h.versioned.is_null() {
        // SAFETY: an owned legacy tensor handed over; validated here, deleted on error.
        AnyOwned::Legacy(unsafe { OwnedLegacyTensor::from_raw(h.legacy) }.py()?)
    } else {
        // SAFETY: as above, versioned.
        AnyOwned::Versioned(unsafe { Owned::<DLManagedTensorVersioned>::from_raw(h.versioned) }.py()?)
    };
    let writability = writability_of(h.writability);
    // Taken over first, so that it is released whatever fails below.
    let held_read = HeldRead::from_id(h.held_read);
    let mut tensor = Tensor::with_writability(owned, writability).ready_on(if h.has_ready != 0 { Some(h.ready) } else { None })?;
    tensor.held_read = held_read;
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
    // Filled whole: a package of this major has a table at least as large as
    // ours (`package` checks), and `Described` grows only with the table.
    let mut d = core::mem::MaybeUninit::<Described>::uninit();
    // SAFETY: the package's function, with a live object, a writable out
    // struct of the size passed, from an attached thread.
    let code = unsafe { (api.describe)(obj.as_ptr(), u8::from(requested.is_some()), requested.unwrap_or(0), d.as_mut_ptr(), core::mem::size_of::<Described>()) };
    match code {
        0 => {}
        1 => return Ok(None),
        _ => return Err(PyErr::fetch(py)),
    }
    // SAFETY: filled whole on success (above).
    let d = unsafe { d.assume_init() };
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

unsafe extern "C" fn describe(obj: *mut ffi::PyObject, has_requested: u8, requested: i64, out: *mut Described, out_size: usize) -> c_int {
    let on_panic = || PySystemError::new_err("dlbridge panicked while describing a tensor to another extension");
    for_c_caller(-1, on_panic, |py| {
        // SAFETY: a live object, borrowed for the call (the caller's contract).
        let obj = unsafe { pyo3::Borrowed::from_ptr(py, obj) };
        let Ok(tensor) = obj.cast_exact::<TensorObject>() else { return Ok(1) };
        let tensor = tensor.get();
        let ready = tensor.lend_stream((has_requested != 0).then_some(requested))?;
        let described = || Described {
            tensor: tensor.borrowed_dltensor(),
            writability: writability_code(tensor.writability()),
            padded: u8::from(tensor.view().is_subbyte_padded()),
            has_ready: u8::from(ready.is_some()),
            ready: ready.unwrap_or(0),
        };
        if out_size >= core::mem::size_of::<Described>() {
            // SAFETY: the caller's writable out struct, as large as ours (written in place).
            unsafe { out.write(described()) };
        } else {
            // SAFETY: the caller's writable out struct of `out_size` bytes.
            unsafe { write_prefix(&described(), out, out_size) };
        }
        Ok(0)
    })
}

#[cfg(all(test, target_pointer_width = "64"))]
mod layout {
    use core::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn the_structs_another_build_reads_are_those_of_abi_2() {
        assert_eq!(ABI_MAJOR, 2, "a new major: pin its layout here");
        assert_eq!((size_of::<TensorApi>(), offset_of!(TensorApi, adopt), offset_of!(TensorApi, describe)), (24, 8, 16));
        let handover = (
            size_of::<Handover>(),
            offset_of!(Handover, legacy),
            offset_of!(Handover, writability),
            offset_of!(Handover, has_ready),
            offset_of!(Handover, ready),
            offset_of!(Handover, held_read),
        );
        assert_eq!(handover, (40, 8, 16, 17, 24, 32));
        let described = (
            size_of::<Described>(),
            offset_of!(Described, writability),
            offset_of!(Described, padded),
            offset_of!(Described, has_ready),
            offset_of!(Described, ready),
        );
        assert_eq!(described, (64, 48, 49, 50, 56));
    }
}
