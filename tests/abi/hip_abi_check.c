/* hip_abi_check.c: GENERATED from the quantshadow vendor tables (runtime/src/vendor/, see
 * abi.rs c_check_source). Do not edit: run
 *   QUANTSHADOW_REGEN_ABI=1 cargo test -p quantshadow-runtime --test vendor_abi
 * Prints `name value` for every vendor constant the tables hard-code that exists in the
 * headers it is compiled against; tests/abi/run_on_gpu.sh compiles and runs it. */
#include <stdio.h>
#if !defined(__cplusplus)
#error "hipblaslt.h is C++: compile with hipcc or g++ -x c++"
#endif
#include <hip/hip_version.h>
#include <hip/library_types.h>
#include <hipblas/hipblas-version.h>
#include <hipblas/hipblas.h>
#include <hipblaslt/hipblaslt-version.h>
#include <hipblaslt/hipblaslt.h>
#include <rocblas/internal/rocblas-version.h>
#include <rocblas/rocblas.h>

#define QS_VER(a, b, c) ((a) * 1000000LL + (b) * 1000LL + (c))
#define QS_V_HIP QS_VER(HIP_VERSION_MAJOR, HIP_VERSION_MINOR, 0)
#define QS_V_HIPBLASLT QS_VER(HIPBLASLT_VERSION_MAJOR, HIPBLASLT_VERSION_MINOR, HIPBLASLT_VERSION_PATCH)
#define QS_V_HIPBLAS QS_VER(hipblasVersionMajor, hipblasVersionMinor, hipblasVersionPatch)
#define QS_V_ROCBLAS QS_VER(ROCBLAS_VERSION_MAJOR, ROCBLAS_VERSION_MINOR, ROCBLAS_VERSION_PATCH)
#define P(name, value) printf("%s %lld\n", name, (long long)(value))

