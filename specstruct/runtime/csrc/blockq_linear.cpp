// A Linear kernel on block-quantized weights (GGUF's Q8_0, Q6_K, Q5_K, Q5_1, Q5_0, Q4_K, Q4_1, Q4_0, IQ4_XS, IQ4_NL,
// Q3_K, Q2_K as they ship) whose result for a row never depends on the other rows: y = x W^T, float32 in and out, CPU.
//
// Weights. Every format is held as unsigned integers u (2 to 8 bits) with, per group of G inputs of one output
// (G = 16 or 32, the format's own sub-block), a float32 scale d and either an integer zero point z of the whole
// tensor (w = d * (u - z): Q8_0, Q5_0, Q4_0, Q6_K, Q3_K) or a float32 min m (w = d * u - m: Q4_K, Q5_K, Q2_K, and
// Q4_1, Q5_1 with m the negated fp16 min they ship). These are the format's values exactly. IQ4_NL and IQ4_XS keep
// their 4-bit codes: the kernel turns each code into kvalues_iq4nl[code] + 128 through one table lookup per vector
// (VPSHUFB), a zero point of 128, as ggml does. K-quants and IQ4_XS keep their two levels, as they ship: d = D * sc
// and m = Dmin * mc, a float32 D (Dmin) per super-block of `gps` groups and a small integer sc (mc) per group, whose
// product is exact in float32 (an fp16 times an integer of at most 8 bits), so a group costs 1-2 bytes of scales
// per output, not 4-8. Every D is the file's own fp16 (widening it is exact).
// The integers are planes as the formats ship them: a low plane of 4 bits (2 bits for Q3_K and Q2_K; 8-bit weights
// are whole bytes) plus one plane per higher bit, one 64-bit mask per quad vector and bit (Q5_0/Q5_1/Q5_K: 4 + 1,
// Q6_K: 4 + 2, Q3_K: 2 + 1). Bytes per weight held: Q2_K 0.39, Q3_K 0.45, IQ4_XS 0.54, Q4_K 0.58, IQ4_NL 0.56,
// Q4_0 0.56, Q4_1 0.63, Q5_K 0.70, Q5_0 0.69, Q5_1 0.75, Q6_K 0.82, Q8_0 1.06 (the files: 0.33, 0.43, 0.53, 0.56,
// 0.56, 0.56, 0.63, 0.69, 0.69, 0.75, 0.82, 1.06; Q2_K's and Q3_K's 4- and 6-bit sub-scales take a byte each).
// They are packed once (quantized.py) into panels of 16 outputs:
// for each group, its G/4 quads of 4 inputs, each quad as 16 outputs x 4 bytes (one 512-bit vector); a low plane of
// L bits holds 8/L quads per vector: quad i in bits 0..L-1, quad i + Q*L/8 in bits L..2L-1, ... (Q = G/4 quads).
//
// Activations. Each row of x is quantized on its own, per group of G inputs, to int8 with scale s = max|x|/127
// (round to nearest even) and the group's sum A of those int8 values: a row's quantization depends on that row
// alone.
//
// Sums. For each output, for each group in increasing order: the exact integer dot product D of u and the int8
// activations (VPDPBUSD), then acc += float(D - z*A) * (d*s) (symmetric) or acc += s * fma(d, float(D), -(m*A))
// (affine), one fused multiply-add per group. That order depends on K and G alone: not on how many rows are in
// the call, a row's place among them, the panel split between threads or the vector unit, so a row computed
// alone is bitwise the same row computed among any others. The AVX2 path (D from VPMADDUBSW pair sums, exact)
// and the scalar path do the same float operations in the same order, so all three give the same bits: a
// model's output does not depend on the machine's vector unit (tests build the AVX2 one on an AVX-512 CPU).
//
// Speed: one row streams the packed bytes once (0.39-1.1 bytes per weight instead of float32's 4); the rows of a
// call are taken up to MB at a time against one panel, so each weight vector loaded (and each low-plane vector
// unpacked) serves them all; a panel (a few KB to 150 KB) stays in cache while every block of rows uses it. On the
// AVX-512 path a block's activations, scales and sums are laid out group-major once per call (its rows of a group
// side by side), so the row loop reads them at constant offsets from one pointer, and D becomes a float by the bits
// of 1.5 * 2^23 + D (the even chain starts there) rather than VCVTDQ2PS, which shares VPDPBUSD's port on Intel:
// prefill runs close to the VPDPBUSD throughput of a core. Where the CPU has AMX and the OS grants it, 16 rows and
// more run on tiles instead (one TDPBSUD a group of 16 rows, the same float operations after it: see "AMX" below).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define SPECSTRUCT_VNNI 1
#define SPECSTRUCT_VECTOR 1
static const char* SIMD = "avx512-vnni";
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define SPECSTRUCT_AVX2 1
#define SPECSTRUCT_VECTOR 1
#ifdef __AVXVNNI__
static const char* SIMD = "avx-vnni";  // AVX2 with 256-bit VPDPBUSD (Intel since Alder Lake, AMD since Zen 5)
#else
static const char* SIMD = "avx2";
#endif
#else
static const char* SIMD = "scalar";
#endif

constexpr int NO = 16;  // outputs per panel
template <int G>
constexpr int64_t KGPS = 256 / G;  // groups per super-block of a K-quant (the vector path's only sub-scaled formats)
#ifndef PREFETCH_GROUPS
#define PREFETCH_GROUPS 16
#endif
constexpr int64_t PREFETCH = PREFETCH_GROUPS;  // groups ahead to prefetch in a panel's stream
#ifdef SPECSTRUCT_AVX2
constexpr int MB = 6;  // the most rows per block: 6 accumulators + 8 weight vectors fit in 16 registers
#else
constexpr int MB = 16;  // the most rows per block: 16 accumulators + 8 weight vectors + scales fit in 32 registers
#endif

struct Format {
  int G;      // inputs per group
  int bits;   // 2, 3, 4, 5, 6 or 8
  int zero;   // the zero point z, or -1: affine (a float min per group)
  int gps;    // groups per super-block: 1, a float scale per group; more, a float per super-block times an int8 per group
  bool lut;   // 4-bit codes through kvalues_iq4nl: u = IQ4NL[code] + 128 (IQ4_NL, IQ4_XS)
};

// The formats the vector paths compute, as (G, bits, affine, sub-scaled, table): Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, IQ4_NL,
// IQ4_XS, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K; any other layout runs on the scalar path.
#define EACH_FORMAT(F)                                                                                             \
  F(32, 8, false, false, false) F(32, 4, false, false, false) F(32, 5, false, false, false)                      \
  F(32, 4, true, false, false) F(32, 5, true, false, false) F(32, 4, false, false, true)                         \
  F(32, 4, false, true, true) F(32, 4, true, true, false) F(32, 5, true, true, false) F(16, 6, false, true, false) \
  F(16, 3, false, true, false) F(16, 2, true, true, false)

// The width of a format's low plane: 8-bit weights are whole bytes, 4 to 6 bits a 4-bit plane, 2 and 3 a 2-bit one.
static constexpr int low_bits(int bits) { return bits >= 8 ? 8 : (bits >= 4 ? 4 : 2); }

