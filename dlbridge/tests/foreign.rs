//! Foreign tensors as a C producer might send them: well-formed, malformed and
//! hostile. Every malformed case must be an `Err` naming the problem, and every
//! owned tensor's deleter must run exactly once.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dlbridge::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use dlbridge::{DataType, DataTypeCode, Device, DeviceType, Error, OwnedLegacyTensor, OwnedTensor, TensorView};
use proptest::prelude::*;

/// A hand-built producer: the managed struct, its shape/strides and a counter
/// the deleter bumps.
struct Producer {
    managed: DLManagedTensorVersioned,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    deleted: Arc<AtomicUsize>,
}

unsafe extern "C" fn count_delete(m: *mut DLManagedTensorVersioned) {
    // SAFETY: manager_ctx points at the Producer's counter, which the test keeps alive.
    let deleted = unsafe { &*((*m).manager_ctx as *const AtomicUsize) };
    deleted.fetch_add(1, Ordering::SeqCst);
}

impl Producer {
    fn new(data: *mut c_void, dtype: DataType, shape: &[i64], strides: Option<&[i64]>) -> Box<Self> {
        let mut p = Box::new(Producer {
            managed: DLManagedTensorVersioned {
                version: DLPackVersion::CURRENT,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(count_delete),
                flags: 0,
                dl_tensor: DLTensor {
                    data,
                    device: Device::CPU,
                    ndim: shape.len() as i32,
                    dtype,
                    shape: std::ptr::null_mut(),
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                },
            },
            shape: shape.to_vec(),
            strides: strides.map(<[i64]>::to_vec),
            deleted: Arc::new(AtomicUsize::new(0)),
        });
        p.managed.manager_ctx = Arc::as_ptr(&p.deleted).cast_mut().cast();
        p.managed.dl_tensor.shape = p.shape.as_mut_ptr();
        if let Some(s) = p.strides.as_mut() {
            p.managed.dl_tensor.strides = s.as_mut_ptr();
        }
        p
    }

    /// Imports through `from_raw` and returns the outcome and the deleter count.
    fn import(&mut self) -> (Result<Vec<i64>, Error>, usize) {
        // SAFETY: the struct and its arrays live in `self` for the whole call.
        let result = unsafe { OwnedTensor::from_raw(&mut self.managed) }.map(|t| t.view().strides().to_vec());
        (result, self.deleted.load(Ordering::SeqCst))
    }
}

fn buffer() -> Vec<f32> {
    (0..64).map(|v| v as f32).collect()
}

#[test]
fn well_formed_tensor_imports_and_deleter_runs_once() {
    let mut data = buffer();
    let mut p = Producer::new(data.as_mut_ptr().cast(), DataType::FLOAT32, &[4, 4], None);
    let (strides, deleted) = p.import();
    assert_eq!(strides.unwrap(), vec![4, 1], "NULL strides are read as row-major");
    assert_eq!(deleted, 1);
}