int main(void)
{
    printf("# quantshadow ABI dump: side=hip\n");
    P("HIP_VERSION_MAJOR", HIP_VERSION_MAJOR);
    P("HIP_VERSION_MINOR", HIP_VERSION_MINOR);
    P("HIPBLASLT_VERSION_MAJOR", HIPBLASLT_VERSION_MAJOR);
    P("HIPBLASLT_VERSION_MINOR", HIPBLASLT_VERSION_MINOR);
    P("HIPBLASLT_VERSION_PATCH", HIPBLASLT_VERSION_PATCH);
    P("hipblasVersionMajor", hipblasVersionMajor);
    P("hipblasVersionMinor", hipblasVersionMinor);
    P("hipblasVersionPatch", hipblasVersionPatch);
    P("ROCBLAS_VERSION_MAJOR", ROCBLAS_VERSION_MAJOR);
    P("ROCBLAS_VERSION_MINOR", ROCBLAS_VERSION_MINOR);
    P("ROCBLAS_VERSION_PATCH", ROCBLAS_VERSION_PATCH);

    /* HIP_DATA_TYPE: hipDataType (hip/library_types.h) */
    P("HIP_R_32F", HIP_R_32F);
    P("HIP_R_64F", HIP_R_64F);
    P("HIP_R_16F", HIP_R_16F);
    P("HIP_R_8I", HIP_R_8I);
    P("HIP_C_32F", HIP_C_32F);
    P("HIP_C_64F", HIP_C_64F);
    P("HIP_C_16F", HIP_C_16F);
    P("HIP_C_8I", HIP_C_8I);
    P("HIP_R_8U", HIP_R_8U);
    P("HIP_C_8U", HIP_C_8U);
    P("HIP_R_32I", HIP_R_32I);
    P("HIP_C_32I", HIP_C_32I);
    P("HIP_R_32U", HIP_R_32U);
    P("HIP_C_32U", HIP_C_32U);
    P("HIP_R_16BF", HIP_R_16BF);
    P("HIP_C_16BF", HIP_C_16BF);
    P("HIP_R_4I", HIP_R_4I);
    P("HIP_C_4I", HIP_C_4I);
    P("HIP_R_4U", HIP_R_4U);
    P("HIP_C_4U", HIP_C_4U);
    P("HIP_R_16I", HIP_R_16I);
    P("HIP_C_16I", HIP_C_16I);
    P("HIP_R_16U", HIP_R_16U);
    P("HIP_C_16U", HIP_C_16U);
    P("HIP_R_64I", HIP_R_64I);
    P("HIP_C_64I", HIP_C_64I);
    P("HIP_R_64U", HIP_R_64U);
    P("HIP_C_64U", HIP_C_64U);
#if QS_V_HIP >= QS_VER(6, 3, 0)
    P("HIP_R_8F_E4M3", HIP_R_8F_E4M3);
#endif
#if QS_V_HIP >= QS_VER(6, 3, 0)
    P("HIP_R_8F_E5M2", HIP_R_8F_E5M2);
#endif
#if QS_V_HIP >= QS_VER(7, 0, 0)
    P("HIP_R_8F_UE8M0", HIP_R_8F_UE8M0);
#endif
#if QS_V_HIP >= QS_VER(7, 0, 0)
    P("HIP_R_6F_E2M3", HIP_R_6F_E2M3);
#endif
#if QS_V_HIP >= QS_VER(7, 0, 0)
    P("HIP_R_6F_E3M2", HIP_R_6F_E3M2);
#endif
#if QS_V_HIP >= QS_VER(7, 0, 0)
    P("HIP_R_4F_E2M1", HIP_R_4F_E2M1);
#endif
    P("HIP_R_8F_E4M3_FNUZ", HIP_R_8F_E4M3_FNUZ);
    P("HIP_R_8F_E5M2_FNUZ", HIP_R_8F_E5M2_FNUZ);

    /* HIPBLAS_STATUS: hipblasStatus_t (hipblas-common/hipblas-common.h) */
    P("HIPBLAS_STATUS_SUCCESS", HIPBLAS_STATUS_SUCCESS);
    P("HIPBLAS_STATUS_NOT_INITIALIZED", HIPBLAS_STATUS_NOT_INITIALIZED);
    P("HIPBLAS_STATUS_ALLOC_FAILED", HIPBLAS_STATUS_ALLOC_FAILED);
    P("HIPBLAS_STATUS_INVALID_VALUE", HIPBLAS_STATUS_INVALID_VALUE);
    P("HIPBLAS_STATUS_MAPPING_ERROR", HIPBLAS_STATUS_MAPPING_ERROR);
    P("HIPBLAS_STATUS_EXECUTION_FAILED", HIPBLAS_STATUS_EXECUTION_FAILED);
    P("HIPBLAS_STATUS_INTERNAL_ERROR", HIPBLAS_STATUS_INTERNAL_ERROR);
    P("HIPBLAS_STATUS_NOT_SUPPORTED", HIPBLAS_STATUS_NOT_SUPPORTED);
    P("HIPBLAS_STATUS_ARCH_MISMATCH", HIPBLAS_STATUS_ARCH_MISMATCH);
    P("HIPBLAS_STATUS_HANDLE_IS_NULLPTR", HIPBLAS_STATUS_HANDLE_IS_NULLPTR);
    P("HIPBLAS_STATUS_INVALID_ENUM", HIPBLAS_STATUS_INVALID_ENUM);
    P("HIPBLAS_STATUS_UNKNOWN", HIPBLAS_STATUS_UNKNOWN);

    /* HIPBLAS_OPERATION: hipblasOperation_t (hipblas-common/hipblas-common.h) */
    P("HIPBLAS_OP_N", HIPBLAS_OP_N);
    P("HIPBLAS_OP_T", HIPBLAS_OP_T);
    P("HIPBLAS_OP_C", HIPBLAS_OP_C);

    /* HIPBLAS_POINTER_MODE: hipblasPointerMode_t (hipblas/hipblas.h) */
    P("HIPBLAS_POINTER_MODE_HOST", HIPBLAS_POINTER_MODE_HOST);
    P("HIPBLAS_POINTER_MODE_DEVICE", HIPBLAS_POINTER_MODE_DEVICE);

    /* HIPBLAS_COMPUTE_TYPE: hipblasComputeType_t (hipblas-common/hipblas-common.h) */
    P("HIPBLAS_COMPUTE_16F", HIPBLAS_COMPUTE_16F);
    P("HIPBLAS_COMPUTE_16F_PEDANTIC", HIPBLAS_COMPUTE_16F_PEDANTIC);
    P("HIPBLAS_COMPUTE_32F", HIPBLAS_COMPUTE_32F);
    P("HIPBLAS_COMPUTE_32F_PEDANTIC", HIPBLAS_COMPUTE_32F_PEDANTIC);
    P("HIPBLAS_COMPUTE_32F_FAST_16F", HIPBLAS_COMPUTE_32F_FAST_16F);
    P("HIPBLAS_COMPUTE_32F_FAST_16BF", HIPBLAS_COMPUTE_32F_FAST_16BF);
    P("HIPBLAS_COMPUTE_32F_FAST_TF32", HIPBLAS_COMPUTE_32F_FAST_TF32);
    P("HIPBLAS_COMPUTE_64F", HIPBLAS_COMPUTE_64F);
    P("HIPBLAS_COMPUTE_64F_PEDANTIC", HIPBLAS_COMPUTE_64F_PEDANTIC);
    P("HIPBLAS_COMPUTE_32I", HIPBLAS_COMPUTE_32I);
    P("HIPBLAS_COMPUTE_32I_PEDANTIC", HIPBLAS_COMPUTE_32I_PEDANTIC);
#if QS_V_HIP >= QS_VER(7, 0, 0)
    P("HIPBLAS_COMPUTE_32F_FAST_8F_FNUZ", HIPBLAS_COMPUTE_32F_FAST_8F_FNUZ);
#endif
#if QS_V_HIP >= QS_VER(7, 0, 0)
    P("HIPBLAS_COMPUTE_32F_FAST_8BF_FNUZ", HIPBLAS_COMPUTE_32F_FAST_8BF_FNUZ);
#endif
#if QS_V_HIP >= QS_VER(7, 0, 0)
    P("HIPBLAS_COMPUTE_32F_FAST_8F8BF_FNUZ", HIPBLAS_COMPUTE_32F_FAST_8F8BF_FNUZ);
#endif
#if QS_V_HIP >= QS_VER(7, 0, 0)
    P("HIPBLAS_COMPUTE_32F_FAST_8BF8F_FNUZ", HIPBLAS_COMPUTE_32F_FAST_8BF8F_FNUZ);
#endif

    /* HIPBLAS_DATATYPE: hipblasDatatype_t (hipblas/hipblas.h) */
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_R_16F", HIPBLAS_R_16F);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_R_32F", HIPBLAS_R_32F);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_R_64F", HIPBLAS_R_64F);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_C_16F", HIPBLAS_C_16F);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_C_32F", HIPBLAS_C_32F);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_C_64F", HIPBLAS_C_64F);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_R_8I", HIPBLAS_R_8I);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_R_8U", HIPBLAS_R_8U);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_R_32I", HIPBLAS_R_32I);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_R_32U", HIPBLAS_R_32U);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_C_8I", HIPBLAS_C_8I);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_C_8U", HIPBLAS_C_8U);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_C_32I", HIPBLAS_C_32I);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_C_32U", HIPBLAS_C_32U);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_R_16B", HIPBLAS_R_16B);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_C_16B", HIPBLAS_C_16B);
#endif
#if QS_V_HIPBLAS < QS_VER(3, 0, 0)
    P("HIPBLAS_DATATYPE_INVALID", HIPBLAS_DATATYPE_INVALID);
