// The CPU's int8 dot-product peak: every thread runs a register-resident loop of independent accumulator chains of
// one int8 multiply-add instruction, so the figure is the issue rate of the vector units, not memory or latency.
//
//   avx512-vnni  vpdpbusd zmm: 64 u8 x s8 products summed into 16 int32 lanes per instruction (16 chains)
//   avx-vnni     vpdpbusd ymm (VEX): 32 products per instruction (12 chains)
//   avx2         vpmaddubsw + vpmaddwd + vpaddd ymm: 32 products per three instructions (8 chains), the sequence
//                int8 kernels use where VNNI is missing
//
// Built with -march=native: a path exists only where this CPU has its instructions (isas() lists them).
#include <torch/extension.h>
#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <string>
#include <vector>

namespace {

// An empty asm statement that claims to read and write a register: the compiler can neither fold the chain nor
// drop it, and it costs no instruction.
#define KEEP(r) asm volatile("" : "+v"(r))

#if defined(__AVX512VNNI__) && defined(__AVX512F__)
int64_t chains_avx512(int64_t iters, int seed) {
  const __m512i a = _mm512_set1_epi8(static_cast<char>(1 + seed % 3)), b = _mm512_set1_epi8(static_cast<char>(-2));
  __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0,
          c9 = c0, c10 = c0, c11 = c0, c12 = c0, c13 = c0, c14 = c0, c15 = c0;
  for (int64_t i = 0; i < iters; ++i) {
    c0 = _mm512_dpbusd_epi32(c0, a, b); c1 = _mm512_dpbusd_epi32(c1, a, b);
    c2 = _mm512_dpbusd_epi32(c2, a, b); c3 = _mm512_dpbusd_epi32(c3, a, b);
    c4 = _mm512_dpbusd_epi32(c4, a, b); c5 = _mm512_dpbusd_epi32(c5, a, b);
    c6 = _mm512_dpbusd_epi32(c6, a, b); c7 = _mm512_dpbusd_epi32(c7, a, b);
    c8 = _mm512_dpbusd_epi32(c8, a, b); c9 = _mm512_dpbusd_epi32(c9, a, b);
    c10 = _mm512_dpbusd_epi32(c10, a, b); c11 = _mm512_dpbusd_epi32(c11, a, b);
    c12 = _mm512_dpbusd_epi32(c12, a, b); c13 = _mm512_dpbusd_epi32(c13, a, b);
    c14 = _mm512_dpbusd_epi32(c14, a, b); c15 = _mm512_dpbusd_epi32(c15, a, b);
    KEEP(c0); KEEP(c1); KEEP(c2); KEEP(c3); KEEP(c4); KEEP(c5); KEEP(c6); KEEP(c7);
    KEEP(c8); KEEP(c9); KEEP(c10); KEEP(c11); KEEP(c12); KEEP(c13); KEEP(c14); KEEP(c15);
  }
  __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)),
                               _mm512_add_epi32(_mm512_add_epi32(c4, c5), _mm512_add_epi32(c6, c7)));
  s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(c8, c9), _mm512_add_epi32(c10, c11)),
                                           _mm512_add_epi32(_mm512_add_epi32(c12, c13), _mm512_add_epi32(c14, c15))));
  return _mm512_reduce_add_epi32(s);
}
#endif

#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
inline __m256i dp256(__m256i c, __m256i a, __m256i b) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(c, a, b);  // the VEX encoding (AVX-VNNI)
#else
  return _mm256_dpbusd_epi32(c, a, b);  // the EVEX encoding: the same operation on a ymm register
#endif
}

