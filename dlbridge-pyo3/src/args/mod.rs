//! Argument types for `#[pyfunction]`s that take any framework's tensor:
//! [`PyTensor`] to read, [`PyTensorMut`] to write, as rust-numpy separates
//! `PyReadonlyArray` and `PyReadwriteArray`. Both hold a [borrow](crate::borrows)
//! of the tensor's bytes for as long as they live.
//!
//! Both are typed when asked: `PyTensor<'py, f32, Ix2, Cpu, CContiguous>`
//! takes only a float32 2-d C-contiguous CPU tensor (a TypeError at
//! extraction names what was expected and what came), and then gives its
//! `ndarray` view or slice with no further check (`typed.rs`). The defaults
//! ([`AnyDtype`], [`AnyRank`], [`AnyDevice`], [`AnyLayout`]) take anything.
//!
//! On CUDA, each knows the stream its data is ready on ([`PyTensor::ready_stream`]):
//! launch on it, or extract with `extract_on_stream(obj, your_stream)` to have
//! your stream wait for the producer's work first (an event, no host sync).
//! CUDA managed memory, which `view()` lets host code read, is waited for by
//! the host at extraction.

mod in_place;
mod kinds;
mod refusals;
mod typed;

use core::marker::PhantomData;
use core::sync::atomic::{AtomicBool, Ordering};

use dlbridge::streams::Stream;
use dlbridge::{DeviceType, TensorView, TensorViewMut};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::Borrowed;

use in_place::{in_place, InPlace};
use refusals::{check_kind, element_error, write_refusal};
pub use kinds::{AnyDevice, AnyDtype, AnyLayout, AnyRank, CContiguous, Cpu, Cuda, DeviceKind, Dtype, FContiguous, LayoutKind, Rank};

use crate::borrows::{acquire, Borrow};
use crate::any_owned::AnyOwned;
use crate::convert::type_name;
use crate::handoff::{settle, wait_for_argument};
use crate::import::{from_dlpack, import_for_extension, ImportOptions};
use crate::writability::Writability;

/// A read-only argument that accepts any producer's tensor: DLPack objects and
/// capsules, buffer-protocol exporters, and both array interfaces; with type
/// parameters, only tensors of that element type, rank, device and layout
/// ([`Dtype`], [`Rank`], [`DeviceKind`], [`LayoutKind`]).
///
/// For types with the DLPack C exchange API (torch, dlbridge), the tensor is
/// borrowed through the non-owning `dltensor_from_py_object_no_sync`: no
/// allocation, no capsule, valid while the call runs.
///
/// ```no_run
/// use dlbridge_pyo3::{Cpu, CContiguous, PyTensor};
/// use pyo3::prelude::*;
///
/// // Any float64 tensor: a TypeError names what came instead.
/// #[pyfunction]
/// fn total(x: PyTensor<'_, f64, dlbridge_pyo3::AnyRank, Cpu, CContiguous>) -> f64 {
///     x.as_slice().iter().sum()
/// }
/// ```
pub struct PyTensor<'py, T: Dtype = AnyDtype, D: Rank = AnyRank, Dev: DeviceKind = AnyDevice, L: LayoutKind = AnyLayout> {
    /// Dropped first: a producer's deleter, run when `owned` drops, may borrow
    /// the same memory again.
    _borrow: Borrow<'py>,
    /// Readable under `_borrow`. Its `'static` is private: the data lives as
    /// long as `owned` (or `source`, for a borrowed fill), and the view is only
    /// handed out reborrowed from `&self`.
    view: TensorView<'static>,
    /// The owning import; `None` for memory read in place, which `source`
    /// keeps alive. Boxed: the argument is moved on every call, the import
    /// made only off the fast paths.
    owned: Option<Box<AnyOwned>>,
    source: Bound<'py, PyAny>,
    ready: Option<i64>,
    _kind: Kind<T, D, Dev, L>,
}

/// What a typed argument's parameters asked for, carried in its type only.
type Kind<T, D, Dev, L> = PhantomData<fn() -> (T, D, Dev, L)>;

