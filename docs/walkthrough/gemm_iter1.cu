// Walkthrough, SGEMM iteration 1 (docs/walkthrough/typed-2026-12-02.md): C[M,N] = A[M,K] @ B[K,N], fp32, row-major.
// Methods: memory.shared_memory_tiling (USE_SMEM: BM x BK of A and BK x BN of B staged in shared memory per step of
// K) and compute.register_tiling (each thread accumulates a TM x TN tile of C in registers). A branch is a choice
// of tile sizes; an ablation turns one method off (USE_SMEM 0: the same register tile fed from global memory;
// TM = TN = 1: one output per thread, 16 x 16 threads).
#include <cuda_runtime.h>
#ifndef BM
#define BM 64
#endif
#ifndef BN
#define BN 64
#endif
#ifndef BK
#define BK 8
#endif
#ifndef TM
#define TM 4
#endif
#ifndef TN
#define TN 4
#endif
#ifndef USE_SMEM
#define USE_SMEM 1
#endif
#define NT ((BM / TM) * (BN / TN))

__global__ void __launch_bounds__(NT) sgemm_tiled(const float* __restrict__ A, const float* __restrict__ B,
                                                  float* __restrict__ C, int M, int N, int K) {
    const int tid = threadIdx.x;
    const int tx = tid % (BN / TN), ty = tid / (BN / TN);
    const int row0 = blockIdx.y * BM + ty * TM, col0 = blockIdx.x * BN + tx * TN;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
#if USE_SMEM
    __shared__ float As[BK][BM];
    __shared__ float Bs[BK][BN];
    for (int k0 = 0; k0 < K; k0 += BK) {
        for (int e = tid; e < BM * BK; e += NT) {
            int r = e / BK, c = e % BK, gr = blockIdx.y * BM + r, gc = k0 + c;
            As[c][r] = (gr < M && gc < K) ? A[(size_t)gr * K + gc] : 0.0f;
        }
        for (int e = tid; e < BK * BN; e += NT) {
            int r = e / BN, c = e % BN, gr = k0 + r, gc = blockIdx.x * BN + c;
            Bs[r][c] = (gr < K && gc < N) ? B[(size_t)gr * N + gc] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[kk][ty * TM + i];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[kk][tx * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#else
    for (int k = 0; k < K; ++k) {
        float a[TM], b[TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) a[i] = (row0 + i < M) ? A[(size_t)(row0 + i) * K + k] : 0.0f;
#pragma unroll
        for (int j = 0; j < TN; ++j) b[j] = (col0 + j < N) ? B[(size_t)k * N + col0 + j] : 0.0f;
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
#endif
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            if (row0 + i < M && col0 + j < N) C[(size_t)(row0 + i) * N + col0 + j] = acc[i][j];
}

extern "C" void solve(const float* A, const float* B, float* C, int M, int N, int K) {
    dim3 grid((N + BN - 1) / BN, (M + BM - 1) / BM);
    sgemm_tiled<<<grid, NT>>>(A, B, C, M, N, K);
}
