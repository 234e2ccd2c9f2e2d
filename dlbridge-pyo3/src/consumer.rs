//! Consumer side: take a tensor from any Python producer.
//!
//! [`from_dlpack`] speaks DLPack only: raw capsules and `__dlpack__`, with the
//! array-API negotiation (ask for `max_version=(1, 3)`, pass `dl_device` and
//! `copy` only when asked, retry with no keywords on TypeError, which also
//! serves early-draft producers). [`import_any`] adds the buffer protocol,
//! `__array_interface__` and `__cuda_array_interface__`.

use core::ffi::c_void;

use dlbridge::export::{export_raw, RawLayout};
use dlbridge::ffi::DLPACK_FLAG_BITMASK_READ_ONLY;
use dlbridge::ffi::DLTensor;
use dlbridge::{to_contiguous, DataType, DataTypeCode, Device, DeviceType, ManagedTensor, TensorView, TensorViewMut};
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple};
use pyo3::{ffi, intern, Borrowed};

use crate::capsule::{consume_capsule, is_capsule, AnyManaged};
use crate::errors::IntoPyResult;
use crate::exchange;
use crate::owner::{BufferOwner, PyOwner};
use crate::tensor::Tensor;

/// What the caller asks of an import.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// The device the result must be on; `None` keeps the producer's.
    pub device: Option<Device>,
    /// `Some(true)`: the result owns fresh memory. `Some(false)`: never copy.
    /// `None`: copy only if needed.
    pub copy: Option<bool>,
}

