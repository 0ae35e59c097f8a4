// SGEMM with register tiling (compute.register_tiling) over shared-memory tiles (memory.shared_memory_tiling):
// a BM x BN block tile, each of the 256 threads computes TM x TN outputs held in registers. VEC=1 loads the tiles
// and stores C with 128-bit accesses (memory.vectorized_access). Needs M % BM == 0, N % BN == 0, K % BK == 0.
#include <cuda_runtime.h>
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef TM
#define TM 8
#endif
#ifndef TN
#define TN 8
#endif
#ifndef VEC
#define VEC 1
#endif
#define BK 8
#define THREADS ((BM / TM) * (BN / TN))

__global__ void __launch_bounds__(THREADS) sgemm_reg(const float* __restrict__ A, const float* __restrict__ B,
                                                     float* __restrict__ C, int M, int N, int K) {
    __shared__ float As[BK][BM];  // A tile, transposed
    __shared__ float Bs[BK][BN];
    const int tx = threadIdx.x % (BN / TN), ty = threadIdx.x / (BN / TN);
    const int bm = blockIdx.y * BM, bn = blockIdx.x * BN;
    float acc[TM][TN] = {};
    float a[TM], b[TN];
    for (int k0 = 0; k0 < K; k0 += BK) {
#if VEC
        for (int e = threadIdx.x; e < BM * BK / 4; e += THREADS) {
            int r = e / (BK / 4), c = (e % (BK / 4)) * 4;
            float4 v = *reinterpret_cast<const float4*>(&A[(size_t)(bm + r) * K + k0 + c]);
            As[c][r] = v.x; As[c + 1][r] = v.y; As[c + 2][r] = v.z; As[c + 3][r] = v.w;
        }
        for (int e = threadIdx.x; e < BK * BN / 4; e += THREADS) {
            int r = e / (BN / 4), c = (e % (BN / 4)) * 4;
            *reinterpret_cast<float4*>(&Bs[r][c]) = *reinterpret_cast<const float4*>(&B[(size_t)(k0 + r) * N + bn + c]);
        }
#else
        for (int e = threadIdx.x; e < BM * BK; e += THREADS) {
            int r = e / BK, c = e % BK;
            As[c][r] = A[(size_t)(bm + r) * K + k0 + c];
        }
        for (int e = threadIdx.x; e < BK * BN; e += THREADS) {
            int r = e / BN, c = e % BN;
            Bs[r][c] = B[(size_t)(k0 + r) * N + bn + c];
        }
#endif
        __syncthreads();
#pragma unroll
        for (int k = 0; k < BK; ++k) {
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[k][ty * TM + i];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[k][tx * TN + j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        float* out = &C[(size_t)(bm + ty * TM + i) * N + bn + tx * TN];
#if VEC
#pragma unroll
        for (int j = 0; j < TN; j += 4)
            *reinterpret_cast<float4*>(&out[j]) = make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
#else
#pragma unroll
        for (int j = 0; j < TN; ++j) out[j] = acc[i][j];
#endif
    }
}

extern "C" void solve(const float* A, const float* B, float* C, int M, int N, int K) {
    dim3 grid(N / BN, M / BM);
    sgemm_reg<<<grid, THREADS>>>(A, B, C, M, N, K);
}
