//! Producer side: hand Rust-owned memory to DLPack consumers without copying.
//!
//! Each export makes one heap allocation holding the managed struct, the owner
//! and the shape and strides. Its deleter drops the owner and frees the block.
//! Exports follow the DLPack 1.2+ rules: strides are always filled when
//! `ndim > 0`, shape and strides are NULL when `ndim == 0`, and `data` is NULL
//! when the tensor has no elements. The block itself is in `block.rs`.

mod allocator;
mod block;

use core::ffi::c_void;
use core::ops::{Deref, DerefMut};
use core::ptr::NonNull;

use crate::dtype::DataType;
use crate::element::Element;
use crate::error::Error;
use crate::ffi::DLPACK_FLAG_BITMASK_READ_ONLY;
use crate::layout::{element_count, extent_of, place_in_buffer, MAX_NDIM};
use crate::managed_abi::ManagedAbi;
use crate::owned::Owned;

pub use allocator::{BlockAllocator, GlobalBlocks};
pub(crate) use block::{export_placed, place_owner};
use block::{discard_block, write_block};
use crate::view::TensorView;
use crate::Device;

/// Where a raw export's elements are: the parts of a `DLTensor` other than the pointers.
#[derive(Clone, Copy, Debug)]
pub struct RawLayout<'s> {
    /// Element type.
    pub dtype: DataType,
    /// Where the memory lives.
    pub device: Device,
    /// Extent of each axis.
    pub shape: &'s [i64],
    /// Strides in elements; `None` means row-major.
    pub strides: Option<&'s [i64]>,
    /// Bytes from the data pointer to element 0.
    pub byte_offset: u64,
}

/// Exports memory that `owner` keeps alive, as a managed tensor of ABI `M`.
///
/// `data` is the address the tensor's `data` field will hold; element 0 is at
/// `data + byte_offset`. When `strides` is `None` they are filled in row-major.
/// The result is validated like any foreign tensor.
///
/// # Safety
/// Every byte that the layout reaches from `data` must stay valid (readable,
/// and writable unless `flags` has READ_ONLY) until `owner` is dropped, and
/// nothing else may write it while the tensor is shared, unless it is read-only.
///
/// ```
/// use dlbridge::export::{export_raw, RawLayout};
/// use dlbridge::ffi::DLPACK_FLAG_BITMASK_READ_ONLY;
/// use dlbridge::{DataType, Device, OwnedTensor};
///
/// // Memory that a Vec owns, exported from its second element on (byte_offset 4).
/// let mut words = vec![0u32, 7, 8, 9];
/// let data = words.as_mut_ptr().cast();
/// let layout = RawLayout { dtype: DataType::UINT32, device: Device::CPU, shape: &[3], strides: None, byte_offset: 4 };
/// // SAFETY: the Vec is the owner: its heap memory stays put until the deleter drops it,
/// // and the layout reaches bytes 4..16 of its 16. Read-only: nothing writes them.
/// let t: OwnedTensor = unsafe { export_raw(words, data, layout, DLPACK_FLAG_BITMASK_READ_ONLY) }?;
/// assert!(t.is_read_only());
/// assert_eq!(t.view().try_as_slice::<u32>()?, &[7, 8, 9]);
/// # Ok::<(), dlbridge::Error>(())
/// ```
pub unsafe fn export_raw<M: ManagedAbi, O: Send + 'static>(
    owner: O,
    data: *mut c_void,
    layout: RawLayout<'_>,
    flags: u64,
) -> Result<Owned<M>, Error> {
    let ndim = layout.shape.len();
    if ndim > MAX_NDIM {
        return Err(Error::NdimOutOfRange { ndim: ndim as i64, max: MAX_NDIM });
    }
    if let Some(strides) = layout.strides {
        if strides.len() != ndim {
            return Err(Error::StridesLength { expected: ndim, found: strides.len() });
        }
    }
    let numel = element_count(layout.shape)?;
    let block: NonNull<M> = write_block(owner, data, layout, numel, flags, &GlobalBlocks)?;
    // SAFETY: the block is a complete managed tensor we own; shape and strides
    // live in it, and the caller vouches for the data. On error `from_raw` calls
    // the deleter, which drops the owner and frees the block.
    unsafe { Owned::from_raw(block.as_ptr()) }.map(|owned| owned.with_export_flags(flags))
}

