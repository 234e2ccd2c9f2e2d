//! Whom dlbridge trusts for what, and by what Python code cannot forge.
//!
//! Python code can give a class any name, copy any attribute (a capsule
//! included) onto a class of its own, answer any `__class__`, give a metaclass
//! a lying `__dict__`, rebind any module attribute and replace any
//! `sys.modules` entry. Only C code makes a static type, fills a type's real
//! `tp_mro` and `tp_dict`, has a C function's address, and reaches the
//! interpreter's state dict. Each trust rests on one of those; whatever is
//! not trusted goes through the object's own `__dlpack__`, or is refused.
//!
//! | trusted | for | because | impostor test |
//! |---|---|---|---|
//! | torch's exchange table | importing and filling torch tensors without `__dlpack__` | its address is what torch's builtin `torch._C._dlpack_exchange_api` returns, and the object's type has the static `torch._C.TensorBase` in its real MRO | `test_trust.py::test_a_class_with_torchs_capsule_*` |
//! | another producer's exchange table | the same | published by a static type that also defines (in its real dict) the `__dlpack__` its instances run, read from that dict (a metaclass answers attribute lookups), and made by the type's own library (`gc.get_referents` reaches a static type's dict) (dlbridge's own tensors are imported directly; its table takes exact `dlbridge.Tensor` objects only) | `test_trust.py::test_a_heap_type_publishing_a_table_*`, `test_trust.py::test_a_class_with_dlbridges_capsule_*`, `test_trust.py::test_a_metaclass_cannot_answer_*`, `test_trust.py::test_a_table_written_into_*` |
//! | NumPy's array struct | reading arrays in place | the exact type is a static type named `numpy.ndarray`, with room for the struct | `test_soundness.py::test_a_class_named_numpy_ndarray_*`, `test_soundness.py::test_numpy_ndarray_rebound_*` |
//! | `ml_dtypes`' scalar types | naming dtypes NumPy lacks, sizing `numpy()`'s views | `numpy.generic` subclasses with a NumPy dtype registered for them (only C code registers one: a user-defined type number whose scalar type is this one), named as the attribute that holds them, of the item size of the DLPack dtype they name, read once before any field of an array | `test_ml_dtypes.py::test_an_impostor_ml_dtypes_module_*`, `test_ml_dtypes.py::test_a_numpy_subclass_posing_*`, `test_ml_dtypes.py::test_a_module_pointing_names_*`, `test_ml_dtypes_rebound.py::test_a_rebound_ml_dtypes_*` |
//! | the package's `Tensor` table | adopting and describing package tensors | a capsule in the interpreter's state dict, of this ABI major and size | `test_trust.py::test_the_package_table_*` |
//! | the borrow registry | sharing borrows between extensions | a capsule in the interpreter's state dict, of this ABI major and size | `test_borrow_registry.py::test_one_registry_*`, `test_borrow_registry.py::test_a_registry_of_another_major_*` |
//! | a table a test asked to trust | driving the table path with a test's own classes | `_trust_table_for_tests`, kept in the interpreter's dict and read only by copies compiled with the `testing` feature (never in a wheel: `release_smoke.py` checks the installed package lacks it) | — |

use core::ffi::CStr;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyString, PyType};

/// The module `sys.modules[name]`, if imported (never imports it). Anything
/// may sit there: what it gives is checked by the caller.
pub(crate) fn imported_module<'py>(py: Python<'py>, name: &Bound<'py, PyString>) -> Option<Bound<'py, PyAny>> {
    // SAFETY: with the GIL; GetModule never imports and returns a new reference or NULL.
    let module = unsafe { Bound::from_owned_ptr_or_opt(py, ffi::PyImport_GetModule(name.as_ptr())) };
    if module.is_none() {
        let _ = PyErr::take(py);
    }
    module
}

/// Whether `ty` is a static (C-made) type: Python code makes only heap types,
/// and cannot set attributes on static ones.
///
/// # Safety
/// `ty` is a live type object.
#[inline]
pub(crate) unsafe fn is_static_type(ty: *mut ffi::PyTypeObject) -> bool {
    // SAFETY: a field of a live type object (atomic without a GIL: CPython
    // sets flags on a type at any time).
    #[cfg(Py_GIL_DISABLED)]
    let flags = unsafe { (*ty).tp_flags.load(core::sync::atomic::Ordering::Relaxed) };
    // SAFETY: as above.
    #[cfg(not(Py_GIL_DISABLED))]
    let flags = unsafe { (*ty).tp_flags };
    flags & ffi::Py_TPFLAGS_HEAPTYPE == 0
}

