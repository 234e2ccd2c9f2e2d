//! An extension that takes any framework's tensor as an argument and returns a
//! dlbridge tensor, written with `dlbridge-pyo3`'s typed arguments: the type
//! says what the function takes, and a mismatch is a TypeError naming both.
use dlbridge_pyo3::{CContiguous, Cpu, PyTensor, PyTensorMut, Tensor};
use ndarray::{Axis, Ix2, IxDyn};
use pyo3::exceptions::PyMemoryError;
use pyo3::prelude::*;

/// Multiplies every element of a float32 CPU tensor by `factor`, in place, in
/// the caller's own memory (NumPy array, torch tensor, ...): any rank and
/// layout, negative strides included. Read-only memory (and memory whose
/// producer could not say it is writable) is refused with BufferError.
#[pyfunction]
fn scale(mut x: PyTensorMut<'_, f32, IxDyn, Cpu>, factor: f32) {
    x.as_array_mut().mapv_inplace(|v| v * factor);
}

/// The sum of a float32 CPU tensor, read without copying.
#[pyfunction]
fn total(x: PyTensor<'_, f32, IxDyn, Cpu>) -> f64 {
    x.as_array().iter().map(|&v| f64::from(v)).sum()
}

/// The sum of each row of a float32 2-d C-contiguous CPU tensor, as a new
/// tensor in Rust-owned memory.
#[pyfunction]
fn row_sums(x: PyTensor<'_, f32, Ix2, Cpu, CContiguous>) -> PyResult<Tensor> {
    Tensor::from_array(x.as_array().sum_axis(Axis(1)))
}

/// The argument itself as a dlbridge tensor over the same memory, with the
/// writability its producer gave (kept beyond the call).
#[pyfunction]
fn as_tensor(x: PyTensor<'_>) -> PyResult<Tensor> {
    Ok(Tensor::new(x.into_owned()?))
}

/// `0, 1, ..., n-1` as float32 in Rust-owned memory, returned without copying.
#[pyfunction]
fn arange(n: usize) -> PyResult<Tensor> {
    // `n` comes from Python: an allocation that fails is a MemoryError, not an abort.
    let mut values = Vec::new();
    values
        .try_reserve_exact(n)
        .map_err(|_| PyMemoryError::new_err(format!("cannot allocate {n} float32 values")))?;
    values.extend((0..n).map(|v| v as f32));
    Tensor::from_array(ndarray::Array1::from_vec(values))
}

#[pymodule(gil_used = false)]
fn scale_inplace(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(scale, m)?)?;
    m.add_function(wrap_pyfunction!(total, m)?)?;
    m.add_function(wrap_pyfunction!(row_sums, m)?)?;
    m.add_function(wrap_pyfunction!(arange, m)?)?;
    m.add_function(wrap_pyfunction!(as_tensor, m)?)?;
    Ok(())
}
