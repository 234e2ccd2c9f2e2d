//! [`AnyOwned`]: a tensor taken from Python and kept alive, whatever carried it.

use dlbridge::ffi::{DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, DLPACK_FLAG_BITMASK_READ_ONLY};
use dlbridge::{Error, OwnedLegacyTensor, OwnedTensor, TensorView, TensorViewMut};
use pyo3::prelude::*;

use crate::owner::PyOwner;

/// A tensor owned by Rust: a managed tensor of either ABI, or memory a
/// Python object exposes directly.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyOwned {
    /// From a `dltensor_versioned` capsule or the exchange API.
    Versioned(OwnedTensor),
    /// From a legacy `dltensor` capsule.
    Legacy(OwnedLegacyTensor),
    /// Memory that a Python object describes itself (NumPy's array struct),
    /// kept alive by a reference to the object: no managed tensor, no allocation.
    Object(ObjectTensor),
}

/// Memory a Python object exposes, validated, with a strong reference that
/// keeps it alive. Always aliased: the object reaches the same bytes.
#[derive(Debug)]
pub struct ObjectTensor {
    /// Its `'static` is private: the data lives as long as `owner`, and the view
    /// is only handed out reborrowed from `&self`.
    view: TensorView<'static>,
    read_only: bool,
    _owner: PyOwner,
}

impl ObjectTensor {
    /// Wraps a validated view of memory that `obj` keeps alive, marked aliased.
    ///
    /// # Safety
    /// Every byte the view reaches must stay valid (readable, and writable
    /// unless `read_only`) for as long as `obj` lives and is not resized.
    pub(crate) unsafe fn new(obj: &Bound<'_, PyAny>, mut view: TensorView<'static>, read_only: bool) -> Self {
        view.mark_aliased();
        ObjectTensor { view, read_only, _owner: PyOwner::new(obj) }
    }

    /// The view, apart from the owner, to export the owner with: valid only
    /// for as long as the owner lives, wherever it is moved.
    pub(crate) fn detached_view(&self) -> TensorView<'static> {
        self.view.clone()
    }
}

impl AnyOwned {
    /// The validated view: shape, strides, dtype, device and addresses. For a
    /// tensor imported from Python (marked aliased) its typed reads refuse:
    /// read through [`read`](Self::read).
    pub fn view(&self) -> &TensorView<'_> {
        match self {
            AnyOwned::Versioned(t) => t.view(),
            AnyOwned::Legacy(t) => t.view(),
            AnyOwned::Object(t) => &t.view,
        }
    }

    /// A shared borrow of the tensor's bytes in the process's borrow registry,
    /// with a view whose typed reads (`as_slice`, `try_as_array`, copies) work
    /// while it lives. BufferError while a [`PyTensorMut`](crate::PyTensorMut)
    /// of overlapping memory is alive, in any extension.
    pub fn read<'a>(&'a self, py: Python<'a>) -> PyResult<crate::ReadGuard<'a>> {
        // SAFETY: memory that Python objects can reach is written from Rust only
        // under an exclusive borrow of the registry (`PyTensorMut`); an unaliased
        // owner is written only through `try_view_mut`, which needs `&mut self`.
        unsafe { crate::ReadGuard::new(py, self.view()) }
    }

    /// Whether the memory is reachable through other objects (anything imported
    /// from Python is), so that reads need [`read`](Self::read) and writes a
    /// [`PyTensorMut`](crate::PyTensorMut).
    pub fn is_aliased(&self) -> bool {
        self.view().is_aliased()
    }

    /// A writable view, refused for read-only or overlapping tensors, and for
    /// tensors imported from Python, whose memory other objects can reach:
    /// write those through [`PyTensorMut`](crate::PyTensorMut), which holds an
    /// exclusive borrow of the bytes.
    pub fn try_view_mut(&mut self) -> Result<TensorViewMut<'_>, Error> {
        match self {
            AnyOwned::Versioned(t) => t.try_view_mut(),
            AnyOwned::Legacy(t) => t.try_view_mut(),
            AnyOwned::Object(_) => Err(Error::Aliased),
        }
    }

    /// The view with typed reads allowed.
    ///
    /// # Safety
    /// As [`dlbridge::Owned::view_unchecked`].
    pub(crate) unsafe fn view_unchecked(&self) -> TensorView<'_> {
        // SAFETY: forwarded from the caller.
        unsafe { self.view().assume_unaliased() }
    }

    /// Marks the data reachable through other paths (see [`dlbridge::Owned::mark_aliased`]).
    pub(crate) fn mark_aliased(&mut self) {
        match self {
            AnyOwned::Versioned(t) => t.mark_aliased(),
            AnyOwned::Legacy(t) => t.mark_aliased(),
            AnyOwned::Object(_) => {}
        }
    }

    /// The DLPack flags (0 for legacy tensors).
    pub fn flags(&self) -> u64 {
        match self {
            AnyOwned::Versioned(t) => t.flags(),
            AnyOwned::Legacy(_) => 0,
            AnyOwned::Object(t) => {
                let read_only = if t.read_only { DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 };
                let padded = if t.view.is_subbyte_padded() { DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED } else { 0 };
                read_only | padded
            }
        }
    }

    /// Whether the producer marked the data read-only.
    pub fn is_read_only(&self) -> bool {
        match self {
            AnyOwned::Versioned(t) => t.is_read_only(),
            AnyOwned::Legacy(_) => false,
            AnyOwned::Object(t) => t.read_only,
        }
    }

    /// Whether the producer says it copied the data for us.
    pub fn is_copied(&self) -> bool {
        matches!(self, AnyOwned::Versioned(t) if t.is_copied())
    }
}

impl From<OwnedTensor> for AnyOwned {
    fn from(t: OwnedTensor) -> Self {
        AnyOwned::Versioned(t)
    }
}

impl From<OwnedLegacyTensor> for AnyOwned {
    fn from(t: OwnedLegacyTensor) -> Self {
        AnyOwned::Legacy(t)
    }
}
