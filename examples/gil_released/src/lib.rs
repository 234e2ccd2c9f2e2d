//! An extension that reads and writes any framework's tensor with the GIL
//! released (`py.detach`), so that other Python threads run meanwhile. It is
//! sound because the arguments hold borrows in dlbridge-pyo3's registry,
//! shared by every extension of the process: while `fill` holds a tensor's
//! bytes, no other extension (nor dlbridge's own copies, pickles or shared
//! memory) may read or write them, and while `checksum` holds them, no one
//! may write them. Its tests drive it from many threads against every other
//! route to the same memory, and check that promise by the values seen.
use dlbridge_pyo3::{CContiguous, Cpu, PyTensor, PyTensorMut};
use pyo3::prelude::*;
use std::time::{Duration, Instant};

/// Reads `x`'s bytes for about `micros` microseconds with the GIL released:
/// their sum, and whether any byte changed while it read (never, while the
/// borrow is honoured).
#[pyfunction]
fn checksum(py: Python<'_>, x: PyTensor<'_, u8, dlbridge_pyo3::AnyRank, Cpu, CContiguous>, micros: u64) -> (u64, bool) {
    let bytes: &[u8] = x.as_slice();
    py.detach(|| {
        let first: u64 = bytes.iter().map(|&b| u64::from(b)).sum();
        let until = Instant::now() + Duration::from_micros(micros);
        let mut stable = true;
        while Instant::now() < until {
            // SAFETY: reading our shared slice; volatile, so that each pass reads
            // the memory again, as another thread's write would show.
            let again: u64 = bytes.iter().map(|b| u64::from(unsafe { core::ptr::read_volatile(b) })).sum();
            stable &= again == first;
        }
        (first, stable)
    })
}

/// Writes `value` into every byte of `x` with the GIL released, holds them for
/// about `micros` microseconds, and says whether they all still hold `value`
/// (always, while no one else may write them).
#[pyfunction]
fn fill(py: Python<'_>, mut x: PyTensorMut<'_, u8, dlbridge_pyo3::AnyRank, Cpu, CContiguous>, value: u8, micros: u64) -> bool {
    let bytes: &mut [u8] = x.as_slice_mut();
    py.detach(|| {
        bytes.fill(value);
        let until = Instant::now() + Duration::from_micros(micros);
        let mut kept = true;
        while Instant::now() < until {
            // SAFETY: reading our own exclusive slice; volatile so that each pass reads memory.
            kept &= bytes.iter().all(|b| unsafe { core::ptr::read_volatile(b) } == value);
        }
        kept
    })
}

#[pymodule(gil_used = false)]
fn gil_released(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(checksum, m)?)?;
    m.add_function(wrap_pyfunction!(fill, m)?)
}
