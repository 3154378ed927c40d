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
// row is read once for all the query heads of its KV head, not once per head. A pass runs in tiles of consecutive
// rows of one KV head (a prompt chunk's tile_rows, or a decode step's or verification's few): each key and value
// loaded serves every row of the tile, and each row's sums keep the order above, so the bits are those of the row
// computed alone.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "fast_math.h"

#include <algorithm>
#include <atomic>
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

// The largest of x[0..n), n >= 1: 16 lanes, then the lanes and the tail. A maximum is exact, so this is
// std::max_element's value in any order, but without its chain of dependent compares (4 cycles a score, a third of a
// prefill's attention); at most the sign of a zero differs, and exp_shifted's results do not depend on it.
static inline float max_of(const float* x, int64_t n) {
  int64_t i = 0;
  float m = x[0];
  if (n >= W) {
    v16 acc = load(x);
    for (i = W; i + W <= n; i += W) {
      const v16 a = load(x + i);
      acc = a > acc ? a : acc;
    }
    for (int l = 0; l < W; ++l) m = std::max(m, acc[l]);
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
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
  for (int g = 0; g < G; ++g) total[g] = exp_shifted(p + g * seen, seen, max_of(p + g * seen, seen));
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
    const float total = exp_shifted(pg, seen, max_of(pg, seen));
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
    const float total = exp_shifted(pg, seen, max_of(pg, seen));
    for (int64_t d = 0; d < D; ++d) {
      float o = 0.f;
      for (int64_t j = 0; j < seen; ++j) o += pg[j] * v[j * D + d];
      out[g * D + d] = o / total;
    }
  }
}

// A tile of up to MAX_TILE consecutive query rows of one KV head computed together (a prompt chunk's, or the few of
// a decode step or a verification), so that each key and value loaded serves every row of the tile that sees it (row
// at a time, a 1,024-token prompt reads the cache's keys and values once per row). Each row still gets one_row's
// arithmetic in one_row's order, so the same bits: its scores one by one as scores<C> computes them (16 lanes over
// the head's vectors, hsum8 = hsum's tree), soft-capped, its softmax by exp_shifted over its own keys from its first
// one, and sum_j p_j v_j in increasing j from its first key, its accumulators spilled to memory between blocks of
// keys (exact) rather than kept in registers for the whole sum. A key block some rows of the tile do not see (past a
// row's end, before its window) is scored for the rows that see part of it and the extra scores are never read.
constexpr int64_t MAX_TILE = 16;
constexpr int64_t VALUE_BLOCK = 64;  // keys whose values stay in L1 while every row adds them, CW vectors at a time
// Keys ahead whose key and value rows are asked for (prefetched) while the current ones are summed: a pass of a few
// rows over a long cache streams it from memory (python -m benchmarks.attention_stream times it against a plain read).
// Into L2 (PREFETCHT1), not L1: on the Zen 4 EPYC a pass of 1, 5 and 9 rows on 1,200-2,500 cached tokens ran
// 1.45-1.53x, 1.14-1.19x and 1.08-1.10x faster than with the same prefetches into L1 (the same bits; python -m
// benchmarks.attention_stream --commit 9d7f546, the L1 version), and 16 to 48 keys ahead did alike.
constexpr int64_t AHEAD = 16;

// The scores of HP query heads (q, D floats apart) against the 8 keys at kb: s[h * ss + b], the bits of scores<C>.
template <int C, int HP>
static inline void scores8(const float* q, const float* kb, float* s, int64_t ss) {
  constexpr int64_t D = C * W;
  v16 acc[HP][8] = {};
  for (int c = 0; c < C; ++c) {
    v16 qc[HP];
    for (int h = 0; h < HP; ++h) qc[h] = load(q + h * D + c * W);
    for (int b = 0; b < 8; ++b) {
      const v16 kc = load(kb + b * D + c * W);
      for (int h = 0; h < HP; ++h) acc[h][b] += qc[h] * kc;
    }
  }
  for (int h = 0; h < HP; ++h) hsum8(acc[h], s + h * ss);
}

