// What bounds the block-quantized kernel's AMX path: its schedule for one format (G = 32 inputs a group, affine:
// Q4_K's), timed whole and in parts, one thread. A standalone copy of the schedule of amx_block in
// specstruct/runtime/csrc/blockq_linear.cpp (the same tile instructions, the same per-group float steps), on random
// bytes; benchmarks/amx_parts.py builds and runs it.
//
// A "group-block" is one group of 32 inputs of 16 rows x 16 outputs (8,192 multiply-adds): one TDPBSUD, one tile
// store of its 16 x 16 sums, and 16 rows of float steps. Printed: nanoseconds per group-block of each variant.
// A third schedule is the one llama.cpp's K-quant numerics would allow, which the kernel does not use: one activation
// scale per 256 inputs, so a super-block's sums with the integer sub-scales are exact integers. The weights sc * u
// (10 bits for Q4_K) are held as hi and lo bytes, two blocks of rows share each weight tile (four TDPBSUD per 64
// inputs), four tile stores and one float step per row and super-block; timed per 32 inputs of 16 rows x 16 outputs.
// (Built into the kernel, it made a 1,024-token prefill 1.06x faster and moved the logits further from llama.cpp's:
// docs/benchmarks.md.)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <vector>

#include "../../specstruct/runtime/csrc/amx_tiles.h"  // the kernel's own tile instructions

