//! The `candle` feature against the real candle crate (CPU): zero-copy read-only
//! export of candle tensors and the copying import, every dtype both ways,
//! layouts, refusals, and who keeps candle's storage alive and unwritten.
#![cfg(feature = "candle")]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, DType, Device as CandleDevice, IndexOp, InplaceOp1, Storage, Tensor, WithDType};
use dlbridge::ffi::{DLTensor, DLPACK_FLAG_BITMASK_READ_ONLY};
use dlbridge::{DataType, DataTypeCode, Device, Element, Error, OwnedLegacyTensor, OwnedTensor, TensorView};

// ---------------------------------------------------------------------------
// An allocator that tells when one watched address is freed: the proof that an
// export keeps candle's buffer alive, and that its deleter lets it go.

struct Watching;
static WATCHED: AtomicUsize = AtomicUsize::new(0);
static FREED: AtomicBool = AtomicBool::new(false);
/// Tests that watch an address run one at a time.
static WATCH_LOCK: Mutex<()> = Mutex::new(());

fn note_free(ptr: *mut u8) {
    if ptr as usize == WATCHED.load(Ordering::SeqCst) {
        FREED.store(true, Ordering::SeqCst);
    }
}

// SAFETY: forwards every call to `System`; only reads two atomics on the side.
unsafe impl GlobalAlloc for Watching {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note_free(ptr);
        // SAFETY: forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() && new != ptr {
            note_free(ptr);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Watching = Watching;

fn watch(addr: usize) -> std::sync::MutexGuard<'static, ()> {
    let guard = WATCH_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    FREED.store(false, Ordering::SeqCst);
    WATCHED.store(addr, Ordering::SeqCst);
    guard
}

fn freed() -> bool {
    FREED.load(Ordering::SeqCst)
}

// ---------------------------------------------------------------------------

const CPU: CandleDevice = CandleDevice::Cpu;

/// Address of the first element of a candle CPU tensor's storage buffer.
fn storage_ptr<T: WithDType>(t: &Tensor) -> usize {
    let (storage, _) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else { panic!("not a CPU tensor") };
    T::cpu_storage_as_slice(cpu).unwrap().as_ptr() as usize
}

/// The elements of a view in index order, whatever its strides.
fn values<T: Element>(view: &TensorView<'_>) -> Vec<T> {
    let c: OwnedTensor = dlbridge::to_contiguous(view).unwrap();
    c.view().try_as_slice::<T>().unwrap().to_vec()
}

fn f8e4m3() -> DataType {
    DataType::new(DataTypeCode::FLOAT8_E4M3FN, 8, 1)
}

fn f8e8m0() -> DataType {
    DataType::new(DataTypeCode::FLOAT8_E8M0FNU, 8, 1)
}