#endif

    /* HIPBLASLT_MATMUL_DESC_ATTRIBUTES: hipblasLtMatmulDescAttributes_t (hipblaslt/hipblaslt.h) */
    P("HIPBLASLT_MATMUL_DESC_TRANSA", HIPBLASLT_MATMUL_DESC_TRANSA);
    P("HIPBLASLT_MATMUL_DESC_TRANSB", HIPBLASLT_MATMUL_DESC_TRANSB);
    P("HIPBLASLT_MATMUL_DESC_EPILOGUE", HIPBLASLT_MATMUL_DESC_EPILOGUE);
    P("HIPBLASLT_MATMUL_DESC_BIAS_POINTER", HIPBLASLT_MATMUL_DESC_BIAS_POINTER);
    P("HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE", HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
    P("HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER", HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER);
    P("HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER", HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER);
    P("HIPBLASLT_MATMUL_DESC_C_SCALE_POINTER", HIPBLASLT_MATMUL_DESC_C_SCALE_POINTER);
    P("HIPBLASLT_MATMUL_DESC_D_SCALE_POINTER", HIPBLASLT_MATMUL_DESC_D_SCALE_POINTER);
    P("HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER", HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER);
    P("HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER", HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER);
    P("HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD", HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD);
    P("HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE", HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE);
    P("HIPBLASLT_MATMUL_DESC_POINTER_MODE", HIPBLASLT_MATMUL_DESC_POINTER_MODE);
#if QS_V_HIPBLASLT >= QS_VER(0, 8, 0)
    P("HIPBLASLT_MATMUL_DESC_AMAX_D_POINTER", HIPBLASLT_MATMUL_DESC_AMAX_D_POINTER);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE", HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 3, 0)
    P("HIPBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE", HIPBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_MATMUL_DESC_A_SCALE_MODE", HIPBLASLT_MATMUL_DESC_A_SCALE_MODE);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_MATMUL_DESC_B_SCALE_MODE", HIPBLASLT_MATMUL_DESC_B_SCALE_MODE);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 4, 0)
    P("HIPBLASLT_MATMUL_DESC_SM_COUNT_TARGET", HIPBLASLT_MATMUL_DESC_SM_COUNT_TARGET);