/// Each malformed case: what to break, and a check on the error.
#[test]
fn malformed_tensors_are_errors_and_still_deleted() {
    let mut data = buffer();
    let ptr: *mut c_void = data.as_mut_ptr().cast();
    type Break = fn(&mut Producer);
    type Check = fn(&Error) -> bool;
    let cases: Vec<(&str, Break, Check)> = vec![
        ("negative ndim", |p| p.managed.dl_tensor.ndim = -1, |e| matches!(e, Error::NdimOutOfRange { ndim: -1, .. })),
        ("ndim over the maximum", |p| p.managed.dl_tensor.ndim = 65, |e| matches!(e, Error::NdimOutOfRange { ndim: 65, max: 64 })),
        ("NULL shape", |p| p.managed.dl_tensor.shape = std::ptr::null_mut(), |e| matches!(e, Error::NullShape { ndim: 2 })),
        ("negative dimension", |p| p.shape[1] = -3, |e| matches!(e, Error::NegativeDimension { axis: 1, size: -3 })),
        ("count overflows i64", |p| p.shape.copy_from_slice(&[i64::MAX, 3]), |e| matches!(e, Error::SizeOverflow { .. })),
        ("extent overflows", |p| {
            p.strides = Some(vec![i64::MAX, 1]);
            p.managed.dl_tensor.strides = p.strides.as_mut().unwrap().as_mut_ptr();
        }, |e| matches!(e, Error::ExtentOverflow { .. })),
        ("strides reach below address 0", |p| {
            p.strides = Some(vec![i64::MIN / 8, 1]);
            p.managed.dl_tensor.strides = p.strides.as_mut().unwrap().as_mut_ptr();
        }, |e| matches!(e, Error::ExtentOverflow { .. })),
        ("byte_offset past the address space", |p| p.managed.dl_tensor.byte_offset = u64::MAX - 8, |e| matches!(e, Error::ExtentOverflow { .. })),
        ("unknown dtype code", |p| p.managed.dl_tensor.dtype.code = DataTypeCode(99), |e| matches!(e, Error::UnknownDtypeCode { code: 99 })),
        ("zero bits", |p| p.managed.dl_tensor.dtype.bits = 0, |e| matches!(e, Error::InvalidDtypeBits { .. })),
        ("zero lanes", |p| p.managed.dl_tensor.dtype.lanes = 0, |e| matches!(e, Error::ZeroLanes { .. })),
        ("bool with 1 bit", |p| p.managed.dl_tensor.dtype = DataType::new(DataTypeCode::BOOL, 1, 1), |e| matches!(e, Error::InvalidDtypeBits { expected: "8", .. })),
        ("float4 with 8 bits", |p| p.managed.dl_tensor.dtype = DataType::new(DataTypeCode::FLOAT4_E2M1FN, 8, 1), |e| matches!(e, Error::InvalidDtypeBits { expected: "4", .. })),
        ("float6 with 8 bits", |p| p.managed.dl_tensor.dtype = DataType::new(DataTypeCode::FLOAT6_E3M2FN, 8, 1), |e| matches!(e, Error::InvalidDtypeBits { expected: "6", .. })),
        ("major version 0", |p| p.managed.version.major = 0, |e| matches!(e, Error::UnsupportedVersion { major: 0, .. })),
        ("major version 2", |p| p.managed.version = DLPackVersion { major: 2, minor: 0 }, |e| matches!(e, Error::UnsupportedVersion { major: 2, minor: 0 })),
        ("NULL data with elements", |p| p.managed.dl_tensor.data = std::ptr::null_mut(), |e| matches!(e, Error::NullData { elements: 16 })),
    ];
    for (name, break_it, check) in cases {
        let mut p = Producer::new(ptr, DataType::FLOAT32, &[4, 4], None);
        break_it(&mut p);
        let (result, deleted) = p.import();
        let err = result.expect_err(name);
        assert!(check(&err), "{name}: unexpected error {err:?}");
        assert!(!err.to_string().is_empty());
        assert_eq!(deleted, 1, "{name}: the deleter runs exactly once");
    }
}

#[test]
fn version_mismatch_never_reads_past_flags() {
    // A major-2 struct whose dl_tensor is garbage: only the prefix may be read.
    let mut p = Producer::new(std::ptr::without_provenance_mut(0xdead), DataType::FLOAT32, &[4], None);
    p.managed.version.major = 2;
    p.managed.dl_tensor.ndim = -99;
    p.managed.dl_tensor.shape = std::ptr::dangling_mut::<i64>();
    let (result, deleted) = p.import();
    assert!(matches!(result, Err(Error::UnsupportedVersion { major: 2, .. })));
    assert_eq!(deleted, 1);
}

