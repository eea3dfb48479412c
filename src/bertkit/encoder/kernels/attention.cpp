// Attention of many short sequences laid end to end (bertkit's packed layout), fp32 or bf16, CPU.
//
// A batch of short texts is hundreds of (sequence, head) problems of a few dozen tokens each.
// Called per run of equal lengths, PyTorch's CPU flash-attention kernel spends most of its time
// outside the arithmetic there (tiny BLAS calls, horizontal reductions, masked tails); this file
// does one problem in registers and L1:
//
// - the sequence's rows (contiguous in the packed (N, 3H) projections) are copied once into a
//   thread-local buffer: a streaming read, where strided reads head by head would wait on memory
//   (bf16 rows are widened to fp32 there: the arithmetic is fp32 in both, as SDPA's CPU kernel
//   does in bf16, and the outputs are rounded to bf16 to nearest even);
// - scores are computed key by key with 16 queries in the vector lanes, so the softmax's maximum
//   and sum run down the lanes, without a horizontal reduction or a masked tail;
// - the weighted sum of values runs 4 queries by hs floats in registers.
//
// Built with GCC/Clang vector extensions (no intrinsics, so any x86-64 or ARM target the compiler
// vectorizes for) and OpenMP, which binds to the libgomp PyTorch has already loaded.
// encoder/native.py compiles it for this CPU on first use; packing.py calls `bertkit_attention`.

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "vector.h"