// ggml's kvalues_iq4nl: the 16 values an IQ4_NL / IQ4_XS code stands for.
static const int8_t IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Where a panel's scales are: super [nsb][16] fp16 (and supermin), sub [ng][16] int8 (and submin) when gps > 1.
struct Scales {
  const c10::Half* super;
  const c10::Half* supermin;
  const int8_t* sub;
  const int8_t* submin;
};

// The scale (and min) of group g, output o: D * sc exactly as the format defines it.
static inline float scale_at(const Format& f, const Scales& s, int64_t g, int o) {
  return f.gps == 1 ? (float)s.super[g * 16 + o] : (float)s.super[(g / f.gps) * 16 + o] * (float)s.sub[g * 16 + o];
}
static inline float min_at(const Format& f, const Scales& s, int64_t g, int o) {
  return f.gps == 1 ? (float)s.supermin[g * 16 + o]
                    : (float)s.supermin[(g / f.gps) * 16 + o] * (float)s.submin[g * 16 + o];
}

static inline int64_t group_bytes(const Format& f) { return (int64_t)f.G * NO * f.bits / 8; }

// One group of G inputs -> int8 q, scale s = max|x|/127, sum A of q (all zero, scale NaN, when an input is NaN or
// infinite: its outputs are NaN, as in float).
static inline void quantize_group(const float* xg, int G, int8_t* qg, float* s, int32_t* a) {
  float amax = 0.f;
  bool finite = true;
  for (int i = 0; i < G; ++i) {
    amax = std::max(amax, std::fabs(xg[i]));
    finite = finite && std::isfinite(xg[i]);
  }
  int32_t sum = 0;
  if (!finite) {
    std::memset(qg, 0, G);
  } else {
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    for (int i = 0; i < G; ++i) {
      const int v = (int)std::nearbyint(xg[i] * inv);  // to nearest, ties to even
      qg[i] = (int8_t)std::max(-127, std::min(127, v));
      sum += qg[i];
    }
  }
  *s = finite ? amax / 127.f : NAN;
  *a = sum;
}

#ifdef SPECSTRUCT_VNNI
// quantize_group for G a multiple of 16, 16 inputs per vector: the same values (the max is exact, x * inv is one
// float multiply as there, and the conversion rounds to nearest even as nearbyint does).
static inline void quantize_group_vnni(const float* xg, int G, int8_t* qg, float* s, int32_t* a) {
  __m512 vmax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int i = 0; i < G; i += 16) {
    const __m512 v = _mm512_loadu_ps(xg + i);
    vmax = _mm512_max_ps(vmax, _mm512_abs_ps(v));
    bad |= _mm512_fpclass_ps_mask(v, 0x01 | 0x80 | 0x08 | 0x10);  // NaN (quiet, signalling), +inf, -inf
  }
  if (bad) {
    std::memset(qg, 0, G);
    *s = NAN;
    *a = 0;
    return;
  }
  const float amax = _mm512_reduce_max_ps(vmax);
  const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  __m512i sum = _mm512_setzero_si512();
  for (int i = 0; i < G; i += 16) {
    __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + i), inv));  // MXCSR: to nearest, ties to even
    v = _mm512_max_epi32(_mm512_set1_epi32(-127), _mm512_min_epi32(_mm512_set1_epi32(127), v));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qg + i), _mm512_cvtepi32_epi8(v));
    sum = _mm512_add_epi32(sum, v);
  }
  *s = amax / 127.f;
  *a = _mm512_reduce_add_epi32(sum);
}
#endif

// x [M, K] float32 -> int8 [M, K], scale [M, K/G], sum [M, K/G]; `vector`: 16 inputs at a time where built (the
// same values). `block` > 1: in blocks of that many rows (the last one fewer, or as many with `pad`: its missing
// rows left as they are), each block group-major, its rows of a group side by side: row r0 + r's group g at
// r0 * K + (g * R + r) * G (scale and sum at r0 * K/G + g * R + r), R the block's rows; 1: row-major.
static void quantize_rows(const float* x, int64_t M, int64_t K, int G, int8_t* q, float* s, int32_t* a,
                          bool vector, int64_t block, bool pad = false) {
  const int64_t ng = K / G;
  at::parallel_for(0, M, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t first = r - r % block, R = pad ? block : std::min(block, M - first), rr = r - first;
      for (int64_t g = 0; g < ng; ++g) {
        const int64_t from = r * K + g * G, to = first * K + (g * R + rr) * G, at = first * ng + g * R + rr;
#ifdef SPECSTRUCT_VNNI
        if (vector && G % 16 == 0) {
          quantize_group_vnni(x + from, G, q + to, s + at, a + at);
          continue;
        }
#endif
        quantize_group(x + from, G, q + to, s + at, a + at);
      }
    }
  });
}

// The unsigned weight of output o, input k (within its group's panel block) -- for the scalar path and de-quantizing.
static inline int weight_at(const uint8_t* gb, const Format& f, int o, int k) {
  const int quad = k / 4, j = k % 4;
  if (f.bits == 8) return gb[(quad * NO + o) * 4 + j];
  const int lb = low_bits(f.bits), vectors = f.G / 4 * lb / 8;  // quad vectors of the low plane
  const uint8_t b = gb[((quad % vectors) * NO + o) * 4 + j];
  int u = (b >> (lb * (quad / vectors))) & ((1 << lb) - 1);
  for (int b = 0; b < f.bits - lb; ++b) {  // bit o*4+j of the quad's 64-bit mask for bit lb + b
    const uint8_t* high = gb + f.G * NO * lb / 8 + (quad * (f.bits - lb) + b) * 8;
    u |= ((high[o / 2] >> ((o % 2) * 4 + j)) & 1) << (lb + b);
  }
  return f.lut ? IQ4NL[u] + 128 : u;
}

// Rows [0, R) against one panel: scalar, the same float operations in the same order as the vector path.
static void panel_scalar(const Format& f, int R, const uint8_t* w, const Scales& sc, int64_t ng,
                         const int8_t* q, const float* s, const int32_t* a, int64_t K, float* y, int64_t ldy,
                         int ncols) {
  for (int r = 0; r < R; ++r) {
    float acc[NO];
    for (int o = 0; o < NO; ++o) acc[o] = 0.f;
    for (int64_t g = 0; g < ng; ++g) {
      const uint8_t* gb = w + g * group_bytes(f);
      const int8_t* qg = q + r * K + g * f.G;
      const float sa = s[r * ng + g];
      const int32_t A = a[r * ng + g];
      for (int o = 0; o < NO; ++o) {
        int32_t D = 0;
        for (int k = 0; k < f.G; ++k) D += weight_at(gb, f, o, k) * (int32_t)qg[k];
        if (f.zero >= 0) {
          acc[o] = std::fma((float)(D - f.zero * A), scale_at(f, sc, g, o) * sa, acc[o]);
        } else {
          const float inner = std::fma(scale_at(f, sc, g, o), (float)D, -(min_at(f, sc, g, o) * (float)A));
          acc[o] = std::fma(inner, sa, acc[o]);
        }
      }
    }
    for (int o = 0; o < ncols; ++o) y[r * ldy + o] = acc[o];
  }
}