/// Exports a 2x3 tensor of `0..6` in `dtype`, then its transpose and a narrow
/// of it, checking dtype, layout, zero copy, read-only and values; then takes
/// each back into candle.
fn export_and_back<T: Element + WithDType + PartialEq + std::fmt::Debug>(candle: DType, dl: DataType) {
    let t = Tensor::arange(0f32, 6.0, &CPU).unwrap().reshape((2, 3)).unwrap().to_dtype(candle).unwrap();
    assert_eq!(t.dtype(), candle);
    let base = storage_ptr::<T>(&t);
    let expected: Vec<T> = t.flatten_all().unwrap().to_vec1().unwrap();

    let e = OwnedTensor::from_candle(&t).unwrap();
    let v = e.view();
    assert_eq!((v.dtype(), v.shape(), v.strides()), (dl, &[2i64, 3][..], &[3i64, 1][..]), "{candle:?}");
    assert_eq!(v.as_ptr() as usize, base, "{candle:?}: zero copy");
    assert!(e.is_read_only() && e.flags() & DLPACK_FLAG_BITMASK_READ_ONLY != 0);
    assert_eq!(v.try_as_slice::<T>().unwrap(), &expected[..], "{candle:?}");

    // Transposed: the same memory, strides swapped.
    let tt = t.t().unwrap();
    let et = OwnedTensor::from_candle(&tt).unwrap();
    assert_eq!((et.view().shape(), et.view().strides()), (&[3i64, 2][..], &[1i64, 3][..]));
    assert_eq!(et.view().as_ptr() as usize, base);
    let expected_t: Vec<T> = tt.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(values::<T>(et.view()), expected_t, "{candle:?} transposed");

    // Narrowed: element 0 at candle's start_offset.
    let n = t.narrow(1, 1, 2).unwrap();
    let en = OwnedTensor::from_candle(&n).unwrap();
    assert_eq!((en.view().shape(), en.view().strides()), (&[2i64, 2][..], &[3i64, 1][..]));
    assert_eq!(en.view().as_ptr() as usize, base + core::mem::size_of::<T>());
    let expected_n: Vec<T> = n.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(values::<T>(en.view()), expected_n, "{candle:?} narrowed");

    // Back into candle: a copy, same dtype, shape and values.
    for (exported, source) in [(&e, &t), (&et, &tt), (&en, &n)] {
        let back = exported.view().to_candle_copied().unwrap();
        assert_eq!((back.dtype(), back.dims()), (candle, source.dims()));
        assert_ne!(storage_ptr::<T>(&back), base, "{candle:?}: import copies");
        let got: Vec<T> = back.flatten_all().unwrap().to_vec1().unwrap();
        let want: Vec<T> = source.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(got, want, "{candle:?} round trip");
    }
}

#[test]
fn every_candle_dtype_exports_zero_copy_and_imports() {
    export_and_back::<u8>(DType::U8, DataType::UINT8);
    export_and_back::<u32>(DType::U32, DataType::UINT32);
    export_and_back::<i16>(DType::I16, DataType::INT16);
    export_and_back::<i32>(DType::I32, DataType::INT32);
    export_and_back::<i64>(DType::I64, DataType::INT64);
    export_and_back::<half::bf16>(DType::BF16, DataType::BFLOAT16);
    export_and_back::<half::f16>(DType::F16, DataType::FLOAT16);
    export_and_back::<f32>(DType::F32, DataType::FLOAT32);
    export_and_back::<f64>(DType::F64, DataType::FLOAT64);
    export_and_back::<float8::F8E4M3>(DType::F8E4M3, f8e4m3());
}

#[test]
fn float8_e8m0_travels_as_raw_bytes_both_ways() {
    let bytes = [127u8, 128, 0, 254, 255, 1];
    let t = Tensor::from_raw_buffer(&bytes, DType::F8E8M0, &[2, 3], &CPU).unwrap();
    let e = OwnedTensor::from_candle(&t).unwrap();
    assert_eq!((e.view().dtype(), e.view().shape()), (f8e8m0(), &[2i64, 3][..]));
    assert_eq!(e.view().as_bytes().unwrap(), &bytes);
    assert!(e.is_read_only());
    let back = e.view().to_candle_copied().unwrap();
    assert_eq!((back.dtype(), back.dims()), (DType::F8E8M0, &[2usize, 3][..]));
    let again = OwnedTensor::from_candle(&back).unwrap();
    assert_eq!(again.view().as_bytes().unwrap(), &bytes);
    assert_ne!(again.view().as_ptr(), e.view().as_ptr());
}

#[test]
fn dtype_tables_are_inverse() {
    let all = [
        DType::U8, DType::U32, DType::I16, DType::I32, DType::I64, DType::BF16, DType::F16, DType::F32, DType::F64,
        DType::F8E4M3, DType::F8E8M0,
    ];
    for d in all {
        let dl = dlbridge::dtype_from_candle(d).unwrap();
        assert_eq!(dlbridge::dtype_to_candle(dl).unwrap(), d);
        assert_eq!(dl.itemsize(), Some(d.size_in_bytes()), "{d:?}");
    }
    for (d, code, bits) in [
        (DType::F6E2M3, DataTypeCode::FLOAT6_E2M3FN, 6),
        (DType::F6E3M2, DataTypeCode::FLOAT6_E3M2FN, 6),
        (DType::F4, DataTypeCode::FLOAT4_E2M1FN, 4),
    ] {
        let dl = DataType::new(code, bits, 1);
        assert!(matches!(dlbridge::dtype_from_candle(d), Err(Error::UnsupportedDtype { dtype, .. }) if dtype == dl), "{d:?}");
        assert!(matches!(dlbridge::dtype_to_candle(dl), Err(Error::UnsupportedDtype { .. })));
    }
}