/// `owned`'s view with typed reads allowed, for as long as `owned` lives.
///
/// # Safety
/// The caller holds a registry borrow of the bytes for as long as it uses the
/// result, and keeps `owned` alive (not necessarily in place: the data is
/// on the heap) at least as long.
unsafe fn view_under_borrow(owned: &AnyOwned) -> TensorView<'static> {
    // SAFETY: forwarded from the caller; a view owns its shape and strides, so
    // only the data, which `owned` keeps alive and never moves, is borrowed.
    unsafe { core::mem::transmute::<TensorView<'_>, TensorView<'static>>(owned.view_unchecked()) }
}

impl<'py, T: Dtype, D: Rank, Dev: DeviceKind, L: LayoutKind> PyTensor<'py, T, D, Dev, L> {
    /// The validated view, readable (slices, arrays) while the argument lives.
    pub fn view(&self) -> &TensorView<'_> {
        &self.view
    }

    /// The Python object the tensor came from.
    pub fn source(&self) -> &Bound<'py, PyAny> {
        &self.source
    }

    /// For device memory, the stream the data is ready on, where to launch work
    /// on it, valid while the call runs: the one passed to
    /// [`extract_on_stream`](Self::extract_on_stream) (`None` if nothing was
    /// pending); else the producer's current work stream (exchange API), or
    /// the legacy default stream, 1 on CUDA (`__dlpack__`, and a dlbridge
    /// `Tensor`, even an idle one, whose later exports then wait for work
    /// queued there). `None` on the CPU, and after a stream of -1.
    pub fn ready_stream(&self) -> Option<i64> {
        self.ready
    }

    /// Extracts `obj` with its data ready on `stream` (a default stream, a
    /// `CUstream` handle vouched for with [`Stream::from_raw`], or
    /// [`Stream::NO_SYNC`] for no ordering): the stream is made to wait for the
    /// producer's pending work, on the GPU. ValueError for a stream the device
    /// does not accept, any stream on the CPU, and `NO_SYNC` on CUDA managed
    /// memory (which the host may read, and must then wait for).
    ///
    /// ```no_run
    /// use dlbridge_pyo3::dlbridge::streams::Stream;
    /// use dlbridge_pyo3::PyTensor;
    /// use pyo3::prelude::*;
    ///
    /// #[pyfunction]
    /// fn launch(x: &Bound<'_, PyAny>, handle: i64) -> PyResult<()> {
    ///     // SAFETY: the caller passes a live CUstream of x's device (the
    ///     // protocols hand streams over as raw integers).
    ///     let stream = unsafe { Stream::from_raw(handle) };
    ///     let x = <PyTensor>::extract_on_stream(x, stream)?;
    ///     let _data = x.view().as_ptr(); // queue kernels on `handle` here
    ///     Ok(())
    /// }
    /// ```
    pub fn extract_on_stream(obj: &Bound<'py, PyAny>, stream: Stream) -> PyResult<Self> {
        Self::extract_with(obj, Some(stream))
    }

    /// An owned tensor, for keeping beyond the call (a borrowed one is imported
    /// through DLPack first).
    pub fn into_owned(self) -> PyResult<AnyOwned> {
        match self.owned {
            Some(owned) => Ok(*owned),
            None => from_dlpack(&self.source, ImportOptions::default()),
        }
    }

    fn extract_with(obj: &Bound<'py, PyAny>, stream: Option<Stream>) -> PyResult<Self> {
        prepare(obj.py());
        let source = obj.clone();
        let requested = stream.map(Stream::value);
        // SAFETY: the view reads the source's memory, which `source` keeps
        // alive for as long as this PyTensor; the view never outlives it.
        if let Some(InPlace { view, ready, .. }) = unsafe { in_place(&source, requested, false) }? {
            // On ROCm only `__dlpack__` can order the producer's work before a stream.
            let orderable = requested.is_none() || view.device().device_type != DeviceType::ROCM;
            if orderable {
                // Unless asked, the data stays on the producer's stream, where the
                // header says a borrower launches its kernels.
                let ready = if requested.is_some() { settle(view.device(), ready, requested)? } else { ready };
                wait_for_argument(view.device(), ready, requested)?;
                check_kind::<T, D, Dev, L>(&view, &source)?;
                let borrow = acquire(source.py(), &view, false, || type_name(&source))?;
                T::check_elements(&view).map_err(|err| element_error::<T, D, Dev, L>(&view, &source, err))?;
                return Ok(PyTensor { view, owned: None, source, ready, _borrow: borrow, _kind: PhantomData });
            }
        }
        let (owned, ready) = import_for_extension(&source, stream)?;
        check_kind::<T, D, Dev, L>(owned.view(), &source)?;
        wait_for_argument(owned.view().device(), ready, requested)?;
        let borrow = acquire(source.py(), owned.view(), false, || type_name(&source))?;
        // SAFETY: the shared borrow just taken lives as long as the PyTensor,
        // and so does `owned`, which keeps the data alive.
        let view = unsafe { view_under_borrow(&owned) };
        T::check_elements(&view).map_err(|err| element_error::<T, D, Dev, L>(&view, &source, err))?;
        Ok(PyTensor { view, owned: Some(Box::new(owned)), source, ready, _borrow: borrow, _kind: PhantomData })
    }
}

