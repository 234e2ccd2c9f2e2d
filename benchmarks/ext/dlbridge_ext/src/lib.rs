//! The dlbridge-pyo3 side of `./dev bench`'s extension-call rows: the same four
//! functions as `numpy_ext`, `nanobind_ext.cpp` and `tvm_ffi_ext.cc`, with
//! typed arguments (a 1-d float32 CPU tensor, any layout), as rust-numpy's
//! `PyReadonlyArray1<f32>` and `PyReadwriteArray1<f32>` are typed.
use dlbridge_pyo3::{Cpu, PyTensor, PyTensorMut};
use ndarray::Ix1;
use pyo3::prelude::*;

type Vector<'py> = PyTensor<'py, f32, Ix1, Cpu>;
type VectorMut<'py> = PyTensorMut<'py, f32, Ix1, Cpu>;

fn double(x: &mut VectorMut<'_>) {
    let mut array = x.as_array_mut();
    array *= 2.0;
}

/// The sum of a 1-d float32 tensor.
#[pyfunction]
fn sum1(x: Vector<'_>) -> f32 {
    x.as_array().sum()
}

/// The sum of three 1-d float32 tensors.
#[pyfunction]
fn sum3(a: Vector<'_>, b: Vector<'_>, c: Vector<'_>) -> f32 {
    a.as_array().sum() + b.as_array().sum() + c.as_array().sum()
}

/// Doubles a 1-d float32 tensor in place.
#[pyfunction]
fn scale1(mut x: VectorMut<'_>) {
    double(&mut x);
}

/// Doubles three 1-d float32 tensors in place.
#[pyfunction]
fn scale3(mut a: VectorMut<'_>, mut b: VectorMut<'_>, mut c: VectorMut<'_>) {
    double(&mut a);
    double(&mut b);
    double(&mut c);
}

#[pymodule(gil_used = false)]
fn dlbridge_bench_ext(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sum1, m)?)?;
    m.add_function(wrap_pyfunction!(sum3, m)?)?;
    m.add_function(wrap_pyfunction!(scale1, m)?)?;
    m.add_function(wrap_pyfunction!(scale3, m)?)?;
    Ok(())
}