#[test]
fn dtypes_candle_lacks_are_refused_on_import() {
    let refused = [
        DataType::BOOL,
        DataType::INT8,
        DataType::UINT16,
        DataType::UINT64,
        DataType::COMPLEX64,
        DataType::COMPLEX128,
        DataType::new(DataTypeCode::FLOAT8_E5M2, 8, 1),
        DataType::new(DataTypeCode::FLOAT8_E4M3, 8, 1),
        DataType::FLOAT32.with_lanes(4),
        DataType::new(DataTypeCode::FLOAT4_E2M1FN, 4, 1),
    ];
    for dtype in refused {
        let t: OwnedTensor = dlbridge::zeros(dtype, &[4]).unwrap();
        let err = t.view().to_candle_copied().unwrap_err();
        assert!(matches!(err, Error::UnsupportedDtype { dtype: d, .. } if d == dtype), "{dtype}: {err}");
    }
}

#[test]
fn candle_sub_byte_dummies_are_refused_on_export() {
    for d in [DType::F4, DType::F6E2M3, DType::F6E3M2] {
        let t = Tensor::from_raw_buffer(&[0u8; 3], d, &[4], &CPU).unwrap();
        let err = OwnedTensor::from_candle(&t).unwrap_err();
        assert!(matches!(err, Error::UnsupportedDtype { .. }), "{d:?}: {err}");
    }
}

#[test]
fn broadcast_scalar_and_empty_layouts_export() {
    // Broadcast: zero strides over one row of three.
    let row = Tensor::new(&[1f32, 2., 3.], &CPU).unwrap();
    let b = row.broadcast_as((2, 3)).unwrap();
    let e = OwnedTensor::from_candle(&b).unwrap();
    assert_eq!((e.view().shape(), e.view().strides()), (&[2i64, 3][..], &[0i64, 1][..]));
    assert_eq!(values::<f32>(e.view()), [1., 2., 3., 1., 2., 3.]);
    assert!(!e.view().is_non_overlapping());
    let back = e.view().to_candle_copied().unwrap();
    assert_eq!(back.to_vec2::<f32>().unwrap(), [[1., 2., 3.], [1., 2., 3.]]);

    // A scalar: ndim 0, shape and strides NULL.
    let s = Tensor::new(7i64, &CPU).unwrap();
    let e = OwnedTensor::from_candle(&s).unwrap();
    assert_eq!(e.view().ndim(), 0);
    assert!(e.as_raw().dl_tensor.shape.is_null());
    assert_eq!(e.view().as_slice::<i64>(), Some(&[7][..]));
    assert_eq!(e.view().to_candle_copied().unwrap().to_vec0::<i64>().unwrap(), 7);

    // Empty, also at the end of its storage (start_offset == len): data NULL.
    let t = Tensor::arange(0u32, 6, &CPU).unwrap().reshape((2, 3)).unwrap();
    for empty in [Tensor::zeros((0, 3), DType::F32, &CPU).unwrap(), t.narrow(1, 3, 0).unwrap()] {
        let e = OwnedTensor::from_candle(&empty).unwrap();
        assert!(e.as_raw().dl_tensor.data.is_null());
        assert_eq!(e.view().shape(), empty.dims().iter().map(|&d| d as i64).collect::<Vec<_>>());
        let back = e.view().to_candle_copied().unwrap();
        assert_eq!((back.dims(), back.dtype()), (empty.dims(), empty.dtype()));
    }

    // Indexing and a 3-d permutation.
    let t = Tensor::arange(0f64, 24.0, &CPU).unwrap().reshape((2, 3, 4)).unwrap();
    let p = t.permute((2, 0, 1)).unwrap().i((.., 1, 1..)).unwrap();
    let e = OwnedTensor::from_candle(&p).unwrap();
    let expected: Vec<f64> = p.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(values::<f64>(e.view()), expected);
    assert_eq!(e.view().shape(), &[4, 2]);
}