/// Exports the memory of an already validated view, with the same layout (on
/// `device`, which must reach the same memory), without validating it again:
/// the fast path of a producer re-exporting what it holds.
///
/// # Safety
/// The memory the view describes must stay valid, as for [`export_raw`], until
/// `owner` is dropped; `flags` has IS_SUBBYTE_TYPE_PADDED exactly when the view
/// is padded (a consumer reads that many bytes).
pub unsafe fn export_view<M: ManagedAbi, O: Send + 'static>(
    owner: O,
    view: &TensorView<'_>,
    device: Device,
    flags: u64,
) -> Result<Owned<M>, Error> {
    // SAFETY: forwarded from the caller.
    let block: NonNull<M> = unsafe { export_view_in(owner, view, device, flags, &GlobalBlocks) }?;
    // SAFETY: the block was just written with the view's layout, so the view's
    // validation carries over; the caller keeps the memory valid until the
    // owner, and so the block, is dropped.
    unsafe { Ok(Owned::from_validated(block, view.relabelled(device)).with_export_flags(flags)) }
}

/// As [`export_view`], with the block from `allocator`, and the managed tensor
/// returned as is: the caller owns it, and hands it to a consumer or calls its
/// deleter once. For producers that pass it straight on (a capsule), which
/// need no [`Owned`] of their own.
///
/// # Safety
/// As for [`export_view`].
pub unsafe fn export_view_in<M: ManagedAbi, O: Send + 'static, A: BlockAllocator>(
    owner: O,
    view: &TensorView<'_>,
    device: Device,
    flags: u64,
    allocator: &A,
) -> Result<NonNull<M>, Error> {
    let layout = RawLayout {
        dtype: view.dtype(),
        device,
        shape: view.shape(),
        strides: Some(view.strides()),
        byte_offset: 0,
    };
    write_block(owner, view.as_ptr().cast_mut(), layout, view.len(), flags, allocator)
}

/// Exports the elements that `slice_of` finds in `owner`, asked only once the
/// owner sits in the export block it will live in until the deleter runs. So
/// an owner that keeps its elements inline (an array, a `SmallVec`) is safe,
/// and a `Deref` that answers differently on each call is asked once.
fn export_owner<M, O, T>(
    owner: O,
    slice_of: impl FnOnce(&mut O) -> (*mut T, usize),
    shape: &[i64],
    strides: Option<&[i64]>,
    flags: u64,
) -> Result<Owned<M>, Error>
where
    M: ManagedAbi,
    O: Send + 'static,
    T: Element,
{
    let mut place = extent_of(shape, strides)?;
    let block = place_owner::<M, O, _>(owner, shape.len(), &GlobalBlocks)?;
    // SAFETY: the owner was written into the block, which does not move, and
    // nothing else refers to it: this borrow is the only one.
    let (base, len) = slice_of(unsafe { &mut (*block.as_ptr()).owner });
    if let Err(err) = place_in_buffer(&mut place, len) {
        // SAFETY: fresh from `place_owner`, never filled, not used again.
        unsafe { discard_block(block) };
        return Err(err);
    }
    // SAFETY: element `first` and every element the layout reaches from it lie
    // within the `len` elements at `base` (checked above), which the owner, now
    // in its final place in the block, keeps alive until the deleter drops it.
    Ok(unsafe { export_placed(block, base.wrapping_add(place.first), shape, strides, &place, flags) })
}

