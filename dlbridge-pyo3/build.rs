//! Makes PyO3's cfgs of the target interpreter (`Py_GIL_DISABLED`, `Py_3_x`) this crate's too.
fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