impl<'a, 'py, T: Dtype, D: Rank, Dev: DeviceKind, L: LayoutKind> FromPyObject<'a, 'py> for PyTensor<'py, T, D, Dev, L> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Self::extract_with(&obj.to_owned(), None)
    }
}

/// A writable argument: the caller's own memory (a NumPy array, a torch
/// tensor, a bytearray), written in place; typed as [`PyTensor`] is.
///
/// Refused with BufferError, saying why, unless the producer declared the
/// memory writable: READ_ONLY set, a read-only buffer, an array interface with
/// `readonly=True`, a legacy capsule (whose writability is unknown), or
/// elements that overlap (broadcasts) are all refused, and so is memory that
/// another argument of the same call already borrows. A torch tensor is
/// written as torch's own export would allow (writable, even over a read-only
/// NumPy array's memory, as torch itself treats it).
///
/// ```no_run
/// use dlbridge_pyo3::{AnyRank, CContiguous, Cpu, PyTensorMut};
/// use pyo3::prelude::*;
///
/// #[pyfunction]
/// fn double(mut x: PyTensorMut<'_, f32, AnyRank, Cpu, CContiguous>) {
///     for v in x.as_slice_mut() {
///         *v *= 2.0;
///     }
/// }
/// ```
pub struct PyTensorMut<'py, T: Dtype = AnyDtype, D: Rank = AnyRank, Dev: DeviceKind = AnyDevice, L: LayoutKind = AnyLayout> {
    /// Dropped first, as in [`PyTensor`].
    _borrow: Borrow<'py>,
    /// For writes, and reads between them; `'static` is private, as in
    /// [`PyTensor`]: only reborrows of it are handed out.
    view: TensorViewMut<'static>,
    /// Keeps the data alive; `None` for memory written in place, which
    /// `source` keeps alive.
    _owned: Option<Box<AnyOwned>>,
    source: Bound<'py, PyAny>,
    ready: Option<i64>,
    _kind: Kind<T, D, Dev, L>,
}

