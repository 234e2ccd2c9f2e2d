//! Owned tensors: a managed-tensor pointer whose deleter runs exactly once.
//!
//! # Ownership contract
//! A [`Owned`] owns one `DLManagedTensorVersioned` ([`OwnedTensor`]) or
//! legacy `DLManagedTensor` ([`OwnedLegacyTensor`]). It calls the producer's
//! deleter once, when dropped, unless [`Owned::into_raw`] handed ownership on.
//! A NULL deleter is allowed and means there is nothing to free.
//!
//! Taking a pointer is `unsafe` (the pointer must really be an owned managed
//! tensor); everything after that is safe, because the tensor was validated once
//! on the way in.

use core::ptr::NonNull;

use crate::error::Error;
use crate::ffi::{
    DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLPACK_FLAG_BITMASK_IS_COPIED,
    DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, DLPACK_FLAG_BITMASK_READ_ONLY, DLPACK_MAJOR_VERSION,
};
use crate::view::TensorView;
use crate::view_mut::TensorViewMut;

use crate::managed_abi::ManagedAbi;

/// An owned, validated managed tensor.
///
/// # Ownership contract
/// A `Owned` owns one `DLManagedTensorVersioned` ([`OwnedTensor`]) or legacy
/// `DLManagedTensor` ([`OwnedLegacyTensor`]). It calls the producer's deleter
/// once, when dropped, unless [`Owned::into_raw`] handed ownership on. A NULL
/// deleter is allowed and means there is nothing to free.
///
/// Taking a pointer is `unsafe` (the pointer must really be an owned managed
/// tensor); everything after that is safe, because the tensor was validated once,
/// by [`TensorView::from_dltensor`], on the way in.
pub struct Owned<M: ManagedAbi> {
    ptr: NonNull<M>,
    /// The validated view. Its `'static` is private: it reads data that `*ptr`
    /// keeps alive until `Drop`, and is only handed out re-borrowed from `&self`.
    view: TensorView<'static>,
    /// Read-only whatever the ABI: a legacy struct has no flags to carry READ_ONLY,
    /// so a read-only export of one (or `mark_read_only`) is remembered here.
    read_only: bool,
    /// The data may be reachable through other paths (see [`Owned::mark_aliased`]).
    aliased: bool,
}

/// An owned `DLManagedTensorVersioned` (DLPack ≥ 1.0).
pub type OwnedTensor = Owned<DLManagedTensorVersioned>;
/// An owned legacy `DLManagedTensor`.
pub type OwnedLegacyTensor = Owned<DLManagedTensor>;

// SAFETY: DLPack requires a deleter to be callable from any thread (producers
// take their own locks, such as the GIL), and the view is Send.
unsafe impl<M: ManagedAbi> Send for Owned<M> {}
// SAFETY: `&Owned` only allows reads of immutable metadata and data.
unsafe impl<M: ManagedAbi> Sync for Owned<M> {}

impl<M: ManagedAbi> Owned<M> {
    /// Takes ownership of `ptr` and validates it. On any error the deleter has
    /// already been called, as the header requires for a version mismatch.
    ///
    /// # Safety
    /// `ptr` must be NULL or point to a managed tensor that the caller owns, that
    /// nothing else will use or delete, whose `shape` and `strides` are readable
    /// during this call (they are copied), and whose data is valid as
    /// [`TensorView::from_dltensor`] requires until the deleter runs. Unless the
    /// result is [marked aliased](Self::mark_aliased), nothing else may write the
    /// data while a read from [`view`](Self::view) lives, nor access it while a
    /// view from [`try_view_mut`](Self::try_view_mut) lives.
    ///
    /// ```
    /// use dlbridge::OwnedTensor;
    ///
    /// // A pointer as a C producer hands it over (here made by dlbridge itself).
    /// let raw = OwnedTensor::from_vec(vec![1u8, 2, 3], &[3])?.into_raw();
    /// // SAFETY: `raw` is a live managed tensor that nothing else owns or uses.
    /// let t = unsafe { OwnedTensor::from_raw(raw) }?;
    /// assert_eq!(t.view().as_slice::<u8>(), Some(&[1, 2, 3][..]));
    /// drop(t); // calls the producer's deleter, once
    /// // SAFETY: NULL is allowed, and refused.
    /// assert!(unsafe { OwnedTensor::from_raw(core::ptr::null_mut()) }.is_err());
    /// # Ok::<(), dlbridge::Error>(())
    /// ```
    pub unsafe fn from_raw(ptr: *mut M) -> Result<Self, Error> {
        // SAFETY: forwarded from the caller.
        unsafe { Self::try_from_raw(ptr) }.map_err(|(err, ptr)| {
            if let Some(ptr) = ptr {
                // SAFETY: ownership was passed in and not taken.
                unsafe { M::delete(ptr) };
            }
            err
        })
    }

