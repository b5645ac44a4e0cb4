//! Snapshots of detached sketch checks (`qs_sketch_snap_{a}_{d}`, qs_abi.h `QsSnapParams`).
//!
//! A sketch check enqueued on the caller's stream delays everything after it by the check's
//! latency (16-34 us on an H100, most of it serial finishing, not work). A detached check
//! instead copies the sampled rows of the call (op(A) rows, A's scale entries, C and D rows,
//! row bias, device-pointer scalars) into a buffer of its own with one copy kernel on the
//! caller's stream, and runs the unchanged check kernel over that copy elsewhere: on a side
//! stream (eager calls) or as a graph branch no later node waits for (captured calls). The copy
//! holds the call's own codes, so the check decodes exactly what it would have read in place.
//!
//! This module is the layout: where each region goes, the launch, and the problem descriptor
//! of the copy (a GEMM of `count` rows, batch item 0, row-major, scales outer-major).

use super::abi::{
    status, AbiError, LaunchConfig, QsGemmDesc, QsRowSel, QsScalar, QsSnapAllParams, QsSnapHeader,
    QsSnapParams, QsSnapRegion, BIAS_ROWS, BLOCK_THREADS, ORDER_ROW, ROWS_ALL, SCALE_OUTER_MAJOR,
};
use crate::formats::Format;
use std::mem::size_of;

/// Regions start at this alignment (vector loads, and the pool's own block alignment).
const REGION_ALIGN: u64 = 256;
/// Packed rows are padded to whole 16-byte vectors.
const ROW_ALIGN: u64 = 16;
/// Elements of the widest row one block copies at least (the copy is bandwidth, not latency,
/// once a block moves several KiB).
const SNAP_MIN_SLICE: u64 = 2048;
/// Blocks per SM the copy aims for when there are few rows (decode).
const SNAP_BLOCKS_PER_SM: u64 = 2;
const SNAP_MAX_CHUNKS: u64 = 65535;

/// Header tag of a copy of every row (qs_sketch.cu `QS_SNAP_ALL_ROWS_TAG`).
const SNAP_ALL_ROWS_TAG: u64 = 1;

/// Why a call cannot be checked detached (it is then checked on its own stream as before).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NotDetachable {
    #[error("a batched B (one weight per batch item): the copy keeps batch item 0's projection only")]
    BatchedB,
    #[error("snapshot of {bytes} bytes is over the limit of {limit}")]
    TooLarge { bytes: u64, limit: u64 },
    #[error(transparent)]
    Abi(#[from] AbiError),
}

/// Where a snapshot of `count` rows of one call shape puts each region, and its launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotLayout {
    pub count: u64,
    pub a: QsSnapRegion,
    /// Zero-sized when A has no scale tensor.
    pub a_scale: QsSnapRegion,
    /// Zero-sized when the call has no C.
    pub c: QsSnapRegion,
    pub d: QsSnapRegion,
    /// Row bias entries (0 when the call has none along rows).
    pub bias_off: u64,
    pub bytes: u64,
    pub launch: LaunchConfig,
    /// What of the call the layout was sized for ([`Self::fits`]).
    shape: LayoutShape,
}

/// The parts of a call that size a snapshot. A site's identity fixes K, N and the formats of
/// A, B and D, not whether a call has C (beta may change per call), a row bias or A's scales:
/// a snapshot laid out without room for those must not take a call that has them (the copy
/// would write its C rows over the header, past the buffer when C is wider than D).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LayoutShape {
    k: u64,
    n: u64,
    a_format: u32,
    a_scale: Option<(u32, u32)>,
    c_format: Option<u32>,
    d_format: u32,
    row_bias_format: Option<u32>,
}

impl LayoutShape {
    fn of(g: &QsGemmDesc) -> LayoutShape {
        LayoutShape {
            k: g.k,
            n: g.n,
            a_format: g.a.format,
            a_scale: (g.a_scale.ptr != 0).then_some((g.a_scale.format, g.a_scale.grid_inner)),
            c_format: (g.c.ptr != 0).then_some(g.c.format),
            d_format: g.d.format,
            row_bias_format: (g.bias.ptr != 0 && g.bias.axis == BIAS_ROWS).then_some(g.bias.format),
        }
    }
}

