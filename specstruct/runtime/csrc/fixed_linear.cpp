// A Linear kernel whose result for a row never depends on the other rows: y = x W^T (+ b), float32, CPU.
//
// The weight is packed once into panels of NB output columns, [P][K][NB] (fixed_linear.py pack_weight). For
// each output y[m][n] the kernel adds x[m][k] * W[n][k] in increasing k, one fused multiply-add at a time,
// into a fresh sum per block of KC inputs, and adds the block sums to y in increasing k. That order depends
// on K alone: not on how many rows are in the call, a row's place among them, the panel split between
// threads or the CPU's vector width, so a row computed alone is bitwise the same row computed among any
// others (what speculative verification and batching need), with no padding row.
//
// The weights may be float32, or 16-bit as a GGUF file ships them (fp16, bf16: each value widened to float32 as
// it is loaded into a register, exactly -- fp16 by F16C's conversion, bf16 by a 16-bit shift -- so the products
// and their order are the float32 kernel's on the widened weights, bit for bit, at half the bytes streamed), or
// int8 with a scale per output (drafts).
//
// Speed: the rows of a call are taken MB at a time against one panel (each weight value loaded once per MB
// rows, MB x 4 accumulators held in registers, the panel prefetched 16 rows ahead into L2), so one row streams
// the weights like a GEMV and 2-9 rows cost little more; the rows of a long call (a prefill) go through the
// panel one KC-input slice at a time, so that slice stays in cache; panels are split between torch's OpenMP
// threads (at::parallel_for, on torch's own libgomp).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 vec;
constexpr int VW = 16;  // floats per vector register
constexpr int MB = 6;   // rows per block: MB x 4 accumulators + 4 weights fit in 32 registers
static inline vec vzero() { return _mm512_setzero_ps(); }
static inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
static inline vec vset1(float a) { return _mm512_set1_ps(a); }
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline void vstore(float* p, vec a) { _mm512_storeu_ps(p, a); }
static inline vec vload(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
static inline vec vload(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
static inline vec vload(const at::BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
constexpr const char* SIMD = "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 vec;
constexpr int VW = 8;
constexpr int MB = 3;   // 12 accumulators + 4 weights in 16 registers
static inline vec vzero() { return _mm256_setzero_ps(); }
static inline vec vload(const float* p) { return _mm256_loadu_ps(p); }
static inline vec vset1(float a) { return _mm256_set1_ps(a); }
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline void vstore(float* p, vec a) { _mm256_storeu_ps(p, a); }
static inline vec vload(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
static inline vec vload(const at::Half* p) {
#if defined(__F16C__)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  alignas(32) float wide[VW];
  for (int i = 0; i < VW; ++i) wide[i] = static_cast<float>(p[i]);
  return _mm256_load_ps(wide);
#endif
}
static inline vec vload(const at::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
constexpr const char* SIMD = "avx2";
#else  // portable, slow: one float per "vector", the same fused multiply-adds in the same order
typedef float vec;
constexpr int VW = 1;
constexpr int MB = 2;
static inline vec vzero() { return 0.f; }
static inline vec vload(const float* p) { return *p; }
static inline vec vset1(float a) { return a; }
static inline vec vfma(vec a, vec b, vec c) { return std::fma(a, b, c); }
static inline void vstore(float* p, vec a) { *p = a; }
static inline vec vload(const int8_t* p) { return static_cast<float>(*p); }
static inline vec vload(const at::Half* p) { return static_cast<float>(*p); }      // exact, as the vector paths
static inline vec vload(const at::BFloat16* p) { return static_cast<float>(*p); }
constexpr const char* SIMD = "scalar";
#endif
constexpr int NV = 4;             // vectors per panel
constexpr int NB = NV * VW;       // output columns per panel
constexpr int64_t KC = 256;       // inputs per block sum
constexpr int64_t PREFETCH_BYTES = 16 * 256;  // how far ahead in the panel to prefetch, into L2
constexpr int64_t KS = 64;        // inputs per sub-slice when 2-4 blocks of rows share a slice (it stays in L1)
constexpr int CARRY_BLOCKS = 4;   // the most blocks of rows whose sums are carried between sub-slices

// What a block does with its sums: start them at zero or from `carry` (resume), and at the end of its inputs
// store them into y (the first block of inputs), add them to y, or keep them in `carry` for the next sub-slice.
struct Sums {
  float* carry;   // R x NB floats, or nullptr
  bool resume;    // start from carry
  bool finish;    // the block sum is complete: write it to y
  bool first;     // ... storing it (the first block of inputs) rather than adding it
};

// Rows [0, R) of x against one panel, inputs [k0, k1), one fused multiply-add at a time in increasing k.
template <int R, typename W>
static inline void block(const float* __restrict x, int64_t K, int64_t k0, int64_t k1, const W* __restrict w,
                         float* __restrict y, int64_t ldy, int64_t ncols, Sums how) {
  vec acc[R][NV];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = how.resume ? vload(how.carry + (r * NV + v) * VW) : vzero();
  for (int64_t k = k0; k < k1; ++k) {
    const W* wk = w + k * NB;
    const char* ahead = reinterpret_cast<const char*>(wk) + PREFETCH_BYTES;
    for (size_t b = 0; b < NB * sizeof(W); b += 64) __builtin_prefetch(ahead + b, 0, 2);
    const vec w0 = vload(wk), w1 = vload(wk + VW), w2 = vload(wk + 2 * VW), w3 = vload(wk + 3 * VW);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vec xb = vset1(x[r * K + k]);
      acc[r][0] = vfma(xb, w0, acc[r][0]);
      acc[r][1] = vfma(xb, w1, acc[r][1]);
      acc[r][2] = vfma(xb, w2, acc[r][2]);
      acc[r][3] = vfma(xb, w3, acc[r][3]);
    }
  }
  if (!how.finish) {  // exact: a float stored and loaded again is the same float
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) vstore(how.carry + (r * NV + v) * VW, acc[r][v]);
    return;
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    float sum[NB];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) vstore(sum + v * VW, acc[r][v]);
    float* yr = y + r * ldy;
    if (how.first)
      for (int64_t j = 0; j < ncols; ++j) yr[j] = sum[j];
    else
      for (int64_t j = 0; j < ncols; ++j) yr[j] += sum[j];
  }
}

// The last rows of a call (fewer than MB): the block of exactly that many.
template <int R, typename W>
static inline void tail(int64_t left, const float* x, int64_t K, int64_t k0, int64_t k1, const W* w, float* y,
                        int64_t ldy, int64_t ncols, Sums how) {
  if constexpr (R > 0) {
    if (left == R) block<R, W>(x, K, k0, k1, w, y, ldy, ncols, how);
    else tail<R - 1, W>(left, x, K, k0, k1, w, y, ldy, ncols, how);
  }
}

// Every row against one panel, one block of inputs at a time (that slice of the panel stays in cache while all
// the rows use it; the order of the sums is the same whatever the loop nesting). With 2-4 blocks of rows (a
// verification pass, a small batch) the slice is walked in sub-slices of KS inputs, every block in turn, their
// sums carried between sub-slices: the blocks after the first then read the weights from L1, not L2 (re-reading
// the model from L2 made the Linear layers of a 9-row pass cost 1.24x one row's). The same fused multiply-adds in
// the same order.
template <typename W>
static void panel(const float* x, int64_t M, int64_t K, const W* w, float* y, int64_t N, int64_t ncols) {
  const int64_t blocks = (M + MB - 1) / MB;
  alignas(64) float carry[CARRY_BLOCKS][MB * NB];
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t k1 = std::min(K, k0 + KC);
    const int64_t step = blocks > 1 && blocks <= CARRY_BLOCKS ? KS : KC;
    for (int64_t s0 = k0; s0 < k1; s0 += step) {
      const int64_t s1 = std::min(k1, s0 + step);
      int64_t m = 0;
      for (int64_t b = 0; m < M; ++b, m += MB) {
        const Sums how{b < CARRY_BLOCKS ? carry[b] : nullptr, s0 > k0, s1 == k1, k0 == 0};
        if (m + MB <= M) block<MB, W>(x + m * K, K, s0, s1, w, y + m * N, N, ncols, how);
        else tail<MB - 1, W>(M - m, x + m * K, K, s0, s1, w, y + m * N, N, ncols, how);
      }
    }
  }
}

template <typename W>
static torch::Tensor run(const torch::Tensor& x_in, const torch::Tensor& packed, int64_t N) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat && !x_in.is_cuda(), "x: 2-D float32 on the CPU");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == NB && packed.is_contiguous(), "packed weight: [P, K, ", NB, "]");
  const torch::Tensor x = x_in.contiguous();
  const int64_t M = x.size(0), K = x.size(1), P = packed.size(0);
  TORCH_CHECK(packed.size(1) == K && P * NB >= N && (P - 1) * NB < N, "packed weight does not match x or N");
  torch::Tensor y = torch::empty({M, N}, x.options());
  if (M == 0) return y;
  const float* xd = x.data_ptr<float>();
  const W* wd = packed.data_ptr<W>();
  float* yd = y.data_ptr<float>();
  if (K == 0) {
    y.zero_();
  } else {
    at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p)
        panel<W>(xd, M, K, wd + p * K * NB, yd + p * NB, N, std::min<int64_t>(NB, N - p * NB));
    });
  }
  return y;
}

