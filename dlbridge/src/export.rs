//! Producer side: hand Rust-owned memory to DLPack consumers without copying.
//!
//! Each export makes one heap allocation holding the managed struct, the owner
//! and the shape and strides. Its deleter drops the owner and frees the block.
//! Exports follow the DLPack 1.2+ rules: strides are always filled when
//! `ndim > 0`, shape and strides are NULL when `ndim == 0`, and `data` is NULL
//! when the tensor has no elements.

use core::alloc::Layout;
use core::ffi::c_void;
use core::ops::{Deref, DerefMut};
use core::ptr::NonNull;

use crate::dtype::DataType;
use crate::element::Element;
use crate::error::Error;
use crate::ffi::{DLTensor, DLPACK_FLAG_BITMASK_READ_ONLY};
use crate::owned::{Owned, ManagedAbi};
use crate::layout::{element_count, extent_of, place_in_buffer, row_major_strides_into, Placement, Small, MAX_NDIM};
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

/// The single allocation behind an export: the managed struct first, so that a
/// pointer to it is a pointer to the block.
#[repr(C)]
pub(crate) struct ExportBlock<M, O> {
    managed: M,
    pub(crate) owner: O,
    ndim: usize,
    // followed by `2 * ndim` i64: shape, then strides
}

// Cannot fire: ndim <= MAX_NDIM (checked by every caller), so the block is a
// few hundred bytes plus the owner's size, far from any layout limit.
#[allow(clippy::expect_used)]
fn block_layout<M, O>(ndim: usize) -> (Layout, usize) {
    let head = Layout::new::<ExportBlock<M, O>>();
    // Cannot fail: ndim <= MAX_NDIM, so the array is at most 1 KiB.
    let dims = Layout::array::<i64>(2 * ndim).expect("small array layout");
    let (layout, offset) = head.extend(dims).expect("small block layout");
    (layout.pad_to_align(), offset)
}

unsafe extern "C" fn delete_block<M: ManagedAbi, O>(managed: *mut M) {
    let block = managed.cast::<ExportBlock<M, O>>();
    // SAFETY: `managed` is the first field of a block made by `export_raw` with
    // these M and O; the deleter runs once, so the owner is dropped once.
    unsafe {
        let (layout, _) = block_layout::<M, O>((*block).ndim);
        core::ptr::drop_in_place(core::ptr::addr_of_mut!((*block).owner));
        std::alloc::dealloc(block.cast(), layout);
    }
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
    let block: NonNull<M> = write_block(owner, data, layout, numel, flags)?;
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
    let layout = RawLayout {
        dtype: view.dtype(),
        device,
        shape: view.shape(),
        strides: Some(view.strides()),
        byte_offset: 0,
    };
    let block: NonNull<M> = write_block(owner, view.as_ptr().cast_mut(), layout, view.len(), flags)?;
    // SAFETY: the block was just written with the view's layout, so the view's
    // validation carries over; the caller keeps the memory valid until the
    // owner, and so the block, is dropped.
    unsafe { Ok(Owned::from_validated(block, view.relabelled(device)).with_export_flags(flags)) }
}

/// Allocates the one block of an export and moves `owner` into it, its final
/// place: a pointer into an owner that keeps its elements inline is taken only
/// after this. On allocation failure the owner is dropped.
pub(crate) fn place_owner<M: ManagedAbi, O: Send + 'static>(owner: O, ndim: usize) -> Result<NonNull<ExportBlock<M, O>>, Error> {
    let (block_layout, _) = block_layout::<M, O>(ndim);
    // SAFETY: the layout is non-zero sized (it holds the managed struct).
    let raw = unsafe { std::alloc::alloc(block_layout) };
    let block = NonNull::new(raw.cast::<ExportBlock<M, O>>()).ok_or(Error::AllocationFailed { bytes: block_layout.size() })?;
    // SAFETY: freshly allocated with room for the head; written once.
    unsafe {
        core::ptr::addr_of_mut!((*block.as_ptr()).owner).write(owner);
        core::ptr::addr_of_mut!((*block.as_ptr()).ndim).write(ndim);
    }
    Ok(block)
}

