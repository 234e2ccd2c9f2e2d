//! The spec's stream hand-off as a pure decision: given the stream a tensor's
//! data is ready on and the stream a consumer names, what must happen. No CUDA
//! is needed to decide; [`crate::cuda`] carries the decision out.

use crate::device::DeviceType;
use crate::error::Error;

/// A stream value as the DLPack protocols hand it over: -1 (no
/// synchronisation), a device's default stream, or a stream handle, which
/// the driver dereferences. Safe code can name only the fixed values; a
/// handle must be vouched for with [`Stream::from_raw`].
///
/// ```compile_fail,E0603
/// // A handle cannot be made in safe code: the field is private...
/// let stream = dlbridge::streams::Stream(0xdead);
/// ```
///
/// ```compile_fail,E0133
/// // ...and `from_raw` is unsafe.
/// let stream = dlbridge::streams::Stream::from_raw(0xdead);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stream(i64);

impl Stream {
    /// -1: the consumer asks for no synchronisation.
    pub const NO_SYNC: Stream = Stream(-1);
    /// CUDA's legacy default stream (`CU_STREAM_LEGACY`).
    pub const CUDA_LEGACY: Stream = Stream(1);
    /// CUDA's per-thread default stream (`CU_STREAM_PER_THREAD`).
    pub const CUDA_PER_THREAD: Stream = Stream(2);
    /// ROCm's default stream.
    pub const ROCM_DEFAULT: Stream = Stream(0);

    /// A stream from its protocol value.
    ///
    /// # Safety
    /// `value` is one of the fixed values above or the handle of a live stream
    /// (a `CUstream`) of the tensor's device, alive for the call it is passed
    /// to: dlbridge passes it to the driver then, and keeps no handle past it
    /// (what is pending on it is marked with an event dlbridge records).
    pub const unsafe fn from_raw(value: i64) -> Stream {
        Stream(value)
    }

    /// The protocol value.
    pub const fn value(self) -> i64 {
        self.0
    }
}

/// What a producer does before handing a tensor to a consumer's stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPlan {
    /// Nothing: the consumer asked for no synchronisation (-1), the data has no
    /// pending work, or it is ready on the consumer's own stream.
    Nothing,
    /// Record an event on `ready` and make `consumer` wait on it, without
    /// blocking the host (`cuEventRecord` + `cuStreamWaitEvent`).
    Wait {
        /// The stream the data is ready on.
        ready: i64,
        /// The consumer's stream.
        consumer: i64,
    },
}

/// Decides the hand-off of data ready on `ready` (`None`: no pending work; -1:
/// unknown, because its producer was asked not to synchronise) to a consumer
/// that passed `consumer` (`None`: the legacy default stream, as the spec says
/// a producer must assume). Stream values are checked for the device type;
/// ROCm values are checked but never waited on (dlbridge makes no HIP calls).
pub fn plan(device: DeviceType, ready: Option<i64>, consumer: Option<i64>) -> Result<SyncPlan, Error> {
    let Some(default) = device.default_stream() else {
        return match consumer {
            None => Ok(SyncPlan::Nothing),
            Some(stream) => Err(Error::InvalidStream { device, stream }),
        };
    };
    let consumer = consumer.unwrap_or(default);
    if !device.accepts_stream(consumer) {
        return Err(Error::InvalidStream { device, stream: consumer });
    }
    Ok(match ready {
        _ if consumer == -1 || device == DeviceType::ROCM => SyncPlan::Nothing,
        None | Some(-1) => SyncPlan::Nothing,
        Some(ready) if !device.accepts_stream(ready) => return Err(Error::InvalidStream { device, stream: ready }),
        Some(ready) if ready == consumer => SyncPlan::Nothing,
        Some(ready) => SyncPlan::Wait { ready, consumer },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_hand_off() {
        let cuda = DeviceType::CUDA;
        assert_eq!(plan(cuda, Some(7), Some(9)), Ok(SyncPlan::Wait { ready: 7, consumer: 9 }));
        assert_eq!(plan(cuda, Some(7), None), Ok(SyncPlan::Wait { ready: 7, consumer: 1 }), "None is the legacy default");
        assert_eq!(plan(cuda, Some(7), Some(7)), Ok(SyncPlan::Nothing));
        assert_eq!(plan(cuda, Some(7), Some(-1)), Ok(SyncPlan::Nothing), "-1 asks for no synchronisation");
        assert_eq!(plan(cuda, None, Some(9)), Ok(SyncPlan::Nothing), "no pending work");
        assert_eq!(plan(cuda, Some(-1), Some(9)), Ok(SyncPlan::Nothing), "unknown: the producer was told not to sync");
        assert_eq!(plan(cuda, Some(0), Some(9)), Err(Error::InvalidStream { device: cuda, stream: 0 }), "0 is no stream");
        assert_eq!(plan(cuda, Some(1), Some(2)), Ok(SyncPlan::Wait { ready: 1, consumer: 2 }));
        assert_eq!(plan(cuda, Some(1), Some(0)), Err(Error::InvalidStream { device: cuda, stream: 0 }));
        assert_eq!(plan(DeviceType::CUDA_MANAGED, Some(3), Some(4)), Ok(SyncPlan::Wait { ready: 3, consumer: 4 }));
    }

    #[test]
    fn rocm_and_cpu() {
        assert_eq!(plan(DeviceType::ROCM, Some(5), Some(0)), Ok(SyncPlan::Nothing));
        assert!(plan(DeviceType::ROCM, Some(5), Some(1)).is_err());
        assert_eq!(plan(DeviceType::CPU, None, None), Ok(SyncPlan::Nothing));
        assert!(plan(DeviceType::CPU, None, Some(1)).is_err());
    }
}
