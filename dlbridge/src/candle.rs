//! `candle` integration (feature `candle`): zero-copy, read-only export of
//! candle CPU tensors ([`Owned::from_candle`]) and import of DLPack tensors
//! into candle by one copy ([`TensorView::to_candle_copied`]). The public items
//! carry the documentation; this module is private.

use candle_core::{CpuStorage, DType, DeviceLocation, Storage, StorageRef};

use crate::dtype::{DataType, DataTypeCode};
use crate::error::Error;
use crate::export::{export_raw, RawLayout};
use crate::ffi::{DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_READ_ONLY};
use crate::managed_abi::ManagedAbi;
use crate::owned::Owned;
use crate::view::TensorView;
use crate::{Device, DeviceType};

/// A read guard on a candle storage must be `Send`: an export may be freed on
/// any thread. It is with parking_lot's `send_guard` feature (see Cargo.toml),
/// which also makes parking_lot refuse `deadlock_detection`, the one mode in
/// which a guard must be released by the thread that took it.
const _: () = {
    const fn send<T: Send>() {}
    send::<StorageRef<'static>>();
};

/// The DLPack dtype of a candle dtype, or the reason there is none.
///
/// | candle | DLPack |
/// |---|---|
/// | `U8`, `U32`, `I16`, `I32`, `I64` | `uint8`, `uint32`, `int16`, `int32`, `int64` |
/// | `F16`, `BF16`, `F32`, `F64` | `float16`, `bfloat16`, `float32`, `float64` |
/// | `F8E4M3` (`float8::F8E4M3`: finite, NaN only) | `float8_e4m3fn` |
/// | `F8E8M0` (raw bytes, one per element) | `float8_e8m0fnu` |
///
/// candle's `F6E2M3`, `F6E3M2` and `F4` are refused (`UnsupportedDtype`), both
/// ways: candle calls them dummy types and keeps their raw bytes in a `Vec<u8>`
/// indexed by a layout that counts elements, not bytes, so their packing is not
/// defined. A dtype of a later candle is refused with `UnsupportedFormat`.
pub fn dtype_from_candle(dtype: DType) -> Result<DataType, Error> {
    let float8 = |code| DataType::new(code, 8, 1);
    let packed = |code, bits| Error::UnsupportedDtype { dtype: DataType::new(code, bits, 1), operation: "candle, whose packing of this sub-byte dtype is undefined," };
    Ok(match dtype {
        DType::U8 => DataType::UINT8,
        DType::U32 => DataType::UINT32,
        DType::I16 => DataType::INT16,
        DType::I32 => DataType::INT32,
        DType::I64 => DataType::INT64,
        DType::BF16 => DataType::BFLOAT16,
        DType::F16 => DataType::FLOAT16,
        DType::F32 => DataType::FLOAT32,
        DType::F64 => DataType::FLOAT64,
        DType::F8E4M3 => float8(DataTypeCode::FLOAT8_E4M3FN),
        DType::F8E8M0 => float8(DataTypeCode::FLOAT8_E8M0FNU),
        DType::F6E2M3 => return Err(packed(DataTypeCode::FLOAT6_E2M3FN, 6)),
        DType::F6E3M2 => return Err(packed(DataTypeCode::FLOAT6_E3M2FN, 6)),
        DType::F4 => return Err(packed(DataTypeCode::FLOAT4_E2M1FN, 4)),
        // `DType` is non-exhaustive: a dtype of a later candle.
        other => return Err(Error::UnsupportedFormat { format: other.as_str().to_owned(), reason: "a candle dtype with no DLPack dtype known to dlbridge" }),
    })
}

