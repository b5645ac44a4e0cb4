//! Vendor ABI tables: the mappings onto the problem model, the version-keyed decoding, the
//! tables' own consistency, and the check against dumps printed by the generated C programs
//! compiled on GPU hosts (`tests/abi/`).

use quantshadow_runtime::formats::Format;
use quantshadow_runtime::problem::{
    Activation, ComputeType, Order, ScaleGranularity, ScaleStorage, Transpose,
};
use quantshadow_runtime::vendor::abi::{self, AbiDiff, DumpError, HeaderVersions};
use quantshadow_runtime::vendor::{
    self, cublas, cublaslt, cuda_driver, data_type, hipblas, hipblaslt, rocblas, AttrHandling,
    EpilogueMapping, LayoutAttr, LibVersion, Library, MatmulDescAttr, PointerMode, Side, VersionRange,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn v(major: u32, minor: u32, patch: u32) -> LibVersion {
    LibVersion::new(major, minor, patch)
}

fn abi_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/abi")
}

// ---------------------------------------------------------------------------------------------
// Data types
// ---------------------------------------------------------------------------------------------

#[test]
fn cuda_data_types_map_to_formats() {
    let cases = [
        (0, Some(Format::F32)),
        (2, Some(Format::F16)),
        (14, Some(Format::Bf16)),
        (3, Some(Format::Int8)),
        (10, Some(Format::I32)),
        (28, Some(Format::E4m3fn)),
        (29, Some(Format::E5m2)),
        (30, Some(Format::Ue8m0)),
        (33, Some(Format::E2m1)),
        (1, None),  // f64
        (4, None),  // complex f32
        (8, None),  // u8
        (16, None), // int4: packing undocumented for GEMMs
        (31, None), // fp6
        (32, None),
        (1000, None), // a hipDataType FNUZ value is not a cudaDataType
        (-1, None),
    ];
    for (value, want) in cases {
        assert_eq!(data_type::format_from_cuda_data_type(value), want, "cudaDataType {value}");
    }
}

#[test]
fn hip_data_types_keep_ocp_and_fnuz_fp8_apart() {
    assert_eq!(data_type::format_from_hip_data_type(28), Some(Format::E4m3fn));
    assert_eq!(data_type::format_from_hip_data_type(29), Some(Format::E5m2));
    assert_eq!(data_type::format_from_hip_data_type(1000), Some(Format::E4m3fnuz));
    assert_eq!(data_type::format_from_hip_data_type(1001), Some(Format::E5m2fnuz));
    assert_eq!(data_type::format_from_hip_data_type(30), Some(Format::Ue8m0));
    assert_eq!(data_type::format_from_hip_data_type(33), Some(Format::E2m1));
    assert_eq!(data_type::format_from_hip_data_type(14), Some(Format::Bf16));
    assert_eq!(data_type::format_from_hip_data_type(1002), None);
    assert_eq!(data_type::hip_data_type_name(1000), "HIP_R_8F_E4M3_FNUZ");
    assert_eq!(data_type::hip_data_type_name(28), "HIP_R_8F_E4M3");
    assert_eq!(data_type::hip_data_type_name(999), "<unknown hipDataType>");
}

#[test]
fn data_types_round_trip_through_formats() {
    for format in Format::ALL {
        if let Some(code) = data_type::hip_data_type_for_format(format) {
            assert_eq!(data_type::format_from_hip_data_type(code), Some(format), "{format}");
        }
        if let Some(code) = data_type::cuda_data_type_for_format(format) {
            // UE4M3 shares 28 with E4M3 (CUDA_R_8F_UE4M3 = CUDA_R_8F_E4M3).
            let want = if format == Format::Ue4m3 { Format::E4m3fn } else { format };
            assert_eq!(data_type::format_from_cuda_data_type(code), Some(want), "{format}");
        }
    }
    assert_eq!(data_type::cuda_data_type_for_format(Format::E4m3fnuz), None);
    assert_eq!(data_type::hip_data_type_for_format(Format::E4m3fnuz), Some(1000));
    assert_eq!(data_type::cuda_data_type_name(28), "CUDA_R_8F_E4M3");
    assert_eq!(data_type::cuda_data_type_name(5), "CUDA_C_64F");
}

// ---------------------------------------------------------------------------------------------
// Operations and compute types
// ---------------------------------------------------------------------------------------------

#[test]
fn operations_map_to_transposes() {
    assert_eq!(cublas::transpose_from_cublas_operation(0), Some(Transpose::N));
    assert_eq!(cublas::transpose_from_cublas_operation(1), Some(Transpose::T));
    assert_eq!(cublas::transpose_from_cublas_operation(2), Some(Transpose::T));
    assert_eq!(cublas::transpose_from_cublas_operation(3), None);
    assert_eq!(cublas::transpose_from_cublas_operation(111), None);
    assert_eq!(cublas::cublas_operation_name(3), "CUBLAS_OP_CONJG");
    for (ops, n, t, c) in [
        (hipblas::transpose_from_hipblas_operation as fn(i32) -> Option<Transpose>, 111, 112, 113),
        (rocblas::transpose_from_rocblas_operation, 111, 112, 113),
    ] {
        assert_eq!(ops(n), Some(Transpose::N));
        assert_eq!(ops(t), Some(Transpose::T));
        assert_eq!(ops(c), Some(Transpose::T));
        assert_eq!(ops(0), None, "CUBLAS_OP_N is not a hipBLAS/rocBLAS operation");
        assert_eq!(ops(114), None);
    }
}