// R rows (row r's queries at q + r * qs, its output at out + r * qs) of one KV head over keys [first[r], end[r]),
// both nondecreasing in r. S: R * G * (end[R-1] - first[0]) floats, O: R * G * D floats of scratch.
template <int C, int G>
static void attend_tile(const float* q, int64_t qs, const float* k, const float* v, float* out, int64_t R,
                      const int64_t* first, const int64_t* end, float* S, float* O, float cap) {
  constexpr int64_t D = C * W;
  constexpr int CW = (G + 1) * 4 <= 28 ? std::min(C, 4) : std::min(C, 2);  // one_row's
#ifdef __AVX512F__
  constexpr int HP = G % 3 == 0 ? 3 : 2;  // heads scored together: HP * 8 accumulators + HP + 1 of 32 registers
#else
  constexpr int HP = 1;
#endif
  const int64_t lo = first[0], hi = end[R - 1], span = hi - lo;
  int64_t j = lo;
  for (; j + 8 <= hi; j += 8) {
    const float* kb = k + j * D;
    if (j + AHEAD + 8 <= hi)
      for (int64_t f = 0; f < 8 * D; f += W) __builtin_prefetch(kb + AHEAD * D + f, 0, 2);
    for (int64_t r = 0; r < R; ++r) {
      if (j >= end[r] || j + 8 <= first[r]) continue;
      const float* qr = q + r * qs;
      float* sr = S + r * G * span + (j - lo);
      int g = 0;
      for (; g + HP <= G; g += HP) scores8<C, HP>(qr + g * D, kb, sr + g * span, span);
      for (; g < G; ++g) scores8<C, 1>(qr + g * D, kb, sr + g * span, span);
    }
  }
  for (; j < hi; ++j)  // the last keys, one at a time
    for (int64_t r = 0; r < R; ++r) {
      if (j < first[r] || j >= end[r]) continue;
      for (int g = 0; g < G; ++g) {
        v16 acc = {};
        for (int c = 0; c < C; ++c) acc += load(q + r * qs + g * D + c * W) * load(k + j * D + c * W);
        S[(r * G + g) * span + (j - lo)] = hsum(acc);
      }
    }
  float total[MAX_TILE][G];
  for (int64_t r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) {
      float* p = S + (r * G + g) * span + (first[r] - lo);
      const int64_t n = end[r] - first[r];
      soft_cap(p, n, cap);
      total[r][g] = exp_shifted(p, n, max_of(p, n));
    }
  // Each block of values is read once, for every row and every CW-vector chunk of the head (O holds all D of each
  // row's heads); each accumulator still sums its keys in increasing j.
  std::fill(O, O + R * G * D, 0.0f);
  for (int64_t jb = lo; jb < hi; jb += VALUE_BLOCK) {
    const int64_t jend = std::min(jb + VALUE_BLOCK, hi);
    for (int c0 = 0; c0 < C; c0 += CW)
      for (int64_t r = 0; r < R; ++r) {
        const int64_t js = std::max(jb, first[r]), je = std::min(jend, end[r]);
        if (js >= je) continue;
        float* Or = O + r * G * D + c0 * W;
        const float* pr = S + r * G * span;
        v16 o[G][CW];
        for (int g = 0; g < G; ++g)
          for (int c = 0; c < CW; ++c) o[g][c] = load(Or + g * D + c * W);
        const bool ask = c0 == 0 && r == 0;  // the block's first reader asks for the value row AHEAD keys on
        for (int64_t jj = js; jj < je; ++jj) {
          if (ask && jj + AHEAD < hi)
            for (int64_t f = 0; f < D; f += W) __builtin_prefetch(v + (jj + AHEAD) * D + f, 0, 2);
          v16 vj[CW];
          for (int c = 0; c < CW; ++c) vj[c] = load(v + jj * D + (c0 + c) * W);
          for (int g = 0; g < G; ++g) {
            const float w = pr[g * span + (jj - lo)];
            for (int c = 0; c < CW; ++c) o[g][c] += w * vj[c];
          }
        }
        for (int g = 0; g < G; ++g)
          for (int c = 0; c < CW; ++c) store(Or + g * D + c * W, o[g][c]);
      }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c)
        store(out + r * qs + g * D + c * W, load(O + (r * G + g) * D + c * W) / total[r][g]);
}

using TileFn = void (*)(const float*, int64_t, const float*, const float*, float*, int64_t, const int64_t*,
                        const int64_t*, float*, float*, float);

template <int C>
static TileFn tile_for_g(int64_t G) {
  switch (G) {  // one_row_c's heads per KV head; others row at a time
    case 1: return attend_tile<C, 1>;
    case 2: return attend_tile<C, 2>;
    case 3: return attend_tile<C, 3>;
    case 4: return attend_tile<C, 4>;
    case 5: return attend_tile<C, 5>;
    case 6: return attend_tile<C, 6>;
    case 7: return attend_tile<C, 7>;
    case 8: return attend_tile<C, 8>;
    default: return nullptr;
  }
}

static TileFn tile_for(int64_t D, int64_t G) {
  switch (D) {
    case 16: return tile_for_g<1>(G);
    case 32: return tile_for_g<2>(G);
    case 64: return tile_for_g<4>(G);
    case 128: return tile_for_g<8>(G);
    case 256: return tile_for_g<16>(G);
    default: return nullptr;
  }
}