#ifdef SPECSTRUCT_VNNI
// 1.5 * 2^23: the floats MAGIC + D for integers |D| < 2^22 are exact, their bits MAGIC_BITS + D. Every group's D is
// below 2^22 in magnitude (32 inputs x 255 x 127 at most).
constexpr float MAGIC = 12582912.f;
constexpr int32_t MAGIC_BITS = 0x4B400000;
static inline __m512 half16(const c10::Half* p) {  // 16 fp16 values widened (exactly) to float32
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// acc + VPDPBUSD(w, the 4 int8 activations at q in every lane), the activations read by the instruction's own
// broadcast ({1to16}): one instruction, not a VPBROADCASTD and a VPDPBUSD as the compiler writes the intrinsics
// (1-7% faster at 2-256 rows on a 2-core AMD EPYC, Zen 4, `python -m benchmarks.blockq_ab`; the same bits).
static inline __m512i dpbusd_broadcast(__m512i acc, __m512i w, const int32_t* q) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*q));
  return acc;
}

// One group's weights as QUADS vectors of 16 outputs x 4 inputs, unsigned (the low plane, the high bits, the IQ4
// table): the operands of VPDPBUSD (and the rows of the AMX path's weight tile).
template <int G, int BITS, bool LUT>
static inline void unpack_group(const uint8_t* __restrict gb, __m512i* wv) {
  constexpr int QUADS = G / 4;
  constexpr int LB = low_bits(BITS), PER = 8 / LB, NV = QUADS / PER;  // the low plane: PER quads per vector
  if constexpr (BITS == 8) {
#pragma GCC unroll 8
    for (int i = 0; i < QUADS; ++i) wv[i] = _mm512_loadu_si512(gb + 64 * i);
  } else {
    const __m512i low = _mm512_set1_epi8((char)((1 << LB) - 1));
#pragma GCC unroll 4
    for (int i = 0; i < NV; ++i) {
      const __m512i v = _mm512_loadu_si512(gb + 64 * i);
#pragma GCC unroll 4
      for (int j = 0; j < PER; ++j) wv[i + j * NV] = _mm512_and_si512(_mm512_srli_epi16(v, LB * j), low);
    }
    if constexpr (BITS > LB) {  // the high bit planes: for quad i, bit b, a 64-bit mask of the bytes that have it
      const uint8_t* high = gb + G * NO * LB / 8;
#pragma GCC unroll 8
      for (int i = 0; i < QUADS; ++i)
#pragma GCC unroll 2
        for (int b = 0; b < BITS - LB; ++b) {
          uint64_t bits;
          std::memcpy(&bits, high + (i * (BITS - LB) + b) * 8, 8);
          wv[i] = _mm512_or_si512(wv[i],
                                  _mm512_maskz_mov_epi8(_cvtu64_mask64(bits), _mm512_set1_epi8((char)((1 << LB) << b))));
        }
    }
    if constexpr (LUT) {  // codes -> IQ4NL[code] + 128, 16 entries per 128-bit lane
      const __m512i table = _mm512_broadcast_i32x4(
          _mm_add_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(IQ4NL)), _mm_set1_epi8((char)0x80)));
#pragma GCC unroll 8
      for (int i = 0; i < QUADS; ++i) wv[i] = _mm512_shuffle_epi8(table, wv[i]);
    }
  }
}

// A group's scales (dv) and mins (mv) of the panel's 16 outputs, as the format defines them.
template <int G, bool AFFINE, bool SUB>
static inline void group_scales(const Scales& sc, int64_t g, __m512& dv, __m512& mv) {
  mv = _mm512_setzero_ps();
  if constexpr (SUB) {
    const int64_t sb = g / KGPS<G>;  // a constant: a shift, not a division per group
    const __m512i subs = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc.sub + g * NO)));
    dv = _mm512_mul_ps(half16(sc.super + sb * NO), _mm512_cvtepi32_ps(subs));
    if constexpr (AFFINE) {
      const __m512i mins = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc.submin + g * NO)));
      mv = _mm512_mul_ps(half16(sc.supermin + sb * NO), _mm512_cvtepi32_ps(mins));
    }
  } else {
    dv = half16(sc.super + g * NO);
    if constexpr (AFFINE) mv = half16(sc.supermin + g * NO);
  }
}

template <int R, int G, int BITS, bool AFFINE, bool SUB, bool LUT>
static void panel_vnni(const uint8_t* __restrict w, const Scales& sc, int64_t ng,
                       const int8_t* __restrict q, const float* __restrict s, const float* __restrict fa_,
                       const int32_t* __restrict, int64_t K, int zero, float* __restrict y, int64_t ldy, int ncols) {
  constexpr int QUADS = G / 4;
  static_assert(QUADS % 2 == 0, "the even and odd chains below");
  constexpr int64_t GB = (int64_t)G * NO * BITS / 8;
  __m512 acc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  // the output lines, written once at the end, asked for writing now (PREFETCHW), as amx_block does
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(y + r * ldy), _MM_HINT_ET0);
  for (int64_t g = 0; g < ng; ++g) {
    const uint8_t* gb = w + g * GB;
#pragma GCC unroll 8
    for (int64_t line = 0; line < GB; line += 64) __builtin_prefetch(gb + PREFETCH * GB + line, 0, 1);
    if constexpr (SUB) __builtin_prefetch(sc.sub + (g + PREFETCH) * NO, 0, 1);
    __m512i wv[QUADS];
    unpack_group<G, BITS, LUT>(gb, wv);
    __m512 dv, mv;
    group_scales<G, AFFINE, SUB>(sc, g, dv, mv);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      // the block's activations group-major (quantize_rows' `block`): row r's group g at (g * R + r) * G, so the
      // rows of a group are at constant offsets from one pointer
      const int32_t* qg = reinterpret_cast<const int32_t*>(q + (g * R + r) * G);  // 4 int8 inputs per word
      // two chains of VPDPBUSD (even and odd quads), added at the end: half the dependent latency per row, and
      // the same D (an integer sum, exact in any order)
      // The even chain starts at MAGIC's bits, so the sum's bits are the float MAGIC + D (|D| < 2^22): D as a float
      // without VCVTDQ2PS, which shares VPDPBUSD's one port on Intel.
      __m512i even = _mm512_set1_epi32(MAGIC_BITS), odd = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int i = 0; i < QUADS; i += 2) {
        even = dpbusd_broadcast(even, wv[i], qg + i);
        odd = dpbusd_broadcast(odd, wv[i + 1], qg + i + 1);
      }
      const __m512 biased = _mm512_castsi512_ps(_mm512_add_epi32(even, odd));  // MAGIC + D, exactly
      const __m512 sa = _mm512_set1_ps(s[g * R + r]), fa = _mm512_set1_ps(fa_[g * R + r]);
      if constexpr (!AFFINE) {  // fa is MAGIC + z*A here: (MAGIC + D) - (MAGIC + z*A) is D - z*A exactly, as
                                // float(D) - float(z*A) is (integers below 2^24)
        acc[r] = _mm512_fmadd_ps(_mm512_sub_ps(biased, fa), _mm512_mul_ps(dv, sa), acc[r]);
      } else {
        const __m512 dotf = _mm512_sub_ps(biased, _mm512_set1_ps(MAGIC));  // float(D), exactly
        const __m512 inner = _mm512_fmsub_ps(dv, dotf, _mm512_mul_ps(mv, fa));
        acc[r] = _mm512_fmadd_ps(inner, sa, acc[r]);
      }
    }
  }
  const __mmask16 keep = ncols >= NO ? (__mmask16)0xFFFF : (__mmask16)((1u << ncols) - 1);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ldy, keep, acc[r]);
}