fn bits_of(code: u32) -> Result<u64, AbiError> {
    Format::from_u8(code as u8).map(|f| f.bits() as u64).ok_or(AbiError::TooLarge {
        what: "format code",
        value: code as u64,
        limit: 12,
    })
}

fn padded_row_bytes(elements: u64, bits: u64) -> u64 {
    (elements * bits).div_ceil(8).next_multiple_of(ROW_ALIGN)
}

impl SnapshotLayout {
    /// Layout for `count` sampled rows of calls shaped like `g` (pointers do not matter, the
    /// presence of C, A scales and a row bias does). `sm_count` sizes the copy's grid.
    pub fn new(g: &QsGemmDesc, count: u64, sm_count: u32, limit_bytes: u64) -> Result<Self, NotDetachable> {
        if g.batch > 1 && (g.b.batch_stride != 0 || g.b_scale.batch_stride != 0) {
            return Err(NotDetachable::BatchedB);
        }
        let count = count.max(1);
        let mut off = (size_of::<QsSnapHeader>() as u64 + 8 * count).next_multiple_of(REGION_ALIGN);
        let mut take = |bytes: u64| {
            let at = off;
            off = (off + bytes).next_multiple_of(REGION_ALIGN);
            at
        };
        let mut region = |row_bytes: u64| QsSnapRegion { off: take(row_bytes * count), row_bytes };
        let a = region(padded_row_bytes(g.k, bits_of(g.a.format)?));
        let a_scale = if g.a_scale.ptr != 0 {
            region(padded_row_bytes(g.a_scale.grid_inner as u64, bits_of(g.a_scale.format)?))
        } else {
            QsSnapRegion::default()
        };
        let c = if g.c.ptr != 0 {
            region(padded_row_bytes(g.n, bits_of(g.c.format)?))
        } else {
            QsSnapRegion::default()
        };
        let d = region(padded_row_bytes(g.n, bits_of(g.d.format)?));
        let bias_off = if g.bias.ptr != 0 && g.bias.axis == BIAS_ROWS {
            take(padded_row_bytes(count, bits_of(g.bias.format)?))
        } else {
            0
        };
        let bytes = off;
        if bytes > limit_bytes {
            return Err(NotDetachable::TooLarge { bytes, limit: limit_bytes });
        }
        // Slices of the widest row: enough blocks to fill the GPU when rows are few, none
        // narrower than SNAP_MIN_SLICE elements.
        let widest = g.k.max(g.n).max(1);
        let by_width = widest.div_ceil(SNAP_MIN_SLICE).max(1);
        let by_fill = (SNAP_BLOCKS_PER_SM * sm_count.max(1) as u64).div_ceil(count).max(1);
        let chunks = by_width.min(by_fill).min(SNAP_MAX_CHUNKS);
        let launch = LaunchConfig::new([count, chunks, 1], BLOCK_THREADS)?;
        Ok(SnapshotLayout { count, a, a_scale, c, d, bias_off, bytes, launch, shape: LayoutShape::of(g) })
    }

    /// Whether a snapshot of this layout holds the call `g`: the same parts as the call it was
    /// made for (C, a row bias and A's scales present or absent alike, same widths and formats).
    pub fn fits(&self, g: &QsGemmDesc) -> bool {
        LayoutShape::of(g) == self.shape
    }

    /// The copy kernel's parameters for a snapshot at `base` of the call `g`, rows `rows`.
    /// `epoch_counter` 0: the epoch is `rows.epoch_value` (eager calls, counted on the host);
    /// else the device counter there (graph replays).
    pub fn params(&self, g: &QsGemmDesc, rows: QsRowSel, base: u64, epoch_counter: u64) -> QsSnapParams {
        QsSnapParams {
            g: *g,
            rows,
            out_ptr: base,
            a: self.a,
            a_scale: self.a_scale,
            c: self.c,
            d: self.d,
            bias_off: self.bias_off,
            epoch_counter_ptr: epoch_counter,
        }
    }