// Tasks [0, count) over the threads from a shared counter, task 0 first: a thread that gets the CPU takes more of
// them; which thread computes a task never changes its bits.
template <class Task>
static void share_tasks(int64_t count, const Task& task) {
  std::atomic<int64_t> next{0};
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), count);
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    std::vector<float> S, O;
    for (int64_t t = next.fetch_add(1, std::memory_order_relaxed); t < count;
         t = next.fetch_add(1, std::memory_order_relaxed))
      task(t, S, O);
  });
}

// q [Hkv, G, Lq, D] (the last Lq positions), k / v [Hkv, Lk, D] -> [Lq, Hkv * G, D]; row i sees keys
// 0 .. Lk - Lq + i, or with a sliding window (window > 0) its last `window` of them; softcap > 0 caps the scores.
// tile_rows > 1: rows in tiles where the head size and heads per KV head have a tile (tile_for); tile_rows = 1, or
// no tile: row at a time. The bits are the same either way. A pass of at most MAX_TILE rows (a decode step, a
// verification: it may exceed tile_rows) is one tile per KV head where the KV heads give every thread a task: each
// key and value is then read from memory once, where a tile per row or two would read a long cache several times.
// Otherwise (a prompt chunk, or more threads than KV heads) tiles of up to tile_rows rows (at most MAX_TILE; fewer
// where the tiles would not give every thread two tasks; at least one).
torch::Tensor attend(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in, double scaling,
                     int64_t window, double softcap, int64_t tile_rows) {
  TORCH_CHECK(q_in.dim() == 4 && k_in.dim() == 3 && v_in.dim() == 3, "attend: q [Hkv, G, Lq, D], k/v [Hkv, Lk, D]");
  TORCH_CHECK(q_in.scalar_type() == torch::kFloat && k_in.scalar_type() == torch::kFloat &&
              v_in.scalar_type() == torch::kFloat, "attend: float32 only");
  TORCH_CHECK(q_in.device().is_cpu() && k_in.device().is_cpu() && v_in.device().is_cpu(), "attend: CPU tensors only");
  const int64_t H = q_in.size(0), G = q_in.size(1), Lq = q_in.size(2), D = q_in.size(3), Lk = k_in.size(1);
  TORCH_CHECK(k_in.size(0) == H && v_in.size(0) == H && k_in.size(2) == D && v_in.size(2) == D &&
              v_in.size(1) == Lk && Lk >= Lq, "attend: shapes do not match");
  TORCH_CHECK(window >= 0 && softcap >= 0, "attend: window and softcap are >= 0 (0: none)");
  TORCH_CHECK(tile_rows >= 1, "attend: tile_rows is >= 1 (1: row at a time)");
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
  auto bounds = [&](int64_t i, int64_t& first, int64_t& end) {  // the keys row i sees: [first, end)
    end = Lk - Lq + i + 1;
    first = window > 0 && end > window ? end - window : 0;
  };
  const TileFn tile = tile_for(D, G);
  const int64_t threads = at::get_num_threads();
  const int64_t R = Lq <= MAX_TILE && H >= threads
                        ? Lq
                        : std::max<int64_t>(1, std::min({tile_rows, MAX_TILE, Lq * H / (2 * threads)}));
  if (tile != nullptr && tile_rows > 1 && R >= 1) {  // R = 0: no rows
    const int64_t tiles = (Lq + R - 1) / R;
    share_tasks(tiles * H, [&](int64_t t, std::vector<float>& S, std::vector<float>& O) {
      const int64_t i0 = (tiles - 1 - t / H) * R, h = t % H, rows = std::min(R, Lq - i0);  // the longest rows first
      int64_t first[MAX_TILE], end[MAX_TILE];
      for (int64_t r = 0; r < rows; ++r) bounds(i0 + r, first[r], end[r]);
      const size_t need = rows * G * (end[rows - 1] - first[0]);
      if (S.size() < need) S.resize(need);
      if (O.size() < static_cast<size_t>(rows * G * D)) O.resize(rows * G * D);
      tile(qp + (i0 * H + h) * G * D, H * G * D, kp + h * ks, vp + h * vs, op + (i0 * H + h) * G * D, rows, first,
           end, S.data(), O.data(), cap);
    });
    return out;
  }
  at::parallel_for(0, Lq * H, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> p(G * Lk);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i = t / H, h = t % H;
      int64_t first, end;
      bounds(i, first, end);
      const int64_t seen = end - first;
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
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scaling"), py::arg("window") = 0, py::arg("softcap") = 0.0,
        py::arg("tile_rows") = 1);
}
