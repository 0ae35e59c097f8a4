// Walkthrough, layer norm iteration 1 (docs/walkthrough/typed-2026-12-02.md): y = (x - mean) / sqrt(var + eps) * w + b per row
// of x[M, N], fp32. Methods: memory.coalescing (T threads share a row and step through it together, so a warp
// reads 32 consecutive floats; COALESCED 0 gives each thread its own contiguous chunk of the row instead) and
// latency.warp_shuffle (the row's sums reduced with __shfl_xor_sync inside each warp, then across warps through
// shared memory; USE_SHFL 0 reduces in a shared-memory tree with a barrier per level). A branch is a choice of T
// threads per row and rows per block.
#include <cuda_runtime.h>
#ifndef T
#define T 128
#endif
#ifndef ROWS
#define ROWS 1
#endif
#ifndef COALESCED
#define COALESCED 1
#endif
#ifndef USE_SHFL
#define USE_SHFL 1
#endif
#define WARPS (T / 32)

// The sum of v over the T threads of this row's group (row r of the block); every thread gets it.
__device__ __forceinline__ float row_sum(float v, float* red, int r, int t) {
#if USE_SHFL
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (WARPS == 1) return v;
    __syncthreads();
    if ((t & 31) == 0) red[r * WARPS + t / 32] = v;
    __syncthreads();
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) s += red[r * WARPS + w];
    return s;
#else
    __syncthreads();
    red[r * T + t] = v;
    __syncthreads();
    for (int h = T / 2; h > 0; h >>= 1) {
        if (t < h) red[r * T + t] += red[r * T + t + h];
        __syncthreads();
    }
    return red[r * T];
#endif
}

__global__ void __launch_bounds__(T * ROWS) layernorm_rows(const float* __restrict__ x, const float* __restrict__ w,
                                                           const float* __restrict__ b, float* __restrict__ y,
                                                           int M, int N, float eps) {
#if USE_SHFL
    __shared__ float red[ROWS * WARPS];
#else
    __shared__ float red[ROWS * T];
#endif
    const int r = threadIdx.x / T, t = threadIdx.x % T;
    const int row = blockIdx.x * ROWS + r;
    const bool live = row < M;
    const float* xr = x + (size_t)(live ? row : 0) * N;
#if COALESCED
#define IDX(i) ((i) * T + t)
    const int per = (N + T - 1) / T;
#else
    const int per = (N + T - 1) / T;
#define IDX(i) (t * per + (i))
#endif
    float s = 0.0f;
    for (int i = 0; i < per; ++i) {
        int j = IDX(i);
        if (live && j < N) s += xr[j];
    }
    const float mean = row_sum(s, red, r, t) / N;
    float q = 0.0f;
    for (int i = 0; i < per; ++i) {
        int j = IDX(i);
        if (live && j < N) {
            float d = xr[j] - mean;
            q += d * d;
        }
    }
    const float inv = rsqrtf(row_sum(q, red, r, t) / N + eps);
    if (!live) return;
    float* yr = y + (size_t)row * N;
    for (int i = 0; i < per; ++i) {
        int j = IDX(i);
        if (j < N) yr[j] = (xr[j] - mean) * inv * w[j] + b[j];
    }
}

extern "C" void solve(const float* x, const float* w, const float* b, float* y, int M, int N, float eps) {
    layernorm_rows<<<(M + ROWS - 1) / ROWS, T * ROWS>>>(x, w, b, y, M, N, eps);
}
