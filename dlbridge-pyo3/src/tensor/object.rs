//! `dlbridge.Tensor`, the Python class over a [`Tensor`]: its properties,
//! the protocols it speaks, and its methods.

use core::ffi::c_int;
use core::ops::Deref;

use dlbridge::{to_contiguous, DeviceType, OwnedTensor};
use pyo3::exceptions::{PyAttributeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use pyo3::{ffi, intern};

use super::{buffer, dlpack, pickle, tolist, Tensor};
use crate::convert::{device_tuple, DType};
use crate::errors::IntoPyResult;
use crate::python_calls::{entered, Scalar};

/// The `dlbridge.Tensor` class: immutable, over one [`Tensor`].
#[pyclass(frozen, freelist = 64, module = "dlbridge", name = "Tensor")]
pub struct TensorObject(pub(crate) Tensor);

impl Deref for TensorObject {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        &self.0
    }
}

impl From<Tensor> for TensorObject {
    fn from(tensor: Tensor) -> Self {
        TensorObject(tensor)
    }
}

#[pymethods]
impl TensorObject {
    /// Extent of each axis.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        entered();
        PyTuple::new(py, self.view().shape())
    }

    /// Number of axes.
    #[getter]
    fn ndim(&self) -> usize {
        entered();
        self.view().ndim()
    }

    /// Number of elements.
    #[getter]
    fn size(&self) -> usize {
        entered();
        self.view().len()
    }

    /// Bytes the elements take when contiguous: exact, however large (a
    /// broadcast of 2**62 float32 elements takes 2**64).
    #[getter]
    fn nbytes(&self) -> u128 {
        entered();
        let view = self.view();
        let (count, bits) = (view.len() as u128, u128::from(view.dtype().element_bits()));
        if view.is_subbyte_padded() {
            count * bits.div_ceil(8)
        } else {
            (count * bits).div_ceil(8)
        }
    }

    /// Stride of each axis, in elements; always filled in.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        entered();
        PyTuple::new(py, self.view().strides())
    }

    /// Element type.
    #[getter]
    fn dtype(&self) -> DType {
        entered();
        DType(self.view().dtype())
    }

    /// `(device_type, device_id)`, as `__dlpack_device__` returns.
    #[getter]
    fn device<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        entered();
        device_tuple(py, self.view().device())
    }

    /// Whether the data may not be written: True when the producer said so,
    /// and when it could not say (a legacy capsule).
    #[getter(readonly)]
    fn is_readonly(&self) -> bool {
        entered();
        self.readonly()
    }

    /// Whether the producer made a copy for this tensor (IS_COPIED).
    #[getter]
    fn is_copied(&self) -> bool {
        entered();
        self.owned.is_copied()
    }

    /// Address of element 0, `byte_offset` applied.
    #[getter]
    fn data_ptr(&self) -> usize {
        entered();
        self.view().as_ptr() as usize
    }

    /// `__dlpack__`, installed as a method descriptor (see `dlpack.rs`).
    #[classattr]
    #[pyo3(name = "__dlpack__")]
    fn dlpack_descriptor(py: Python<'_>) -> PyResult<Py<PyAny>> {
        entered();
        // Re-entrant during type creation: PyO3 hands out the type before
        // filling its dict with class attributes such as this one.
        let ty = py.get_type::<TensorObject>();
        let def = Box::leak(Box::new(dlpack::method_def()));
        // SAFETY: the type is live and the method definition is leaked, so it
        // outlives the descriptor, as CPython requires.
        unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyDescr_NewMethod(ty.as_type_ptr(), def)) }.map(Bound::unbind)
    }

    /// The DLPack 1.3 C exchange API: a `"dlpack_exchange_api"` capsule holding
    /// a static table shared by every tensor.
    #[classattr]
    fn __dlpack_c_exchange_api__(py: Python<'_>) -> PyResult<Py<PyAny>> {
        entered();
        super::exchange_table::exchange_api_capsule(py)
    }

    /// `(device_type, device_id)` of the memory.
    fn __dlpack_device__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        entered();
        device_tuple(py, self.view().device())
    }

    /// NumPy's array interface (version 3), for CPU-accessible tensors.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        entered();
        let device = self.view().device();
        if !device.is_cpu_accessible() {
            return Err(PyAttributeError::new_err(format!("__array_interface__ is only offered on the CPU; tensor is on {device}")));
        }
        self.wait_for_host()?;
        buffer::interface_dict(py, self)
    }

    /// The CUDA array interface (version 3), for tensors in CUDA memory.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        entered();
        let device = self.view().device();
        if !matches!(device.device_type, DeviceType::CUDA | DeviceType::CUDA_MANAGED) {
            return Err(PyAttributeError::new_err(format!("__cuda_array_interface__ is only offered for CUDA memory; tensor is on {device}")));
        }
        let dict = buffer::interface_dict(py, self)?;
        // The stream the data is ready on; None when no work is pending.
        dict.set_item("stream", self.ready_stream()?)?;
        Ok(dict)
    }

    /// Buffer protocol (CPU only): struct format, shape, byte strides, read-only state.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        entered();
        // SAFETY: CPython's own buffer request.
        unsafe { buffer::get_buffer(slf, view, flags) }
    }

    unsafe fn __releasebuffer__(&self, view: *mut ffi::Py_buffer) {
        entered();
        // SAFETY: a buffer that `__getbuffer__` filled.
        unsafe { buffer::release_buffer(view) }
    }

    /// The elements as nested Python lists (CPU only).
    fn tolist<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        entered();
        tolist::tolist(py, self.host_read(py)?.view())
    }

    /// Pickle support: out-of-band bytes with protocol 5, in-band before.
    fn __reduce_ex__<'py>(slf: &Bound<'py, Self>, protocol: Scalar<i64>) -> PyResult<Bound<'py, PyTuple>> {
        entered();
        pickle::reduce_ex(slf, protocol.0)
    }

    /// `copy.copy`: the same values and writability in new memory (see pickle.rs).
    fn __copy__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        entered();
        pickle::copy(slf)
    }

    /// `copy.deepcopy`: as `copy.copy`, since a tensor holds no Python objects.
    fn __deepcopy__<'py>(slf: &Bound<'py, Self>, _memo: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        entered();
        pickle::copy(slf)
    }

    /// The bytes of a C-contiguous CPU tensor as a 1-d uint8 tensor sharing them.
    fn _bytes(slf: &Bound<'_, Self>) -> PyResult<Tensor> {
        entered();
        pickle::bytes_view(slf)
    }

    /// "writable", "readonly" or "unknown" (see the README's Writability).
    #[getter]
    fn _writability(&self) -> &'static str {
        entered();
        self.writability.name()
    }

    /// Whether a sub-byte dtype is stored one element per byte (IS_SUBBYTE_TYPE_PADDED).
    #[getter]
    fn _subbyte_padded(&self) -> bool {
        entered();
        self.view().is_subbyte_padded()
    }

    /// A tensor with the same values in a shared-memory segment (this one if
    /// it already is): pickling it sends a handle, and the receiving process
    /// maps the same memory. See `dlbridge.share_memory`.
    fn share_memory<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        entered();
        if slf.get().origin.is_some() {
            return Ok(slf.clone().into_any());
        }
        let py = slf.py();
        let share = super::import_package(py, "dlbridge._shared", "share_memory()")?.getattr(intern!(py, "share_memory"))?;
        crate::python_calls::call1(&share, slf.as_any())
    }

    /// Whether the data lives in a shared-memory segment that pickles as a handle.
    #[getter]
    fn is_shared(&self) -> bool {
        entered();
        self.origin.is_some()
    }

    /// A NumPy array over this tensor's memory, zero-copy and as writable as
    /// the tensor; `ml_dtypes` types (bfloat16, float8, ...) for the dtypes
    /// NumPy lacks. A packed sub-byte tensor is unpacked into a new array.
    fn numpy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        entered();
        // Whatever route NumPy is given below, host code reads the memory next.
        slf.get().check_host_access()?;
        let py = slf.py();
        let to_numpy = super::import_package(py, "dlbridge._numpy", "numpy()")?.getattr(intern!(py, "to_numpy"))?;
        crate::python_calls::call1(&to_numpy, slf.as_any())
    }

    /// A C-contiguous copy in fresh memory that Rust owns.
    fn copy(&self, py: Python<'_>) -> PyResult<Tensor> {
        entered();
        let copied: OwnedTensor = to_contiguous(self.host_read(py)?.view()).py()?;
        Ok(Tensor::new(copied))
    }

    fn __len__(&self) -> PyResult<usize> {
        entered();
        self.view()
            .shape()
            .first()
            .map(|&d| d as usize)
            .ok_or_else(|| PyTypeError::new_err("len() of a 0-d tensor"))
    }

    fn __repr__(&self) -> String {
        entered();
        let view = self.view();
        let shape: Vec<String> = view.shape().iter().map(i64::to_string).collect();
        let shape = if shape.len() == 1 { format!("({},)", shape[0]) } else { format!("({})", shape.join(", ")) };
        let ro = if self.readonly() { ", readonly" } else { "" };
        format!("Tensor(shape={shape}, dtype={}, device={}{ro})", view.dtype(), view.device())
    }
}
