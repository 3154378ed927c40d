// A Linear kernel on block-quantized weights (GGUF's Q4_K, Q6_K, Q8_0, Q5_0, Q4_0 as they ship) whose result
// for a row never depends on the other rows: y = x W^T, float32 in and out, CPU.
//
// Weights. Every format is held as unsigned integers u (4 or 8 bits) with, per group of G inputs of one output
// (G = 16 or 32, the format's own sub-block), a float32 scale d and either an integer zero point z of the whole
// tensor (w = d * (u - z): Q8_0, Q5_0, Q6_K, Q4_0) or a float32 min m (w = d * u - m: Q4_K). These are the
// format's values exactly (d and m are the products of its fp16 super-block scales and its 6- or 8-bit
// sub-block scales, exact in float32). They are packed once (quantized.py) into panels of 16 outputs:
// for each group, its G/4 quads of 4 inputs, each quad as 16 outputs x 4 bytes (one 512-bit vector); 4-bit
// weights put quad i in the low nibbles and quad i + G/8 in the high nibbles of the same bytes.
//
// Activations. Each row of x is quantized on its own, per group of G inputs, to int8 with scale s = max|x|/127
// (round to nearest even) and the group's sum A of those int8 values: a row's quantization depends on that row
// alone.
//
// Sums. For each output, for each group in increasing order: the exact integer dot product D of u and the int8
// activations (VPDPBUSD), then acc += float(D - z*A) * (d*s) (symmetric) or acc += s * fma(d, float(D), -(m*A))
// (affine), one fused multiply-add per group. That order depends on K and G alone: not on how many rows are in
// the call, a row's place among them, the panel split between threads or the vector unit, so a row computed
// alone is bitwise the same row computed among any others. The scalar path does the same float operations in
// the same order, so it gives the same bits as the AVX-512 VNNI one.
//
// Speed: one row streams the packed bytes once (0.56-1.1 bytes per weight instead of float32's 4); the rows of a
// call are taken up to MB at a time against one panel, so each weight vector loaded (and each 4-bit vector
// unpacked) serves them all; a panel (a few KB to 150 KB) stays in cache while every block of rows uses it.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define SPECSTRUCT_VNNI 1
static const char* SIMD = "avx512-vnni";
#else
static const char* SIMD = "scalar";
#endif

constexpr int NO = 16;  // outputs per panel
constexpr int MB = 8;   // rows per block

struct Format {
  int G;      // inputs per group
  int bits;   // 4 or 8
  int zero;   // the zero point z, or -1: affine (a float min per group)
};

static inline int64_t group_bytes(const Format& f) { return (int64_t)f.G * NO * f.bits / 8; }

// x [M, K] float32 -> int8 [M, K], scale [M, K/G], sum [M, K/G].
static void quantize_rows(const float* x, int64_t M, int64_t K, int G, int8_t* q, float* s, int32_t* a) {
  const int64_t ng = K / G;
  at::parallel_for(0, M, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t g = 0; g < ng; ++g) {
        const float* xg = x + r * K + g * G;
        float amax = 0.f;
        for (int i = 0; i < G; ++i) amax = std::max(amax, std::fabs(xg[i]));
        const float scale = amax / 127.f;
        const float inv = amax > 0.f ? 127.f / amax : 0.f;
        int32_t sum = 0;
        int8_t* qg = q + r * K + g * G;
        for (int i = 0; i < G; ++i) {
          const int v = (int)std::nearbyint(xg[i] * inv);
          qg[i] = (int8_t)std::max(-127, std::min(127, v));
          sum += qg[i];
        }
        s[r * ng + g] = scale;
        a[r * ng + g] = sum;
      }
  });
}

// The unsigned weight of output o, input k (within its group's panel block) -- for the scalar path and de-quantizing.
static inline int weight_at(const uint8_t* gb, const Format& f, int o, int k) {
  const int quad = k / 4, j = k % 4;
  if (f.bits == 8) return gb[(quad * NO + o) * 4 + j];
  const int half = f.G / 8;
  const uint8_t b = gb[((quad % half) * NO + o) * 4 + j];
  return quad < half ? (b & 0x0F) : (b >> 4);
}

