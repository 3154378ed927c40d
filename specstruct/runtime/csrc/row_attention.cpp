// Row-wise causal attention whose result for a query row never depends on the other rows: float32, CPU.
//
// packed.py computes, for each new token of a sequence, softmax(q k^T * scaling) v over exactly the keys that
// token may see (its own cache up to and including itself), so a row's output is the same whether it is
// computed alone, among the other candidates of a verification pass, among other sequences' rows, or inside a
// prefill chunk of any size. In Python that is a loop of small torch ops per row and layer (5% of a 9-row
// pass of the 1.5B, 13% of the 0.5B draft's); here it is one call per layer.
//
// Each (row, KV head) is one task, computed start to end by one thread in an order fixed by the row's own
// number of visible keys and the head size: dot products in 16 lanes (lane = input index mod 16) reduced by a
// fixed tree, the softmax's sum the same way over keys, and the weighted sum of values in increasing key order.
// No order depends on the number of rows in the call, a row's place among them, or the thread split. The
// exponential is a Cephes-style polynomial (about 1 ulp), the same code for every row.
//
// A sliding window (Mistral, Gemma 2 and 3, Phi-3) is where a row's keys start: the row at position p sees keys
// p - window + 1 .. p, as transformers' sliding-window mask. Soft-capping (Gemma 2) replaces each score s (already
// scaled) by cap * tanh(s / cap) before the softmax, tanh a Cephes-style polynomial too: both depend on the row's
// own position and scores alone, so rows stay invariant. For speed, keys are scored
// eight at a time (independent chains, their sums reduced together by the same tree: the same bits) and each value
// row is read once for all the query heads of its KV head, not once per head.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "fast_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

typedef float v16 __attribute__((vector_size(64)));  // GCC / Clang vectors: AVX-512, 2 x AVX2 or scalar code
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
constexpr int W = 16;  // floats per v16

static inline v16 load(const float* p) {
  v16 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
static inline void store(float* p, v16 a) { std::memcpy(p, &a, sizeof a); }
// The 16 lanes summed by a fixed tree: halves, then quarters, ...
static inline float hsum(v16 a) {
  v8 b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
  v4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
  return (c[0] + c[2]) + (c[1] + c[3]);
}

// x[j] = exp(x[j] - m) for x[j] <= m, and their sum (16 lanes over j, then the tail in order).
static inline float exp_shifted(float* __restrict x, int64_t n, float m) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = exp_poly(std::max(x[i] - m, -87.0f));  // exp(-87) ~ 1.6e-38: no denormal
  v16 acc = {};
  int64_t i = 0;
  for (; i + W <= n; i += W) acc += load(x + i);
  float s = hsum(acc);
  for (; i < n; ++i) s += x[i];
  return s;
}

// Soft-capping of n scores in place: s = cap * tanh(s / cap); cap 0: none.
static inline void soft_cap(float* p, int64_t n, float cap) {
  if (cap > 0.0f) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) p[i] = cap * tanh_poly(p[i] / cap);
  }
}