#[test]
fn try_from_raw_leaves_ownership_on_error() {
    let mut p = Producer::new(std::ptr::null_mut(), DataType::FLOAT32, &[2], None);
    // SAFETY: the struct lives in `p`.
    let err = unsafe { OwnedTensor::try_from_raw(&mut p.managed) }.unwrap_err();
    assert!(matches!(err.0, Error::NullData { .. }));
    assert!(err.1.is_some());
    assert_eq!(p.deleted.load(Ordering::SeqCst), 0, "the caller still owns it");
}

#[test]
fn null_deleter_and_null_pointer_are_fine() {
    let mut data = buffer();
    let mut p = Producer::new(data.as_mut_ptr().cast(), DataType::FLOAT32, &[3], None);
    p.managed.deleter = None;
    // SAFETY: the struct lives in `p`.
    let t = unsafe { OwnedTensor::from_raw(&mut p.managed) }.unwrap();
    assert_eq!(t.view().as_slice::<f32>().unwrap(), &[0.0, 1.0, 2.0]);
    drop(t);
    // SAFETY: NULL is explicitly allowed.
    assert!(matches!(unsafe { OwnedTensor::from_raw(std::ptr::null_mut()) }, Err(Error::NullPointer)));
}

#[test]
fn zero_size_and_scalar_and_unknown_device() {
    let mut p = Producer::new(std::ptr::null_mut(), DataType::FLOAT32, &[0, 5], Some(&[0, 0]));
    let (result, _) = p.import();
    assert_eq!(result.unwrap(), vec![0, 0]);
    let mut value = 3.5f64;
    let mut p = Producer::new((&mut value as *mut f64).cast(), DataType::FLOAT64, &[], None);
    p.managed.dl_tensor.shape = std::ptr::null_mut();
    // SAFETY: the struct lives in `p`.
    let t = unsafe { OwnedTensor::from_raw(&mut p.managed) }.unwrap();
    assert_eq!(t.view().as_slice::<f64>(), Some(&[3.5][..]));
    drop(t);
    // An unknown device code is refused: nothing can be done with such memory.
    let mut data = buffer();
    let mut p = Producer::new(data.as_mut_ptr().cast(), DataType::FLOAT32, &[2], None);
    p.managed.dl_tensor.device = Device::new(DeviceType(77), 3);
    // SAFETY: the struct lives in `p`.
    let err = unsafe { OwnedTensor::from_raw(&mut p.managed) }.unwrap_err();
    assert!(matches!(err, Error::UnknownDevice { device } if device.device_type == DeviceType(77)), "{err}");
    // A known device that the CPU cannot reach is kept, and refused for CPU access.
    let mut p = Producer::new(data.as_mut_ptr().cast(), DataType::FLOAT32, &[2], None);
    p.managed.dl_tensor.device = Device::new(DeviceType::CUDA, 3);
    // SAFETY: the struct lives in `p`.
    let t = unsafe { OwnedTensor::from_raw(&mut p.managed) }.unwrap();
    assert_eq!(t.view().device().to_string(), "cuda:3");
    assert!(t.view().as_slice::<f32>().is_none());
    assert!(matches!(t.view().try_as_slice::<f32>(), Err(Error::NotCpuAccessible { .. })));
}

#[test]
fn flags_are_reported_and_read_only_blocks_writes() {
    let mut data = buffer();
    let mut p = Producer::new(data.as_mut_ptr().cast(), DataType::FLOAT32, &[2], None);
    p.managed.flags = dlbridge::ffi::DLPACK_FLAG_BITMASK_READ_ONLY | dlbridge::ffi::DLPACK_FLAG_BITMASK_IS_COPIED;
    // SAFETY: the struct lives in `p`.
    let mut t = unsafe { OwnedTensor::from_raw(&mut p.managed) }.unwrap();
    assert!(t.is_read_only() && t.is_copied() && !t.is_subbyte_padded());
    assert!(matches!(t.try_view_mut(), Err(Error::ReadOnly)));
}