/// Parses a `device` argument: None, `"cpu"`, or a `(device_type, device_id)` tuple.
pub fn parse_device(device: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Device>> {
    let Some(device) = device else { return Ok(None) };
    if device.is_none() {
        return Ok(None);
    }
    if let Ok(name) = device.cast::<PyString>() {
        let name = name.to_str()?;
        return match name {
            "cpu" => Ok(Some(Device::CPU)),
            other => Err(PyValueError::new_err(format!(
                "device {other:?} is not understood: use None, \"cpu\" or a (device_type, device_id) tuple"
            ))),
        };
    }
    parse_device_tuple(device, "device").map(Some)
}

/// Parses a `(device_type, device_id)` tuple, as `__dlpack_device__` returns and
/// `dl_device` takes; IntEnum members are accepted.
pub(crate) fn parse_device_tuple(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Device> {
    let bad = || PyTypeError::new_err(format!("{what} must be a (device_type, device_id) tuple of ints, got {obj}"));
    let tuple = obj.cast::<PyTuple>().map_err(|_| bad())?;
    if tuple.len() != 2 {
        return Err(bad());
    }
    let device_type: i32 = tuple.get_item(0)?.extract().map_err(|_| bad())?;
    let device_id: i32 = tuple.get_item(1)?.extract().map_err(|_| bad())?;
    Ok(Device::new(DeviceType(device_type), device_id))
}

/// The keyword names of a `__dlpack__` call, cached per combination of the
/// optional `dl_device` and `copy`.
// Cannot fire: making a tuple of interned strings fails only on out-of-memory.
#[allow(clippy::expect_used)]
fn kwnames(py: Python<'_>, dl_device: bool, copy: bool) -> &Bound<'_, PyTuple> {
    static CACHE: [PyOnceLock<Py<PyTuple>>; 4] = [const { PyOnceLock::new() }; 4];
    let index = usize::from(dl_device) | usize::from(copy) << 1;
    CACHE[index]
        .get_or_init(py, || {
            let mut names = vec![intern!(py, "max_version")];
            if dl_device {
                names.push(intern!(py, "dl_device"));
            }
            if copy {
                names.push(intern!(py, "copy"));
            }
            PyTuple::new(py, names).expect("a tuple of strings").unbind()
        })
        .bind(py)
}

// Cannot fire: making a tuple of two small ints fails only on out-of-memory.
#[allow(clippy::expect_used)]
fn max_version_arg(py: Python<'_>) -> &Bound<'_, PyTuple> {
    static MAX_VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    MAX_VERSION
        .get_or_init(py, || {
            let v = dlbridge::ffi::DLPackVersion::CURRENT;
            PyTuple::new(py, [v.major, v.minor]).expect("a tuple of ints").unbind()
        })
        .bind(py)
}

/// `obj.__dlpack__(max_version=(1, 3)[, dl_device=..][, copy=..])` by vectorcall,
/// with interned names and no dict.
fn call_dlpack_versioned<'py>(obj: &Bound<'py, PyAny>, options: ImportOptions) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let device_arg = options.device.map(|d| PyTuple::new(py, [d.device_type.0, d.device_id])).transpose()?;
    let copy_arg = options.copy.map(|c| pyo3::types::PyBool::new(py, c).to_owned().into_any());
    let mut args: [*mut ffi::PyObject; 4] = [obj.as_ptr(), max_version_arg(py).as_ptr(), core::ptr::null_mut(), core::ptr::null_mut()];
    let keywords = [device_arg.as_ref().map(|d| d.as_any()), copy_arg.as_ref()];
    for (slot, value) in args[2..].iter_mut().zip(keywords.into_iter().flatten()) {
        *slot = value.as_ptr();
    }
    let names = kwnames(py, device_arg.is_some(), copy_arg.is_some());
    // SAFETY: `args` holds self followed by one value per keyword name, all
    // borrowed from live objects for the duration of the call; nargsf counts
    // self only.
    unsafe {
        let result = ffi::PyObject_VectorcallMethod(intern!(py, "__dlpack__").as_ptr(), args.as_ptr(), 1, names.as_ptr());
        Bound::from_owned_ptr_or_err(py, result)
    }
}

/// Turns a failed `__dlpack__` lookup into the TypeError that `from_dlpack` raises.
fn no_dlpack(obj: &Bound<'_, PyAny>) -> PyErr {
    let name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
    PyTypeError::new_err(format!(
        "object of type {name} does not support DLPack: it has no __dlpack__ method and is not a DLPack capsule"
    ))
}

fn has_dlpack(obj: &Bound<'_, PyAny>) -> bool {
    obj.hasattr(intern!(obj.py(), "__dlpack__")).unwrap_or(false)
}

/// Calls `__dlpack__` with the array-API negotiation and returns its capsule.
fn request_capsule<'py>(obj: &Bound<'py, PyAny>, options: ImportOptions) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let mut attempt = call_dlpack_versioned(obj, options);
    if options != ImportOptions::default() && matches!(&attempt, Err(err) if err.is_instance_of::<PyTypeError>(py)) {
        // A producer that knows max_version but not the newer dl_device/copy:
        // ask again without them; `finish` applies them afterwards.
        attempt = call_dlpack_versioned(obj, ImportOptions::default());
    }
    let capsule = match attempt {
        Ok(capsule) => capsule,
        Err(err) if err.is_instance_of::<PyTypeError>(py) => {
            // A producer that predates max_version: retry with no keywords.
            // Early-draft producers land here too and return their legacy
            // capsule, the only ABI of the draft whose layout is certain.
            obj.call_method0(intern!(py, "__dlpack__")).map_err(|retry_err| {
                if retry_err.is_instance_of::<PyAttributeError>(py) && !has_dlpack(obj) {
                    no_dlpack(obj)
                } else {
                    retry_err
                }
            })?
        }
        Err(err) if err.is_instance_of::<PyAttributeError>(py) && !has_dlpack(obj) => return Err(no_dlpack(obj)),
        Err(err) => return Err(err),
    };
    if !is_capsule(&capsule) {
        let kind = capsule.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        return Err(PyTypeError::new_err(format!("__dlpack__ returned a {kind}, not a DLPack capsule")));
    }
    Ok(capsule)
}

/// Applies `device` and `copy` to an imported tensor.
fn finish(managed: AnyManaged, options: ImportOptions) -> PyResult<AnyManaged> {
    let device = managed.view().device();
    if let Some(wanted) = options.device {
        let reachable = wanted == device || (wanted == Device::CPU && device.is_cpu_accessible());
        if !reachable {
            if options.copy == Some(false) {
                return Err(PyValueError::new_err(format!(
                    "the tensor is on {device}, not {wanted}, and copy=False forbids moving it"
                )));
            }
            return Err(PyBufferError::new_err(format!("cannot move a tensor from {device} to {wanted}")));
        }
    }
    match options.copy {
        Some(true) if !managed.is_copied() => {
            let copied: ManagedTensor = to_contiguous(managed.view()).py()?;
            Ok(AnyManaged::Versioned(copied))
        }
        Some(false) if managed.is_copied() => Err(PyBufferError::new_err(
            "the producer copied the data (IS_COPIED is set) although copy=False was requested",
        )),
        _ => Ok(managed),
    }
}