/// The candle dtype of a DLPack dtype: the inverse of [`dtype_from_candle`].
/// Every other dtype (bool, int8, uint16, uint64, complex, the other 8-bit
/// floats, sub-byte types, vector lanes) is refused with `UnsupportedDtype`.
pub fn dtype_to_candle(dtype: DataType) -> Result<DType, Error> {
    const TABLE: [(DataType, DType); 11] = [
        (DataType::UINT8, DType::U8),
        (DataType::UINT32, DType::U32),
        (DataType::INT16, DType::I16),
        (DataType::INT32, DType::I32),
        (DataType::INT64, DType::I64),
        (DataType::BFLOAT16, DType::BF16),
        (DataType::FLOAT16, DType::F16),
        (DataType::FLOAT32, DType::F32),
        (DataType::FLOAT64, DType::F64),
        (DataType::new(DataTypeCode::FLOAT8_E4M3FN, 8, 1), DType::F8E4M3),
        (DataType::new(DataTypeCode::FLOAT8_E8M0FNU, 8, 1), DType::F8E8M0),
    ];
    TABLE
        .iter()
        .find(|(dl, _)| *dl == dtype)
        .map(|&(_, candle)| candle)
        .ok_or(Error::UnsupportedDtype { dtype, operation: "candle" })
}

/// The DLPack device of a candle device.
fn device_from_candle(location: DeviceLocation) -> Device {
    let id = |gpu_id: usize| i32::try_from(gpu_id).unwrap_or(i32::MAX);
    match location {
        DeviceLocation::Cpu => Device::CPU,
        DeviceLocation::Cuda { gpu_id } => Device::new(DeviceType::CUDA, id(gpu_id)),
        DeviceLocation::Metal { gpu_id } => Device::new(DeviceType::METAL, id(gpu_id)),
    }
}

/// The dtype, address, length in elements and element size of a CPU storage's
/// buffer, all from the one variant that holds it.
fn cpu_buffer(storage: &CpuStorage) -> (DType, *const u8, usize, usize) {
    fn raw<T>(dtype: DType, v: &[T]) -> (DType, *const u8, usize, usize) {
        (dtype, v.as_ptr().cast(), v.len(), core::mem::size_of::<T>())
    }
    match storage {
        CpuStorage::U8(v) => raw(DType::U8, v),
        CpuStorage::U32(v) => raw(DType::U32, v),
        CpuStorage::I16(v) => raw(DType::I16, v),
        CpuStorage::I32(v) => raw(DType::I32, v),
        CpuStorage::I64(v) => raw(DType::I64, v),
        CpuStorage::BF16(v) => raw(DType::BF16, v),
        CpuStorage::F16(v) => raw(DType::F16, v),
        CpuStorage::F32(v) => raw(DType::F32, v),
        CpuStorage::F64(v) => raw(DType::F64, v),
        CpuStorage::F8E4M3(v) => raw(DType::F8E4M3, v),
        CpuStorage::F6E2M3(v) => raw(DType::F6E2M3, v),
        CpuStorage::F6E3M2(v) => raw(DType::F6E3M2, v),
        CpuStorage::F4(v) => raw(DType::F4, v),
        CpuStorage::F8E8M0(v) => raw(DType::F8E8M0, v),
    }
}

/// What an export of a candle tensor owns: a clone of the tensor, which keeps
/// its storage's allocation alive, and a read guard on that storage, which keeps
/// every candle writer out of it. Fields drop in declaration order, so the
/// guard is released before the tensor (and perhaps the lock with it) goes.
struct StorageLease {
    guard: StorageRef<'static>,
    _tensor: candle_core::Tensor,
}

/// Shape, strides and element 0 (an index into the storage's buffer) of a
/// candle layout, checked to stay inside a buffer of `len` elements.
struct Placed {
    shape: Vec<i64>,
    strides: Vec<i64>,
    first: usize,
}

fn place(layout: &candle_core::Layout, len: usize) -> Result<Placed, Error> {
    let to_i64 = |v: &[usize]| v.iter().map(|&x| i64::try_from(x).unwrap_or(i64::MAX)).collect::<Vec<i64>>();
    let (shape, strides) = (to_i64(layout.dims()), to_i64(layout.stride()));
    let overflow = || Error::ExtentOverflow { shape: shape.clone(), strides: strides.clone(), byte_offset: 0 };
    let numel = layout.dims().iter().try_fold(1usize, |n, &d| n.checked_mul(d)).ok_or_else(|| Error::SizeOverflow { shape: shape.clone() })?;
    let first = layout.start_offset();
    if numel > 0 {
        // candle strides are unsigned: element 0 is the lowest element reached.
        let reach = layout
            .dims()
            .iter()
            .zip(layout.stride())
            .try_fold(first, |hi, (&d, &s)| (d - 1).checked_mul(s).and_then(|r| hi.checked_add(r)))
            .ok_or_else(overflow)?;
        if reach >= len {
            let index = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
            return Err(Error::OutOfBounds { lowest: index(first), highest: index(reach), len });
        }
    }
    Ok(Placed { shape, strides, first })
}