#endif
#if QS_V_HIPBLASLT >= QS_VER(0, 8, 0)
    P("HIPBLASLT_MATMUL_DESC_COMPUTE_INPUT_TYPE_A_EXT", HIPBLASLT_MATMUL_DESC_COMPUTE_INPUT_TYPE_A_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(0, 8, 0)
    P("HIPBLASLT_MATMUL_DESC_COMPUTE_INPUT_TYPE_B_EXT", HIPBLASLT_MATMUL_DESC_COMPUTE_INPUT_TYPE_B_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(0, 10, 0) && QS_V_HIPBLASLT < QS_VER(1, 0, 0)
    P("HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER_VEC_EXT", HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER_VEC_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(0, 10, 0) && QS_V_HIPBLASLT < QS_VER(1, 0, 0)
    P("HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER_VEC_EXT", HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER_VEC_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 1, 0)
    P("HIPBLASLT_MATMUL_DESC_EPILOGUE_ACT_ARG0_EXT", HIPBLASLT_MATMUL_DESC_EPILOGUE_ACT_ARG0_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 1, 0)
    P("HIPBLASLT_MATMUL_DESC_EPILOGUE_ACT_ARG1_EXT", HIPBLASLT_MATMUL_DESC_EPILOGUE_ACT_ARG1_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 4, 0)
    P("HIPBLASLT_MATMUL_DESC_STREAMK_TILE_SCHEDULING_EXT", HIPBLASLT_MATMUL_DESC_STREAMK_TILE_SCHEDULING_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 4, 1)
    P("HIPBLASLT_MATMUL_DESC_UNIFORM_SUMMATION_ORDER_EXT", HIPBLASLT_MATMUL_DESC_UNIFORM_SUMMATION_ORDER_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 5, 0)
    P("HIPBLASLT_MATMUL_DESC_FUSED_EPILOGUE", HIPBLASLT_MATMUL_DESC_FUSED_EPILOGUE);
#endif

    /* HIPBLASLT_MATRIX_LAYOUT_ATTRIBUTES: hipblasLtMatrixLayoutAttribute_t (hipblaslt/hipblaslt.h) */
    P("HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT", HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
    P("HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET", HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
    P("HIPBLASLT_MATRIX_LAYOUT_TYPE", HIPBLASLT_MATRIX_LAYOUT_TYPE);
    P("HIPBLASLT_MATRIX_LAYOUT_ORDER", HIPBLASLT_MATRIX_LAYOUT_ORDER);
    P("HIPBLASLT_MATRIX_LAYOUT_ROWS", HIPBLASLT_MATRIX_LAYOUT_ROWS);
    P("HIPBLASLT_MATRIX_LAYOUT_COLS", HIPBLASLT_MATRIX_LAYOUT_COLS);
    P("HIPBLASLT_MATRIX_LAYOUT_LD", HIPBLASLT_MATRIX_LAYOUT_LD);
#if QS_V_HIPBLASLT >= QS_VER(1, 3, 0)
    P("HIPBLASLT_MATRIX_LAYOUT_BATCH_MODE", HIPBLASLT_MATRIX_LAYOUT_BATCH_MODE);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 5, 0)
    P("HIPBLASLT_MATRIX_LAYOUT_OFFSET", HIPBLASLT_MATRIX_LAYOUT_OFFSET);
#endif

    /* HIPBLASLT_ORDER: hipblasLtOrder_t (hipblaslt/hipblaslt.h) */
    P("HIPBLASLT_ORDER_COL", HIPBLASLT_ORDER_COL);
    P("HIPBLASLT_ORDER_ROW", HIPBLASLT_ORDER_ROW);
#if QS_V_HIPBLASLT >= QS_VER(1, 5, 0)
    P("HIPBLASLT_ORDER_COL16_4R32", HIPBLASLT_ORDER_COL16_4R32);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_ORDER_COL16_4R16", HIPBLASLT_ORDER_COL16_4R16);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_ORDER_COL16_4R8", HIPBLASLT_ORDER_COL16_4R8);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_ORDER_COL16_4R4", HIPBLASLT_ORDER_COL16_4R4);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_ORDER_COL16_4R2", HIPBLASLT_ORDER_COL16_4R2);
#endif

    /* HIPBLASLT_EPILOGUE: hipblasLtEpilogue_t (hipblaslt/hipblaslt.h) */
    P("HIPBLASLT_EPILOGUE_DEFAULT", HIPBLASLT_EPILOGUE_DEFAULT);
    P("HIPBLASLT_EPILOGUE_RELU", HIPBLASLT_EPILOGUE_RELU);
    P("HIPBLASLT_EPILOGUE_BIAS", HIPBLASLT_EPILOGUE_BIAS);
    P("HIPBLASLT_EPILOGUE_RELU_BIAS", HIPBLASLT_EPILOGUE_RELU_BIAS);
    P("HIPBLASLT_EPILOGUE_GELU", HIPBLASLT_EPILOGUE_GELU);
    P("HIPBLASLT_EPILOGUE_GELU_BIAS", HIPBLASLT_EPILOGUE_GELU_BIAS);
#if QS_V_HIPBLASLT >= QS_VER(1, 1, 0)
    P("HIPBLASLT_EPILOGUE_RELU_AUX", HIPBLASLT_EPILOGUE_RELU_AUX);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 1, 0)
    P("HIPBLASLT_EPILOGUE_RELU_AUX_BIAS", HIPBLASLT_EPILOGUE_RELU_AUX_BIAS);
#endif
    P("HIPBLASLT_EPILOGUE_GELU_AUX", HIPBLASLT_EPILOGUE_GELU_AUX);
    P("HIPBLASLT_EPILOGUE_GELU_AUX_BIAS", HIPBLASLT_EPILOGUE_GELU_AUX_BIAS);
    P("HIPBLASLT_EPILOGUE_DGELU", HIPBLASLT_EPILOGUE_DGELU);
    P("HIPBLASLT_EPILOGUE_DGELU_BGRAD", HIPBLASLT_EPILOGUE_DGELU_BGRAD);
    P("HIPBLASLT_EPILOGUE_BGRADA", HIPBLASLT_EPILOGUE_BGRADA);
    P("HIPBLASLT_EPILOGUE_BGRADB", HIPBLASLT_EPILOGUE_BGRADB);
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_EPILOGUE_SWISH_EXT", HIPBLASLT_EPILOGUE_SWISH_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_EPILOGUE_SWISH_BIAS_EXT", HIPBLASLT_EPILOGUE_SWISH_BIAS_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 1, 0)
    P("HIPBLASLT_EPILOGUE_CLAMP_EXT", HIPBLASLT_EPILOGUE_CLAMP_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 1, 0)
    P("HIPBLASLT_EPILOGUE_CLAMP_BIAS_EXT", HIPBLASLT_EPILOGUE_CLAMP_BIAS_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 1, 0)
    P("HIPBLASLT_EPILOGUE_CLAMP_AUX_EXT", HIPBLASLT_EPILOGUE_CLAMP_AUX_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 1, 0)
    P("HIPBLASLT_EPILOGUE_CLAMP_AUX_BIAS_EXT", HIPBLASLT_EPILOGUE_CLAMP_AUX_BIAS_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 2, 0)
    P("HIPBLASLT_EPILOGUE_SIGMOID_EXT", HIPBLASLT_EPILOGUE_SIGMOID_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 2, 0)
    P("HIPBLASLT_EPILOGUE_SIGMOID_BIAS_EXT", HIPBLASLT_EPILOGUE_SIGMOID_BIAS_EXT);
