//! Validated, borrowed views of a `DLTensor`.
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
//! # Limitations
//! The view cannot know the size of the producer's allocation; it trusts the
//! producer for that, as every DLPack consumer must. Memory that other owners
//! share may change while a view is alive.

use core::ffi::c_void;
use core::marker::PhantomData;
use core::ops::Range;

use crate::dtype::DataType;
use crate::element::Element;
use crate::error::Error;
use crate::ffi::DLTensor;
use crate::layout::{byte_extent, element_count, element_extent, row_major_strides_into};
use crate::Device;

/// Most dimensions a tensor may have; NumPy allows the same 64.
pub const MAX_NDIM: usize = 64;

/// A slice that the view does not hold a reference to: a managed tensor's
/// shape may live in the very allocation its deleter frees, and a reference
/// held across that free would be invalid even if never used again.
#[derive(Clone, Copy, Debug)]
struct RawSlice {
    ptr: *const i64,
    len: usize,
}

impl RawSlice {
    const EMPTY: RawSlice = RawSlice { ptr: core::ptr::NonNull::dangling().as_ptr(), len: 0 };

    fn new(slice: &[i64]) -> Self {
        RawSlice { ptr: slice.as_ptr(), len: slice.len() }
    }

    /// # Safety
    /// The memory must still be valid, as it is for the view's lifetime.
    unsafe fn get(&self) -> &[i64] {
        // SAFETY: made from a valid slice that lives as long as the view.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Strides that were given by the producer, or computed because it sent NULL.
#[derive(Clone, Debug)]
enum Strides {
    Given(RawSlice),
    Computed(Box<[i64]>),
}

/// A validated, read-only view of a tensor whose memory outlives `'a`.
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    /// Address of element 0 (`data + byte_offset`); NULL-based when there are no elements.
    pub(crate) ptr: *const u8,
    shape: RawSlice,
    strides: Strides,
    dtype: DataType,
    device: Device,
    numel: usize,
    /// Bytes reached, relative to element 0: `lo..hi`; empty when `numel == 0`.
    lo: isize,
    hi: isize,
    padded: bool,
    _data: PhantomData<&'a [u8]>,
}

// SAFETY: a view only reads through its pointers; the data it points at is
// required (by `from_dltensor`'s contract) to stay valid and unmoved for `'a`,
// whichever thread reads it.
unsafe impl Send for TensorView<'_> {}
// SAFETY: as above; no method mutates through `&self`.
unsafe impl Sync for TensorView<'_> {}

impl<'a> TensorView<'a> {
    /// Validates `tensor` and returns a view of it. `padded` says whether a
    /// sub-byte dtype is padded to a byte per element (`IS_SUBBYTE_TYPE_PADDED`).
    ///
    /// # Safety
    /// - `tensor.shape`, and `tensor.strides` when not NULL, must point to
    ///   `tensor.ndim` readable `i64` values (when `ndim` is in range) that stay
    ///   unchanged for `'a`;
    /// - when the tensor has elements and its device is CPU-accessible, every byte
    ///   the layout reaches must be readable for `'a`, as DLPack promises.
    ///
    /// The `DLTensor` struct itself may go away sooner: the view copies its fields.
    /// Everything else (ndim, extents, dtype, NULL pointers, overflow) is checked.
    pub unsafe fn from_dltensor(tensor: &DLTensor, padded: bool) -> Result<Self, Error> {
        let ndim = usize::try_from(tensor.ndim)
            .ok()
            .filter(|&n| n <= MAX_NDIM)
            .ok_or(Error::NdimOutOfRange { ndim: i64::from(tensor.ndim), max: MAX_NDIM })?;
        let shape: &'a [i64] = if ndim == 0 {
            &[]
        } else if tensor.shape.is_null() {
            return Err(Error::NullShape { ndim: tensor.ndim });
        } else {
            // SAFETY: non-NULL and, by this function's contract, `ndim` readable
            // values that live for 'a.
            unsafe { core::slice::from_raw_parts(tensor.shape, ndim) }
        };
        let strides = if ndim == 0 {
            Strides::Given(RawSlice::EMPTY)
        } else if tensor.strides.is_null() {
            // Row-major, as producers before DLPack 1.2 meant by NULL. The strides of
            // an empty tensor may overflow; they are never used, so zeros stand in.
            let mut computed = vec![0i64; ndim].into_boxed_slice();
            if !row_major_strides_into(shape, |axis, stride| computed[axis] = stride) {
                computed.fill(0);
            }
            Strides::Computed(computed)
        } else {
            // SAFETY: as for `shape`.
            Strides::Given(RawSlice::new(unsafe { core::slice::from_raw_parts(tensor.strides, ndim) }))
        };
        // SAFETY: forwarded from the caller.
        unsafe { Self::from_parts(tensor.data, tensor.byte_offset, shape, strides, tensor.dtype, tensor.device, padded) }
    }