    /// Validates `ptr` and takes ownership of it only on success. On error the
    /// pointer is handed back, untouched, with its deleter not called, so that
    /// the caller can leave it to its producer (a capsule destructor, say).
    ///
    /// # Safety
    /// As for [`from_raw`](Self::from_raw).
    #[allow(clippy::type_complexity)]
    pub unsafe fn try_from_raw(ptr: *mut M) -> Result<Self, (Error, Option<NonNull<M>>)> {
        let ptr = NonNull::new(ptr).ok_or((Error::NullPointer, None))?;
        // SAFETY: the caller guarantees a live managed tensor; only the version
        // is read before it is checked.
        if let Some(version) = unsafe { M::read_version(ptr) } {
            if version.major != DLPACK_MAJOR_VERSION {
                return Err((Error::UnsupportedVersion { major: version.major, minor: version.minor }, Some(ptr)));
            }
        }
        // SAFETY: the version matches, so the whole struct has the layout we know.
        let managed: &'static M = unsafe { &*ptr.as_ptr() };
        let padded = managed.flags() & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED != 0;
        // SAFETY: the version matches, so `dl_tensor` has the layout we know; the
        // caller guarantees its pointers. The 'static borrow is confined to
        // `Owned`, which outlives every use of it.
        match unsafe { TensorView::from_dltensor(managed.dl_tensor(), padded) } {
            Ok(view) => Ok(Owned { ptr, view, read_only: false, aliased: false }),
            Err(err) => Err((err, Some(ptr))),
        }
    }

    /// Wraps a tensor whose view was validated already (an export of a view).
    ///
    /// # Safety
    /// `ptr` must be an owned managed tensor that `view` describes exactly.
    pub(crate) unsafe fn from_validated(ptr: NonNull<M>, view: TensorView<'static>) -> Self {
        Owned { ptr, view, read_only: false, aliased: false }
    }

    /// Gives up ownership without calling the deleter, for a C consumer.
    pub fn into_raw(self) -> *mut M {
        let ptr = self.ptr.as_ptr();
        core::mem::forget(self);
        ptr
    }

    /// The raw struct, for reading fields this type does not expose.
    pub fn as_raw(&self) -> &M {
        // SAFETY: owned and live until drop.
        unsafe { self.ptr.as_ref() }
    }

