//! The dlbridge-pyo3 side of `./dev bench`'s extension-call rows: the same four
//! functions as `numpy_ext`, `nanobind_ext.cpp` and `tvm_ffi_ext.cc`.
use dlbridge_pyo3::{to_py_err, PyTensor, PyTensorMut};
use ndarray::Ix1;
use pyo3::prelude::*;

fn total(x: &PyTensor<'_>) -> PyResult<f32> {
    Ok(x.view().try_as_array::<f32, Ix1>().map_err(to_py_err)?.sum())
}

fn double(x: &mut PyTensorMut<'_>) -> PyResult<()> {
    let mut view = x.view_mut()?;
    let mut array = view.try_as_array_mut::<f32, Ix1>().map_err(to_py_err)?;
    array *= 2.0;
    Ok(())
}

/// The sum of a 1-d float32 tensor.
#[pyfunction]
fn sum1(x: PyTensor<'_>) -> PyResult<f32> {
    total(&x)
}

/// The sum of three 1-d float32 tensors.
#[pyfunction]
fn sum3(a: PyTensor<'_>, b: PyTensor<'_>, c: PyTensor<'_>) -> PyResult<f32> {
    Ok(total(&a)? + total(&b)? + total(&c)?)
}

/// Doubles a 1-d float32 tensor in place.
#[pyfunction]
fn scale1(mut x: PyTensorMut<'_>) -> PyResult<()> {
    double(&mut x)
}

/// Doubles three 1-d float32 tensors in place.
#[pyfunction]
fn scale3(mut a: PyTensorMut<'_>, mut b: PyTensorMut<'_>, mut c: PyTensorMut<'_>) -> PyResult<()> {
    double(&mut a)?;
    double(&mut b)?;
    double(&mut c)
}

#[pymodule]
fn dlbridge_bench_ext(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sum1, m)?)?;
    m.add_function(wrap_pyfunction!(sum3, m)?)?;
    m.add_function(wrap_pyfunction!(scale1, m)?)?;
    m.add_function(wrap_pyfunction!(scale3, m)?)?;
    Ok(())
}
