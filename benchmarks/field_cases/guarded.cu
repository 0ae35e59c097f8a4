// Field case of issue #19: the whole kernel body is under an arch guard that sm_90a does not meet, so on an H200
// the kernel compiles to a function that returns at once and y is never written (benchmarks/h200_verify.sh field).
#include <cuda_runtime.h>

__global__ void affine_sm100(const float* __restrict__ x, float* __restrict__ y, int n) {
#if __CUDA_ARCH__ >= 1000
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaf(3.0f, x[i], 1.0f);
#endif
}

extern "C" void solve(const float* x, float* y, int n) {
    if (n > 0) affine_sm100<<<(n + 255) / 256, 256>>>(x, y, n);
}
