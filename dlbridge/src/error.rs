//! The crate's one error type.

use core::fmt;

use crate::{DataType, Device};

/// Everything that can be wrong with a tensor, a layout or a request.
///
/// Each variant carries the values at fault, so that the message names the axis,
/// the value and what was expected. The Python layer maps each variant to the
/// exception type the spec names.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// A NULL managed-tensor pointer was given.
    NullPointer,
    /// A versioned tensor has a major version other than the one implemented.
    UnsupportedVersion {
        /// The tensor's major version.
        major: u32,
        /// The tensor's minor version.
        minor: u32,
    },
    /// `ndim` is negative or above [`MAX_NDIM`](crate::MAX_NDIM).
    NdimOutOfRange {
        /// The value found.
        ndim: i64,
        /// The largest accepted.
        max: usize,
    },
    /// `shape` is NULL although `ndim > 0`.
    NullShape {
        /// The tensor's ndim.
        ndim: i32,
    },
    /// A shape entry is negative.
    NegativeDimension {
        /// The axis.
        axis: usize,
        /// The extent found.
        size: i64,
    },
    /// The dtype code is not one that DLPack 1.3 defines.
    UnknownDtypeCode {
        /// The code found.
        code: u8,
    },
    /// The bits do not fit the dtype code.
    InvalidDtypeBits {
        /// The dtype found.
        dtype: DataType,
        /// The bits allowed for its code.
        expected: &'static str,
    },
    /// The dtype has zero lanes.
    ZeroLanes {
        /// The dtype found.
        dtype: DataType,
    },
    /// A dtype name that [`DataType::from_str`](core::str::FromStr) does not know.
    UnknownDtypeName {
        /// The name given.
        name: String,
    },
    /// The element count does not fit in 64 bits or in memory.
    SizeOverflow {
        /// The shape.
        shape: Vec<i64>,
    },
    /// The bytes reached through shape, strides and `byte_offset` do not fit in
    /// the address space.
    ExtentOverflow {
        /// The shape.
        shape: Vec<i64>,
        /// The strides, in elements.
        strides: Vec<i64>,
        /// The tensor's `byte_offset`.
        byte_offset: u64,
    },
    /// `data` is NULL although the tensor has elements.
    NullData {
        /// The element count.
        elements: u64,
    },
    /// The strides have a length other than the shape's.
    StridesLength {
        /// The shape's length.
        expected: usize,
        /// The strides' length.
        found: usize,
    },
    /// A row-major shape needs another number of elements than the data holds.
    ElementCount {
        /// The shape asked for.
        shape: Vec<i64>,
        /// The elements it needs.
        needs: usize,
        /// The elements the data holds.
        has: usize,
    },
    /// A layout reaches elements outside the buffer that should hold them.
    OutOfBounds {
        /// Lowest element index reached (may be negative).
        lowest: i64,
        /// Highest element index reached.
        highest: i64,
        /// Elements in the buffer.
        len: usize,
    },
    /// The memory is not reachable from the CPU.
    NotCpuAccessible {
        /// Where it lives.
        device: Device,
    },
    /// The tensor's dtype is not the one requested.
    DtypeMismatch {
        /// The dtype requested.
        expected: DataType,
        /// The tensor's dtype.
        found: DataType,
    },
    /// The data holds bytes that are not valid values of the requested type (a
    /// `bool` other than 0 or 1).
    InvalidValues {
        /// The dtype requested.
        dtype: DataType,
    },
    /// Element 0 is not aligned for the requested type.
    Misaligned {
        /// Address of element 0.
        address: usize,
        /// The alignment needed.
        align: usize,
    },
    /// A contiguous layout was required.
    NotContiguous,
    /// Write access was requested to a read-only tensor.
    ReadOnly,
    /// A write, or a typed read, was requested of a tensor whose memory other
    /// paths may write, without a borrow that excludes them.
    Aliased,
    /// Write access was requested to a tensor whose elements overlap in memory.
    OverlappingMemory,
    /// A fixed-rank view was requested of a tensor of another rank.
    RankMismatch {
        /// The rank requested.
        expected: usize,
        /// The tensor's rank.
        found: usize,
    },
    /// A dtype spelling of another protocol (a typestr, a buffer format) that
    /// has no DLPack dtype or cannot be parsed.
    UnsupportedFormat {
        /// The spelling given.
        format: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// A stride in bytes is not a whole number of elements.
    StrideNotWhole {
        /// The axis.
        axis: usize,
        /// The stride in bytes.
        byte_stride: i64,
        /// The element size in bytes.
        itemsize: usize,
    },
    /// A stream value the spec does not allow for the device type.
    InvalidStream {
        /// The device type.
        device: crate::DeviceType,
        /// The stream value.
        stream: i64,
    },
    /// A CUDA operation was asked of memory elsewhere (ROCm memory, say).
    NotOnCuda {
        /// Where it lives.
        device: Device,
    },
    /// No CUDA driver could be loaded, or it failed to initialise.
    CudaUnavailable {
        /// Why.
        reason: String,
    },
    /// A CUDA driver call failed.
    Cuda {
        /// The driver function.
        call: &'static str,
        /// Its `CUresult`.
        code: u32,
    },
    /// The driver's JIT compiler refused PTX text, and said why.
    PtxRejected {
        /// The `CUresult` of `cuModuleLoadDataEx` (CUDA_ERROR_INVALID_PTX, say).
        code: u32,
        /// The compiler's error log.
        log: String,
    },
    /// A kernel's arguments differ in number or size from the parameters the
    /// driver reports for it.
    KernelArguments {
        /// What differs.
        reason: String,
    },
    /// A module image given as PTX is not PTX text (a cubin or fatbin, say).
    NotPtx {
        /// What it is instead.
        reason: &'static str,
    },
    /// A stream captures a CUDA graph, and what was asked cannot be part of it.
    StreamCapture {
        /// What, why, and what to do instead.
        reason: String,
    },
    /// The allocator could not provide the memory (Python: MemoryError).
    AllocationFailed {
        /// The bytes asked for.
        bytes: usize,
    },
    /// The device type is not one that DLPack 1.3 defines.
    UnknownDevice {
        /// The device found.
        device: Device,
    },
    /// A sub-byte dtype or padding mode that this operation cannot handle.
    UnsupportedDtype {
        /// The dtype.
        dtype: DataType,
        /// What was attempted.
        operation: &'static str,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NullPointer => write!(f, "managed tensor pointer is NULL"),
            Error::UnsupportedVersion { major, minor } => write!(
                f,
                "DLPack version {major}.{minor} is not supported: major version must be {}",
                crate::ffi::DLPACK_MAJOR_VERSION
            ),
            Error::NdimOutOfRange { ndim, max } => write!(f, "ndim {ndim} is out of range 0..={max}"),
            Error::NullShape { ndim } => write!(f, "shape is NULL but ndim is {ndim}"),
            Error::NegativeDimension { axis, size } => write!(f, "shape[{axis}] is negative: {size}"),
            Error::UnknownDtypeCode { code } => write!(f, "unknown DLPack dtype code {code}"),
            Error::InvalidDtypeBits { dtype, expected } => write!(
                f,
                "dtype code {} cannot have {} bits (expected {expected})",
                dtype.code.0, dtype.bits
            ),
            Error::ZeroLanes { dtype } => {
                write!(f, "dtype (code {}, {} bits) has 0 lanes; lanes must be at least 1", dtype.code.0, dtype.bits)
            }
            Error::UnknownDtypeName { name } => write!(f, "unknown dtype name {name:?}"),
            Error::SizeOverflow { shape } => write!(f, "element count of shape {shape:?} overflows"),
            Error::ExtentOverflow { shape, strides, byte_offset } => write!(
                f,
                "memory reached by shape {shape:?}, strides {strides:?} and byte_offset {byte_offset} overflows the address space"
            ),
            Error::NullData { elements } => write!(f, "data is NULL but the tensor has {elements} elements"),
            Error::StridesLength { expected, found } => {
                write!(f, "strides has {found} entries but shape has {expected}")
            }
            Error::ElementCount { shape, needs, has } => {
                write!(f, "shape {shape:?} needs {needs} elements, the data has {has}")
            }
            Error::OutOfBounds { lowest, highest, len } => write!(
                f,
                "layout reaches elements {lowest}..={highest} but the buffer holds {len} elements"
            ),
            Error::NotCpuAccessible { device } => write!(f, "memory on device {device} is not accessible from the CPU"),
            Error::DtypeMismatch { expected, found } => write!(f, "expected dtype {expected}, found {found}"),
            Error::InvalidValues { dtype } => write!(f, "data holds bytes that are not valid {dtype} values"),
            Error::Misaligned { address, align } => {
                write!(f, "element 0 at {address:#x} is not aligned to {align} bytes")
            }
            Error::NotContiguous => write!(f, "tensor is not C-contiguous"),
            Error::ReadOnly => write!(f, "tensor is read-only"),
            Error::Aliased => write!(
                f,
                "the tensor's memory can be reached through other objects, so it may be read or written only under a borrow \
                 that excludes them (dlbridge-pyo3: PyTensor or .read() to read, PyTensorMut to write), or copied"
            ),
            Error::OverlappingMemory => write!(f, "tensor elements overlap in memory, so it cannot be written through"),
            Error::RankMismatch { expected, found } => write!(f, "expected {expected} dimensions, found {found}"),
            Error::UnsupportedFormat { format, reason } => write!(f, "format {format:?}: {reason}"),
            Error::StrideNotWhole { axis, byte_stride, itemsize } => write!(
                f,
                "stride {byte_stride} of axis {axis} is not a multiple of the itemsize {itemsize}; DLPack counts strides in elements"
            ),
            Error::InvalidStream { device, stream } => write!(f, "stream {stream} is not valid for a tensor on {device}"),
            Error::NotOnCuda { device } => write!(f, "memory on {device} cannot be copied with CUDA (dlbridge makes no HIP calls)"),
            Error::CudaUnavailable { reason } => write!(f, "CUDA is not available: {reason}"),
            Error::Cuda { call, code } => {
                match crate::cuda_result::name(*code) {
                    Some(name) => write!(f, "{call} failed with CUresult {code} ({name})")?,
                    None => write!(f, "{call} failed with CUresult {code}")?,
                }
                if crate::cuda_result::is_sticky(*code) {
                    write!(f, "; the driver says this error leaves CUDA unusable in this process until it restarts")?;
                }
                Ok(())
            }
            Error::PtxRejected { code, log } => {
                let name = crate::cuda_result::name(*code).unwrap_or("an unnamed CUresult");
                write!(f, "cuModuleLoadDataEx failed with CUresult {code} ({name}); the JIT compiler's log: {log}")
            }
            Error::KernelArguments { reason } => write!(f, "the launch's arguments do not match the kernel's parameters: {reason}"),
            Error::NotPtx { reason } => write!(f, "the module image is not PTX text: {reason}; pass the NUL-terminated PTX that nvcc -ptx or NVRTC writes"),
            Error::StreamCapture { reason } => write!(f, "CUDA graph capture: {reason}"),
            Error::AllocationFailed { bytes } => write!(f, "could not allocate {bytes} bytes"),
            Error::UnknownDevice { device } => {
                write!(f, "device type {} is not one that DLPack defines", device.device_type.0)
            }
            Error::UnsupportedDtype { dtype, operation } => write!(f, "{operation} does not support dtype {dtype}"),
        }
    }
}

impl std::error::Error for Error {}