#define PANEL panel_vnni

#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
// AMX: one TDPBSUD multiplies a tile of 16 rows x G int8 activations (signed) by one of G/4 quads x 16 outputs x 4
// weights (unsigned, the vectors unpack_group makes) into 16 x 16 exact int32 sums D: a whole group of a block of 16
// rows in one instruction. Symmetric formats (w = d * (u - z)) multiply signed weights u - z instead (TDPBSSD; every
// such u - z fits int8), so the tile's sums are D - z*A already. Then the same float operations per group as
// panel_vnni, lane for lane, so the same bits (float(D) and float(D - z*A) by VCVTDQ2PS: exact, as MAGIC's bits are).
// Linux grants a process the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM); where the CPU lacks AMX or
// the OS refuses (some virtual machines list AMX and refuse it), the VNNI path runs. The tile instructions
// (amx_tiles.h) name the memory each reads or writes, so the accumulators stay in registers.
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define SPECSTRUCT_AMX 1
#include "amx_tiles.h"  // the tile instructions, TileConfig, ROWS16

static bool amx_granted() {  // AMX-TILE and AMX-INT8 listed, and the tile state granted to this process
  static const bool granted = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }();
  return granted;
}
static std::atomic<bool> amx_wanted{true};  // tests and A/B probes turn it off (use_amx)
constexpr int AMX_ROWS = 16;                // rows per tile: blocks of 16 rows, the last one padded with zero rows
// Fewer rows: the VNNI path (a padded tile and a panel unpacked to memory cost more there). 64: where the tiles
// started to win on the 2-core Xeon (`python -m benchmarks.int8_peak --amx-ab`: 0.55-0.80x at 16 rows, 0.77-0.98x
// at 32, 0.90-0.99x at 48, 0.99-1.07x at 64, 1.06-1.21x at 256). Tests lower it (amx_min_rows) to reach the tiles.
static std::atomic<int64_t> amx_min_rows{64};

// Tiles 0-3: D (16 rows x 16 int32); 4, 5: activations (16 rows x G bytes); 6, 7: weights (G/4 quads x 64 bytes).
template <int G>
static void tile_configure() {
  TileConfig c;
  for (int t = 0; t < 4; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  for (int t = 4; t < 6; ++t) c.rows[t] = 16, c.colsb[t] = G;
  for (int t = 6; t < 8; ++t) c.rows[t] = G / 4, c.colsb[t] = 64;
  asm volatile("ldtilecfg %0" ::"m"(c));
}

// A panel's weights unpacked once (QUADS vectors per group: the weight tiles' rows) with its scales and mins per group,
// for every block of rows to use.
template <int G, int BITS, bool AFFINE, bool SUB, bool LUT>
static void amx_unpack(const uint8_t* __restrict w, const Scales& sc, int64_t ng, int zero, uint8_t* __restrict wb,
                       float* __restrict dvb, float* __restrict mvb) {
  constexpr int QUADS = G / 4;
  constexpr int64_t GB = (int64_t)G * NO * BITS / 8;
  for (int64_t g = 0; g < ng; ++g) {
    __m512i wv[QUADS];
    unpack_group<G, BITS, LUT>(w + g * GB, wv);
#pragma GCC unroll 8
    for (int i = 0; i < QUADS; ++i) {
      // symmetric: the signed weights u - z (int8: pick_amx checks they fit), so the tile's sums are D - z*A
      if constexpr (!AFFINE) wv[i] = _mm512_sub_epi8(wv[i], _mm512_set1_epi8((char)zero));
      _mm512_storeu_si512(wb + (g * QUADS + i) * 64, wv[i]);
    }
    __m512 dv, mv;
    group_scales<G, AFFINE, SUB>(sc, g, dv, mv);
    _mm512_storeu_ps(dvb + g * NO, dv);
    _mm512_storeu_ps(mvb + g * NO, mv);
  }
}

// One row's float operations of one group, D from the tile's store: panel_vnni's, lane for lane.
template <bool AFFINE>
static inline __attribute__((always_inline)) void amx_row(const int32_t* __restrict d, __m512 dv, __m512 mv, float s,
                                                           float fa, __m512& acc) {
  const __m512i dot = _mm512_load_si512(d);
  if constexpr (!AFFINE) {  // the tile's sums are D - z*A (signed weights): as a float, exactly panel_vnni's
                            // (MAGIC + D) - (MAGIC + z*A)
    (void)fa;
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dv, _mm512_set1_ps(s)), acc);
  } else {
    const __m512 inner = _mm512_fmsub_ps(dv, _mm512_cvtepi32_ps(dot), _mm512_mul_ps(mv, _mm512_set1_ps(fa)));
    acc = _mm512_fmadd_ps(inner, _mm512_set1_ps(s), acc);  // float(D) by VCVTDQ2PS: exact
  }
}

// A block of 16 rows (the first R real) against one unpacked panel. q: the block's activations group-major (row r's
// group g at (g * 16 + r) * G), s and fa likewise (g * 16 + r). Four groups in flight: the tile unit computes the
// next three while the vector unit finishes one (a tile's product and store take several times the vector work's
// latency). A group's product is stored one group ahead of its float operations, not with its product: the vector
// loads of a group's sums then follow no store whose product is still being computed.
template <int G, bool AFFINE>
static void amx_block(const uint8_t* __restrict wb, const float* __restrict dvb, const float* __restrict mvb,
                      int64_t ng, const int8_t* __restrict q, const float* __restrict s, const float* __restrict fa,
                      int R, float* __restrict y, int64_t ldy, int ncols) {
  constexpr int QUADS = G / 4;
  alignas(64) int32_t d[4][AMX_ROWS * NO];
  // The block's output lines (the first line of each of its R rows' strips, ldy floats apart), written once at the
  // end, asked for now for writing (PREFETCHW; a read prefetch where the build lacks PRFCHW): each lies in another
  // row of y and in no cache, and the stores waiting on their reads for ownership stalled the block (gate/up's
  // 17,920 outputs ran 0.75x the rate of q/k/v's 2,048 on one thread).
  for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(y + r * ldy), _MM_HINT_ET0);
#define ACC(r) __m512 acc##r = _mm512_setzero_ps();
  ROWS16(ACC)
#undef ACC
  // group g: D in tile g % 4 (computed three groups ahead, stored to d[g % 4] one group ahead), activations and
  // weights in tiles 4 + g % 2 and 6 + g % 2
#define COMPUTE(c, ta, tb, g)                                    \
  do {                                                           \
    if ((g) < ng) {                                              \
      TILE_LOAD(ta, q + (g) * AMX_ROWS * G, G);                  \
      TILE_LOAD(tb, wb + (g) * QUADS * 64, 64);                  \
      TILE_ZERO(c);                                              \
      if constexpr (AFFINE)                                      \
        TILE_DPBSUD(c, ta, tb);                                  \
      else                                                       \
        TILE_DPBSSD(c, ta, tb);                                  \
    }                                                            \
  } while (0)
#define STORE(c, g)                                              \
  do {                                                           \
    if ((g) < ng) TILE_STORE(c, d[c], 64);                       \
  } while (0)