#endif

    /* HIPBLASLT_MATRIX_SCALE: hipblasLtMatmulMatrixScale_t (hipblaslt/hipblaslt.h) */
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F", HIPBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3", HIPBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0", HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F", HIPBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F", HIPBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 0, 0)
    P("HIPBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F", HIPBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 3, 0)
    P("HIPBLASLT_MATMUL_MATRIX_SCALE_BLK32_UE8M0_32_8_EXT", HIPBLASLT_MATMUL_MATRIX_SCALE_BLK32_UE8M0_32_8_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 3, 0)
    P("HIPBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE8M0_EXT", HIPBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE8M0_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 3, 0)
    P("HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE4M3_EXT", HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE4M3_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 3, 0)
    P("HIPBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE5M3_EXT", HIPBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE5M3_EXT);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 3, 0)
    P("HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE5M3_EXT", HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE5M3_EXT);
#endif

    /* HIPBLASLT_POINTER_MODE: hipblasLtPointerMode_t (hipblaslt/hipblaslt.h) */
    P("HIPBLASLT_POINTER_MODE_HOST", HIPBLASLT_POINTER_MODE_HOST);
#if QS_V_HIPBLASLT >= QS_VER(0, 6, 0) && QS_V_HIPBLASLT < QS_VER(0, 7, 0)
    P("HIPBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST", HIPBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST);