/// A new tensor sharing the memory of one of our own `Tensor` objects, exported
/// as `__dlpack__` would (flags included) but without a capsule.
fn share_tensor(tensor: &Bound<'_, Tensor>) -> PyResult<AnyManaged> {
    Tensor::export_versioned(tensor).map(AnyManaged::Versioned)
}

/// NumPy's public array struct (`PyArrayObject_fields`), up to `flags`; these
/// fields have the same offsets in NumPy 1.x and 2.x.
#[repr(C)]
struct NumpyArrayFields {
    ob_base: ffi::PyObject,
    data: *mut c_void,
    nd: core::ffi::c_int,
    dimensions: *const isize,
    strides: *const isize,
    base: *mut ffi::PyObject,
    descr: *const NumpyDescrFields,
    flags: core::ffi::c_int,
}

/// The head of NumPy's `PyArray_Descr`, up to `type_num` (same offsets in 1.x and 2.x).
#[repr(C)]
struct NumpyDescrFields {
    ob_base: ffi::PyObject,
    typeobj: *mut ffi::PyTypeObject,
    kind: core::ffi::c_char,
    type_char: core::ffi::c_char,
    byteorder: core::ffi::c_char,
    former_flags: core::ffi::c_char,
    type_num: core::ffi::c_int,
}

const NPY_ARRAY_WRITEABLE: core::ffi::c_int = 0x0400;

/// The dtype of a NumPy builtin type number, for the types DLPack shares with NumPy.
fn numpy_dtype(type_num: core::ffi::c_int) -> Option<DataType> {
    let long = if core::mem::size_of::<core::ffi::c_long>() == 8 { (DataType::INT64, DataType::UINT64) } else { (DataType::INT32, DataType::UINT32) };
    Some(match type_num {
        0 => DataType::BOOL,
        1 => DataType::INT8,
        2 => DataType::UINT8,
        3 => DataType::INT16,
        4 => DataType::UINT16,
        5 => DataType::INT32,
        6 => DataType::UINT32,
        7 => long.0,
        8 => long.1,
        9 => DataType::INT64,
        10 => DataType::UINT64,
        11 => DataType::FLOAT32,
        12 => DataType::FLOAT64,
        14 => DataType::COMPLEX64,
        15 => DataType::COMPLEX128,
        23 => DataType::FLOAT16,
        _ => return None,
    })
}

/// `numpy.ndarray`, once seen (a static type: it lives as long as the process).
static NDARRAY_TYPE: core::sync::atomic::AtomicPtr<ffi::PyTypeObject> = core::sync::atomic::AtomicPtr::new(core::ptr::null_mut());

fn is_exact_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    use core::sync::atomic::Ordering;
    // SAFETY: reading the type of a live object.
    let ty = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    let known = NDARRAY_TYPE.load(Ordering::Relaxed);
    if !known.is_null() {
        return ty == known;
    }
    // SAFETY: `tp_name` of a live type is a NUL-terminated string.
    let name = unsafe { core::ffi::CStr::from_ptr((*ty).tp_name) };
    if name.to_bytes() == b"numpy.ndarray" {
        NDARRAY_TYPE.store(ty, Ordering::Relaxed);
        return true;
    }
    false
}

