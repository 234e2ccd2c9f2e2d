// The kernel of examples/cuda_kernel, in CUDA C. scale.ptx beside it is what
// NVRTC compiles it to (kernels/generate.py); the extension ships that PTX
// and the driver compiles it for the GPU at run time.
//
// out[i] = x[i] * factor for i < n, with a grid-stride loop so that any grid
// covers any n. x and out may be the same memory (scaling in place).
extern "C" __global__ void scale_f32(const float* x, float* out, unsigned long long n, float factor) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = x[i] * factor;
    }
}
