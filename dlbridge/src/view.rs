//! Validated views of a `DLTensor`.
//!
//! [`TensorView::from_dltensor`] is the one validation path: every foreign
//! tensor, whether it comes from a capsule, the exchange API or C, passes through
//! it before any byte of its data is touched. Once validated, every accessor is
//! safe.
//!
//! # What is checked
//! - `0 <= ndim <= MAX_NDIM`, and `shape` is NULL only when `ndim == 0`;
//! - every extent is `>= 0`, and the element count fits in `i64` and `usize`;
//! - the dtype follows the header's rules ([`DataType::validate`]);
//! - NULL `strides` are read as row-major (legal before DLPack 1.2);
//! - `data` is NULL only when there are no elements;
//! - the lowest and highest bytes reached, with negative strides and
//!   `byte_offset`, are computed with checked arithmetic and fit the address space.
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
use crate::error::Error;
use crate::ffi::DLTensor;
use crate::layout::{
    byte_extent, element_count, element_extent, is_contiguous, is_non_overlapping, row_major_strides_into, Dims, MAX_NDIM,
};
use crate::Device;

/// A validated, read-only view of a tensor whose memory outlives `'a`.
///
/// A view of memory that other objects may write (one taken from
/// [`Owned::view`](crate::Owned::view) after [`mark_aliased`](crate::Owned::mark_aliased))
/// gives shape, strides and addresses, but refuses typed reads
/// (`as_bytes`, `as_slice`, `as_array`, copies) with [`Error::Aliased`]:
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

/// Copies `into.len()` values from `ptr`, which need not be aligned.
///
/// # Safety
/// `ptr` must point at `into.len()` readable `i64`s.
unsafe fn copy_dims(ptr: *const i64, into: &mut [i64]) {
    for (i, slot) in into.iter_mut().enumerate() {
        // SAFETY: forwarded from the caller; an unaligned read is explicit, so a
        // C producer's misaligned array is read, not undefined behaviour.
        *slot = unsafe { ptr.add(i).read_unaligned() };
    }
}

impl<'a> TensorView<'a> {
    /// Validates `tensor` and returns a view of it. `padded` says whether a
    /// sub-byte dtype is padded to a byte per element (`IS_SUBBYTE_TYPE_PADDED`).
    ///
    /// # Safety
    /// - `tensor.shape`, and `tensor.strides` when not NULL, must point to
    ///   `tensor.ndim` readable `i64` values (when `ndim` is in range) during
    ///   this call; the view copies them, so they may change or go away after;
    /// - when the tensor has elements and its device is CPU-accessible, every byte
    ///   the layout reaches must be readable for `'a`, as DLPack promises, and
    ///   nothing may write those bytes while a slice or array read from the view
    ///   lives (a view of memory others may write is for
    ///   [`Owned::mark_aliased`](crate::Owned::mark_aliased)).
    ///
    /// Everything else (ndim, extents, dtype, NULL pointers, overflow) is checked.
    ///
    /// ```
    /// use dlbridge::ffi::DLTensor;
    /// use dlbridge::{DataType, Device, TensorView};
    ///
    /// // A DLTensor as a C producer fills it in: here over a local array.
    /// let data = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    /// let mut shape = [2i64, 3];
    /// let mut tensor = DLTensor {
    ///     data: data.as_ptr().cast_mut().cast(),
    ///     device: Device::CPU,
    ///     ndim: 2,
    ///     dtype: DataType::FLOAT32,
    ///     shape: shape.as_mut_ptr(),
    ///     strides: core::ptr::null_mut(), // row-major
    ///     byte_offset: 0,
    /// };
    /// // SAFETY: shape holds ndim extents; `data` holds the 6 elements the layout
    /// // reaches, outlives the view, and nothing writes it meanwhile.
    /// let view = unsafe { TensorView::from_dltensor(&tensor, false) }?;
    /// assert_eq!((view.strides(), view.as_slice::<f32>()), (&[3i64, 1][..], Some(&data[..])));
    ///
    /// // A malformed tensor is an error, not undefined behaviour.
    /// shape[1] = -3;
    /// tensor.shape = shape.as_mut_ptr();
    /// // SAFETY: as above.
    /// assert!(unsafe { TensorView::from_dltensor(&tensor, false) }.is_err());
    /// # Ok::<(), dlbridge::Error>(())
    /// ```
    pub unsafe fn from_dltensor(tensor: &DLTensor, padded: bool) -> Result<Self, Error> {
        let ndim = usize::try_from(tensor.ndim)
            .ok()
            .filter(|&n| n <= MAX_NDIM)
            .ok_or(Error::NdimOutOfRange { ndim: i64::from(tensor.ndim), max: MAX_NDIM })?;
        if ndim > 0 && tensor.shape.is_null() {
            return Err(Error::NullShape { ndim: tensor.ndim });
        }
        let mut dims = Dims::zeros(ndim);
        let (shape, strides) = dims.split_mut();
        let strides_were_null = ndim > 0 && tensor.strides.is_null();
        if ndim > 0 {
            // SAFETY: non-NULL and, by this function's contract, `ndim` readable values.
            unsafe { copy_dims(tensor.shape, shape) };
            if strides_were_null {
                // Row-major, as producers before DLPack 1.2 meant by NULL. The strides of
                // an empty tensor may overflow; they are never used, so zeros stand in.
                if !row_major_strides_into(shape, |axis, stride| strides[axis] = stride) {
                    strides.fill(0);
                }
            } else {
                // SAFETY: as for `shape`.
                unsafe { copy_dims(tensor.strides, strides) };
            }
        }
        let parts = Parts { dims, strides_were_null, dtype: tensor.dtype, device: tensor.device, padded };
        // SAFETY: forwarded from the caller.
        unsafe { Self::validate(tensor.data, tensor.byte_offset, parts) }
    }