constexpr int NO = 16, ROWS = 16, G = 32, QUADS = G / 4;
static void configure() {  // as blockq_linear.cpp: 0-3 sums, 4-5 activations, 6-7 weights
  TileConfig c;
  for (int t = 0; t < 4; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  for (int t = 4; t < 6; ++t) c.rows[t] = 16, c.colsb[t] = G;
  for (int t = 6; t < 8; ++t) c.rows[t] = QUADS, c.colsb[t] = 64;
  asm volatile("ldtilecfg %0" ::"m"(c));
}

// Buffers on cache-line boundaries, as a tile load wants them: on the 16 bytes past a line where malloc put
// std::vector's buffers here, each tile row straddled two lines and the tile loads + TDPBSUD took 2.2x as long (the kernel's own buffers measured no
// different aligned: `python -m benchmarks.blockq_ab --source` with its scratch aligned, 0.97-1.00x).
template <class T>
struct Lines64 {
  using value_type = T;
  Lines64() = default;
  template <class U>
  Lines64(const Lines64<U>&) {}
  T* allocate(std::size_t n) {
    void* p = std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, std::size_t) { std::free(p); }
  template <class U>
  bool operator==(const Lines64<U>&) const { return true; }
  template <class U>
  bool operator!=(const Lines64<U>&) const { return false; }
};
template <class T>
using vec = std::vector<T, Lines64<T>>;

struct Data {  // one panel (unpacked) and every row's activations, group-major per block of 16 rows
  int64_t M, K, ng;
  vec<uint8_t> wb0, wb1, kw;  // kw: the K-quant schedule's hi and lo weight tiles, 2 KB per 64 inputs
  vec<int32_t> mp, ap;        // its sub-min pairs (4 per super-block) and each row's pairs of group sums
  vec<float> dv, mv, s, fa, y;
  vec<int8_t> q;
};

static inline __attribute__((always_inline)) void row_reg(const int32_t* d, __m512 dv, __m512 mv, float s, float fa,
                                                          __m512& acc) {
  const __m512 inner = _mm512_fmsub_ps(dv, _mm512_cvtepi32_ps(_mm512_load_si512(d)), _mm512_mul_ps(mv, _mm512_set1_ps(fa)));
  acc = _mm512_fmadd_ps(inner, _mm512_set1_ps(s), acc);
}
static inline __attribute__((always_inline)) void row_mem(const int32_t* d, __m512 dv, __m512 mv, float s, float fa,
                                                          float* acc) {
  const __m512 inner = _mm512_fmsub_ps(dv, _mm512_cvtepi32_ps(_mm512_load_si512(d)), _mm512_mul_ps(mv, _mm512_set1_ps(fa)));
  _mm512_store_ps(acc, _mm512_fmadd_ps(inner, _mm512_set1_ps(s), _mm512_load_ps(acc)));
}

// The kernel's schedule for one block of 16 rows and one panel; TILES / STORES / FLOATS switch its parts.
template <bool TILES, bool STORES, bool FLOATS>
static void block(const Data& D, const int8_t* q, const float* s, const float* fa, float* y) {
  const uint8_t* wb = D.wb0.data();
  const float *dvb = D.dv.data(), *mvb = D.mv.data();
  const int64_t ng = D.ng;
  alignas(64) static thread_local int32_t d[4][ROWS * NO];
#define ACC(r) __m512 acc##r = _mm512_setzero_ps();
  ROWS16(ACC)
#undef ACC
#define COMPUTE(c, ta, tb, g)                                         \
  if (TILES && (g) < ng) {                                            \
    TILE_LOAD(ta, q + (g) * ROWS * G, G);                             \
    TILE_LOAD(tb, wb + (g) * QUADS * 64, 64);                         \
    TILE_ZERO(c);                                                     \
    TILE_DPBSUD(c, ta, tb);                                           \
  }
#define STORE(c, g) \
  if (STORES && (g) < ng) TILE_STORE(c, d[c], 64);
#define ROW(r) row_reg(dg + (r) * NO, dv, mv, sg[r], fg[r], acc##r);
#define GROUP(g)                                                                                             \
  if (FLOATS && (g) < ng) {                                                                                  \
    const int32_t* dg = d[(g) % 4];                                                                          \
    const __m512 dv = _mm512_loadu_ps(dvb + (g) * NO), mv = _mm512_loadu_ps(mvb + (g) * NO);                 \
    const float *sg = s + (g) * ROWS, *fg = fa + (g) * ROWS;                                                 \
    ROWS16(ROW)                                                                                              \
  }
  COMPUTE(0, 4, 6, 0) COMPUTE(1, 5, 7, 1) COMPUTE(2, 4, 6, 2) STORE(0, 0)
  for (int64_t g = 0; g < ng; g += 4) {
    COMPUTE(3, 5, 7, g + 3) STORE(1, g + 1) GROUP(g)
    COMPUTE(0, 4, 6, g + 4) STORE(2, g + 2) GROUP(g + 1)
    COMPUTE(1, 5, 7, g + 5) STORE(3, g + 3) GROUP(g + 2)
    COMPUTE(2, 4, 6, g + 6) STORE(0, g + 4) GROUP(g + 3)
  }
#undef ROW
#define OUT(r) _mm512_storeu_ps(y + (r) * NO, acc##r);
  ROWS16(OUT)
#undef OUT
}

// 2 blocks of 16 rows x 2 panels per group: each tile loaded serves two products (half the tile loads per
// product); the 64 accumulators (2 x 2 x 16 rows) live in memory.
template <bool TILES, bool STORES, bool FLOATS>
static void block22(const Data& D, const int8_t* q0, const int8_t* q1, const float* s0, const float* fa0,
                    const float* s1, const float* fa1, float* y) {
  const int64_t ng = D.ng;
  const uint8_t *wb0 = D.wb0.data(), *wb1 = D.wb1.data();
  alignas(64) static thread_local int32_t d[4][ROWS * NO];
  alignas(64) static thread_local float acc[4][ROWS * NO];
  std::memset(acc, 0, sizeof acc);
  for (int64_t g = 0; g < ng; ++g) {
    if (TILES) {
      TILE_LOAD(4, q0 + g * ROWS * G, G);
      TILE_LOAD(5, q1 + g * ROWS * G, G);
      TILE_LOAD(6, wb0 + g * QUADS * 64, 64);
      TILE_LOAD(7, wb1 + g * QUADS * 64, 64);
      TILE_ZERO(0); TILE_ZERO(1); TILE_ZERO(2); TILE_ZERO(3);
      TILE_DPBSUD(0, 4, 6); TILE_DPBSUD(1, 4, 7); TILE_DPBSUD(2, 5, 6); TILE_DPBSUD(3, 5, 7);
    }
    if (STORES) {
      TILE_STORE(0, d[0], 64); TILE_STORE(1, d[1], 64); TILE_STORE(2, d[2], 64); TILE_STORE(3, d[3], 64);
    }
    if (FLOATS) {
      const __m512 dv = _mm512_loadu_ps(D.dv.data() + g * NO), mv = _mm512_loadu_ps(D.mv.data() + g * NO);
      const float* ss[4] = {s0, s0, s1, s1};
      const float* ff[4] = {fa0, fa0, fa1, fa1};
      for (int t = 0; t < 4; ++t)
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r) row_mem(d[t] + r * NO, dv, mv, ss[t][g * ROWS + r], ff[t][g * ROWS + r], acc[t] + r * NO);
    }
  }
  for (int t = 0; t < 4; ++t) std::memcpy(y + t * ROWS * NO, acc[t], sizeof acc[t]);
}


