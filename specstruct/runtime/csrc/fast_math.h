// Elementwise math shared by the kernels (included by layer_ops.cpp and row_attention.cpp): Cephes-style
// polynomials written so that loops of them vectorize and an element's bits depend on its own value alone (vector
// body or tail, the same arithmetic). native.cpu_key hashes this header with each source that includes it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

// exp(t) for t in [-87, 88]: range reduction by ln 2 (Cephes' two-part constant), a degree-6 polynomial, the power
// of two written into the exponent bits.
static inline float exp_poly(float t) {
  float fn = (t * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  float r = t - fn * 0.693359375f + fn * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(fn) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(float));
  return y * scale;
}

// tanh(x) as Cephes' tanhf: an odd polynomial below 0.625, else 1 - 2 / (exp(2|x|) + 1) with the sign of x; both
// computed and one selected, so that loops of it vectorize.
static inline float tanh_poly(float x) {
  const float z = std::fabs(x), s = x * x;
  const float small = ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s +
                        1.33314422036e-1f) * s - 3.33332819422e-1f) * s * x + x;
  const float big = 1.0f - 2.0f / (exp_poly(std::min(z + z, 88.0f)) + 1.0f);
  return z < 0.625f ? small : (x < 0.0f ? -big : big);
}
