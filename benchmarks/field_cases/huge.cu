// Field case of issue #19: a correct kernel that is run at a size that cannot fit any GPU (n=10^12: 4 TB of input,
// 8 TB per input set); the plan gate must refuse it from its estimate before anything is allocated.
#include <cuda_runtime.h>

__global__ void affine(const float* __restrict__ x, float* __restrict__ y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = fmaf(3.0f, x[i], 1.0f);
}

extern "C" void solve(const float* x, float* y, long long n) {
    if (n > 0) affine<<<132 * 8, 256>>>(x, y, n);
}
