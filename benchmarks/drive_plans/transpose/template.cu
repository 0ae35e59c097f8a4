// Tiled transpose, y[N, M] = x[M, N]^T in fp32, with one switch per optimization method the drive may claim
// (benchmarks/drive_plans/transpose_h200.py writes each branch and ablation as a block of #defines on top of this
// file). Switches: SMEM (memory.shared_memory_tiling: a TILE x TILE tile staged in shared memory, padded by PAD, so
// both the reads of x and the writes of y are coalesced), VEC (memory.vectorized_access: float4 loads and stores
// where the row length allows, scalar tails), ASYNC (memory.async_copy: the tile filled with cp.async, needs SMEM),
// UNROLL (compute.loop_unroll of the per-thread row loops), MINB (latency.occupancy_tuning: __launch_bounds__'s
// minimum blocks per SM; 0 leaves it out). Hyperparameters: TILE, BROWS (thread rows per block).
#include <cuda_runtime.h>
#include <cuda_pipeline.h>

#ifndef TILE
#define TILE 32
#endif
#ifndef BROWS
#define BROWS 8
#endif
#ifndef PAD
#define PAD 1
#endif
#ifndef SMEM
#define SMEM 1
#endif
#ifndef VEC
#define VEC 0
#endif
#ifndef ASYNC
#define ASYNC 0
#endif
#ifndef UNROLL
#define UNROLL 0
#endif
#ifndef MINB
#define MINB 0
#endif
#if ASYNC && !SMEM
#error "ASYNC fills the shared-memory tile: it needs SMEM"
#endif

constexpr int V = VEC ? 4 : 1;               // columns per thread
constexpr int TX = TILE / V;                  // threads along a tile row
constexpr int THREADS = TX * BROWS;
static_assert(TILE % V == 0 && TILE % BROWS == 0 && THREADS <= 1024, "bad tile shape");

#if UNROLL
#define ROWS_LOOP _Pragma("unroll")
#else
#define ROWS_LOOP _Pragma("unroll 1")
#endif

#if MINB > 0
#define BOUNDS __launch_bounds__(THREADS, MINB)
#else
#define BOUNDS __launch_bounds__(THREADS)
#endif

__global__ void BOUNDS transpose_tiled(const float* __restrict__ x, float* __restrict__ y, int M, int N) {
    const int bx = blockIdx.x * TILE;  // first column of x in this tile
    const int by = blockIdx.y * TILE;  // first row of x in this tile
    const int tx = threadIdx.x, ty = threadIdx.y;
    const bool rows4 = (N & 3) == 0;   // x's rows start 16-byte aligned: float4 loads are allowed
    const bool cols4 = (M & 3) == 0;   // y's rows start 16-byte aligned: float4 stores are allowed
    (void)rows4;
    (void)cols4;
#if SMEM
    __shared__ float tile[TILE][TILE + PAD];
    ROWS_LOOP
    for (int k = 0; k < TILE; k += BROWS) {
        const int rl = ty + k, cl = tx * V;
        const int gr = by + rl, gc = bx + cl;
        if (gr >= M) continue;
#if ASYNC
        #pragma unroll
        for (int q = 0; q < V; ++q)
            if (gc + q < N) __pipeline_memcpy_async(&tile[rl][cl + q], x + (size_t)gr * N + gc + q, sizeof(float));
#elif VEC
        if (rows4 && gc + 3 < N) {
            const float4 v = *reinterpret_cast<const float4*>(x + (size_t)gr * N + gc);
            tile[rl][cl] = v.x; tile[rl][cl + 1] = v.y; tile[rl][cl + 2] = v.z; tile[rl][cl + 3] = v.w;
        } else {
            #pragma unroll
            for (int q = 0; q < V; ++q)
                if (gc + q < N) tile[rl][cl + q] = x[(size_t)gr * N + gc + q];
        }
#else
        if (gc < N) tile[rl][cl] = x[(size_t)gr * N + gc];
#endif
    }
#if ASYNC
    __pipeline_commit();
    __pipeline_wait_prior(0);
#endif
    __syncthreads();
    ROWS_LOOP
    for (int k = 0; k < TILE; k += BROWS) {
        const int orl = ty + k, ocl = tx * V;      // row and first column of y in this tile
        const int orow = bx + orl, ocol = by + ocl;  // y's row is x's column, y's column is x's row
        if (orow >= N) continue;
#if VEC
        if (cols4 && ocol + 3 < M) {
            const float4 o = make_float4(tile[ocl][orl], tile[ocl + 1][orl], tile[ocl + 2][orl], tile[ocl + 3][orl]);
            *reinterpret_cast<float4*>(y + (size_t)orow * M + ocol) = o;
        } else {
            #pragma unroll
            for (int q = 0; q < V; ++q)
                if (ocol + q < M) y[(size_t)orow * M + ocol + q] = tile[ocl + q][orl];
        }
#else
        if (ocol < M) y[(size_t)orow * M + ocol] = tile[ocl][orl];
#endif
    }
#else
    // no shared memory: each thread moves its own elements, the writes of y strided by M
    ROWS_LOOP
    for (int k = 0; k < TILE; k += BROWS) {
        const int gr = by + ty + k, gc = bx + tx * V;
        if (gr >= M) continue;
#if VEC
        if (rows4 && gc + 3 < N) {
            const float4 v = *reinterpret_cast<const float4*>(x + (size_t)gr * N + gc);
            y[(size_t)gc * M + gr] = v.x; y[(size_t)(gc + 1) * M + gr] = v.y;
            y[(size_t)(gc + 2) * M + gr] = v.z; y[(size_t)(gc + 3) * M + gr] = v.w;
            continue;
        }
#endif
        #pragma unroll
        for (int q = 0; q < V; ++q)
            if (gc + q < N) y[(size_t)(gc + q) * M + gr] = x[(size_t)gr * N + gc + q];
    }
#endif
}

extern "C" void solve(const float* x, float* y, int M, int N) {
    if (M <= 0 || N <= 0) return;
    dim3 block(TX, BROWS);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    transpose_tiled<<<grid, block>>>(x, y, M, N);
}
