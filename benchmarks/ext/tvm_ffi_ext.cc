// The tvm-ffi side of `./dev bench`'s extension-call rows: the same four
// functions as dlbridge_ext, exported through tvm-ffi's C++ function API and
// loaded with tvm_ffi.load_module. Checks as a tvm-ffi kernel writes them.
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

using tvm::ffi::TensorView;

static void check(const TensorView &x) {
    TVM_FFI_ICHECK(x.ndim() == 1) << "expected a 1-d tensor";
    TVM_FFI_ICHECK(x.dtype().code == kDLFloat && x.dtype().bits == 32 && x.dtype().lanes == 1)
        << "expected float32";
    TVM_FFI_ICHECK(x.device().device_type == kDLCPU) << "expected a CPU tensor";
}

static float total(TensorView x) {
    check(x);
    const float *p = reinterpret_cast<const float *>(static_cast<const char *>(x.data_ptr()) + x.byte_offset());
    int64_t n = x.size(0), step = x.stride(0);
    float s = 0.0f;
    for (int64_t i = 0; i < n; ++i) s += p[i * step];
    return s;
}

static void twice(TensorView x) {
    check(x);
    float *p = reinterpret_cast<float *>(static_cast<char *>(x.data_ptr()) + x.byte_offset());
    int64_t n = x.size(0), step = x.stride(0);
    for (int64_t i = 0; i < n; ++i) p[i * step] *= 2.0f;
}

static double sum1(TensorView x) { return total(x); }
static double sum3(TensorView a, TensorView b, TensorView c) { return total(a) + total(b) + total(c); }
static void scale1(TensorView x) { twice(x); }
static void scale3(TensorView a, TensorView b, TensorView c) { twice(a); twice(b); twice(c); }

TVM_FFI_DLL_EXPORT_TYPED_FUNC(sum1, sum1);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(sum3, sum3);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale1, scale1);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale3, scale3);
