//! Validated views of a `DLTensor`.
//!
//! Foreign tensors are validated before any byte of their data is touched
//! (`validate.rs`: [`TensorView::from_dltensor`], [`TensorView::from_byte_strides`]);
//! once validated, every accessor is safe.
//!
//! # What the view keeps
//! Shape and strides are copied at validation (inline up to 4 axes): a
//! producer that rewrites its own arrays afterwards (torch's `unsqueeze_`,
//! `as_strided_`) cannot change what the view reads or how far it reaches.
//!
//! # Limitations
//! The view cannot know the size of the producer's allocation; it trusts the
//! producer for that, as every DLPack consumer must. A producer that frees or
//! moves its storage after export (torch's `resize_`, `set_`) breaks every
//! consumer, NumPy's included.

use core::ffi::c_void;
use core::marker::PhantomData;
use core::ops::Range;

use crate::dtype::DataType;
use crate::dims::Dims;
use crate::layout::{is_contiguous, is_non_overlapping};
use crate::Device;

mod validate;

/// A validated, read-only view of a tensor whose memory outlives `'a`.
///
/// A view of memory that other objects may write (one taken from
/// [`Owned::view`](crate::Owned::view) after [`mark_aliased`](crate::Owned::mark_aliased))
/// gives shape, strides and addresses, but refuses typed reads
/// (`as_bytes`, `as_slice`, `as_array`, copies) with [`Error::Aliased`](crate::Error::Aliased):
/// those need a borrow that excludes writers, such as dlbridge-pyo3's `read()`.
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    /// Address of element 0 (`data + byte_offset`); NULL-based when there are no elements.
    pub(crate) ptr: *const u8,
    dims: Dims,
    strides_were_null: bool,
    dtype: DataType,
    device: Device,
    numel: usize,
    /// Bytes reached, relative to element 0: `lo..hi`; empty when `numel == 0`.
    lo: isize,
    hi: isize,
    padded: bool,
    /// Other paths may write the data: typed reads need the caller's proof that none does.
    aliased: bool,
    _data: PhantomData<&'a [u8]>,
}

// SAFETY: a view only reads through its pointer; the data it points at is
// required (by `from_dltensor`'s contract) to stay valid and unmoved for `'a`,
// whichever thread reads it. Shape and strides are the view's own.
unsafe impl Send for TensorView<'_> {}
// SAFETY: as above; no method mutates through `&self`.
unsafe impl Sync for TensorView<'_> {}

impl<'a> TensorView<'a> {
    /// The view of a layout already proven to lie in a live allocation
    /// (an export of Rust memory), without validating it again: `numel`
    /// elements reaching bytes `lo..hi` from `ptr`.
    ///
    /// # Safety
    /// `shape` and `strides` (same length, at most `MAX_NDIM`) must describe a
    /// well-formed tensor of `dtype` with `numel` elements reaching exactly bytes
    /// `lo..hi` relative to `ptr`, in memory valid for `'a`.
    pub(crate) unsafe fn from_placed(ptr: *const u8, shape: &[i64], strides: &[i64], dtype: DataType, numel: usize, (lo, hi): (isize, isize)) -> Self {
        let (lo, hi) = if numel == 0 { (0, 0) } else { (lo, hi) };
        TensorView {
            ptr,
            dims: Dims::from_slices(shape, strides),
            strides_were_null: false,
            dtype,
            device: Device::CPU,
            numel,
            lo,
            hi,
            padded: false,
            aliased: false,
            _data: PhantomData,
        }
    }

    /// The same view, as seen on `device` (which must reach the same memory),
    /// for a lifetime the caller vouches for.
    ///
    /// # Safety
    /// The memory must stay valid for `'b`, as [`from_dltensor`](Self::from_dltensor) requires.
    pub(crate) unsafe fn relabelled<'b>(&self, device: Device) -> TensorView<'b> {
        TensorView { device, _data: PhantomData, ..self.clone() }
    }

    /// Marks the data as writable through other paths: typed reads then refuse
    /// (there is no safe way back; see [`assume_unaliased`](Self::assume_unaliased)).
    pub fn mark_aliased(&mut self) {
        self.aliased = true;
    }

    /// The same view with typed reads allowed, for a caller that proves that
    /// nothing writes the data meanwhile.
    ///
    /// # Safety
    /// Nothing may write the bytes this view reaches, through any other path,
    /// while the result or anything read from it lives.
    pub unsafe fn assume_unaliased(&self) -> TensorView<'_> {
        TensorView { aliased: false, _data: PhantomData, ..self.clone() }
    }

    /// This view with typed reads allowed, for a caller inside the crate that
    /// proved exclusion.
    pub(crate) fn unaliased(mut self) -> Self {
        self.aliased = false;
        self
    }

    /// Whether other paths may write the data, so that typed reads refuse
    /// (see the type's documentation).
    pub fn is_aliased(&self) -> bool {
        self.aliased
    }

    /// Extent of each axis.
    #[inline]
    pub fn shape(&self) -> &[i64] {
        self.dims.shape()
    }

    /// Stride of each axis in elements; computed row-major when the producer sent NULL.
    #[inline]
    pub fn strides(&self) -> &[i64] {
        self.dims.strides()
    }

    /// Whether the producer sent NULL strides, which were then computed.
    pub fn strides_were_null(&self) -> bool {
        self.strides_were_null
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.dims.shape().len()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.numel
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.numel == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// Where the memory lives.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Whether a sub-byte dtype is padded to one byte per element (the flag
    /// means nothing for whole-byte dtypes, and is false for them).
    pub fn is_subbyte_padded(&self) -> bool {
        self.padded && self.dtype.is_sub_byte()
    }

    /// Address of element 0 (`data + byte_offset`). Meaningless when the tensor is empty.
    pub fn as_ptr(&self) -> *const c_void {
        self.ptr.cast()
    }

    /// Addresses of every byte the tensor reaches; empty when it has no elements.
    pub fn byte_range(&self) -> Range<usize> {
        if self.numel == 0 {
            return 0..0;
        }
        let base = self.ptr as usize;
        base.wrapping_add_signed(self.lo)..base.wrapping_add_signed(self.hi)
    }

    /// Bytes needed to hold the elements contiguously.
    pub fn nbytes(&self) -> usize {
        // Saturates for a broadcast whose copy would not fit in memory anyway:
        // allocating that many bytes then fails with `AllocationFailed`.
        let bytes = self.dtype.storage_bytes(self.numel as u64, self.padded).unwrap_or(u64::MAX);
        usize::try_from(bytes).unwrap_or(usize::MAX)
    }

    /// Whether the elements are laid out row-major with no gaps.
    #[inline]
    pub fn is_c_contiguous(&self) -> bool {
        is_contiguous(self.shape().iter().zip(self.strides()).rev(), self.numel)
    }

    /// Whether the elements are laid out column-major with no gaps.
    #[inline]
    pub fn is_f_contiguous(&self) -> bool {
        is_contiguous(self.shape().iter().zip(self.strides()), self.numel)
    }

    /// Whether no two indices share an element (no zero strides over extents > 1,
    /// no interleaving). Write access needs this.
    #[inline]
    pub fn is_non_overlapping(&self) -> bool {
        self.numel <= 1 || is_non_overlapping(self.shape(), self.strides())
    }
}