/// Zero-copy import of an exact `numpy.ndarray` of a standard numeric dtype,
/// read from NumPy's public struct instead of a capsule: the same tensor that
/// `__dlpack__` would give (READ_ONLY when not writeable), without NumPy's
/// allocation and deleter. `None` for anything else, which goes through `__dlpack__`.
fn numpy_fast_path(obj: &Bound<'_, PyAny>) -> PyResult<Option<ManagedTensor>> {
    if !is_exact_ndarray(obj) {
        return Ok(None);
    }
    // SAFETY: `obj` is an exact numpy.ndarray, whose object starts with these
    // public fields; its descr is a live PyArray_Descr.
    let (array, descr) = unsafe {
        let array = &*obj.as_ptr().cast::<NumpyArrayFields>();
        (array, &*array.descr)
    };
    let native = if cfg!(target_endian = "little") { b'<' } else { b'>' };
    let Some(dtype) = numpy_dtype(descr.type_num) else { return Ok(None) };
    if !matches!(descr.byteorder as u8, b'=' | b'|') && descr.byteorder as u8 != native {
        return Ok(None);
    }
    let ndim = match usize::try_from(array.nd) {
        Ok(n) if n <= dlbridge::MAX_NDIM => n,
        _ => return Ok(None),
    };
    let itemsize = dtype.itemsize().unwrap_or(1) as isize;
    let (dims, byte_strides) = if ndim == 0 {
        (&[][..], &[][..])
    } else {
        // SAFETY: a live array with nd > 0 has `nd` dimensions and strides, which
        // live as long as the array.
        unsafe { (core::slice::from_raw_parts(array.dimensions, ndim), core::slice::from_raw_parts(array.strides, ndim)) }
    };
    if dims.iter().zip(byte_strides).any(|(&d, &s)| d > 1 && s % itemsize != 0) {
        return Ok(None); // NumPy's own export refuses these; let it say so.
    }
    let flags = if array.flags & NPY_ARRAY_WRITEABLE == 0 { DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 };
    let shape = crate::consumer::small_i64(dims, |d| d as i64);
    let strides = crate::consumer::small_i64(byte_strides, |s| (s / itemsize) as i64);
    let layout = RawLayout { dtype, device: Device::CPU, shape: shape.as_slice(), strides: Some(strides.as_slice()), byte_offset: 0 };
    // SAFETY: the array's data is valid for its own layout for as long as the
    // array lives, which the owner guarantees; the layout is validated again.
    let managed = unsafe { export_raw(PyOwner::new(obj), array.data, layout, flags) }.py()?;
    Ok(Some(managed))
}

/// Up to 8 values on the stack, more on the heap.
pub(crate) enum SmallI64 {
    Inline([i64; 8], usize),
    Heap(Vec<i64>),
}

impl SmallI64 {
    pub(crate) fn as_slice(&self) -> &[i64] {
        match self {
            SmallI64::Inline(values, len) => &values[..*len],
            SmallI64::Heap(values) => values,
        }
    }
}

pub(crate) fn small_i64(values: &[isize], map: impl Fn(isize) -> i64) -> SmallI64 {
    if values.len() <= 8 {
        let mut out = [0i64; 8];
        for (slot, &v) in out.iter_mut().zip(values) {
            *slot = map(v);
        }
        SmallI64::Inline(out, values.len())
    } else {
        SmallI64::Heap(values.iter().map(|&v| map(v)).collect())
    }
}

/// Imports through DLPack: a raw `dltensor`/`dltensor_versioned` capsule (which
/// is consumed) or any object with `__dlpack__`.
///
/// Raises TypeError for an object with neither, ValueError for a used or
/// foreign capsule, BufferError for a tensor that cannot be imported, and
/// ValueError when `copy=False` forbids a needed copy.
pub fn from_dlpack(obj: &Bound<'_, PyAny>, options: ImportOptions) -> PyResult<AnyManaged> {
    if let Ok(tensor) = obj.cast_exact::<Tensor>() {
        return finish(share_tensor(tensor)?, options);
    }
    if is_capsule(obj) {
        return finish(consume_capsule(obj)?, options);
    }
    if let Some(managed) = numpy_fast_path(obj)? {
        return finish(AnyManaged::Versioned(managed), options);
    }
    if let Some(api) = exchange::lookup(obj) {
        if let Some(managed) = exchange::import_owned(obj, api)? {
            return finish(AnyManaged::Versioned(managed), options);
        }
    }
    let capsule = match request_capsule(obj, options) {
        // A producer that cannot copy still gets the caller a copy: import the
        // tensor as it is, then copy here. tvm-ffi refuses with BufferError,
        // TensorFlow with RuntimeError; if the plain import fails too, the
        // producer's first answer is the one reported.
        Err(err) if options.copy == Some(true) => {
            request_capsule(obj, ImportOptions { copy: None, ..options }).map_err(|_| err)?
        }
        other => other?,
    };
    finish(consume_capsule(&capsule)?, options)
}

