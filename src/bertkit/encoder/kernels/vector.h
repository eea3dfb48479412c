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

// e^x, Cephes' expf (about 1 ulp), x clamped to [-87.3, 88.3]: below, e^-87.3 (1e-38) rather
// than 0, which every caller's sum (at least 1) or product ignores.
inline v16 exp16(v16 x) {
    x = x < broadcast(-87.3f) ? broadcast(-87.3f) : x;
    x = x > broadcast(88.3f) ? broadcast(88.3f) : x;
    v16 n = round_even(x * 1.44269504088896341f);
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
