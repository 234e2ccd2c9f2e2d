//! Every `sizeof`, `_Alignof` and `offsetof` of the real `dlpack.h`, and every
//! constant, must equal what dlbridge declares. Names must match one to one, so
//! a field the header gains or loses fails the test as well.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::mem::{align_of, offset_of, size_of};

use dlbridge::ffi::*;
use dlbridge::{DataTypeCode, DeviceType};
use dlbridge_c_abi_tests::{dlb_layout_len, dlb_layout_rows, HEADER};

macro_rules! rows {
    (sizes: $($t:ident),*; fields: $($ft:ident . $f:ident),*; consts: $($c:ident = $v:expr),* $(,)?) => {{
        let mut rows: Vec<(String, u64)> = Vec::new();
        $(
            rows.push((concat!("sizeof ", stringify!($t)).into(), size_of::<$t>() as u64));
            rows.push((concat!("alignof ", stringify!($t)).into(), align_of::<$t>() as u64));
        )*
        $( rows.push((concat!(stringify!($ft), ".", stringify!($f)).into(), offset_of!($ft, $f) as u64)); )*
        $( rows.push((stringify!($c).into(), $v as u64)); )*
        rows
    }};
}

fn rust_rows() -> BTreeMap<String, u64> {
    let rows = rows! {
        sizes: DLPackVersion, DLDevice, DLDataType, DLTensor, DLManagedTensor, DLManagedTensorVersioned,
            DLPackExchangeAPIHeader, DLPackExchangeAPI;
        fields: DLPackVersion.major, DLPackVersion.minor, DLDevice.device_type, DLDevice.device_id,
            DLDataType.code, DLDataType.bits, DLDataType.lanes,
            DLTensor.data, DLTensor.device, DLTensor.ndim, DLTensor.dtype, DLTensor.shape, DLTensor.strides,
            DLTensor.byte_offset,
            DLManagedTensor.dl_tensor, DLManagedTensor.manager_ctx, DLManagedTensor.deleter,
            DLManagedTensorVersioned.version, DLManagedTensorVersioned.manager_ctx,
            DLManagedTensorVersioned.deleter, DLManagedTensorVersioned.flags, DLManagedTensorVersioned.dl_tensor,
            DLPackExchangeAPIHeader.version, DLPackExchangeAPIHeader.prev_api,
            DLPackExchangeAPI.header, DLPackExchangeAPI.managed_tensor_allocator,
            DLPackExchangeAPI.managed_tensor_from_py_object_no_sync,
            DLPackExchangeAPI.managed_tensor_to_py_object_no_sync,
            DLPackExchangeAPI.dltensor_from_py_object_no_sync, DLPackExchangeAPI.current_work_stream;
        consts:
            DLPACK_MAJOR_VERSION = DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION = DLPACK_MINOR_VERSION,
            DLPACK_FLAG_BITMASK_READ_ONLY = DLPACK_FLAG_BITMASK_READ_ONLY,
            DLPACK_FLAG_BITMASK_IS_COPIED = DLPACK_FLAG_BITMASK_IS_COPIED,
            DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED = DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED,
            kDLCPU = DeviceType::CPU.0, kDLCUDA = DeviceType::CUDA.0, kDLCUDAHost = DeviceType::CUDA_HOST.0,
            kDLOpenCL = DeviceType::OPENCL.0, kDLVulkan = DeviceType::VULKAN.0, kDLMetal = DeviceType::METAL.0,
            kDLVPI = DeviceType::VPI.0, kDLROCM = DeviceType::ROCM.0, kDLROCMHost = DeviceType::ROCM_HOST.0,
            kDLExtDev = DeviceType::EXT_DEV.0, kDLCUDAManaged = DeviceType::CUDA_MANAGED.0,
            kDLOneAPI = DeviceType::ONE_API.0, kDLWebGPU = DeviceType::WEBGPU.0, kDLHexagon = DeviceType::HEXAGON.0,
            kDLMAIA = DeviceType::MAIA.0, kDLTrn = DeviceType::TRN.0,
            kDLInt = DataTypeCode::INT.0, kDLUInt = DataTypeCode::UINT.0, kDLFloat = DataTypeCode::FLOAT.0,
            kDLOpaqueHandle = DataTypeCode::OPAQUE_HANDLE.0, kDLBfloat = DataTypeCode::BFLOAT.0,
            kDLComplex = DataTypeCode::COMPLEX.0, kDLBool = DataTypeCode::BOOL.0,
            kDLFloat8_e3m4 = DataTypeCode::FLOAT8_E3M4.0, kDLFloat8_e4m3 = DataTypeCode::FLOAT8_E4M3.0,
            kDLFloat8_e4m3b11fnuz = DataTypeCode::FLOAT8_E4M3B11FNUZ.0,
            kDLFloat8_e4m3fn = DataTypeCode::FLOAT8_E4M3FN.0, kDLFloat8_e4m3fnuz = DataTypeCode::FLOAT8_E4M3FNUZ.0,
            kDLFloat8_e5m2 = DataTypeCode::FLOAT8_E5M2.0, kDLFloat8_e5m2fnuz = DataTypeCode::FLOAT8_E5M2FNUZ.0,
            kDLFloat8_e8m0fnu = DataTypeCode::FLOAT8_E8M0FNU.0,
            kDLFloat6_e2m3fn = DataTypeCode::FLOAT6_E2M3FN.0, kDLFloat6_e3m2fn = DataTypeCode::FLOAT6_E3M2FN.0,
            kDLFloat4_e2m1fn = DataTypeCode::FLOAT4_E2M1FN.0,
    };
    let mut map: BTreeMap<String, u64> = rows.into_iter().collect();
    map.insert("sizeof DLDeviceType".into(), size_of::<DLDeviceType>() as u64);
    map
}

fn c_rows() -> BTreeMap<String, u64> {
    // SAFETY: the C table is a static array of `dlb_layout_len` rows with
    // static NUL-terminated names.
    unsafe {
        let rows = std::slice::from_raw_parts(dlb_layout_rows.as_ptr(), dlb_layout_len);
        rows.iter().map(|r| (CStr::from_ptr(r.name).to_string_lossy().into_owned(), r.value)).collect()
    }
}

#[test]
fn every_layout_fact_matches_the_real_header() {
    let (rust, c) = (rust_rows(), c_rows());
    assert!(c.len() >= 86, "the C table is suspiciously short: {} rows from {HEADER}", c.len());
    let mut mismatches = Vec::new();
    for (name, c_value) in &c {
        match rust.get(name) {
            Some(r) if r == c_value => {}
            Some(r) => mismatches.push(format!("{name}: header {c_value}, dlbridge {r}")),
            None => mismatches.push(format!("{name}: in the header table, not checked on the Rust side")),
        }
    }
    for name in rust.keys().filter(|n| !c.contains_key(*n)) {
        mismatches.push(format!("{name}: checked on the Rust side, missing from the header table"));
    }
    assert!(mismatches.is_empty(), "layout differs from {HEADER}:\n{}", mismatches.join("\n"));
}
