// Element-wise probes of the device helpers for the GPU selftest: every decoder code, the
// encoders, hash3 / probe signs / row permutation and the scale-entry mapping, written out so
// the host can compare them bit for bit with formats.rs, rng.rs, sketch.rs and problem.rs.
// No defines. Entries: qs_selftest_decode, qs_selftest_encode, qs_selftest_hash,
// qs_selftest_window, qs_selftest_scale_entry, qs_selftest_late_copy, qs_selftest_early_probe
// (one QsSelftestParams by value, any grid, any block size).
#include "qs_device.h"

#define QS_FOR_EACH(i, n) for (qs_u64 i = (qs_u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (qs_u64)gridDim.x * blockDim.x)

QS_GLOBAL void qs_selftest_decode(QsSelftestParams P) {
    const qs_u32* in = (const qs_u32*)P.in_ptr;
    double* out = (double*)P.out_ptr;
    QS_FOR_EACH(i, P.n) {
        out[2 * i] = qs_decode_f64_rt(P.format, in[i]);
        out[2 * i + 1] = (double)qs_decode_f32_rt(P.format, in[i]);
    }
}

QS_GLOBAL void qs_selftest_encode(QsSelftestParams P) {
    const double* in = (const double*)P.in_ptr;
    qs_u32* out = (qs_u32*)P.out_ptr;
    QS_FOR_EACH(i, P.n) out[i] = qs_encode_rt(P.format, in[i]);
}

QS_GLOBAL void qs_selftest_hash(QsSelftestParams P) {
    const qs_u64* in = (const qs_u64*)P.in_ptr;
    qs_u64* out = (qs_u64*)P.out_ptr;
    QS_FOR_EACH(i, P.n) {
        out[3 * i] = qs_hash3(P.seed, P.stream, in[i]);
        out[3 * i + 1] = qs_probe_negative(P.seed, (qs_u32)P.stream, in[i]);
        out[3 * i + 2] = qs_perm_row(P.perm_a, P.perm_b, P.total, P.stride, P.epoch, in[i]);
    }
}

// Rows of eager windows through qs_rows_at (QS_ROWS_WINDOW): start in P.stride, t from in_ptr;
// ~0 where qs_rows_at refuses the row.
QS_GLOBAL void qs_selftest_window(QsSelftestParams P) {
    const qs_u64* in = (const qs_u64*)P.in_ptr;
    qs_u64* out = (qs_u64*)P.out_ptr;
    QsRowSel r;
    r.total_rows = P.total;
    r.count = P.n;
    r.stride = P.stride;
    r.perm_a = P.perm_a;
    r.perm_b = P.perm_b;
    r.list_ptr = r.epoch_ptr = 0;
    r.epoch_value = P.epoch;
    r.mode = QS_ROWS_WINDOW;
    r.advance_epoch = 0;
    QS_FOR_EACH(i, P.n) {
        qs_u64 row = 0;
        out[i] = qs_rows_at(r, qs_rows_epoch(r), in[i], &row, 0) ? row : ~0ull;
    }
}

QS_GLOBAL void qs_selftest_scale_entry(QsSelftestParams P) {
    const qs_u64* in = (const qs_u64*)P.in_ptr;
    qs_u64* out = (qs_u64*)P.out_ptr;
    const QsScaleLookup s = qs_scale_lookup(P.scale);
    QS_FOR_EACH(i, P.n) out[i] = qs_scale_entry(s, in[3 * i], in[3 * i + 1], in[3 * i + 2]);
}

// The early-start selftest's kernel ahead of a check: lets kernels launched early behind it start
// at once, waits `stream` ns, then copies n u32 words from in_ptr to out_ptr. A check started
// early behind it must judge the words copied, never what out_ptr held before.
QS_GLOBAL void qs_selftest_late_copy(QsSelftestParams P) {
    qs_launch_dependents();
    qs_sleep_ns(P.stream);
    QS_FOR_EACH(i, P.n) ((qs_u32*)P.out_ptr)[i] = ((const qs_u32*)P.in_ptr)[i];
}

// Whether an early start takes effect: launched early behind the late writer, block 0 stores the
// global timer before and after its wait at out_ptr[0], out_ptr[1] (ns). Started early, the two
// are the writer's remaining sleep apart; started in order, about nothing.
QS_GLOBAL void qs_selftest_early_probe(QsSelftestParams P) {
    qs_u64 before = 0, after = 0;
#if defined(QS_CUDA) && defined(__CUDA_ARCH__)
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(before));
#endif
    qs_wait_prior_grid();
#if defined(QS_CUDA) && defined(__CUDA_ARCH__)
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(after));
#endif
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        ((qs_u64*)P.out_ptr)[0] = before;
        ((qs_u64*)P.out_ptr)[1] = after;
    }
}