// The K-quant numerics' schedule (two blocks of 16 rows, Q4_K: affine, 8 groups a super-block); TILES / FLOATS switch
// its parts.
template <bool TILES, bool FLOATS>
static void block_k(const Data& D, int64_t r0, float* y) {
  const int64_t nsb = D.K / 256, ng = D.ng;
  const int8_t *q0 = D.q.data() + r0 * D.K, *q1 = q0 + ROWS * D.K;
  alignas(64) static thread_local int32_t d[4][ROWS * NO];
  alignas(64) static thread_local float acc[2][ROWS * NO];
  std::memset(acc, 0, sizeof acc);
  for (int64_t b = 0; b < nsb; ++b) {
    if (TILES) {
      TILE_ZERO(0); TILE_ZERO(1); TILE_ZERO(2); TILE_ZERO(3);
      for (int64_t c = 4 * b; c < 4 * b + 4; ++c) {
        TILE_LOAD(4, q0 + c * 1024, 64);
        TILE_LOAD(5, q1 + c * 1024, 64);
        TILE_LOAD(6, D.kw.data() + c * 2048, 64);
        TILE_LOAD(7, D.kw.data() + c * 2048 + 1024, 64);
        TILE_DPBSSD(0, 4, 6); TILE_DPBSUD(1, 4, 7); TILE_DPBSSD(2, 5, 6); TILE_DPBSUD(3, 5, 7);
      }
      TILE_STORE(0, d[0], 64); TILE_STORE(1, d[1], 64); TILE_STORE(2, d[2], 64); TILE_STORE(3, d[3], 64);
    }
    if (FLOATS) {
      const __m512 dv = _mm512_loadu_ps(D.dv.data() + b * NO), mv = _mm512_loadu_ps(D.mv.data() + b * NO);
      __m512i pairs[4];
      for (int j = 0; j < 4; ++j) pairs[j] = _mm512_loadu_si512(D.mp.data() + (b * 4 + j) * NO);
      for (int h = 0; h < 2; ++h) {
        const float* sh = D.s.data() + (r0 + h * ROWS) * ng + b * 8 * ROWS;
        const int32_t* ah = D.ap.data() + (r0 + h * ROWS) * (ng / 2) + b * 4 * ROWS;
#pragma GCC unroll 16
        for (int r = 0; r < ROWS; ++r) {
          const __m512i I = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(d[2 * h] + r * NO), 8),
                                             _mm512_load_si512(d[2 * h + 1] + r * NO));
          __m512i m = _mm512_madd_epi16(pairs[0], _mm512_set1_epi32(ah[r]));
          for (int j = 1; j < 4; ++j) m = _mm512_add_epi32(m, _mm512_madd_epi16(pairs[j], _mm512_set1_epi32(ah[j * ROWS + r])));
          const __m512 inner = _mm512_fmsub_ps(dv, _mm512_cvtepi32_ps(I), _mm512_mul_ps(mv, _mm512_cvtepi32_ps(m)));
          _mm512_store_ps(acc[h] + r * NO, _mm512_fmadd_ps(inner, _mm512_set1_ps(sh[r]), _mm512_load_ps(acc[h] + r * NO)));
        }
      }
    }
  }
  std::memcpy(y, acc, sizeof acc);
}
template <bool T, bool F>
static void run_k(const Data& D) {
  for (int64_t r = 0; r < D.M; r += 2 * ROWS) block_k<T, F>(D, r, const_cast<float*>(D.y.data()));
}

