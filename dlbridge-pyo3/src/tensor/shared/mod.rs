//! Tensors in POSIX shared memory, which pickle as a handle that another
//! process maps: `dlbridge.empty(..., shared=True)`, `share_memory()`, and the
//! handles' unpickling (`dlbridge._shared` is the Python side).
//!
//! Here in Rust, not in Python, so that freeing a shared tensor runs no Python
//! code but the resource tracker's notice (`table.rs`): a daemon thread that
//! frees one while the interpreter exits cannot be ended halfway through an
//! unmap or an unlink, and the table has a lock of its own, not the GIL.
//!
//! | file | what |
//! |---|---|
//! | `segment.rs` | one segment: made or opened in `/dev/shm`, mapped, unmapped |
//! | `table.rs` | this process's segments: mapped once, unlinked by their maker, swept at exit |

#[cfg(unix)]
mod segment;
#[cfg(unix)]
mod table;
#[cfg(not(unix))]
#[path = "no_table.rs"]
mod table;

use std::sync::Arc;

use dlbridge::export::{export_raw, RawLayout};
use dlbridge::ffi::{DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED, DLPACK_FLAG_BITMASK_READ_ONLY};
use dlbridge::{DataType, Device, OwnedTensor};
use pyo3::exceptions::{PyMemoryError, PyValueError};
use pyo3::prelude::*;
use pyo3::ffi;

pub(crate) use table::Shared;
#[cfg(all(feature = "testing", unix))]
pub(crate) use segment::SKIP_FREE_SPACE_CHECK;

use super::Tensor;
use crate::convert::{parse_dtype, parse_pickled_shape};
use crate::errors::IntoPyResult;
use crate::owner::open_buffer;
use crate::python_calls::{entered, Scalar};
use crate::writability::Writability;

/// `_shared_tensor(name, size, dtype, shape, writability, padded, fill=None)`:
/// a tensor over segment `name` of `size` bytes (mapped once per process), or
/// over a new segment when `name` is None, filled with `fill`'s bytes (a
/// C-contiguous buffer of `size` bytes) if given, else zeros.
#[pyfunction]
#[pyo3(signature = (name, size, dtype, shape, writability, padded, fill=None))]
#[allow(clippy::too_many_arguments)] // a pickled handle's fields, and the bytes to fill
pub(crate) fn _shared_tensor(
    py: Python<'_>,
    name: Option<&str>,
    size: Scalar<usize>,
    dtype: &Bound<'_, PyAny>,
    shape: &Bound<'_, PyAny>,
    writability: &str,
    padded: Scalar<bool>,
    fill: Option<&Bound<'_, PyAny>>,
) -> PyResult<Tensor> {
    entered();
    let (size, padded) = (size.0, padded.0);
    let malformed = |why: String| PyValueError::new_err(format!("malformed dlbridge shared-memory handle: {why}"));
    let dtype = parse_dtype(dtype)?;
    let writability = Writability::from_name(writability).ok_or_else(|| malformed(format!("writability {writability:?}")))?;
    let shape = parse_pickled_shape(shape)?;
    let padded = padded && dtype.is_sub_byte();
    if storage_bytes(dtype, &shape, padded)? != size {
        return Err(malformed(format!("{size} bytes cannot hold shape {shape:?} of {dtype}")));
    }
    let segment = match name {
        None => {
            let made = table::create(py, size)?;
            if let Some(fill) = fill {
                copy_in(&made, fill)?;
            }
            made
        }
        Some(name) if is_segment_name(name) => table::attach(name, size)?,
        Some(name) => return Err(malformed(format!("segment {name:?}"))),
    };
    over(segment, dtype, &shape, writability, padded)
}

/// `empty(shape, dtype, shared=True)`: a zero-filled writable tensor in a new segment.
pub(crate) fn empty(py: Python<'_>, dtype: DataType, shape: &[i64]) -> PyResult<Tensor> {
    let size = storage_bytes(dtype, shape, false)?;
    over(table::create(py, size)?, dtype, shape, Writability::Writable, false)
}

/// The bytes a row-major tensor of `shape` takes.
fn storage_bytes(dtype: DataType, shape: &[i64], padded: bool) -> PyResult<usize> {
    let numel = dlbridge::layout::element_count(shape).py()?;
    dtype
        .storage_bytes(numel as u64, padded)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| PyMemoryError::new_err(format!("a shared tensor of shape {shape:?} of {dtype} does not fit in memory")))
}

/// A tensor over the whole of `segment`, which its export keeps mapped.
fn over(segment: Arc<Shared>, dtype: DataType, shape: &[i64], writability: Writability, padded: bool) -> PyResult<Tensor> {
    let mut flags = if padded { DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED } else { 0 };
    if writability == Writability::ReadOnly {
        flags |= DLPACK_FLAG_BITMASK_READ_ONLY;
    }
    let layout = RawLayout { dtype, device: Device::CPU, shape, strides: None, byte_offset: 0 };
    let base = segment.base().cast();
    // SAFETY: the mapping holds the layout's whole extent (the callers size the
    // segment by it), at least one byte, writable, for as long as the segment
    // lives, which the export holds.
    let owned: OwnedTensor = unsafe { export_raw(Arc::clone(&segment), base, layout, flags) }.py()?;
    let mut tensor = Tensor::with_writability(owned.into(), writability);
    tensor.origin = Some(segment);
    Ok(tensor)
}

/// Copies `fill` (C-contiguous, exactly the segment's size) into a segment
/// nothing else has seen yet.
fn copy_in(segment: &Shared, fill: &Bound<'_, PyAny>) -> PyResult<()> {
    let owner = open_buffer(fill, ffi::PyBUF_C_CONTIGUOUS)?;
    let buffer = owner.view();
    if usize::try_from(buffer.len).ok() != Some(segment.size) {
        return Err(PyValueError::new_err(format!("{} bytes to fill a segment of {}", buffer.len, segment.size)));
    }
    if segment.size > 0 {
        // SAFETY: the buffer holds `size` readable bytes, kept open by `owner`; the
        // segment's fresh mapping holds `size` writable ones no one else reaches.
        unsafe { core::ptr::copy_nonoverlapping(buffer.buf.cast::<u8>(), segment.base(), segment.size) };
    }
    Ok(())
}

/// `dlb<hex>_<hex>_<hex>`: what this process names its segments, and the only
/// names a handle may carry.
fn is_segment_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("dlb") else { return false };
    let parts: Vec<&str> = rest.split('_').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
}

/// `_shared_exit_sweep()`: unlinks every segment this process made and still
/// has, and tells the resource tracker (atexit, and multiprocessing's
/// finalizers); see `table.rs`.
#[pyfunction]
pub(crate) fn _shared_exit_sweep(py: Python<'_>) {
    entered();
    table::exit_sweep(py);
}

/// What `Tensor.__reduce_ex__` gives for a tensor over `segment`: a handle.
pub(crate) fn handle<'py>(py: Python<'py>, segment: &Shared, args: [Bound<'py, PyAny>; 4]) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
    let attach = super::import_package(py, "dlbridge._shared", "pickling a shared tensor")?.getattr(pyo3::intern!(py, "_attach"))?;
    let [dtype, shape, writability, padded] = args;
    let handle = (segment.name.as_str(), segment.size, dtype, shape, writability, padded);
    (attach, handle).into_pyobject(py)
}