namespace {

using namespace bertkit;
using bertkit::store;  // overloaded below

typedef uint32_t u16v __attribute__((vector_size(64)));
typedef uint16_t h16 __attribute__((vector_size(32)));
typedef uint16_t h16u __attribute__((vector_size(32), aligned(2)));

constexpr int64_t kMaxLength = 512;    // tokens per sequence
constexpr int64_t kMaxHeadSize = 128;  // hs, a multiple of 16
constexpr int64_t kCopyBytes = 1 << 20;  // longer sequences are read in place

// bf16 (the upper half of an fp32), rounded to nearest even (inputs are finite here)
inline void store(uint16_t* p, v16 x) {
    u16v bits = (u16v)x;
    *(h16u*)p = __builtin_convertvector((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16, h16);
}
// n floats from bf16 values
inline void widen(const uint16_t* from, float* to, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) store(to + i, (v16)(__builtin_convertvector(*(const h16u*)(from + i), u16v) << 16));
    for (; i < n; ++i) {
        uint32_t bits = (uint32_t)from[i] << 16;
        memcpy(to + i, &bits, 4);
    }
}

// One (sequence, head): q, k, v point at the head's columns in the sequence's first row, rows
// `rs` floats apart; `queries` of the `keys` rows attend (all of them, or only the first);
// o receives them, rows `os` floats apart. qt and st are the caller's scratch.
template <int NV, typename Out>
void attend_head(const float* q, const float* k, const float* v, int64_t rs, Out* o, int64_t os,
                 int64_t keys, int64_t queries, float scale, float* qt, float* st) {
    constexpr int hs = 16 * NV;
    for (int64_t i0 = 0; i0 < queries; i0 += 16) {
        const int64_t n = queries - i0 < 16 ? queries - i0 : 16;
        // qt (hs, 16): the block's queries, transposed; lanes past `n` stay zero
        for (int d = 0; d < hs; ++d) *(v16*)(qt + 16 * d) = v16{};
        for (int64_t i = 0; i < n; ++i)
            for (int d = 0; d < hs; ++d) qt[16 * d + i] = q[(i0 + i) * rs + d];
        // st (keys, 16): the scores, key by key, the block's queries in the lanes
        v16 top = broadcast(-__builtin_inff());
        int64_t j = 0;
        for (; j + 4 <= keys; j += 4) {
            v16 a0{}, a1{}, a2{}, a3{};
            const float* k0 = k + j * rs;
            const float *k1 = k0 + rs, *k2 = k1 + rs, *k3 = k2 + rs;
            for (int d = 0; d < hs; ++d) {
                v16 x = *(const v16*)(qt + 16 * d);
                a0 += k0[d] * x;
                a1 += k1[d] * x;
                a2 += k2[d] * x;
                a3 += k3[d] * x;
            }
            a0 *= scale;
            a1 *= scale;
            a2 *= scale;
            a3 *= scale;
            *(v16*)(st + 16 * j) = a0;
            *(v16*)(st + 16 * (j + 1)) = a1;
            *(v16*)(st + 16 * (j + 2)) = a2;
            *(v16*)(st + 16 * (j + 3)) = a3;
            v16 m01 = a0 > a1 ? a0 : a1, m23 = a2 > a3 ? a2 : a3;
            v16 m = m01 > m23 ? m01 : m23;
            top = m > top ? m : top;
        }
        for (; j < keys; ++j) {
            v16 a{};
            const float* kj = k + j * rs;
            for (int d = 0; d < hs; ++d) a += kj[d] * *(const v16*)(qt + 16 * d);
            a *= scale;
            *(v16*)(st + 16 * j) = a;
            top = a > top ? a : top;
        }
        v16 sum{};
        for (j = 0; j < keys; ++j) {
            v16 e = exp_nonpositive(*(v16*)(st + 16 * j) - top);
            *(v16*)(st + 16 * j) = e;
            sum += e;
        }
        v16 inverse = 1.0f / sum;
        // outputs, 4 queries at a time: their weights broadcast from st, the values' rows loaded
        for (int64_t i = 0; i < n; i += 4) {
            v16 acc[4][NV] = {};
            for (j = 0; j < keys; ++j) {
                const float* vj = v + j * rs;
                const float* p = st + 16 * j + i;
                for (int c = 0; c < NV; ++c) {
                    v16 x = load(vj + 16 * c);
                    for (int r = 0; r < 4; ++r) acc[r][c] += p[r] * x;
                }
            }
            for (int r = 0; r < 4 && i + r < n; ++r)
                for (int c = 0; c < NV; ++c) store(o + (i0 + i + r) * os + 16 * c, acc[r][c] * inverse[i + r]);
        }
    }
}

template <typename Out>
using HeadFn = void (*)(const float*, const float*, const float*, int64_t, Out*, int64_t, int64_t, int64_t,
                        float, float*, float*);

template <typename Out>
HeadFn<Out> head_function(int64_t hs) {
    switch (hs) {
        case 16: return attend_head<1, Out>;
        case 32: return attend_head<2, Out>;
        case 48: return attend_head<3, Out>;
        case 64: return attend_head<4, Out>;
        case 80: return attend_head<5, Out>;
        case 96: return attend_head<6, Out>;
        case 112: return attend_head<7, Out>;
        case 128: return attend_head<8, Out>;
        default: return nullptr;
    }
}

// T: float, or uint16_t for bf16 (read widened to fp32, written rounded back)
template <typename T>
int attend(const T* qkv, int64_t rs, T* out, int64_t os, const int64_t* starts, const int64_t* lengths,
           int64_t sequences, int64_t heads, int64_t hs, float scale, int first_only, int threads) {
    HeadFn<T> head = head_function<T>(hs);
    if (head == nullptr) return 1;
    for (int64_t b = 0; b < sequences; ++b)
        if (lengths[b] < 1 || lengths[b] > kMaxLength) return 2;
    const int64_t width = heads * hs;
    #pragma omp parallel num_threads(threads)
    {
        static thread_local std::vector<float> copy;
        alignas(64) float qt[16 * kMaxHeadSize];
        alignas(64) float st[16 * kMaxLength];
        #pragma omp for schedule(dynamic, 1)
        for (int64_t b = 0; b < sequences; ++b) {
            const int64_t keys = lengths[b], rows = keys * rs;
            const float* seq;
            if constexpr (sizeof(T) == 2) {
                if ((int64_t)copy.size() < rows) copy.resize(rows);
                widen(qkv + starts[b] * rs, copy.data(), rows);
                seq = copy.data();
            } else {
                seq = qkv + starts[b] * rs;
                if (rows * (int64_t)sizeof(float) <= kCopyBytes) {
                    if ((int64_t)copy.size() < rows) copy.resize(rows);
                    memcpy(copy.data(), seq, rows * sizeof(float));
                    seq = copy.data();
                }
            }
            T* o = out + (first_only ? b : starts[b]) * os;
            for (int64_t h = 0; h < heads; ++h) {
                const float* q = seq + h * hs;
                head(q, q + width, q + 2 * width, rs, o + h * hs, os, keys, first_only ? 1 : keys, scale, qt, st);
            }
        }
    }
    return 0;
}

}  // namespace

extern "C" {

int bertkit_attention_max_length() { return kMaxLength; }

// qkv: (N, 3 * heads * hs) rows `rs` elements apart, each row [q | k | v], each of them heads × hs,
// fp32, or bf16 with `bf16` set (out too); sequence b holds rows starts[b] .. starts[b] + lengths[b] - 1.
// out: (N, heads * hs) rows `os` elements apart, or with first_only (B, heads * hs): row b the
// attention of sequence b's first token. Returns 0, or 1 for a head size it has no code for, 2 for
// a length outside 1 .. kMaxLength.
int bertkit_attention(const void* qkv, int64_t rs, void* out, int64_t os, const int64_t* starts,
                      const int64_t* lengths, int64_t sequences, int64_t heads, int64_t hs, float scale,
                      int first_only, int bf16, int threads) {
    if (bf16)
        return attend((const uint16_t*)qkv, rs, (uint16_t*)out, os, starts, lengths, sequences, heads, hs, scale,
                      first_only, threads);
    return attend((const float*)qkv, rs, (float*)out, os, starts, lengths, sequences, heads, hs, scale, first_only,
                  threads);
}

}  // extern "C"
