//! Borrows of tensor memory, tracked by byte range in one registry per process
//! (shared by every extension that links this crate), as rust-numpy's `borrow`
//! module does for NumPy arrays.
//!
//! Every Rust reference to memory that Python objects can reach is made under
//! a borrow: [`PyTensor`](crate::PyTensor) and [`ReadGuard`] hold a shared one,
//! [`PyTensorMut`](crate::PyTensorMut) an exclusive one. Any number of shared
//! borrows may overlap; an exclusive borrow needs its bytes to itself. So
//! `f(a, a)` with two writable arguments, or a writable one and a reader of
//! overlapping memory (in this call, another extension, or another thread),
//! gets a BufferError instead of two aliasing Rust references. Ranges are
//! conservative: interleaved views whose elements never meet but whose byte
//! ranges overlap conflict too. Python code that writes the same memory while
//! an extension holds a borrow (NumPy from another thread, a callback) is
//! outside what Rust borrows can see.

mod registry;
mod table;

use core::ffi::c_int;
use core::marker::PhantomData;
use core::sync::atomic::{AtomicU64, Ordering};

use dlbridge::{Device, TensorView};
use pyo3::exceptions::{PyBufferError, PyMemoryError};
use pyo3::prelude::*;

use registry::{api, Conflict};

/// Finds or publishes the interpreter's registry now, so that extracting an
/// argument runs no Python code once a producer has handed over pointers;
/// whether it is there to use.
pub(crate) fn prepare() -> bool {
    api().is_ok()
}

/// A live borrow in the registry; released when dropped. It holds a
/// `Python<'py>` marker, which is not `Send`, so it is dropped on the thread
/// that took it, attached (with a GIL, that is the registry's lock): it
/// cannot move to another thread, nor into `Python::detach`, whose closure
/// must be `Send`; and `'py` ends before the thread detaches for good.
#[derive(Debug)]
pub(crate) struct Borrow<'py> {
    id: u64,
    _gil: PhantomData<Python<'py>>,
}

impl Drop for Borrow<'_> {
    fn drop(&mut self) {
        if self.id != 0 {
            // An id was given out, so the registry is known.
            if let Ok(api) = api() {
                // SAFETY: the registry's own function, with an id it gave out;
                // the thread is attached (the token's lifetime has not ended).
                unsafe { (api.release)(self.id) }
            }
        }
    }
}

/// The address space a view's bytes live in, as one number: all CPU-reachable
/// memory is one space; each device's memory is another.
#[inline(always)]
fn space_of(view: &TensorView<'_>) -> u64 {
    let device = if view.device().is_cpu_accessible() { Device::CPU } else { view.device() };
    (u64::from(device.device_type.0 as u32) << 32) | u64::from(device.device_id as u32)
}

/// Registers a borrow of `view`'s bytes, refused with BufferError if it
/// conflicts with a live one: a shared borrow conflicts with an exclusive one,
/// an exclusive with any. `what` names the object, for the message.
#[inline(always)] // the caller's view may live in registers (see `args::in_place`)
pub(crate) fn acquire<'py>(py: Python<'py>, view: &TensorView<'_>, exclusive: bool, what: impl FnOnce() -> String) -> PyResult<Borrow<'py>> {
    acquire_bytes(py, space_of(view), view.byte_range(), exclusive, what)
}

/// [`acquire`] of bytes `bytes` of address space `space`.
fn acquire_bytes<'py>(_py: Python<'py>, space: u64, bytes: core::ops::Range<usize>, exclusive: bool, what: impl FnOnce() -> String) -> PyResult<Borrow<'py>> {
    if bytes.is_empty() {
        return Ok(Borrow { id: 0, _gil: PhantomData });
    }
    let api = api().map_err(|unshared| PyBufferError::new_err(unshared.message()))?;
    let mut conflict = Conflict::default();
    // SAFETY: the registry's own function, with a writable out struct of the
    // size passed, from an attached thread (`py`; with a GIL, it is held).
    let id = unsafe { (api.acquire)(space, bytes.start, bytes.end, c_int::from(exclusive), &mut conflict, core::mem::size_of::<Conflict>()) };
    if id != 0 {
        return Ok(Borrow { id, _gil: PhantomData });
    }
    // A conflict is never empty: an empty one means there was no memory to record the borrow.
    if conflict.end == 0 {
        return Err(PyMemoryError::new_err("no memory to record a borrow of this tensor"));
    }
    let (mine, theirs) = match (exclusive, conflict.exclusive) {
        (true, true) => ("writable", "writable"),
        (true, false) => ("writable", "read"),
        _ => ("read", "writable"),
    };
    let overlap = bytes.end.min(conflict.end).saturating_sub(bytes.start.max(conflict.start));
    Err(PyBufferError::new_err(format!(
        "cannot borrow this {} as {mine}: {overlap} of its bytes are already borrowed as {theirs} \
         (by another argument of this call, or by code running elsewhere), and Rust may not hold a \
         reference to memory while it is written; pass a copy (e.g. x.copy()) if the two should be independent",
        what()
    )))
}