using Fn = void (*)(const Data&);
template <bool T, bool S, bool F>
static void run1(const Data& D) {
  for (int64_t r = 0; r < D.M; r += ROWS)
    block<T, S, F>(D, D.q.data() + r * D.K, D.s.data() + r * D.ng, D.fa.data() + r * D.ng, const_cast<float*>(D.y.data()));
}
template <bool T, bool S, bool F>
static void run22(const Data& D) {  // counts as 2 panels: called for every other panel
  for (int64_t r = 0; r < D.M; r += 2 * ROWS)
    block22<T, S, F>(D, D.q.data() + r * D.K, D.q.data() + (r + ROWS) * D.K, D.s.data() + r * D.ng,
                     D.fa.data() + r * D.ng, D.s.data() + (r + ROWS) * D.ng, D.fa.data() + (r + ROWS) * D.ng,
                     const_cast<float*>(D.y.data()));
}

int main(int argc, char** argv) {
  const int64_t M = argc > 1 ? std::atoll(argv[1]) : 256, K = argc > 2 ? std::atoll(argv[2]) : 1536,
                N = argc > 3 ? std::atoll(argv[3]) : 1536, reps = argc > 4 ? std::atoll(argv[4]) : 9;
  if (M % 32 || K % 256 || N % 32) {  // super-blocks of 256 inputs
    std::fprintf(stderr, "rows a multiple of 32, inputs of 256, outputs of 32\n");
    return 2;
  }
  if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    std::puts("AMX not granted: nothing to measure");
    return 3;
  }
  Data D{M, K, K / G, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  std::mt19937 rng(1);
  D.wb0.resize(D.ng * QUADS * 64), D.wb1.resize(D.ng * QUADS * 64), D.q.resize(M * K);
  for (auto& b : D.wb0) b = rng() & 15;
  for (auto& b : D.wb1) b = rng() & 15;
  for (auto& b : D.q) b = (int8_t)(rng() & 255);
  D.kw.resize(K * 32), D.mp.assign(K / 256 * 4 * NO, 0x00030002), D.ap.assign(M * D.ng / 2, 0x00050004);
  for (std::size_t i = 0; i < D.kw.size(); ++i) D.kw[i] = (i / 1024) % 2 ? rng() & 255 : rng() & 3;  // lo, hi (0-3)
  D.dv.assign(D.ng * NO, 0.01f), D.mv.assign(D.ng * NO, 0.02f), D.s.assign(M * D.ng, 0.1f), D.fa.assign(M * D.ng, 3.f);
  D.y.assign(4 * ROWS * NO, 0.f);
  configure();
  struct Variant { const char* name; Fn fn; int panels_per_call; };
  const Variant variants[] = {
      {"the kernel's schedule", run1<true, true, true>, 1},
      {"  tiles: loads + TDPBSUD", run1<true, false, false>, 1},
      {"  tiles + stores of the sums", run1<true, true, false>, 1},
      {"  tiles + float steps (no store)", run1<true, false, true>, 1},
      {"  float steps alone", run1<false, false, true>, 1},
      {"K-quant numerics: super-blocks", run_k<true, true>, 1},
      {"  tiles: loads + TDPBSUD + stores", run_k<true, false>, 1},
      {"  float steps alone", run_k<false, true>, 1},
      {"2x2 blocks (accumulators in memory)", run22<true, true, true>, 2},
      {"  tiles: loads + TDPBSUD", run22<true, false, false>, 2},
      {"  tiles + stores of the sums", run22<true, true, false>, 2},
      {"  float steps alone", run22<false, false, true>, 2},
  };
  const double units = (double)(N / NO) * (M / ROWS) * D.ng;  // group-blocks per product
  std::printf("%lld rows x %lld inputs x %lld outputs, one thread, median of %lld:\n", (long long)M, (long long)K,
              (long long)N, (long long)reps);
  for (const Variant& v : variants) {
    std::vector<double> t;
    for (int64_t i = 0; i < reps; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t p = 0; p < N / NO; p += v.panels_per_call) v.fn(D);
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    const double sec = t[t.size() / 2];
    std::printf("%-38s %7.2f ns per group-block  %6.1f G multiply-adds/s\n", v.name, sec / units * 1e9,
                (double)M * K * N / sec / 1e9);
  }
  asm volatile("tilerelease" ::);
  return 0;
}