/// Whether `ty` is a static type named `name`. Compares bytes up to the first
/// that differs, with no strlen: this runs for every argument of a process
/// that has not passed a NumPy array yet.
///
/// # Safety
/// `ty` is a live type object.
#[inline]
pub(crate) unsafe fn is_static_type_named(ty: *mut ffi::PyTypeObject, name: &CStr) -> bool {
    // SAFETY: `tp_name` of a live type is NUL-terminated; the comparison stops
    // at its first byte that differs from `name`'s, at the latest at `name`'s NUL.
    let named = name.to_bytes_with_nul().iter().enumerate().all(|(i, &b)| unsafe { *(*ty).tp_name.add(i) } as u8 == b);
    // SAFETY: forwarded from the caller.
    named && unsafe { is_static_type(ty) }
}

/// Whether two addresses lie in one loaded object (the executable or one
/// shared library): a static type vouches only for a table its own library
/// made (Python code can reach a static type's real dict through
/// `gc.get_referents`, and write another library's table there).
pub(crate) fn in_one_loaded_object(a: *const core::ffi::c_void, b: *const core::ffi::c_void) -> bool {
    let base = |address: *const core::ffi::c_void| {
        // SAFETY: Dl_info is plain data that dladdr fills; any address may be asked about.
        let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
        // SAFETY: as above.
        (unsafe { libc::dladdr(address, &mut info) } != 0 && !info.dli_fbase.is_null()).then_some(info.dli_fbase)
    };
    matches!((base(a), base(b)), (Some(x), Some(y)) if x == y)
}

/// The class of `ty`'s real MRO whose own dict defines `name`: where CPython's
/// lookup finds it, whatever a metaclass says `__dict__` or `__mro__` is.
pub(crate) fn definer<'py>(ty: &Bound<'py, PyType>, name: &Bound<'py, PyString>) -> Option<Bound<'py, PyType>> {
    ty.mro().iter().filter_map(|class| class.cast_into::<PyType>().ok()).find(|class| {
        own_dict_item(class, name).is_some()
    })
}

/// `name` in `ty`'s own dict (not its bases'), read from the type itself.
pub(crate) fn own_dict_item<'py>(ty: &Bound<'py, PyType>, name: &Bound<'py, PyString>) -> Option<Bound<'py, PyAny>> {
    let py = ty.py();
    // SAFETY: a live type; its dict (a new reference from 3.12, where static
    // builtin types keep it elsewhere; borrowed before) is a dict or NULL.
    let dict = unsafe {
        #[cfg(Py_3_12)]
        let dict = Bound::from_owned_ptr_or_opt(py, ffi::PyType_GetDict(ty.as_type_ptr()));
        #[cfg(not(Py_3_12))]
        let dict = Bound::from_borrowed_ptr_or_opt(py, (*ty.as_type_ptr()).tp_dict);
        dict?
    };
    let mut item = core::ptr::null_mut();
    // SAFETY: a real dict; GetItemRef gives a new reference, or NULL (with an
    // error only if the key's hash failed, which a str's cannot).
    if unsafe { ffi::compat::PyDict_GetItemRef(dict.as_ptr(), name.as_ptr(), &mut item) } <= 0 {
        let _ = PyErr::take(py);
        return None;
    }
    // SAFETY: the new reference just taken.
    Some(unsafe { Bound::from_owned_ptr(py, item) })
}

/// `interpreter_dict.setdefault(key, value)`: the entry there after, which
/// `value` if no other was. The interpreter's state dict is reachable only
/// from C: an entry there was put there by C code.
pub(crate) fn publish_for_interpreter<'py>(py: Python<'py>, key: &CStr, value: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let key = PyString::new(py, key.to_str().ok()?);
    // SAFETY: the current interpreter's dict (borrowed; NULL, with no error set,
    // if it has none). SetDefault is atomic, so of two extensions publishing at
    // once one wins; it returns a borrowed reference to the entry.
    unsafe {
        let dict = ffi::PyInterpreterState_GetDict(ffi::PyInterpreterState_Get());
        if dict.is_null() {
            return None;
        }
        let entry = ffi::PyDict_SetDefault(dict, key.as_ptr(), value.as_ptr());
        if entry.is_null() {
            let _ = PyErr::take(py);
            return None;
        }
        Some(Bound::from_borrowed_ptr(py, entry))
    }
}

