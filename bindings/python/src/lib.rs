//! `dlbridge._native`: the Python package's native module. Everything lives in
//! `dlbridge-pyo3`; this crate only registers it.
use pyo3::prelude::*;

#[pymodule(gil_used = false)]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    dlbridge_pyo3::register(module)?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