impl<M: ManagedAbi> Owned<M> {
    /// Exports a candle CPU tensor without copying: the same memory, shape and
    /// strides (element 0 at the tensor's `start_offset`), always READ_ONLY.
    /// Every candle dtype is exported except the sub-byte dummies (see
    /// [`dtype_from_candle`](crate::dtype_from_candle)).
    ///
    /// ```
    /// use candle_core::{Device, Tensor};
    /// let t = Tensor::arange(0f32, 6.0, &Device::Cpu).unwrap().reshape((2, 3)).unwrap().t().unwrap();
    /// let exported = dlbridge::OwnedTensor::from_candle(&t)?;
    /// assert!(exported.is_read_only());
    /// assert_eq!((exported.view().shape(), exported.view().strides()), (&[3i64, 2][..], &[1i64, 3][..]));
    /// # Ok::<(), dlbridge::Error>(())
    /// ```
    ///
    /// # The storage stays alive and unchanged
    /// A candle `Tensor` is a handle on an `Arc<RwLock<Storage>>` that its
    /// clones, reshapes, narrows, transposes and `detach` share, and candle
    /// writes that storage in place through `&self`: `const_set`, `zero_set`,
    /// `one_set`, `slice_set`, `inplace_op1`/`2`/`3` and `Var::set`, each under
    /// the lock's write guard (an `InplaceOp` even gets `&mut CpuStorage`, and
    /// may replace or grow its `Vec`). A clone of the tensor alone would keep the
    /// storage alive but neither unchanged nor in place. So the export holds a
    /// clone **and a read guard on the storage** until its deleter runs: while
    /// it lives no candle API can write or move the elements, and every in-place
    /// write to that storage, through any tensor that shares it, waits until the
    /// export is dropped. A thread that writes in place a storage it has
    /// exported and still holds blocks forever (a deadlock, never undefined
    /// behaviour): `Tensor::copy` first if the tensor must stay writable.
    ///
    /// Taking the guard waits while another thread writes the storage, or waits
    /// to: parking_lot's lock is fair, and candle's `storage_and_layout`, the
    /// only public way in, takes a non-recursive read guard. So exporting a
    /// storage again while this thread still holds an export of it and another
    /// thread waits to write it also blocks until the first export is dropped.
    /// candle's tensor operations read through recursive read guards, which
    /// an export never blocks.
    ///
    /// candle has no public way to tell whether a storage is shared, so the
    /// export is READ_ONLY even when it is not: candle's own readers do not take
    /// the write lock, so a consumer writing it would race with them. (A legacy
    /// `DLManagedTensor` has no flags: it stays read-only on the Rust side, but
    /// a C consumer given it by `into_raw` is not told.)
    ///
    /// # Errors
    /// `NotCpuAccessible` for a CUDA or Metal tensor; `UnsupportedDtype` for
    /// candle's `F6E2M3`, `F6E3M2` and `F4`; `OutOfBounds` for a layout that
    /// reaches outside its storage (candle's public `Tensor::from_storage`
    /// takes any shape without checking it against the storage).
    pub fn from_candle(tensor: &candle_core::Tensor) -> Result<Self, Error> {
        let location = tensor.device().location();
        if location != DeviceLocation::Cpu {
            return Err(Error::NotCpuAccessible { device: device_from_candle(location) });
        }
        let tensor = tensor.clone();
        let (guard, layout) = tensor.storage_and_layout();
        let layout = layout.clone();
        // SAFETY: only the lifetime changes. The guard borrows the RwLock that
        // lives in the heap allocation of the tensor's `Arc<RwLock<Storage>>`,
        // not the `Tensor` handle itself, so moving the handle leaves the lock
        // in place; `StorageLease` keeps the handle (hence the Arc, hence the
        // lock) alive for as long as the guard, and drops the guard first. The
        // guard never escapes the lease.
        let guard: StorageRef<'static> = unsafe { core::mem::transmute::<StorageRef<'_>, StorageRef<'static>>(guard) };
        let lease = StorageLease { guard, _tensor: tensor };
        let Storage::Cpu(storage) = &*lease.guard else {
            // A CPU device with a GPU storage: not something candle builds.
            return Err(Error::NotCpuAccessible { device: device_from_candle(lease._tensor.device().location()) });
        };
        // The storage's own variant, not the tensor's dtype field, decides the
        // dtype and the element size.
        let (candle_dtype, base, len, itemsize) = cpu_buffer(storage);
        let dtype = dtype_from_candle(candle_dtype)?;
        let placed = place(&layout, len)?;
        // In bounds when the tensor has elements; never read otherwise (the
        // export's data pointer is then NULL).
        let data = base.wrapping_add(placed.first.wrapping_mul(itemsize)).cast_mut();
        let raw = RawLayout { dtype, device: Device::CPU, shape: &placed.shape, strides: Some(&placed.strides), byte_offset: 0 };
        // SAFETY: `data` points into the `Vec` of the storage the guard reads
        // (the heap buffer of a `Vec` inside the lock: moving the lease into the
        // export block moves neither), and `place` checked that every element
        // the layout reaches lies among its `len` elements. Until the deleter
        // drops the lease, the read guard keeps out every candle writer, all of
        // which take the write guard: `const_set` and friends, `slice_set`,
        // `Var::set`, and an `InplaceOp` that could replace or grow the `Vec`.
        // So those bytes stay valid and unchanged, and the export is READ_ONLY,
        // so no consumer may write them while candle's readers read them. A hostile caller holding another
        // clone can only wait on the lock.
        unsafe { export_raw(lease, data.cast(), raw, DLPACK_FLAG_BITMASK_READ_ONLY) }
    }
}

