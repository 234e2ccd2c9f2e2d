//! Strong references to Python objects, and export blocks from Python's
//! allocator, that a DLPack deleter may drop from any thread, with or without
//! the GIL, even after the interpreter has finalised.

use core::alloc::Layout;
use core::ptr::NonNull;

use dlbridge::export::{export_view_in, BlockAllocator};
use dlbridge::thread_exit::parking_on_exit;
use dlbridge::{Device, ManagedAbi, TensorView};
use pyo3::ffi;
use pyo3::{Bound, PyAny, Python};

/// Runs `release` with the GIL taken (`PyGILState_Ensure` is reentrant), or not
/// at all once the interpreter is no longer initialised: the reference is then
/// leaked, the pattern NumPy's deleter uses. A daemon thread that CPython ends
/// while it takes the GIL at interpreter exit parks there (see
/// `dlbridge::thread_exit`).
pub(crate) fn with_gil_unless_finalized(release: impl FnOnce()) {
    // SAFETY: `Py_IsInitialized` may be called at any time; the GIL state calls
    // pair up around `release`.
    unsafe {
        if ffi::Py_IsInitialized() == 0 {
            return;
        }
        // Already attached (a tensor freed by Python code): nothing to take.
        // (Not PyGILState_Check: once a sub-interpreter exists, CPython turns
        // that check off and it answers 1 on every thread.)
        if crate::gil::holds_gil() {
            return release();
        }
        let gil = parking_on_exit(|| ffi::PyGILState_Ensure());
        release();
        ffi::PyGILState_Release(gil);
    }
}

/// Releases a strong reference, which may run finalizers (Python code that
/// may give the GIL up and take it back), so that a daemon thread CPython ends
/// meanwhile at interpreter exit parks instead of unwinding Rust frames.
///
/// # Safety
/// `obj` is a strong reference the caller owns; the GIL is held.
pub(crate) unsafe fn release_reference(obj: *mut ffi::PyObject) {
    // SAFETY: forwarded from the caller.
    parking_on_exit(|| unsafe { ffi::Py_DECREF(obj) })
}

/// Exports `view`, memory that `obj` keeps alive, in one block from Python's
/// allocator (`PyMem_Malloc`: pymalloc for blocks this small), as NumPy does
/// for its own exports: several times cheaper than `malloc` and `free`. The
/// deleter takes the GIL once to release `obj` and free the block; once the
/// interpreter is finalised both are leaked, as [`PyOwner`] leaks.
///
/// # Safety
/// As for [`dlbridge::export::export_view_in`], with `obj` as the owner.
pub(crate) unsafe fn export_in_python_blocks<M: ManagedAbi>(
    obj: &Bound<'_, PyAny>,
    view: &TensorView<'_>,
    device: Device,
    flags: u64,
) -> Result<NonNull<M>, dlbridge::Error> {
    let owner = HeldRef(obj.clone().into_ptr());
    // SAFETY: forwarded from the caller.
    unsafe { export_view_in(owner, view, device, flags, &PythonBlocks(obj.py())) }
}

/// A strong reference released without taking the GIL: it lives only in
/// blocks of [`PythonBlocks`], whose `release` drops it with the GIL held, or
/// dropped at once where an export under the GIL fails to allocate. Never an
/// owner of any other export (`export_view`, `export_raw`): their deleters
/// drop it on whatever thread they run.
struct HeldRef(*mut ffi::PyObject);

// SAFETY: the pointer is only decref'd, with the GIL held (see above).
unsafe impl Send for HeldRef {}

impl Drop for HeldRef {
    fn drop(&mut self) {
        // SAFETY: the GIL is held wherever a HeldRef is dropped (see the type).
        unsafe { release_reference(self.0) }
    }
}

/// Export blocks from `PyMem_Malloc`. Allocating needs the GIL, which the
/// token proves; `release` takes it. (PyO3 modules refuse sub-interpreters,
/// whose allocators are separate on 3.12+; a foreign thread that calls the
/// deleter while attached to one would free into the wrong one, as it would
/// with NumPy's exports, which free the same way.)
struct PythonBlocks<'py>(Python<'py>);

// SAFETY: PyMem_Malloc gives NULL or a block of the size asked for, aligned
// for any C type (8 bytes at least); the GIL it needs is held (the token).
// `release` drops the owner and frees with the GIL taken, or leaks both.
unsafe impl BlockAllocator for PythonBlocks<'_> {
    fn allocate(&self, layout: Layout) -> *mut u8 {
        if layout.size() == 0 || layout.align() > 8 {
            return core::ptr::null_mut();
        }
        // SAFETY: the GIL is held for `'py`.
        unsafe { ffi::PyMem_Malloc(layout.size()).cast() }
    }

    unsafe fn release(block: *mut u8, _: Layout, drop_owner: impl FnOnce()) {
        with_gil_unless_finalized(|| {
            drop_owner();
            // SAFETY: from PyMem_Malloc (the caller's contract), freed once, with the GIL.
            unsafe { ffi::PyMem_Free(block.cast()) }
        });
    }
}

