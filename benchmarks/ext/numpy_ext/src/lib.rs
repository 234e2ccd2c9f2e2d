//! The rust-numpy side of `./dev bench`'s extension-call rows: the same four
//! functions as `dlbridge_ext`, with rust-numpy's typed arguments.
use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::prelude::*;

fn double(x: &mut PyReadwriteArray1<'_, f32>) {
    let mut array = x.as_array_mut();
    array *= 2.0;
}

/// The sum of a 1-d float32 NumPy array.
#[pyfunction]
fn sum1(x: PyReadonlyArray1<'_, f32>) -> f32 {
    x.as_array().sum()
}

/// The sum of three 1-d float32 NumPy arrays.
#[pyfunction]
fn sum3(a: PyReadonlyArray1<'_, f32>, b: PyReadonlyArray1<'_, f32>, c: PyReadonlyArray1<'_, f32>) -> f32 {
    a.as_array().sum() + b.as_array().sum() + c.as_array().sum()
}

/// Doubles a 1-d float32 NumPy array in place.
#[pyfunction]
fn scale1(mut x: PyReadwriteArray1<'_, f32>) {
    double(&mut x);
}

/// Doubles three 1-d float32 NumPy arrays in place.
#[pyfunction]
fn scale3(mut a: PyReadwriteArray1<'_, f32>, mut b: PyReadwriteArray1<'_, f32>, mut c: PyReadwriteArray1<'_, f32>) {
    double(&mut a);
    double(&mut b);
    double(&mut c);
}

#[pymodule(gil_used = false)]
fn numpy_bench_ext(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sum1, m)?)?;
    m.add_function(wrap_pyfunction!(sum3, m)?)?;
    m.add_function(wrap_pyfunction!(scale1, m)?)?;
    m.add_function(wrap_pyfunction!(scale3, m)?)?;
    Ok(())
}
