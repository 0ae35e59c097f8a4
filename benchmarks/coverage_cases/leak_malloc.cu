// y = 2 x through a scratch buffer that solve() cudaMalloc's on every call and never frees: 4 n bytes lost per
// call (2 MiB at n = 524288). Its output is right and its timing honest; only the device memory it holds grows
// with the calls, which the timing gate's LEAK check reads (issue #39). Its twin, scratch_malloc.cu, frees it.
#include <cuda_runtime.h>

__global__ void scale_into(const float* x, float* scratch, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) scratch[i] = 2.0f * x[i];
}

__global__ void copy_out(const float* scratch, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = scratch[i];
}

extern "C" void solve(const float* x, float* y, int n) {
    float* scratch = nullptr;
    cudaMalloc(&scratch, (size_t)n * sizeof(float));
    int threads = 256, blocks = (n + threads - 1) / threads;
    scale_into<<<blocks, threads>>>(x, scratch, n);
    copy_out<<<blocks, threads>>>(scratch, y, n);
    // no cudaFree(scratch): the leak
}
