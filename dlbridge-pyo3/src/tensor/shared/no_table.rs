//! Without POSIX shared memory (not a Unix): every shared tensor is refused.

use std::sync::Arc;

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

/// Never made here.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) size: usize,
}

impl Shared {
    pub(crate) fn base(&self) -> *mut u8 {
        core::ptr::null_mut()
    }
}

fn refused<T>() -> PyResult<T> {
    Err(PyOSError::new_err("shared tensors need POSIX shared memory (Linux's /dev/shm)"))
}

pub(crate) fn create(_py: Python<'_>, _size: usize) -> PyResult<Arc<Shared>> {
    refused()
}

pub(crate) fn attach(_name: &str, _size: usize) -> PyResult<Arc<Shared>> {
    refused()
}

pub(crate) fn exit_sweep(_py: Python<'_>) {}
