// Field case of issue #19: a row softmax of ~30 us on an H200 (M=65536, N=200: 105 MB read and written) whose
// solve() also does host work, as a third-party solve() did: it copies the first output row back and sums it on
// the host. The copy waits for the kernel, so the host's time and its jitter are inside every timed call.
#include <cuda_runtime.h>
#include <math.h>

constexpr int ROWS_PER_BLOCK = 8;  // one warp per row

__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int M, int N) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= M) return;
    const float* in = x + (size_t)row * N;
    float* out = y + (size_t)row * N;
    float m = -INFINITY;
    for (int j = lane; j < N; j += 32) m = fmaxf(m, in[j]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float s = 0.0f;
    for (int j = lane; j < N; j += 32) s += expf(in[j] - m);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    float inv = 1.0f / s;
    for (int j = lane; j < N; j += 32) out[j] = expf(in[j] - m) * inv;
}

static float first_row[1024];
volatile float first_row_sum;  // read by nobody: keeps the host loop

extern "C" void solve(const float* x, float* y, int M, int N) {
    if (M <= 0 || N <= 0) return;
    softmax_rows<<<(M + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, 32 * ROWS_PER_BLOCK>>>(x, y, M, N);
    // the host-side "sanity check": a blocking copy of one row, then a loop over it on the host
    int n = N < 1024 ? N : 1024;
    if (cudaMemcpy(first_row, y, n * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) return;
    float s = 0.0f;
    for (int j = 0; j < n; ++j) s += first_row[j];
    first_row_sum = s;
}
