//! The NumPy fast path: an exact `numpy.ndarray` read from NumPy's public struct
//! instead of a capsule, giving the tensor `__dlpack__` would give (READ_ONLY
//! when not writeable) without NumPy's allocation and deleter.
//!
//! The type is recognised without asking any module, which Python code can
//! rebind: it is the static type named "numpy.ndarray" (any class may take
//! that name, but only C code makes a static type) whose instances are at
//! least NumPy's struct.
//!
//! NumPy's `__dlpack__` refuses `ml_dtypes`' types (bfloat16, float8, float6,
//! float4, int4, ...); this path recognises them by their scalar type object,
//! taken from the imported `ml_dtypes` module, and gives them their DLPack
//! dtype. The sub-byte ones hold one value per byte: IS_SUBBYTE_TYPE_PADDED.

use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, Ordering};

use dlbridge::{DataType, Device, TensorView};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::any_owned::{AnyOwned, ObjectTensor};
use crate::errors::IntoPyResult;
use crate::trust::{imported_module, is_static_type_named};

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

/// `ml_dtypes`' scalar types by name, with their DLPack dtype.
const ML_DTYPES: [(&str, DataType); 19] = {
    use dlbridge::DataTypeCode as C;
    [
        ("bfloat16", DataType::BFLOAT16),
        ("float8_e3m4", DataType::new(C::FLOAT8_E3M4, 8, 1)),
        ("float8_e4m3", DataType::new(C::FLOAT8_E4M3, 8, 1)),
        ("float8_e4m3b11fnuz", DataType::new(C::FLOAT8_E4M3B11FNUZ, 8, 1)),
        ("float8_e4m3fn", DataType::new(C::FLOAT8_E4M3FN, 8, 1)),
        ("float8_e4m3fnuz", DataType::new(C::FLOAT8_E4M3FNUZ, 8, 1)),
        ("float8_e5m2", DataType::new(C::FLOAT8_E5M2, 8, 1)),
        ("float8_e5m2fnuz", DataType::new(C::FLOAT8_E5M2FNUZ, 8, 1)),
        ("float8_e8m0fnu", DataType::new(C::FLOAT8_E8M0FNU, 8, 1)),
        ("float6_e2m3fn", DataType::new(C::FLOAT6_E2M3FN, 6, 1)),
        ("float6_e3m2fn", DataType::new(C::FLOAT6_E3M2FN, 6, 1)),
        ("float4_e2m1fn", DataType::new(C::FLOAT4_E2M1FN, 4, 1)),
        ("complex32", DataType::new(C::COMPLEX, 32, 1)),
        ("int1", DataType::new(C::INT, 1, 1)),
        ("int2", DataType::new(C::INT, 2, 1)),
        ("int4", DataType::new(C::INT, 4, 1)),
        ("uint1", DataType::new(C::UINT, 1, 1)),
        ("uint2", DataType::new(C::UINT, 2, 1)),
        ("uint4", DataType::new(C::UINT, 4, 1)),
    ]
};

/// One `ml_dtypes` type as NumPy describes it: its scalar type's address,
/// the NumPy dtype's kind, and the DLPack dtype.
#[derive(Clone, Copy, Debug)]
struct MlType {
    scalar: usize,
    kind: u8,
    dtype: DataType,
}

/// The bytes one element of `dtype` takes in NumPy: sub-byte types are padded.
fn numpy_itemsize(dtype: DataType) -> usize {
    dtype.itemsize().unwrap_or(1)
}

/// [`ml_dtypes_table`], once read.
static ML_TABLE: std::sync::OnceLock<Vec<MlType>> = std::sync::OnceLock::new();

/// NumPy numbers the types it does not build in from here; `ml_dtypes`' among them.
const NPY_USERDEF: core::ffi::c_int = 256;