#[test]
fn legacy_struct_imports() {
    static DELETED: AtomicUsize = AtomicUsize::new(0);
    unsafe extern "C" fn del(_: *mut DLManagedTensor) {
        DELETED.fetch_add(1, Ordering::SeqCst);
    }
    let mut data = [1u8, 2, 3];
    let mut shape = [2i64];
    let mut m = DLManagedTensor {
        dl_tensor: DLTensor {
            data: data.as_mut_ptr().cast(),
            device: Device::CPU,
            ndim: 1,
            dtype: DataType::UINT8,
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 1,
        },
        manager_ctx: std::ptr::null_mut(),
        deleter: Some(del),
    };
    // SAFETY: the struct, shape and data live on this stack frame.
    let t = unsafe { OwnedLegacyTensor::from_raw(&mut m) }.unwrap();
    assert_eq!(t.view().as_slice::<u8>(), Some(&[2, 3][..]), "byte_offset is honoured");
    assert_eq!(t.version(), None);
    drop(t);
    assert_eq!(DELETED.load(Ordering::SeqCst), 1);
}

#[test]
fn contiguity_predicates() {
    let mut data = buffer();
    let base: *mut c_void = data.as_mut_ptr().cast();
    let view = |shape: &[i64], strides: &[i64]| {
        let mut shape = shape.to_vec();
        let mut strides = strides.to_vec();
        let t = DLTensor {
            data: base,
            device: Device::CPU,
            ndim: shape.len() as i32,
            dtype: DataType::FLOAT32,
            shape: shape.as_mut_ptr(),
            strides: strides.as_mut_ptr(),
            byte_offset: 0,
        };
        // SAFETY: the layouts below stay inside the 64-element buffer.
        let v = unsafe { TensorView::from_dltensor(&t, false) }.unwrap();
        (v.is_c_contiguous(), v.is_f_contiguous(), v.is_non_overlapping())
    };
    assert_eq!(view(&[2, 3], &[3, 1]), (true, false, true));
    assert_eq!(view(&[2, 3], &[1, 2]), (false, true, true));
    assert_eq!(view(&[1, 3], &[99, 1]), (true, true, true), "size-1 axes have any stride");
    assert_eq!(view(&[3, 2], &[0, 1]), (false, false, false));
    assert_eq!(view(&[2, 2], &[1, 1]), (false, false, false), "interleaved");
    assert_eq!(view(&[4], &[2]), (false, false, true));
}

/// A simple oracle: the lowest and highest byte any index reaches, by enumeration.
fn brute_force_extent(shape: &[i64], strides: &[i64], itemsize: i64) -> Option<(i64, i64)> {
    let total: i64 = shape.iter().product();
    if total == 0 {
        return None;
    }
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    for mut k in 0..total {
        let mut off = 0;
        for (d, s) in shape.iter().zip(strides).rev() {
            off += (k % d) * s;
            k /= d;
        }
        lo = lo.min(off * itemsize);
        hi = hi.max(off * itemsize + itemsize);
    }
    Some((lo, hi))
}

