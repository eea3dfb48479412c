// What bertkit's kernels share: 16-float vectors (GCC/Clang vector extensions; the compiler maps
// them onto the CPU's vector registers, two of them where those hold 8 floats), their loads and
// stores, and the elementwise functions the kernels need, written out so that they vectorize.

#pragma once

#include <stdint.h>

namespace bertkit {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16v __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));  // unaligned access

inline v16 broadcast(float x) { return v16{} + x; }
inline v16 load(const float* p) { return *(const v16u*)p; }
inline void store(float* p, v16 x) { *(v16u*)p = x; }

// round half to even, as torch.round, for |x| < 2^22: adding 1.5 * 2^23 leaves no fraction bits
inline v16 round_even(v16 x) {
    const v16 big = broadcast(12582912.0f);
    return (x + big) - big;
}

// e^x for x <= 0 (every caller's case: a score less its row's maximum, erf's -x^2), Cephes' expf,
// about 1 ulp. Below -87.3 it returns e^-87.3 (1e-38) rather than 0, which the callers' sums (at
// least 1) and products ignore.
inline v16 exp_nonpositive(v16 x) {
    x = x < broadcast(-87.3f) ? broadcast(-87.3f) : x;
    const v16 big = broadcast(12582912.0f);
    v16 n = (x * 1.44269504088896341f + big) - big;  // round_even
    v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
    v16 p = broadcast(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    i16v exponent = (__builtin_convertvector(n, i16v) + 127) << 23;
    return p * (v16)exponent;
}

}  // namespace bertkit