    /// The validated view of the tensor. For a tensor [marked
    /// aliased](Self::mark_aliased) it gives the layout and addresses, and
    /// refuses typed reads with [`Error::Aliased`].
    pub fn view(&self) -> &TensorView<'_> {
        &self.view
    }

    /// The view with typed reads allowed even when the tensor is marked
    /// aliased, for a caller that proves that nothing writes the data meanwhile
    /// (a shared borrow in a registry, say).
    ///
    /// # Safety
    /// Nothing may write the bytes this tensor reaches, through any other path,
    /// while the result or anything read from it lives.
    pub unsafe fn view_unchecked(&self) -> TensorView<'_> {
        // SAFETY: forwarded from the caller.
        unsafe { self.view.assume_unaliased() }
    }

    /// A view through which the data may be written, with the reason for a
    /// refusal: read-only tensors, and tensors whose elements overlap.
    ///
    /// A legacy tensor cannot say whether its producer allows writes; it is
    /// taken as writable here, since the caller holds the owning pointer and
    /// chose to trust it (the Python layer treats it as unknown instead).
    pub fn try_view_mut(&mut self) -> Result<TensorViewMut<'_>, Error> {
        if self.aliased {
            return Err(Error::Aliased);
        }
        // SAFETY: not aliased: `from_raw`'s caller vouched that nothing else
        // accesses the data, and Rust exports own it.
        unsafe { self.try_view_mut_unchecked() }
    }

    /// [`try_view_mut`](Self::try_view_mut) for a tensor marked aliased, whose
    /// caller proves exclusive access another way (a borrow registry, say).
    ///
    /// # Safety
    /// Nothing may read or write the bytes this tensor reaches, through any
    /// other path, while the returned view (or a borrow from it) lives.
    pub unsafe fn try_view_mut_unchecked(&mut self) -> Result<TensorViewMut<'_>, Error> {
        if self.is_read_only() {
            return Err(Error::ReadOnly);
        }
        // SAFETY: the caller proves exclusive access, so no other path writes either.
        TensorViewMut::from_view(unsafe { self.view.assume_unaliased() })
    }

    /// Marks the data as reachable through other paths than this owner (a
    /// Python object it was imported from, another import of the same memory):
    /// [`try_view_mut`](Self::try_view_mut) then refuses, and so do the typed
    /// reads of [`view`](Self::view); both need a proof of exclusion
    /// ([`try_view_mut_unchecked`](Self::try_view_mut_unchecked),
    /// [`view_unchecked`](Self::view_unchecked)). There is no way to clear it.
    pub fn mark_aliased(&mut self) {
        self.aliased = true;
        self.view.mark_aliased();
    }

    /// Whether the tensor was [marked aliased](Self::mark_aliased).
    pub fn is_aliased(&self) -> bool {
        self.aliased
    }

    /// Like [`try_view_mut`](Self::try_view_mut), `None` on refusal.
    pub fn view_mut(&mut self) -> Option<TensorViewMut<'_>> {
        self.try_view_mut().ok()
    }

    /// The ABI version; `None` for a legacy tensor.
    pub fn version(&self) -> Option<DLPackVersion> {
        self.as_raw().version()
    }

    /// The `DLPACK_FLAG_BITMASK_*` bits; 0 for a legacy tensor.
    pub fn flags(&self) -> u64 {
        self.as_raw().flags()
    }

    /// Whether the producer marked the data read-only.
    pub fn is_read_only(&self) -> bool {
        self.read_only || self.flags() & DLPACK_FLAG_BITMASK_READ_ONLY != 0
    }

    /// Whether the producer made a copy for this consumer.
    pub fn is_copied(&self) -> bool {
        self.flags() & DLPACK_FLAG_BITMASK_IS_COPIED != 0
    }

    /// Whether a sub-byte dtype is padded to one byte per element.
    pub fn is_subbyte_padded(&self) -> bool {
        self.flags() & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED != 0
    }
}

impl<M: ManagedAbi> Owned<M> {
    fn insert_flags(&mut self, bits: u64) {
        // SAFETY: owned; `flags` is in the stable prefix, and the view holds no
        // reference into the struct itself, only into its shape and strides.
        if let Some(flags) = unsafe { (*self.ptr.as_ptr()).flags_mut() } {
            *flags |= bits;
        }
    }

    /// Sets READ_ONLY: in the struct when it has flags, and for this owner's own
    /// views in any case. There is no way to clear it: only the producer may grant writes.
    pub fn mark_read_only(&mut self) {
        self.read_only = true;
        self.insert_flags(DLPACK_FLAG_BITMASK_READ_ONLY);
    }

    /// Applies an export's flags on the Rust side too, so that a legacy export
    /// (which drops them from the struct) stays read-only here.
    pub(crate) fn with_export_flags(mut self, flags: u64) -> Self {
        self.read_only |= flags & DLPACK_FLAG_BITMASK_READ_ONLY != 0;
        self
    }

    /// Sets IS_COPIED (a no-op for legacy tensors): the consumer will own this
    /// data alone. Only for tensors whose data nothing else refers to, such as
    /// a fresh copy.
    pub fn mark_copied(&mut self) {
        self.insert_flags(DLPACK_FLAG_BITMASK_IS_COPIED);
    }
}

impl<M: ManagedAbi> Drop for Owned<M> {
    fn drop(&mut self) {
        // SAFETY: we own the pointer, and nothing uses it after this.
        unsafe { M::delete(self.ptr) }
    }
}

impl<M: ManagedAbi> core::fmt::Debug for Owned<M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Owned")
            .field("version", &self.version())
            .field("flags", &self.flags())
            .field("view", &self.view)
            .finish()
    }
}
