//! The raw DLPack 1.3 ABI, under the names `dlpack.h` gives it.
//!
//! Every type here is `#[repr(C)]` with exactly the header's layout; a test in
//! `tests/c-abi` compares each `sizeof` and `offsetof` against the real header.
//! Codes that a foreign producer may send (device type, dtype code) are integer
//! newtypes, never Rust enums, so an unknown value is representable and harmless.
//! Deleters are `Option<fn>` because the header allows them to be NULL.
//!
//! [`DLDevice`], [`DLDeviceType`], [`DLDataType`] and [`DLDataTypeCode`] are the
//! same types as [`Device`](crate::Device), [`DeviceType`](crate::DeviceType),
//! [`DataType`](crate::DataType) and [`DataTypeCode`](crate::DataTypeCode).

use core::ffi::{c_char, c_int, c_void};

pub use crate::device::{Device as DLDevice, DeviceType as DLDeviceType};
pub use crate::dtype::{DataType as DLDataType, DataTypeCode as DLDataTypeCode};

/// Major version of the ABI this crate implements. A tensor with another major
/// may only have its deleter called.
pub const DLPACK_MAJOR_VERSION: u32 = 1;
/// Minor version of the ABI this crate implements. Minor versions only add enum values.
pub const DLPACK_MINOR_VERSION: u32 = 3;

/// The tensor is read-only: the consumer must not write through `data`.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// The producer made a copy; the consumer owns the data alone until it calls the deleter.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;
/// A sub-byte type (fp4, fp6) is padded to one byte per element; by default it is packed.
pub const DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: u64 = 1 << 2;

/// An ABI version: `major` changes break the layout after `flags`, `minor` only adds values.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DLPackVersion {
    /// Incompatible layout changes.
    pub major: u32,
    /// Compatible additions (new enum values).
    pub minor: u32,
}

impl DLPackVersion {
    /// The version this crate implements, 1.3.
    pub const CURRENT: DLPackVersion =
        DLPackVersion { major: DLPACK_MAJOR_VERSION, minor: DLPACK_MINOR_VERSION };
}

/// A plain, non-owning description of an n-dimensional array.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DLTensor {
    /// Start of the allocation. May be NULL when the tensor has no elements.
    /// Element 0 is at `data + byte_offset`; it need not be aligned.
    pub data: *mut c_void,
    /// Where the memory lives.
    pub device: DLDevice,
    /// Number of dimensions, ≥ 0.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents. May be NULL only when `ndim == 0`.
    pub shape: *mut i64,
    /// `ndim` strides in elements, not bytes. NULL (row-major) is legal before 1.2
    /// and for `ndim == 0`; a consumer must still accept it.
    pub strides: *mut i64,
    /// Bytes from `data` to element 0.
    pub byte_offset: u64,
}

/// Deleter of a legacy managed tensor: frees `self` and everything it holds.
pub type DLManagedTensorDeleter = unsafe extern "C" fn(*mut DLManagedTensor);
/// Deleter of a versioned managed tensor: frees `self` and everything it holds.
pub type DLManagedTensorVersionedDeleter = unsafe extern "C" fn(*mut DLManagedTensorVersioned);

/// Legacy (pre-1.0) owned tensor, carried by a `"dltensor"` capsule. It has no
/// version and no flags.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context; opaque to the consumer. May be NULL.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it is done; frees this struct too. May be NULL.
    pub deleter: Option<DLManagedTensorDeleter>,
}

/// Versioned owned tensor (DLPack ≥ 1.0), carried by a `"dltensor_versioned"` capsule.
///
/// `version`, `manager_ctx`, `deleter` and `flags` keep their place in every future
/// ABI, so a consumer can always call the deleter; it may touch `dl_tensor` only
/// when `version.major` is [`DLPACK_MAJOR_VERSION`].
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// ABI version of this struct, set by the producer.
    pub version: DLPackVersion,
    /// The producer's context; opaque to the consumer. May be NULL.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when it is done; frees this struct too. May be NULL.
    pub deleter: Option<DLManagedTensorVersionedDeleter>,
    /// `DLPACK_FLAG_BITMASK_*` bits; 0 by default.
    pub flags: u64,
    /// The tensor. Valid only when `version.major` matches.
    pub dl_tensor: DLTensor,
}