/// Imports from anything that exposes DLPack, the buffer protocol,
/// `__array_interface__` or `__cuda_array_interface__`, tried in that order.
pub fn import_any(obj: &Bound<'_, PyAny>, copy: Option<bool>) -> PyResult<AnyManaged> {
    let py = obj.py();
    let options = ImportOptions { device: None, copy };
    if obj.cast_exact::<Tensor>().is_ok() || is_capsule(obj) || has_dlpack(obj) {
        return from_dlpack(obj, options);
    }
    // SAFETY: a type-slot check on a live object.
    let managed = if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 1 {
        import_buffer(obj)?
    } else if let Some(interface) = optional_attr(obj, intern!(py, "__array_interface__"))? {
        import_array_interface(obj, &interface)?
    } else if let Some(interface) = optional_attr(obj, intern!(py, "__cuda_array_interface__"))? {
        import_cuda_array_interface(obj, &interface)?
    } else {
        let name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        return Err(PyTypeError::new_err(format!(
            "cannot make a tensor from {name}: it has no __dlpack__, buffer protocol, __array_interface__ or __cuda_array_interface__"
        )));
    };
    finish(managed, options)
}

fn optional_attr<'py>(obj: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> PyResult<Option<Bound<'py, PyAny>>> {
    match obj.getattr(name) {
        Ok(value) => Ok(Some(value)),
        Err(err) if err.is_instance_of::<PyAttributeError>(obj.py()) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Imports a buffer-protocol exporter (bytes, bytearray, memoryview,
/// array.array, mmap, ...) without copying; the buffer stays open until the
/// tensor is freed.
pub fn import_buffer(obj: &Bound<'_, PyAny>) -> PyResult<AnyManaged> {
    // SAFETY: Py_buffer is plain data; GetBuffer fills it or fails.
    let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { core::mem::zeroed() });
    // SAFETY: `obj` is live and `view` is writable; on success the view must be
    // released once, which `BufferOwner` does.
    if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_RECORDS_RO) } != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    let owner = BufferOwner::new(view);
    let view = owner.view();
    let format = if view.format.is_null() {
        "B".to_owned()
    } else {
        // SAFETY: a filled view's non-NULL `format` is a C string that lives as long as the view.
        unsafe { core::ffi::CStr::from_ptr(view.format) }.to_string_lossy().into_owned()
    };
    let dtype = DataType::from_buffer_format(&format).ok_or_else(|| {
        PyBufferError::new_err(format!("buffer format {format:?} has no DLPack dtype (or is not in native byte order)"))
    })?;
    let itemsize = view.itemsize as i64;
    if dtype.itemsize() != Some(view.itemsize as usize) {
        return Err(PyBufferError::new_err(format!("buffer itemsize {itemsize} does not match format {format:?}")));
    }
    if !view.suboffsets.is_null() {
        return Err(PyBufferError::new_err("buffers with suboffsets (PIL-style arrays) cannot be described by DLPack"));
    }
    let ndim = usize::try_from(view.ndim).map_err(|_| PyBufferError::new_err("negative buffer ndim"))?;
    let (shape, strides): (Vec<i64>, Vec<i64>) = if view.shape.is_null() {
        (vec![view.len as i64 / itemsize.max(1)], vec![1])
    } else {
        // SAFETY: with PyBUF_RECORDS the exporter fills `ndim` shape and stride
        // entries, which live as long as the view.
        let (shape, byte_strides) = unsafe {
            (core::slice::from_raw_parts(view.shape, ndim), core::slice::from_raw_parts(view.strides, ndim))
        };
        let mut strides = Vec::with_capacity(ndim);
        for (axis, (&s, &d)) in byte_strides.iter().zip(shape).enumerate() {
            if s as i64 % itemsize != 0 && d > 1 {
                return Err(PyBufferError::new_err(format!(
                    "buffer stride {s} of axis {axis} is not a multiple of the itemsize {itemsize}; DLPack counts strides in elements"
                )));
            }
            strides.push(s as i64 / itemsize);
        }
        (shape.iter().map(|&d| d as i64).collect(), strides)
    };
    let flags = if view.readonly != 0 { DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 };
    let data = view.buf;
    let layout = RawLayout { dtype, device: Device::CPU, shape: &shape, strides: Some(&strides), byte_offset: 0 };
    // SAFETY: the exporter guarantees `buf` with these shape and strides stays
    // valid until the buffer is released, which happens when `owner` drops.
    let managed: ManagedTensor = unsafe { export_raw(owner, data, layout, flags) }.py()?;
    Ok(AnyManaged::Versioned(managed))
}

