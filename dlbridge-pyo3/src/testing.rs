//! Hooks for dlbridge's own test suite, built only with the `testing` feature
//! (the development build of the Python package turns it on; wheels do not).

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::import::{from_dlpack, ImportOptions};

/// How often each function of dlbridge's exchange-API table ran: a dict with
/// keys allocator, from_py_object, to_py_object, dltensor_from_py_object and
/// current_work_stream. For tests that must prove a consumer took the fast path.
#[pyfunction]
fn _exchange_api_calls(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let names = ["allocator", "from_py_object", "to_py_object", "dltensor_from_py_object", "current_work_stream"];
    let dict = PyDict::new(py);
    for (name, calls) in names.iter().zip(&crate::tensor::CALLS) {
        dict.set_item(name, calls.load(std::sync::atomic::Ordering::Relaxed))?;
    }
    Ok(dict)
}

/// Imports `x` through DLPack and drops the owned tensor on a new Rust thread
/// that has never held the GIL, while this thread waits with the GIL released:
/// the producer's deleter must cope.
#[pyfunction]
fn _drop_on_rust_thread(py: Python<'_>, x: &Bound<'_, PyAny>) -> PyResult<()> {
    let owned = from_dlpack(x, ImportOptions::default())?;
    py.detach(|| std::thread::spawn(move || drop(owned)).join())
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("the dropping thread panicked"))
}

/// Whether the GIL check (which decides whether a blocking driver call
/// detaches) answers yes here, and no on a Rust thread that runs while this
/// one holds the GIL: before 3.12 the current thread state is global, and a
/// check that reads only it answers yes on every thread.
#[pyfunction]
fn _holds_gil_here_and_elsewhere() -> PyResult<(bool, bool)> {
    let elsewhere = std::thread::spawn(crate::gil::holds_gil)
        .join()
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("the checking thread panicked"))?;
    Ok((crate::gil::holds_gil(), elsewhere))
}

/// Skips (or not) the free-space check of new shared-memory segments, so that
/// tests can see the reservation alone refuse.
#[cfg(unix)]
#[pyfunction]
fn _skip_shared_free_space_check(skip: bool) {
    crate::tensor::SKIP_FREE_SPACE_CHECK.store(skip, std::sync::atomic::Ordering::Relaxed);
}

/// Trusts the exchange table in `capsule` (a `"dlpack_exchange_api"` capsule a
/// test made with ctypes) as if a static type published it, so that tests can
/// drive the table path with classes of their own.
#[pyfunction]
fn _trust_table_for_tests(capsule: &Bound<'_, PyAny>) -> PyResult<()> {
    let name = crate::exchange::EXCHANGE_API_CAPSULE_NAME;
    // SAFETY: a name check, then the pointer of a capsule of that name.
    let address = unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule.as_ptr(), name.as_ptr()) != 1 {
            return Err(pyo3::exceptions::PyTypeError::new_err("not a dlpack_exchange_api capsule"));
        }
        pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), name.as_ptr())
    };
    crate::trust::trust_table_for_tests(capsule.py(), address as usize)
}

/// How many argument borrows are live: 0 between extension calls.
#[pyfunction]
fn _live_borrows(py: Python<'_>) -> usize {
    crate::borrows::live_count(py)
}

/// Reads `x` as a [`PyTensor`](crate::PyTensor) and `y` as a
/// [`PyTensorMut`](crate::PyTensorMut), and adds 1 to each element of `y`:
/// lets Python tests drive the argument types and their borrow checks.
#[pyfunction]
fn _read_then_write(x: crate::PyTensor<'_>, mut y: crate::PyTensorMut<'_>) -> PyResult<usize> {
    let n = x.view().len();
    let mut view = y.view_mut()?;
    for v in view.try_as_slice_mut::<u8>().map_err(crate::to_py_err)? {
        *v = v.wrapping_add(1);
    }
    Ok(n)
}

