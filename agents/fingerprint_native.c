/* Lane sums of fingerprint v3 on the CPU (definition: agents/fingerprinting.py).
 *
 * Each piece is rows [row_begin, row_end) of one tensor's int32 words, viewed as [rows, 4096];
 * word i of a row with index r (counted from the tensor's start) has the weight
 * w_l = colw_l[i] + r * R_l, and adds (x ^ w_l) * (w_l | 1) to lane l, mod 2^32.
 * Rows go BLOCK at a time so each column weight is loaded once per block: both lanes' tables
 * (32 KiB) fill a typical L1 cache, and reading them once per row pair made those loads the
 * limit (the block loop ran 1.7x faster on one core of a 2-core EPYC, with AVX-512 or AVX2
 * code, 2026-12-05; `python -m bench fingerprint --device cpu` measures it in place).
 *
 * With `stats` set for a piece (float32 gradients), the same pass also sums the squares of the
 * values (float lanes per row, double across rows), so the gradient norm costs no second read of
 * the memory and one fused multiply-add per vector. Non-finite elements are counted from it: a
 * finite float sum of squares proves every value of those rows finite (inf and NaN propagate,
 * squares never cancel); only rows whose sum is not finite (a NaN or inf, or finite values so big
 * their squares overflow) are read again, counting exponent-all-ones words and summing squares in
 * double. With the tables read once per block the loop is ALU-bound, so each vector op saved shows. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef COLS
#error "COLS (the row width) is passed by fingerprint_native.py, its one definition"
#endif
#define W 8
#define BLOCK 8 /* rows per block; row_pair and row_one take the rest */
#define INLINE static inline __attribute__((always_inline))

/* GCC/Clang vector extensions: 8 x u32 (AVX2 where -march=native has it, else narrower or
 * scalar code, same results). Written out because auto-vectorizing the plain loop kept the
 * accumulators in memory (3x slower). */
typedef uint32_t v8 __attribute__((vector_size(4 * W)));
typedef float v8f __attribute__((vector_size(4 * W)));

typedef struct {
    uint32_t s0, s1; /* the two lane sums, mod 2^32 */
    double sq;       /* sum of squares (stats only) */
    int64_t nonfinite;
} Acc;

INLINE v8 load8(const uint32_t *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE uint32_t hsum(v8 v) {
    uint32_t s = 0;
    for (int k = 0; k < W; k++) s += v[k];
    return s;
}

INLINE double hsumf(v8f v) {
    double s = 0;
    for (int k = 0; k < W; k++) s += v[k];
    return s;
}

INLINE void stats1(uint32_t v, Acc *a) {
    float f;
    memcpy(&f, &v, sizeof f);
    a->sq += (double)f * f;
    a->nonfinite += (v & 0x7f800000u) == 0x7f800000u;
}

/* Fold one row group's float sum of squares into acc; the exact slow path when it is not finite. */
INLINE void fold_stats(v8f sq, const uint32_t *x, int64_t len, const uint32_t *y, int64_t leny, Acc *acc) {
    double s = hsumf(sq);
    if (isfinite(s)) {
        acc->sq += s;
        return;
    }
    for (int64_t c = 0; c < len; c++) stats1(x[c], acc);
    for (int64_t c = 0; c < leny; c++) stats1(y[c], acc);
}

INLINE void row_pair(const uint32_t *restrict xa, const uint32_t *restrict xb, const uint32_t *restrict c0,
                     const uint32_t *restrict c1, uint32_t ra0, uint32_t ra1, uint32_t R0, uint32_t R1, Acc *acc,
                     const int stats) {
    v8 a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0}, w;
    v8f sqa = {0}, sqb = {0}; /* one chain per row: a single one made the float adds' latency the limit */
    uint32_t rb0 = ra0 + R0, rb1 = ra1 + R1;
    for (int c = 0; c < COLS; c += W) {
        v8 u0 = load8(c0 + c), u1 = load8(c1 + c), va = load8(xa + c), vb = load8(xb + c);
        w = u0 + ra0; a0 += (va ^ w) * (w | 1u);
        w = u1 + ra1; a1 += (va ^ w) * (w | 1u);
        w = u0 + rb0; b0 += (vb ^ w) * (w | 1u);
        w = u1 + rb1; b1 += (vb ^ w) * (w | 1u);
        if (stats) {
            v8f fa = (v8f)va, fb = (v8f)vb;
            sqa += fa * fa;
            sqb += fb * fb;
        }
    }
    acc->s0 += hsum(a0 + b0);
    acc->s1 += hsum(a1 + b1);
    if (stats) fold_stats(sqa + sqb, xa, COLS, xb, COLS, acc);
}

/* BLOCK consecutive full rows. Each row keeps its own float chain of squares and rows fold in pairs,
 * as in row_pair, so the sums of squares are the same whichever loop reads a row. */
