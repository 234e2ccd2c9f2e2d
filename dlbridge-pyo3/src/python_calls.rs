//! Ways between Rust frames and Python code that may run for a while: a
//! producer's methods and properties, a caller's `__index__` or `__bool__`,
//! the package's helpers written in Python.
//!
//! Python code may give the GIL up (a blocking call, or the interpreter's
//! regular hand-over between threads) and take it back; a daemon thread that
//! takes it back while the interpreter exits is ended by CPython 3.13 and
//! older with `pthread_exit`, which must not unwind this crate's frames or
//! PyO3's. Any allocation may run Python code too (a collection's
//! finalizers). So every function Python calls here registers its thread
//! first ([`entered`]; `dlbridge::thread_exit`), before any argument of the
//! caller's is converted ([`Scalar`] for the ones PyO3 converts), and such a
//! thread parks where it was ended instead: `scripts/house.py` checks that
//! every `#[pyfunction]` and `#[pymethods]` function begins so. The C entry
//! points (`errors::for_c_caller`) and the calls below register too.

use pyo3::prelude::*;
use pyo3::ffi;
use pyo3::types::PyString;

/// Called first by every function and method Python calls (any of them may
/// run Python code: an allocation may start a collection): registers the
/// thread (see the module).
#[inline]
pub(crate) fn entered() {
    dlbridge::thread_exit::park_this_thread_if_ended();
}

/// A bool or int argument that PyO3 converts before the function's body runs,
/// with the caller's Python code (`__index__`, `__bool__`): the thread is
/// registered before the conversion.
#[derive(Clone, Copy)]
pub(crate) struct Scalar<T>(pub T);

impl<'a, 'py, T: FromPyObject<'a, 'py, Error = PyErr>> FromPyObject<'a, 'py> for Scalar<T> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        entered();
        T::extract(obj).map(Scalar)
    }
}

/// `callable(arg)`.
pub(crate) fn call1<'py>(callable: &Bound<'py, PyAny>, arg: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    entered();
    callable.call1((arg,))
}

/// `obj.name()`.
pub(crate) fn call_method0<'py>(obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
    entered();
    obj.call_method0(name)
}

/// `obj.name`, which a property may compute in Python.
pub(crate) fn getattr<'py>(obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
    entered();
    obj.getattr(name)
}

/// `import name`, which runs the module's code the first time.
pub(crate) fn import<'py>(py: Python<'py>, name: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyAny>> {
    entered();
    Ok(PyModule::import(py, name)?.into_any())
}

/// A vectorcall of method `name` with `args` (self first) and `kwnames`, as
/// `PyObject_VectorcallMethod`.
///
/// # Safety
/// As `PyObject_VectorcallMethod`: `args` holds `nargsf` positional values,
/// self first, followed by one value per name in `kwnames` (a tuple or NULL),
/// all live for the call.
pub(crate) unsafe fn vectorcall_method<'py>(
    py: Python<'py>,
    name: &Bound<'py, PyString>,
    args: &[*mut ffi::PyObject],
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
) -> PyResult<Bound<'py, PyAny>> {
    entered();
    // SAFETY: forwarded from the caller; a new reference or NULL with an error set.
    unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyObject_VectorcallMethod(name.as_ptr(), args.as_ptr(), nargsf, kwnames)) }
}
