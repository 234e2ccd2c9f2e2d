//! An extension that computes with candle and exchanges tensors with any
//! framework through `dlbridge-pyo3`: candle tensors leave without a copy (read
//! only), and any framework's tensor is read into candle with one copy.
use candle_core::{Device, Tensor as CandleTensor};
use dlbridge::{DataType, OwnedTensor};
use dlbridge_pyo3::{to_py_err, PyTensor, Tensor};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

fn candle_err(err: candle_core::Error) -> PyErr {
    PyRuntimeError::new_err(format!("candle: {err}"))
}

/// `0, 1, ..., rows*cols-1` computed by candle as a `rows x cols` tensor of
/// `dtype` (a DLPack dtype name candle has: "float32", "bfloat16", "int64",
/// ...), transposed if asked, and returned without copying: NumPy and torch
/// read candle's own memory. The tensor is read-only.
#[pyfunction]
#[pyo3(signature = (rows, cols, dtype = "float32", transpose = false))]
fn arange(rows: usize, cols: usize, dtype: &str, transpose: bool) -> PyResult<Tensor> {
    let dl: DataType = dtype.parse().map_err(to_py_err)?;
    let candle_dtype = dlbridge::dtype_to_candle(dl).map_err(to_py_err)?;
    let n = (rows * cols) as f64;
    let mut t = CandleTensor::arange(0f64, n, &Device::Cpu)
        .and_then(|t| t.reshape((rows, cols)))
        .and_then(|t| t.to_dtype(candle_dtype))
        .map_err(candle_err)?;
    if transpose {
        t = t.t().map_err(candle_err)?;
    }
    Ok(Tensor::new(OwnedTensor::from_candle(&t).map_err(to_py_err)?))
}

/// The sum of any framework's tensor (NumPy, torch, ..., any layout, any dtype
/// candle has), computed by candle in float64 on a copy of the elements.
#[pyfunction]
fn candle_sum(x: PyTensor<'_>) -> PyResult<f64> {
    let t = x.view().to_candle_copied().map_err(to_py_err)?;
    t.to_dtype(candle_core::DType::F64)
        .and_then(|t| t.sum_all())
        .and_then(|s| s.to_vec0::<f64>())
        .map_err(candle_err)
}

/// The shape and candle dtype name of a tensor read into candle.
#[pyfunction]
fn candle_describe(x: PyTensor<'_>) -> PyResult<(Vec<usize>, String)> {
    let t = x.view().to_candle_copied().map_err(to_py_err)?;
    Ok((t.dims().to_vec(), t.dtype().as_str().to_owned()))
}

/// `2 * x` computed by candle and handed back without a second copy: the
/// result's candle storage is exported as it is.
#[pyfunction]
fn candle_double(x: PyTensor<'_>) -> PyResult<Tensor> {
    let t = x.view().to_candle_copied().map_err(to_py_err)?;
    let doubled = (&t + &t).map_err(candle_err)?;
    Ok(Tensor::new(OwnedTensor::from_candle(&doubled).map_err(to_py_err)?))
}

#[pymodule(gil_used = false)]
fn candle_tensor(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(arange, m)?)?;
    m.add_function(wrap_pyfunction!(candle_sum, m)?)?;
    m.add_function(wrap_pyfunction!(candle_describe, m)?)?;
    m.add_function(wrap_pyfunction!(candle_double, m)?)?;
    Ok(())
}