#[test]
fn legacy_export_stays_read_only_on_the_rust_side() {
    let t = Tensor::ones(4, DType::F32, &CPU).unwrap();
    let mut e = OwnedLegacyTensor::from_candle(&t).unwrap();
    assert!(e.is_read_only());
    assert!(matches!(e.try_view_mut(), Err(Error::ReadOnly)));
    assert_eq!(e.view().as_slice::<f32>(), Some(&[1f32; 4][..]));
}

#[test]
fn a_layout_beyond_its_storage_is_refused() {
    // `Tensor::from_storage` is public, safe and takes any shape.
    let storage = Storage::Cpu(CpuStorage::F32(vec![1.0; 4]));
    let t = Tensor::from_storage(storage, (2, 3), BackpropOp::none(), false);
    let err = OwnedTensor::from_candle(&t).unwrap_err();
    assert!(matches!(err, Error::OutOfBounds { highest: 5, len: 4, .. }), "{err}");
    // The same storage with a shape it can hold exports.
    let storage = Storage::Cpu(CpuStorage::F32(vec![1.0; 4]));
    let t = Tensor::from_storage(storage, (2, 2), BackpropOp::none(), false);
    assert_eq!(OwnedTensor::from_candle(&t).unwrap().view().shape(), &[2, 2]);
}

#[test]
fn strided_imports_copy_in_index_order() {
    let neg = OwnedTensor::from_owner_mut((0..6).map(|v| v as f32).collect::<Vec<_>>(), &[2, 3], Some(&[-3, -1])).unwrap();
    let c = neg.view().to_candle_copied().unwrap();
    assert_eq!(c.to_vec2::<f32>().unwrap(), [[5., 4., 3.], [2., 1., 0.]]);
    assert!(c.is_contiguous());

    let zero = OwnedTensor::from_owner_mut(vec![7i64, 8], &[3, 2], Some(&[0, 1])).unwrap();
    assert_eq!(zero.view().to_candle_copied().unwrap().to_vec2::<i64>().unwrap(), [[7, 8], [7, 8], [7, 8]]);

    let gaps = OwnedTensor::from_owner_mut((0..6u8).collect::<Vec<_>>(), &[2, 2], Some(&[3, 1])).unwrap();
    assert_eq!(gaps.view().to_candle_copied().unwrap().to_vec2::<u8>().unwrap(), [[0, 1], [3, 4]]);

    let fortran = OwnedTensor::from_owner_mut(vec![1.0f64, 2., 3., 4., 5., 6.], &[2, 3], Some(&[1, 2])).unwrap();
    assert_eq!(fortran.view().to_candle_copied().unwrap().to_vec2::<f64>().unwrap(), [[1., 3., 5.], [2., 4., 6.]]);
}

#[test]
fn import_is_a_copy_that_later_writes_do_not_reach() {
    let mut src = OwnedTensor::from_vec(vec![1.0f32; 4], &[2, 2]).unwrap();
    let c = src.view().to_candle_copied().unwrap();
    assert_ne!(storage_ptr::<f32>(&c), src.view().as_ptr() as usize);
    src.try_view_mut().unwrap().try_as_slice_mut::<f32>().unwrap()[0] = 5.0;
    assert_eq!(c.to_vec2::<f32>().unwrap(), [[1.0, 1.0], [1.0, 1.0]]);
}

#[test]
fn import_refuses_memory_the_cpu_cannot_reach() {
    let src = OwnedTensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    let mut dl: DLTensor = src.as_raw().dl_tensor;
    dl.device = Device::cuda(0);
    // SAFETY: `dl` describes `src`'s live buffer; only the device differs, and
    // nothing reads through it.
    let view = unsafe { TensorView::from_dltensor(&dl, false) }.unwrap();
    assert!(matches!(view.to_candle_copied(), Err(Error::NotCpuAccessible { .. })));
}