/// Holds `x` as a [`PyTensor`](crate::PyTensor), or with `writable` as a
/// [`PyTensorMut`](crate::PyTensorMut) after setting each byte to 1, while it
/// calls `callback()`: lets tests run Python code (another extension,
/// dlbridge's own readers, a producer changing its metadata) while a borrow is
/// live. Returns the callback's result and the shape `x` has afterwards.
#[pyfunction]
#[pyo3(signature = (x, callback, writable=false))]
fn _while_borrowed<'py>(x: &Bound<'py, PyAny>, callback: &Bound<'py, PyAny>, writable: bool) -> PyResult<(Bound<'py, PyAny>, Vec<i64>)> {
    if writable {
        let mut x = x.extract::<crate::PyTensorMut<'_>>()?;
        x.view_mut()?.try_as_slice_mut::<u8>().map_err(crate::to_py_err)?.fill(1);
        let result = callback.call0()?;
        Ok((result, x.view().shape().to_vec()))
    } else {
        let x = x.extract::<crate::PyTensor<'_>>()?;
        let result = callback.call0()?;
        Ok((result, x.view().shape().to_vec()))
    }
}

/// The stream an extension's argument `x` is ready on: extracted as a
/// [`PyTensor`](crate::PyTensor), or with `extract_on_stream` when `stream` is
/// given; with `writable`, as a [`PyTensorMut`](crate::PyTensorMut).
#[pyfunction]
#[pyo3(signature = (x, stream=None, writable=false))]
fn _argument_ready_stream(x: &Bound<'_, PyAny>, stream: Option<i64>, writable: bool) -> PyResult<Option<i64>> {
    // SAFETY: a raw stream value from Python, as `from_dlpack(stream=)` takes one.
    let stream = stream.map(|s| unsafe { dlbridge::streams::Stream::from_raw(s) });
    Ok(match (writable, stream) {
        (false, None) => x.extract::<crate::PyTensor<'_>>()?.ready_stream(),
        (false, Some(s)) => <crate::PyTensor>::extract_on_stream(x, s)?.ready_stream(),
        (true, None) => x.extract::<crate::PyTensorMut<'_>>()?.ready_stream(),
        (true, Some(s)) => <crate::PyTensorMut>::extract_on_stream(x, s)?.ready_stream(),
    })
}

/// How many tensors exported by [`_contract_breaking_table`] have been deleted.
static BROKEN_TABLE_DELETIONS: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);

/// Values whose drop is counted: the owner behind the broken table's exports.
struct Counted(Vec<f32>);

impl core::ops::Deref for Counted {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.0
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        BROKEN_TABLE_DELETIONS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
    }
}

/// Exports a valid tensor, then returns 0 with a Python exception still set,
/// which the API forbids.
unsafe extern "C" fn export_then_leave_an_exception(_object: *mut core::ffi::c_void, out: *mut *mut dlbridge::ffi::DLManagedTensorVersioned) -> core::ffi::c_int {
    let Ok(tensor) = dlbridge::OwnedTensor::from_owner(Counted(vec![1.0, 2.0]), &[2], None) else { return -1 };
    // SAFETY: the caller's out pointer; the GIL is held, as the API requires.
    unsafe {
        *out = tensor.into_raw();
        pyo3::ffi::PyErr_SetString(pyo3::ffi::PyExc_RuntimeError, c"left set by a broken table".as_ptr());
    }
    0
}

static BROKEN_TABLE: dlbridge::ffi::DLPackExchangeAPI = dlbridge::ffi::DLPackExchangeAPI {
    header: dlbridge::ffi::DLPackExchangeAPIHeader { version: dlbridge::ffi::DLPackVersion::CURRENT, prev_api: core::ptr::null_mut() },
    managed_tensor_allocator: None,
    managed_tensor_from_py_object_no_sync: Some(export_then_leave_an_exception),
    managed_tensor_to_py_object_no_sync: None,
    dltensor_from_py_object_no_sync: None,
    current_work_stream: None,
};

/// A "dlpack_exchange_api" capsule whose export succeeds but leaves a Python
/// exception set, and how many of its exports were deleted so far.
#[pyfunction]
fn _contract_breaking_table(py: Python<'_>) -> PyResult<(Py<PyAny>, usize)> {
    let table = core::ptr::addr_of!(BROKEN_TABLE).cast_mut().cast();
    // SAFETY: a static table outlives the capsule; no destructor is needed.
    let capsule = unsafe {
        Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyCapsule_New(table, crate::exchange::EXCHANGE_API_CAPSULE_NAME.as_ptr(), None))?
    };
    Ok((capsule.unbind(), BROKEN_TABLE_DELETIONS.load(core::sync::atomic::Ordering::Relaxed)))
}