    /// The copy of every row (`qs_sketch_snap_all`) of the call `g` into the snapshot at `base`:
    /// where [`Self::lean_copy`] allows and `rows` selects every row (decode). None otherwise;
    /// [`Self::params`] then serves the call. Same snapshot as the other copies: header (tag 1,
    /// `rows.epoch_value`, device-pointer scalars, the status "rows past the end" when `rows`
    /// says more rows than the call has), row list t -> t, regions.
    pub fn every_row_params(&self, g: &QsGemmDesc, rows: QsRowSel, base: u64) -> Option<QsSnapAllParams> {
        // A defence, not a fallback: the rows read must be the call's and each slot must hold a
        // whole row. A layout belongs to one site's shape (N and K are part of the site), so
        // every caller meets both; the other copy kernels do not check them either.
        if rows.mode != ROWS_ALL || rows.total_rows > g.m || !Self::lean_copy(g) {
            return None;
        }
        let (a_bits, d_bits) = (bits_of(g.a.format).ok()?, bits_of(g.d.format).ok()?);
        let (a_rs, _) = g.a.op_strides();
        let scalar = |s: &QsScalar| -> Option<(u64, u32)> {
            match s.device_ptr() {
                Some(ptr) => Some((ptr, bits_of(s.format).ok()? as u32)),
                None => Some((0, 0)),
            }
        };
        let mut scalar_ptr = [0u64; 5];
        let mut scalar_bits = [0u32; 5];
        for (i, s) in g.scalars().into_iter().enumerate() {
            (scalar_ptr[i], scalar_bits[i]) = scalar(s)?;
        }
        let (a_bytes, d_bytes) = (g.k * a_bits / 8, g.n * d_bits / 8);
        if a_bytes > self.a.row_bytes || d_bytes > self.d.row_bytes {
            return None; // a layout made for another shape
        }
        let past_end = if rows.count > rows.total_rows { status::OUT_OF_BOUNDS } else { 0 };
        Some(QsSnapAllParams {
            a_ptr: g.a.ptr,
            a_ld_bytes: a_rs * a_bits / 8,
            d_ptr: g.d.ptr,
            d_ld_bytes: g.d.ld * d_bits / 8,
            out_ptr: base,
            a: self.a,
            d: self.d,
            epoch: rows.epoch_value,
            status: (SNAP_ALL_ROWS_TAG << 32) | past_end as u64,
            scalar_ptr,
            scalar_bits,
            rows: u32::try_from(rows.count.min(rows.total_rows).min(self.count)).ok()?,
            a_bytes: u32::try_from(a_bytes).ok()?,
            d_bytes: u32::try_from(d_bytes).ok()?,
        })
    }

    /// Whether the lean copy (`qs_sketch_snap_rows_{a}_{d}`) serves this call: one batch item,
    /// contiguous op(A) rows and row-major D rows of byte formats whose every slice is whole
    /// 16-byte vectors inside the buffers, and nothing else to copy but device-pointer scalars
    /// (no C, A scales or row bias). The general copy handles every layout and format, and its
    /// size costs ~1.1 us per copy in a decode graph (H100, instruction fetch after each GEMV);
    /// taking FP8's tensor scales (device pointers) here saves it ~1.5 us per eager copy.
    pub fn lean_copy(g: &QsGemmDesc) -> bool {
        let (Ok(a_bits), Ok(d_bits)) = (bits_of(g.a.format), bits_of(g.d.format)) else { return false };
        let (a_rs, a_cs) = g.a.op_strides();
        let whole_vectors = |ptr: u64, ld: u64, len: u64, bits: u64| {
            let bytes = bits / 8;
            ptr.is_multiple_of(ROW_ALIGN)
                && (ld * bytes).is_multiple_of(ROW_ALIGN)
                && (len * bytes).is_multiple_of(ROW_ALIGN)
        };
        g.batch == 1
            && g.m >= 1
            && a_bits >= 8
            && d_bits >= 8
            && a_cs == 1
            && g.d.order == ORDER_ROW
            && whole_vectors(g.a.ptr, a_rs, g.k, a_bits)
            && whole_vectors(g.d.ptr, g.d.ld, g.n, d_bits)
            && (g.m - 1) * a_rs + g.k <= g.a.extent
            && (g.m - 1) * g.d.ld + g.n <= g.d.extent
            && g.c.ptr == 0
            && g.a_scale.ptr == 0
            && !(g.bias.ptr != 0 && g.bias.axis == BIAS_ROWS)
    }

