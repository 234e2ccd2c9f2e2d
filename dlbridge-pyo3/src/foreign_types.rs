//! Other libraries' types and modules, found without importing anything and
//! known by what Python code cannot forge: a class may take any name and an
//! attribute may be rebound, but only C code makes a static type.

use core::ffi::CStr;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyString;

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

/// Whether `ty` is a static (C-made) type named `name`. Compares bytes up to
/// the first that differs, with no strlen: this runs for every argument of
/// a process that has not passed a NumPy array yet.
///
/// # Safety
/// `ty` is a live type object.
#[inline]
pub(crate) unsafe fn is_static_type_named(ty: *mut ffi::PyTypeObject, name: &CStr) -> bool {
    // SAFETY: `tp_name` of a live type is NUL-terminated; the comparison stops
    // at its first byte that differs from `name`'s, at the latest at `name`'s NUL.
    let named = name.to_bytes_with_nul().iter().enumerate().all(|(i, &b)| unsafe { *(*ty).tp_name.add(i) } as u8 == b);
    // SAFETY: a field of a live type object.
    named && unsafe { (*ty).tp_flags } & ffi::Py_TPFLAGS_HEAPTYPE == 0
}
