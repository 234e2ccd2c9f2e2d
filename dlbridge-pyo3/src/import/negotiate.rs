//! Asking a producer for a capsule: the array API's `__dlpack__` negotiation.
//!
//! Ask for `max_version=(1, 3)`, pass `dl_device` and `copy` only when the
//! caller gave them and dlbridge cannot serve them itself (a move between
//! host and CUDA, or CUDA memory the host can reach, is made here, not asked
//! of the producer), retry without them on TypeError, then with no keywords at
//! all (early-draft and pre-1.0 producers). The `stream` passed is valid for
//! the device the data is handed over on: none for the CPU, else the caller's
//! or the legacy default stream, in every attempt.

use pyo3::exceptions::{PyAttributeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
use pyo3::{ffi, intern};

use dlbridge::Device;

use super::ImportOptions;
use crate::handoff::reaches;
use crate::capsule::is_capsule;
use crate::moves::can_move;
use crate::convert::type_name;

/// The keyword names of a `__dlpack__` call, cached per combination of the
/// optional `stream`, `dl_device` and `copy` (`max_version` when `versioned`).
// Cannot fire: making a tuple of interned strings fails only on out-of-memory.
#[allow(clippy::expect_used)]
fn kwnames(py: Python<'_>, versioned: bool, stream: bool, dl_device: bool, copy: bool) -> &Bound<'_, PyTuple> {
    static CACHE: [PyOnceLock<Py<PyTuple>>; 16] = [const { PyOnceLock::new() }; 16];
    let index = usize::from(versioned) | usize::from(stream) << 1 | usize::from(dl_device) << 2 | usize::from(copy) << 3;
    CACHE[index]
        .get_or_init(py, || {
            let wanted = [(versioned, intern!(py, "max_version")), (stream, intern!(py, "stream")), (dl_device, intern!(py, "dl_device")), (copy, intern!(py, "copy"))];
            let names: Vec<_> = wanted.into_iter().filter(|(on, _)| *on).map(|(_, name)| name).collect();
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

/// `obj.__dlpack__([max_version=(1, 3)][, stream=..][, dl_device=..][, copy=..])`
/// by vectorcall, with interned names and no dict.
fn call_dlpack<'py>(obj: &Bound<'py, PyAny>, versioned: bool, stream: Option<i64>, options: ImportOptions) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let stream_arg = stream.map(|s| s.into_pyobject(py)).transpose()?;
    let device_arg = options.device.map(|d| PyTuple::new(py, [d.device_type.0, d.device_id])).transpose()?;
    let copy_arg = options.copy.map(|c| pyo3::types::PyBool::new(py, c).to_owned().into_any());
    let version_arg = versioned.then(|| max_version_arg(py).as_any().clone());
    let values = [version_arg.as_ref(), stream_arg.as_ref().map(|s| s.as_any()), device_arg.as_ref().map(|d| d.as_any()), copy_arg.as_ref()];
    let mut args: [*mut ffi::PyObject; 5] = [obj.as_ptr(), core::ptr::null_mut(), core::ptr::null_mut(), core::ptr::null_mut(), core::ptr::null_mut()];
    for (slot, value) in args[1..].iter_mut().zip(values.into_iter().flatten()) {
        *slot = value.as_ptr();
    }
    let names = kwnames(py, versioned, stream_arg.is_some(), device_arg.is_some(), copy_arg.is_some());
    // SAFETY: `args` holds self followed by one value per keyword name, in the
    // names' order, all borrowed from live objects for the duration of the
    // call; nargsf counts self only.
    unsafe { crate::python_calls::vectorcall_method(py, intern!(py, "__dlpack__"), &args, 1, names.as_ptr()) }
}

/// The producer's device, from `__dlpack_device__`; `None` when it has none,
/// or it fails or says something that is no device.
fn producer_device(obj: &Bound<'_, PyAny>) -> Option<Device> {
    let device = crate::python_calls::call_method0(obj, intern!(obj.py(), "__dlpack_device__")).ok()?;
    crate::convert::parse_device_tuple(&device, "__dlpack_device__()").ok()
}

/// What to ask a producer on `producer` for, when the caller wants `options`:
/// a move dlbridge can make itself (a reach, or a copy between host and CUDA)
/// is not asked for, so a producer that cannot make it (as the spec allows)
/// still hands its tensor over; nor is a copy dlbridge makes anyway.
fn what_to_ask(producer: Option<Device>, options: ImportOptions) -> ImportOptions {
    match (options.device, producer) {
        (Some(wanted), Some(own)) if wanted != own && (reaches(own, wanted) || can_move(own, wanted)) => {
            ImportOptions { device: None, copy: options.copy.filter(|&c| !c), ..options }
        }
        _ => options,
    }
}

/// The `stream` to pass with `asked`: one valid for the device the data is
/// handed over on (`dl_device`, else the producer's): none for a device
/// without streams (where a caller's stream is a ValueError), else the
/// caller's or the device's legacy default, checked by the spec's rules. A
/// producer on an unknown device is asked with the caller's stream only.
fn stream_to_pass(producer: Option<Device>, asked: ImportOptions, requested: Option<i64>) -> PyResult<Option<i64>> {
    let Some(device) = asked.device.or(producer) else { return Ok(requested) };
    let Some(default) = device.device_type.default_stream() else {
        return match requested {
            None => Ok(None),
            Some(s) => Err(PyValueError::new_err(format!("stream={s} was given, but the tensor is asked for on {device}, which has no streams"))),
        };
    };
    let stream = requested.unwrap_or(default);
    if !device.device_type.accepts_stream(stream) {
        return Err(PyValueError::new_err(format!("stream {stream} is not valid for a tensor on {device}")));
    }
    Ok(Some(stream))
}

/// Turns a failed `__dlpack__` lookup into the TypeError that `from_dlpack` raises.
fn no_dlpack(obj: &Bound<'_, PyAny>) -> PyErr {
    PyTypeError::new_err(format!(
        "object of type {} does not support DLPack: it has no __dlpack__ method and is not a DLPack capsule",
        type_name(obj)
    ))
}

pub(crate) fn has_dlpack(obj: &Bound<'_, PyAny>) -> bool {
    let name = intern!(obj.py(), "__dlpack__");
    // The type first: a method found there is not bound to the object (no
    // allocation, and the type's attribute cache answers); then the object,
    // which may carry one of its own, as NumPy's lookup would find.
    obj.get_type().hasattr(name).unwrap_or(false) || obj.hasattr(name).unwrap_or(false)
}

/// Calls `__dlpack__` with the array-API negotiation and returns its capsule,
/// with the stream the successful call passed (`None` when it passed none:
/// the producer then orders its work before the legacy default stream).
pub(crate) fn request_capsule<'py>(obj: &Bound<'py, PyAny>, options: ImportOptions) -> PyResult<(Bound<'py, PyAny>, Option<i64>)> {
    let py = obj.py();
    let producer = producer_device(obj);
    let options = what_to_ask(producer, options);
    let stream = stream_to_pass(producer, options, options.stream.map(dlbridge::streams::Stream::value))?;
    let mut ready = stream;
    let is_type_error = |attempt: &PyResult<Bound<'py, PyAny>>| matches!(attempt, Err(err) if err.is_instance_of::<PyTypeError>(py));
    let mut attempt = call_dlpack(obj, true, stream, options);
    if (options.device.is_some() || options.copy.is_some()) && is_type_error(&attempt) {
        // A producer that knows max_version but not the newer dl_device/copy:
        // ask again without them; the caller applies them afterwards.
        attempt = call_dlpack(obj, true, stream, ImportOptions::default());
    }
    if stream.is_some() && is_type_error(&attempt) {
        // A producer that predates max_version, asked with its stream.
        attempt = call_dlpack(obj, false, stream, ImportOptions::default());
    }
    let capsule = match attempt {
        Ok(capsule) => capsule,
        Err(err) if err.is_instance_of::<PyTypeError>(py) => {
            // A producer that predates max_version: retry with no keywords.
            // Early-draft producers land here too and return their legacy
            // capsule, the only ABI of the draft whose layout is certain.
            ready = None;
            crate::python_calls::call_method0(obj, intern!(py, "__dlpack__")).map_err(|retry_err| {
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
        return Err(PyTypeError::new_err(format!("__dlpack__ returned {}, not a DLPack capsule", crate::convert::with_article(&type_name(&capsule)))));
    }
    Ok((capsule, ready))
}
