// Inclusive prefix sum, recursive Blelloch: each level scans blocks of 512 in shared memory, writes each block's
// total to a buffer it cudaMalloc's, scans those totals (recursively) and adds them back; the buffers are
// cudaFree'd before solve() returns. Honest host work inside the call: timed by its events, not SUSPECT (#41).
#include <cuda_runtime.h>

constexpr int B = 512;  // elements per block, two per thread

__global__ void scan_blocks(const float* in, float* out, float* sums, int n) {
    __shared__ float s[B];
    int t = threadIdx.x, base = blockIdx.x * B;
    float a = base + 2 * t < n ? in[base + 2 * t] : 0.0f;
    float b = base + 2 * t + 1 < n ? in[base + 2 * t + 1] : 0.0f;
    s[2 * t] = a;
    s[2 * t + 1] = b;
    for (int d = 1; d < B; d <<= 1) {  // up-sweep: partial sums in place
        __syncthreads();
        int i = (t + 1) * 2 * d - 1;
        if (i < B) s[i] += s[i - d];
    }
    __syncthreads();
    float total = s[B - 1];
    __syncthreads();
    if (t == 0) s[B - 1] = 0.0f;
    for (int d = B / 2; d >= 1; d >>= 1) {  // down-sweep: the exclusive scan
        __syncthreads();
        int i = (t + 1) * 2 * d - 1;
        if (i < B) {
            float left = s[i - d];
            s[i - d] = s[i];
            s[i] += left;
        }
    }
    __syncthreads();
    if (base + 2 * t < n) out[base + 2 * t] = s[2 * t] + a;
    if (base + 2 * t + 1 < n) out[base + 2 * t + 1] = s[2 * t + 1] + b;
    if (t == 0 && sums) sums[blockIdx.x] = total;
}

__global__ void add_offsets(float* out, const float* scanned, int n) {
    if (blockIdx.x == 0) return;
    float offset = scanned[blockIdx.x - 1];
    int base = blockIdx.x * B;
    for (int j = threadIdx.x; j < B && base + j < n; j += blockDim.x) out[base + j] += offset;
}

static void scan(const float* in, float* out, int n) {
    int blocks = (n + B - 1) / B;
    if (blocks == 1) {
        scan_blocks<<<1, B / 2>>>(in, out, nullptr, n);
        return;
    }
    float *sums, *scanned;
    cudaMalloc(&sums, blocks * sizeof(float));
    cudaMalloc(&scanned, blocks * sizeof(float));
    scan_blocks<<<blocks, B / 2>>>(in, out, sums, n);
    scan(sums, scanned, blocks);
    add_offsets<<<blocks, 256>>>(out, scanned, n);
    cudaFree(sums);
    cudaFree(scanned);
}

extern "C" void solve(const float* input, float* output, int N) {
    scan(input, output, N);
}
