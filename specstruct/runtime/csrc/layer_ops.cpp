// The small ops of a decoder layer, one call each: RMSNorm (with the residual add before it) and rotary position
// embedding, float32, CPU. Per decode step transformers runs ~15 small torch ops per layer around these (casts,
// pow, mean, rsqrt, rotate_half's slices, negation and concatenation, ...); here they are 3 calls per layer.
//
// Each row is computed start to end by one thread in an order fixed by its own length: a row's result never
// depends on the other rows of the call, their number or the thread split (row invariance, as the linear and
// attention kernels). The sum of squares runs in 16 lanes (lane = index mod 16) reduced by a fixed tree. The
// other architectures' pieces are here too: Gemma's norm (weight + 1), per-head q / k norms (Qwen3, Gemma 3), a
// partial rotary embedding (Phi-3 variants) and Gemma's gelu_tanh MLP activation.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "fast_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>

typedef float v16 __attribute__((vector_size(64)));  // GCC / Clang vectors: AVX-512, 2 x AVX2 or scalar code
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

static inline v16 load(const float* p) {
  v16 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
static inline float hsum(v16 a) {
  v8 b = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
  v4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
  return (c[0] + c[2]) + (c[1] + c[3]);
}

// 1 / sqrt(mean(x^2) + eps) of one row of C floats.
static inline float inv_rms(const float* x, int64_t C, float eps) {
  v16 acc = {};
  int64_t i = 0;
  for (; i + 16 <= C; i += 16) {
    v16 a = load(x + i);
    acc += a * a;
  }
  float ss = hsum(acc);
  for (; i < C; ++i) ss += x[i] * x[i];
  return 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
}

// y = (w + offset) * (x / sqrt(mean(x^2) + eps)) for one row of C floats (y may be x). offset 1: Gemma's norm,
// whose weight is stored less one.
static inline void norm_row(const float* x, const float* __restrict w, float* y, int64_t C, float eps, float offset) {
  const float inv = inv_rms(x, C, eps);
  if (offset == 0.0f)
    for (int64_t j = 0; j < C; ++j) y[j] = w[j] * (x[j] * inv);
  else
    for (int64_t j = 0; j < C; ++j) y[j] = (w[j] + offset) * (x[j] * inv);
}

static int64_t grain(int64_t C) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(C, 1)); }

static void check(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat && t.device().is_cpu() && t.is_contiguous(),
              what, ": contiguous float32 CPU tensors only");
}

// x [R, C], w [C] -> y [R, C]
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps, double offset) {
  check(x, "rms_norm");
  check(w, "rms_norm");
  const int64_t C = x.size(-1), R = x.numel() / C;
  TORCH_CHECK(w.numel() == C, "rms_norm: weight size does not match");
  auto y = torch::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, R, grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) norm_row(xp + r * C, wp, yp + r * C, C, static_cast<float>(eps), static_cast<float>(offset));
  });
  return y;
}

// h [R, C], d [R, C], w [C] -> (h + d, rms_norm(h + d)): the residual add and the next norm in one pass. With
// d_w (Gemma's norm after attention), d is normed first: (h + rms_norm(d, d_w), rms_norm(that, w)).
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& h, const torch::Tensor& d,
                                                      const torch::Tensor& w, double eps, double offset,
                                                      const c10::optional<torch::Tensor>& d_w) {
  check(h, "add_rms_norm");
  check(d, "add_rms_norm");
  check(w, "add_rms_norm");
  const int64_t C = h.size(-1), R = h.numel() / C;
  TORCH_CHECK(d.numel() == h.numel() && w.numel() == C, "add_rms_norm: sizes do not match");
  if (d_w) {
    check(*d_w, "add_rms_norm");
    TORCH_CHECK(d_w->numel() == C, "add_rms_norm: d_w size does not match");
  }
  auto s = torch::empty_like(h);
  auto y = torch::empty_like(h);
  const float *hp = h.data_ptr<float>(), *dp = d.data_ptr<float>(), *wp = w.data_ptr<float>();
  const float* dwp = d_w ? d_w->data_ptr<float>() : nullptr;
  float *sp = s.data_ptr<float>(), *yp = y.data_ptr<float>();
  const float e = static_cast<float>(eps), o = static_cast<float>(offset);
  at::parallel_for(0, R, grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* sr = sp + r * C;
      if (dwp) {
        norm_row(dp + r * C, dwp, sr, C, e, o);
        for (int64_t j = 0; j < C; ++j) sr[j] = hp[r * C + j] + sr[j];
      } else {
        for (int64_t j = 0; j < C; ++j) sr[j] = hp[r * C + j] + dp[r * C + j];
      }
      norm_row(sr, wp, yp + r * C, C, e, o);
    }
  });
  return {s, y};
}

// In place: each head of x [R, H*D] (rows of any stride) normed by w [D], as Qwen3's and Gemma 3's q / k norms.
void head_rms_norm_(torch::Tensor x, const torch::Tensor& w, double eps, double offset) {
  check(w, "head_rms_norm_");
  const int64_t D = w.numel(), R = x.size(0);
  TORCH_CHECK(x.scalar_type() == torch::kFloat && x.device().is_cpu() && x.dim() == 2 && x.stride(1) == 1 &&
              x.size(1) % D == 0, "head_rms_norm_: x is float32 CPU [rows, heads * head size]");
  const int64_t H = x.size(1) / D, xs = x.stride(0);
  float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  at::parallel_for(0, R, grain(H * D), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t h = 0; h < H; ++h) norm_row(xp + r * xs + h * D, wp, xp + r * xs + h * D, D, static_cast<float>(eps),
                                               static_cast<float>(offset));
  });
}