#endif
#if QS_V_HIPBLASLT >= QS_VER(0, 7, 0)
    P("HIPBLASLT_POINTER_MODE_DEVICE", HIPBLASLT_POINTER_MODE_DEVICE);
#endif
#if QS_V_HIPBLASLT >= QS_VER(0, 7, 0)
    P("HIPBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST", HIPBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST);
#endif

    /* HIPBLASLT_BATCH_MODE: hipblasLtBatchMode_t (hipblaslt/hipblaslt.h) */
#if QS_V_HIPBLASLT >= QS_VER(1, 3, 0)
    P("HIPBLASLT_BATCH_MODE_STRIDED", HIPBLASLT_BATCH_MODE_STRIDED);
#endif
#if QS_V_HIPBLASLT >= QS_VER(1, 3, 0)
    P("HIPBLASLT_BATCH_MODE_POINTER_ARRAY", HIPBLASLT_BATCH_MODE_POINTER_ARRAY);
#endif

    /* HIPBLASLT_SIZES: sizeof (hipblaslt/hipblaslt.h) */
    P("sizeof(hipblasLtMatmulAlgo_t)", sizeof(hipblasLtMatmulAlgo_t));
    P("sizeof(hipblasLtMatmulDescOpaque_t)", sizeof(hipblasLtMatmulDescOpaque_t));
    P("sizeof(hipblasLtMatrixLayoutOpaque_t)", sizeof(hipblasLtMatrixLayoutOpaque_t));
    P("sizeof(hipblasLtMatmulPreferenceOpaque_t)", sizeof(hipblasLtMatmulPreferenceOpaque_t));

    /* ROCBLAS_STATUS: rocblas_status (rocblas/internal/rocblas-types.h) */
    P("rocblas_status_success", rocblas_status_success);
    P("rocblas_status_invalid_handle", rocblas_status_invalid_handle);
    P("rocblas_status_not_implemented", rocblas_status_not_implemented);
    P("rocblas_status_invalid_pointer", rocblas_status_invalid_pointer);
    P("rocblas_status_invalid_size", rocblas_status_invalid_size);
    P("rocblas_status_memory_error", rocblas_status_memory_error);
    P("rocblas_status_internal_error", rocblas_status_internal_error);
    P("rocblas_status_invalid_value", rocblas_status_invalid_value);

    /* ROCBLAS_OPERATION: rocblas_operation (rocblas/internal/rocblas-types.h) */
    P("rocblas_operation_none", rocblas_operation_none);
    P("rocblas_operation_transpose", rocblas_operation_transpose);
    P("rocblas_operation_conjugate_transpose", rocblas_operation_conjugate_transpose);

    /* ROCBLAS_DATATYPE: rocblas_datatype (rocblas/internal/rocblas-types.h) */
    P("rocblas_datatype_f16_r", rocblas_datatype_f16_r);
    P("rocblas_datatype_f32_r", rocblas_datatype_f32_r);
    P("rocblas_datatype_f64_r", rocblas_datatype_f64_r);
    P("rocblas_datatype_f16_c", rocblas_datatype_f16_c);
    P("rocblas_datatype_f32_c", rocblas_datatype_f32_c);
    P("rocblas_datatype_f64_c", rocblas_datatype_f64_c);
    P("rocblas_datatype_i8_r", rocblas_datatype_i8_r);
    P("rocblas_datatype_u8_r", rocblas_datatype_u8_r);
    P("rocblas_datatype_i32_r", rocblas_datatype_i32_r);
    P("rocblas_datatype_u32_r", rocblas_datatype_u32_r);
    P("rocblas_datatype_i8_c", rocblas_datatype_i8_c);
    P("rocblas_datatype_u8_c", rocblas_datatype_u8_c);
    P("rocblas_datatype_i32_c", rocblas_datatype_i32_c);
    P("rocblas_datatype_u32_c", rocblas_datatype_u32_c);
    P("rocblas_datatype_bf16_r", rocblas_datatype_bf16_r);
    P("rocblas_datatype_bf16_c", rocblas_datatype_bf16_c);
    P("rocblas_datatype_f8_r", rocblas_datatype_f8_r);
    P("rocblas_datatype_bf8_r", rocblas_datatype_bf8_r);
    P("rocblas_datatype_invalid", rocblas_datatype_invalid);

    /* ROCBLAS_COMPUTETYPE: rocblas_computetype (rocblas/internal/rocblas-types.h) */
    P("rocblas_compute_type_f32", rocblas_compute_type_f32);
    P("rocblas_compute_type_f8_f8_f32", rocblas_compute_type_f8_f8_f32);
    P("rocblas_compute_type_f8_bf8_f32", rocblas_compute_type_f8_bf8_f32);
    P("rocblas_compute_type_bf8_f8_f32", rocblas_compute_type_bf8_f8_f32);
    P("rocblas_compute_type_bf8_bf8_f32", rocblas_compute_type_bf8_bf8_f32);
    P("rocblas_compute_type_invalid", rocblas_compute_type_invalid);

    /* ROCBLAS_POINTER_MODE: rocblas_pointer_mode (rocblas/internal/rocblas-types.h) */
    P("rocblas_pointer_mode_host", rocblas_pointer_mode_host);
    P("rocblas_pointer_mode_device", rocblas_pointer_mode_device);

    /* ROCBLAS_GEMM_ALGO: rocblas_gemm_algo (rocblas/internal/rocblas-types.h) */
    P("rocblas_gemm_algo_standard", rocblas_gemm_algo_standard);
    P("rocblas_gemm_algo_solution_index", rocblas_gemm_algo_solution_index);

    /* ROCBLAS_GEMM_FLAGS: rocblas_gemm_flags (rocblas/internal/rocblas-types.h) */
    P("rocblas_gemm_flags_none", rocblas_gemm_flags_none);
    P("rocblas_gemm_flags_use_cu_efficiency", rocblas_gemm_flags_use_cu_efficiency);
    P("rocblas_gemm_flags_fp16_alt_impl", rocblas_gemm_flags_fp16_alt_impl);
    P("rocblas_gemm_flags_check_solution_index", rocblas_gemm_flags_check_solution_index);
    P("rocblas_gemm_flags_fp16_alt_impl_rnz", rocblas_gemm_flags_fp16_alt_impl_rnz);
#if QS_V_ROCBLAS >= QS_VER(5, 0, 0)
    P("rocblas_gemm_flags_stochastic_rounding", rocblas_gemm_flags_stochastic_rounding);
#endif
    return 0;
}
