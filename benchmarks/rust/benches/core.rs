//! dlbridge's core against dlpark 0.10 on the same operations:
//! export of an owned array and drop (deleter included), validation of a
//! foreign DLTensor (1-d and 4-d), ndarray views, and contiguous copies
//! (dlpark has none; ndarray's `as_standard_layout` is the baseline there).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use dlbridge::ffi::DLTensor;
use dlbridge::{DataType, Device, OwnedTensor, TensorView};
use ndarray::{Array1, Array2, ArrayViewD, IxDyn};

fn export_and_drop(c: &mut Criterion) {
    let mut g = c.benchmark_group("export+drop Array1<f32>(16)");
    g.bench_function("dlbridge", |b| {
        b.iter(|| {
            let a = Array1::<f32>::zeros(16);
            drop(black_box(OwnedTensor::from_array(black_box(a)).unwrap()));
        })
    });
    g.bench_function("dlpark", |b| {
        b.iter(|| {
            let a = Array1::<f32>::zeros(16);
            let init: dlpark::allocation::dynamic::Initialized<dlpark::ffi::DLManagedTensorVersioned> =
                Box::new(black_box(a)).try_into().unwrap();
            // SAFETY: the descriptor comes from dlpark's own ndarray producer.
            drop(black_box(unsafe { init.finish() }));
        })
    });
    g.bench_function("dlbridge from_vec", |b| {
        b.iter(|| {
            let v = vec![0f32; 16];
            drop(black_box(OwnedTensor::from_vec(black_box(v), &[16]).unwrap()));
        })
    });
    g.finish();
}

fn foreign(shape: &mut [i64], strides: &mut [i64], data: &mut [f32]) -> DLTensor {
    DLTensor {
        data: data.as_mut_ptr().cast(),
        device: Device::CPU,
        ndim: shape.len() as i32,
        dtype: DataType::FLOAT32,
        shape: shape.as_mut_ptr(),
        strides: strides.as_mut_ptr(),
        byte_offset: 0,
    }
}

fn validate(c: &mut Criterion) {
    let mut data = vec![0f32; 2 * 3 * 4 * 5];
    for (name, mut shape, mut strides) in [
        ("1-d", vec![120i64], vec![1i64]),
        ("4-d", vec![2i64, 3, 4, 5], vec![60i64, 20, 5, 1]),
    ] {
        let t = foreign(&mut shape, &mut strides, &mut data);
        let mut g = c.benchmark_group(format!("validate foreign DLTensor {name}"));
        g.bench_function("dlbridge", |b| {
            // SAFETY: `t` describes the live `data` buffer.
            b.iter(|| black_box(unsafe { TensorView::from_dltensor(black_box(&t), false) }.unwrap().len()))
        });
        // SAFETY: dlpark's DLTensor has the same repr(C) layout as ours (both follow dlpack.h 1.3).
        let theirs = unsafe { &*(&t as *const DLTensor).cast::<dlpark::ffi::DLTensor>() };
        g.bench_function("dlpark", |b| {
            // SAFETY: as above.
            b.iter(|| black_box(unsafe { dlpark::TensorRef::from_raw(black_box(theirs)) }.unwrap().shape().len()))
        });
        g.finish();
    }
}

fn views(c: &mut Criterion) {
    let ours = OwnedTensor::from_array(Array2::<f32>::zeros((16, 16))).unwrap();
    let init: dlpark::allocation::dynamic::Initialized<dlpark::ffi::DLManagedTensorVersioned> =
        Box::new(Array2::<f32>::zeros((16, 16))).try_into().unwrap();
    // SAFETY: dlpark's own producer.
    let theirs = unsafe { init.finish() };
    let mut g = c.benchmark_group("ndarray view of a managed (16,16) f32");
    g.bench_function("dlbridge", |b| b.iter(|| black_box(black_box(&ours).view().as_array::<f32, IxDyn>().unwrap().len())));
    g.bench_function("dlpark", |b| {
        b.iter(|| {
            // SAFETY: the managed tensor is alive and nothing writes it.
            let v: ArrayViewD<'_, f32> =
                unsafe { dlpark::TryFromDlpack::try_from_dlpack(black_box(&theirs), ()) }.unwrap();
            black_box(v.len())
        })
    });
    g.finish();
}

fn copies(c: &mut Criterion) {
    let src = Array2::<f32>::from_shape_fn((1024, 1024), |(i, j)| (i * 1024 + j) as f32);
    let transposed = OwnedTensor::from_array(src.clone().reversed_axes()).unwrap();
    let contiguous = OwnedTensor::from_array(src.clone()).unwrap();
    let mut g = c.benchmark_group("to_contiguous 4 MiB f32");
    g.sample_size(20);
    g.bench_function("dlbridge contiguous", |b| {
        b.iter(|| black_box(dlbridge::to_contiguous::<dlbridge::ffi::DLManagedTensorVersioned>(contiguous.view()).unwrap()))
    });
    g.bench_function("ndarray to_owned contiguous", |b| b.iter(|| black_box(src.to_owned())));
    g.bench_function("dlbridge transposed", |b| {
        b.iter(|| black_box(dlbridge::to_contiguous::<dlbridge::ffi::DLManagedTensorVersioned>(transposed.view()).unwrap()))
    });
    let t = src.t();
    g.bench_function("ndarray as_standard_layout transposed", |b| b.iter(|| black_box(t.as_standard_layout().into_owned())));
    g.finish();
}

criterion_group!(benches, export_and_drop, validate, views, copies);
criterion_main!(benches);