INLINE void row_block(const uint32_t *restrict x, const uint32_t *restrict c0, const uint32_t *restrict c1,
                      uint32_t r0, uint32_t r1, uint32_t R0, uint32_t R1, Acc *acc, const int stats) {
    v8 s0 = {0}, s1 = {0}, t0 = {0}, t1 = {0};
    v8f sq[BLOCK] = {{0}};
    for (int c = 0; c < COLS; c += W) {
        v8 w0 = load8(c0 + c) + r0, w1 = load8(c1 + c) + r1; /* row k's weights: + k * R */
        for (int k = 0; k < BLOCK; k += 2) {
            v8 va = load8(x + k * COLS + c), vb = load8(x + (k + 1) * COLS + c);
            s0 += (va ^ w0) * (w0 | 1u);
            s1 += (va ^ w1) * (w1 | 1u);
            w0 += R0;
            w1 += R1;
            t0 += (vb ^ w0) * (w0 | 1u);
            t1 += (vb ^ w1) * (w1 | 1u);
            w0 += R0;
            w1 += R1;
            if (stats) {
                v8f fa = (v8f)va, fb = (v8f)vb;
                sq[k] += fa * fa;
                sq[k + 1] += fb * fb;
            }
        }
    }
    acc->s0 += hsum(s0 + t0);
    acc->s1 += hsum(s1 + t1);
    if (stats)
        for (int k = 0; k < BLOCK; k += 2)
            fold_stats(sq[k] + sq[k + 1], x + k * COLS, COLS, x + (k + 1) * COLS, COLS, acc);
}

INLINE void row_one(const uint32_t *restrict x, int64_t len, const uint32_t *restrict c0, const uint32_t *restrict c1,
                    uint32_t r0, uint32_t r1, Acc *acc, const int stats) {
    v8 a0 = {0}, a1 = {0}, w;
    v8f sq = {0};
    int64_t c = 0;
    for (; c + W <= len; c += W) {
        v8 v = load8(x + c);
        w = load8(c0 + c) + r0; a0 += (v ^ w) * (w | 1u);
        w = load8(c1 + c) + r1; a1 += (v ^ w) * (w | 1u);
        if (stats) {
            v8f f = (v8f)v;
            sq += f * f;
        }
    }
    acc->s0 += hsum(a0);
    acc->s1 += hsum(a1);
    if (stats) fold_stats(sq, x, c, x, 0, acc);
    for (; c < len; c++) {
        uint32_t w0 = c0[c] + r0, w1 = c1[c] + r1;
        acc->s0 += (x[c] ^ w0) * (w0 | 1u);
        acc->s1 += (x[c] ^ w1) * (w1 | 1u);
        if (stats) stats1(x[c], acc);
    }
}

INLINE void piece(const uint32_t *x, int64_t n, int64_t r, int64_t end, const uint32_t *c0, const uint32_t *c1,
                  uint32_t R0, uint32_t R1, Acc *acc, const int stats) {
    int64_t full = n / COLS, stop = end < full ? end : full;
    for (; r + BLOCK <= stop; r += BLOCK)
        row_block(x + r * COLS, c0, c1, (uint32_t)r * R0, (uint32_t)r * R1, R0, R1, acc, stats);
    for (; r + 1 < stop; r += 2)
        row_pair(x + r * COLS, x + (r + 1) * COLS, c0, c1, (uint32_t)r * R0, (uint32_t)r * R1, R0, R1, acc, stats);
    for (; r < end; r++) {
        int64_t len = n - r * COLS;
        row_one(x + r * COLS, len < COLS ? len : COLS, c0, c1, (uint32_t)r * R0, (uint32_t)r * R1, acc, stats);
    }
}

/* out[4 * i ...]: lane sum 0, lane sum 1, the bits of the double sum of squares, non-finite count.
 * Pieces run on up to `threads` OpenMP threads. The OpenMP build is linked against the runtime
 * file torch loaded (fingerprint_native.py), so the pieces run on torch's own intra-op threads,
 * which still spin-wait from the backward pass when the optimizer hook calls this; a pool of our
 * own would have to share the cores with them. */
void lockstep_lane_sums(int64_t npieces, const int64_t *ptrs, const int64_t *nwords, const int64_t *row_begin,
                        const int64_t *row_end, const int64_t *stats, const uint32_t *colw, uint32_t R0, uint32_t R1,
                        int64_t *out, int threads) {
    const uint32_t *c0 = colw, *c1 = colw + COLS;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < npieces; i++) {
        const uint32_t *x = (const uint32_t *)(intptr_t)ptrs[i];
        Acc acc = {0, 0, 0.0, 0};
        if (stats[i])
            piece(x, nwords[i], row_begin[i], row_end[i], c0, c1, R0, R1, &acc, 1);
        else
            piece(x, nwords[i], row_begin[i], row_end[i], c0, c1, R0, R1, &acc, 0);
        out[4 * i] = acc.s0;
        out[4 * i + 1] = acc.s1;
        memcpy(&out[4 * i + 2], &acc.sq, sizeof acc.sq);
        out[4 * i + 3] = acc.nonfinite;
    }
}