/// The interpreter's dict's entry `key`, if any.
pub(crate) fn interpreter_entry<'py>(py: Python<'py>, key: &CStr) -> Option<Bound<'py, PyAny>> {
    let key = PyString::new(py, key.to_str().ok()?);
    let mut entry = core::ptr::null_mut();
    // SAFETY: the current interpreter's dict (borrowed; NULL if it has none);
    // GetItemRef gives a new reference, or NULL.
    unsafe {
        let dict = ffi::PyInterpreterState_GetDict(ffi::PyInterpreterState_Get());
        if dict.is_null() || ffi::compat::PyDict_GetItemRef(dict, key.as_ptr(), &mut entry) <= 0 {
            let _ = PyErr::take(py);
            return None;
        }
        Some(Bound::from_owned_ptr(py, entry))
    }
}

/// The pointer of `entry` if it is a capsule named `name` whose table starts
/// with major `major` and a size of at least `size`; `Err` with what it is
/// otherwise.
pub(crate) fn table_of(entry: &Bound<'_, PyAny>, name: &CStr, major: u32, size: usize) -> Result<*mut core::ffi::c_void, TableMismatch> {
    // SAFETY: a name check on a live object; IsValid never raises.
    if unsafe { ffi::PyCapsule_IsValid(entry.as_ptr(), name.as_ptr()) } != 1 {
        return Err(TableMismatch::NotATable);
    }
    // SAFETY: a valid capsule of this name (checked), whose pointer is not NULL.
    let table = unsafe { ffi::PyCapsule_GetPointer(entry.as_ptr(), name.as_ptr()) };
    // SAFETY: tables published under these names live as long as the process
    // and start with their major and size, read before anything else.
    let [found_major, found_size] = unsafe { table.cast::<[u32; 2]>().read() };
    if found_major != major {
        return Err(TableMismatch::OtherMajor(found_major));
    }
    if (found_size as usize) < size {
        return Err(TableMismatch::NotATable);
    }
    Ok(table)
}

/// Why an entry is not a table this build may use.
#[derive(Clone, Copy, Debug)]
pub(crate) enum TableMismatch {
    /// Not a capsule of the name, or a table smaller than this ABI's.
    NotATable,
    /// A table of another ABI major.
    OtherMajor(u32),
}

/// Where the addresses of exchange tables that dlbridge's own tests made
/// with ctypes on classes of their own (heap types) are kept: a set in the
/// interpreter's dict, so that every copy of dlbridge-pyo3 built with the
/// `testing` feature (the package's, an example's) trusts them. Never in a wheel.
#[cfg(feature = "testing")]
const TABLES_FOR_TESTS: &CStr = c"dlbridge.tables_trusted_for_tests";

/// Trusts the table at `address` as if a static type published it (tests only).
#[cfg(feature = "testing")]
pub(crate) fn trust_table_for_tests(py: Python<'_>, address: usize) -> PyResult<()> {
    let fresh = pyo3::types::PySet::empty(py)?;
    let set = publish_for_interpreter(py, TABLES_FOR_TESTS, fresh.as_any())
        .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("this interpreter has no state dict"))?;
    set.cast_into::<pyo3::types::PySet>()?.add(address)
}

/// Whether a test made `api` and asked for it to be trusted.
#[inline]
pub(crate) fn trusted_for_tests(py: Python<'_>, api: &dlbridge::ffi::DLPackExchangeAPI) -> bool {
    #[cfg(feature = "testing")]
    return interpreter_entry(py, TABLES_FOR_TESTS)
        .and_then(|set| set.cast_into::<pyo3::types::PySet>().ok())
        .is_some_and(|set| set.contains(core::ptr::from_ref(api) as usize).unwrap_or(false));
    #[cfg(not(feature = "testing"))]
    {
        let _ = (py, api);
        false
    }
}
