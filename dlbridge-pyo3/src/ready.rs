//! Where a `Tensor`'s data is ready, kept past the call that named it.
//!
//! Stream values reach dlbridge as raw handles that are valid for the call
//! that passes them: CuPy and numba destroy their streams when collected, and
//! the per-thread default stream (2) is another stream in each thread. So a
//! `Tensor` keeps none: work pending on such a stream when the tensor is made
//! is marked with an event dlbridge records there and owns. The legacy default
//! stream (1), which the driver owns, is kept as it is. Once the legacy stream
//! has been made to wait for the event (to hand the data to a consumer told
//! to use it: an extension, dlbridge's exchange table, the CUDA array
//! interface), the legacy stream is the data's stream from then on, so that
//! later work queued there is waited for too.
//!
//! ROCm is the exception: dlbridge makes no HIP calls, so it can neither wait
//! for a ROCm stream nor record an event there; a ROCm tensor keeps the value
//! its producer was given, for extensions, and dlbridge never uses it.

use std::sync::{Arc, Mutex, PoisonError};

use dlbridge::cuda::ReadyEvent;
use dlbridge::{Device, DeviceType};
use pyo3::PyResult;

use crate::errors::IntoPyResult;

#[derive(Clone, Debug)]
enum Ready {
    /// No pending work.
    Idle,
    /// Pending on CUDA's legacy default stream.
    Legacy,
    /// Pending work marked by an event dlbridge recorded.
    Event(Arc<ReadyEvent>),
    /// A ROCm stream value, handed back and never used.
    Rocm(i64),
}

/// The kept readiness of a tensor's data on `device`.
#[derive(Debug)]
pub(crate) struct ReadyCell {
    device: Device,
    state: Mutex<Ready>,
}

impl ReadyCell {
    /// No pending work.
    pub(crate) fn idle(device: Device) -> Self {
        ReadyCell { device, state: Mutex::new(Ready::Idle) }
    }

    /// Keeps data ready on `stream`, a value valid for this call (`None` or
    /// -1: nothing to wait for): an event is recorded on any CUDA stream other
    /// than the legacy default. Needs the driver for such a stream.
    pub(crate) fn keep(device: Device, stream: Option<i64>) -> PyResult<Self> {
        let state = match (device.device_type, stream.filter(|&s| s != -1)) {
            (_, None) => Ready::Idle,
            (DeviceType::ROCM, Some(s)) => Ready::Rocm(s),
            (t, Some(_)) if !t.has_streams() => Ready::Idle,
            (_, Some(1)) => Ready::Legacy,
            // SAFETY: a stream value the caller or producer passed for this call
            // (README, "Raw addresses"); only the event outlives the call.
            (_, Some(s)) => Ready::Event(Arc::new(unsafe { ReadyEvent::record(device.device_id, s) }.py()?)),
        };
        Ok(ReadyCell { device, state: Mutex::new(state) })
    }

    fn get(&self) -> Ready {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The stream the data is ready on for a consumer on `consumer` (`None`,
    /// or -1: the legacy default), valid for this call: `consumer` itself once
    /// made to wait for the kept event, the legacy stream when the data is
    /// pending there, or `None` for no pending work. Waiting for the event
    /// needs no host synchronisation (see `dlbridge::cuda::order_streams`).
    pub(crate) fn stream_for(&self, consumer: Option<i64>) -> PyResult<Option<i64>> {
        if self.device.device_type == DeviceType::CPU {
            return Ok(None); // never pending: no lock on the host's hot paths
        }
        match self.get() {
            Ready::Idle => Ok(None),
            Ready::Legacy => Ok(Some(1)),
            Ready::Rocm(s) => Ok(Some(s)),
            Ready::Event(event) => {
                let target = consumer.filter(|&s| s != -1).unwrap_or(1);
                // SAFETY: the consumer's stream value, for this call.
                unsafe { event.order_before(target) }.py()?;
                if target == 1 {
                    *self.state.lock().unwrap_or_else(PoisonError::into_inner) = Ready::Legacy;
                }
                Ok(Some(target))
            }
        }
    }

    /// The stream a consumer that names none works on (an extension argument,
    /// the exchange table's fill): the data's stream, and for idle CUDA
    /// memory the legacy default, which then becomes the data's stream, so
    /// that the tensor's later exports wait for the work queued there.
    pub(crate) fn lend(&self) -> PyResult<Option<i64>> {
        if matches!(self.device.device_type, DeviceType::CUDA | DeviceType::CUDA_MANAGED) {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if matches!(*state, Ready::Idle) {
                *state = Ready::Legacy;
            }
        }
        self.stream_for(None)
    }

    /// Blocks until the pending work is done, for CUDA managed memory that
    /// the host is about to read; a no-op for other memory.
    pub(crate) fn wait_on_host(&self) -> PyResult<()> {
        if self.device.device_type != DeviceType::CUDA_MANAGED {
            return Ok(());
        }
        match self.get() {
            Ready::Idle | Ready::Rocm(_) => Ok(()),
            Ready::Legacy => crate::handoff::wait_if_managed(self.device, Some(1)),
            Ready::Event(event) => event.wait_on_host().py(),
        }
    }
}
