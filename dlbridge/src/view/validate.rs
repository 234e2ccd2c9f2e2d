//! Validation of foreign tensors: from a `DLTensor` (strides in elements) or
//! from byte strides (NumPy's struct, the buffer protocol, the array
//! interfaces). Every foreign tensor, whether it comes from a capsule, the
//! exchange API, C or a NumPy array, passes through one of them before any
//! byte of its data is touched; both end in the same checks.
//!
//! # What is checked
//! - `0 <= ndim <= MAX_NDIM`, and `shape` is NULL only when `ndim == 0`;
//! - every extent is `>= 0`, and the element count fits in `i64` and `usize`;
//! - the dtype follows the header's rules ([`DataType::validate`]);
//! - NULL `strides` are read as row-major (legal before DLPack 1.2);
//! - `data` is NULL only when there are no elements;
//! - the lowest and highest bytes reached, with negative strides and
//!   `byte_offset`, are computed with checked arithmetic and fit the address space.

use core::ffi::c_void;
use core::marker::PhantomData;

use super::TensorView;
use crate::dtype::DataType;
use crate::error::Error;
use crate::ffi::DLTensor;
use crate::dims::Dims;
use crate::layout::{byte_extent, element_count, element_extent, element_stride, row_major_strides_into, MAX_NDIM};
use crate::Device;

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
    #[inline(always)] // as `from_byte_strides`
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

    /// Validates a tensor whose strides are in bytes (as NumPy's array struct,
    /// the buffer protocol and the array interfaces give them) in one pass
    /// that fills the view's own shape and strides: `axis(i)` is axis `i`'s
    /// extent and byte stride, read once. A byte stride that is not a whole
    /// number of elements is refused ([`Error::StrideNotWhole`]) unless its
    /// axis has at most one element; packed sub-byte dtypes have no byte
    /// strides and are refused ([`Error::UnsupportedDtype`]).
    ///
    /// # Safety
    /// When the tensor has elements and `device` is CPU-accessible, every byte
    /// the layout reaches from `data` must be readable for `'a`, and nothing may
    /// write those bytes while a slice or array read from the view lives, as
    /// [`from_dltensor`](Self::from_dltensor) requires. Everything else is checked.
    ///
    /// ```
    /// use dlbridge::{DataType, Device, TensorView};
    ///
    /// let data = [1u16, 2, 3, 4, 5, 6];
    /// let (shape, byte_strides) = ([3i64, 2], [2i64, 6]); // column-major
    /// // SAFETY: the layout reaches the 6 elements of `data`, which outlives the view.
    /// let view = unsafe {
    ///     TensorView::from_byte_strides(data.as_ptr().cast_mut().cast(), DataType::UINT16, Device::CPU, 2, false, |i| (shape[i], byte_strides[i]))
    /// }?;
    /// assert_eq!(view.strides(), &[1, 3]);
    /// assert!(view.is_f_contiguous());
    /// # Ok::<(), dlbridge::Error>(())
    /// ```
    // Inlined, with `validate`: the view is built where the caller keeps it.
    // Copied out of a returned `Result`, its fresh narrow stores stall the copy.
    #[inline(always)]
    pub unsafe fn from_byte_strides(
        data: *mut c_void,
        dtype: DataType,
        device: Device,
        ndim: usize,
        padded: bool,
        mut axis: impl FnMut(usize) -> (i64, i64),
    ) -> Result<Self, Error> {
        if ndim > MAX_NDIM {
            return Err(Error::NdimOutOfRange { ndim: ndim as i64, max: MAX_NDIM });
        }
        let itemsize = match dtype.itemsize() {
            Some(size) => size,
            None if padded => 1,
            None => return Err(Error::UnsupportedDtype { dtype, operation: "byte strides (packed sub-byte elements have none)" }),
        };
        let mut dims = Dims::zeros(ndim);
        let (shape, strides) = dims.split_mut();
        for (i, (dim, stride)) in shape.iter_mut().zip(strides.iter_mut()).enumerate() {
            let (extent, byte_stride) = axis(i);
            *dim = extent;
            *stride = element_stride(i, byte_stride, extent, itemsize)?;
        }
        let parts = Parts { dims, strides_were_null: false, dtype, device, padded };
        // SAFETY: forwarded from the caller.
        unsafe { Self::validate(data, 0, parts) }
    }

    /// The common tail of validation.
    #[inline(always)]
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
}

/// The parts of a tensor that validation checks, besides its pointers.
struct Parts {
    dims: Dims,
    strides_were_null: bool,
    dtype: DataType,
    device: Device,
    padded: bool,
}
