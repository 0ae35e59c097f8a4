// Walkthrough, SGEMM iterations 2 and 3 (docs/walkthrough/typed-2026-12-02.md): C[M,N] = A[M,K] @ B[K,N], fp32, row-major,
// on iteration 1's shared-memory and register tiles. Methods, each a switch:
//   VEC     memory.vectorized_access: tiles loaded from global memory as float4 (LDG.E.128), register fragments
//           read from shared memory as float4 (LDS.128)
//   DB      latency.double_buffering: two shared-memory stages; the next tile is loaded into registers while
//           the current one is multiplied, so one barrier per K step
//   UNROLL  compute.loop_unroll: the BK loop fully unrolled (0: #pragma unroll 1)
//   MINB    latency.occupancy_tuning: __launch_bounds__(NT, MINB) asks for MINB resident blocks per SM
//   ASYNC   memory.async_copy (with VEC): the B tile copied global -> shared by cp.async (LDGSTS), 16 bytes a
//           thread, without passing through registers (A still goes through registers: it is transposed)
// Dims that are not multiples of the tiles (and of 4) take a plain kernel, so any shape is right.
#include <cuda_runtime.h>
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef BK
#define BK 8
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
#ifndef DB
#define DB 1
#endif
#ifndef UNROLL
#define UNROLL 1
#endif
#ifndef MINB
#define MINB 1
#endif
#ifndef ASYNC
#define ASYNC 0
#endif
static_assert(!ASYNC || VEC, "ASYNC copies float4 chunks: it needs VEC");
#define NT ((BM / TM) * (BN / TN))
#define LA (BM * BK / 4 / NT)  // float4 of A per thread per tile
#define LB (BK * BN / 4 / NT)  // float4 of B per thread per tile
#define STAGES (DB ? 2 : 1)
static_assert(TM % 4 == 0 && TN % 4 == 0, "float4 fragments need TM and TN multiples of 4");
static_assert(LA > 0 && LB > 0 && (BM * BK / 4) % NT == 0 && (BK * BN / 4) % NT == 0,
              "every thread loads a whole number of float4 of each tile");
#if UNROLL
#define KK_UNROLL _Pragma("unroll")
#else
#define KK_UNROLL _Pragma("unroll 1")
#endif

__global__ void sgemm_plain(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                            int M, int N, int K) {
    int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
    if (row >= M || col >= N) return;
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += A[(size_t)row * K + k] * B[(size_t)k * N + col];
    C[(size_t)row * N + col] = acc;
}