/// A NumPy typestr (`"<f4"`, `"|b1"`, ...) as a DLPack dtype; native byte order only.
pub fn dtype_from_typestr(typestr: &str) -> PyResult<DataType> {
    let bad = |why: &str| PyBufferError::new_err(format!("typestr {typestr:?}: {why}"));
    let bytes = typestr.as_bytes();
    if bytes.len() < 3 {
        return Err(bad("expected <byteorder><kind><size>"));
    }
    let native = if cfg!(target_endian = "little") { b'<' } else { b'>' };
    if !(bytes[0] == b'|' || bytes[0] == b'=' || bytes[0] == native) {
        return Err(bad("DLPack only supports native byte order"));
    }
    let size: u8 = typestr[2..].parse().map_err(|_| bad("bad item size"))?;
    let code = match bytes[1] {
        b'b' if size == 1 => DataTypeCode::BOOL,
        b'i' => DataTypeCode::INT,
        b'u' => DataTypeCode::UINT,
        b'f' => DataTypeCode::FLOAT,
        b'c' => DataTypeCode::COMPLEX,
        _ => return Err(bad("this kind has no DLPack dtype")),
    };
    let dtype = DataType::new(code, size.checked_mul(8).ok_or_else(|| bad("item size too large"))?, 1);
    dtype.validate().map_err(|e| bad(&e.to_string()))?;
    Ok(dtype)
}

/// The typestr of a single-lane dtype that NumPy's kinds can express.
pub fn typestr(dtype: DataType) -> Option<String> {
    let kind = match dtype.code {
        DataTypeCode::BOOL => 'b',
        DataTypeCode::INT => 'i',
        DataTypeCode::UINT => 'u',
        DataTypeCode::FLOAT => 'f',
        DataTypeCode::COMPLEX => 'c',
        _ => return None,
    };
    let size = dtype.itemsize().filter(|_| dtype.lanes == 1)?;
    let order = if size == 1 { '|' } else if cfg!(target_endian = "little") { '<' } else { '>' };
    Some(format!("{order}{kind}{size}"))
}

/// The fields both array interfaces share.
struct Interface {
    shape: Vec<i64>,
    dtype: DataType,
    data: Option<(usize, bool)>,
    strides_bytes: Option<Vec<i64>>,
}