#define ROW(r) amx_row<AFFINE>(dg + (r) * NO, dv, mv, sg[r], fg[r], acc##r);
#define group(g)                                                                             \
  do {                                                                                       \
    if ((g) < ng) {                                                                          \
      const int32_t* dg = d[(g) % 4];                                                        \
      const __m512 dv = _mm512_loadu_ps(dvb + (g) * NO), mv = _mm512_loadu_ps(mvb + (g) * NO); \
      const float *sg = s + (g) * AMX_ROWS, *fg = fa + (g) * AMX_ROWS;                       \
      ROWS16(ROW)                                                                            \
    }                                                                                        \
  } while (0)
  COMPUTE(0, 4, 6, 0);
  COMPUTE(1, 5, 7, 1);
  COMPUTE(2, 4, 6, 2);
  STORE(0, 0);
  for (int64_t g = 0; g < ng; g += 4) {
    COMPUTE(3, 5, 7, g + 3);
    STORE(1, g + 1);
    group(g);
    COMPUTE(0, 4, 6, g + 4);
    STORE(2, g + 2);
    group(g + 1);
    COMPUTE(1, 5, 7, g + 5);
    STORE(3, g + 3);
    group(g + 2);
    COMPUTE(2, 4, 6, g + 6);
    STORE(0, g + 4);
    group(g + 3);
  }
#undef COMPUTE
#undef STORE
#undef group
#undef ROW
  const __mmask16 keep = ncols >= NO ? (__mmask16)0xFFFF : (__mmask16)((1u << ncols) - 1);
#define OUT(r) \
  if ((r) < R) _mm512_mask_storeu_ps(y + (r) * ldy, keep, acc##r);
  ROWS16(OUT)
#undef OUT
}

using UnpackFn = void (*)(const uint8_t*, const Scales&, int64_t, int, uint8_t*, float*, float*);
using BlockFn = void (*)(const uint8_t*, const float*, const float*, int64_t, const int8_t*, const float*,
                         const float*, int, float*, int64_t, int);

struct AmxPath {
  UnpackFn unpack;
  BlockFn block;
};

// The AMX path of a format (the same formats as the VNNI path's), or none where AMX is not granted or turned off.
static AmxPath pick_amx(const Format& f) {
  if (!amx_wanted.load(std::memory_order_relaxed) || !amx_granted()) return {nullptr, nullptr};
  const bool sub = f.gps > 1, affine = f.zero < 0;
  if (sub && f.gps != 256 / f.G) return {nullptr, nullptr};
  if (!affine && f.bits == 8 && f.zero != 128) return {nullptr, nullptr};  // u - z would not fit int8
#define FORMAT(g, b, a, s, t)                                                       \
  if (f.G == g && f.bits == b && affine == a && sub == s && f.lut == t)             \
    return {amx_unpack<g, b, a, s, t>, amx_block<g, a>};
  EACH_FORMAT(FORMAT)
#undef FORMAT
  return {nullptr, nullptr};
}
#endif  // AMX
#endif

#ifdef SPECSTRUCT_AVX2
static inline __m256 half8(const c10::Half* p) {  // 8 fp16 values widened (exactly) to float32
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 32 bits -> 32 bytes, byte i all ones where bit i is set.
static inline __m256i bytes_of_bits(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32((int)bits), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                                                     2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

// D for 8 outputs: the exact integer dot product of one row's G int8 activations (4 per word of qg) with the
// group's weights (QUADS vectors of 8 outputs x 4 inputs; 8-bit and table ones as u - 128 unless AVX-VNNI), A their
// sum.
template <int QUADS, int BITS, bool SIGNED>
static inline __m256i dot8(const __m256i* wv, const int32_t* qg, int32_t A) {
#ifdef __AVXVNNI__
  __m256i dot = _mm256_setzero_si256();  // VPDPBUSD: unsigned weights times signed activations, 4 per lane
  for (int i = 0; i < QUADS; ++i) dot = _mm256_dpbusd_avx_epi32(dot, wv[i], _mm256_set1_epi32(qg[i]));
  return dot;
#else
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (SIGNED) {  // |u - 128| * sign(q): pairs below 2 * 128 * 127 = 32512; D = D' + 128 A
    __m256i dot = _mm256_set1_epi32(128 * A);
    for (int i = 0; i < QUADS; ++i) {
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(wv[i]), _mm256_sign_epi8(_mm256_set1_epi32(qg[i]), wv[i]));
      dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pairs, ones));
    }
    return dot;
  } else {  // CHUNK quads' pairs summed in int16 first: at most CHUNK * 2 * (2^BITS - 1) * 127 <= 32767
    constexpr int CHUNK = std::min(QUADS, 32767 / (2 * ((1 << BITS) - 1) * 127));
    static_assert(CHUNK >= 1 && QUADS % CHUNK == 0, "whole chunks of quads");
    __m256i dot = _mm256_setzero_si256();
    for (int i = 0; i < QUADS; i += CHUNK) {
      __m256i pairs = _mm256_maddubs_epi16(wv[i], _mm256_set1_epi32(qg[i]));
      for (int j = 1; j < CHUNK; ++j)
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(wv[i + j], _mm256_set1_epi32(qg[i + j])));
      dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pairs, ones));
    }
    return dot;
  }
#endif
}

// One group of the panel's half h (8 outputs) for rows [0, R): acc[r] += that group's terms.
template <int R, int G, int BITS, bool AFFINE, bool SUB, bool LUT>
static inline void group_avx2(const uint8_t* __restrict gb, int h, int64_t g, const Scales& sc, int64_t ng,
                              const int8_t* __restrict q, const float* __restrict s, const float* __restrict fa_,
                              const int32_t* __restrict ia, int64_t K, __m256* acc) {
  constexpr int QUADS = G / 4;
  __m256i wv[QUADS];
  if constexpr (BITS == 8) {
    for (int i = 0; i < QUADS; ++i) {
      wv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + 64 * i + 32 * h));
#ifndef __AVXVNNI__
      wv[i] = _mm256_xor_si256(wv[i], _mm256_set1_epi8((char)0x80));  // u - 128 as a signed byte
#endif
    }
  } else {
    constexpr int LB = low_bits(BITS), PER = 8 / LB, NV = QUADS / PER;
    const __m256i low = _mm256_set1_epi8((char)((1 << LB) - 1));
    for (int i = 0; i < NV; ++i) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + 64 * i + 32 * h));
      for (int j = 0; j < PER; ++j) wv[i + j * NV] = _mm256_and_si256(_mm256_srli_epi16(v, LB * j), low);
    }
    if constexpr (BITS > LB) {
      const uint8_t* high = gb + G * NO * LB / 8;
      for (int i = 0; i < QUADS; ++i)
        for (int b = 0; b < BITS - LB; ++b) {
          uint64_t bits;
          std::memcpy(&bits, high + (i * (BITS - LB) + b) * 8, 8);
          wv[i] = _mm256_or_si256(wv[i], _mm256_and_si256(bytes_of_bits((uint32_t)(bits >> (32 * h))),
                                                          _mm256_set1_epi8((char)((1 << LB) << b))));
        }
    }
    if constexpr (LUT) {  // codes -> IQ4NL[code] + 128 (AVX-VNNI, unsigned) or IQ4NL[code] (pair sums, signed)
      __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(IQ4NL));
