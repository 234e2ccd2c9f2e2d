/* sizeof/offsetof of every DLPack struct and field, and the value of every
 * constant, as the real dlpack.h defines them. The Rust test compares each row
 * with what dlbridge reports, by name. */
#include <stddef.h>
#include <stdint.h>
#include <dlpack/dlpack.h>

typedef struct { const char* name; uint64_t value; } dlb_row;

#define SIZE(T) {"sizeof " #T, sizeof(T)}, {"alignof " #T, _Alignof(T)}
#define FIELD(T, f) {#T "." #f, offsetof(T, f)}
#define CONST(c) {#c, (uint64_t)(c)}

const dlb_row dlb_layout_rows[] = {
    SIZE(DLPackVersion), FIELD(DLPackVersion, major), FIELD(DLPackVersion, minor),
    SIZE(DLDevice), FIELD(DLDevice, device_type), FIELD(DLDevice, device_id),
    SIZE(DLDataType), FIELD(DLDataType, code), FIELD(DLDataType, bits), FIELD(DLDataType, lanes),
    SIZE(DLTensor), FIELD(DLTensor, data), FIELD(DLTensor, device), FIELD(DLTensor, ndim),
    FIELD(DLTensor, dtype), FIELD(DLTensor, shape), FIELD(DLTensor, strides), FIELD(DLTensor, byte_offset),
    SIZE(DLManagedTensor), FIELD(DLManagedTensor, dl_tensor), FIELD(DLManagedTensor, manager_ctx),
    FIELD(DLManagedTensor, deleter),
    SIZE(DLManagedTensorVersioned), FIELD(DLManagedTensorVersioned, version),
    FIELD(DLManagedTensorVersioned, manager_ctx), FIELD(DLManagedTensorVersioned, deleter),
    FIELD(DLManagedTensorVersioned, flags), FIELD(DLManagedTensorVersioned, dl_tensor),
    SIZE(DLPackExchangeAPIHeader), FIELD(DLPackExchangeAPIHeader, version), FIELD(DLPackExchangeAPIHeader, prev_api),
    SIZE(DLPackExchangeAPI), FIELD(DLPackExchangeAPI, header), FIELD(DLPackExchangeAPI, managed_tensor_allocator),
    FIELD(DLPackExchangeAPI, managed_tensor_from_py_object_no_sync),
    FIELD(DLPackExchangeAPI, managed_tensor_to_py_object_no_sync),
    FIELD(DLPackExchangeAPI, dltensor_from_py_object_no_sync), FIELD(DLPackExchangeAPI, current_work_stream),
    {"sizeof DLDeviceType", sizeof(DLDeviceType)},
    CONST(DLPACK_MAJOR_VERSION), CONST(DLPACK_MINOR_VERSION),
    CONST(DLPACK_FLAG_BITMASK_READ_ONLY), CONST(DLPACK_FLAG_BITMASK_IS_COPIED),
    CONST(DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED),
    CONST(kDLCPU), CONST(kDLCUDA), CONST(kDLCUDAHost), CONST(kDLOpenCL), CONST(kDLVulkan), CONST(kDLMetal),
    CONST(kDLVPI), CONST(kDLROCM), CONST(kDLROCMHost), CONST(kDLExtDev), CONST(kDLCUDAManaged),
    CONST(kDLOneAPI), CONST(kDLWebGPU), CONST(kDLHexagon), CONST(kDLMAIA), CONST(kDLTrn),
    CONST(kDLInt), CONST(kDLUInt), CONST(kDLFloat), CONST(kDLOpaqueHandle), CONST(kDLBfloat),
    CONST(kDLComplex), CONST(kDLBool), CONST(kDLFloat8_e3m4), CONST(kDLFloat8_e4m3),
    CONST(kDLFloat8_e4m3b11fnuz), CONST(kDLFloat8_e4m3fn), CONST(kDLFloat8_e4m3fnuz),
    CONST(kDLFloat8_e5m2), CONST(kDLFloat8_e5m2fnuz), CONST(kDLFloat8_e8m0fnu),
    CONST(kDLFloat6_e2m3fn), CONST(kDLFloat6_e3m2fn), CONST(kDLFloat4_e2m1fn),
};

const size_t dlb_layout_len = sizeof(dlb_layout_rows) / sizeof(dlb_layout_rows[0]);
