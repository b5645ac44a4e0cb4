//! Decoders not written yet: every call of these entries passes through, counted.
//! (Removed entry by entry as the vendor decoders land.)
use super::{hook, GemmArgs, InterceptedGemm, Skip};

impl GemmArgs for hook::cublasLtMatmul::Args {
    const ENTRY: &'static str = hook::cublasLtMatmul::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasLtMatmul: decoder not written"))
    }
}

impl GemmArgs for hook::cublasGemmEx::Args {
    const ENTRY: &'static str = hook::cublasGemmEx::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasGemmEx: decoder not written"))
    }
}

impl GemmArgs for hook::cublasGemmEx_64::Args {
    const ENTRY: &'static str = hook::cublasGemmEx_64::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasGemmEx_64: decoder not written"))
    }
}

impl GemmArgs for hook::cublasGemmStridedBatchedEx::Args {
    const ENTRY: &'static str = hook::cublasGemmStridedBatchedEx::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasGemmStridedBatchedEx: decoder not written"))
    }
}

impl GemmArgs for hook::cublasGemmStridedBatchedEx_64::Args {
    const ENTRY: &'static str = hook::cublasGemmStridedBatchedEx_64::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasGemmStridedBatchedEx_64: decoder not written"))
    }
}

impl GemmArgs for hook::cublasGemmBatchedEx::Args {
    const ENTRY: &'static str = hook::cublasGemmBatchedEx::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasGemmBatchedEx: decoder not written"))
    }
}

impl GemmArgs for hook::cublasGemmBatchedEx_64::Args {
    const ENTRY: &'static str = hook::cublasGemmBatchedEx_64::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasGemmBatchedEx_64: decoder not written"))
    }
}

impl GemmArgs for hook::cublasSgemm_v2::Args {
    const ENTRY: &'static str = hook::cublasSgemm_v2::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasSgemm_v2: decoder not written"))
    }
}

impl GemmArgs for hook::cublasSgemm_v2_64::Args {
    const ENTRY: &'static str = hook::cublasSgemm_v2_64::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasSgemm_v2_64: decoder not written"))
    }
}

impl GemmArgs for hook::cublasHgemm::Args {
    const ENTRY: &'static str = hook::cublasHgemm::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasHgemm: decoder not written"))
    }
}

impl GemmArgs for hook::cublasHgemm_64::Args {
    const ENTRY: &'static str = hook::cublasHgemm_64::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasHgemm_64: decoder not written"))
    }
}

impl GemmArgs for hook::cublasSgemmStridedBatched::Args {
    const ENTRY: &'static str = hook::cublasSgemmStridedBatched::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasSgemmStridedBatched: decoder not written"))
    }
}

impl GemmArgs for hook::cublasSgemmStridedBatched_64::Args {
    const ENTRY: &'static str = hook::cublasSgemmStridedBatched_64::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasSgemmStridedBatched_64: decoder not written"))
    }
}

impl GemmArgs for hook::cublasHgemmStridedBatched::Args {
    const ENTRY: &'static str = hook::cublasHgemmStridedBatched::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasHgemmStridedBatched: decoder not written"))
    }
}

impl GemmArgs for hook::cublasHgemmStridedBatched_64::Args {
    const ENTRY: &'static str = hook::cublasHgemmStridedBatched_64::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("cublasHgemmStridedBatched_64: decoder not written"))
    }
}

impl GemmArgs for hook::hipblasLtMatmul::Args {
    const ENTRY: &'static str = hook::hipblasLtMatmul::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("hipblasLtMatmul: decoder not written"))
    }
}

impl GemmArgs for hook::hipblasGemmEx::Args {
    const ENTRY: &'static str = hook::hipblasGemmEx::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("hipblasGemmEx: decoder not written"))
    }
}

impl GemmArgs for hook::hipblasGemmEx_v2::Args {
    const ENTRY: &'static str = hook::hipblasGemmEx_v2::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("hipblasGemmEx_v2: decoder not written"))
    }
}

impl GemmArgs for hook::hipblasGemmStridedBatchedEx::Args {
    const ENTRY: &'static str = hook::hipblasGemmStridedBatchedEx::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("hipblasGemmStridedBatchedEx: decoder not written"))
    }
}

impl GemmArgs for hook::hipblasGemmStridedBatchedEx_v2::Args {
    const ENTRY: &'static str = hook::hipblasGemmStridedBatchedEx_v2::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("hipblasGemmStridedBatchedEx_v2: decoder not written"))
    }
}

impl GemmArgs for hook::rocblas_gemm_ex::Args {
    const ENTRY: &'static str = hook::rocblas_gemm_ex::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("rocblas_gemm_ex: decoder not written"))
    }
}

impl GemmArgs for hook::rocblas_gemm_strided_batched_ex::Args {
    const ENTRY: &'static str = hook::rocblas_gemm_strided_batched_ex::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("rocblas_gemm_strided_batched_ex: decoder not written"))
    }
}

impl GemmArgs for hook::rocblas_gemm_ex3::Args {
    const ENTRY: &'static str = hook::rocblas_gemm_ex3::NAME;
    fn quick_key(&self) -> u64 {
        0
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        Err(Skip::new("rocblas_gemm_ex3: decoder not written"))
    }
}