proptest! {
    /// Every tensor the validator accepts touches bytes only inside the byte
    /// range it reports, and that range is exactly what indexing reaches.
    #[test]
    fn reported_extent_is_exact(
        dims in prop::collection::vec((0i64..5, -7i64..8), 0..5),
        offset_elems in 0u64..64,
    ) {
        let shape: Vec<i64> = dims.iter().map(|d| d.0).collect();
        let strides: Vec<i64> = dims.iter().map(|d| d.1).collect();
        let mut data = vec![0f32; 256];
        let mut shape_c = shape.clone();
        let mut strides_c = strides.clone();
        let base = data.as_mut_ptr();
        let t = DLTensor {
            data: base.cast(),
            device: Device::CPU,
            ndim: shape.len() as i32,
            dtype: DataType::FLOAT32,
            shape: shape_c.as_mut_ptr(),
            strides: strides_c.as_mut_ptr(),
            byte_offset: offset_elems * 4,
        };
        // SAFETY: only metadata is read; the data is never touched here.
        let v = unsafe { TensorView::from_dltensor(&t, false) }.unwrap();
        let element0 = base as i64 + offset_elems as i64 * 4;
        match brute_force_extent(&shape, &strides, 4) {
            None => prop_assert!(v.byte_range().is_empty()),
            Some((lo, hi)) => {
                prop_assert_eq!(v.byte_range(), (element0 + lo) as usize..(element0 + hi) as usize);
            }
        }
    }

    /// Safe exports build their view from their own bounds check instead of the
    /// validator; it must be the view the validator computes from scratch.
    #[test]
    fn exported_view_equals_a_fresh_validation(dims in prop::collection::vec((0i64..4, -5i64..6), 0..4)) {
        let shape: Vec<i64> = dims.iter().map(|d| d.0).collect();
        let strides: Vec<i64> = dims.iter().map(|d| d.1).collect();
        let Ok(t) = OwnedTensor::from_owner_mut(vec![0u16; 512], &shape, Some(&strides)) else { return Ok(()) };
        let (range, ptr, len) = (t.view().byte_range(), t.view().as_ptr(), t.view().len());
        // SAFETY: an owned tensor from `into_raw`, validated again from scratch.
        let again = unsafe { OwnedTensor::from_raw(t.into_raw()) }.unwrap();
        prop_assert_eq!(again.view().byte_range(), range);
        prop_assert_eq!(again.view().as_ptr(), ptr);
        prop_assert_eq!(again.view().len(), len);
        prop_assert_eq!(again.view().strides(), &strides[..]);
    }

    /// Strides in bytes give the view that the same strides in elements give.
    #[test]
    fn byte_strides_validate_as_element_strides(
        dims in prop::collection::vec((0i64..5, -7i64..8), 0..5),
        itemsize_log2 in 0u32..4,
    ) {
        let dtype = DataType::new(DataTypeCode::UINT, 8 << itemsize_log2, 1);
        let itemsize = 1i64 << itemsize_log2;
        let mut shape: Vec<i64> = dims.iter().map(|d| d.0).collect();
        let mut strides: Vec<i64> = dims.iter().map(|d| d.1).collect();
        let data = vec![0u64; 512];
        let base = data[256..].as_ptr().cast_mut().cast::<c_void>();
        let t = DLTensor { data: base, device: Device::CPU, ndim: shape.len() as i32, dtype,
                           shape: shape.as_mut_ptr(), strides: strides.as_mut_ptr(), byte_offset: 0 };
        // SAFETY: only metadata is read; the data is never touched here.
        let from_elements = unsafe { TensorView::from_dltensor(&t, false) }.unwrap();
        // SAFETY: as above.
        let from_bytes = unsafe {
            TensorView::from_byte_strides(base, dtype, Device::CPU, shape.len(), false, |i| (shape[i], strides[i] * itemsize))
        }.unwrap();
        prop_assert_eq!(from_bytes.shape(), from_elements.shape());
        prop_assert_eq!(from_bytes.strides(), from_elements.strides());
        prop_assert_eq!(from_bytes.byte_range(), from_elements.byte_range());
    }

    /// Arbitrary byte strides, sizes and addresses are errors, never panics,
    /// and what is accepted reaches a range that fits the address space.
    #[test]
    fn arbitrary_byte_strides_never_panic(
        ndim in 0usize..70,
        axes in prop::collection::vec((any::<i64>(), any::<i64>()), 70),
        code in any::<u8>(), bits in any::<u8>(), padded in any::<bool>(), data in any::<usize>(),
    ) {
        let dtype = DataType::new(DataTypeCode(code), bits, 1);
        // SAFETY: an address without provenance: only metadata is read, never the data.
        let view = unsafe {
            TensorView::from_byte_strides(std::ptr::without_provenance_mut(data), dtype, Device::CPU, ndim, padded, |i| axes[i])
        };
        if let Ok(v) = view {
            let r = v.byte_range();
            prop_assert!(r.start <= r.end);
        }
    }

    /// Arbitrary metadata never panics the validator.
    #[test]
    fn arbitrary_metadata_never_panics(
        ndim in -3i32..8,
        shape in prop::collection::vec(any::<i64>(), 8),
        strides in prop::collection::vec(any::<i64>(), 8),
        code in any::<u8>(), bits in any::<u8>(), lanes in any::<u16>(),
        byte_offset in any::<u64>(), data in any::<usize>(), null_strides in any::<bool>(),
    ) {
        let mut shape = shape;
        let mut strides = strides;
        // An address without provenance: only metadata is read, never the data.
        let t = DLTensor {
            data: std::ptr::without_provenance_mut(data),
            device: Device::CPU,
            ndim,
            dtype: DataType::new(DataTypeCode(code), bits, lanes),
            shape: shape.as_mut_ptr(),
            strides: if null_strides { std::ptr::null_mut() } else { strides.as_mut_ptr() },
            byte_offset,
        };
        // SAFETY: shape and strides hold 8 entries, at least ndim when in range;
        // only metadata is read.
        if let Ok(v) = unsafe { TensorView::from_dltensor(&t, false) } {
            let r = v.byte_range();
            prop_assert!(r.start <= r.end);
        }
    }
}