    /// The common tail of validation.
    unsafe fn validate(data: *mut c_void, byte_offset: u64, parts: Parts) -> Result<Self, Error> {
        let Parts { dims, strides_were_null, dtype, device, padded } = parts;
        let (shape, strides) = (dims.shape(), dims.strides());
        dtype.validate()?;
        if device.device_type.name().is_none() {
            return Err(Error::UnknownDevice { device });
        }
        let numel = element_count(shape)?;
        let overflow = || Error::ExtentOverflow { shape: shape.to_vec(), strides: strides.to_vec(), byte_offset };
        let (lo, hi) = if numel == 0 {
            (0, 0)
        } else {
            let (lo_elem, hi_elem) = element_extent(shape, strides).ok_or_else(overflow)?;
            byte_extent(lo_elem, hi_elem, dtype, padded).ok_or_else(overflow)?
        };
        if numel > 0 && data.is_null() {
            return Err(Error::NullData { elements: numel as u64 });
        }
        // Element 0 and the bytes reached must all lie in the address space, and
        // the span must fit in isize, as for any Rust allocation.
        let base = (data as usize as u64).checked_add(byte_offset).ok_or_else(overflow)?;
        let fits = numel == 0
            || (base.checked_add_signed(lo).is_some()
                && base.checked_add_signed(hi).is_some_and(|end| end <= usize::MAX as u64)
                && hi.checked_sub(lo).is_some_and(|span| span <= isize::MAX as i64));
        if !fits || byte_offset > isize::MAX as u64 {
            return Err(overflow());
        }
        Ok(TensorView {
            ptr: (data as *const u8).wrapping_add(byte_offset as usize),
            dims,
            strides_were_null,
            dtype,
            device,
            numel,
            lo: if numel == 0 { 0 } else { lo as isize },
            hi: if numel == 0 { 0 } else { hi as isize },
            padded,
            aliased: false,
            _data: PhantomData,
        })
    }

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
    pub fn shape(&self) -> &[i64] {
        self.dims.shape()
    }

    /// Stride of each axis in elements; computed row-major when the producer sent NULL.
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
    pub fn is_c_contiguous(&self) -> bool {
        is_contiguous(self.shape().iter().zip(self.strides()).rev(), self.numel)
    }

    /// Whether the elements are laid out column-major with no gaps.
    pub fn is_f_contiguous(&self) -> bool {
        is_contiguous(self.shape().iter().zip(self.strides()), self.numel)
    }

    /// Whether no two indices share an element (no zero strides over extents > 1,
    /// no interleaving). Write access needs this.
    pub fn is_non_overlapping(&self) -> bool {
        self.numel <= 1 || is_non_overlapping(self.shape(), self.strides())
    }
}

/// The parts of a tensor that validation checks, besides its pointers.
struct Parts {
    dims: Dims,
    strides_were_null: bool,
    dtype: DataType,
    device: Device,
    padded: bool,
}