/// Reports an allocator error: `kind` is a Python exception name such as
/// `"MemoryError"`, `message` a NUL-terminated text.
pub type DLPackSetError =
    unsafe extern "C" fn(error_ctx: *mut c_void, kind: *const c_char, message: *const c_char);

/// Allocates a new tensor like `prototype` (only dtype, ndim, shape and device are
/// read). Returns 0, or -1 after calling `set_error`.
pub type DLPackManagedTensorAllocator = unsafe extern "C" fn(
    prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<DLPackSetError>,
) -> c_int;

/// Owning export of a Python object, without stream synchronisation. Returns 0,
/// or -1 with a Python exception set.
pub type DLPackManagedTensorFromPyObjectNoSync =
    unsafe extern "C" fn(py_object: *mut c_void, out: *mut *mut DLManagedTensorVersioned) -> c_int;

/// Steals `tensor` and returns a new reference to a producer-framework object.
/// Returns 0, or -1 with a Python exception set.
pub type DLPackManagedTensorToPyObjectNoSync = unsafe extern "C" fn(
    tensor: *mut DLManagedTensorVersioned,
    out_py_object: *mut *mut c_void,
) -> c_int;

/// Non-owning fill of a caller's `DLTensor`; the pointers in it stay valid only
/// until control returns to the producer. Returns 0, or -1 with a Python exception set.
pub type DLPackDLTensorFromPyObjectNoSync =
    unsafe extern "C" fn(py_object: *mut c_void, out: *mut DLTensor) -> c_int;

/// Writes the producer's current stream for a device (NULL for CPU). Returns 0 or -1.
pub type DLPackCurrentWorkStream = unsafe extern "C" fn(
    device_type: DLDeviceType,
    device_id: i32,
    out_current_stream: *mut *mut c_void,
) -> c_int;

/// Version header of an exchange-API table, with a link to an older table.
#[repr(C)]
#[derive(Debug)]
pub struct DLPackExchangeAPIHeader {
    /// Version of the table that follows this header.
    pub version: DLPackVersion,
    /// The same producer's table for an older version; NULL if there is none.
    pub prev_api: *mut DLPackExchangeAPIHeader,
}

/// The C exchange API of a framework, found as the `"dlpack_exchange_api"` capsule
/// in `type(x).__dlpack_c_exchange_api__`. It lives for the whole process.
/// Consumers should NULL-check every entry: some producers leave some NULL.
#[repr(C)]
#[derive(Debug)]
pub struct DLPackExchangeAPI {
    /// Version and link to older tables.
    pub header: DLPackExchangeAPIHeader,
    /// Allocates a tensor on the producer's allocator.
    pub managed_tensor_allocator: Option<DLPackManagedTensorAllocator>,
    /// Owning export of a Python object.
    pub managed_tensor_from_py_object_no_sync: Option<DLPackManagedTensorFromPyObjectNoSync>,
    /// Import of a managed tensor as a producer-framework object.
    pub managed_tensor_to_py_object_no_sync: Option<DLPackManagedTensorToPyObjectNoSync>,
    /// Non-owning export of a Python object. May be NULL.
    pub dltensor_from_py_object_no_sync: Option<DLPackDLTensorFromPyObjectNoSync>,
    /// The producer's current stream for a device.
    pub current_work_stream: Option<DLPackCurrentWorkStream>,
}

// SAFETY: the table only holds function pointers and a pointer to another static
// table; the header requires both to live, unchanged, for the whole process.
unsafe impl Sync for DLPackExchangeAPI {}
// SAFETY: as above; the header is immutable once published.
unsafe impl Sync for DLPackExchangeAPIHeader {}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<DLPackVersion>() == 8);
    assert!(size_of::<DLDevice>() == 8 && align_of::<DLDevice>() == 4);
    assert!(size_of::<DLDataType>() == 4 && align_of::<DLDataType>() == 2);
    assert!(size_of::<DLTensor>() == 48);
    assert!(offset_of!(DLTensor, ndim) == 16 && offset_of!(DLTensor, dtype) == 20);
    assert!(offset_of!(DLTensor, shape) == 24 && offset_of!(DLTensor, byte_offset) == 40);
    assert!(size_of::<DLManagedTensor>() == 64);
    assert!(size_of::<DLManagedTensorVersioned>() == 80);
    assert!(offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
    assert!(size_of::<DLPackExchangeAPIHeader>() == 16);
    assert!(size_of::<DLPackExchangeAPI>() == 56);
};
