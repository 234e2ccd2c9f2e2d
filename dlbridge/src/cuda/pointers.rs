//! What the driver says a pointer is: its device, and whether it is device,
//! managed or pinned host memory. Asked with no context first (unified
//! addressing needs none); a driver that wants one is asked again with a
//! context that is already awake, so that no device's context is woken for it.

use core::ffi::{c_int, c_uint};

use super::{awake_device, check, in_context, Api, DevicePtr, CUDA_ERROR_INVALID_CONTEXT};
use crate::error::Error;
use crate::{Device, DeviceType};

const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_uint = 2;
const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_uint = 8;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_uint = 9;
const CU_MEMORYTYPE_HOST: c_int = 1;
/// What the driver answers for memory it does not know (pageable host memory, garbage).
const CUDA_ERROR_INVALID_VALUE: u32 = 1;

fn attribute(api: &Api, address: usize, attribute: c_uint) -> Result<c_int, Error> {
    let mut value: c_int = 0;
    // SAFETY: a query with a writable out value (an int for these attributes);
    // any address is allowed (an unknown one is an error code).
    let code = unsafe { (api.pointer_get_attribute)((&mut value as *mut c_int).cast(), attribute, address as DevicePtr) };
    check("cuPointerGetAttribute", code).map(|()| value)
}

/// Runs `query` with no context, then, if the driver wants one, with the
/// context of `likely_device` (when the caller knows which device to expect:
/// a producer's claim) or of a device that is already awake.
fn ask<T>(likely_device: Option<i32>, query: impl Fn(&Api) -> Result<T, Error>) -> Result<T, Error> {
    let api = super::api()?;
    match query(api) {
        Err(Error::Cuda { code: CUDA_ERROR_INVALID_CONTEXT, .. }) => {
            in_context(likely_device.unwrap_or_else(|| awake_device(api)), |api| query(api))
        }
        other => other,
    }
}

/// The ordinal of the device that `address` (a CUDA pointer) belongs to. A
/// driver that wants a context is asked with that of `likely_device`, the
/// device the caller expects.
pub fn pointer_device(address: usize, likely_device: i32) -> Result<i32, Error> {
    ask(Some(likely_device), |api| attribute(api, address, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL))
}

/// Where `address` lives, as a DLPack device: CUDA memory of its device,
/// CUDA managed memory, or pinned host memory (`CUDAHost`, device 0); with the
/// ordinal of the device the memory belongs to (for pinned memory, the one
/// whose context allocated it). `None` for memory the driver does not know
/// (pageable host memory, or no memory at all).
pub fn pointer_place(address: usize) -> Result<Option<(Device, i32)>, Error> {
    ask(None, |api| {
        let ordinal = match attribute(api, address, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
            Err(Error::Cuda { code: CUDA_ERROR_INVALID_VALUE, .. }) => return Ok(None),
            other => other?,
        };
        let device = if attribute(api, address, CU_POINTER_ATTRIBUTE_IS_MANAGED)? != 0 {
            Device::new(DeviceType::CUDA_MANAGED, ordinal)
        } else if attribute(api, address, CU_POINTER_ATTRIBUTE_MEMORY_TYPE)? == CU_MEMORYTYPE_HOST {
            Device::new(DeviceType::CUDA_HOST, 0)
        } else {
            Device::cuda(ordinal)
        };
        Ok(Some((device, ordinal)))
    })
}
