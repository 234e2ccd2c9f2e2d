//! Safe-API soundness: hostile owners, padded copies, allocation failure.
//! Run under Miri by `./dev miri`; each test would read freed or wrong memory
//! (and Miri would say so) if the property it names did not hold.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};

use dlbridge::ffi::{DLTensor, DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED};
use dlbridge::{to_contiguous, zeros, DataType, DataTypeCode, Device, Error, OwnedTensor, TensorView};

/// An owner that keeps its elements inline: moving it moves the data.
struct Inline([f32; 4]);

impl Deref for Inline {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.0
    }
}

impl DerefMut for Inline {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.0
    }
}

#[test]
fn inline_owner_is_read_where_it_finally_lives() {
    let t = OwnedTensor::from_owner_mut(Inline([1.0, 2.0, 3.0, 0xdead as f32]), &[4], None).unwrap();
    // Moving the tensor handle must not matter either: the owner lives in the block.
    let moved = Box::new(t);
    assert_eq!(moved.view().as_slice::<f32>(), Some(&[1.0, 2.0, 3.0, 0xdead as f32][..]));
    let ro = OwnedTensor::from_owner(Inline([5.0; 4]), &[2, 2], None).unwrap();
    assert_eq!(ro.view().as_slice::<f32>(), Some(&[5.0; 4][..]));
}

#[test]
fn inline_owner_with_negative_strides() {
    let mut t = OwnedTensor::from_owner_mut(Inline([0.0, 1.0, 2.0, 3.0]), &[4], Some(&[-1])).unwrap();
    // SAFETY: element 0 of a 4-element tensor is in bounds.
    assert_eq!(unsafe { *t.view().as_ptr().cast::<f32>() }, 3.0);
    let mut vm = t.try_view_mut().unwrap();
    assert!(vm.as_slice_mut::<f32>().is_none(), "not C-contiguous");
}

/// A `Deref` that answers with a shorter slice on every call after the first.
struct Shrinking {
    data: Vec<u8>,
    calls: Cell<usize>,
}

impl Deref for Shrinking {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let n = self.calls.get();
        self.calls.set(n + 1);
        &self.data[..self.data.len().saturating_sub(n * 4)]
    }
}

#[test]
fn lying_deref_is_asked_once() {
    let owner = Shrinking { data: vec![7u8; 8], calls: Cell::new(0) };
    let t = OwnedTensor::from_owner(owner, &[8], None).unwrap();
    assert_eq!(t.view().as_slice::<u8>(), Some(&[7u8; 8][..]));
    // A lie that shrinks before the export asks is caught by the bounds check.
    let owner = Shrinking { data: vec![7u8; 8], calls: Cell::new(1) };
    let err = OwnedTensor::from_owner(owner, &[8], None).unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { len: 4, .. }), "{err}");
}

#[test]
fn reborrowed_view_reads_what_was_written() {
    let mut t = OwnedTensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    let mut vm = t.try_view_mut().unwrap();
    vm.as_slice_mut::<f32>().unwrap()[0] = 9.0;
    assert_eq!(vm.view().as_slice::<f32>().unwrap()[0], 9.0);
    vm.as_slice_mut::<f32>().unwrap()[1] = 8.0;
    let done = vm.into_view();
    assert_eq!(done.as_slice::<f32>(), Some(&[9.0, 8.0, 1.0, 1.0][..]));
}

#[test]
fn a_writable_view_given_up_writes_the_owner() {
    let mut t = OwnedTensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    // SAFETY: a C-contiguous float32 view of an owner that outlives the slice.
    let slice = unsafe { t.try_view_mut().unwrap().into_slice_mut_unchecked::<f32>() };
    slice[3] = 7.0;
    assert_eq!(t.view().as_slice::<f32>(), Some(&[1.0, 1.0, 1.0, 7.0][..]));
    let mut empty = OwnedTensor::from_vec(Vec::<f32>::new(), &[0]).unwrap();
    // SAFETY: as above; no elements.
    assert!(unsafe { empty.try_view_mut().unwrap().into_slice_mut_unchecked::<f32>() }.is_empty());
}

fn fp4() -> DataType {
    DataType::new(DataTypeCode::FLOAT4_E2M1FN, 4, 1)
}

