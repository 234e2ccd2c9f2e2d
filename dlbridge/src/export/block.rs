//! The one allocation behind an export: the managed struct, the owner, then
//! the shape and strides; its deleter drops the owner and frees the block.

use core::alloc::Layout;
use core::ffi::c_void;
use core::marker::PhantomData;
use core::ptr::NonNull;

use super::allocator::{BlockAllocator, GlobalBlocks};
use super::RawLayout;
use crate::element::Element;
use crate::error::Error;
use crate::ffi::DLTensor;
use crate::layout::{row_major_strides_into, Placement, Small};
use crate::managed_abi::ManagedAbi;
use crate::owned::Owned;
use crate::view::TensorView;
use crate::Device;

/// The single allocation behind an export: the managed struct first, so that a
/// pointer to it is a pointer to the block. `A` allocated it and frees it.
#[repr(C)]
pub(crate) struct ExportBlock<M, O, A = GlobalBlocks> {
    managed: M,
    pub(crate) owner: O,
    ndim: usize,
    allocator: PhantomData<fn() -> A>,
    // followed by `2 * ndim` i64: shape, then strides
}

// Cannot fire: ndim <= MAX_NDIM (checked by every caller), so the block is a
// few hundred bytes plus the owner's size, far from any layout limit.
#[allow(clippy::expect_used)]
pub(super) fn block_layout<M, O, A>(ndim: usize) -> (Layout, usize) {
    let head = Layout::new::<ExportBlock<M, O, A>>();
    // Cannot fail: ndim <= MAX_NDIM, so the array is at most 1 KiB.
    let dims = Layout::array::<i64>(2 * ndim).expect("small array layout");
    let (layout, offset) = head.extend(dims).expect("small block layout");
    (layout.pad_to_align(), offset)
}

/// Drops the owner of a block and frees it, through its allocator.
///
/// # Safety
/// `block` came from [`place_owner`] (owner and ndim written) and is not used afterwards.
unsafe fn release_block<M, O, A: BlockAllocator>(block: *mut ExportBlock<M, O, A>) {
    // SAFETY: per the caller; `release` drops the owner once, then frees.
    unsafe {
        let (layout, _) = block_layout::<M, O, A>((*block).ndim);
        A::release(block.cast(), layout, || core::ptr::drop_in_place(core::ptr::addr_of_mut!((*block).owner)));
    }
}

unsafe extern "C" fn delete_block<M: ManagedAbi, O, A: BlockAllocator>(managed: *mut M) {
    // SAFETY: `managed` is the first field of a block made by `fill_block` with
    // these M, O and A; the deleter runs once, so the owner is dropped once.
    unsafe { release_block(managed.cast::<ExportBlock<M, O, A>>()) }
}

/// Allocates the one block of an export from `allocator` and moves `owner`
/// into it, its final place: a pointer into an owner that keeps its elements
/// inline is taken only after this. On allocation failure the owner is dropped.
pub(crate) fn place_owner<M: ManagedAbi, O: Send + 'static, A: BlockAllocator>(
    owner: O,
    ndim: usize,
    allocator: &A,
) -> Result<NonNull<ExportBlock<M, O, A>>, Error> {
    let (block_layout, _) = block_layout::<M, O, A>(ndim);
    let raw = allocator.allocate(block_layout);
    let block = NonNull::new(raw.cast::<ExportBlock<M, O, A>>()).ok_or(Error::AllocationFailed { bytes: block_layout.size() })?;
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
pub(super) unsafe fn discard_block<M: ManagedAbi, O, A: BlockAllocator>(block: NonNull<ExportBlock<M, O, A>>) {
    // SAFETY: forwarded from the caller.
    unsafe { release_block(block.as_ptr()) }
}

/// Writes the managed struct, shape and strides of a block from [`place_owner`].
/// `layout` must have the block's ndim, matching strides, and `numel` elements.
///
/// # Safety
/// `block` came from [`place_owner`] with `layout.shape.len()` axes and its
/// managed struct is not written yet.
unsafe fn fill_block<M: ManagedAbi, O: Send + 'static, A: BlockAllocator>(
    block: NonNull<ExportBlock<M, O, A>>,
    data: *mut c_void,
    layout: RawLayout<'_>,
    numel: usize,
    flags: u64,
) -> NonNull<M> {
    let ndim = layout.shape.len();
    let (_, dims_offset) = block_layout::<M, O, A>(ndim);
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
    let managed = M::assemble(dl_tensor, raw.cast(), delete_block::<M, O, A>, flags);
    // SAFETY: the head has room for the struct, written once before anyone reads it.
    unsafe { core::ptr::addr_of_mut!((*block.as_ptr()).managed).write(managed) };
    block.cast()
}

/// Allocates and fills the one block of an export of memory that does not
/// live inside `owner` itself.
pub(super) fn write_block<M: ManagedAbi, O: Send + 'static, A: BlockAllocator>(
    owner: O,
    data: *mut c_void,
    layout: RawLayout<'_>,
    numel: usize,
    flags: u64,
    allocator: &A,
) -> Result<NonNull<M>, Error> {
    let block = place_owner::<M, O, A>(owner, layout.shape.len(), allocator)?;
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
    block: NonNull<ExportBlock<M, O, GlobalBlocks>>,
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