#[test]
fn the_export_keeps_candle_storage_alive_and_the_deleter_frees_it() {
    let t = Tensor::arange(0f32, 6.0, &CPU).unwrap().reshape((2, 3)).unwrap();
    let _watch = watch(storage_ptr::<f32>(&t));
    let e = OwnedTensor::from_candle(&t.t().unwrap()).unwrap();
    drop(t);
    assert!(!freed(), "the export holds the storage");
    assert_eq!(values::<f32>(e.view()), [0., 3., 1., 4., 2., 5.]);
    drop(e);
    assert!(freed(), "the deleter released the last reference");

    // The other order: the export goes first, candle's tensor still holds it.
    drop(_watch);
    let t = Tensor::ones(8, DType::F64, &CPU).unwrap();
    let _watch = watch(storage_ptr::<f64>(&t));
    let e = OwnedTensor::from_candle(&t).unwrap();
    drop(e);
    assert!(!freed());
    assert_eq!(t.to_vec1::<f64>().unwrap(), [1.0; 8]);
    drop(t);
    assert!(freed());
}

/// An in-place op of the kind candle lets anyone write: it replaces the `Vec`
/// of the storage it is given, freeing the old one.
struct ReplaceStorage;
impl InplaceOp1 for ReplaceStorage {
    fn name(&self) -> &'static str {
        "replace-storage"
    }
    fn cpu_fwd(&self, storage: &mut CpuStorage, _layout: &candle_core::Layout) -> candle_core::Result<()> {
        *storage = CpuStorage::F32(vec![9.0; 1024]);
        Ok(())
    }
}

#[test]
fn candle_writers_wait_until_the_export_is_dropped_on_any_thread() {
    let t = Tensor::arange(0f32, 4.0, &CPU).unwrap();
    let _watch = watch(storage_ptr::<f32>(&t));
    let e = OwnedTensor::from_candle(&t).unwrap();

    // A hostile op that would free the exported buffer, and an ordinary one
    // that would overwrite it, both from clones on other threads.
    let (tx, rx) = mpsc::channel();
    let writers: Vec<_> = [0, 1]
        .into_iter()
        .map(|k| {
            let (clone, tx) = (t.clone(), tx.clone());
            std::thread::spawn(move || {
                if k == 0 {
                    clone.inplace_op1(&ReplaceStorage).unwrap();
                } else {
                    clone.zero_set().unwrap();
                }
                tx.send(k).unwrap();
            })
        })
        .collect();
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "a writer got past the export's read guard");
    assert!(!freed());
    assert_eq!(e.view().as_slice::<f32>(), Some(&[0f32, 1., 2., 3.][..]));

    // Dropped on another thread: the guard is released there.
    std::thread::spawn(move || drop(e)).join().unwrap();
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(20)).unwrap();
    }
    writers.into_iter().for_each(|w| w.join().unwrap());
    assert!(freed(), "the replacing op freed the old buffer, after the export");
    let after = t.to_vec1::<f32>().unwrap();
    assert!(after == [0.0; 4] || after == [9.0; 4], "{after:?}");
}

#[test]
fn candle_readers_are_not_blocked_by_an_export() {
    let t = Tensor::arange(0f32, 4.0, &CPU).unwrap();
    let e = OwnedTensor::from_candle(&t).unwrap();
    let e2 = OwnedTensor::from_candle(&t).unwrap();
    assert_eq!((&t + 1.0).unwrap().to_vec1::<f32>().unwrap(), [1., 2., 3., 4.]);
    assert_eq!(t.sum_all().unwrap().to_vec0::<f32>().unwrap(), 6.0);
    let back = e.view().to_candle_copied().unwrap();
    assert_eq!(back.to_vec1::<f32>().unwrap(), [0., 1., 2., 3.]);
    drop((e, e2));
    t.zero_set().unwrap();
    assert_eq!(t.to_vec1::<f32>().unwrap(), [0.; 4]);
}
