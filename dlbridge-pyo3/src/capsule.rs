//! DLPack capsules: `dltensor` / `dltensor_versioned`, renamed `used_*` once a
//! consumer owns the tensor.
//!
//! The names themselves live in one place, [`ManagedAbi::CAPSULE_NAME`] and
//! [`ManagedAbi::USED_CAPSULE_NAME`]; they are static C strings, as the spec requires.

use core::ffi::{c_void, CStr};
use core::ptr::NonNull;

use dlbridge::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use dlbridge::{ManagedAbi, Owned};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::{ffi, Bound};

pub use crate::any_owned::AnyOwned;
use crate::errors::IntoPyResult;

/// Destructor of the capsules we produce: deletes the tensor unless a consumer
/// renamed the capsule (took ownership). Any exception already in flight is
/// saved and restored around the deleter.
// PyErr_Fetch/Restore still work on 3.12+, where they are deprecated for GetRaisedException.
#[allow(deprecated)]
unsafe extern "C" fn destructor<M: ManagedAbi>(capsule: *mut ffi::PyObject) {
    // SAFETY: CPython calls capsule destructors with the GIL held and a live
    // capsule. `PyCapsule_IsValid` never raises; GetPointer may, which is why
    // the in-flight exception is saved first.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, M::USED_CAPSULE_NAME.as_ptr()) == 1 {
            return;
        }
        let in_flight = !ffi::PyErr_Occurred().is_null();
        let (mut kind, mut value, mut traceback) = (core::ptr::null_mut(), core::ptr::null_mut(), core::ptr::null_mut());
        if in_flight {
            ffi::PyErr_Fetch(&mut kind, &mut value, &mut traceback);
        }
        let ptr = ffi::PyCapsule_GetPointer(capsule, M::CAPSULE_NAME.as_ptr()).cast::<M>();
        match NonNull::new(ptr) {
            Some(ptr) => M::delete(ptr),
            None => ffi::PyErr_WriteUnraisable(capsule),
        }
        if in_flight {
            ffi::PyErr_Restore(kind, value, traceback);
        }
    }
}

/// Wraps an owned tensor in a new capsule named [`ManagedAbi::CAPSULE_NAME`].
pub fn into_capsule<'py, M: ManagedAbi>(py: Python<'py>, tensor: Owned<M>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: a live managed tensor, given up by its owner.
    unsafe { raw_into_capsule(py, given_up(tensor)) }
}

/// A tensor's managed struct, given up by its `Owned` to the caller, who
/// must hand it on or call its deleter.
pub(crate) fn given_up<M: ManagedAbi>(owned: Owned<M>) -> NonNull<M> {
    let raw = owned.into_raw();
    // SAFETY: `into_raw` gives up a live tensor, never NULL.
    unsafe { NonNull::new_unchecked(raw) }
}

/// Wraps a managed tensor the caller owns in a new capsule, which takes it
/// over: its destructor deletes it exactly once unless a consumer renames it.
/// On failure the tensor is deleted here.
///
/// # Safety
/// `raw` is a live managed tensor that the caller owns and does not use afterwards.
pub(crate) unsafe fn raw_into_capsule<'py, M: ManagedAbi>(py: Python<'py>, raw: NonNull<M>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: per the caller.
    unsafe {
        let capsule = ffi::PyCapsule_New(raw.as_ptr().cast::<c_void>(), M::CAPSULE_NAME.as_ptr(), Some(destructor::<M>));
        if capsule.is_null() {
            // Nothing took ownership: delete it here.
            M::delete(raw);
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, capsule))
    }
}

/// The name of a capsule, if it has a readable one.
fn capsule_name(capsule: &Bound<'_, PyAny>) -> Option<String> {
    // SAFETY: `capsule` is a live capsule (checked by the caller); the name, if
    // any, is a NUL-terminated string that lives as long as the capsule.
    unsafe {
        let name = ffi::PyCapsule_GetName(capsule.as_ptr());
        if name.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        Some(CStr::from_ptr(name).to_string_lossy().into_owned())
    }
}