// float32, float16 or bfloat16 panels: the same sums in the same order, each weight widened exactly.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t N,
                     const c10::optional<torch::Tensor>& bias) {
  torch::Tensor y;
  switch (packed.scalar_type()) {
    case at::kFloat: y = run<float>(x, packed, N); break;
    case at::kHalf: y = run<at::Half>(x, packed, N); break;
    case at::kBFloat16: y = run<at::BFloat16>(x, packed, N); break;
    default: TORCH_CHECK(false, "packed weight: float32, float16 or bfloat16, not ", packed.scalar_type());
  }
  if (bias.has_value() && bias->defined()) y.add_(*bias);
  return y;
}

// Weight-only int8 (drafts): y = (x Q^T) * scale (+ b), Q int8 panels, one scale per output. Same order of sums.
torch::Tensor linear_int8(const torch::Tensor& x, const torch::Tensor& packed, int64_t N, const torch::Tensor& scale,
                          const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(packed.scalar_type() == at::kChar, "packed weight: int8");
  torch::Tensor y = run<int8_t>(x, packed, N);
  y.mul_(scale);
  if (bias.has_value() && bias->defined()) y.add_(*bias);
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Without the GIL, as torch's own ops: other Python threads (a server's event loop) run while a layer computes.
  m.def("linear", &linear, "y = x W^T (+ b) on a packed float32/float16/bfloat16 weight, each row's result "
        "independent of the others",
        py::call_guard<py::gil_scoped_release>());
  m.def("linear_int8", &linear_int8, "y = (x Q^T) * scale (+ b) on packed int8 weights (drafts)",
        py::call_guard<py::gil_scoped_release>());
  m.attr("panel_width") = NB;
  m.attr("simd") = SIMD;
}
