/* The C helpers every generated CPU kernel file starts with (luminar/backends/cpu/render.py's
 * PRELUDE puts the includes and the target's vector width before them). */
/* vector variants from glibc's libmvec (what <math.h> declares only under -ffast-math). Not for
 * log2f: its vector variant rounds differently from the scalar one, so a value computed in a
 * vector loop and again in a scalar one compared unequal (amax's gradient tests x == max and
 * found no maximum: 0/0). */
extern float exp2f(float) __attribute__((simd("notinbranch")));
extern float sinf(float) __attribute__((simd("notinbranch")));
/* lm_dot16x2, the integer block dot: products of 16 + 16 int8 pairs a0.b0 + a1.b1, summed in fours
 * into 8 float lanes (exact integers). An operand is 16 bytes in a vector (lm_b16), unpacked there
 * (a nibble's shift and mask on all lanes). AVX2: maddubs multiplies unsigned by signed bytes and
 * adds pairs: a >= 0 (a nibble) goes in as it is; a signed a goes in as |a|, b with a's sign, exact
 * while b > -128 (_dot_operands orders the operands so); a pair sum is at most 2 * 128 * 127 < 2^15.
 * llama.cpp's Q4 x Q8 form: a dot of int16-widened bytes (pmaddwd) on bytes staged through the
 * stack was 1.4x slower (Zen 3). */
typedef float lm_v8 __attribute__((vector_size(32)));
typedef unsigned char lm_b16 __attribute__((vector_size(16)));
static inline lm_b16 lm_bytes16(const void *p) { lm_b16 v; __builtin_memcpy(&v, p, 16); return v; }
#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
/* lm_f16: IEEE half bits to float, by F16C's vcvtph2ps where there is one: gcc's own conversion of
 * a _Float16 is, with AVX512-FP16, a vcvtsh2ss that merges into the register it wrote before, a
 * dependency chain through a loop (a quantized matvec's per-block scales: 2x its time, one
 * Sapphire Rapids core). */
#ifdef __F16C__
static inline float lm_f16(unsigned short h) { return _cvtsh_ss(h); }
#else
static inline float lm_f16(unsigned short h) { _Float16 f; __builtin_memcpy(&f, &h, 2); return (float)f; }
#endif
static inline lm_v8 lm_dot16x2(lm_b16 a0, lm_b16 b0, lm_b16 a1, lm_b16 b1, int a_signed) {
#ifdef __AVX2__
    __m256i a = _mm256_set_m128i((__m128i)a1, (__m128i)a0), b = _mm256_set_m128i((__m128i)b1, (__m128i)b0);
    if (a_signed) { b = _mm256_sign_epi8(b, a); a = _mm256_sign_epi8(a, a); }
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)  /* the same products summed in fours, one instruction */
    return (lm_v8)_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b));
#else
    return (lm_v8)_mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
#endif
#else
    lm_v8 sum = {0};  /* the same lanes: byte j of a0 a1 times byte j of b0 b1 into lane j / 4 */
    for (int j = 0; j < 32; j++)  /* (an unsigned a is below 128: the same as a signed char) */
        sum[j / 4] += (float)(j < 16 ? (signed char)a0[j] * (signed char)b0[j] : (signed char)a1[j - 16] * (signed char)b1[j - 16]);
    return sum;
#endif
}
/* 2 or 4 blocks' bytes in 64 (block_dot): lm_dot32 sums products in fours, block b's into its lanes */
typedef float lm_v16 __attribute__((vector_size(64)));
typedef unsigned char lm_b64 __attribute__((vector_size(64)));
static inline void lm_f16x16(float *out, const unsigned short *h, long long n) {  /* up to 16 halves */
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(n >= 16 ? 0xffff : (1u << n) - 1, h)));
#else
    for (long long j = 0; j < n && j < 16; j++) out[j] = lm_f16(h[j]);
#endif
}
#ifdef __AVX512BW__
static inline lm_b64 lm_bytes16x4(const void *p, long long stride) {  /* 16 bytes at p + b * stride, b < 4 */
    const char *c = (const char *)p;
    if (stride == 16) return (lm_b64)_mm512_loadu_si512(c);
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)c));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c + stride)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c + 2 * stride)), 2);
    return (lm_b64)_mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(c + 3 * stride)), 3);
}
static inline __m512i lm_dot32(__m512i a, __m512i b, int a_signed, __m512i sum) {  /* sum + a.b in fours */
    if (a_signed) { b = _mm512_mask_sub_epi8(b, _mm512_movepi8_mask(a), _mm512_setzero_si512(), b); a = _mm512_abs_epi8(a); }
#ifdef __AVX512VNNI__
    return _mm512_dpbusd_epi32(sum, a, b);
#else
    return _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(a, b), _mm512_set1_epi16(1)));
#endif
}
static inline lm_v16 lm_spread4(const float *s) {  /* s[b] into lanes 4b..4b+3, b < 4 */
    return (lm_v16)_mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), _mm512_castps128_ps512(_mm_loadu_ps(s)));
}
static inline lm_v16 lm_spread2(const float *s) {  /* s[b] into lanes 8b..8b+7, b < 2 */
    const __m128 two = _mm_castpd_ps(_mm_load_sd((const double *)s));
    return (lm_v16)_mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), _mm512_castps128_ps512(two));
}
#endif
static inline float lm_index_float(long long x) { return (float)(int)(x >> 24) * 16777216.0f + (float)(int)(x & 0xffffff); }
static inline float lm_bf16(unsigned short b) { union { uint32_t u; float f; } v = { (uint32_t)b << 16 }; return v.f; }
/* exp2 as inline arithmetic rather than libmvec's exp2f: that one takes a slow per-lane path for
 * results outside the normal floats (masked attention scores below -126 made a causal softmax
 * ~10x slower), and gcc cannot be kept from calling it on such lanes. 2^x = 2^f * 2^n with n =
 * rint(x), 2^f by a degree-6 polynomial on [-0.5, 0.5] (fitted here; relative error < 8e-8, about
 * 1 ulp). 2^n is split as 2^h * 2^(n-h), h = n clamped to [-125, 127]: 2^h goes into p's exponent
 * bits (p * 2^h stays a normal float), 2^(n-h) is a normal float, and their one product rounds
 * once, so overflow gives inf, underflow 0 and subnormal results are right. NaN stays NaN.
 * (Clamping x to [-251, 254] first costs two ops where range tests and selects cost six: 1.4x
 * the throughput of the previous form with its per-case selects.) */
static inline float lm_exp2(float x) {
    const float c = x < -251.0f ? -251.0f : (x > 254.0f ? 254.0f : x);
    const float n = rintf(c), f = c - n;
    float p = 0.00015345806605182588f;
    p = p * f + 0.0013399932067841291f;
    p = p * f + 0.009618489071726799f;
    p = p * f + 0.05550328642129898f;
    p = p * f + 0.24022646248340607f;
    p = p * f + 0.6931471824645996f;
    p = p * f + 1.0f;
    const int32_t e = (int32_t)n, h = e < -125 ? -125 : (e > 127 ? 127 : e);
    union { float f; int32_t i; } a = { p }, b = { .i = (e - h + 127) << 23 };
    a.i += h * (1 << 23);
    return x != x ? x : a.f * b.f;
}