#[test]
fn compute_types_map_or_refuse() {
    let cublas_cases = [
        (64, Some(ComputeType::F16)),
        (68, Some(ComputeType::F32)),
        (69, Some(ComputeType::F32)),
        (74, Some(ComputeType::F32FastF16)),
        (75, Some(ComputeType::F32FastBf16)),
        (77, Some(ComputeType::F32FastTf32)),
        (70, Some(ComputeType::F64)),
        (72, Some(ComputeType::I32)),
        (78, None), // BF16x9 emulation
        (79, None),
        (0, None), // CUDA_R_32F is a data type, not a cublasComputeType_t
    ];
    for (value, want) in cublas_cases {
        assert_eq!(cublas::compute_type_from_cublas(value), want, "cublasComputeType_t {value}");
    }
    assert_eq!(cublas::cublas_compute_type_name(78), "CUBLAS_COMPUTE_32F_EMULATED_16BFX9");

    let hip_cases = [
        (0, Some(ComputeType::F16)),
        (2, Some(ComputeType::F32)),
        (4, Some(ComputeType::F32FastF16)),
        (5, Some(ComputeType::F32FastBf16)),
        (6, Some(ComputeType::F32FastTf32)),
        (7, Some(ComputeType::F64)),
        (9, Some(ComputeType::I32)),
        (100, None),
        (103, None),
        (68, None), // a cuBLAS value
    ];
    for (value, want) in hip_cases {
        assert_eq!(hipblas::compute_type_from_hipblas(value), want, "hipblasComputeType_t {value}");
    }
    assert_eq!(hipblas::hipblas_compute_type_name(100), "HIPBLAS_COMPUTE_32F_FAST_8F_FNUZ");
}