impl TensorView<'_> {
    /// A new candle CPU tensor holding a **copy** of this tensor's elements,
    /// with its shape, row-major.
    ///
    /// candle's CPU storage is a `Vec<T>`, which must own memory from Rust's
    /// global allocator, and candle has no borrowed or custom storage: it
    /// cannot take foreign memory, so this always copies. Once for a
    /// C-contiguous tensor; a strided one (negative, zero or gapped strides) is
    /// first made contiguous by [`to_contiguous`](crate::to_contiguous), a
    /// second copy.
    ///
    /// ```
    /// let t = dlbridge::OwnedTensor::from_owner_mut(vec![1.0f32, 2.0, 3.0, 4.0], &[2, 2], Some(&[1, 2]))?;
    /// let c = t.view().to_candle_copied()?;
    /// assert_eq!(c.to_vec2::<f32>().unwrap(), [[1.0, 3.0], [2.0, 4.0]]);
    /// # Ok::<(), dlbridge::Error>(())
    /// ```
    ///
    /// # Errors
    /// `NotCpuAccessible` for memory the CPU cannot reach; `UnsupportedDtype`
    /// for a dtype candle lacks (see [`dtype_to_candle`](crate::dtype_to_candle)).
    pub fn to_candle_copied(&self) -> Result<candle_core::Tensor, Error> {
        let dtype = dtype_to_candle(self.dtype())?;
        self.check_host_readable()?;
        if let Some(bytes) = self.as_bytes() {
            return from_bytes(bytes, dtype, self);
        }
        let contiguous = crate::copy::to_contiguous::<DLManagedTensorVersioned>(self)?;
        let bytes = contiguous.view().as_bytes().ok_or(Error::NotContiguous)?;
        from_bytes(bytes, dtype, self)
    }
}

/// A candle tensor of `view`'s shape from the row-major bytes of its elements.
fn from_bytes(bytes: &[u8], dtype: DType, view: &TensorView<'_>) -> Result<candle_core::Tensor, Error> {
    let shape: Vec<usize> = view.shape().iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect();
    // `from_raw_buffer` copies `bytes` into a new `Vec` once (twice if they are
    // not aligned for the dtype). It fails only when the byte count does not
    // match the shape, which a validated view's bytes always do.
    candle_core::Tensor::from_raw_buffer(bytes, dtype, &shape, &candle_core::Device::Cpu)
        .map_err(|_| Error::SizeOverflow { shape: view.shape().to_vec() })
}