int64_t chains_vnni256(int64_t iters, int seed) {
  const __m256i a = _mm256_set1_epi8(static_cast<char>(1 + seed % 3)), b = _mm256_set1_epi8(static_cast<char>(-2));
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0, c8 = c0,
          c9 = c0, c10 = c0, c11 = c0;
  for (int64_t i = 0; i < iters; ++i) {
    c0 = dp256(c0, a, b); c1 = dp256(c1, a, b); c2 = dp256(c2, a, b); c3 = dp256(c3, a, b);
    c4 = dp256(c4, a, b); c5 = dp256(c5, a, b); c6 = dp256(c6, a, b); c7 = dp256(c7, a, b);
    c8 = dp256(c8, a, b); c9 = dp256(c9, a, b); c10 = dp256(c10, a, b); c11 = dp256(c11, a, b);
    KEEP(c0); KEEP(c1); KEEP(c2); KEEP(c3); KEEP(c4); KEEP(c5);
    KEEP(c6); KEEP(c7); KEEP(c8); KEEP(c9); KEEP(c10); KEEP(c11);
  }
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                               _mm256_add_epi32(_mm256_add_epi32(c4, c5), _mm256_add_epi32(c6, c7)));
  s = _mm256_add_epi32(s, _mm256_add_epi32(_mm256_add_epi32(c8, c9), _mm256_add_epi32(c10, c11)));
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return out[0] + out[7];
}
#endif

#if defined(__AVX2__)
int64_t chains_avx2(int64_t iters, int seed) {
  // Eight distinct (a, b) products, their inputs re-claimed every iteration (KEEP), so that no step is loop-invariant
  // and none is shared between chains: each chain step is a real maddubs + madd + add.
  __m256i a0 = _mm256_set1_epi8(static_cast<char>(1 + seed % 3)), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3),
          a3 = _mm256_set1_epi8(4), b0 = _mm256_set1_epi8(static_cast<char>(-2)), b1 = _mm256_set1_epi8(5);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
#define STEP(c, a, b) c = _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones))
  for (int64_t i = 0; i < iters; ++i) {
    KEEP(a0); KEEP(a1); KEEP(a2); KEEP(a3); KEEP(b0); KEEP(b1);
    STEP(c0, a0, b0); STEP(c1, a1, b0); STEP(c2, a2, b0); STEP(c3, a3, b0);
    STEP(c4, a0, b1); STEP(c5, a1, b1); STEP(c6, a2, b1); STEP(c7, a3, b1);
    KEEP(c0); KEEP(c1); KEEP(c2); KEEP(c3); KEEP(c4); KEEP(c5); KEEP(c6); KEEP(c7);
  }
#undef STEP
  __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)),
                               _mm256_add_epi32(_mm256_add_epi32(c4, c5), _mm256_add_epi32(c6, c7)));
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), s);
  return out[0] + out[7];
}
#endif

// The paths this build has, best first: (name, chains per iteration, products per chain step).
struct Path { const char* name; int64_t (*fn)(int64_t, int); int chains; int products; };

std::vector<Path> paths() {
  std::vector<Path> out;
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
  out.push_back({"avx512-vnni", chains_avx512, 16, 64});
#endif
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
  out.push_back({"avx-vnni", chains_vnni256, 12, 32});
#endif
#if defined(__AVX2__)
  out.push_back({"avx2", chains_avx2, 8, 32});
#endif
  return out;
}

}  // namespace

std::vector<std::string> isas() {
  std::vector<std::string> names;
  for (const auto& p : paths()) names.emplace_back(p.name);
  return names;
}

// Runs `isa`'s loop for `iters` iterations on each of `threads` threads at once; returns
// (wall seconds, multiply-adds done in all, checksum).
std::tuple<double, double, int64_t> run(const std::string& isa, int64_t iters, int threads) {
  for (const auto& p : paths()) {
    if (isa != p.name) continue;
    int64_t sum = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sum)
    sum += p.fn(iters, omp_get_thread_num());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double products = static_cast<double>(iters) * p.chains * p.products * threads;
    return {seconds, products, sum};
  }
  TORCH_CHECK(false, "int8 peak: no '", isa, "' path in this build");
  return {0.0, 0.0, 0};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("isas", &isas, "the int8 paths this build has, best first");
  m.def("run", &run, "run one path on all threads: (seconds, multiply-adds, checksum)");
}