// gate, up [R, I] (rows of any stride) -> act(gate) * up [R, I], the MLP's activation: silu, x / (1 + exp(-x)), or
// gelu_pytorch_tanh (Gemma), 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))). Each row in one loop from its
// first element (torch's elementwise kernels cut a tensor by threads and vector tails wherever the whole tensor's
// size puts the cuts: an element's bits could depend on the number of rows).
template <bool GELU>
static torch::Tensor act_mul(const torch::Tensor& gate, const torch::Tensor& up) {
  for (const auto* t : {&gate, &up})
    TORCH_CHECK(t->scalar_type() == torch::kFloat && t->device().is_cpu() && t->dim() == 2 && t->stride(1) == 1,
                "act_mul: float32 CPU [rows, size] with contiguous rows");
  TORCH_CHECK(gate.sizes() == up.sizes(), "act_mul: shapes do not match");
  const int64_t R = gate.size(0), I = gate.size(1), gs = gate.stride(0), us = up.stride(0);
  auto y = torch::empty({R, I}, gate.options());
  const float *gp = gate.data_ptr<float>(), *upp = up.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, R, grain(I), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *g = gp + r * gs, *u = upp + r * us;
      float* out = yp + r * I;
#pragma omp simd
      for (int64_t j = 0; j < I; ++j) {
        const float x = g[j];
        if constexpr (GELU)
          out[j] = 0.5f * x * (1.0f + tanh_poly(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[j];
        else
          out[j] = x / (1.0f + exp_poly(std::max(std::min(-x, 88.0f), -87.0f))) * u[j];
      }
    }
  });
  return y;
}

torch::Tensor silu_mul(const torch::Tensor& gate, const torch::Tensor& up) { return act_mul<false>(gate, up); }
torch::Tensor gelu_tanh_mul(const torch::Tensor& gate, const torch::Tensor& up) { return act_mul<true>(gate, up); }

// In place: every head (head_dim floats; 0: cos's size) of q [R, Hq*hd] and k [R, Hk*hd] rotated by row r's cos /
// sin [R, D], as transformers' apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1),
// over each head's first D floats (a partial rotary embedding leaves the rest). q and k may be column slices of a
// wider output (rows of any stride).
void rope_(torch::Tensor q, torch::Tensor k, const torch::Tensor& cos, const torch::Tensor& sin, int64_t head_dim) {
  check(cos, "rope_");
  check(sin, "rope_");
  const int64_t D = cos.size(-1), R = cos.numel() / D, half = D / 2, hd = head_dim > 0 ? head_dim : D;
  for (const auto* t : {&q, &k})
    TORCH_CHECK(t->scalar_type() == torch::kFloat && t->device().is_cpu() && t->dim() == 2 && t->stride(1) == 1 &&
                t->size(0) == R && t->size(1) % hd == 0, "rope_: q and k are float32 CPU [rows, heads * head size]");
  TORCH_CHECK(D % 2 == 0 && D <= hd && sin.numel() == cos.numel(), "rope_: shapes do not match");
  const int64_t Hq = q.size(1) / hd, Hk = k.size(1) / hd, qs = q.stride(0), ks = k.stride(0);
  float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *snp = sin.data_ptr<float>();
  at::parallel_for(0, R, grain((Hq + Hk) * hd), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *c = cp + r * D, *s = snp + r * D;
      for (int64_t h = 0; h < Hq + Hk; ++h) {
        float* x = h < Hq ? qp + r * qs + h * hd : kp + r * ks + (h - Hq) * hd;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = x[i], b = x[i + half];
          x[i] = a * c[i] - b * s[i];
          x[i + half] = b * c[i + half] + a * s[i + half];
        }
      }
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "RMSNorm per row, row-invariant", py::arg("x"), py::arg("w"), py::arg("eps"),
        py::arg("offset") = 0.0);
  m.def("add_rms_norm", &add_rms_norm, "(h + d, RMSNorm(h + d)) per row, row-invariant", py::arg("h"), py::arg("d"),
        py::arg("w"), py::arg("eps"), py::arg("offset") = 0.0, py::arg("d_w") = py::none());
  m.def("head_rms_norm_", &head_rms_norm_, "RMSNorm of each head in place, per row", py::arg("x"), py::arg("w"),
        py::arg("eps"), py::arg("offset") = 0.0);
  m.def("silu_mul", &silu_mul, "silu(gate) * up per element, row-invariant", py::arg("gate"), py::arg("up"));
  m.def("gelu_tanh_mul", &gelu_tanh_mul, "gelu_tanh(gate) * up per element, row-invariant", py::arg("gate"),
        py::arg("up"));
  m.def("rope_", &rope_, "rotary position embedding of q and k in place, per row", py::arg("q"), py::arg("k"),
        py::arg("cos"), py::arg("sin"), py::arg("head_dim") = 0);
}