// Rows [0, R) against one panel: scalar, the same float operations in the same order as the vector path.
static void panel_scalar(const Format& f, int R, const uint8_t* w, const float* d, const float* m, int64_t ng,
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
          acc[o] = std::fma((float)(D - f.zero * A), d[g * NO + o] * sa, acc[o]);
        } else {
          const float inner = std::fma(d[g * NO + o], (float)D, -(m[g * NO + o] * (float)A));
          acc[o] = std::fma(inner, sa, acc[o]);
        }
      }
    }
    for (int o = 0; o < ncols; ++o) y[r * ldy + o] = acc[o];
  }
}

#ifdef SPECSTRUCT_VNNI
template <int R, int G, int BITS, bool AFFINE>
static void panel_vnni(const uint8_t* __restrict w, const float* __restrict d, const float* __restrict m, int64_t ng,
                       const int8_t* __restrict q, const float* __restrict s, const int32_t* __restrict a, int64_t K,
                       int zero, float* __restrict y, int64_t ldy, int ncols) {
  constexpr int QUADS = G / 4;
  constexpr int64_t GB = (int64_t)G * NO * BITS / 8;
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < ng; ++g) {
    const uint8_t* gb = w + g * GB;
    __builtin_prefetch(gb + 8 * GB, 0, 1);
    __builtin_prefetch(gb + 8 * GB + 64, 0, 1);
    __m512i wv[QUADS];
    if constexpr (BITS == 8) {
#pragma GCC unroll 8
      for (int i = 0; i < QUADS; ++i) wv[i] = _mm512_loadu_si512(gb + 64 * i);
    } else {
#pragma GCC unroll 4
      for (int i = 0; i < QUADS / 2; ++i) {
        const __m512i v = _mm512_loadu_si512(gb + 64 * i);
        wv[i] = _mm512_and_si512(v, low);
        wv[i + QUADS / 2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
    }
    const __m512 dv = _mm512_loadu_ps(d + g * NO);
    __m512 mv = _mm512_setzero_ps();
    if constexpr (AFFINE) mv = _mm512_loadu_ps(m + g * NO);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const int8_t* qg = q + r * K + g * G;
      __m512i dot = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int i = 0; i < QUADS; ++i) {
        int32_t four;
        std::memcpy(&four, qg + 4 * i, 4);
        dot = _mm512_dpbusd_epi32(dot, wv[i], _mm512_set1_epi32(four));
      }
      const float sa = s[r * ng + g];
      const int32_t A = a[r * ng + g];
      if constexpr (!AFFINE) {
        dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(zero * A));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dv, _mm512_set1_ps(sa)), acc[r]);
      } else {
        const __m512 inner = _mm512_fmsub_ps(dv, _mm512_cvtepi32_ps(dot), _mm512_mul_ps(mv, _mm512_set1_ps((float)A)));
        acc[r] = _mm512_fmadd_ps(inner, _mm512_set1_ps(sa), acc[r]);
      }
    }
  }
  const __mmask16 keep = ncols >= NO ? (__mmask16)0xFFFF : (__mmask16)((1u << ncols) - 1);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ldy, keep, acc[r]);
}

template <int G, int BITS, bool AFFINE>
static void rows_vnni(int R, const uint8_t* w, const float* d, const float* m, int64_t ng, const int8_t* q,
                      const float* s, const int32_t* a, int64_t K, int zero, float* y, int64_t ldy, int ncols) {
  switch (R) {
#define CASE(n) case n: return panel_vnni<n, G, BITS, AFFINE>(w, d, m, ng, q, s, a, K, zero, y, ldy, ncols);
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
#undef CASE
  }
}