/// Drops the owner of a block whose managed struct was never written, and frees it.
///
/// # Safety
/// `block` came from [`place_owner`] and is not used afterwards.
unsafe fn discard_block<M: ManagedAbi, O>(block: NonNull<ExportBlock<M, O>>) {
    // SAFETY: the owner and ndim were written by `place_owner`; the block is freed once.
    unsafe {
        let (layout, _) = block_layout::<M, O>((*block.as_ptr()).ndim);
        core::ptr::drop_in_place(core::ptr::addr_of_mut!((*block.as_ptr()).owner));
        std::alloc::dealloc(block.as_ptr().cast(), layout);
    }
}

/// Writes the managed struct, shape and strides of a block from [`place_owner`].
/// `layout` must have the block's ndim, matching strides, and `numel` elements.
///
/// # Safety
/// `block` came from [`place_owner`] with `layout.shape.len()` axes and its
/// managed struct is not written yet.
unsafe fn fill_block<M: ManagedAbi, O: Send + 'static>(
    block: NonNull<ExportBlock<M, O>>,
    data: *mut c_void,
    layout: RawLayout<'_>,
    numel: usize,
    flags: u64,
) -> NonNull<M> {
    let ndim = layout.shape.len();
    let (_, dims_offset) = block_layout::<M, O>(ndim);
    let raw = block.as_ptr().cast::<u8>();
    let (shape_ptr, strides_ptr) = if ndim == 0 {
        (core::ptr::null_mut(), core::ptr::null_mut())
    } else {
        // SAFETY: the block has room for 2 * ndim i64 at `dims_offset`, aligned for i64.
        unsafe {
            let dims = raw.add(dims_offset).cast::<i64>();
            core::ptr::copy_nonoverlapping(layout.shape.as_ptr(), dims, ndim);
            let strides = dims.add(ndim);
            match layout.strides {
                Some(s) => core::ptr::copy_nonoverlapping(s.as_ptr(), strides, ndim),
                None => {
                    // Saturated strides can only belong to an empty tensor,
                    // where they are never used.
                    row_major_strides_into(layout.shape, |axis, stride| strides.add(axis).write(stride));
                }
            }
            (dims, strides)
        }
    };
    let dl_tensor = DLTensor {
        data: if numel == 0 { core::ptr::null_mut() } else { data },
        device: layout.device,
        ndim: ndim as i32,
        dtype: layout.dtype,
        shape: shape_ptr,
        strides: strides_ptr,
        byte_offset: if numel == 0 { 0 } else { layout.byte_offset },
    };
    let managed = M::assemble(dl_tensor, raw.cast(), delete_block::<M, O>, flags);
    // SAFETY: the head has room for the struct, written once before anyone reads it.
    unsafe { core::ptr::addr_of_mut!((*block.as_ptr()).managed).write(managed) };
    block.cast()
}

/// Allocates and fills the one block of an export of memory that does not
/// live inside `owner` itself.
fn write_block<M: ManagedAbi, O: Send + 'static>(
    owner: O,
    data: *mut c_void,
    layout: RawLayout<'_>,
    numel: usize,
    flags: u64,
) -> Result<NonNull<M>, Error> {
    let block = place_owner::<M, O>(owner, layout.shape.len())?;
    // SAFETY: a block fresh from `place_owner` with this ndim.
    Ok(unsafe { fill_block(block, data, layout, numel, flags) })
}

