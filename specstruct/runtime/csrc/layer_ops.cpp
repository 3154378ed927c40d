// The small ops of a decoder layer, one call each: RMSNorm (with the residual add before it) and rotary position
// embedding, float32, CPU. Per decode step transformers runs ~15 small torch ops per layer around these (casts,
// pow, mean, rsqrt, rotate_half's slices, negation and concatenation, ...); here they are 3 calls per layer.
//
// Each row is computed start to end by one thread in an order fixed by its own length: a row's result never
// depends on the other rows of the call, their number or the thread split (row invariance, as the linear and
// attention kernels). The sum of squares runs in 16 lanes (lane = index mod 16) reduced by a fixed tree.
#include <torch/extension.h>
#include <ATen/Parallel.h>

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

// y = w * (x / sqrt(mean(x^2) + eps)) for one row of C floats.
static inline void norm_row(const float* __restrict x, const float* __restrict w, float* __restrict y, int64_t C,
                            float eps) {
  v16 acc = {};
  int64_t i = 0;
  for (; i + 16 <= C; i += 16) {
    v16 a = load(x + i);
    acc += a * a;
  }
  float ss = hsum(acc);
  for (; i < C; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
  for (int64_t j = 0; j < C; ++j) y[j] = w[j] * (x[j] * inv);
}

static int64_t grain(int64_t C) { return std::max<int64_t>(1, 32768 / std::max<int64_t>(C, 1)); }

static void check(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.scalar_type() == torch::kFloat && t.device().is_cpu() && t.is_contiguous(),
              what, ": contiguous float32 CPU tensors only");
}

// x [R, C], w [C] -> y [R, C]
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  check(x, "rms_norm");
  check(w, "rms_norm");
  const int64_t C = x.size(-1), R = x.numel() / C;
  TORCH_CHECK(w.numel() == C, "rms_norm: weight size does not match");
  auto y = torch::empty_like(x);
  const float *xp = x.data_ptr<float>(), *wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, R, grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) norm_row(xp + r * C, wp, yp + r * C, C, static_cast<float>(eps));
  });
  return y;
}

// h [R, C], d [R, C], w [C] -> (h + d, rms_norm(h + d)): the residual add and the next norm in one pass.
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& h, const torch::Tensor& d,
                                                      const torch::Tensor& w, double eps) {
  check(h, "add_rms_norm");
  check(d, "add_rms_norm");
  check(w, "add_rms_norm");
  const int64_t C = h.size(-1), R = h.numel() / C;
  TORCH_CHECK(d.numel() == h.numel() && w.numel() == C, "add_rms_norm: sizes do not match");
  auto s = torch::empty_like(h);
  auto y = torch::empty_like(h);
  const float *hp = h.data_ptr<float>(), *dp = d.data_ptr<float>(), *wp = w.data_ptr<float>();
  float *sp = s.data_ptr<float>(), *yp = y.data_ptr<float>();
  at::parallel_for(0, R, grain(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t j = 0; j < C; ++j) sp[r * C + j] = hp[r * C + j] + dp[r * C + j];
      norm_row(sp + r * C, wp, yp + r * C, C, static_cast<float>(eps));
    }
  });
  return {s, y};
}

// In place: every head of q [R, Hq*D] and k [R, Hk*D] rotated by row r's cos / sin [R, D], as transformers'
// apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1). q and k may be column slices
// of a wider output (rows of any stride).
void rope_(torch::Tensor q, torch::Tensor k, const torch::Tensor& cos, const torch::Tensor& sin) {
  check(cos, "rope_");
  check(sin, "rope_");
  const int64_t D = cos.size(-1), R = cos.numel() / D, half = D / 2;
  for (const auto* t : {&q, &k})
    TORCH_CHECK(t->scalar_type() == torch::kFloat && t->device().is_cpu() && t->dim() == 2 && t->stride(1) == 1 &&
                t->size(0) == R && t->size(1) % D == 0, "rope_: q and k are float32 CPU [rows, heads * head size]");
  TORCH_CHECK(D % 2 == 0 && sin.numel() == cos.numel(), "rope_: shapes do not match");
  const int64_t Hq = q.size(1) / D, Hk = k.size(1) / D, qs = q.stride(0), ks = k.stride(0);
  float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>();
  const float *cp = cos.data_ptr<float>(), *snp = sin.data_ptr<float>();
  at::parallel_for(0, R, grain((Hq + Hk) * D), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float *c = cp + r * D, *s = snp + r * D;
      for (int64_t h = 0; h < Hq + Hk; ++h) {
        float* x = h < Hq ? qp + r * qs + h * D : kp + r * ks + (h - Hq) * D;
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
  m.def("rms_norm", &rms_norm, "RMSNorm per row, row-invariant", py::arg("x"), py::arg("w"), py::arg("eps"));
  m.def("add_rms_norm", &add_rms_norm, "(h + d, RMSNorm(h + d)) per row, row-invariant", py::arg("h"), py::arg("d"),
        py::arg("w"), py::arg("eps"));
  m.def("rope_", &rope_, "rotary position embedding of q and k in place, per row", py::arg("q"), py::arg("k"),
        py::arg("cos"), py::arg("sin"));
}