impl<'py, T: Dtype, D: Rank, Dev: DeviceKind, L: LayoutKind> PyTensorMut<'py, T, D, Dev, L> {
    /// A read-only view, for shape, strides and reads: its slices end before
    /// the next [`view_mut`](Self::view_mut).
    pub fn view(&self) -> &TensorView<'_> {
        self.view.view()
    }

    /// The writable view; writes are seen in the caller's own object. (Python
    /// code the extension itself runs meanwhile is outside what Rust can see;
    /// see `borrows`.)
    pub fn view_mut(&mut self) -> PyResult<TensorViewMut<'_>> {
        Ok(self.writable())
    }

    /// The writable view, infallibly, reborrowed from `&mut self`.
    fn writable(&mut self) -> TensorViewMut<'_> {
        self.view.reborrow()
    }

    /// The writable view in place, for typed writes that reborrow it; never
    /// handed out (a caller could swap a `'static` view out of it).
    fn writable_in_place(&mut self) -> &mut TensorViewMut<'static> {
        &mut self.view
    }

    /// The Python object the tensor came from.
    pub fn source(&self) -> &Bound<'py, PyAny> {
        &self.source
    }

    /// The stream the data is ready on, as [`PyTensor::ready_stream`].
    pub fn ready_stream(&self) -> Option<i64> {
        self.ready
    }

    /// Extracts `obj` with its data ready on `stream`, as [`PyTensor::extract_on_stream`].
    pub fn extract_on_stream(obj: &Bound<'py, PyAny>, stream: Stream) -> PyResult<Self> {
        Self::extract_with(obj, Some(stream))
    }

    fn extract_with(obj: &Bound<'py, PyAny>, stream: Option<Stream>) -> PyResult<Self> {
        prepare(obj.py());
        let source = obj.clone();
        // A NumPy array, a dlbridge Tensor or a torch tensor is written in
        // place: no stream to settle unless asked for one.
        if stream.is_none() {
            // SAFETY: the view reads the source's memory, which `source` keeps
            // alive for as long as this PyTensorMut; the view never outlives it.
            if let Some(InPlace { view, ready, writability }) = unsafe { in_place(&source, None, true) }? {
                check_kind::<T, D, Dev, L>(&view, &source)?;
                wait_for_argument(view.device(), ready, None)?;
                // In place, nothing was copied: a Tensor's IS_COPIED says how it was
                // made (writes reach all who hold it), and torch.Tensor's table
                // sets it only when asked to copy (exchange/guard.rs).
                let refusal = write_refusal(writability, false, &view);
                return Self::writable_under_borrow(view, None, source, ready, refusal);
            }
        }
        let (owned, ready) = import_for_extension(&source, stream)?;
        check_kind::<T, D, Dev, L>(owned.view(), &source)?;
        wait_for_argument(owned.view().device(), ready, stream.map(Stream::value))?;
        let refusal = write_refusal(Writability::of(&owned), owned.is_copied(), owned.view());
        // SAFETY: the exclusive borrow taken next lives as long as the
        // PyTensorMut, and so does `owned`, which keeps the data alive.
        let view = unsafe { view_under_borrow(&owned) };
        Self::writable_under_borrow(view, Some(Box::new(owned)), source, ready, refusal)
    }

    /// Refuses with `refusal`, or takes the exclusive borrow of `view`'s bytes
    /// that makes it writable through this argument.
    #[inline(always)] // as `in_place` is, and for the same reason
    fn writable_under_borrow(
        view: TensorView<'static>,
        owned: Option<Box<AnyOwned>>,
        source: Bound<'py, PyAny>,
        ready: Option<i64>,
        refusal: Option<&'static str>,
    ) -> PyResult<Self> {
        if let Some(why) = refusal {
            return Err(PyBufferError::new_err(format!("cannot borrow this {} as writable: {why}", type_name(&source))));
        }
        // Reads through `view` and writes through `view_mut` need `&self` and
        // `&mut self`, so never overlap; the borrow excludes every other path.
        let borrow = acquire(source.py(), &view, true, || type_name(&source))?;
        T::check_elements(&view).map_err(|err| element_error::<T, D, Dev, L>(&view, &source, err))?;
        // SAFETY: `self` holds an exclusive borrow of these bytes in the registry,
        // and hands out writes only reborrowed from `&mut self`; writability and
        // non-overlap were checked by `write_refusal`.
        let view = unsafe { TensorViewMut::new_unchecked(view) };
        Ok(PyTensorMut { view, _owned: owned, source, ready, _borrow: borrow, _kind: PhantomData })
    }
}

/// Registers the thread (extraction runs the caller's Python code), and runs
/// now whatever Python code extraction could need (finding the borrow registry
/// and the package's table), before any argument's pointers are taken.
#[inline(always)]
fn prepare(py: Python<'_>) {
    crate::python_calls::entered();
    // Once all of it is done, one load per argument.
    static PREPARED: AtomicBool = AtomicBool::new(false);
    if !PREPARED.load(Ordering::Relaxed) {
        prepare_once(py, &PREPARED);
    }
}

#[cold]
fn prepare_once(py: Python<'_>, prepared: &AtomicBool) {
    let registry = crate::borrows::prepare();
    crate::tensor::prepare_package_api(py);
    crate::gil::release_in_driver_calls();
    // A registry not found yet (refused) is asked again by the next argument.
    prepared.store(registry, Ordering::Relaxed);
}

impl<'a, 'py, T: Dtype, D: Rank, Dev: DeviceKind, L: LayoutKind> FromPyObject<'a, 'py> for PyTensorMut<'py, T, D, Dev, L> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        Self::extract_with(&obj.to_owned(), None)
    }
}
