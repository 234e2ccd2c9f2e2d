//! Handing data from one stream to another, and to the host: the steps that
//! imports, exports and extension arguments share.

use dlbridge::streams::SyncPlan;
use dlbridge::{Device, DeviceType};
use pyo3::PyResult;

use crate::errors::IntoPyResult;

/// Whether memory on `device` can be handed to a consumer that asked for `wanted`.
pub(crate) fn reaches(device: Device, wanted: Device) -> bool {
    wanted == device || (wanted == Device::CPU && device.is_cpu_accessible())
}

/// Waits on the host for the work pending on CUDA managed memory, which host
/// code is about to read; a no-op for other memory.
pub(crate) fn wait_if_managed(device: Device, ready: Option<i64>) -> PyResult<()> {
    match ready {
        // SAFETY: a stream value from the producer, as for `settle`.
        Some(ready) if device.device_type == DeviceType::CUDA_MANAGED => unsafe { dlbridge::cuda::wait_on_host(device.device_id, ready) }.py(),
        _ => Ok(()),
    }
}

/// [`wait_if_managed`] for an extension's argument extracted on `requested`:
/// stream -1 orders nothing, so for CUDA managed memory, which safe Rust may
/// then read on the host while a kernel still writes it, it is refused.
pub(crate) fn wait_for_argument(device: Device, ready: Option<i64>, requested: Option<i64>) -> PyResult<()> {
    if device.device_type == DeviceType::CUDA_MANAGED && requested == Some(-1) {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "stream -1 (Stream::NO_SYNC) orders nothing, but CUDA managed memory may be read on the host only after the \
             work that writes it: extract a managed-memory argument with a stream, or without one",
        ));
    }
    wait_if_managed(device, ready)
}

/// Makes the consumer's stream (`requested`, or the device's legacy default)
/// wait for the work pending on the data's `ready` stream, on the GPU, and
/// returns the stream the data is then ready on. Nothing to do when they are
/// the same (a producer asked through `__dlpack__` has ordered its work
/// already), or on ROCm (no HIP calls); when the caller passed -1, nothing is
/// ordered and no stream is kept (the producer's may not outlive the tensor).
pub(crate) fn settle(device: Device, ready: Option<i64>, requested: Option<i64>) -> PyResult<Option<i64>> {
    let plan = dlbridge::streams::plan(device.device_type, ready, requested).py()?;
    // SAFETY: `ready` came from the producer (its stream value, its table's
    // current work stream, or its array interface's entry) and `requested`
    // from the caller: the protocols hand streams over as raw integers
    // (README, "Raw addresses").
    unsafe { dlbridge::cuda::carry_out(device, plan) }.py()?;
    Ok(match plan {
        SyncPlan::Wait { consumer, .. } => Some(consumer),
        SyncPlan::Nothing if requested == Some(-1) => None,
        SyncPlan::Nothing => ready,
    })
}