/// A shared borrow held by a Python object for as long as it lives: by a
/// tensor over another tensor's bytes (`Tensor._bytes()`, which pickling's
/// out-of-band buffers, shared memory and transports read after the call that
/// made it). Released with the GIL taken when dropped (a tensor may be
/// dropped anywhere), or by [`end`](Self::end) once nothing reads the bytes
/// through it any more.
#[derive(Debug, Default)]
pub(crate) struct HeldRead {
    /// The registry's id; 0 once ended, or for none.
    id: AtomicU64,
}

impl HeldRead {
    /// A shared borrow of `view`'s bytes (BufferError while a writer holds any of them).
    pub(crate) fn take(py: Python<'_>, view: &TensorView<'_>, what: impl FnOnce() -> String) -> PyResult<Self> {
        let borrow = core::mem::ManuallyDrop::new(acquire(py, view, false, what)?);
        Ok(HeldRead { id: AtomicU64::new(borrow.id) })
    }

    /// A borrow of this registry that `id` names (0: none), taken over.
    pub(crate) fn from_id(id: u64) -> Self {
        HeldRead { id: AtomicU64::new(id) }
    }

    /// The borrow's id, given up to the caller (who takes it over).
    pub(crate) fn into_id(self) -> u64 {
        core::mem::ManuallyDrop::new(self).id.swap(0, Ordering::AcqRel)
    }

    /// Ends the borrow now (the bytes are read through another borrow from here on).
    pub(crate) fn end(&self, py: Python<'_>) {
        drop(Borrow { id: self.id.swap(0, Ordering::AcqRel), _gil: PhantomData::<Python<'_>> });
        let _ = py;
    }
}

impl Drop for HeldRead {
    fn drop(&mut self) {
        let id = *self.id.get_mut();
        if id != 0 {
            // The registry's lock is taken with the GIL (or a mutex), wherever this is dropped.
            crate::owner::with_gil_unless_finalized(|| drop(Borrow { id, _gil: PhantomData::<Python<'_>> }));
        }
    }
}

/// A shared borrow of a tensor's bytes, and a view to read them through:
/// while it lives, no [`PyTensorMut`](crate::PyTensorMut) of overlapping
/// memory can be taken in any extension of the process. It is taken and
/// ended with the GIL held (its lifetime is the `Python` token's), as
/// rust-numpy's `PyReadonlyArray` is; its slices may be read with the GIL
/// released (`py.detach(|| ...)`).
///
/// ```no_run
/// use dlbridge_pyo3::{from_dlpack, ImportOptions};
/// use pyo3::prelude::*;
///
/// #[pyfunction]
/// fn first(x: &Bound<'_, PyAny>) -> PyResult<f32> {
///     let owned = from_dlpack(x, ImportOptions::default())?; // may be reached through x: aliased
///     let read = owned.read(x.py())?;                       // so reads take a shared borrow
///     let values: &[f32] = read.view().try_as_slice().map_err(dlbridge_pyo3::to_py_err)?;
///     Ok(values[0])
/// }
/// ```
///
/// The guard stays on the thread that holds the GIL: it cannot be sent
/// elsewhere, where it would be dropped without the registry's lock (its
/// view can: `let view = guard.view();` crosses threads).
///
/// ```compile_fail,E0277
/// use dlbridge_pyo3::AnyOwned;
/// use pyo3::Python;
///
/// fn send_away(owned: &AnyOwned) {
///     Python::attach(|py| {
///         let guard = owned.read(py).unwrap();
///         std::thread::scope(|s| {
///             s.spawn(move || drop(guard)); // a ReadGuard is not Send
///         });
///     });
/// }
/// ```
#[derive(Debug)]
pub struct ReadGuard<'a> {
    view: TensorView<'a>,
    _borrow: Borrow<'a>,
}

impl<'a> ReadGuard<'a> {
    /// Takes a shared borrow of `view`'s bytes.
    ///
    /// # Safety
    /// Nothing may write the bytes except under an exclusive borrow of this
    /// registry (`view` is the view of memory Python objects may reach).
    pub(crate) unsafe fn new(py: Python<'a>, view: &'a TensorView<'_>) -> PyResult<Self> {
        let borrow = acquire(py, view, false, || "tensor".to_owned())?;
        // SAFETY: the shared borrow just taken excludes every writer the
        // registry knows of, which by the caller's contract is every writer.
        let view = unsafe { view.assume_unaliased() };
        Ok(ReadGuard { view, _borrow: borrow })
    }

    /// The view, with typed reads (`as_slice`, `try_as_array`, copies) that end
    /// when the guard is dropped.
    pub fn view(&self) -> &TensorView<'_> {
        &self.view
    }
}

/// How many borrows are live in the process (for tests).
#[cfg(feature = "testing")]
pub(crate) fn live_count(_py: Python<'_>) -> usize {
    // SAFETY: the registry's own function, from an attached thread.
    api().map_or(0, |api| unsafe { (api.live)() })
}