/// Exports a layout already proven to lie inside a live allocation of `T`s,
/// building its view from that proof instead of validating it again.
///
/// # Safety
/// `block` came from [`place_owner`] with `shape.len()` axes, and every element
/// `place` reaches from `element0` lies in an allocation that the block's owner
/// keeps alive and in place, writable unless `flags` has READ_ONLY.
pub(crate) unsafe fn export_placed<M: ManagedAbi, O: Send + 'static, T: Element>(
    block: NonNull<ExportBlock<M, O>>,
    element0: *mut T,
    shape: &[i64],
    strides: Option<&[i64]>,
    place: &Placement,
    flags: u64,
) -> Owned<M> {
    let layout = RawLayout { dtype: T::DTYPE, device: Device::CPU, shape, strides, byte_offset: 0 };
    // SAFETY: forwarded from the caller.
    let block: NonNull<M> = unsafe { fill_block(block, element0.cast(), layout, place.numel, flags) };
    let size = core::mem::size_of::<T>() as isize;
    let strides = match strides {
        Some(strides) => Small::from_slice(strides),
        None => {
            let mut computed = Small::from_fn(shape.len(), |_| 0);
            row_major_strides_into(shape, |axis, stride| computed.as_mut_slice()[axis] = stride);
            computed
        }
    };
    let extent = (place.lo as isize * size, (place.hi as isize + 1) * size);
    // SAFETY: the block was just written with this layout; the extent lies in a
    // live Rust allocation (the caller's proof), so it fits the address space.
    unsafe {
        let element0 = if place.numel == 0 { core::ptr::null() } else { element0.cast_const().cast() };
        let view = TensorView::from_placed(element0, shape, strides.as_slice(), T::DTYPE, place.numel, extent);
        Owned::from_validated(block, view).with_export_flags(flags)
    }
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
    let block = place_owner::<M, O>(owner, shape.len())?;
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
    /// assert!(OwnedTensor::from_vec(vec![0u8; 5], &[2, 3]).is_err());
    /// # Ok::<(), dlbridge::Error>(())
    /// ```
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[i64]) -> Result<Self, Error> {
        Self::from_owner_mut(data, shape, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::DLManagedTensorVersioned;
    use crate::{OwnedLegacyTensor, OwnedTensor};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Counted(Vec<f32>, Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }
    impl Deref for Counted {
        type Target = [f32];
        fn deref(&self) -> &[f32] {
            &self.0
        }
    }
    impl DerefMut for Counted {
        fn deref_mut(&mut self) -> &mut [f32] {
            &mut self.0
        }
    }

    #[test]
    fn vec_export_fills_strides_and_drops_owner_once() {
        let drops = Arc::new(AtomicUsize::new(0));
        let t = OwnedTensor::from_owner_mut(Counted(vec![1.0; 6], drops.clone()), &[2, 3], None).unwrap();
        let raw = t.as_raw();
        assert_eq!(raw.version, crate::ffi::DLPackVersion::CURRENT);
        assert!(!raw.dl_tensor.strides.is_null());
        assert_eq!(t.view().strides(), &[3, 1]);
        assert_eq!(t.view().as_slice::<f32>().unwrap(), &[1.0; 6]);
        assert!(!t.is_read_only());
        drop(t);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn negative_strides_place_element_zero_at_the_end() {
        let t = OwnedTensor::from_vec((0..4).map(|v| v as f32).collect(), &[4]).unwrap();
        let first = t.view().as_ptr();
        drop(t);
        let _ = first;
        let t = OwnedTensor::from_owner_mut(vec![0i32, 1, 2, 3], &[4], Some(&[-1])).unwrap();
        // SAFETY: element 0 of a 4-element i32 tensor is in bounds.
        assert_eq!(unsafe { *t.view().as_ptr().cast::<i32>() }, 3);
        assert!(t.view().as_slice::<i32>().is_none());
    }

    #[test]
    fn layouts_outside_the_buffer_are_refused() {
        let drops = Arc::new(AtomicUsize::new(0));
        let err = OwnedTensor::from_owner_mut(Counted(vec![0.0; 5], drops.clone()), &[2, 3], None).unwrap_err();
        assert!(matches!(err, Error::OutOfBounds { highest: 5, len: 5, .. }), "{err}");
        assert_eq!(drops.load(Ordering::SeqCst), 1, "the owner is dropped on error");
        let err = OwnedTensor::from_vec(vec![0u8; 4], &[2, -2]).unwrap_err();
        assert!(matches!(err, Error::NegativeDimension { axis: 1, size: -2 }));
        let err = OwnedTensor::from_owner_mut(vec![0u8; 4], &[2, 2], Some(&[1])).unwrap_err();
        assert!(matches!(err, Error::StridesLength { expected: 2, found: 1 }));
    }

    #[test]
    fn empty_and_scalar_follow_the_1_2_rules() {
        let t = OwnedTensor::from_vec(Vec::<f64>::new(), &[0, 3]).unwrap();
        assert!(t.as_raw().dl_tensor.data.is_null());
        assert_eq!(t.view().strides(), &[3, 1]);
        let s = OwnedTensor::from_vec(vec![7i64], &[]).unwrap();
        assert!(s.as_raw().dl_tensor.shape.is_null() && s.as_raw().dl_tensor.strides.is_null());
        assert_eq!(s.view().as_slice::<i64>(), Some(&[7][..]));
    }

    #[test]
    fn shared_owner_is_read_only() {
        let shared: Arc<[u16]> = Arc::from(vec![1u16, 2, 3]);
        let mut t = OwnedTensor::from_owner(shared.clone(), &[3], None).unwrap();
        assert!(t.is_read_only());
        assert!(matches!(t.try_view_mut(), Err(Error::ReadOnly)));
        assert_eq!(t.view().as_slice::<u16>(), Some(&[1, 2, 3][..]));
        drop(t);
        assert_eq!(Arc::strong_count(&shared), 1);
    }

    #[test]
    fn legacy_export_round_trips() {
        let mut t = OwnedLegacyTensor::from_vec(vec![1u8, 2, 3, 4], &[2, 2]).unwrap();
        assert_eq!(t.version(), None);
        t.view_mut().unwrap().as_slice_mut::<u8>().unwrap()[0] = 9;
        assert_eq!(t.view().as_slice::<u8>().unwrap(), &[9, 2, 3, 4]);
        let raw = t.into_raw();
        // SAFETY: `raw` came from `into_raw` and is owned again here.
        let back = unsafe { OwnedLegacyTensor::from_raw(raw) }.unwrap();
        assert_eq!(back.view().shape(), &[2, 2]);
    }

    #[test]
    fn export_view_matches_a_fresh_validation() {
        let src = OwnedTensor::from_owner_mut((0..12).collect::<Vec<i32>>(), &[3, 2], Some(&[-4, 2])).unwrap();
        // SAFETY: `src` owns the data and outlives the export.
        let exported: OwnedTensor = unsafe { export_view((), src.view(), Device::CPU, 0) }.unwrap();
        let (shape, strides, range) = (exported.view().shape().to_vec(), exported.view().strides().to_vec(), exported.view().byte_range());
        // SAFETY: an owned tensor from `into_raw`, validated again from scratch.
        let again = unsafe { OwnedTensor::from_raw(exported.into_raw()) }.unwrap();
        assert_eq!((again.view().shape(), again.view().strides()), (&shape[..], &strides[..]));
        assert_eq!(again.view().byte_range(), range);
        assert_eq!(again.view().byte_range(), src.view().byte_range());
        assert_eq!(again.view().as_ptr(), src.view().as_ptr());
    }

    #[test]
    fn block_is_one_allocation_per_ndim() {
        let (small, _) = block_layout::<DLManagedTensorVersioned, Vec<u8>>(0);
        let (big, _) = block_layout::<DLManagedTensorVersioned, Vec<u8>>(4);
        assert_eq!(big.size() - small.size(), 64);
    }
}
