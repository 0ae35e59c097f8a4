// Register-tiled SGEMM: 128x128 block tile, 8x8 outputs per thread, 128-bit loads/stores. The champion of the
// 2-iteration H200 run in README (4.45 ms at 4096^3 vs 25.37 ms for examples/gemm/gemm.cu).
#define BM 128
#define BN 128
#define TM 8
#define TN 8
#define VEC 1
#include "reg_tiled.cuh"
