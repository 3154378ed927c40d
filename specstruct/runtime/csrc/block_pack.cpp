// Packs decoded block-quantized weights into the panels blockq_linear.cpp reads, in one pass (quantized.py's
// QuantWeight.fill does the same with numpy and torch ops, about eight passes over every weight, and stays the
// reference: tests compare the two bytewise).
//
// u [rows, in] uint8: one unsigned value per weight (rows of one panel range; the last panel's missing rows read as
// `pad`). out [panels, groups, bytes] uint8, contiguous. For panel p and group g (of `group` inputs), the 16 rows'
// values as 32-bit quads: v[q][r * 4 + k] = u[p * 16 + r][g * group + q * 4 + k]. Eight bits: v as it is. Fewer:
// a low plane of lb bits (4, or 2 below 4 bits), quad vector i in bits 0..lb-1 of plane byte i, quad vector i + n in
// bits lb..2lb-1, ...; then per quad vector and bit above lb, a 64-bit mask with bit t of byte m for byte m * 8 + t.
#include <torch/extension.h>

#include <cstring>
#include <cstdint>
#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <vector>

namespace {

// Bit h of each of 64 bytes, as one 64-bit word (bit k: byte k).
inline uint64_t bit_mask(const uint8_t* v, int h) {
#if defined(__AVX2__)
  const __m256i lo = _mm256_slli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v)), 7 - h);
  const __m256i hi = _mm256_slli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + 32)), 7 - h);
  return (uint64_t)(uint32_t)_mm256_movemask_epi8(lo) | ((uint64_t)(uint32_t)_mm256_movemask_epi8(hi) << 32);
#else
  uint64_t word = 0;
  for (int k = 0; k < 64; ++k) word |= (uint64_t)((v[k] >> h) & 1) << k;
  return word;
#endif
}

void pack(torch::Tensor u, torch::Tensor out, int64_t group, int64_t bits, int64_t pad) {
  TORCH_CHECK(u.dtype() == torch::kUInt8 && out.dtype() == torch::kUInt8, "u and out must be uint8");
  TORCH_CHECK(u.is_contiguous() && out.is_contiguous() && u.dim() == 2 && out.dim() == 3, "bad shapes");
  TORCH_CHECK(group % 4 == 0 && bits >= 2 && bits <= 8, "unsupported group or bits");
  const int64_t rows = u.size(0), in = u.size(1), panels = out.size(0), groups = out.size(1), bytes = out.size(2);
  const int64_t quads = group / 4, lb = bits >= 8 ? 8 : (bits >= 4 ? 4 : 2), n = quads * lb / 8;
  TORCH_CHECK(groups * group == in && panels * 16 >= rows && bytes == group * 16 * bits / 8, "shapes disagree");
  const uint8_t* U = u.data_ptr<uint8_t>();
  uint8_t* O = out.data_ptr<uint8_t>();
#pragma omp parallel
  {
    std::vector<uint32_t> v32(quads * 16);  // v as 32-bit quads: v32[q * 16 + r]
#pragma omp for schedule(static)
    for (int64_t p = 0; p < panels; ++p) {
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t r = 0; r < 16; ++r) {
          const int64_t row = p * 16 + r;
          if (row < rows) {
            const uint8_t* src = U + row * in + g * group;
            for (int64_t q = 0; q < quads; ++q) std::memcpy(&v32[q * 16 + r], src + q * 4, 4);
          } else {
            const uint32_t fill = 0x01010101u * (uint8_t)pad;
            for (int64_t q = 0; q < quads; ++q) v32[q * 16 + r] = fill;
          }
        }
        const uint8_t* v = reinterpret_cast<const uint8_t*>(v32.data());
        uint8_t* o = O + (p * groups + g) * bytes;
        if (bits == 8) {
          std::memcpy(o, v, quads * 64);
          continue;
        }
        const uint8_t mask = (uint8_t)((1 << lb) - 1);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t b = 0; b < 64; ++b) {
            uint8_t byte = 0;
            for (int64_t j = 0; j < 8 / lb; ++j) byte |= (uint8_t)((v[(j * n + i) * 64 + b] & mask) << (lb * j));
            o[i * 64 + b] = byte;
          }
        o += n * 64;
        for (int64_t q = 0; q < quads; ++q)
          for (int64_t h = lb; h < bits; ++h, o += 8) {
            const uint64_t word = bit_mask(v + q * 64, (int)h);
            std::memcpy(o, &word, 8);  // little-endian: bit t of byte m is byte m * 8 + t's bit
          }
      }
    }
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "decoded block-quantized values [rows, in] into blockq_linear's panels, in one pass",
        py::arg("u"), py::arg("out"), py::arg("group"), py::arg("bits"), py::arg("pad"));
}
