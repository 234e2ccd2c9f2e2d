//! Importing through another type's exchange table, as that type's
//! `__dlpack__` would, or not at all.
//!
//! A table is used only when the class that publishes it is also the class
//! whose `__dlpack__` the object would run (a subclass that overrides
//! `__dlpack__` gets its own method), and only when Python code cannot have
//! copied it there (see `trust.rs`): torch's own table on a type with
//! `torch._C.TensorBase` in its real MRO, or a table a static type publishes. A table is handed an object its producer reads as its own
//! type, so an impostor must never reach one. The 1.2 integer form
//! (`__c_dlpack_exchange_api__`) is not read: any int could be published
//! there, and every producer that had it also has `__dlpack__`.
//!
//! A table skips the checks its producer's `__dlpack__` makes, and the hooks
//! it dispatches; `guard.rs` makes the checks, and sends a type with hooks to
//! `__dlpack__`. Any
//! failure of a table falls back to `__dlpack__`, which raises the producer's
//! own error.

use core::cell::RefCell;
use core::ffi::c_void;

use dlbridge::ffi::{DLManagedTensorVersioned, DLPackExchangeAPI, DLTensor};
use dlbridge::{Device, DeviceType, OwnedTensor};
use pyo3::prelude::*;
use pyo3::types::PyType;
use pyo3::{ffi, intern};

use super::guard::{torch_checks, Guard};
use super::{compatible, EXCHANGE_API_CAPSULE_NAME};
use crate::trust::{definer, in_one_loaded_object, is_static_type, own_dict_item, trusted_for_tests};
use crate::writability::Writability;

/// A type's exchange table and the checks to make before using it.
#[derive(Clone, Copy, Debug)]
pub struct Table {
    /// The table.
    pub api: &'static DLPackExchangeAPI,
    /// What to check first.
    pub guard: Guard,
    /// What the producer's export would say of writes to what the table's
    /// fill describes (a fill carries no flags): see `guard.rs`.
    pub fill_writability: Writability,
}

/// A type's table from its `"dlpack_exchange_api"` capsule, if the class that
/// publishes it also defines the `__dlpack__` its instances run.
fn find(ty: &Bound<'_, PyType>) -> Option<Table> {
    let py = ty.py();
    let name = intern!(py, "__dlpack_c_exchange_api__");
    let publisher = definer(ty, name)?;
    let method_owner = definer(ty, intern!(py, "__dlpack__"))?;
    if !publisher.is(&method_owner) {
        return None;
    }
    // From the publisher's own dict, never by attribute lookup: a metaclass
    // answers that (with any capsule, or by running Python code).
    let value = own_dict_item(&publisher, name)?;
    // SAFETY: a name check on a live object; IsValid never raises.
    if unsafe { ffi::PyCapsule_IsValid(value.as_ptr(), EXCHANGE_API_CAPSULE_NAME.as_ptr()) } != 1 {
        return None;
    }
    // SAFETY: validated capsule; its pointer is a process-lifetime table.
    let ptr = unsafe { ffi::PyCapsule_GetPointer(value.as_ptr(), EXCHANGE_API_CAPSULE_NAME.as_ptr()) };
    // SAFETY: as above.
    let api = unsafe { compatible(ptr.cast()) }?;
    let guard = match torch_checks(ty) {
        Some(checks) => Guard::Torch(checks),
        None => Guard::None,
    };
    // torch's own table on a real torch type; any other table (another torch
    // type's, such as ReadOnlyTensorWrapper's) only from a static type, made
    // by the type's own library. (dlbridge's own tensors never get here: they
    // are imported directly.)
    let trusted = match guard {
        Guard::Torch(checks) if checks.is_torch_table(api) => true,
        _ => {
            let (table, ty) = (core::ptr::from_ref(api).cast(), publisher.as_type_ptr().cast_const().cast());
            // SAFETY: a live type object.
            (unsafe { is_static_type(publisher.as_type_ptr()) } && in_one_loaded_object(table, ty)) || trusted_for_tests(py, api)
        }
    };
    if !trusted || !guard.dispatches_nothing(ty) {
        return None;
    }
    let fill_writability = guard.fill_writability(api);
    Some(Table { api, guard, fill_writability })
}

thread_local! {
    /// (type, version tag, table); the types are kept alive (one leaked
    /// reference each) so that a freed type's address can never be mistaken for
    /// a cached one. CPython changes a type's version tag whenever the type or a
    /// base is modified, so a `__dlpack__` assigned later is seen.
    static CACHE: RefCell<Vec<(usize, u32, Option<Table>)>> = const { RefCell::new(Vec::new()) };
}

const CACHE_CAPACITY: usize = 32;