__device__ __forceinline__ void async_b(float (*Bs)[BN], const float* B, int N, int k0, int tid) {
#pragma unroll
    for (int l = 0; l < LB; ++l) {
        int e = tid + l * NT, r = e / (BN / 4), c = (e % (BN / 4)) * 4;
        unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(&Bs[r][c]));
        const float* src = B + (size_t)(k0 + r) * N + blockIdx.x * BN + c;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

__device__ __forceinline__ void async_wait() { asm volatile("cp.async.wait_group 0;\n" ::); }

struct Frag {
    float4 a[LA > 0 ? LA : 1];
    float4 b[LB > 0 ? LB : 1];
};

__device__ __forceinline__ void load_global(Frag& f, const float* A, const float* B, int K, int N, int k0, int tid) {
#pragma unroll
    for (int l = 0; l < LA; ++l) {
        int e = tid + l * NT, r = e / (BK / 4), c4 = e % (BK / 4);
        f.a[l] = *reinterpret_cast<const float4*>(A + (size_t)(blockIdx.y * BM + r) * K + k0 + c4 * 4);
    }
#if !ASYNC
#pragma unroll
    for (int l = 0; l < LB; ++l) {
        int e = tid + l * NT, r = e / (BN / 4), c4 = e % (BN / 4);
        f.b[l] = *reinterpret_cast<const float4*>(B + (size_t)(k0 + r) * N + blockIdx.x * BN + c4 * 4);
    }
#endif
}

__device__ __forceinline__ void store_shared(const Frag& f, float (*As)[BM], float (*Bs)[BN], int tid) {
#pragma unroll
    for (int l = 0; l < LA; ++l) {
        int e = tid + l * NT, r = e / (BK / 4), c = (e % (BK / 4)) * 4;
        As[c + 0][r] = f.a[l].x;
        As[c + 1][r] = f.a[l].y;
        As[c + 2][r] = f.a[l].z;
        As[c + 3][r] = f.a[l].w;
    }
#if !ASYNC
#pragma unroll
    for (int l = 0; l < LB; ++l) {
        int e = tid + l * NT, r = e / (BN / 4), c = (e % (BN / 4)) * 4;
        *reinterpret_cast<float4*>(&Bs[r][c]) = f.b[l];
    }
#endif
}

// Scalar tile loads (VEC 0): the same elements as load_global + store_shared, one float at a time.
__device__ __forceinline__ void load_scalar(const float* A, const float* B, float (*As)[BM], float (*Bs)[BN],
                                            int K, int N, int k0, int tid) {
    for (int e = tid; e < BM * BK; e += NT) {
        int r = e / BK, c = e % BK;
        As[c][r] = A[(size_t)(blockIdx.y * BM + r) * K + k0 + c];
    }
    for (int e = tid; e < BK * BN; e += NT) {
        int r = e / BN, c = e % BN;
        Bs[r][c] = B[(size_t)(k0 + r) * N + blockIdx.x * BN + c];
    }
}

__global__ void __launch_bounds__(NT, MINB) sgemm_tiled2(const float* __restrict__ A, const float* __restrict__ B,
                                                         float* __restrict__ C, int M, int N, int K) {
    __shared__ __align__(16) float As[STAGES][BK][BM];
    __shared__ __align__(16) float Bs[STAGES][BK][BN];
    const int tid = threadIdx.x, tx = tid % (BN / TN), ty = tid / (BN / TN);
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;
    const int tiles = K / BK;
#if VEC
    Frag f;
#endif
#if VEC
#if ASYNC
    async_b(Bs[0], B, N, 0, tid);
#endif
    load_global(f, A, B, K, N, 0, tid);
    store_shared(f, As[0], Bs[0], tid);
#if ASYNC
    async_wait();
#endif
#else
    load_scalar(A, B, As[0], Bs[0], K, N, 0, tid);
#endif
    __syncthreads();
    for (int t = 0; t < tiles; ++t) {
        const int cur = DB ? (t & 1) : 0;
#if DB && VEC
        if (t + 1 < tiles) {
#if ASYNC
            async_b(Bs[cur ^ 1], B, N, (t + 1) * BK, tid);
#endif
            load_global(f, A, B, K, N, (t + 1) * BK, tid);
        }
#endif
        KK_UNROLL
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
#if VEC
#pragma unroll
            for (int i = 0; i < TM; i += 4) {
                float4 v = *reinterpret_cast<const float4*>(&As[cur][kk][ty * TM + i]);
                a[i] = v.x; a[i + 1] = v.y; a[i + 2] = v.z; a[i + 3] = v.w;
            }
#pragma unroll
            for (int j = 0; j < TN; j += 4) {
                float4 v = *reinterpret_cast<const float4*>(&Bs[cur][kk][tx * TN + j]);
                b[j] = v.x; b[j + 1] = v.y; b[j + 2] = v.z; b[j + 3] = v.w;
            }
#else
#pragma unroll
            for (int i = 0; i < TM; ++i) a[i] = As[cur][kk][ty * TM + i];
#pragma unroll
            for (int j = 0; j < TN; ++j) b[j] = Bs[cur][kk][tx * TN + j];
#endif
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
        }
        if (t + 1 < tiles) {
#if DB
#if VEC
            store_shared(f, As[cur ^ 1], Bs[cur ^ 1], tid);
#if ASYNC
            async_wait();
#endif
#else
            load_scalar(A, B, As[cur ^ 1], Bs[cur ^ 1], K, N, (t + 1) * BK, tid);
#endif
            __syncthreads();
#else
            __syncthreads();
#if VEC
#if ASYNC
            async_b(Bs[0], B, N, (t + 1) * BK, tid);
#endif
            load_global(f, A, B, K, N, (t + 1) * BK, tid);
            store_shared(f, As[0], Bs[0], tid);
#if ASYNC
            async_wait();
#endif
#else
            load_scalar(A, B, As[0], Bs[0], K, N, (t + 1) * BK, tid);
#endif
            __syncthreads();
#endif
        }
    }
    const int row0 = blockIdx.y * BM + ty * TM, col0 = blockIdx.x * BN + tx * TN;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#if VEC
#pragma unroll
        for (int j = 0; j < TN; j += 4) {
            float4 v = make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
            *reinterpret_cast<float4*>(C + (size_t)(row0 + i) * N + col0 + j) = v;
        }
#else
#pragma unroll
        for (int j = 0; j < TN; ++j) C[(size_t)(row0 + i) * N + col0 + j] = acc[i][j];
#endif
}

extern "C" void solve(const float* A, const float* B, float* C, int M, int N, int K) {
    if (M % BM || N % BN || K % BK || N % 4 || K % 4) {
        sgemm_plain<<<dim3((N + 15) / 16, (M + 15) / 16), dim3(16, 16)>>>(A, B, C, M, N, K);
        return;
    }
    sgemm_tiled2<<<dim3(N / BN, M / BM), NT>>>(A, B, C, M, N, K);
}