#[test]
fn copies_of_padded_sub_byte_stay_padded() {
    let mut bytes: Vec<u8> = (0u8..6).collect();
    let (mut shape, mut strides) = ([2i64, 3], [3i64, 1]);
    let dl = DLTensor {
        data: bytes.as_mut_ptr().cast(),
        device: Device::CPU,
        ndim: 2,
        dtype: fp4(),
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: 0,
    };
    // SAFETY: the arrays and the six bytes live for the whole test.
    let view = unsafe { TensorView::from_dltensor(&dl, true) }.unwrap();
    let copy: OwnedTensor = to_contiguous(&view).unwrap();
    assert!(copy.is_subbyte_padded());
    assert_eq!(copy.flags() & DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED);
    assert_eq!(copy.view().as_bytes(), Some(&[0u8, 1, 2, 3, 4, 5][..]));
    // Transposed: the strided path copies one padded byte per element.
    let (mut shape, mut strides) = ([3i64, 2], [1i64, 3]);
    let dl = DLTensor { shape: shape.as_mut_ptr(), strides: strides.as_mut_ptr(), ..dl };
    // SAFETY: as above.
    let view = unsafe { TensorView::from_dltensor(&dl, true) }.unwrap();
    let copy: OwnedTensor = to_contiguous(&view).unwrap();
    assert!(copy.is_subbyte_padded());
    assert_eq!(copy.view().as_bytes(), Some(&[0u8, 3, 1, 4, 2, 5][..]));
    // A legacy tensor cannot say it is padded: refused rather than mislabelled.
    assert!(matches!(to_contiguous::<dlbridge::ffi::DLManagedTensor>(&view), Err(Error::UnsupportedDtype { .. })));
}

#[test]
#[cfg_attr(miri, ignore = "Miri stops on an allocation larger than its memory instead of failing it")]
fn failed_allocations_are_errors() {
    let err = zeros::<dlbridge::ffi::DLManagedTensorVersioned>(DataType::UINT8, &[1 << 50]).unwrap_err();
    assert!(matches!(err, Error::AllocationFailed { .. }), "{err}");
    let mut one = 1.0f64;
    let (mut shape, mut strides) = ([1i64 << 22, 1 << 22], [0i64, 0]);
    let dl = DLTensor {
        data: (&mut one as *mut f64).cast(),
        device: Device::CPU,
        ndim: 2,
        dtype: DataType::FLOAT64,
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: 0,
    };
    // SAFETY: a broadcast of one live f64.
    let view = unsafe { TensorView::from_dltensor(&dl, false) }.unwrap();
    let err = to_contiguous::<dlbridge::ffi::DLManagedTensorVersioned>(&view).unwrap_err();
    assert!(matches!(err, Error::AllocationFailed { .. }), "{err}");
}

#[test]
fn read_only_exports_stay_read_only_whatever_the_abi() {
    use std::sync::Arc;
    let shared: Arc<[u32]> = Arc::from(vec![1u32, 2, 3, 4]);
    let mut legacy = dlbridge::OwnedLegacyTensor::from_owner(shared.clone(), &[4], None).unwrap();
    assert!(legacy.is_read_only(), "the legacy struct cannot say so, the owner remembers");
    assert!(matches!(legacy.try_view_mut(), Err(Error::ReadOnly)));
    static RODATA: [u32; 4] = [1, 2, 3, 4];
    let mut legacy = dlbridge::OwnedLegacyTensor::from_owner(&RODATA[..], &[4], None).unwrap();
    assert!(matches!(legacy.try_view_mut(), Err(Error::ReadOnly)));
    let mut legacy = dlbridge::OwnedLegacyTensor::from_vec(vec![1u8], &[1]).unwrap();
    legacy.mark_read_only();
    assert!(legacy.view_mut().is_none());
    assert_eq!(shared[0], 1);
}