/// The exchange table of `obj`'s type, cached per type and version tag.
pub(crate) fn lookup(obj: &Bound<'_, PyAny>) -> Option<Table> {
    // SAFETY: reading the type pointer of a live object; no reference is taken.
    let ty = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    // A live type object's version tag (0 when not assigned). Without a GIL,
    // CPython changes it with an atomic store: read it atomically.
    #[cfg(Py_GIL_DISABLED)]
    // SAFETY: as above.
    let tag = || unsafe { core::sync::atomic::AtomicU32::from_ptr(core::ptr::addr_of_mut!((*ty).tp_version_tag)).load(core::sync::atomic::Ordering::Relaxed) };
    #[cfg(not(Py_GIL_DISABLED))]
    // SAFETY: as above.
    let tag = || unsafe { (*ty).tp_version_tag };
    let key = ty as usize;
    let cached = CACHE.with_borrow(|cache| cache.iter().find(|(k, _, _)| *k == key).map(|(_, t, table)| (*t, *table)));
    if let Some((cached_tag, table)) = cached {
        if cached_tag != 0 && cached_tag == tag() {
            return table;
        }
    }
    let ty = obj.get_type();
    let table = find(&ty);
    // Attribute lookups in `find` give the type a current tag.
    let tag = tag();
    CACHE.with_borrow_mut(|cache| {
        if let Some(entry) = cache.iter_mut().find(|(k, _, _)| *k == key) {
            *entry = (key, tag, table);
        } else if cache.len() < CACHE_CAPACITY {
            // Keep the type alive for as long as the cache names it.
            core::mem::forget(ty.clone());
            cache.push((key, tag, table));
        }
    });
    table
}

/// The stream a tensor on `device` is ready on when it comes through `table`:
/// the producer's current work stream, as the header says (NULL on CUDA is the
/// legacy default, 1). `Ok(None)` for a device without streams; `Err(())` when
/// the producer cannot say (no function, or it failed), so the caller goes
/// through `__dlpack__`, which orders the producer's work itself.
fn ready_stream(obj: &Bound<'_, PyAny>, table: Table, device: Device) -> Result<Option<i64>, ()> {
    if !device.device_type.has_streams() {
        return Ok(None);
    }
    let query = table.api.current_work_stream.ok_or(())?;
    let mut stream: *mut c_void = core::ptr::null_mut();
    // SAFETY: the producer's function with a writable out pointer; the GIL is held.
    let rc = unsafe { query(device.device_type, device.device_id, &mut stream) };
    if failed(obj.py(), rc) {
        return Err(());
    }
    // A stream handle is an opaque number; DLPack hands streams over as integers.
    // One past i64::MAX is no user-space pointer: the producer cannot say.
    match stream.addr() as i64 {
        0 if device.device_type != DeviceType::ROCM => Ok(Some(1)),
        value if value < 0 => Err(()),
        value => Ok(Some(value)),
    }
}

/// Whether a table function failed: a non-zero code, or (breaking the API's
/// contract) zero with a Python exception left set. Either way the exception
/// is cleared, so that `__dlpack__` can raise the producer's own.
fn failed(py: Python<'_>, rc: core::ffi::c_int) -> bool {
    // SAFETY: with the GIL; only asks whether an exception is set.
    let pending = unsafe { !ffi::PyErr_Occurred().is_null() } && PyErr::take(py).is_some();
    rc != 0 || pending
}

/// Owning import through a producer's table, with the stream its data is
/// ready on. `Ok(None)` means "use `__dlpack__` instead": there is no usable
/// function, the table failed (its error is dropped: `__dlpack__` raises the
/// producer's own), the producer cannot name its work stream, or the tensor is
/// on ROCm, where dlbridge cannot make a stream wait.
pub(crate) fn import_owned(obj: &Bound<'_, PyAny>, table: Table) -> PyResult<Option<(OwnedTensor, Option<i64>)>> {
    let Some(export) = table.api.managed_tensor_from_py_object_no_sync else { return Ok(None) };
    let take = || {
        let mut out: *mut DLManagedTensorVersioned = core::ptr::null_mut();
        // SAFETY: the producer's function, called with an object of the type it
        // was found on and a writable out pointer; the GIL is held.
        let rc = unsafe { export(obj.as_ptr().cast(), &mut out) };
        if failed(obj.py(), rc) || out.is_null() {
            if rc == 0 && !out.is_null() {
                // SAFETY: an owning export we now own, given up: its deleter runs once.
                drop(unsafe { OwnedTensor::from_raw(out) });
            }
            return None;
        }
        // SAFETY: an owning export we now own; `from_raw` validates it and
        // deletes it on error, after which `__dlpack__` gets its chance.
        unsafe { OwnedTensor::from_raw(out) }.ok()
    };
    let Some(owned) = table.guard.take(obj, take, |owned| owned.view().dtype())? else { return Ok(None) };
    let device = owned.view().device();
    if device.device_type == DeviceType::ROCM {
        return Ok(None);
    }
    let Ok(ready) = ready_stream(obj, table, device) else { return Ok(None) };
    Ok(Some((owned, ready)))
}

/// Non-owning fill through a producer's table, for a tensor borrowed during a
/// call, with the stream its data is ready on (the producer's current work
/// stream: launch on it, or make another stream wait on it; on ROCm too, as
/// no stream is named). `Ok(None)` means "import it owned instead": no fill
/// function, a failed fill, or no current work stream.
pub(crate) fn fill_borrowed(obj: &Bound<'_, PyAny>, table: Table) -> PyResult<Option<(DLTensor, Option<i64>)>> {
    let Some(fill) = table.api.dltensor_from_py_object_no_sync else { return Ok(None) };
    let take = || {
        // SAFETY: DLTensor is plain data; the producer fills it.
        let mut out: DLTensor = unsafe { core::mem::zeroed() };
        // SAFETY: the producer's function, with an object of its type and a writable DLTensor.
        (!failed(obj.py(), unsafe { fill(obj.as_ptr().cast(), &mut out) })).then_some(out)
    };
    let Some(out) = table.guard.take(obj, take, |out| out.dtype)? else { return Ok(None) };
    let Ok(ready) = ready_stream(obj, table, out.device) else { return Ok(None) };
    Ok(Some((out, ready)))
}