#ifdef __AVXVNNI__
      t = _mm_add_epi8(t, _mm_set1_epi8((char)0x80));
#endif
      const __m256i table = _mm256_broadcastsi128_si256(t);
      for (int i = 0; i < QUADS; ++i) wv[i] = _mm256_shuffle_epi8(table, wv[i]);
    }
  }
  __m256 dv, mv = _mm256_setzero_ps();
  if constexpr (SUB) {
    const int64_t sb = g / KGPS<G>;
    const __m256i subs = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc.sub + g * NO + 8 * h)));
    dv = _mm256_mul_ps(half8(sc.super + sb * NO + 8 * h), _mm256_cvtepi32_ps(subs));
    if constexpr (AFFINE) {
      const __m256i mins =
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc.submin + g * NO + 8 * h)));
      mv = _mm256_mul_ps(half8(sc.supermin + sb * NO + 8 * h), _mm256_cvtepi32_ps(mins));
    }
  } else {
    dv = half8(sc.super + g * NO + 8 * h);
    if constexpr (AFFINE) mv = half8(sc.supermin + g * NO + 8 * h);
  }
  for (int r = 0; r < R; ++r) {
    const int32_t* qg = reinterpret_cast<const int32_t*>(q + r * K + g * G);
    const __m256i dot = dot8<QUADS, BITS, BITS == 8 || LUT>(wv, qg, ia[r * ng + g]);
    const __m256 sa = _mm256_set1_ps(s[r * ng + g]), fa = _mm256_set1_ps(fa_[r * ng + g]);
    if constexpr (!AFFINE) {
      acc[r] = _mm256_fmadd_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(dot), fa), _mm256_mul_ps(dv, sa), acc[r]);
    } else {
      const __m256 inner = _mm256_fmsub_ps(dv, _mm256_cvtepi32_ps(dot), _mm256_mul_ps(mv, fa));
      acc[r] = _mm256_fmadd_ps(inner, sa, acc[r]);
    }
  }
}

// panel_vnni on AVX2 (or AVX-VNNI), 8 outputs (256 bits) at a time: per group the same integer dot product D (dot8)
// and the same float operations, lane for lane, as panel_vnni and panel_scalar: the same bits. One or two rows
// take both halves in one pass over the panel (each weight line read once); more rows take one half per pass (16
// registers hold R accumulators and a half's weights).
template <int R, int G, int BITS, bool AFFINE, bool SUB, bool LUT>
static void panel_avx2(const uint8_t* __restrict w, const Scales& sc, int64_t ng,
                       const int8_t* __restrict q, const float* __restrict s, const float* __restrict fa_,
                       const int32_t* __restrict ia, int64_t K, int, float* __restrict y, int64_t ldy, int ncols) {
  constexpr int64_t GB = (int64_t)G * NO * BITS / 8;
  constexpr int HALVES = R <= 2 ? 2 : 1;  // halves per pass
  for (int first = 0; first < 2 && 8 * first < ncols; first += HALVES) {
    const int halves = std::min(HALVES, (ncols + 7) / 8 - first);
    __m256 acc[HALVES][R];
    for (int hh = 0; hh < HALVES; ++hh)
      for (int r = 0; r < R; ++r) acc[hh][r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
      const uint8_t* gb = w + g * GB;
      if (first == 0) {
        for (int64_t line = 0; line < GB; line += 64) __builtin_prefetch(gb + PREFETCH * GB + line, 0, 1);
      }
      for (int hh = 0; hh < halves; ++hh)
        group_avx2<R, G, BITS, AFFINE, SUB, LUT>(gb, first + hh, g, sc, ng, q, s, fa_, ia, K, acc[hh]);
    }
    for (int hh = 0; hh < halves; ++hh) {
      const int h = first + hh, n = std::min(8, ncols - 8 * h);
      for (int r = 0; r < R; ++r) {
        if (n == 8) {
          _mm256_storeu_ps(y + r * ldy + 8 * h, acc[hh][r]);
        } else {
          float tmp[8];
          _mm256_storeu_ps(tmp, acc[hh][r]);
          std::memcpy(y + r * ldy + 8 * h, tmp, n * sizeof(float));
        }
      }
    }
  }
}
#define PANEL panel_avx2
#endif

#ifdef SPECSTRUCT_VECTOR
template <int G, int BITS, bool AFFINE, bool SUB, bool LUT>
static void rows_vector(int R, const uint8_t* w, const Scales& sc, int64_t ng, const int8_t* q,
                        const float* s, const float* fa, const int32_t* ia, int64_t K, int zero, float* y, int64_t ldy,
                        int ncols) {
  switch (R) {
#define CASE(n) \
  case n: return PANEL<n, G, BITS, AFFINE, SUB, LUT>(w, sc, ng, q, s, fa, ia, K, zero, y, ldy, ncols);
#ifdef SPECSTRUCT_VNNI
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) CASE(9) CASE(10) CASE(11) CASE(12) CASE(13)
    CASE(14) CASE(15) CASE(16)
#else
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6)
#endif
#undef CASE
  }
}

using RowsFn = void (*)(int, const uint8_t*, const Scales&, int64_t, const int8_t*, const float*,
                        const float*, const int32_t*, int64_t, int, float*, int64_t, int);

// The vector path of a format: (G, bits, affine, sub-scaled, table) as the GGUF formats are; any other layout runs
// on the scalar path.
static RowsFn pick(const Format& f) {
  const bool sub = f.gps > 1, affine = f.zero < 0;
  if (sub && f.gps != 256 / f.G) return nullptr;  // K-quants and IQ4_XS: super-blocks of 256 inputs (KGPS)
#define FORMAT(g, b, a, s, t) \
  if (f.G == g && f.bits == b && affine == a && sub == s && f.lut == t) return rows_vector<g, b, a, s, t>;
  EACH_FORMAT(FORMAT)
#undef FORMAT
  return nullptr;
}
#endif

static Format check_format(int64_t G, int64_t bits, int64_t zero, int64_t gps, bool lut) {
  TORCH_CHECK((G == 16 || G == 32) && bits >= 2 && bits <= 8 && bits != 7, "group size 16 or 32, 2-6 or 8 bits");
  TORCH_CHECK(!lut || (bits == 4 && zero == 128), "a table format: 4-bit codes, zero point 128");
  TORCH_CHECK(zero >= -1 && zero < (lut ? 256 : 1 << bits),
              "zero point: -1 (affine) or an unsigned value of the weight width");
  TORCH_CHECK(gps >= 1, "groups per super-block: at least 1");
  return Format{(int)G, (int)bits, (int)zero, (int)gps, lut};
}

// The scale tensors of one weight, checked: super (and supermin) [P, nsb, 16] float16, sub (and submin)
// [P, ng, 16] int8 when gps > 1.
struct ScaleTensors {
  const c10::Half* super;
  const c10::Half* supermin;
  const int8_t* sub;
  const int8_t* submin;
  int64_t super_stride, sub_stride;  // per panel
  Scales panel(int64_t p) const {
    return Scales{super + p * super_stride, supermin ? supermin + p * super_stride : nullptr,
                  sub ? sub + p * sub_stride : nullptr, submin ? submin + p * sub_stride : nullptr};
  }
};