impl<M: ManagedAbi> Owned<M> {
    /// Exports a writable tensor over the elements of `owner` (a `Vec<T>`,
    /// `Box<[T]>`, or anything that derefs mutably to a slice).
    ///
    /// `strides` are in elements and may be negative; `None` means row-major.
    /// Element 0 is placed so that the lowest element the layout reaches is the
    /// first of the slice. The layout must stay inside the slice.
    ///
    /// ```
    /// use dlbridge::OwnedTensor;
    ///
    /// // The columns of a row-major 2x3 matrix, as a 3x2 tensor over the same Box.
    /// let data: Box<[u16]> = vec![0, 1, 2, 3, 4, 5].into_boxed_slice();
    /// let mut t = OwnedTensor::from_owner_mut(data, &[3, 2], Some(&[1, 3]))?;
    /// assert_eq!(t.view().strides(), &[1, 3]);
    /// assert!(!t.is_read_only());
    /// assert!(t.try_view_mut()?.try_as_slice_mut::<u16>().is_err()); // not row-major: no slice
    /// // A layout that reaches past the slice is refused.
    /// assert!(OwnedTensor::from_owner_mut(vec![0u16; 5], &[3, 2], Some(&[1, 3])).is_err());
    /// # Ok::<(), dlbridge::Error>(())
    /// ```
    pub fn from_owner_mut<O, T>(owner: O, shape: &[i64], strides: Option<&[i64]>) -> Result<Self, Error>
    where
        O: DerefMut<Target = [T]> + Send + 'static,
        T: Element,
    {
        let slice_of = |owner: &mut O| {
            let slice: &mut [T] = O::deref_mut(owner);
            (slice.as_mut_ptr(), slice.len())
        };
        export_owner(owner, slice_of, shape, strides, 0)
    }

    /// Exports a read-only tensor over the elements of `owner` (an `Arc<[T]>`,
    /// a memory map, ...). The tensor carries READ_ONLY.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use dlbridge::OwnedTensor;
    ///
    /// let shared: Arc<[f64]> = Arc::from(vec![1.0, 2.0, 3.0, 4.0]);
    /// let mut t = OwnedTensor::from_owner(Arc::clone(&shared), &[2, 2], None)?;
    /// assert!(t.is_read_only());
    /// assert_eq!(t.view().as_slice::<f64>(), Some(&shared[..]));
    /// assert!(t.try_view_mut().is_err()); // READ_ONLY: no writes
    /// # Ok::<(), dlbridge::Error>(())
    /// ```
    pub fn from_owner<O, T>(owner: O, shape: &[i64], strides: Option<&[i64]>) -> Result<Self, Error>
    where
        O: Deref<Target = [T]> + Send + 'static,
        T: Element,
    {
        let slice_of = |owner: &mut O| {
            let slice: &[T] = O::deref(owner);
            (slice.as_ptr().cast_mut(), slice.len())
        };
        export_owner(owner, slice_of, shape, strides, DLPACK_FLAG_BITMASK_READ_ONLY)
    }

    /// Exports a `Vec` as a writable row-major tensor of the given shape.
    ///
    /// ```
    /// use dlbridge::{DataType, OwnedTensor};
    ///
    /// let t = OwnedTensor::from_vec(vec![1i32, 2, 3, 4, 5, 6], &[2, 3])?;
    /// assert_eq!((t.view().shape(), t.view().dtype()), (&[2i64, 3][..], DataType::INT32));
    /// // The shape must hold exactly the Vec's elements.
    /// let err = OwnedTensor::from_vec(vec![0u8; 5], &[2, 3]).unwrap_err();
    /// assert_eq!(err.to_string(), "shape [2, 3] needs 6 elements, the data has 5");
    /// # Ok::<(), dlbridge::Error>(())
    /// ```
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[i64]) -> Result<Self, Error> {
        let needs = crate::layout::element_count(shape)?;
        if needs != data.len() {
            return Err(Error::ElementCount { shape: shape.to_vec(), needs, has: data.len() });
        }
        Self::from_owner_mut(data, shape, None)
    }
}

#[cfg(test)]
mod tests;