/// Whether `obj` is a PyCapsule.
pub fn is_capsule(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: a type check on a live object.
    unsafe { ffi::PyCapsule_CheckExact(obj.as_ptr()) == 1 }
}

fn consume_as<M: ManagedAbi>(capsule: &Bound<'_, PyAny>) -> PyResult<Owned<M>> {
    // Without a GIL, two threads may consume one capsule at once: its name is
    // read and changed in the capsule's critical section, so one of them gets
    // the tensor and the other an error (a no-op with a GIL, which does this).
    pyo3::sync::critical_section::with_critical_section(capsule, || consume_now(capsule))
}

fn consume_now<M: ManagedAbi>(capsule: &Bound<'_, PyAny>) -> PyResult<Owned<M>> {
    // SAFETY: GetPointer checks the name again (a capsule consumed meanwhile
    // fails it), so its pointer is an owned managed tensor that nobody has
    // consumed yet. It is validated without taking ownership; only then is the
    // capsule renamed, so a failed import leaves the producer's destructor in charge.
    unsafe {
        let ptr = ffi::PyCapsule_GetPointer(capsule.as_ptr(), M::CAPSULE_NAME.as_ptr()).cast::<M>();
        if ptr.is_null() {
            return Err(PyErr::fetch(capsule.py()));
        }
        let tensor = Owned::<M>::try_from_raw(ptr).map_err(|(err, _)| err).py()?;
        if ffi::PyCapsule_SetName(capsule.as_ptr(), M::USED_CAPSULE_NAME.as_ptr()) != 0 {
            let _ = tensor.into_raw(); // still the capsule's
            return Err(PyErr::fetch(capsule.py()));
        }
        Ok(tensor)
    }
}

/// Takes ownership of the tensor in a `dltensor` or `dltensor_versioned`
/// capsule, renaming it to `used_*` once the import has fully succeeded.
///
/// A used capsule, or one with another name, raises ValueError; a capsule whose
/// tensor is malformed raises BufferError and stays unused, so its producer
/// frees it.
pub fn consume_capsule(capsule: &Bound<'_, PyAny>) -> PyResult<AnyOwned> {
    if !is_capsule(capsule) {
        return Err(PyTypeError::new_err(format!(
            "expected a DLPack capsule, got {}",
            crate::convert::type_name(capsule)
        )));
    }
    // SAFETY: `PyCapsule_IsValid` only compares names and never raises.
    let valid = |name: &CStr| unsafe { ffi::PyCapsule_IsValid(capsule.as_ptr(), name.as_ptr()) == 1 };
    // The producer's memory stays reachable through its own objects.
    let aliased = |mut owned: AnyOwned| {
        owned.mark_aliased();
        owned
    };
    if valid(DLManagedTensorVersioned::CAPSULE_NAME) {
        return consume_as::<DLManagedTensorVersioned>(capsule).map(AnyOwned::Versioned).map(aliased);
    }
    if valid(DLManagedTensor::CAPSULE_NAME) {
        return consume_as::<DLManagedTensor>(capsule).map(AnyOwned::Legacy).map(aliased);
    }
    let name = capsule_name(capsule);
    let used = [DLManagedTensorVersioned::USED_CAPSULE_NAME, DLManagedTensor::USED_CAPSULE_NAME]
        .iter()
        .any(|used| name.as_deref() == used.to_str().ok());
    if used {
        Err(PyValueError::new_err(format!(
            "DLPack capsule {:?} was already consumed; a capsule can be imported only once",
            name.unwrap_or_default()
        )))
    } else {
        Err(PyValueError::new_err(format!(
            "capsule named {:?} is not a DLPack capsule (expected \"dltensor\" or \"dltensor_versioned\")",
            name.unwrap_or_default()
        )))
    }
}
