//! Moves between host and CUDA memory that dlbridge makes itself, for
//! `from_dlpack(device=...)` and for `__dlpack__(dl_device=...)` alike: CUDA
//! to the host (pageable or pinned), and host memory to a CUDA device or to
//! pinned memory. A producer is not asked for a move dlbridge can make.

use dlbridge::export::{export_raw, RawLayout};
use dlbridge::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLPACK_FLAG_BITMASK_READ_ONLY};
use dlbridge::{Device, DeviceType, ManagedAbi, Owned};
use pyo3::exceptions::PyBufferError;
use pyo3::PyResult;

use crate::any_owned::AnyOwned;
use crate::errors::IntoPyResult;
use crate::handoff::wait_if_managed;

fn on_cuda(device: Device) -> bool {
    matches!(device.device_type, DeviceType::CUDA | DeviceType::CUDA_MANAGED)
}

/// Whether dlbridge can copy memory on `from` to `wanted`.
pub(crate) fn can_move(from: Device, wanted: Device) -> bool {
    match wanted.device_type {
        DeviceType::CPU => on_cuda(from),
        DeviceType::CUDA_HOST => on_cuda(from) || from.is_cpu_accessible(),
        DeviceType::CUDA => from.is_cpu_accessible(),
        _ => false,
    }
}

/// A copy on `wanted` of `view` (readable: taken under a registry borrow),
/// whose data is ready on `ready` (a stream
/// value valid for this call), with the stream the copy is ready on: none
/// for host copies (complete when this returns), the legacy default stream
/// for a copy to a device, whose DMA from pageable memory may still run.
pub(crate) fn copy_to<M: ManagedAbi>(view: &dlbridge::TensorView<'_>, ready: Option<i64>, wanted: Device) -> PyResult<(Owned<M>, Option<i64>)> {
    crate::gil::release_in_driver_calls();
    let from = view.device();
    if !can_move(from, wanted) {
        return Err(PyBufferError::new_err(format!("cannot move a tensor from {from} to {wanted}")));
    }
    // The copies below read managed memory on the host.
    wait_if_managed(from, ready)?;
    if wanted.device_type == DeviceType::CUDA {
        return Ok((dlbridge::cuda::to_device(view, wanted.device_id).py()?, Some(1)));
    }
    let pinned = wanted.device_type == DeviceType::CUDA_HOST;
    // SAFETY: `ready` is the stream value the producer was given, or its
    // `__cuda_array_interface__` stream, for this call: the protocols hand
    // streams over as raw integers (README, "Raw addresses").
    Ok((unsafe { dlbridge::cuda::to_host(view, ready, pinned) }.py()?, None))
}

/// The same memory labelled `device` (the CPU, for pinned or managed memory
/// a caller asked for on the CPU), with the same flags and ABI.
pub(crate) fn relabel(owned: AnyOwned, device: Device) -> PyResult<AnyOwned> {
    let view = owned.view();
    let read_only = if owned.is_read_only() { DLPACK_FLAG_BITMASK_READ_ONLY } else { 0 };
    let (data, shape, strides, dtype, flags) = (view.as_ptr().cast_mut(), view.shape().to_vec(), view.strides().to_vec(), view.dtype(), owned.flags() | read_only);
    let layout = RawLayout { dtype, device, shape: &shape, strides: Some(&strides), byte_offset: 0 };
    // The memory the imported tensor describes, with its layout (copied out
    // above), stays valid until its owner, moved into the new tensor, is
    // dropped; `device` reaches the same memory. Writability goes with the flags.
    let mut relabelled = match owned {
        // SAFETY: as just said.
        AnyOwned::Versioned(t) => AnyOwned::Versioned(unsafe { export_raw::<DLManagedTensorVersioned, _>(t, data, layout, flags) }.py()?),
        // SAFETY: as just said.
        AnyOwned::Legacy(t) => AnyOwned::Legacy(unsafe { export_raw::<DLManagedTensor, _>(t, data, layout, read_only) }.py()?),
        // SAFETY: as just said.
        AnyOwned::Object(t) => AnyOwned::Versioned(unsafe { export_raw::<DLManagedTensorVersioned, _>(t, data, layout, flags) }.py()?),
    };
    relabelled.mark_aliased();
    Ok(relabelled)
}