fn parse_interface<'py>(interface: &Bound<'py, PyAny>, which: &str) -> PyResult<(Interface, Bound<'py, PyDict>)> {
    let dict = interface
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err(format!("{which} must be a dict, got {}", interface)))?
        .clone();
    let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        dict.get_item(key)?.ok_or_else(|| PyValueError::new_err(format!("{which} has no {key:?} key")))
    };
    let shape: Vec<i64> = get("shape")?
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("{which}[\"shape\"] must be a tuple of ints")))?;
    let typestr_obj = get("typestr")?;
    let typestr: String = typestr_obj
        .extract()
        .map_err(|_| PyTypeError::new_err(format!("{which}[\"typestr\"] must be a str")))?;
    let dtype = dtype_from_typestr(&typestr)?;
    let data = match dict.get_item("data")? {
        None => None,
        Some(d) if d.is_none() => None,
        Some(d) => Some(d.extract::<(usize, bool)>().map_err(|_| {
            PyTypeError::new_err(format!("{which}[\"data\"] must be a (pointer: int, readonly: bool) tuple"))
        })?),
    };
    let strides_bytes = match dict.get_item("strides")? {
        None => None,
        Some(s) if s.is_none() => None,
        Some(s) => Some(
            s.extract::<Vec<i64>>()
                .map_err(|_| PyTypeError::new_err(format!("{which}[\"strides\"] must be None or a tuple of ints")))?,
        ),
    };
    if let Some(mask) = dict.get_item("mask")? {
        if !mask.is_none() {
            return Err(PyBufferError::new_err(format!("{which} with a mask cannot be described by DLPack")));
        }
    }
    if let Some(version) = dict.get_item("version")? {
        let v: i64 = version
            .extract()
            .map_err(|_| PyTypeError::new_err(format!("{which}[\"version\"] must be an int")))?;
        if !(0..=3).contains(&v) {
            return Err(PyValueError::new_err(format!("{which} version {v} is not supported (expected up to 3)")));
        }
    } else {
        return Err(PyValueError::new_err(format!("{which} has no \"version\" key")));
    }
    Ok((Interface { shape, dtype, data, strides_bytes }, dict))
}

fn element_strides(interface: &Interface) -> PyResult<Option<Vec<i64>>> {
    let Some(bytes) = &interface.strides_bytes else { return Ok(None) };
    if bytes.len() != interface.shape.len() {
        return Err(PyValueError::new_err(format!(
            "strides has {} entries but shape has {}",
            bytes.len(),
            interface.shape.len()
        )));
    }
    let size = interface.dtype.itemsize().unwrap_or(1) as i64;
    bytes
        .iter()
        .zip(&interface.shape)
        .enumerate()
        .map(|(axis, (&s, &d))| {
            if s % size != 0 && d > 1 {
                Err(PyBufferError::new_err(format!(
                    "stride {s} of axis {axis} is not a multiple of the itemsize {size}"
                )))
            } else {
                Ok(s / size)
            }
        })
        .collect::<PyResult<Vec<_>>>()
        .map(Some)
}

/// Imports an `__array_interface__` (version 3) exporter without copying.
/// With `"data": None` the object's own buffer is used, as NumPy does.
pub fn import_array_interface(obj: &Bound<'_, PyAny>, interface: &Bound<'_, PyAny>) -> PyResult<AnyManaged> {
    let (parsed, dict) = parse_interface(interface, "__array_interface__")?;
    let Some((address, readonly)) = parsed.data else {
        if dict.get_item("offset")?.is_some_and(|o| !o.is_none() && o.extract::<i64>().ok() != Some(0)) {
            return Err(PyBufferError::new_err("__array_interface__ with data=None and an offset is not supported"));
        }
        return import_buffer(obj);
    };
    import_pointer(obj, &parsed, address, readonly, Device::CPU)
}

/// Imports a `__cuda_array_interface__` (versions 0-3) exporter without
/// touching device memory. The device id is reported as 0: the interface does
/// not carry one. A `stream` other than None is validated (0 is not allowed)
/// but not synchronised on, since no CUDA work is done here.
pub fn import_cuda_array_interface(obj: &Bound<'_, PyAny>, interface: &Bound<'_, PyAny>) -> PyResult<AnyManaged> {
    let (parsed, dict) = parse_interface(interface, "__cuda_array_interface__")?;
    if let Some(stream) = dict.get_item("stream")? {
        if !stream.is_none() {
            let s: i64 = stream
                .extract()
                .map_err(|_| PyTypeError::new_err("__cuda_array_interface__[\"stream\"] must be None or an int"))?;
            if s == 0 {
                return Err(PyValueError::new_err(
                    "__cuda_array_interface__ stream 0 is ambiguous and disallowed; use 1 for the legacy default stream",
                ));
            }
        }
    }
    let (address, readonly) =
        parsed.data.ok_or_else(|| PyValueError::new_err("__cuda_array_interface__ needs a \"data\" pointer"))?;
    import_pointer(obj, &parsed, address, readonly, Device::cuda(0))
}

