//! Exports of Rust memory: owners dropped once, layouts refused, the 1.2 rules.

use super::block::block_layout;
use super::*;
use crate::error::Error;
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
    for len in [5, 7] {
        let err = OwnedTensor::from_vec(vec![0u8; len], &[2, 3]).unwrap_err();
        assert!(matches!(err, Error::ElementCount { needs: 6, has, .. } if has == len), "{err}");
    }
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
    let (small, _) = block_layout::<DLManagedTensorVersioned, Vec<u8>, GlobalBlocks>(0);
    let (big, _) = block_layout::<DLManagedTensorVersioned, Vec<u8>, GlobalBlocks>(4);
    assert_eq!(big.size() - small.size(), 64);
}

/// Blocks from the global allocator, counted; or none at all.
struct CountingBlocks {
    refuse: bool,
}
static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static RELEASED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: the global allocator's blocks, released after the owner's drop.
unsafe impl BlockAllocator for CountingBlocks {
    fn allocate(&self, layout: core::alloc::Layout) -> *mut u8 {
        if self.refuse {
            return core::ptr::null_mut();
        }
        ALLOCATED.fetch_add(1, Ordering::SeqCst);
        GlobalBlocks.allocate(layout)
    }

    unsafe fn release(block: *mut u8, layout: core::alloc::Layout, drop_owner: impl FnOnce()) {
        RELEASED.fetch_add(1, Ordering::SeqCst);
        // SAFETY: forwarded; the block came from GlobalBlocks.
        unsafe { GlobalBlocks::release(block, layout, drop_owner) }
    }
}

#[test]
fn export_view_in_uses_the_allocator_given_and_drops_the_owner_once() {
    let src = OwnedTensor::from_owner_mut((0..6).collect::<Vec<i32>>(), &[2, 3], None).unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let owner = Counted(Vec::new(), drops.clone());
    // SAFETY: `src` owns the data and outlives the export.
    let raw: NonNull<DLManagedTensorVersioned> =
        unsafe { export_view_in(owner, src.view(), Device::CPU, 0, &CountingBlocks { refuse: false }) }.unwrap();
    assert_eq!(ALLOCATED.load(Ordering::SeqCst), 1);
    // SAFETY: a fresh export, owned here, validated from scratch.
    let back = unsafe { OwnedTensor::from_raw(raw.as_ptr()) }.unwrap();
    assert_eq!(back.view().try_as_slice::<i32>().unwrap(), &[0, 1, 2, 3, 4, 5]);
    assert_eq!((drops.load(Ordering::SeqCst), RELEASED.load(Ordering::SeqCst)), (0, 0));
    drop(back);
    assert_eq!((drops.load(Ordering::SeqCst), RELEASED.load(Ordering::SeqCst)), (1, 1));

    // No block: an error naming the size, and the owner dropped once, not released.
    let owner = Counted(Vec::new(), drops.clone());
    // SAFETY: as above.
    let refused = unsafe { export_view_in::<DLManagedTensorVersioned, _, _>(owner, src.view(), Device::CPU, 0, &CountingBlocks { refuse: true }) };
    assert!(matches!(refused, Err(Error::AllocationFailed { .. })));
    assert_eq!((drops.load(Ordering::SeqCst), RELEASED.load(Ordering::SeqCst)), (2, 1));
}

#[test]
fn the_global_allocator_refuses_a_zero_sized_block() {
    assert!(GlobalBlocks.allocate(core::alloc::Layout::new::<()>()).is_null());
}
