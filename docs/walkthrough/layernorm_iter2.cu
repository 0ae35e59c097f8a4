// Walkthrough, layer norm iterations 2 and 3 (docs/walkthrough/typed-2026-12-02.md), on iteration 1's coalesced row split and
// warp-shuffle reductions. Methods, each a switch:
//   SMEM_ROW  memory.shared_memory_tiling: the row is read from global memory once, staged in shared memory, and the
//             variance and output passes read it there (0: three passes over global memory)
//   VEC       memory.vectorized_access: float4 loads and stores (LDG.E.128 / STG.E.128); rows whose length is not
//             a multiple of 4 take the scalar path
//   UNROLL    compute.loop_unroll: the per-thread loops unrolled by 4 (0: #pragma unroll 1; -1: no pragma, the
//             compiler's choice, as in iteration 1)
//   MINB      latency.occupancy_tuning: __launch_bounds__(TPR * ROWS, MINB)
// TPR threads share a row; a block holds ROWS rows.
#include <cuda_runtime.h>
#ifndef TPR
#define TPR 256
#endif
#ifndef ROWS
#define ROWS 1
#endif
#ifndef SMEM_ROW
#define SMEM_ROW 1
#endif
#ifndef VEC
#define VEC 1
#endif
#ifndef UNROLL
#define UNROLL -1
#endif
#ifndef MINB
#define MINB 1
#endif
#define WARPS (TPR / 32)
#if UNROLL > 0
#define LOOP_UNROLL _Pragma("unroll 4")
#elif UNROLL == 0
#define LOOP_UNROLL _Pragma("unroll 1")
#else
#define LOOP_UNROLL
#endif

__device__ __forceinline__ float row_sum(float v, float* red, int r, int t) {
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
}

// Each thread reads back, in the second and third passes, only the elements it staged itself: no barrier is
// needed between staging and reading the row.
template <bool V>
__global__ void __launch_bounds__(TPR * ROWS, MINB) layernorm_rows2(const float* __restrict__ x,
                                                                  const float* __restrict__ w,
                                                                  const float* __restrict__ b, float* __restrict__ y,
                                                                  int M, int N, float eps) {
    __shared__ float red[ROWS * WARPS];
    extern __shared__ float4 dyn[];
    const int r = threadIdx.x / TPR, t = threadIdx.x % TPR;
    const int row = blockIdx.x * ROWS + r;
    const bool live = row < M;
    const float* xr = x + (size_t)(live ? row : 0) * N;
    float* stage = reinterpret_cast<float*>(dyn) + (size_t)r * N;
    (void)stage;
    float s = 0.0f;
    if (V) {
        const float4* x4 = reinterpret_cast<const float4*>(xr);
        LOOP_UNROLL
        for (int i = t; i < N / 4; i += TPR) {
            float4 v = live ? x4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
#if SMEM_ROW
            reinterpret_cast<float4*>(stage)[i] = v;
#endif
            s += (v.x + v.y) + (v.z + v.w);
        }
    } else {
        LOOP_UNROLL
        for (int j = t; j < N; j += TPR) {
            float v = live ? xr[j] : 0.0f;
#if SMEM_ROW
            stage[j] = v;
#endif
            s += v;
        }
    }
    const float mean = row_sum(s, red, r, t) / N;
#if SMEM_ROW
    const float* src = stage;
#else
    const float* src = xr;
#endif
    float q = 0.0f;
    if (V) {
        LOOP_UNROLL
        for (int i = t; i < N / 4; i += TPR) {
            float4 v = live ? reinterpret_cast<const float4*>(src)[i] : make_float4(mean, mean, mean, mean);
            float a = v.x - mean, c = v.y - mean, d = v.z - mean, e = v.w - mean;
            q += (a * a + c * c) + (d * d + e * e);
        }
    } else {
        LOOP_UNROLL
        for (int j = t; j < N; j += TPR) {
            float d = live ? src[j] - mean : 0.0f;
            q += d * d;
        }
    }
    const float inv = rsqrtf(row_sum(q, red, r, t) / N + eps);
    if (!live) return;
    float* yr = y + (size_t)row * N;
    if (V) {
        const float4* w4 = reinterpret_cast<const float4*>(w);
        const float4* b4 = reinterpret_cast<const float4*>(b);
        LOOP_UNROLL
        for (int i = t; i < N / 4; i += TPR) {
            float4 v = reinterpret_cast<const float4*>(src)[i], g = w4[i], h = b4[i], o;
            o.x = (v.x - mean) * inv * g.x + h.x;
            o.y = (v.y - mean) * inv * g.y + h.y;
            o.z = (v.z - mean) * inv * g.z + h.z;
            o.w = (v.w - mean) * inv * g.w + h.w;
            reinterpret_cast<float4*>(yr)[i] = o;
        }
    } else {
        LOOP_UNROLL
        for (int j = t; j < N; j += TPR) yr[j] = (src[j] - mean) * inv * w[j] + b[j];
    }
}

extern "C" void solve(const float* x, const float* w, const float* b, float* y, int M, int N, float eps) {
    size_t smem = SMEM_ROW ? (size_t)ROWS * N * sizeof(float) : 0;
#if VEC
    auto kernel = N % 4 == 0 ? layernorm_rows2<true> : layernorm_rows2<false>;
#else
    auto kernel = layernorm_rows2<false>;
#endif
    if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    kernel<<<(M + ROWS - 1) / ROWS, TPR * ROWS, smem>>>(x, w, b, y, M, N, eps);
}