#[test]
fn padded_flag_means_nothing_for_whole_byte_dtypes() {
    let mut value = [1.0f32];
    let dl = DLTensor {
        data: value.as_mut_ptr().cast(),
        device: Device::CPU,
        ndim: 0,
        dtype: DataType::FLOAT32,
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    // SAFETY: one live f32, 0-d.
    let view = unsafe { TensorView::from_dltensor(&dl, true) }.unwrap();
    assert!(!view.is_subbyte_padded());
}

#[cfg(feature = "ndarray")]
#[test]
fn shared_arc_array_legacy_export_is_read_only() {
    let a = ndarray::ArcArray::from_vec(vec![1.0f32, 2.0]);
    let other = a.clone();
    let mut t = dlbridge::OwnedLegacyTensor::from_arc_array(a).unwrap();
    assert!(matches!(t.try_view_mut(), Err(Error::ReadOnly)));
    assert_eq!(other[0], 1.0);
}

#[test]
fn aliased_tensors_need_a_proof_of_exclusion_to_write_or_read() {
    let mut t = OwnedTensor::from_vec(vec![1u8, 2, 3], &[3]).unwrap();
    t.mark_aliased();
    assert!(t.is_aliased() && t.view().is_aliased());
    assert!(matches!(t.try_view_mut(), Err(Error::Aliased)));
    // Every typed read of an aliased view refuses; the layout stays readable.
    assert_eq!(t.view().try_as_bytes(), Err(Error::Aliased));
    assert_eq!(t.view().try_as_slice::<u8>(), Err(Error::Aliased));
    assert!(matches!(to_contiguous::<dlbridge::ffi::DLManagedTensorVersioned>(t.view()), Err(Error::Aliased)));
    assert_eq!((t.view().shape(), t.view().len()), (&[3i64][..], 3));
    // SAFETY: nothing else reaches this Vec: the test owns it alone.
    let mut view = unsafe { t.try_view_mut_unchecked() }.unwrap();
    view.as_slice_mut::<u8>().unwrap()[0] = 9;
    // Reads through the mutable view are proven exclusive already.
    assert_eq!(view.view().as_slice::<u8>(), Some(&[9u8, 2, 3][..]));
    // SAFETY: as above: no other path writes the Vec.
    let read = unsafe { t.view_unchecked() };
    assert_eq!(read.as_slice::<u8>(), Some(&[9u8, 2, 3][..]));
    assert!(!read.is_aliased() && t.view().is_aliased());
}

/// A producer that rewrites its shape and strides in place after export, as
/// torch's `unsqueeze_`, `t_` and `as_strided_` do, then frees them: the view
/// keeps what it validated, and reads or copies nothing beyond it.
#[test]
fn views_keep_their_own_shape_and_strides() {
    let data: Vec<f32> = (0..8).map(|v| v as f32).collect();
    for ndim in [1usize, 8, 9, 64] {
        let mut shape = vec![1i64; ndim];
        let mut strides = vec![1i64; ndim];
        shape[ndim - 1] = 4;
        let dl = DLTensor {
            data: data.as_ptr().cast_mut().cast(),
            device: Device::CPU,
            ndim: ndim as i32,
            dtype: DataType::FLOAT32,
            shape: shape.as_mut_ptr(),
            strides: strides.as_mut_ptr(),
            byte_offset: 0,
        };
        // SAFETY: `dl` describes four live floats; shape and strides are read now.
        let view = unsafe { TensorView::from_dltensor(&dl, false) }.unwrap();
        // The producer now claims twice the elements at twice the stride, then
        // frees its arrays: a view that kept pointers would read freed memory
        // and copy 8 elements' worth into a 4-element buffer.
        shape[ndim - 1] = 8;
        strides[ndim - 1] = 2;
        drop((shape, strides));
        assert_eq!(view.shape()[ndim - 1], 4);
        assert_eq!(view.strides()[ndim - 1], 1);
        assert_eq!((view.len(), view.nbytes()), (4, 16));
        let copy: OwnedTensor = to_contiguous(&view).unwrap();
        assert_eq!(copy.view().as_slice::<f32>(), Some(&[0.0, 1.0, 2.0, 3.0][..]));
    }
}

/// Shape and strides are read unaligned: a C producer's misaligned arrays
/// are data, not undefined behaviour.
#[test]
fn misaligned_shape_and_strides_are_read() {
    let data = [7u8; 6];
    let mut words = [0u8; 8 * 4 + 1];
    words[1..9].copy_from_slice(&2i64.to_ne_bytes());
    words[9..17].copy_from_slice(&3i64.to_ne_bytes());
    words[17..25].copy_from_slice(&3i64.to_ne_bytes());
    words[25..33].copy_from_slice(&1i64.to_ne_bytes());
    let base = words.as_mut_ptr();
    let dl = DLTensor {
        data: data.as_ptr().cast_mut().cast(),
        device: Device::CPU,
        ndim: 2,
        dtype: DataType::UINT8,
        shape: base.wrapping_add(1).cast(),
        strides: base.wrapping_add(17).cast(),
        byte_offset: 0,
    };
    // SAFETY: the arrays hold 2 readable i64 each (misaligned), the data 6 bytes.
    let view = unsafe { TensorView::from_dltensor(&dl, false) }.unwrap();
    assert_eq!((view.shape(), view.strides()), (&[2i64, 3][..], &[3i64, 1][..]));
}