static ScaleTensors check_scales(const Format& f, int64_t P, int64_t ng, const torch::Tensor& super,
                                 const c10::optional<torch::Tensor>& supermin, const c10::optional<torch::Tensor>& sub,
                                 const c10::optional<torch::Tensor>& submin) {
  TORCH_CHECK(ng % f.gps == 0, "groups (", ng, ") are not a whole number of super-blocks of ", f.gps);
  const int64_t nsb = ng / f.gps;
  auto floats = [&](const torch::Tensor& t, const char* what) {
    TORCH_CHECK(t.scalar_type() == at::kHalf && t.is_contiguous() && t.numel() == P * nsb * NO, what,
                ": [P, super-blocks, 16] float16");
    return t.data_ptr<c10::Half>();
  };
  auto bytes = [&](const c10::optional<torch::Tensor>& t, const char* what) -> const int8_t* {
    if (f.gps == 1) return nullptr;
    TORCH_CHECK(t.has_value() && t->scalar_type() == at::kChar && t->is_contiguous() && t->numel() == P * ng * NO, what,
                ": [P, groups, 16] int8");
    return t->data_ptr<int8_t>();
  };
  const bool affine = f.zero < 0;
  TORCH_CHECK(!affine || supermin.has_value(), "an affine format needs mins");
  return ScaleTensors{floats(super, "scales"), affine ? floats(*supermin, "mins") : nullptr, bytes(sub, "sub-scales"),
                      affine ? bytes(submin, "sub-mins") : nullptr, nsb * NO, ng * NO};
}

// A packed weight of N outputs over K inputs, checked: [P, K/G, G*16*bits/8] uint8, contiguous.
static void check_packed(const Format& f, const torch::Tensor& packed, int64_t N, int64_t K) {
  TORCH_CHECK(K % f.G == 0, "the input size ", K, " is not a multiple of the group size ", f.G);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 3 &&
                  packed.size(1) == K / f.G && packed.size(2) == group_bytes(f),
              "packed weight: [P, K/G, G*16*bits/8] uint8, contiguous");
  const int64_t P = packed.size(0);
  TORCH_CHECK(P * NO >= N && (P - 1) * NO < N, "the packed weight has ", P, " panels, not enough or too many for ", N);
}

// Panels [0, count) over the threads, `chunk` at a time from a shared counter: `work(panels)` runs once per thread
// and calls panels(i0, i1) for its next chunk until it returns false. A thread that gets the CPU (the other one
// preempted by another process, or on lighter panels) takes more chunks instead of waiting for a fixed share to
// finish; which thread computes a panel never changes its bits.
template <class Work>
static void share_panels(int64_t count, int64_t chunk, const Work& work) {
  std::atomic<int64_t> next{0};
  auto panels = [&](int64_t& i0, int64_t& i1) {
    i0 = next.fetch_add(chunk, std::memory_order_relaxed);
    i1 = std::min(count, i0 + chunk);
    return i0 < count;
  };
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), (count + chunk - 1) / chunk);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) { work(panels); });
}

// x [M, K] float32; packed [P, K/G, G*16*bits/8] uint8; scales (and mins) [P, K/G/gps, 16] float16; sub-scales
// (and sub-mins) [P, K/G, 16] int8 when gps > 1 -> y [M, N], on the vector path where one was built (`vector`).
// With `panels` (int64 panel indices), only those panels' outputs: y [M, 16 * len(panels)], panel i's 16 outputs
// in columns 16i.. (a last partial panel's extra columns undefined). Each panel is computed as in the whole product,
// so its outputs are bitwise the same.
static torch::Tensor product(const torch::Tensor& x_in, const torch::Tensor& packed, const torch::Tensor& scales,
                             const c10::optional<torch::Tensor>& mins, const c10::optional<torch::Tensor>& subscales,
                             const c10::optional<torch::Tensor>& submins, int64_t N, const Format& f, bool vector,
                             const c10::optional<torch::Tensor>& panels = c10::nullopt) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && !x_in.is_cuda(), "x: 2-D float32 on the CPU");
  const torch::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), ng = K / f.G, P = packed.size(0);
  check_packed(f, packed, N, K);
  const ScaleTensors st = check_scales(f, P, ng, scales, mins, subscales, submins);
  torch::Tensor chosen;
  const int64_t* pick_panel = nullptr;
  int64_t count = P;
  if (panels.has_value()) {
    chosen = panels->to(at::kLong).contiguous();
    TORCH_CHECK(chosen.dim() == 1, "panels: a 1-D list of panel indices");
    pick_panel = chosen.data_ptr<int64_t>();
    count = chosen.numel();
    for (int64_t i = 0; i < count; ++i)
      TORCH_CHECK(pick_panel[i] >= 0 && pick_panel[i] < P, "panel ", pick_panel[i], " out of range [0, ", P, ")");
  }
  const int64_t ldy = pick_panel ? count * NO : N;
  torch::Tensor y = torch::empty({M, ldy}, x.options());
  if (M == 0) return y;
  const int64_t blocks = (M + MB - 1) / MB, even = (M + blocks - 1) / blocks;  // at most MB rows a block, as even as can be
#ifdef SPECSTRUCT_VECTOR
  const RowsFn fn = vector ? pick(f) : nullptr;
#endif
#ifdef SPECSTRUCT_AMX
  const AmxPath amx = fn && M >= amx_min_rows.load() ? pick_amx(f) : AmxPath{nullptr, nullptr};
  const bool tiles = amx.block != nullptr;
#else
  const bool tiles = false;
#endif
#ifdef SPECSTRUCT_VNNI
  // panel_vnni reads its blocks of rows group-major, the AMX path blocks of 16 rows (the last padded with zeros)
  const int64_t layout = tiles ? 16 : (fn ? even : 1);
#else
  const int64_t layout = 1;
#endif
  const int64_t Mp = tiles ? (M + 15) / 16 * 16 : M;
  std::vector<int32_t> words((Mp * K + 3) / 4);  // int8 activations, read 4 at a time as words by the vector path
  int8_t* const qd = reinterpret_cast<int8_t*>(words.data());
  std::vector<float> s(Mp * ng);
  std::vector<int32_t> a(Mp * ng);
  quantize_rows(x.data_ptr<float>(), M, K, f.G, qd, s.data(), a.data(), vector, layout, tiles);
  std::vector<float> fa(Mp * ng);  // the vector path's A as a float: z*A (symmetric) or A (affine), exact
  for (int64_t i = 0; i < Mp * ng; ++i) fa[i] = (float)(f.zero >= 0 ? f.zero * a[i] : a[i]);
#ifdef SPECSTRUCT_VNNI
  if (vector && f.zero >= 0)  // panel_vnni's biased D: MAGIC + z*A, exact (an integer below 2^24)
    for (int64_t i = 0; i < Mp * ng; ++i) fa[i] += MAGIC;
#endif
  const uint8_t* wd = packed.data_ptr<uint8_t>();
  float* yd = y.data_ptr<float>();
  const int64_t pbytes = ng * group_bytes(f);
