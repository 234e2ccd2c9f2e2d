//! An extension that takes any framework's tensor as an argument and returns a
//! dlbridge tensor, written with `dlbridge-pyo3`.
use dlbridge_pyo3::{to_py_err, PyTensor, PyTensorMut, Tensor};
use ndarray::IxDyn;
use pyo3::prelude::*;

/// Multiplies every element of a float32 tensor by `factor`, in place, in the
/// caller's own memory (NumPy array, torch tensor, ...): any layout, negative
/// strides included. Read-only memory (and memory whose producer could not say
/// it is writable) is refused with BufferError.
#[pyfunction]
fn scale(mut x: PyTensorMut<'_>, factor: f32) -> PyResult<()> {
    let mut view = x.view_mut()?;
    let mut array = view.try_as_array_mut::<f32, IxDyn>().map_err(to_py_err)?;
    array.mapv_inplace(|v| v * factor);
    Ok(())
}

/// The sum of a float32 tensor, read without copying.
#[pyfunction]
fn total(x: PyTensor<'_>) -> PyResult<f64> {
    let array = x.view().try_as_array::<f32, IxDyn>().map_err(to_py_err)?;
    Ok(array.iter().map(|&v| f64::from(v)).sum())
}

/// `0, 1, ..., n-1` as float32 in Rust-owned memory, returned without copying.
#[pyfunction]
fn arange(n: usize) -> PyResult<Tensor> {
    Tensor::from_array(ndarray::Array1::from_iter((0..n).map(|v| v as f32)))
}

#[pymodule]
fn scale_inplace(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scale, m)?)?;
    m.add_function(wrap_pyfunction!(total, m)?)?;
    m.add_function(wrap_pyfunction!(arange, m)?)?;
    Ok(())
}