#[test]
fn sgemm_math_modes() {
    assert_eq!(cublas::sgemm_compute_type_for_math_mode(0), Some(ComputeType::F32));
    assert_eq!(cublas::sgemm_compute_type_for_math_mode(2), Some(ComputeType::F32));
    assert_eq!(cublas::sgemm_compute_type_for_math_mode(3), Some(ComputeType::F32FastTf32));
    assert_eq!(cublas::sgemm_compute_type_for_math_mode(3 | 16), Some(ComputeType::F32FastTf32));
    assert_eq!(cublas::sgemm_compute_type_for_math_mode(1), Some(ComputeType::F32FastF16));
    assert_eq!(cublas::sgemm_compute_type_for_math_mode(4), None);
    assert_eq!(cublas::sgemm_compute_type_for_math_mode(5), None);
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt
// ---------------------------------------------------------------------------------------------

fn epi(activation: Activation, bias: bool, aux_output: bool) -> Option<EpilogueMapping> {
    Some(EpilogueMapping { activation, bias, aux_output })
}

#[test]
fn cublaslt_epilogues() {
    let cases = [
        (1, "CUBLASLT_EPILOGUE_DEFAULT", epi(Activation::None, false, false)),
        (2, "CUBLASLT_EPILOGUE_RELU", epi(Activation::Relu, false, false)),
        (4, "CUBLASLT_EPILOGUE_BIAS", epi(Activation::None, true, false)),
        (6, "CUBLASLT_EPILOGUE_RELU_BIAS", epi(Activation::Relu, true, false)),
        (32, "CUBLASLT_EPILOGUE_GELU", epi(Activation::GeluTanh, false, false)),
        (36, "CUBLASLT_EPILOGUE_GELU_BIAS", epi(Activation::GeluTanh, true, false)),
        (130, "CUBLASLT_EPILOGUE_RELU_AUX", epi(Activation::Relu, false, true)),
        (134, "CUBLASLT_EPILOGUE_RELU_AUX_BIAS", epi(Activation::Relu, true, true)),
        (160, "CUBLASLT_EPILOGUE_GELU_AUX", epi(Activation::GeluTanh, false, true)),
        (164, "CUBLASLT_EPILOGUE_GELU_AUX_BIAS", epi(Activation::GeluTanh, true, true)),
        (256, "CUBLASLT_EPILOGUE_BGRADA", epi(Activation::None, false, true)),
        (512, "CUBLASLT_EPILOGUE_BGRADB", epi(Activation::None, false, true)),
        (136, "CUBLASLT_EPILOGUE_DRELU", None),
        (152, "CUBLASLT_EPILOGUE_DRELU_BGRAD", None),
        (192, "CUBLASLT_EPILOGUE_DGELU", None),
        (208, "CUBLASLT_EPILOGUE_DGELU_BGRAD", None),
        (0, "<unknown cublasLtEpilogue_t>", None),
        (65536, "<unknown cublasLtEpilogue_t>", None), // hipBLASLt's SWISH_EXT
    ];
    for (value, name, want) in cases {
        assert_eq!(cublaslt::epilogue_from_cublaslt(value), want, "{name}");
        assert_eq!(cublaslt::cublaslt_epilogue_name(value), name);
    }
}

#[test]
fn cublaslt_scale_modes_map_to_granularity_format_storage() {
    use ScaleGranularity::*;
    let cases = [
        (0, Some((Tensor, Format::F32, ScaleStorage::OuterMajor))),
        (1, Some((Nvfp4, Format::Ue4m3, ScaleStorage::Swizzled128x4))),
        (2, Some((Mx32, Format::Ue8m0, ScaleStorage::Swizzled128x4))),
        (3, Some((PerOuter, Format::F32, ScaleStorage::OuterMajor))),
        (4, Some((Block { outer: 1, inner: 128 }, Format::F32, ScaleStorage::InnerMajor))),
        (5, Some((Block { outer: 128, inner: 128 }, Format::F32, ScaleStorage::OuterMajor))),
        (6, None),
        (7, None),
    ];
    for (mode, want) in cases {
        assert_eq!(cublaslt::scale_granularity_from_cublaslt_scale_mode(mode), want, "scale mode {mode}");
    }
    assert_eq!(cublaslt::cublaslt_scale_mode_name(5), "CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F");
    assert_eq!(cublaslt::cublaslt_scale_mode_name(6), "CUBLASLT_MATMUL_MATRIX_SCALE_PER_BATCH_SCALAR_32F");
    assert_eq!(cublaslt::cublaslt_scale_mode_name(99), "<unknown cublasLtMatmulMatrixScale_t>");
}

#[test]
fn cublaslt_block_scale_layouts_match_pytorch_strides() {
    let v13 = v(13, 1, 0);
    // VEC128_32F: PyTorch's scale is [outer, ceil(K/128)] with strides (1, outer).
    let (m, k) = (256u64, 512u64);
    let spec = cublaslt::cublaslt_scale_spec(v13, 4, m, k).unwrap();
    assert_eq!(spec.ld, 256);
    for (i, kk) in [(0u64, 0u64), (1, 0), (255, 0), (0, 128), (7, 300), (255, 511)] {
        let entry = spec.entry_for_element(0, i, kk, m, k);
        assert_eq!(entry, i + (kk / 128) * m, "A({i}, {kk})");
    }
    assert_eq!(cublaslt::cublaslt_scale_spec(v13, 4, 101, k).unwrap().ld, 104);

    // BLK128x128_32F: [ceil(outer/128), ceil(K/128)] with strides (roundup(ceil(K/128), 4), 1).
    let (n, k) = (384u64, 384u64);
    let spec = cublaslt::cublaslt_scale_spec(v13, 5, n, k).unwrap();
    assert_eq!(spec.ld, 4, "3 K blocks padded to 4");
    for (j, kk) in [(0u64, 0u64), (127, 127), (128, 0), (300, 200), (383, 383)] {
        let entry = spec.entry_for_element(0, j, kk, n, k);
        assert_eq!(entry, (j / 128) * 4 + kk / 128, "B({kk}, {j})");
    }
    assert_eq!(spec.required_entries(n, k, 1), 2 * 4 + 3);

    // Packed and swizzled modes carry no leading dimension.
    assert_eq!(cublaslt::cublaslt_scale_spec(v13, 2, 128, 256).unwrap().ld, 0);
    assert_eq!(
        cublaslt::cublaslt_scale_spec(v13, 3, 128, 256).unwrap().granularity,
        ScaleGranularity::PerOuter
    );
}

#[test]
fn cublaslt_scale_modes_are_version_gated() {
    // 12.8 introduced block scaling (modes 0-2); 12.9 the Hopper modes 3-5.
    assert!(cublaslt::cublaslt_scale_spec(v(12, 8, 0), 2, 128, 128).is_some());
    assert!(cublaslt::cublaslt_scale_spec(v(12, 8, 4), 4, 128, 128).is_none());
    assert!(cublaslt::cublaslt_scale_spec(v(12, 9, 0), 4, 128, 128).is_some());
    assert!(cublaslt::cublaslt_scale_spec(v(12, 6, 0), 0, 128, 128).is_none());
    // PER_BATCH_SCALAR_32F exists from 13.2 on but cannot be modeled.
    assert!(cublaslt::cublaslt_scale_spec(v(13, 2, 0), 6, 128, 128).is_none());
    assert_eq!(cublaslt::desc_attribute(v(12, 6, 0), 31), None);
    assert_eq!(cublaslt::desc_attribute(v(12, 8, 0), 31), Some(MatmulDescAttr::AScaleMode));
}

#[test]
fn cublaslt_attributes_by_version() {
    let v13 = v(13, 1, 0);
    let expect = [
        (0, MatmulDescAttr::ComputeType),
        (1, MatmulDescAttr::ScaleType),
        (2, MatmulDescAttr::PointerMode),
        (3, MatmulDescAttr::TransA),
        (4, MatmulDescAttr::TransB),
        (7, MatmulDescAttr::Epilogue),
        (8, MatmulDescAttr::BiasPointer),
        (17, MatmulDescAttr::AScalePointer),
        (18, MatmulDescAttr::BScalePointer),
        (19, MatmulDescAttr::CScalePointer),
        (20, MatmulDescAttr::DScalePointer),
        (21, MatmulDescAttr::AmaxDPointer),
        (25, MatmulDescAttr::FastAccum),
        (26, MatmulDescAttr::BiasDataType),
        (31, MatmulDescAttr::AScaleMode),
        (32, MatmulDescAttr::BScaleMode),
    ];
    for (id, attr) in expect {
        assert_eq!(cublaslt::desc_attribute(v13, id), Some(attr), "attribute {id}");
        assert_eq!(cublaslt::desc_attribute_id(v13, attr), Some(id));
    }
    assert_eq!(cublaslt::desc_attribute(v13, 9), None, "9 is unassigned");
    assert_eq!(cublaslt::desc_attribute(v13, 16), None, "16 is unassigned");
    assert_eq!(cublaslt::desc_attribute(v(12, 8, 0), 27), Some(MatmulDescAttr::AtomicSyncNumChunksDRows));
    assert_eq!(cublaslt::desc_attribute(v13, 27), None, "ATOMIC_SYNC_* are gone from 13.x");
    assert_eq!(cublaslt::desc_attribute(v13, 38), Some(MatmulDescAttr::EmulationDescriptor));
    assert_eq!(cublaslt::desc_attribute_name(v13, 25), Some("CUBLASLT_MATMUL_DESC_FAST_ACCUM"));

    let layout = [
        (0, LayoutAttr::Type),
        (1, LayoutAttr::Order),
        (2, LayoutAttr::Rows),
        (3, LayoutAttr::Cols),
        (4, LayoutAttr::Ld),
        (5, LayoutAttr::BatchCount),
        (6, LayoutAttr::StridedBatchOffset),
    ];
    for (id, attr) in layout {
        assert_eq!(cublaslt::layout_attribute(v(12, 0, 0), id), Some(attr));
        assert_eq!(cublaslt::layout_attribute_id(v13, attr), Some(id));
    }
    assert_eq!(cublaslt::layout_attribute(v(12, 8, 0), 8), None);
    assert_eq!(cublaslt::layout_attribute(v13, 8), Some(LayoutAttr::BatchMode));
    assert_eq!(cublaslt::cublaslt_version(130100), Some(v13));
    assert_eq!(cublaslt::cublaslt_version(11401), None);
}

#[test]
fn cublaslt_orders_and_pointer_modes() {
    assert_eq!(cublaslt::order_from_cublaslt(0), Some(Order::ColMajor));
    assert_eq!(cublaslt::order_from_cublaslt(1), Some(Order::RowMajor));
    for tiled in 2..=4 {
        assert_eq!(cublaslt::order_from_cublaslt(tiled), None);
    }
    assert_eq!(cublaslt::pointer_mode_from_cublaslt(0), Some(PointerMode::Host));
    assert_eq!(cublaslt::pointer_mode_from_cublaslt(1), Some(PointerMode::Device));
    assert_eq!(cublaslt::pointer_mode_from_cublaslt(4), Some(PointerMode::AlphaDeviceVectorBetaHost));
    assert!(!PointerMode::DeviceVector.is_scalar());
    assert_eq!(cublaslt::pointer_mode_from_cublaslt(5), None);
}

// ---------------------------------------------------------------------------------------------
// hipBLASLt
// ---------------------------------------------------------------------------------------------

#[test]
fn hipblaslt_attributes_102_103_change_meaning_by_release() {
    use MatmulDescAttr::*;
    let cases = [
        (v(0, 8, 0), None, None),
        (v(0, 10, 0), Some(AScalePointerVec), Some(BScalePointerVec)),
        (v(0, 12, 1), Some(AScalePointerVec), Some(BScalePointerVec)),
        (v(1, 0, 0), None, None),
        (v(1, 1, 0), Some(EpilogueActArg0), Some(EpilogueActArg1)),
        (v(1, 2, 2), Some(EpilogueActArg0), Some(EpilogueActArg1)),
    ];
    for (version, a, b) in cases {
        assert_eq!(hipblaslt::desc_attribute(version, 102), a, "102 at {version}");
        assert_eq!(hipblaslt::desc_attribute(version, 103), b, "103 at {version}");
    }
    assert_eq!(
        hipblaslt::desc_attribute_name(v(0, 12, 0), 102),
        Some("HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER_VEC_EXT")
    );
    assert_eq!(
        hipblaslt::desc_attribute_name(v(1, 1, 0), 102),
        Some("HIPBLASLT_MATMUL_DESC_EPILOGUE_ACT_ARG0_EXT")
    );
    assert_eq!(hipblaslt::desc_attribute_id(v(1, 1, 0), EpilogueActArg0), Some(102));
    assert_eq!(hipblaslt::desc_attribute_id(v(0, 12, 0), EpilogueActArg0), None);
    // The clamp bounds are floats; the scale vectors pointers.
    assert_eq!(hipblaslt::desc_attribute_value(EpilogueActArg0), Some(vendor::AttrValue::F32));
    assert_eq!(hipblaslt::desc_attribute_value(AScalePointerVec), Some(vendor::AttrValue::Ptr));
    assert_eq!(EpilogueActArg0.handling(), AttrHandling::MustBeDefault);
    assert_eq!(AScalePointerVec.handling(), AttrHandling::Modeled);
}

#[test]
fn hipblaslt_attributes_by_release() {
    use MatmulDescAttr::*;
    let v12 = v(0, 12, 0);
    let v11 = v(1, 1, 0);
    for (id, attr) in [
        (0, TransA),
        (1, TransB),
        (2, Epilogue),
        (3, BiasPointer),
        (4, BiasDataType),
        (5, AScalePointer),
        (6, BScalePointer),
        (7, CScalePointer),
        (8, DScalePointer),
        (13, PointerMode),
        (14, AmaxDPointer),
    ] {
        assert_eq!(hipblaslt::desc_attribute(v12, id), Some(attr), "{id} at 0.12");
        assert_eq!(hipblaslt::desc_attribute(v11, id), Some(attr), "{id} at 1.1");
    }
    assert_eq!(hipblaslt::desc_attribute(v(0, 7, 0), 14), None, "AMAX_D arrived in 0.8");
    assert_eq!(hipblaslt::desc_attribute(v12, 31), None, "no scale modes before ROCm 7.0");
    assert_eq!(hipblaslt::desc_attribute(v(1, 0, 0), 31), Some(AScaleMode));
    assert_eq!(hipblaslt::desc_attribute(v(1, 0, 0), 32), Some(BScaleMode));
    assert_eq!(hipblaslt::desc_attribute(v11, 23), None);
    assert_eq!(hipblaslt::desc_attribute(v(1, 3, 0), 23), Some(BiasBatchStride));
    // Layout attributes are numbered unlike cuBLASLt's.
    for (id, attr) in [
        (0, LayoutAttr::BatchCount),
        (1, LayoutAttr::StridedBatchOffset),
        (2, LayoutAttr::Type),
        (3, LayoutAttr::Order),
        (4, LayoutAttr::Rows),
        (5, LayoutAttr::Cols),
        (6, LayoutAttr::Ld),
    ] {
        assert_eq!(hipblaslt::layout_attribute(v(0, 6, 0), id), Some(attr));
        assert_eq!(hipblaslt::layout_attribute_id(v11, attr), Some(id));
    }
    assert_eq!(hipblaslt::layout_attribute(v11, 7), None);
    assert_eq!(hipblaslt::layout_attribute(v(1, 3, 0), 7), Some(LayoutAttr::BatchMode));
    assert_eq!(hipblaslt::hipblaslt_version(100100), Some(v11));
    assert_eq!(hipblaslt::hipblaslt_version(1201), Some(v(0, 12, 1)));
    assert_eq!(hipblaslt::hipblaslt_version(500), None, "0.5 predates the tables");
}

#[test]
fn hipblaslt_pointer_mode_1_changed_meaning_after_rocm_6_0() {
    assert_eq!(
        hipblaslt::pointer_mode_from_hipblaslt(v(0, 6, 0), 1),
        Some(PointerMode::AlphaDeviceVectorBetaHost)
    );
    assert_eq!(hipblaslt::pointer_mode_from_hipblaslt(v(0, 6, 0), 4), None);
    assert_eq!(hipblaslt::pointer_mode_from_hipblaslt(v(0, 7, 0), 1), Some(PointerMode::Device));
    assert_eq!(
        hipblaslt::pointer_mode_from_hipblaslt(v(1, 2, 0), 4),
        Some(PointerMode::AlphaDeviceVectorBetaHost)
    );
    assert_eq!(hipblaslt::pointer_mode_from_hipblaslt(v(1, 2, 0), 0), Some(PointerMode::Host));
}

#[test]
fn hipblaslt_scale_modes() {
    let v10 = v(1, 0, 0);
    assert_eq!(
        hipblaslt::scale_granularity_from_hipblaslt_scale_mode(v10, 3),
        Some((ScaleGranularity::PerOuter, Format::F32, ScaleStorage::OuterMajor))
    );
    assert_eq!(
        hipblaslt::scale_granularity_from_hipblaslt_scale_mode(v10, 3),
        cublaslt::scale_granularity_from_cublaslt_scale_mode(3),
        "OUTER_VEC_32F means the same on both vendors"
    );
    assert_eq!(
        Some(hipblaslt::SCALE_POINTER_VEC_EXT_MAPPING),
        cublaslt::scale_granularity_from_cublaslt_scale_mode(3),
        "the ROCm 6.x VEC_EXT pointers are outer-vector scales"
    );
    assert_eq!(
        hipblaslt::scale_granularity_from_hipblaslt_scale_mode(v10, 0),
        Some((ScaleGranularity::Tensor, Format::F32, ScaleStorage::OuterMajor))
    );
    for unmodeled in [1, 2, 4, 5] {
        assert_eq!(
            hipblaslt::scale_granularity_from_hipblaslt_scale_mode(v10, unmodeled),
            None,
            "{unmodeled}"
        );
    }
    assert_eq!(hipblaslt::scale_granularity_from_hipblaslt_scale_mode(v(0, 12, 0), 3), None);
    assert_eq!(hipblaslt::hipblaslt_scale_mode_name(v10, 2), "HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0");
    assert_eq!(
        hipblaslt::hipblaslt_scale_mode_name(v(1, 2, 0), 1001),
        "<unknown hipblasLtMatmulMatrixScale_t>"
    );
    assert_eq!(
        hipblaslt::hipblaslt_scale_mode_name(v(1, 3, 0), 1001),
        "HIPBLASLT_MATMUL_MATRIX_SCALE_BLK32_UE8M0_32_8_EXT"
    );
}

#[test]
fn hipblaslt_epilogues_and_orders_by_release() {
    let v12 = v(0, 12, 0);
    assert_eq!(hipblaslt::epilogue_from_hipblaslt(v12, 4), epi(Activation::None, true, false));
    assert_eq!(hipblaslt::epilogue_from_hipblaslt(v12, 36), epi(Activation::GeluTanh, true, false));
    assert_eq!(hipblaslt::hipblaslt_epilogue_name(v12, 65536), "<unknown hipblasLtEpilogue_t>");
    assert_eq!(hipblaslt::hipblaslt_epilogue_name(v(1, 0, 0), 65536), "HIPBLASLT_EPILOGUE_SWISH_EXT");
    assert_eq!(hipblaslt::epilogue_from_hipblaslt(v(1, 0, 0), 65536), None);
    assert_eq!(hipblaslt::epilogue_from_hipblaslt(v(1, 0, 0), 130), None, "RELU_AUX arrived in 1.1");
    assert_eq!(hipblaslt::epilogue_from_hipblaslt(v(1, 1, 0), 130), epi(Activation::Relu, false, true));
    assert_eq!(hipblaslt::hipblaslt_epilogue_name(v(1, 1, 0), 131072), "HIPBLASLT_EPILOGUE_CLAMP_EXT");
    assert_eq!(hipblaslt::hipblaslt_epilogue_name(v(1, 2, 0), 262144), "HIPBLASLT_EPILOGUE_SIGMOID_EXT");
    assert_eq!(hipblaslt::order_from_hipblaslt(v12, 0), Some(Order::ColMajor));
    assert_eq!(hipblaslt::order_from_hipblaslt(v12, 1), Some(Order::RowMajor));
    assert_eq!(hipblaslt::order_from_hipblaslt(v(1, 0, 0), 100), None);
    assert_eq!(
        vendor::describe(hipblaslt::HIPBLASLT_ORDER, v(1, 0, 0), 100),
        "HIPBLASLT_ORDER_COL16_4R16 (100)"
    );
    assert_eq!(
        vendor::describe(hipblaslt::HIPBLASLT_ORDER, v12, 100),
        "unknown hipblasLtOrder_t value 100 (hipBLASLt 0.12.0)"
    );
}

// ---------------------------------------------------------------------------------------------
// hipBLAS / rocBLAS
// ---------------------------------------------------------------------------------------------

#[test]
fn hipblas_gemm_ex_abis() {
    use hipblas::GemmExAbi::*;
    assert_eq!(hipblas::gemm_ex_abi(true, Some(v(2, 4, 0)), 0), V2);
    assert_eq!(hipblas::gemm_ex_abi(false, Some(v(2, 4, 0)), 151), LegacyDatatype);
    assert_eq!(hipblas::gemm_ex_abi(false, Some(v(3, 0, 0)), 0), V2);
    assert_eq!(hipblas::gemm_ex_abi(false, None, 151), LegacyDatatype);
    assert_eq!(hipblas::gemm_ex_abi(false, None, 14), V2);
    assert_eq!(hipblas::gemm_ex_abi(false, None, 1000), V2);
    assert_eq!(hipblas::format_from_gemm_ex_type(LegacyDatatype, 168), Some(Format::Bf16));
    assert_eq!(hipblas::format_from_gemm_ex_type(LegacyDatatype, 14), None);
    assert_eq!(hipblas::format_from_gemm_ex_type(V2, 14), Some(Format::Bf16));
    assert_eq!(hipblas::format_from_gemm_ex_type(V2, 1001), Some(Format::E5m2fnuz));
    assert_eq!(hipblas::compute_type_from_gemm_ex(LegacyDatatype, 151), Some(ComputeType::F32));
    assert_eq!(hipblas::compute_type_from_gemm_ex(LegacyDatatype, 2), None);
    assert_eq!(hipblas::compute_type_from_gemm_ex(V2, 2), Some(ComputeType::F32));
    assert_eq!(hipblas::hipblas_datatype_name(168), "HIPBLAS_R_16B");
}

#[test]
fn rocblas_types_and_flags() {
    assert_eq!(rocblas::format_from_rocblas_datatype(150), Some(Format::F16));
    assert_eq!(rocblas::format_from_rocblas_datatype(151), Some(Format::F32));
    assert_eq!(rocblas::format_from_rocblas_datatype(168), Some(Format::Bf16));
    assert_eq!(rocblas::format_from_rocblas_datatype(160), Some(Format::Int8));
    assert_eq!(rocblas::format_from_rocblas_datatype(162), Some(Format::I32));
    assert_eq!(rocblas::format_from_rocblas_datatype(152), None);
    assert_eq!(rocblas::rocblas_datatype_name(154), "rocblas_datatype_f32_c");
    assert_eq!(rocblas::unmodeled_gemm_flag(0), None);
    assert_eq!(rocblas::unmodeled_gemm_flag(0x2 | 0x8), None);
    assert_eq!(rocblas::unmodeled_gemm_flag(0x4), Some("rocblas_gemm_flags_fp16_alt_impl"));
    assert_eq!(rocblas::unmodeled_gemm_flag(0x2 | 0x20), Some("rocblas_gemm_flags_stochastic_rounding"));
}

// ---------------------------------------------------------------------------------------------
// Versions and the tables' own consistency
// ---------------------------------------------------------------------------------------------

#[test]
fn version_encodings() {
    assert_eq!(LibVersion::from_cublas_raw(130100), Some(v(13, 1, 0)));
    assert_eq!(LibVersion::from_cublas_raw(120804), Some(v(12, 8, 4)));
    assert_eq!(LibVersion::from_cublas_raw(12103), None, "cuBLAS 11.11.3 in the old encoding");
    assert_eq!(LibVersion::from_cuda_raw(13000), Some(v(13, 0, 0)));
    assert_eq!(LibVersion::from_cuda_raw(12080), Some(v(12, 8, 0)));
    assert_eq!(LibVersion::from_hipblaslt_raw(100100), Some(v(1, 1, 0)));
    assert_eq!(LibVersion::from_hipblaslt_raw(1201), Some(v(0, 12, 1)));
    assert_eq!(LibVersion::from_hip_raw(60443483), Some(v(6, 4, 43483)));
    assert_eq!(LibVersion::from_hip_raw(70051831), Some(v(7, 0, 51831)));
    assert!(VersionRange::since(1, 1, 0).contains(v(1, 1, 0)));
    assert!(!VersionRange::until(1, 0, 0).contains(v(1, 0, 0)));
    assert!(VersionRange::since(1, 1, 0).overlaps(&VersionRange::ALWAYS));
    assert!(!VersionRange::until(1, 0, 0).overlaps(&VersionRange::since(1, 0, 0)));
}

/// Aliases the headers define on purpose (two names, one value).
const ALIASES: [(&str, &str); 2] =
    [("CUDA_R_8F_E4M3", "CUDA_R_8F_UE4M3"), ("CUBLAS_OP_C", "CUBLAS_OP_HERMITAN")];

#[test]
fn tables_are_consistent() {
    let mut problems = Vec::new();
    for side in [Side::Cuda, Side::Hip] {
        let tables = vendor::side_tables(side);
        let all: Vec<_> = tables.iter().flat_map(|(t, es)| es.iter().map(move |e| (*t, *e))).collect();
        for (i, (ta, a)) in all.iter().enumerate() {
            if a.library.side() != side {
                problems.push(format!("{}: library {:?} is not on side {side:?}", a.name, a.library));
            }
            if let (Some(s), Some(u)) = (a.range.since, a.range.until) {
                if s >= u {
                    problems.push(format!("{}: empty range {}", a.name, a.range));
                }
            }
            if a.range.since.is_some_and(|s| s < a.library.min_supported()) {
                problems.push(format!("{}: since below the minimum supported version", a.name));
            }
            if a.library == Library::Hip
                && (a.range.since.is_some_and(|s| s.patch != 0)
                    || a.range.until.is_some_and(|u| u.patch != 0))
            {
                problems.push(format!("{}: HIP ranges compare major.minor only", a.name));
            }
            if a.name.contains(char::is_whitespace) || a.name.is_empty() {
                problems.push(format!("{:?}: not printable as one token", a.name));
            }
            for (tb, b) in &all[i + 1..] {
                if !a.range.overlaps(&b.range) || a.library != b.library {
                    continue;
                }
                if a.name == b.name {
                    problems.push(format!("{} listed twice for overlapping versions", a.name));
                }
                let alias = ALIASES
                    .iter()
                    .any(|(x, y)| (a.name == *x && b.name == *y) || (a.name == *y && b.name == *x));
                if ta == tb && a.value == b.value && !alias && a.enum_name != "sizeof" {
                    problems.push(format!("{ta}: {} and {} share value {}", a.name, b.name, a.value));
                }
            }
        }
    }
    assert!(problems.is_empty(), "table problems:\n{}", problems.join("\n"));
}

#[test]
fn every_attribute_has_a_value_type_for_its_vendor() {
    for e in cublaslt::CUBLASLT_MATMUL_DESC_ATTRIBUTES {
        assert!(cublaslt::desc_attribute_value(e.meaning).is_some(), "{}", e.abi.name);
    }
    for e in hipblaslt::HIPBLASLT_MATMUL_DESC_ATTRIBUTES {
        assert!(hipblaslt::desc_attribute_value(e.meaning).is_some(), "{}", e.abi.name);
    }
    for e in cublaslt::CUBLASLT_MATRIX_LAYOUT_ATTRIBUTES {
        assert!(cublaslt::layout_attribute_value(e.meaning).is_some(), "{}", e.abi.name);
    }
    for e in hipblaslt::HIPBLASLT_MATRIX_LAYOUT_ATTRIBUTES {
        assert!(hipblaslt::layout_attribute_value(e.meaning).is_some(), "{}", e.abi.name);
    }
    use vendor::AttrValue;
    assert_eq!(cublaslt::desc_attribute_value(MatmulDescAttr::FastAccum), Some(AttrValue::I8));
    assert_eq!(cublaslt::desc_attribute_value(MatmulDescAttr::Epilogue), Some(AttrValue::U32));
    assert_eq!(cublaslt::layout_attribute_value(LayoutAttr::Rows).map(AttrValue::bytes), Some(8));
    assert_eq!(cublaslt::desc_attribute_value(MatmulDescAttr::BiasBatchStride), Some(AttrValue::I64));
    assert_eq!(hipblaslt::desc_attribute_value(MatmulDescAttr::BiasBatchStride), Some(AttrValue::I32));
}

#[test]
fn attribute_ids_round_trip_in_every_version_they_exist() {
    fn probe(range: &VersionRange, min: LibVersion) -> LibVersion {
        range.since.unwrap_or(min)
    }
    for e in cublaslt::CUBLASLT_MATMUL_DESC_ATTRIBUTES {
        let at = probe(&e.abi.range, Library::Cublas.min_supported());
        assert_eq!(cublaslt::desc_attribute_id(at, e.meaning), Some(e.abi.value as i32), "{}", e.abi.name);
        assert_eq!(cublaslt::desc_attribute(at, e.abi.value as i32), Some(e.meaning), "{}", e.abi.name);
    }
    for e in hipblaslt::HIPBLASLT_MATMUL_DESC_ATTRIBUTES {
        let at = probe(&e.abi.range, Library::HipBlasLt.min_supported());
        assert_eq!(hipblaslt::desc_attribute_id(at, e.meaning), Some(e.abi.value as i32), "{}", e.abi.name);
        assert_eq!(hipblaslt::desc_attribute(at, e.abi.value as i32), Some(e.meaning), "{}", e.abi.name);
    }
}

#[test]
fn driver_constants() {
    assert_eq!(cuda_driver::CU_STREAM_CAPTURE_STATUS_ACTIVE, 1);
    assert_eq!(cuda_driver::CU_MEMHOSTALLOC_DEVICEMAP, 2);
    assert_eq!(cuda_driver::CU_STREAM_NON_BLOCKING, 1);
    assert_eq!(cuda_driver::CU_EVENT_DISABLE_TIMING, 2);
    assert_eq!(cuda_driver::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 75);
    assert_eq!(cuda_driver::cu_result_name(900), "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED");
    assert_eq!(cuda_driver::cu_result_name(12345), "<unlisted CUresult>");
}

// ---------------------------------------------------------------------------------------------
// ABI dumps
// ---------------------------------------------------------------------------------------------

fn cuda_13() -> HeaderVersions {
    HeaderVersions::new().with(Library::CudaToolkit, v(13, 0, 0)).with(Library::Cublas, v(13, 1, 0))
}

fn cuda_12_8() -> HeaderVersions {
    HeaderVersions::new().with(Library::CudaToolkit, v(12, 8, 0)).with(Library::Cublas, v(12, 8, 4))
}

fn rocm(hip: (u32, u32), hipblaslt: LibVersion, hipblas: LibVersion, rocblas: LibVersion) -> HeaderVersions {
    HeaderVersions::new()
        .with(Library::Hip, v(hip.0, hip.1, 0))
        .with(Library::HipBlasLt, hipblaslt)
        .with(Library::HipBlas, hipblas)
        .with(Library::RocBlas, rocblas)
}

#[test]
fn rendered_rust_side_reads_back_clean() {
    let sets = [
        (Side::Cuda, cuda_13()),
        (Side::Cuda, cuda_12_8()),
        (Side::Hip, rocm((6, 4), v(0, 12, 1), v(2, 4, 0), v(4, 4, 0))),
        (Side::Hip, rocm((7, 1), v(1, 1, 0), v(3, 1, 0), v(5, 1, 0))),
    ];
    for (side, versions) in sets {
        let text = abi::render_expected(side, &versions);
        let dump = abi::parse_dump(&text).unwrap();
        assert_eq!(dump.side, side);
        assert_eq!(dump.versions, versions);
        let diff = abi::compare(&dump);
        assert!(diff.is_clean(), "{side:?} {versions}: {diff}");
    }
    // What differs between releases shows up in the rendering.
    let r64 = abi::render_expected(Side::Hip, &rocm((6, 4), v(0, 12, 1), v(2, 4, 0), v(4, 4, 0)));
    let r71 = abi::render_expected(Side::Hip, &rocm((7, 1), v(1, 1, 0), v(3, 1, 0), v(5, 1, 0)));
    assert!(r64.contains("\nHIPBLASLT_MATMUL_DESC_A_SCALE_POINTER_VEC_EXT 102\n"));
    assert!(!r71.contains("HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER_VEC_EXT"));
    assert!(r71.contains("\nHIPBLASLT_MATMUL_DESC_EPILOGUE_ACT_ARG0_EXT 102\n"));
    assert!(r64.contains("\nHIPBLAS_R_32F 151\n") && !r71.contains("HIPBLAS_R_32F"));
    let c128 = abi::render_expected(Side::Cuda, &cuda_12_8());
    assert!(c128.contains("\nCUBLASLT_MATMUL_DESC_ATOMIC_SYNC_NUM_CHUNKS_D_ROWS 27\n"));
    assert!(!c128.contains("CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F"));
}

#[test]
fn compare_reports_every_difference_at_once() {
    let text = abi::render_expected(Side::Cuda, &cuda_13());
    let mutated: String = text
        .lines()
        .filter(|l| !l.starts_with("CUBLASLT_ORDER_COL32 "))
        .map(|l| {
            if l == "CUBLASLT_MATMUL_DESC_EPILOGUE 7" {
                "CUBLASLT_MATMUL_DESC_EPILOGUE 9".to_string()
            } else {
                l.to_string()
            }
        })
        .chain(["CUBLASLT_MATMUL_DESC_NEW_THING 99".to_string(), "# a comment".to_string(), String::new()])
        .collect::<Vec<_>>()
        .join("\n");
    let diff = abi::compare(&abi::parse_dump(&mutated).unwrap());
    assert_eq!(
        diff,
        AbiDiff {
            missing: vec![("CUBLASLT_ORDER_COL32".into(), 2)],
            extra: vec![("CUBLASLT_MATMUL_DESC_NEW_THING".into(), 99)],
            differing: vec![("CUBLASLT_MATMUL_DESC_EPILOGUE".into(), 7, 9)],
        }
    );
    let report = diff.to_string();
    assert!(
        report.contains("CUBLASLT_ORDER_COL32")
            && report.contains("NEW_THING")
            && report.contains("tables 7, header 9")
    );

    // A dump of an older header judged by its own versions: 12.8 has no VEC128 mode.
    let old = abi::render_expected(Side::Cuda, &cuda_12_8()) + "CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F 4\n";
    let diff = abi::compare(&abi::parse_dump(&old).unwrap());
    assert_eq!(diff.extra, vec![("CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F".to_string(), 4)]);
    assert!(diff.missing.is_empty() && diff.differing.is_empty());
}

#[test]
fn malformed_dumps_are_refused() {
    let good = abi::render_expected(Side::Cuda, &cuda_13());
    assert_eq!(abi::parse_dump("CUDA_VERSION 13000\n"), Err(DumpError::NoSide));
    assert!(matches!(abi::parse_dump(&format!("{good}CUDA_R_32F\n")), Err(DumpError::Malformed { .. })));
    assert!(matches!(abi::parse_dump(&format!("{good}CUDA_R_32F zero\n")), Err(DumpError::Malformed { .. })));
    assert!(matches!(abi::parse_dump(&format!("{good}CUDA_R_32F 0\n")), Err(DumpError::Duplicate { .. })));
    let no_cublas: String =
        good.lines().filter(|l| !l.starts_with("CUBLAS_VER_MINOR")).map(|l| format!("{l}\n")).collect();
    assert_eq!(
        abi::parse_dump(&no_cublas),
        Err(DumpError::MissingVersionKey { library: Library::Cublas, key: "CUBLAS_VER_MINOR" })
    );
}

/// Every dump under `tests/abi/dumps/` (committed from GPU hosts) and the one named by
/// `QUANTSHADOW_ABI_DUMP` must match the tables for its own header versions.
#[test]
fn header_dumps_match_the_tables() {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(abi_dir().join("dumps"))
        .expect("tests/abi/dumps exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    if let Some(extra) = std::env::var_os("QUANTSHADOW_ABI_DUMP") {
        let path = PathBuf::from(extra);
        assert!(path.is_file(), "QUANTSHADOW_ABI_DUMP={} is not a file", path.display());
        paths.push(path);
    }
    paths.sort();
    assert!(!paths.is_empty(), "no ABI dump to check (tests/abi/dumps/*.txt)");
    let mut failures = BTreeMap::new();
    for path in &paths {
        let text = std::fs::read_to_string(path).unwrap();
        match abi::parse_dump(&text) {
            Err(e) => {
                failures.insert(path.display().to_string(), e.to_string());
            }
            Ok(dump) => {
                let diff = abi::compare(&dump);
                if !diff.is_clean() {
                    failures.insert(
                        path.display().to_string(),
                        format!("{} ({})\n{diff}", dump.side.name(), dump.versions),
                    );
                }
            }
        }
    }
    let report: Vec<String> = failures.iter().map(|(p, why)| format!("{p}:\n{why}")).collect();
    assert!(failures.is_empty(), "ABI dumps disagree with the tables:\n{}", report.join("\n"));
}

/// The committed C programs are exactly what the tables generate
/// (`QUANTSHADOW_REGEN_ABI=1` rewrites them).
#[test]
fn generated_c_checks_are_up_to_date() {
    let regen = std::env::var_os("QUANTSHADOW_REGEN_ABI").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (side, file) in [(Side::Cuda, "cuda_abi_check.c"), (Side::Hip, "hip_abi_check.c")] {
        let path = abi_dir().join(file);
        let want = abi::c_check_source(side);
        if regen {
            std::fs::write(&path, &want).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(want.as_str()) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated ABI checks (regenerate with QUANTSHADOW_REGEN_ABI=1 cargo test -p quantshadow-runtime \
         --test vendor_abi): {stale:?}"
    );
    // Every constant is printed by its own name, under a guard only when it is version-gated.
    let cuda = abi::c_check_source(Side::Cuda);
    assert!(cuda.contains("    P(\"CUBLASLT_MATMUL_DESC_FAST_ACCUM\", CUBLASLT_MATMUL_DESC_FAST_ACCUM);\n"));
    assert!(cuda.contains(
        "#if QS_V_CUBLAS >= QS_VER(12, 9, 0)\n    P(\"CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F\", \
         CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F);\n#endif\n"
    ));
    let hip = abi::c_check_source(Side::Hip);
    assert!(hip.contains(
        "#if QS_V_HIPBLASLT >= QS_VER(0, 10, 0) && QS_V_HIPBLASLT < QS_VER(1, 0, 0)\n    \
         P(\"HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER_VEC_EXT\", HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER_VEC_EXT);\n"
    ));
}

/// Helper, not a check: prints the Rust side for the header versions of the dump named by
/// `QUANTSHADOW_ABI_PRINT`, in the dump format, for `diff` against it:
/// `QUANTSHADOW_ABI_PRINT=dump.txt cargo test -p quantshadow-runtime --test vendor_abi -- --ignored
/// --nocapture print_rust_side`.
#[test]
#[ignore = "helper: prints the Rust side of an ABI dump"]
fn print_rust_side() {
    let path = std::env::var_os("QUANTSHADOW_ABI_PRINT").expect("set QUANTSHADOW_ABI_PRINT to a dump file");
    let dump = abi::parse_dump(&std::fs::read_to_string(path).unwrap()).unwrap();
    print!("{}", abi::render_expected(dump.side, &dump.versions));
}