fn import_pointer(
    obj: &Bound<'_, PyAny>,
    parsed: &Interface,
    address: usize,
    readonly: bool,
    device: Device,
) -> PyResult<AnyManaged> {
    let strides = element_strides(parsed)?;
    let layout = RawLayout { dtype: parsed.dtype, device, shape: &parsed.shape, strides: strides.as_deref(), byte_offset: 0 };
    let flags = if readonly { DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 };
    // SAFETY: the interface's exporter promises that `address` with this layout
    // is valid for as long as the object lives; the owner keeps it alive. The
    // layout itself (NULL data, overflow, ...) is validated by `export_raw`.
    let managed: ManagedTensor =
        unsafe { export_raw(PyOwner::new(obj), address as *mut c_void, layout, flags) }.py()?;
    Ok(AnyManaged::Versioned(managed))
}

/// A `#[pyfunction]` argument that accepts any producer's tensor: DLPack
/// objects and capsules, buffer-protocol exporters, and both array interfaces.
///
/// For types with the DLPack C exchange API (torch, dlbridge), the tensor is
/// borrowed through the non-owning `dltensor_from_py_object_no_sync`: no
/// allocation, no capsule. Such a borrow is valid while the call runs and the
/// source object is not resized; the producer cannot flag it read-only.
///
/// ```no_run
/// use dlbridge_pyo3::{to_py_err, PyTensor};
/// use pyo3::prelude::*;
///
/// #[pyfunction]
/// fn total(x: PyTensor<'_>) -> PyResult<f64> {
///     Ok(x.view().try_as_slice::<f64>().map_err(to_py_err)?.iter().sum())
/// }
/// ```
pub struct PyTensor<'py> {
    inner: Held,
    source: Bound<'py, PyAny>,
}

enum Held {
    Owned(AnyManaged),
    /// A non-owning fill and its validated view; both point into the source's memory.
    Borrowed(DLTensor, TensorView<'static>),
}

impl<'py> PyTensor<'py> {
    /// The validated view.
    pub fn view(&self) -> &TensorView<'_> {
        match &self.inner {
            Held::Owned(managed) => managed.view(),
            Held::Borrowed(_, view) => view,
        }
    }

    /// A writable view of the caller's memory; writes are seen in the caller's
    /// own object. Refused (BufferError) for read-only or overlapping tensors.
    pub fn view_mut(&mut self) -> PyResult<TensorViewMut<'_>> {
        match &mut self.inner {
            Held::Owned(managed) => managed.view_mut().py(),
            // SAFETY: the fill describes the source's memory, which the source (held
            // by `self`) keeps alive; producers hand out writable data unless they
            // say otherwise, and this one has no way to say so.
            Held::Borrowed(dl, _) => unsafe { TensorViewMut::from_dltensor(dl, false) }.py(),
        }
    }

    /// The Python object the tensor came from.
    pub fn source(&self) -> &Bound<'py, PyAny> {
        &self.source
    }

    /// The producer's current work stream for this tensor's device (NULL when it
    /// has none, or has no exchange API): launch kernels on it to stay ordered
    /// with the producer's work.
    pub fn work_stream(&self) -> *mut c_void {
        match exchange::lookup(&self.source) {
            Some(api) => exchange::work_stream(api, self.view().device()),
            None => core::ptr::null_mut(),
        }
    }

    /// An owned tensor, for keeping beyond the call (a borrowed one is imported
    /// through DLPack first).
    pub fn into_managed(self) -> PyResult<AnyManaged> {
        match self.inner {
            Held::Owned(managed) => Ok(managed),
            Held::Borrowed(..) => from_dlpack(&self.source, ImportOptions::default()),
        }
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for PyTensor<'py> {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let source = obj.to_owned();
        if let Some(api) = exchange::lookup(&source) {
            if let Some(dl) = exchange::fill_borrowed(&source, api)? {
                // SAFETY: the fill points into the source's memory, which `source`
                // keeps alive for as long as this PyTensor; the view never outlives it.
                let view = unsafe { TensorView::from_dltensor(&dl, false) }.py()?;
                return Ok(PyTensor { inner: Held::Borrowed(dl, view), source });
            }
        }
        let managed = import_any(&source, None)?;
        Ok(PyTensor { inner: Held::Owned(managed), source })
    }
}