using RowsFn = void (*)(int, const uint8_t*, const float*, const float*, int64_t, const int8_t*, const float*,
                        const int32_t*, int64_t, int, float*, int64_t, int);

static RowsFn pick(const Format& f) {
  if (f.G == 32 && f.bits == 8 && f.zero >= 0) return rows_vnni<32, 8, false>;
  if (f.G == 16 && f.bits == 8 && f.zero >= 0) return rows_vnni<16, 8, false>;
  if (f.G == 32 && f.bits == 4 && f.zero < 0) return rows_vnni<32, 4, true>;
  if (f.G == 32 && f.bits == 4 && f.zero >= 0) return rows_vnni<32, 4, false>;
  if (f.G == 16 && f.bits == 4 && f.zero < 0) return rows_vnni<16, 4, true>;
  return nullptr;
}
#endif

static Format check_format(int64_t G, int64_t bits, int64_t zero) {
  TORCH_CHECK((G == 16 || G == 32) && (bits == 4 || bits == 8), "group size 16 or 32, 4 or 8 bits");
  TORCH_CHECK(zero >= -1 && zero < (1 << bits), "zero point: -1 (affine) or an unsigned value of the weight width");
  return Format{(int)G, (int)bits, (int)zero};
}

// x [M, K] float32; packed [P, K/G, G*16*bits/8] uint8; scales (and mins) [P, K/G, 16] float32 -> y [M, N].
torch::Tensor linear(const torch::Tensor& x_in, const torch::Tensor& packed, const torch::Tensor& scales,
                     const c10::optional<torch::Tensor>& mins, int64_t N, int64_t G, int64_t bits, int64_t zero,
                     const c10::optional<torch::Tensor>& bias) {
  const Format f = check_format(G, bits, zero);
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && !x_in.is_cuda(), "x: 2-D float32 on the CPU");
  const torch::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), ng = K / f.G, P = packed.size(0);
  TORCH_CHECK(K % f.G == 0, "the input size ", K, " is not a multiple of the group size ", f.G);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 3 && packed.size(1) == ng &&
                  packed.size(2) == group_bytes(f), "packed weight: [P, K/G, G*16*bits/8] uint8, contiguous");
  TORCH_CHECK(P * NO >= N && (P - 1) * NO < N, "the packed weight has ", P, " panels, not enough or too many for ", N);
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.is_contiguous() && scales.numel() == P * ng * NO,
              "scales: [P, K/G, 16] float32");
  const bool affine = f.zero < 0;
  TORCH_CHECK(!affine || (mins.has_value() && mins->scalar_type() == at::kFloat && mins->is_contiguous() &&
                          mins->numel() == P * ng * NO), "an affine format needs mins: [P, K/G, 16] float32");
  torch::Tensor y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  std::vector<int8_t> q(M * K);
  std::vector<float> s(M * ng);
  std::vector<int32_t> a(M * ng);
  quantize_rows(x.data_ptr<float>(), M, K, f.G, q.data(), s.data(), a.data());
  const uint8_t* wd = packed.data_ptr<uint8_t>();
  const float* dd = scales.data_ptr<float>();
  const float* md = affine ? mins->data_ptr<float>() : nullptr;
  float* yd = y.data_ptr<float>();
  const int64_t pbytes = ng * group_bytes(f), pscales = ng * NO;
#ifdef SPECSTRUCT_VNNI
  const RowsFn fn = pick(f);
#endif
  at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int ncols = (int)std::min<int64_t>(NO, N - p * NO);
      for (int64_t r = 0; r < M; r += MB) {
        const int R = (int)std::min<int64_t>(MB, M - r);
        const uint8_t* w = wd + p * pbytes;
        const float* d = dd + p * pscales;
        const float* m = md ? md + p * pscales : nullptr;
#ifdef SPECSTRUCT_VNNI
        if (fn) {
          fn(R, w, d, m, ng, q.data() + r * K, s.data() + r * ng, a.data() + r * ng, K, f.zero, yd + r * N + p * NO, N, ncols);
          continue;
        }
#endif
        panel_scalar(f, R, w, d, m, ng, q.data() + r * K, s.data() + r * ng, a.data() + r * ng, K, yd + r * N + p * NO, N, ncols);
      }
    }
  });
  if (bias.has_value() && bias->defined()) y.add_(*bias);
  return y;
}

