// The cublasLt constants kernels/_native.cpp declares itself (it builds without CUDA headers), printed from
// the real headers: g++ -I/usr/local/cuda/include scripts/probes/cublaslt_enums.cpp -o /tmp/e && /tmp/e
#include <cublasLt.h>
#include <cstdio>
#include <cstddef>
int main() {
  std::printf("CUDA_R_32F %d CUDA_R_16F %d CUDA_R_16BF %d\n", CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF);
  std::printf("CUBLAS_COMPUTE_32F %d CUBLAS_OP_N %d CUBLAS_OP_T %d\n", CUBLAS_COMPUTE_32F, CUBLAS_OP_N, CUBLAS_OP_T);
  std::printf("DESC_TRANSA %d DESC_TRANSB %d DESC_EPILOGUE %d DESC_BIAS_POINTER %d EPILOGUE_BIAS %d\n",
              CUBLASLT_MATMUL_DESC_TRANSA, CUBLASLT_MATMUL_DESC_TRANSB, CUBLASLT_MATMUL_DESC_EPILOGUE,
              CUBLASLT_MATMUL_DESC_BIAS_POINTER, CUBLASLT_EPILOGUE_BIAS);
  std::printf("PREF_MAX_WORKSPACE_BYTES %d PREF_MIN_ALIGNMENT_A %d B %d C %d D %d\n",
              CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
              CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES);
  std::printf("sizeof algo %zu heuristic %zu workspace offset %zu state offset %zu\n", sizeof(cublasLtMatmulAlgo_t),
              sizeof(cublasLtMatmulHeuristicResult_t), offsetof(cublasLtMatmulHeuristicResult_t, workspaceSize),
              offsetof(cublasLtMatmulHeuristicResult_t, state));
  return 0;
}