/// Keeps a Python object alive for as long as a tensor exported from it lives.
///
/// Dropping it takes the GIL (`PyGILState_Ensure`, which is reentrant), and
/// leaks the reference instead when the interpreter is no longer initialised,
/// the pattern NumPy's deleter uses.
#[derive(Debug)]
pub struct PyOwner(NonNull<ffi::PyObject>);

// SAFETY: the pointer is only dereferenced (decref'd) with the GIL held.
unsafe impl Send for PyOwner {}
// SAFETY: `&PyOwner` gives no access to the object.
unsafe impl Sync for PyOwner {}

impl PyOwner {
    /// A new strong reference to `obj`.
    // Cannot fire: a `Bound` always holds a non-NULL object.
    #[allow(clippy::expect_used)]
    pub fn new(obj: &Bound<'_, PyAny>) -> Self {
        PyOwner(NonNull::new(obj.clone().into_ptr()).expect("a Bound is never NULL"))
    }

    /// The object, borrowed.
    pub fn as_ptr(&self) -> *mut ffi::PyObject {
        self.0.as_ptr()
    }
}

impl Drop for PyOwner {
    fn drop(&mut self) {
        // SAFETY: with the GIL taken, releasing our own strong reference is sound.
        with_gil_unless_finalized(|| unsafe { release_reference(self.0.as_ptr()) });
    }
}

/// A `Py_buffer` held open until dropped; released under the GIL like [`PyOwner`].
pub struct BufferOwner(Box<ffi::Py_buffer>);

// SAFETY: the buffer is only released with the GIL held.
unsafe impl Send for BufferOwner {}
// SAFETY: `&BufferOwner` gives no access to the buffer.
unsafe impl Sync for BufferOwner {}

impl BufferOwner {
    /// Takes ownership of a filled buffer view.
    pub(crate) fn new(view: Box<ffi::Py_buffer>) -> Self {
        BufferOwner(view)
    }

    /// The buffer view.
    pub fn view(&self) -> &ffi::Py_buffer {
        &self.0
    }
}

impl Drop for BufferOwner {
    fn drop(&mut self) {
        let view = core::ptr::from_mut(&mut *self.0);
        // SAFETY: with the GIL taken; the view was filled by PyObject_GetBuffer
        // and is released once.
        with_gil_unless_finalized(|| parking_on_exit(|| unsafe { ffi::PyBuffer_Release(view) }));
    }
}

/// Opens `obj`'s buffer with the request `flags` (`PyBUF_*`).
pub(crate) fn open_buffer(obj: &pyo3::Bound<'_, PyAny>, flags: core::ffi::c_int) -> pyo3::PyResult<BufferOwner> {
    // SAFETY: Py_buffer is plain data; GetBuffer fills it or fails.
    let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { core::mem::zeroed() });
    // SAFETY: `obj` is live and `view` is writable; on success the view must be
    // released once, which `BufferOwner` does.
    if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } != 0 {
        return Err(pyo3::PyErr::fetch(obj.py()));
    }
    Ok(BufferOwner::new(view))
}

/// A value whose drop keeps a Python exception in flight intact: a foreign
/// deleter may run Python code (a ctypes or pybind11 callback), and a tensor
/// object can be freed while an exception propagates; that code would then see
/// the exception set and turn it into a SystemError.
pub(crate) struct ExceptionSafe<T>(core::mem::ManuallyDrop<T>);

impl<T> ExceptionSafe<T> {
    pub(crate) fn new(value: T) -> Self {
        ExceptionSafe(core::mem::ManuallyDrop::new(value))
    }

    /// The value, to be dropped (or kept) by the caller.
    pub(crate) fn into_inner(self) -> T {
        let mut this = core::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never dropped, so the value is taken out exactly once.
        unsafe { core::mem::ManuallyDrop::take(&mut this.0) }
    }
}

impl<T> core::ops::Deref for ExceptionSafe<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> Drop for ExceptionSafe<T> {
    fn drop(&mut self) {
        // Dropped in place (a tensor's owner is large: no move), once.
        let value = &mut self.0;
        let mut dropped = false;
        with_gil_unless_finalized(|| {
            // SAFETY: with the GIL (taken by the caller of this closure); the
            // in-flight exception is saved and restored around the drop; the
            // value is dropped here, once, and never used again.
            // (PyErr_Fetch and Restore still work on 3.12+, where they are deprecated.)
            #[allow(deprecated)]
            unsafe {
                let saving = !ffi::PyErr_Occurred().is_null();
                let (mut kind, mut exc, mut traceback) = (core::ptr::null_mut(), core::ptr::null_mut(), core::ptr::null_mut());
                if saving {
                    ffi::PyErr_Fetch(&mut kind, &mut exc, &mut traceback);
                }
                core::mem::ManuallyDrop::drop(value);
                dropped = true;
                if saving {
                    ffi::PyErr_Restore(kind, exc, traceback);
                }
            }
        });
        if !dropped {
            // A finalised interpreter: no exception to keep; the value's own drop
            // knows not to touch Python.
            // SAFETY: not dropped above; never used again.
            unsafe { core::mem::ManuallyDrop::drop(&mut self.0) }
        }
    }
}