#[test]
fn sub_byte_extent_is_packed() {
    let mut data = [0u8; 4];
    let mut shape = [5i64];
    let t = DLTensor {
        data: data.as_mut_ptr().cast(),
        device: Device::CPU,
        ndim: 1,
        dtype: DataType::new(DataTypeCode::FLOAT4_E2M1FN, 4, 1),
        shape: shape.as_mut_ptr(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    // SAFETY: 5 packed fp4 values need 3 of the 4 bytes.
    let v = unsafe { TensorView::from_dltensor(&t, false) }.unwrap();
    assert_eq!(v.byte_range().len(), 3);
    assert_eq!(v.nbytes(), 3);
    // SAFETY: padded, they need 5 bytes, which the caller must vouch for; only metadata is read.
    let padded = unsafe { TensorView::from_dltensor(&t, true) }.unwrap();
    assert_eq!(padded.byte_range().len(), 5);
}

#[test]
fn byte_strides_refuse_what_they_cannot_describe() {
    let data = [0u8; 16];
    let base = data.as_ptr().cast_mut().cast::<c_void>();
    let float4 = DataType::new(DataTypeCode::FLOAT4_E2M1FN, 4, 1);
    // SAFETY (each call): the layouts reach at most the 16 bytes of `data`, which outlive the views.
    let view = |dtype, ndim, padded, axis: &dyn Fn(usize) -> (i64, i64)| unsafe {
        TensorView::from_byte_strides(base, dtype, Device::CPU, ndim, padded, axis)
    };
    assert!(matches!(view(float4, 1, false, &|_| (4, 1)), Err(Error::UnsupportedDtype { .. })), "packed: no byte strides");
    assert_eq!(view(float4, 1, true, &|_| (4, 1)).map(|v| v.strides().to_vec()), Ok(vec![1]), "padded: a byte each");
    assert!(matches!(view(DataType::FLOAT32, 1, false, &|_| (2, 6)), Err(Error::StrideNotWhole { axis: 0, byte_stride: 6, itemsize: 4 })));
    assert!(matches!(view(DataType::FLOAT32, 1, false, &|_| (-1, 4)), Err(Error::NegativeDimension { .. })));
    assert!(matches!(view(DataType::FLOAT32, 65, false, &|_| (1, 4)), Err(Error::NdimOutOfRange { .. })));
    assert!(matches!(view(DataType::FLOAT32, 2, false, &|_| (1 << 40, 4)), Err(Error::SizeOverflow { .. })), "a huge element count");
    assert!(matches!(view(DataType::FLOAT32, 2, false, &|_| (2, 1 << 62)), Err(Error::ExtentOverflow { .. })), "a huge extent");
}