/// Adds the test hooks to `module`.
/// Imports `x` (a CUDA tensor) and copies it to the host on a new Rust thread
/// that has never held the GIL, while this thread waits with the GIL released:
/// the blocking hook must run the driver's calls there without detaching.
#[pyfunction]
fn _cuda_to_host_on_rust_thread(py: Python<'_>, x: &Bound<'_, PyAny>) -> PyResult<Vec<f32>> {
    let owned = from_dlpack(x, ImportOptions::default())?;
    crate::gil::release_in_driver_calls();
    let copied = py
        .detach(|| {
            std::thread::spawn(move || {
                // SAFETY: no stream: the data is taken as ready (a raw import).
                let host: dlbridge::OwnedTensor = unsafe { dlbridge::cuda::to_host(owned.view(), None, false) }.map_err(|e| e.to_string())?;
                Ok::<Vec<f32>, String>(host.view().as_slice::<f32>().map(<[f32]>::to_vec).unwrap_or_default())
            })
            .join()
        })
        .map_err(|_| pyo3::exceptions::PyRuntimeError::new_err("the copying thread panicked"))?;
    copied.map_err(pyo3::exceptions::PyBufferError::new_err)
}

/// Loads `ptx` on device `device_id`, takes its kernel `name` and launches it
/// on one thread on `stream` with `args`, each `(C type, value)` for u32, u64,
/// f32 or f64: lets tests see the driver's PTX errors and the argument checks.
///
/// Only for kernels that touch no memory with these arguments.
#[pyfunction]
fn _cuda_launch(device_id: i32, ptx: &str, name: &str, args: Vec<(String, f64)>, stream: i64) -> PyResult<()> {
    use dlbridge::cuda::{KernelArg, LaunchConfig, Module};
    let err = |e: dlbridge::Error| crate::to_py_err(e);
    let ptx = std::ffi::CString::new(ptx).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    let name = std::ffi::CString::new(name).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    let function = Module::from_ptx(device_id, &ptx).and_then(|m| m.function(&name)).map_err(err)?;
    let (mut u32s, mut u64s, mut f32s, mut f64s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (kind, value) in &args {
        match kind.as_str() {
            "u32" => u32s.push(*value as u32),
            "u64" => u64s.push(*value as u64),
            "f32" => f32s.push(*value as f32),
            "f64" => f64s.push(*value),
            other => return Err(pyo3::exceptions::PyValueError::new_err(format!("no C type {other}"))),
        }
    }
    let (mut a, mut b, mut c, mut d) = (u32s.iter(), u64s.iter(), f32s.iter(), f64s.iter());
    let kernel_args: Vec<KernelArg<'_>> = args
        .iter()
        .filter_map(|(kind, _)| match kind.as_str() {
            "u32" => a.next().map(KernelArg::new),
            "u64" => b.next().map(KernelArg::new),
            "f32" => c.next().map(KernelArg::new),
            _ => d.next().map(KernelArg::new),
        })
        .collect();
    let config = LaunchConfig { grid: [1, 1, 1], block: [1, 1, 1], shared_mem_bytes: 0 };
    // SAFETY: a stream value from the test, and kernels that touch no memory
    // with the arguments the test passes (this function's contract).
    unsafe { function.launch(config, dlbridge::streams::Stream::from_raw(stream), &kernel_args) }.map_err(err)
}

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(_cuda_launch, module)?)?;
    module.add_function(wrap_pyfunction!(_cuda_to_host_on_rust_thread, module)?)?;
    module.add_function(wrap_pyfunction!(_exchange_api_calls, module)?)?;
    module.add_function(wrap_pyfunction!(_drop_on_rust_thread, module)?)?;
    module.add_function(wrap_pyfunction!(_live_borrows, module)?)?;
    module.add_function(wrap_pyfunction!(_holds_gil_here_and_elsewhere, module)?)?;
    module.add_function(wrap_pyfunction!(_read_then_write, module)?)?;
    module.add_function(wrap_pyfunction!(_while_borrowed, module)?)?;
    module.add_function(wrap_pyfunction!(_argument_ready_stream, module)?)?;
    module.add_function(wrap_pyfunction!(_contract_breaking_table, module)?)?;
    module.add_function(wrap_pyfunction!(_trust_table_for_tests, module)?)?;
    #[cfg(unix)]
    module.add_function(wrap_pyfunction!(_skip_shared_free_space_check, module)?)?;
    Ok(())
}