    /// The problem the check sees: the snapshot at `base` as a GEMM of `count` rows. B, its
    /// scales, the column bias and host-value scalars are the call's own (weights stay put).
    pub fn packed_desc(&self, g: &QsGemmDesc, base: u64) -> QsGemmDesc {
        let n = self.count;
        let mut p = *g;
        p.m = n;
        p.batch = 1;
        let ld = |row_bytes: u64, format: u32| row_bytes * 8 / bits_of(format).unwrap_or(8);
        let packed = |m: &super::abi::QsMatrixDesc, region: QsSnapRegion| {
            let ld = ld(region.row_bytes, m.format);
            super::abi::QsMatrixDesc {
                ptr: base + region.off,
                ld,
                batch_stride: 0,
                extent: n * ld,
                format: m.format,
                order: ORDER_ROW,
                trans: 0,
                reserved: 0,
            }
        };
        p.a = packed(&g.a, self.a);
        p.d = packed(&g.d, self.d);
        if g.c.ptr != 0 {
            p.c = packed(&g.c, self.c);
        }
        if g.a_scale.ptr != 0 {
            let ld = ld(self.a_scale.row_bytes, g.a_scale.format);
            p.a_scale.ptr = base + self.a_scale.off;
            p.a_scale.ld = ld;
            p.a_scale.batch_stride = 0;
            p.a_scale.extent = n * ld;
            p.a_scale.storage = SCALE_OUTER_MAJOR;
            p.a_scale.block_outer = 1;
            p.a_scale.grid_outer = n as u32;
        }
        if g.bias.ptr != 0 && g.bias.axis == BIAS_ROWS {
            p.bias.ptr = base + self.bias_off;
            p.bias.extent = n;
        }
        let scalar_at = |s: &mut QsScalar, i: u64| {
            if s.on_device != 0 && s.ptr != 0 {
                s.ptr = base + 16 + 8 * i;
            }
        };
        scalar_at(&mut p.alpha, 0);
        scalar_at(&mut p.a_tensor_scale, 1);
        scalar_at(&mut p.b_tensor_scale, 2);
        scalar_at(&mut p.beta, 3);
        scalar_at(&mut p.d_scale, 4);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::abi::{
        QsBiasDesc, QsMatrixDesc, QsScaleDesc, BIAS_COLS, ORDER_COL, SCALE_SWIZZLED_128X4,
    };

    fn desc(m: u64, n: u64, k: u64, a: Format, d: Format) -> QsGemmDesc {
        let mat = |format: Format, ld: u64, rows: u64| QsMatrixDesc {
            ptr: 0x1000,
            ld,
            batch_stride: 0,
            extent: ld * rows,
            format: format as u32,
            order: ORDER_ROW,
            trans: 0,
            reserved: 0,
        };
        QsGemmDesc {
            m,
            n,
            k,
            batch: 1,
            a: mat(a, k, m),
            b: mat(a, n, k),
            d: mat(d, n, m),
            ..QsGemmDesc::default()
        }
    }

    #[test]
    fn a_layout_fits_only_calls_with_the_same_parts() {
        let plain = desc(300, 1024, 512, Format::Bf16, Format::Bf16);
        let layout = SnapshotLayout::new(&plain, 64, 132, u64::MAX).unwrap();
        assert!(layout.fits(&plain));
        // Other pointers and row counts do not matter.
        let mut moved = desc(4096, 1024, 512, Format::Bf16, Format::Bf16);
        moved.a.ptr = 0x9000;
        moved.d.ptr = 0xa000;
        assert!(layout.fits(&moved));
        let differs = |f: &dyn Fn(&mut QsGemmDesc)| {
            let mut g = plain;
            f(&mut g);
            !layout.fits(&g)
        };
        assert!(differs(&|g| {
            g.c = g.d; // beta != 0 on this call
            g.c.format = Format::F32 as u32;
        }));
        assert!(differs(&|g| {
            g.bias =
                QsBiasDesc { ptr: 0x2000, format: Format::Bf16 as u32, axis: BIAS_ROWS, ..Default::default() }
        }));
        assert!(differs(&|g| {
            g.a_scale =
                QsScaleDesc { ptr: 0x3000, format: Format::F32 as u32, grid_inner: 4, ..Default::default() }
        }));
        assert!(differs(&|g| g.d.format = Format::F16 as u32));
        // A column bias is not in the snapshot: it fits.
        assert!(!differs(&|g| {
            g.bias =
                QsBiasDesc { ptr: 0x2000, format: Format::Bf16 as u32, axis: BIAS_COLS, ..Default::default() }
        }));
        // And the layout made with C fits calls with C only.
        let mut with_c = plain;
        with_c.c = with_c.d;
        let layout_c = SnapshotLayout::new(&with_c, 64, 132, u64::MAX).unwrap();
        assert!(layout_c.fits(&with_c) && !layout_c.fits(&plain));
        assert!(layout_c.bytes > layout.bytes);
    }

    #[test]
    fn lean_copy_only_for_plain_contiguous_byte_rows() {
        let plain = desc(1, 4096, 4096, Format::Bf16, Format::Bf16);
        assert!(SnapshotLayout::lean_copy(&plain));
        assert!(SnapshotLayout::lean_copy(&desc(300, 1024, 512, Format::E4m3fn, Format::Bf16)));
        let not = |f: &dyn Fn(&mut QsGemmDesc)| {
            let mut g = plain;
            f(&mut g);
            !SnapshotLayout::lean_copy(&g)
        };
        assert!(not(&|g| g.a.format = Format::E2m1 as u32)); // 4-bit codes
        assert!(not(&|g| g.a.trans = 1)); // strided op(A) rows
        assert!(not(&|g| g.d.order = ORDER_COL));
        assert!(not(&|g| g.a.ptr += 2)); // not 16-byte aligned
        assert!(not(&|g| g.k = 4095)); // last slice not whole vectors
        assert!(not(&|g| g.d.extent -= 1)); // last row past the buffer
        assert!(not(&|g| g.batch = 2));
        assert!(not(&|g| g.c.ptr = 0x9000));
        assert!(not(&|g| g.a_scale.ptr = 0x9000));
        assert!(not(&|g| {
            g.bias.ptr = 0x9000;
            g.bias.axis = BIAS_ROWS;
        }));
        // Device-pointer scalars (FP8 tensor scales, a device alpha) are copied into the header.
        let mut device_scales = plain;
        device_scales.a_tensor_scale =
            QsScalar { value: 0.0, ptr: 0x5000, format: Format::F32 as u32, on_device: 1 };
        device_scales.alpha = QsScalar { value: 0.0, ptr: 0x5010, format: Format::F32 as u32, on_device: 1 };
        assert!(SnapshotLayout::lean_copy(&device_scales));
        // A column bias is the weight's, not copied: still lean.
        let mut col_bias = plain;
        col_bias.bias.ptr = 0x9000;
        col_bias.bias.axis = BIAS_COLS;
        assert!(SnapshotLayout::lean_copy(&col_bias));
    }

    #[test]
    fn every_row_copy_only_for_all_rows_of_a_lean_copy_and_its_header_is_the_kernels() {
        let mut g = desc(3, 1024, 2816, Format::Bf16, Format::F16);
        g.a.ld = 3000; // op(A) rows 6000 bytes apart
        g.a.extent = 3000 * 3;
        g.a.ptr = 0x10000;
        g.d.ptr = 0x40000;
        g.alpha = QsScalar { value: 1.0, ptr: 0, format: Format::F32 as u32, on_device: 0 };
        g.b_tensor_scale = QsScalar { value: 0.0, ptr: 0x5000, format: Format::F32 as u32, on_device: 1 };
        g.d_scale = QsScalar { value: 0.0, ptr: 0x5008, format: Format::F16 as u32, on_device: 1 };
        let l = SnapshotLayout::new(&g, 3, 132, u64::MAX).unwrap();
        let p = l.every_row_params(&g, QsRowSel { epoch_value: 9, ..QsRowSel::all(3) }, 0x80000).unwrap();
        assert_eq!((p.a_ptr, p.a_ld_bytes, p.a_bytes), (0x10000, 6000, 2816 * 2));
        assert_eq!((p.d_ptr, p.d_ld_bytes, p.d_bytes), (0x40000, 1024 * 2, 1024 * 2));
        assert_eq!((p.out_ptr, p.a, p.d, p.rows, p.epoch), (0x80000, l.a, l.d, 3, 9));
        assert_eq!(p.status, 1 << 32);
        assert_eq!(p.scalar_ptr, [0, 0, 0x5000, 0, 0x5008]);
        assert_eq!(p.scalar_bits, [0, 0, 32, 0, 16]);
        // More rows asked than the call has: the status says so, and only the call's rows move.
        let over = l.every_row_params(&g, QsRowSel { count: 4, ..QsRowSel::all(3) }, 0x80000).unwrap();
        assert_eq!((over.status, over.rows), ((1 << 32) | status::OUT_OF_BOUNDS as u64, 3));
        // Sampled rows, or a call the lean copy does not serve: the other copy kernels.
        let sampled = QsRowSel { mode: super::super::abi::ROWS_PERM, ..QsRowSel::all(3) };
        assert!(l.every_row_params(&g, sampled, 0x80000).is_none());
        let mut strided = g;
        strided.a.trans = 1;
        assert!(l.every_row_params(&strided, QsRowSel::all(3), 0x80000).is_none());
        // Rows past the call's, or a layout of another shape (narrower slots): not this kernel.
        assert!(l.every_row_params(&g, QsRowSel::all(4), 0x80000).is_none());
        let mut wider = g;
        wider.n = 1040;
        wider.d.ld = 1040;
        wider.d.extent = 1040 * 3;
        assert!(l.every_row_params(&wider, QsRowSel::all(3), 0x80000).is_none());
        // The tag is the kernel's.
        let text = super::super::abi::KernelSource::Sketch.text();
        let line = text.lines().find(|l| l.starts_with("#define QS_SNAP_ALL_ROWS_TAG ")).unwrap();
        assert_eq!(line.split_whitespace().nth(2), Some(format!("{SNAP_ALL_ROWS_TAG}ull").as_str()));
    }

    #[test]
    fn regions_are_aligned_disjoint_and_cover_whole_rows() {
        for (m, n, k, a, d, count) in [
            (4096, 4096, 4096, Format::E4m3fn, Format::Bf16, 256),
            (1, 128256, 4096, Format::Bf16, Format::Bf16, 1),
            (57, 4097, 33, Format::E2m1, Format::F32, 57),
            (55, 3, 7, Format::Int4, Format::F16, 55),
        ] {
            let mut g = desc(m, n, k, a, d);
            g.a_scale = QsScaleDesc {
                ptr: 0x2000,
                format: Format::Ue8m0 as u32,
                grid_inner: k.div_ceil(32) as u32,
                block_inner: 32,
                block_outer: 1,
                storage: SCALE_SWIZZLED_128X4,
                ..QsScaleDesc::default()
            };
            g.c = g.d;
            g.bias = QsBiasDesc { ptr: 0x3000, extent: m, format: Format::Bf16 as u32, axis: BIAS_ROWS };
            let l = SnapshotLayout::new(&g, count, 132, u64::MAX).unwrap();
            let regions = [l.a, l.a_scale, l.c, l.d];
            let mut spans: Vec<(u64, u64)> =
                regions.iter().map(|r| (r.off, r.off + r.row_bytes * count)).collect();
            spans.push((l.bias_off, l.bias_off + 2 * count));
            spans.push((0, 64 + 8 * count)); // header and row list
            spans.sort();
            for w in spans.windows(2) {
                assert!(w[0].1 <= w[1].0, "{spans:?} overlap");
            }
            assert!(spans.last().unwrap().1 <= l.bytes);
            for r in regions {
                assert_eq!(r.off % REGION_ALIGN, 0);
                assert_eq!(r.row_bytes % ROW_ALIGN, 0);
            }
            assert!(l.a.row_bytes * 8 >= k * Format::from_u8(a as u8).unwrap().bits() as u64);
            assert!(l.d.row_bytes * 8 >= n * Format::from_u8(d as u8).unwrap().bits() as u64);
            assert_eq!(l.launch.grid[0] as u64, count);

            let base = 0x7f00_0000_0000;
            let p = l.packed_desc(&g, base);
            assert_eq!((p.m, p.batch), (count, 1));
            assert_eq!(p.a.ptr, base + l.a.off);
            // A row t holds K elements within its padded row, row-major, op(A) = A.
            assert!(p.a.ld >= k && p.a.extent == count * p.a.ld && p.a.trans == 0 && p.a.order == ORDER_ROW);
            assert!(p.d.ld >= n && p.c.ld == p.d.ld && p.c.ptr == base + l.c.off);
            assert_eq!(p.a_scale.storage, SCALE_OUTER_MAJOR);
            assert_eq!((p.a_scale.block_outer, p.a_scale.grid_outer), (1, count as u32));
            assert!(p.a_scale.ld >= p.a_scale.grid_inner as u64);
            assert_eq!((p.bias.ptr, p.bias.extent), (base + l.bias_off, count));
            // B is the call's own.
            assert_eq!(p.b, g.b);
        }
    }

    #[test]
    fn few_rows_get_slices_many_rows_one_per_row() {
        let g = desc(4096, 4096, 4096, Format::Bf16, Format::Bf16);
        let one = SnapshotLayout::new(&g, 1, 132, u64::MAX).unwrap();
        assert_eq!(one.launch.grid, [1, 2, 1]); // 4096 / 2048
        let lm = desc(1, 128256, 4096, Format::Bf16, Format::Bf16);
        assert_eq!(SnapshotLayout::new(&lm, 1, 132, u64::MAX).unwrap().launch.grid, [1, 63, 1]);
        let many = SnapshotLayout::new(&g, 256, 132, u64::MAX).unwrap();
        assert_eq!(many.launch.grid, [256, 2, 1]);
    }

    #[test]
    fn device_scalars_move_into_the_header_host_values_stay() {
        let mut g = desc(8, 64, 64, Format::E4m3fn, Format::Bf16);
        g.a_tensor_scale = QsScalar { value: 0.0, ptr: 0x5000, format: Format::F32 as u32, on_device: 1 };
        g.alpha = QsScalar { value: 2.0, ptr: 0, format: Format::F32 as u32, on_device: 0 };
        g.bias = QsBiasDesc { ptr: 0x3000, extent: 64, format: Format::Bf16 as u32, axis: BIAS_COLS };
        let l = SnapshotLayout::new(&g, 8, 132, u64::MAX).unwrap();
        let p = l.packed_desc(&g, 0x10000);
        assert_eq!(p.a_tensor_scale.ptr, 0x10000 + 16 + 8);
        assert_eq!(p.alpha, g.alpha);
        assert_eq!(p.bias, g.bias, "a column bias is a weight: not copied");
        assert_eq!(l.bias_off, 0);
        // The header offsets the kernel writes: scalars[i] at 16 + 8 i.
        assert_eq!(std::mem::offset_of!(QsSnapHeader, scalars), 16);
    }

    #[test]
    fn batched_weights_and_oversized_snapshots_are_refused() {
        let mut g = desc(16, 64, 64, Format::Bf16, Format::Bf16);
        g.batch = 4;
        g.b.batch_stride = 64 * 64;
        assert_eq!(SnapshotLayout::new(&g, 16, 132, u64::MAX), Err(NotDetachable::BatchedB));
        g.b.batch_stride = 0; // one weight shared by the batch: fine
        assert!(SnapshotLayout::new(&g, 16, 132, u64::MAX).is_ok());
        let big = desc(4096, 128256, 4096, Format::Bf16, Format::Bf16);
        assert!(matches!(SnapshotLayout::new(&big, 256, 132, 1 << 20), Err(NotDetachable::TooLarge { .. })));
    }
}