/// Each `ml_dtypes` type, read once from the imported module and kept only if
/// it is what `ml_dtypes` makes: a `numpy.generic` subclass with a NumPy dtype
/// registered for it (a user-defined type number, this scalar type) that has
/// the DLPack dtype's item size. Anything may sit in `sys.modules` under
/// that name; a module with any other entry is not trusted (and asked again
/// next time). Empty while `ml_dtypes` is not imported.
fn ml_dtypes_table(py: Python<'_>) -> &'static [MlType] {
    if let Some(table) = ML_TABLE.get() {
        return table;
    }
    let Some(module) = imported_module(py, pyo3::intern!(py, "ml_dtypes")) else { return &[] };
    let read = || -> PyResult<Option<Vec<MlType>>> {
        let numpy = py.import("numpy")?;
        let (generic, dtype_of) = (numpy.getattr("generic")?, numpy.getattr("dtype")?);
        let mut table = Vec::with_capacity(ML_DTYPES.len());
        for (name, dtype) in ML_DTYPES {
            let Ok(ty) = module.getattr(name) else { continue };
            let Ok(ty) = ty.cast_into::<pyo3::types::PyType>() else { return Ok(None) };
            if !ty.is_subclass(&generic)? {
                return Ok(None);
            }
            let described = dtype_of.call1((&ty,))?;
            let itemsize: usize = described.getattr("itemsize")?.extract()?;
            let kind: String = described.getattr("kind")?.extract()?;
            // A dtype registered for this very type (a Python-made subclass of
            // float16 gets float16's, whose scalar type is float16).
            let num: core::ffi::c_int = described.getattr("num")?.extract()?;
            let own = described.getattr("type")?.is(&ty) && num >= NPY_USERDEF;
            // Named as the attribute is (a fake module may point one name at
            // another real type of the same size: float8_e5m2 for float8_e4m3fn).
            let named = described.getattr("name")?.extract::<String>()? == *name;
            if !own || !named || itemsize != numpy_itemsize(dtype) || kind.len() != 1 {
                return Ok(None);
            }
            let scalar = ty.as_ptr() as usize;
            // Types live as long as the process; the table keeps them so.
            core::mem::forget(ty);
            table.push(MlType { scalar, kind: kind.as_bytes()[0], dtype });
        }
        Ok(Some(table))
    };
    match read() {
        Ok(Some(table)) => ML_TABLE.get_or_init(|| table),
        _ => {
            let _ = PyErr::take(py);
            &[]
        }
    }
}

/// The `ml_dtypes` scalar type of `dtype`, as [`ml_dtypes_table`] read and
/// checked it (importing `ml_dtypes` first if needed): what `Tensor.numpy()`
/// views a tensor as. Never a module attribute read now, which Python code
/// may have rebound to a type of another size (review S4).
pub(crate) fn ml_dtypes_type(py: Python<'_>, dtype: DataType) -> PyResult<Bound<'_, PyAny>> {
    let needs = || {
        pyo3::exceptions::PyTypeError::new_err(format!(
            "{} needs the ml_dtypes package to become a NumPy array (pip install ml_dtypes)",
            crate::convert::with_article(&format!("{dtype} tensor"))
        ))
    };
    if ML_TABLE.get().is_none() {
        crate::python_calls::import(py, pyo3::intern!(py, "ml_dtypes")).map_err(|_| needs())?;
    }
    let known = ml_dtypes_table(py).iter().find(|t| t.dtype == dtype).ok_or_else(needs)?;
    // SAFETY: the table keeps a strong reference to each of its types (forgotten when read).
    Ok(unsafe { Bound::from_borrowed_ptr(py, known.scalar as *mut ffi::PyObject) })
}

/// The DLPack dtype of a NumPy dtype that is not a builtin number: one of
/// `ml_dtypes`' types, recognised by scalar type identity and kind in the
/// table already read (runs no Python). Only C code registers a NumPy type, so
/// a descr of a table type's number and scalar type is the registered one,
/// whose item size the table checked.
fn ml_dtype_of(descr: &NumpyDescrFields) -> Option<DataType> {
    if descr.type_num < NPY_USERDEF {
        return None;
    }
    let scalar = descr.typeobj as usize;
    let known = ML_TABLE.get()?.iter().find(|t| t.scalar == scalar && t.kind == descr.kind as u8)?;
    Some(known.dtype)
}

/// `numpy.ndarray`, once seen (a static type: it lives as long as the process).
static NDARRAY_TYPE: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(core::ptr::null_mut());

pub(crate) fn is_exact_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: reading the type of a live object.
    let ty = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    let known = NDARRAY_TYPE.load(Ordering::Relaxed);
    if !known.is_null() {
        return ty == known;
    }
    // SAFETY: a live type object.
    if !unsafe { is_numpy_array_type(ty) } {
        return false;
    }
    NDARRAY_TYPE.store(ty, Ordering::Relaxed);
    true
}

/// Whether `ty` is NumPy's array type. `numpy.ndarray` in `sys.modules` is an
/// attribute anyone can rebind, and a class may take any name; but a static
/// type named "numpy.ndarray", with room for NumPy's struct, is NumPy's own.
///
/// # Safety
/// `ty` is a live type object.
unsafe fn is_numpy_array_type(ty: *mut ffi::PyTypeObject) -> bool {
    // SAFETY: forwarded from the caller.
    let named = unsafe { is_static_type_named(ty, c"numpy.ndarray") };
    // SAFETY: a field of a live type object.
    named && usize::try_from(unsafe { (*ty).tp_basicsize }).is_ok_and(|size| size >= core::mem::size_of::<NumpyArrayFields>())
}

/// Zero-copy import of an exact `numpy.ndarray` of a standard numeric dtype.
/// `None` for anything else, which goes through `__dlpack__`.
pub(crate) fn import(obj: &Bound<'_, PyAny>) -> PyResult<Option<AnyOwned>> {
    // SAFETY: the view is kept with `obj`, which keeps the array's data alive.
    let Some((view, read_only)) = (unsafe { view_of(obj) })? else { return Ok(None) };
    // SAFETY: as above; writable unless NumPy says otherwise.
    Ok(Some(AnyOwned::Object(unsafe { ObjectTensor::new(obj, view, read_only) })))
}

/// The validated view of an exact `numpy.ndarray` of a standard numeric
/// dtype, and whether NumPy marks it read-only; `None` for anything else.
///
/// # Safety
/// The view reads the array's data: it must not outlive `obj` (nor be used
/// after the array's data is reallocated, which NumPy refuses while a view or
/// export of it lives, and which the borrow registry cannot see).
pub(crate) unsafe fn view_of(obj: &Bound<'_, PyAny>) -> PyResult<Option<(TensorView<'static>, bool)>> {
    if !is_exact_ndarray(obj) {
        return Ok(None);
    }
    // SAFETY: checked just above; forwarded from the caller.
    unsafe { view_of_exact(obj) }
}

/// [`view_of`] for an object already known to be an exact `numpy.ndarray`.
///
/// # Safety
/// `obj` is an exact `numpy.ndarray` ([`is_exact_ndarray`]); as for [`view_of`].
#[inline(always)] // into `args::in_place`, which says why
pub(crate) unsafe fn view_of_exact(obj: &Bound<'_, PyAny>) -> PyResult<Option<(TensorView<'static>, bool)>> {
    // Reading `ml_dtypes`' table the first time runs Python, which may change
    // the array (its dtype, its shape): done before any field is read.
    // SAFETY: an exact numpy.ndarray starts with these public fields; its
    // descr is a live PyArray_Descr.
    if unsafe { (*(*obj.as_ptr().cast::<NumpyArrayFields>()).descr).type_num } >= NPY_USERDEF {
        let _ = ml_dtypes_table(obj.py());
    }
    // Without a GIL, another thread may change the array's fields meanwhile:
    // they are read in the array's critical section, as NumPy changes them.
    #[cfg(Py_GIL_DISABLED)]
    // SAFETY: forwarded from the caller.
    return pyo3::sync::critical_section::with_critical_section(obj, || unsafe { read_fields(obj) });
    #[cfg(not(Py_GIL_DISABLED))]
    // SAFETY: forwarded from the caller.
    unsafe {
        read_fields(obj)
    }
}

/// The fields [`view_of_exact`] reads, validated into a view.
///
/// # Safety
/// As for [`view_of_exact`].
#[inline(always)]
unsafe fn read_fields(obj: &Bound<'_, PyAny>) -> PyResult<Option<(TensorView<'static>, bool)>> {
    // SAFETY: as above; from here to the view's validation no Python runs.
    let (array, descr) = unsafe {
        let array = &*obj.as_ptr().cast::<NumpyArrayFields>();
        (array, &*array.descr)
    };
    let dtype = match numpy_dtype(descr.type_num) {
        Some(dtype) => dtype,
        None => {
            let Some(dtype) = ml_dtype_of(descr) else { return Ok(None) };
            dtype
        }
    };
    let native = if cfg!(target_endian = "little") { b'<' } else { b'>' };
    if !matches!(descr.byteorder as u8, b'=' | b'|') && descr.byteorder as u8 != native {
        return Ok(None);
    }
    let ndim = match usize::try_from(array.nd) {
        Ok(n) if n <= dlbridge::MAX_NDIM => n,
        _ => return Ok(None),
    };
    let (dims, byte_strides) = (array.dimensions, array.strides);
    let read_only = array.flags & NPY_ARRAY_WRITEABLE == 0;
    // `ml_dtypes` stores sub-byte values one per byte.
    let padded = dtype.is_sub_byte();
    // SAFETY: the array's data stays valid for this layout for as long as the
    // array lives (the caller keeps the view no longer); a live array with
    // nd > 0 has `nd` dimensions and strides, read now. Everything is validated.
    let view = unsafe {
        TensorView::from_byte_strides(array.data, dtype, Device::CPU, ndim, padded, |i| {
            (*dims.add(i) as i64, *byte_strides.add(i) as i64)
        })
    };
    match view {
        Ok(view) => Ok(Some((view, read_only))),
        // NumPy's own export refuses these; let it say so.
        Err(dlbridge::Error::StrideNotWhole { .. }) => Ok(None),
        Err(err) => Err(err).py(),
    }
}