    /// The common tail of validation.
    unsafe fn from_parts(
        data: *mut c_void,
        byte_offset: u64,
        shape: &'a [i64],
        strides: Strides,
        dtype: DataType,
        device: Device,
        padded: bool,
    ) -> Result<Self, Error> {
        dtype.validate()?;
        if device.device_type.name().is_none() {
            return Err(Error::UnknownDevice { device });
        }
        let numel = element_count(shape)?;
        let strides_slice: &[i64] = match &strides {
            // SAFETY: checked readable by the caller for 'a.
            Strides::Given(raw) => unsafe { raw.get() },
            Strides::Computed(s) => s,
        };
        let overflow = || Error::ExtentOverflow { shape: shape.to_vec(), strides: strides_slice.to_vec(), byte_offset };
        let (lo, hi) = if numel == 0 {
            (0, 0)
        } else {
            let (lo_elem, hi_elem) = element_extent(shape, strides_slice).ok_or_else(overflow)?;
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
                && hi.checked_sub(lo).is_some());
        if !fits || byte_offset > isize::MAX as u64 {
            return Err(overflow());
        }
        Ok(TensorView {
            ptr: (data as *const u8).wrapping_add(byte_offset as usize),
            shape: RawSlice::new(shape),
            strides,
            dtype,
            device,
            numel,
            lo: lo as isize,
            hi: hi as isize,
            padded,
            _data: PhantomData,
        })
    }

