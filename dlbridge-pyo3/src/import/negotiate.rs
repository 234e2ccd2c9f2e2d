//! Asking a producer for a capsule: the array API's `__dlpack__` negotiation.
//!
//! Ask for `max_version=(1, 3)`, pass `dl_device` and `copy` only when the
//! caller gave them, retry without them on TypeError, then with no keywords at
//! all (early-draft and pre-1.0 producers).

use pyo3::exceptions::{PyAttributeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
use pyo3::{ffi, intern};

use super::ImportOptions;
use crate::capsule::is_capsule;
use crate::convert::type_name;

/// The keyword names of a `__dlpack__` call, cached per combination of the
/// optional `dl_device` and `copy`.
// Cannot fire: making a tuple of interned strings fails only on out-of-memory.
#[allow(clippy::expect_used)]
fn kwnames(py: Python<'_>, dl_device: bool, copy: bool) -> &Bound<'_, PyTuple> {
    static CACHE: [PyOnceLock<Py<PyTuple>>; 4] = [const { PyOnceLock::new() }; 4];
    let index = usize::from(dl_device) | usize::from(copy) << 1;
    CACHE[index]
        .get_or_init(py, || {
            let mut names = vec![intern!(py, "max_version")];
            if dl_device {
                names.push(intern!(py, "dl_device"));
            }
            if copy {
                names.push(intern!(py, "copy"));
            }
            PyTuple::new(py, names).expect("a tuple of strings").unbind()
        })
        .bind(py)
}

// Cannot fire: making a tuple of two small ints fails only on out-of-memory.
#[allow(clippy::expect_used)]
fn max_version_arg(py: Python<'_>) -> &Bound<'_, PyTuple> {
    static MAX_VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    MAX_VERSION
        .get_or_init(py, || {
            let v = dlbridge::ffi::DLPackVersion::CURRENT;
            PyTuple::new(py, [v.major, v.minor]).expect("a tuple of ints").unbind()
        })
        .bind(py)
}

/// `obj.__dlpack__(max_version=(1, 3)[, dl_device=..][, copy=..])` by vectorcall,
/// with interned names and no dict.
fn call_dlpack_versioned<'py>(obj: &Bound<'py, PyAny>, options: ImportOptions) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let device_arg = options.device.map(|d| PyTuple::new(py, [d.device_type.0, d.device_id])).transpose()?;
    let copy_arg = options.copy.map(|c| pyo3::types::PyBool::new(py, c).to_owned().into_any());
    let mut args: [*mut ffi::PyObject; 4] = [obj.as_ptr(), max_version_arg(py).as_ptr(), core::ptr::null_mut(), core::ptr::null_mut()];
    let keywords = [device_arg.as_ref().map(|d| d.as_any()), copy_arg.as_ref()];
    for (slot, value) in args[2..].iter_mut().zip(keywords.into_iter().flatten()) {
        *slot = value.as_ptr();
    }
    let names = kwnames(py, device_arg.is_some(), copy_arg.is_some());
    // SAFETY: `args` holds self followed by one value per keyword name, all
    // borrowed from live objects for the duration of the call; nargsf counts
    // self only.
    unsafe {
        let result = ffi::PyObject_VectorcallMethod(intern!(py, "__dlpack__").as_ptr(), args.as_ptr(), 1, names.as_ptr());
        Bound::from_owned_ptr_or_err(py, result)
    }
}

/// Turns a failed `__dlpack__` lookup into the TypeError that `from_dlpack` raises.
fn no_dlpack(obj: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!(
        "object of type {} does not support DLPack: it has no __dlpack__ method and is not a DLPack capsule",
        type_name(obj)
    ))
}

pub(crate) fn has_dlpack(obj: &Bound<'_, PyAny>) -> bool {
    obj.hasattr(intern!(obj.py(), "__dlpack__")).unwrap_or(false)
}

/// Calls `__dlpack__` with the array-API negotiation and returns its capsule.
pub(crate) fn request_capsule<'py>(obj: &Bound<'py, PyAny>, options: ImportOptions) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let mut attempt = call_dlpack_versioned(obj, options);
    if options != ImportOptions::default() && matches!(&attempt, Err(err) if err.is_instance_of::<PyTypeError>(py)) {
        // A producer that knows max_version but not the newer dl_device/copy:
        // ask again without them; the caller applies them afterwards.
        attempt = call_dlpack_versioned(obj, ImportOptions::default());
    }
    let capsule = match attempt {
        Ok(capsule) => capsule,
        Err(err) if err.is_instance_of::<PyTypeError>(py) => {
            // A producer that predates max_version: retry with no keywords.
            // Early-draft producers land here too and return their legacy
            // capsule, the only ABI of the draft whose layout is certain.
            obj.call_method0(intern!(py, "__dlpack__")).map_err(|retry_err| {
                if retry_err.is_instance_of::<PyAttributeError>(py) && !has_dlpack(obj) {
                    no_dlpack(obj)
                } else {
                    retry_err
                }
            })?
        }
        Err(err) if err.is_instance_of::<PyAttributeError>(py) && !has_dlpack(obj) => return Err(no_dlpack(obj)),
        Err(err) => return Err(err),
    };
    if !is_capsule(&capsule) {
        return Err(PyTypeError::new_err(format!("__dlpack__ returned a {}, not a DLPack capsule", type_name(&capsule))));
    }
    Ok(capsule)
}
