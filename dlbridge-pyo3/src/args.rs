//! Argument types for `#[pyfunction]`s that take any framework's tensor:
//! [`PyTensor`] to read, [`PyTensorMut`] to write, as rust-numpy separates
//! `PyReadonlyArray` and `PyReadwriteArray`. Both hold a [borrow](crate::borrows)
//! of the tensor's bytes for as long as they live.

use core::ffi::c_void;

use dlbridge::{TensorView, TensorViewMut};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::Borrowed;

use crate::borrows::{acquire, Borrow};
use crate::capsule::AnyOwned;
use crate::convert::type_name;
use crate::errors::IntoPyResult;
use crate::exchange;
use crate::import::{from_dlpack, import_any, ImportOptions};
use crate::writability::Writability;

/// A read-only argument that accepts any producer's tensor: DLPack objects and
/// capsules, buffer-protocol exporters, and both array interfaces.
///
/// For types with the DLPack C exchange API (torch, dlbridge), the tensor is
/// borrowed through the non-owning `dltensor_from_py_object_no_sync`: no
/// allocation, no capsule, valid while the call runs.
///
/// ```no_run
/// use dlbridge_pyo3::{to_py_err, PyTensor};
/// use pyo3::prelude::*;
///
/// #[pyfunction]
/// fn total(x: PyTensor<'_>) -> PyResult<f64> {
///     Ok(x.view().try_as_slice::<f64>().map_err(to_py_err)?.iter().sum())
/// }
/// ```
pub struct PyTensor<'py> {
    held: Held,
    source: Bound<'py, PyAny>,
    _borrow: Borrow,
}

enum Held {
    Owned(AnyOwned),
    /// The validated view of a non-owning fill; it points into the source's memory.
    Borrowed(TensorView<'static>),
}

impl<'py> PyTensor<'py> {
    /// The validated view.
    pub fn view(&self) -> &TensorView<'_> {
        match &self.held {
            Held::Owned(owned) => owned.view(),
            Held::Borrowed(view) => view,
        }
    }

    /// The Python object the tensor came from.
    pub fn source(&self) -> &Bound<'py, PyAny> {
        &self.source
    }

    /// The producer's current work stream for this tensor's device (NULL when it
    /// has none, or has no exchange API): launch kernels on it to stay ordered
    /// with the producer's work.
    pub fn work_stream(&self) -> *mut c_void {
        match exchange::lookup(&self.source) {
            Some(table) => exchange::work_stream(table, self.view().device()),
            None => core::ptr::null_mut(),
        }
    }

    /// An owned tensor, for keeping beyond the call (a borrowed one is imported
    /// through DLPack first).
    pub fn into_owned(self) -> PyResult<AnyOwned> {
        match self.held {
            Held::Owned(owned) => Ok(owned),
            Held::Borrowed(_) => from_dlpack(&self.source, ImportOptions::default()),
        }
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for PyTensor<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let source = obj.to_owned();
        if let Some(table) = exchange::lookup(&source) {
            if let Some(dl) = exchange::fill_borrowed(&source, table)? {
                // SAFETY: the fill points into the source's memory, which `source`
                // keeps alive for as long as this PyTensor; the view never outlives
                // it. A fill that does not validate is left for the owned import.
                if let Ok(view) = unsafe { TensorView::from_dltensor(&dl, false) } {
                    let borrow = acquire(&view, false)?;
                    return Ok(PyTensor { held: Held::Borrowed(view), source, _borrow: borrow });
                }
            }
        }
        let owned = import_any(&source, None)?;
        let borrow = acquire(owned.view(), false)?;
        Ok(PyTensor { held: Held::Owned(owned), source, _borrow: borrow })
    }
}

/// A writable argument: the caller's own memory (a NumPy array, a torch
/// tensor, a bytearray), written in place.
///
/// Refused with BufferError, saying why, unless the producer declared the
/// memory writable: READ_ONLY set, a read-only buffer, an array interface with
/// `readonly=True`, a legacy capsule (whose writability is unknown), or
/// elements that overlap (broadcasts) are all refused, and so is memory that
/// another argument of the same call already borrows.
///
/// ```no_run
/// use dlbridge_pyo3::{to_py_err, PyTensorMut};
/// use pyo3::prelude::*;
///
/// #[pyfunction]
/// fn double(mut x: PyTensorMut<'_>) -> PyResult<()> {
///     for v in x.view_mut()?.try_as_slice_mut::<f32>().map_err(to_py_err)? {
///         *v *= 2.0;
///     }
///     Ok(())
/// }
/// ```
pub struct PyTensorMut<'py> {
    owned: AnyOwned,
    source: Bound<'py, PyAny>,
    _borrow: Borrow,
}

impl<'py> PyTensorMut<'py> {
    /// A read-only view, for shape, strides and reads.
    pub fn view(&self) -> &TensorView<'_> {
        self.owned.view()
    }

    /// The writable view; writes are seen in the caller's own object.
    pub fn view_mut(&mut self) -> PyResult<TensorViewMut<'_>> {
        // SAFETY: `self` holds an exclusive borrow of these bytes in the registry,
        // so no other PyTensor or PyTensorMut reaches them while the view lives,
        // and `&mut self` makes the view the only one from here. (Python code the
        // extension itself runs meanwhile is outside what Rust can see; see
        // `borrows`.)
        unsafe { self.owned.try_view_mut_unchecked() }.py()
    }

    /// The Python object the tensor came from.
    pub fn source(&self) -> &Bound<'py, PyAny> {
        &self.source
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for PyTensorMut<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let source = obj.to_owned();
        let owned = import_any(&source, None)?;
        let refusal = match Writability::of(&owned) {
            Writability::Writable => None,
            Writability::ReadOnly => Some("its producer marked it read-only"),
            Writability::Unknown => {
                Some("it came through a legacy DLPack capsule, which cannot say whether writes are allowed")
            }
        };
        if let Some(why) = refusal {
            return Err(PyBufferError::new_err(format!("cannot borrow this {} as writable: {why}", type_name(&source))));
        }
        if owned.is_copied() {
            return Err(PyBufferError::new_err(format!(
                "cannot borrow this {} as writable: its producer handed over a copy (IS_COPIED), so writes would be lost",
                type_name(&source)
            )));
        }
        if !owned.view().is_non_overlapping() {
            return Err(PyBufferError::new_err(format!(
                "cannot borrow this {} as writable: its elements overlap in memory (a broadcast)",
                type_name(&source)
            )));
        }
        let borrow = acquire(owned.view(), true)?;
        Ok(PyTensorMut { owned, source, _borrow: borrow })
    }
}
