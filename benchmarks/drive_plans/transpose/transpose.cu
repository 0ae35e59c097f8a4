// Naive out-of-place transpose, the baseline of the H200 acceptance drive (benchmarks/drive_plans/transpose_h200.py):
// y[N, M] = x[M, N]^T, fp32. One thread per element, 16x16 blocks: the reads of x are coalesced along a row, the
// writes of y stride by M floats, so every warp's store touches 32 different DRAM sectors.
#include <cuda_runtime.h>

__global__ void transpose_naive(const float* __restrict__ x, float* __restrict__ y, int M, int N) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;  // column of x
    int r = blockIdx.y * blockDim.y + threadIdx.y;  // row of x
    if (r < M && c < N) y[(size_t)c * M + r] = x[(size_t)r * N + c];
}

extern "C" void solve(const float* x, float* y, int M, int N) {
    if (M <= 0 || N <= 0) return;
    dim3 block(16, 16);
    dim3 grid((N + 15) / 16, (M + 15) / 16);
    transpose_naive<<<grid, block>>>(x, y, M, N);
}