// hsum of each of 8 vectors at once, the same adds in the same pairs (so the same bits): lanes i and i + 8, then
// i and i + 4, then (0 + 2) and (1 + 3), then those two; each step packs two vectors' halves into one.
static inline void hsum8(const v16* a, float* out) {
  v16 b[4], c[2];
  for (int i = 0; i < 4; ++i)
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const v16 d = __builtin_shufflevector(c[0], c[1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
                __builtin_shufflevector(c[0], c[1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  const v8 e = __builtin_shufflevector(d, d, 0, 2, 4, 6, 8, 10, 12, 14) +
               __builtin_shufflevector(d, d, 1, 3, 5, 7, 9, 11, 13, 15);
  std::memcpy(out, &e, sizeof e);
}

// The scores q.k of G query heads against `seen` keys, C = D / 16 vectors per head: each in 16 lanes then hsum,
// KB keys at a time (independent chains; the order within each score is the same for the last keys, one at a time).
template <int C>
static void scores(const float* q, const float* k, int64_t G, int64_t seen, float* p) {
  constexpr int64_t D = C * W;
  constexpr int64_t KB = 8;  // = hsum8's vectors
  int64_t j = 0;
  for (; j + KB <= seen; j += KB) {
    const float* kb = k + j * D;
    for (int64_t g = 0; g < G; ++g) {
      v16 acc[KB] = {};
      for (int c = 0; c < C; ++c) {
        const v16 qc = load(q + g * D + c * W);
        for (int64_t b = 0; b < KB; ++b) acc[b] += qc * load(kb + b * D + c * W);
      }
      hsum8(acc, p + g * seen + j);
    }
  }
  for (; j < seen; ++j) {
    for (int64_t g = 0; g < G; ++g) {
      v16 acc = {};
      for (int c = 0; c < C; ++c) acc += load(q + g * D + c * W) * load(k + j * D + c * W);
      p[g * seen + j] = hsum(acc);
    }
  }
}

// One (row, KV head) of G query heads over `seen` keys: scores, softmax, then sum_j p_j v_j in increasing j,
// divided by the softmax's sum. G known here: the values are read once for all G heads, CW vectors of each at a
// time (G * CW accumulators in registers), where a loop per head would read them G times.
template <int C, int G>
static void one_row(const float* q, const float* k, const float* v, float* out, int64_t seen, float* p, float cap) {
  constexpr int64_t D = C * W;
  constexpr int CW = (G + 1) * 4 <= 28 ? std::min(C, 4) : std::min(C, 2);
  scores<C>(q, k, G, seen, p);
  soft_cap(p, G * seen, cap);
  float total[G];
  for (int g = 0; g < G; ++g) total[g] = exp_shifted(p + g * seen, seen, *std::max_element(p + g * seen, p + (g + 1) * seen));
  for (int c0 = 0; c0 < C; c0 += CW) {
    v16 o[G][CW] = {};
    for (int64_t j = 0; j < seen; ++j) {
      v16 vj[CW];
      for (int c = 0; c < CW; ++c) vj[c] = load(v + j * D + (c0 + c) * W);
      for (int g = 0; g < G; ++g) {
        const float w = p[g * seen + j];
        for (int c = 0; c < CW; ++c) o[g][c] += w * vj[c];
      }
    }
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < CW; ++c) store(out + g * D + (c0 + c) * W, o[g][c] / total[g]);
  }
}

// Any G: the same computation, the values read once per head.
template <int C>
static void one_row_any_g(const float* q, const float* k, const float* v, float* out, int64_t G, int64_t seen,
                          float* p, float cap) {
  constexpr int64_t D = C * W;
  scores<C>(q, k, G, seen, p);
  soft_cap(p, G * seen, cap);
  for (int64_t g = 0; g < G; ++g) {
    float* pg = p + g * seen;
    const float total = exp_shifted(pg, seen, *std::max_element(pg, pg + seen));
    v16 o[C] = {};
    for (int64_t j = 0; j < seen; ++j) {
      const float w = pg[j];
      for (int c = 0; c < C; ++c) o[c] += w * load(v + j * D + c * W);
    }
    for (int c = 0; c < C; ++c) store(out + g * D + c * W, o[c] / total);
  }
}

template <int C>
static void one_row_c(const float* q, const float* k, const float* v, float* out, int64_t G, int64_t seen,
                      float* p, float cap) {
  switch (G) {  // the usual query heads per KV head; the values summed in the same order either way
    case 1: one_row<C, 1>(q, k, v, out, seen, p, cap); break;
    case 2: one_row<C, 2>(q, k, v, out, seen, p, cap); break;
    case 3: one_row<C, 3>(q, k, v, out, seen, p, cap); break;
    case 4: one_row<C, 4>(q, k, v, out, seen, p, cap); break;
    case 5: one_row<C, 5>(q, k, v, out, seen, p, cap); break;
    case 6: one_row<C, 6>(q, k, v, out, seen, p, cap); break;
    case 7: one_row<C, 7>(q, k, v, out, seen, p, cap); break;
    case 8: one_row<C, 8>(q, k, v, out, seen, p, cap); break;
    default: one_row_any_g<C>(q, k, v, out, G, seen, p, cap);
  }
}

// Any head size: the same computation, one float at a time (a dot product summed in increasing index).
static void one_row_any(const float* q, const float* k, const float* v, float* out, int64_t G, int64_t D,
                        int64_t seen, float* p, float cap) {
  for (int64_t g = 0; g < G; ++g) {
    float* pg = p + g * seen;
    for (int64_t j = 0; j < seen; ++j) {
      float s = 0.f;
      for (int64_t d = 0; d < D; ++d) s += q[g * D + d] * k[j * D + d];
      pg[j] = s;
    }
    soft_cap(pg, seen, cap);
    const float total = exp_shifted(pg, seen, *std::max_element(pg, pg + seen));
    for (int64_t d = 0; d < D; ++d) {
      float o = 0.f;
      for (int64_t j = 0; j < seen; ++j) o += pg[j] * v[j * D + d];
      out[g * D + d] = o / total;
    }
  }
}

// q [Hkv, G, Lq, D] (the last Lq positions), k / v [Hkv, Lk, D] -> [Lq, Hkv * G, D]; row i sees keys
// 0 .. Lk - Lq + i, or with a sliding window (window > 0) its last `window` of them; softcap > 0 caps the scores.
torch::Tensor attend(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in, double scaling,
                     int64_t window, double softcap) {
  TORCH_CHECK(q_in.dim() == 4 && k_in.dim() == 3 && v_in.dim() == 3, "attend: q [Hkv, G, Lq, D], k/v [Hkv, Lk, D]");
  TORCH_CHECK(q_in.scalar_type() == torch::kFloat && k_in.scalar_type() == torch::kFloat &&
              v_in.scalar_type() == torch::kFloat, "attend: float32 only");
  TORCH_CHECK(q_in.device().is_cpu() && k_in.device().is_cpu() && v_in.device().is_cpu(), "attend: CPU tensors only");
  const int64_t H = q_in.size(0), G = q_in.size(1), Lq = q_in.size(2), D = q_in.size(3), Lk = k_in.size(1);
  TORCH_CHECK(k_in.size(0) == H && v_in.size(0) == H && k_in.size(2) == D && v_in.size(2) == D &&
              v_in.size(1) == Lk && Lk >= Lq, "attend: shapes do not match");
  TORCH_CHECK(window >= 0 && softcap >= 0, "attend: window and softcap are >= 0 (0: none)");
  const float cap = static_cast<float>(softcap);
  // [Lq, H, G, D], each row's queries times `scaling` (as transformers' eager attention does before q.k)
  const auto q = (q_in.permute({2, 0, 1, 3}) * scaling).contiguous();
  // keys / values may be views of a longer buffer (the KV cache grows in place): rows of D floats, any head stride
  auto rows_of_d = [D](const torch::Tensor& t) { return t.stride(2) == 1 && t.stride(1) == D ? t : t.contiguous(); };
  const auto k = rows_of_d(k_in), v = rows_of_d(v_in);
  const int64_t ks = k.stride(0), vs = v.stride(0);
  auto out = torch::empty({Lq, H * G, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, Lq * H, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> p(G * Lk);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t / H, h = t % H, end = Lk - Lq + i + 1;
      const int64_t first = window > 0 && end > window ? end - window : 0, seen = end - first;
      const float* qt = qp + t * G * D;
      const float *kh = kp + h * ks + first * D, *vh = vp + h * vs + first * D;
      float* ot = op + t * G * D;
      switch (D) {  // the usual head sizes, in registers; any other, one float at a time
        case 16: one_row_c<1>(qt, kh, vh, ot, G, seen, p.data(), cap); break;
        case 32: one_row_c<2>(qt, kh, vh, ot, G, seen, p.data(), cap); break;
        case 64: one_row_c<4>(qt, kh, vh, ot, G, seen, p.data(), cap); break;
        case 128: one_row_c<8>(qt, kh, vh, ot, G, seen, p.data(), cap); break;
        case 256: one_row_c<16>(qt, kh, vh, ot, G, seen, p.data(), cap); break;
        default: one_row_any(qt, kh, vh, ot, G, D, seen, p.data(), cap);
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attend", &attend, "row-wise causal attention, each query row over its own visible keys, row-invariant",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scaling"), py::arg("window") = 0, py::arg("softcap") = 0.0);
}