    /// A view of parts already proven valid, without validating them again:
    /// the one constructor besides [`from_dltensor`](Self::from_dltensor).
    ///
    /// # Safety
    /// The parts must describe a well-formed tensor (valid dtype; `shape` and
    /// `strides` hold `ndim` values, or are ignored for `ndim == 0`) whose `numel`
    /// elements reach exactly bytes `lo..hi` relative to `ptr`, in memory valid
    /// for the caller's lifetime; the two arrays must outlive the result.
    #[allow(clippy::too_many_arguments)]
    unsafe fn from_proven(
        ptr: *const u8,
        shape: *const i64,
        strides: *const i64,
        ndim: usize,
        dtype: DataType,
        device: Device,
        numel: usize,
        (lo, hi): (isize, isize),
        padded: bool,
    ) -> TensorView<'static> {
        let raw = |ptr: *const i64| if ndim == 0 { RawSlice::EMPTY } else { RawSlice { ptr, len: ndim } };
        let (lo, hi) = if numel == 0 { (0, 0) } else { (lo, hi) };
        TensorView { ptr, shape: raw(shape), strides: Strides::Given(raw(strides)), dtype, device, numel, lo, hi, padded, _data: PhantomData }
    }

    /// The view of a tensor whose bytes `lo..hi` (relative to element 0) are
    /// known to lie in a live allocation, without validating it again.
    ///
    /// # Safety
    /// As [`from_proven`](Self::from_proven), for `tensor`'s fields.
    pub(crate) unsafe fn from_placed_unchecked(tensor: &DLTensor, numel: usize, lo: isize, hi: isize) -> TensorView<'static> {
        let ptr = (tensor.data as *const u8).wrapping_add(tensor.byte_offset as usize);
        // SAFETY: forwarded from the caller.
        unsafe { Self::from_proven(ptr, tensor.shape, tensor.strides, tensor.ndim as usize, tensor.dtype, tensor.device, numel, (lo, hi), false) }
    }

    /// The same view, reading shape and strides from copies at `shape` and
    /// `strides` (NULL for 0-d), as seen on `device`.
    ///
    /// # Safety
    /// The two arrays must hold this view's shape and strides and outlive the result.
    pub(crate) unsafe fn rebased(&self, shape: *const i64, strides: *const i64, device: Device) -> TensorView<'static> {
        // SAFETY: this view was validated; only where its shape and strides are read changes.
        unsafe { Self::from_proven(self.ptr, shape, strides, self.shape.len, self.dtype, device, self.numel, (self.lo, self.hi), self.padded) }
    }

    /// Extent of each axis.
    pub fn shape(&self) -> &[i64] {
        // SAFETY: validated readable and unchanging for 'a, which outlives &self.
        unsafe { self.shape.get() }
    }

    /// Stride of each axis in elements; computed row-major when the producer sent NULL.
    pub fn strides(&self) -> &[i64] {
        match &self.strides {
            // SAFETY: as for `shape`.
            Strides::Given(raw) => unsafe { raw.get() },
            Strides::Computed(s) => s,
        }
    }

    /// Whether the producer sent NULL strides, which were then computed.
    pub fn strides_were_null(&self) -> bool {
        matches!(self.strides, Strides::Computed(_))
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len
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
        contiguous(self.shape().iter().zip(self.strides()).rev(), self.numel)
    }

    /// Whether the elements are laid out column-major with no gaps.
    pub fn is_f_contiguous(&self) -> bool {
        contiguous(self.shape().iter().zip(self.strides()), self.numel)
    }

    /// Whether no two indices share an element (no zero strides over extents > 1,
    /// no interleaving). Write access needs this.
    pub fn is_non_overlapping(&self) -> bool {
        if self.numel <= 1 {
            return true;
        }
        let mut axes: Vec<(u128, u128)> = self
            .shape()
            .iter()
            .zip(self.strides())
            .filter(|(&d, _)| d > 1)
            .map(|(&d, &s)| (u128::from(s.unsigned_abs()), d as u128))
            .collect();
        axes.sort_unstable();
        let mut span = 1u128; // elements covered by the axes seen so far
        for (stride, dim) in axes {
            if stride < span {
                return false;
            }
            span += stride * (dim - 1);
        }
        true
    }

    /// Checks that the memory is CPU-accessible and holds `T`s, aligned for `T`.
    pub(crate) fn check_typed<T: Element>(&self) -> Result<(), Error> {
        if !self.device.is_cpu_accessible() {
            return Err(Error::NotCpuAccessible { device: self.device });
        }
        if self.dtype != T::DTYPE {
            return Err(Error::DtypeMismatch { expected: T::DTYPE, found: self.dtype });
        }
        let align = core::mem::align_of::<T>();
        if self.numel > 0 && (self.ptr as usize) % align != 0 {
            return Err(Error::Misaligned { address: self.ptr as usize, align });
        }
        Ok(())
    }

    /// The raw bytes of a C-contiguous, CPU-accessible tensor, in index order.
    /// `None` otherwise.
    pub fn as_bytes(&self) -> Option<&'a [u8]> {
        if !self.device.is_cpu_accessible() || !self.is_c_contiguous() {
            return None;
        }
        if self.numel == 0 {
            return Some(&[]);
        }
        // SAFETY: validation proved ptr+lo..ptr+hi lies in the address space and,
        // by `from_dltensor`'s contract, is readable for 'a; a C-contiguous layout
        // has lo == 0 and hi == nbytes.
        Some(unsafe { core::slice::from_raw_parts(self.ptr, self.hi as usize) })
    }

    /// The elements as a slice, when the tensor is C-contiguous, CPU-accessible,
    /// of dtype `T::DTYPE`, aligned for `T`, and holds only valid `T` values.
    pub fn as_slice<T: Element>(&self) -> Option<&'a [T]> {
        self.try_as_slice().ok()
    }

    /// Like [`as_slice`](Self::as_slice), with the reason for a refusal.
    pub fn try_as_slice<T: Element>(&self) -> Result<&'a [T], Error> {
        self.check_typed::<T>()?;
        let bytes = self.as_bytes().ok_or(Error::NotContiguous)?;
        if !T::bit_patterns_valid(bytes) {
            return Err(Error::InvalidValues { dtype: self.dtype });
        }
        if self.numel == 0 {
            return Ok(&[]);
        }
        // SAFETY: `bytes` holds numel * size_of::<T>() readable bytes (dtype checked,
        // and `Element` ties its bits to T's size), aligned for T (checked), all of
        // them valid T values (checked just above).
        Ok(unsafe { core::slice::from_raw_parts(self.ptr.cast::<T>(), self.numel) })
    }
}

fn contiguous<'s>(axes: impl Iterator<Item = (&'s i64, &'s i64)>, numel: usize) -> bool {
    if numel <= 1 {
        return true;
    }
    let mut expected = 1i64;
    for (&dim, &stride) in axes {
        if dim != 1 {
            if stride != expected {
                return false;
            }
            expected *= dim;
        }
    }
    true
}
