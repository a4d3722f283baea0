/* Lane sums of fingerprint v3 on the CPU (definition: agents/fingerprint.py).
 *
 * Each piece is rows [row_begin, row_end) of one tensor's int32 words, viewed as [rows, 4096];
 * word i of a row with index r (counted from the tensor's start) has the weight
 * w_l = colw_l[i] + r * R_l, and adds (x ^ w_l) * (w_l | 1) to lane l, mod 2^32.
 * Rows go two at a time so each column weight is loaded once per pair: with both lanes'
 * 16 KiB tables that keeps the loop near memory speed. */
#include <stdint.h>
#include <string.h>

#define COLS 4096
#define W 8

/* GCC/Clang vector extensions: 8 x u32 (AVX2 where -march=native has it, else narrower or
 * scalar code, same results). Written out because auto-vectorizing the plain loop kept the
 * accumulators in memory (3x slower). */
typedef uint32_t v8 __attribute__((vector_size(4 * W)));

static inline v8 load8(const uint32_t *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint32_t hsum(v8 v) {
    uint32_t s = 0;
    for (int k = 0; k < W; k++) s += v[k];
    return s;
}

static void row_pair(const uint32_t *restrict xa, const uint32_t *restrict xb, const uint32_t *restrict c0,
                     const uint32_t *restrict c1, uint32_t ra0, uint32_t ra1, uint32_t R0, uint32_t R1,
                     uint32_t *s0, uint32_t *s1) {
    v8 a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0}, w;
    uint32_t rb0 = ra0 + R0, rb1 = ra1 + R1;
    for (int c = 0; c < COLS; c += W) {
        v8 u0 = load8(c0 + c), u1 = load8(c1 + c), va = load8(xa + c), vb = load8(xb + c);
        w = u0 + ra0; a0 += (va ^ w) * (w | 1u);
        w = u1 + ra1; a1 += (va ^ w) * (w | 1u);
        w = u0 + rb0; b0 += (vb ^ w) * (w | 1u);
        w = u1 + rb1; b1 += (vb ^ w) * (w | 1u);
    }
    *s0 += hsum(a0 + b0);
    *s1 += hsum(a1 + b1);
}

static void row_one(const uint32_t *restrict x, int64_t len, const uint32_t *restrict c0, const uint32_t *restrict c1,
                    uint32_t r0, uint32_t r1, uint32_t *s0, uint32_t *s1) {
    v8 a0 = {0}, a1 = {0}, w;
    int64_t c = 0;
    for (; c + W <= len; c += W) {
        v8 v = load8(x + c);
        w = load8(c0 + c) + r0; a0 += (v ^ w) * (w | 1u);
        w = load8(c1 + c) + r1; a1 += (v ^ w) * (w | 1u);
    }
    uint32_t t0 = hsum(a0), t1 = hsum(a1);
    for (; c < len; c++) {
        uint32_t w0 = c0[c] + r0, w1 = c1[c] + r1;
        t0 += (x[c] ^ w0) * (w0 | 1u);
        t1 += (x[c] ^ w1) * (w1 | 1u);
    }
    *s0 += t0;
    *s1 += t1;
}

void lockstep_lane_sums(int64_t npieces, const int64_t *ptrs, const int64_t *nwords, const int64_t *row_begin,
                        const int64_t *row_end, const uint32_t *colw, uint32_t R0, uint32_t R1, int64_t *out) {
    const uint32_t *c0 = colw, *c1 = colw + COLS;
    for (int64_t i = 0; i < npieces; i++) {
        const uint32_t *x = (const uint32_t *)(intptr_t)ptrs[i];
        int64_t n = nwords[i], r = row_begin[i], end = row_end[i], full = n / COLS;
        int64_t stop = end < full ? end : full;
        uint32_t s0 = 0, s1 = 0;
        for (; r + 1 < stop; r += 2)
            row_pair(x + r * COLS, x + (r + 1) * COLS, c0, c1, (uint32_t)r * R0, (uint32_t)r * R1, R0, R1, &s0, &s1);
        for (; r < end; r++) {
            int64_t len = n - r * COLS;
            row_one(x + r * COLS, len < COLS ? len : COLS, c0, c1, (uint32_t)r * R0, (uint32_t)r * R1, &s0, &s1);
        }
        out[2 * i] = s0;
        out[2 * i + 1] = s1;
    }
}