// The same product on the scalar path, whatever the CPU (tests compare the two bitwise).
torch::Tensor linear_scalar(const torch::Tensor& x_in, const torch::Tensor& packed, const torch::Tensor& scales,
                            const c10::optional<torch::Tensor>& mins, int64_t N, int64_t G, int64_t bits, int64_t zero) {
  const Format f = check_format(G, bits, zero);
  const torch::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), ng = K / f.G, P = packed.size(0);
  TORCH_CHECK(K % f.G == 0 && packed.size(1) == ng && scales.numel() == P * ng * NO, "shapes do not match");
  torch::Tensor y = torch::empty({M, N}, x.options());
  std::vector<int8_t> q(M * K);
  std::vector<float> s(M * ng);
  std::vector<int32_t> a(M * ng);
  quantize_rows(x.data_ptr<float>(), M, K, f.G, q.data(), s.data(), a.data());
  const float* md = f.zero < 0 ? mins->data_ptr<float>() : nullptr;
  for (int64_t p = 0; p < P; ++p)
    panel_scalar(f, (int)M, packed.data_ptr<uint8_t>() + p * ng * group_bytes(f), scales.data_ptr<float>() + p * ng * NO,
                 md ? md + p * ng * NO : nullptr, ng, q.data(), s.data(), a.data(), K, y.data_ptr<float>() + p * NO, N,
                 (int)std::min<int64_t>(NO, N - p * NO));
  return y;
}

// The float32 weights of some outputs (rows of W): an embedding lookup, or de-quantizing for tests.
torch::Tensor dequantize_rows(const torch::Tensor& packed, const torch::Tensor& scales,
                              const c10::optional<torch::Tensor>& mins, const torch::Tensor& rows, int64_t K,
                              int64_t G, int64_t bits, int64_t zero) {
  const Format f = check_format(G, bits, zero);
  const int64_t ng = K / f.G, P = packed.size(0);
  const torch::Tensor ids = rows.to(at::kLong).contiguous();
  const int64_t n = ids.numel();
  torch::Tensor out = torch::empty({n, K}, scales.options());
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) TORCH_CHECK(id[i] >= 0 && id[i] < P * NO, "row ", id[i], " out of range");
  const uint8_t* wd = packed.data_ptr<uint8_t>();
  const float* dd = scales.data_ptr<float>();
  const float* md = f.zero < 0 ? mins->data_ptr<float>() : nullptr;
  float* od = out.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t p = id[i] / NO;
      const int o = (int)(id[i] % NO);
      for (int64_t g = 0; g < ng; ++g) {
        const uint8_t* gb = wd + (p * ng + g) * group_bytes(f);
        const float dv = dd[(p * ng + g) * NO + o];
        const float mv = md ? md[(p * ng + g) * NO + o] : 0.f;
        for (int k = 0; k < f.G; ++k) {
          const int u = weight_at(gb, f, o, k);
          od[i * K + g * f.G + k] = f.zero >= 0 ? dv * (float)(u - f.zero) : dv * (float)u - mv;
        }
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Without the GIL, as torch's own ops: other Python threads (a server's event loop) run while a layer computes.
  m.def("linear", &linear, "y = x W^T (+ b) on block-quantized weights, each row's result independent of the others",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_scalar", &linear_scalar, "linear's computation on the portable path (bitwise the same)",
        py::call_guard<py::gil_scoped_release>());
  m.def("dequantize_rows", &dequantize_rows, "the float32 values of some rows of a block-quantized weight",
        py::call_guard<py::gil_scoped_release>());
  m.attr("panel_outputs") = NO;
  m.attr("simd") = SIMD;
}