#ifdef SPECSTRUCT_AMX
  if (tiles) {  // each panel unpacked once, then every block of 16 rows against it
    share_panels(count, 1, [&](const auto& panels) {
      if (f.G == 32) tile_configure<32>(); else tile_configure<16>();
      std::vector<uint8_t> wb(ng * f.G / 4 * 64);
      std::vector<float> dvb(ng * NO), mvb(ng * NO);
      int64_t i0, i1;
      while (panels(i0, i1))
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t p = pick_panel ? pick_panel[i] : i;
          const int ncols = (int)std::min<int64_t>(NO, N - p * NO);
          amx.unpack(wd + p * pbytes, st.panel(p), ng, f.zero, wb.data(), dvb.data(), mvb.data());
          for (int64_t r = 0; r < M; r += AMX_ROWS)
            amx.block(wb.data(), dvb.data(), mvb.data(), ng, qd + r * K, s.data() + r * ng, fa.data() + r * ng,
                      (int)std::min<int64_t>(AMX_ROWS, M - r), yd + r * ldy + i * NO, ldy, ncols);
        }
      asm volatile("tilerelease" ::);
    });
    return y;
  }
#endif
  const int64_t chunk = std::max<int64_t>(1, count / (16 * at::get_num_threads()));
  share_panels(count, chunk, [&](const auto& panels) {
    int64_t i0, i1;
    while (panels(i0, i1))
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t p = pick_panel ? pick_panel[i] : i;
        const int ncols = (int)std::min<int64_t>(NO, N - p * NO);
        for (int64_t r = 0; r < M; r += even) {
          const int R = (int)std::min<int64_t>(even, M - r);
          const uint8_t* w = wd + p * pbytes;
          const Scales sc = st.panel(p);
  #ifdef SPECSTRUCT_VECTOR
          if (fn) {
            fn(R, w, sc, ng, qd + r * K, s.data() + r * ng, fa.data() + r * ng, a.data() + r * ng, K, f.zero,
               yd + r * ldy + i * NO, ldy, ncols);
            continue;
          }
  #endif
          panel_scalar(f, R, w, sc, ng, qd + r * K, s.data() + r * ng, a.data() + r * ng, K, yd + r * ldy + i * NO, ldy,
                       ncols);
        }
      }
  });
  return y;
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& scales,
                     const c10::optional<torch::Tensor>& mins, const c10::optional<torch::Tensor>& subscales,
                     const c10::optional<torch::Tensor>& submins, int64_t N, int64_t G, int64_t bits, int64_t zero,
                     int64_t gps, bool lut, const c10::optional<torch::Tensor>& bias) {
  torch::Tensor y = product(x, packed, scales, mins, subscales, submins, N, check_format(G, bits, zero, gps, lut), true);
  if (bias.has_value() && bias->defined()) y.add_(*bias);
  return y;
}

// Only some panels' outputs (`product`'s `panels`): the LM head where a constraint allows few tokens.
torch::Tensor linear_panels(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& scales,
                            const c10::optional<torch::Tensor>& mins, const c10::optional<torch::Tensor>& subscales,
                            const c10::optional<torch::Tensor>& submins, int64_t N, int64_t G, int64_t bits,
                            int64_t zero, int64_t gps, bool lut, const torch::Tensor& panels) {
  return product(x, packed, scales, mins, subscales, submins, N, check_format(G, bits, zero, gps, lut), true, panels);
}

// The same product on the scalar path, whatever the CPU (tests compare the two bitwise).
torch::Tensor linear_scalar(const torch::Tensor& x, const torch::Tensor& packed, const torch::Tensor& scales,
                            const c10::optional<torch::Tensor>& mins, const c10::optional<torch::Tensor>& subscales,
                            const c10::optional<torch::Tensor>& submins, int64_t N, int64_t G, int64_t bits,
                            int64_t zero, int64_t gps, bool lut) {
  return product(x, packed, scales, mins, subscales, submins, N, check_format(G, bits, zero, gps, lut), false);
}

// The float32 weights of some outputs (rows of W): an embedding lookup, or de-quantizing for tests.
torch::Tensor dequantize_rows(const torch::Tensor& packed, const torch::Tensor& scales,
                              const c10::optional<torch::Tensor>& mins, const c10::optional<torch::Tensor>& subscales,
                              const c10::optional<torch::Tensor>& submins, const torch::Tensor& rows, int64_t N,
                              int64_t K, int64_t G, int64_t bits, int64_t zero, int64_t gps, bool lut) {
  const Format f = check_format(G, bits, zero, gps, lut);
  const int64_t ng = K / f.G, P = packed.size(0);
  check_packed(f, packed, N, K);
  const ScaleTensors st = check_scales(f, P, ng, scales, mins, subscales, submins);
  const torch::Tensor ids = rows.to(at::kLong).contiguous();
  const int64_t n = ids.numel();
  torch::Tensor out = torch::empty({n, K}, scales.options().dtype(at::kFloat));
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(id[i] >= 0 && id[i] < N, "row ", id[i], " out of range [0, ", N, ")");
  const uint8_t* wd = packed.data_ptr<uint8_t>();
  float* od = out.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t p = id[i] / NO;
      const int o = (int)(id[i] % NO);
      const Scales sc = st.panel(p);
      for (int64_t g = 0; g < ng; ++g) {
        const uint8_t* gb = wd + (p * ng + g) * group_bytes(f);
        const float dv = scale_at(f, sc, g, o);
        const float mv = f.zero < 0 ? min_at(f, sc, g, o) : 0.f;
        for (int k = 0; k < f.G; ++k) {
          const int u = weight_at(gb, f, o, k);
          od[i * K + g * f.G + k] = f.zero >= 0 ? dv * (float)(u - f.zero) : dv * (float)u - mv;
        }
      }
    }
  });
  return out;
}

// The AMX path's switch (tests compare it with the VNNI path bitwise; probes time the two).
bool use_amx(bool on) {
#ifdef SPECSTRUCT_AMX
  return amx_wanted.exchange(on);
#else
  (void)on;
  return false;
#endif
}

// The fewest rows a product runs on the tiles with; returns the previous value (the bits are the same either way).
int64_t set_amx_min_rows(int64_t rows) {
#ifdef SPECSTRUCT_AMX
  return amx_min_rows.exchange(std::max<int64_t>(rows, 1));
#else
  (void)rows;
  return 0;
#endif
}

bool amx_active() {
#ifdef SPECSTRUCT_AMX
  return amx_wanted.load() && amx_granted();
#else
  return false;
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Without the GIL, as torch's own ops: other Python threads (a server's event loop) run while a layer computes.
  m.def("linear", &linear, "y = x W^T (+ b) on block-quantized weights, each row's result independent of the others",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_panels", &linear_panels, "linear's outputs of some 16-output panels only (bitwise the same)",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_scalar", &linear_scalar, "linear's computation on the portable path (bitwise the same)",
        py::call_guard<py::gil_scoped_release>());
  m.def("dequantize_rows", &dequantize_rows, "the float32 values of some rows of a block-quantized weight",
        py::call_guard<py::gil_scoped_release>());
  m.def("use_amx", &use_amx, "turn the AMX path on or off (where granted); returns whether it was on");
  m.def("amx_min_rows", &set_amx_min_rows, "set the fewest rows a product runs on AMX tiles with; returns the old");
  m.def("amx", &amx_active, "whether products of many rows run on AMX tiles here (the CPU has them, the OS grants them)");
  m.attr("panel_outputs") = NO;
  m.attr("simd") = SIMD;
  m.attr("iq4nl_values") = std::vector<int>(IQ4NL, IQ4NL + 16);  // the table IQ4 codes index (tests compare gguf's)
}
