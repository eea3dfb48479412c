// What runs around an int8 GEMM (torch._int_mm) in bertkit's int8 layers, one pass per row:
// quantizing a Linear's input, and turning the int32 accumulators back into floats with whatever
// follows the Linear (bias, residual, LayerNorm, GELU) and the quantization of the next Linear's
// input, so that a row is read once while it is in L1.
//
// The formulas are backend/int8.py's (dynamic, one range per row) and backend/int8_static.py's
// (static, one calibrated range per Linear), evaluated in the same order, except GELU's erf: a
// rational function (erf16 below), closer to erf than PyTorch's vectorized one and a third of the
// GELU's time cheaper (docs/design.md). Rows are independent, so a row's result never depends on
// its batch.
//
// Vector extensions and OpenMP, no PyTorch headers; encoder/native.py compiles and loads it.

#include <stdint.h>
#include <string.h>

#include <vector>

#include "vector.h"

namespace {

using namespace bertkit;
using bertkit::round_even;  // overloaded below for one float

typedef int32_t i16vu __attribute__((vector_size(64), aligned(4)));
typedef int8_t b16 __attribute__((vector_size(16)));
typedef int8_t b16u __attribute__((vector_size(16), aligned(1)));

// round half to even, as torch.round (the vector form is vector.h's)
inline float round_even(float x) {
    volatile float big = 12582912.0f;  // volatile: no reassociation folds the rounding away
    return (x + big) - big;
}

// erf as a rational function of x on [-4, 4] (beyond, erf is ±1 in float), odd over even
// polynomials in x² (Eigen's and XLA's float erf): 10 FMAs, 2 products and a division, within
// 4.5e-7 of erf (PyTorch's vectorized erf, Abramowitz & Stegun 7.1.26 with an exp: 6.1e-7).
inline v16 erf16(v16 x) {
    x = x < -4.0f ? broadcast(-4.0f) : (x > 4.0f ? broadcast(4.0f) : x);
    const v16 x2 = x * x;
    v16 p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
    p = x2 * p - 2.10102402082508e-06f;
    p = x2 * p - 5.69250639462346e-05f;
    p = x2 * p - 7.34990630326855e-04f;
    p = x2 * p - 2.95459980854025e-03f;
    p = x2 * p - 1.60960333262415e-02f;
    v16 q = x2 * -1.45660718464996e-05f - 2.13374055278905e-04f;
    q = x2 * q - 1.68282697438203e-03f;
    q = x2 * q - 7.37332916720468e-03f;
    q = x2 * q - 1.42647390514189e-02f;
    return x * p / q;
}

enum Activation { kNone = 0, kGeluErf = 1, kRelu = 2 };

// 16 values, already rounded, clamped to int8's range and stored (one value: the same, scalar)
inline void store_int8(int8_t* q, v16 v) {
    v = v < -128.0f ? broadcast(-128.0f) : v;
    v = v > 127.0f ? broadcast(127.0f) : v;
    *(b16u*)q = __builtin_convertvector(__builtin_convertvector(v, i16v), b16);
}
inline int8_t to_int8(float v) { return (int8_t)(v < -128.0f ? -128.0f : (v > 127.0f ? 127.0f : v)); }

inline float sum_lanes(v16 v) {
    float sum = 0.f;
    for (int t = 0; t < 16; ++t) sum += v[t];
    return sum;
}

// Row-wise quantization of x (cols floats) into q, as int8.quantize_rows: the range holds 0,
// scale = (hi - lo) / 255, zero = -128 - round(lo / scale), q = clamp(round(x / scale) + zero).
void quantize_dynamic(const float* x, int64_t cols, int8_t* q, float* scale_out, float* zero_out) {
    v16 lo{}, hi{};
    int64_t j = 0;
    for (; j + 16 <= cols; j += 16) {
        v16 v = load(x + j);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    float l = 0.f, h = 0.f;
    for (int t = 0; t < 16; ++t) {
        l = lo[t] < l ? lo[t] : l;
        h = hi[t] > h ? hi[t] : h;
    }
    for (; j < cols; ++j) {
        l = x[j] < l ? x[j] : l;
        h = x[j] > h ? x[j] : h;
    }
    float range = h - l;
    const float scale = (range > 1e-12f ? range : 1e-12f) / 255.0f;
    const float zero = -128.0f - round_even(l / scale);
    *scale_out = scale;
    *zero_out = zero;
    const v16 s = broadcast(scale), z = broadcast(zero);
    for (j = 0; j + 16 <= cols; j += 16) store_int8(q + j, round_even(load(x + j) / s) + z);
    for (; j < cols; ++j) q[j] = to_int8(round_even(x[j] / scale) + zero);
}

// Static quantization, as int8_static.static_linear_rows: q = clamp(round(x · multiplier) + zero).
void quantize_static(const float* x, int64_t cols, const float* multiplier, float zero, int8_t* q) {
    int64_t j = 0;
    const v16 z = broadcast(zero);
    for (; j + 16 <= cols; j += 16) store_int8(q + j, round_even(load(x + j) * load(multiplier + j)) + z);
    for (; j < cols; ++j) q[j] = to_int8(round_even(x[j] * multiplier[j]) + zero);
}

}  // namespace

extern "C" {

// x (rows, cols) floats, rows xs apart → q (rows, cols) int8, scale and zero (rows,): per row, or
// with multiplier (cols,) non-null one static range (zero `static_zero`, scale/zero untouched).
int bertkit_int8_quantize(const float* x, int64_t rows, int64_t cols, int64_t xs, int8_t* q, float* scale,
                          float* zero, const float* multiplier, float static_zero, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < rows; ++i) {
        if (multiplier) quantize_static(x + i * xs, cols, multiplier, static_zero, q + i * cols);
        else quantize_dynamic(x + i * xs, cols, q + i * cols, scale + i, zero + i);
    }
    return 0;
}

// acc (rows, cols) int32 = q Qᵀ of a Linear whose input was quantized with row_scale/row_zero
// (one per row, or one for all rows when row_step is 0) → per row, in this order:
//   y = float(acc) · (s · weight_scale) − (s · z) · column_sums + bias        (int8.dequantize)
//   y = residual + y                                  where residual is non-null (rows rs apart)
//   y = LayerNorm(y) · gamma + beta                   where gamma is non-null
//   y = act(y)                                        act: 0 none, 1 GELU (erf), 2 ReLU
// then y is written to out (rows os apart) where out is non-null, and quantized for the next
// Linear into q (rows, cols) where q is non-null: per row into q_scale/q_zero, or with
// q_multiplier non-null with that static range.
int bertkit_int8_epilogue(const int32_t* acc, int64_t rows, int64_t cols, const float* row_scale,
                          const float* row_zero, int64_t row_step, const float* weight_scale,
                          const float* column_sums, const float* bias, const float* residual, int64_t rs,
                          const float* gamma, const float* beta, float eps, int act, float* out, int64_t os,
                          int8_t* q, float* q_scale, float* q_zero, const float* q_multiplier,
                          float q_static_zero, int threads) {
    if (act < kNone || act > kRelu) return 1;
    #pragma omp parallel num_threads(threads)
    {
        static thread_local std::vector<float> buffer;
        if ((int64_t)buffer.size() < cols + 16) buffer.resize(cols + 16);
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < rows; ++i) {
            // straight into out where nothing reads the row after it is written (no activation's
            // vector tail, no quantization), else through a row of scratch
            const bool direct = out && !q && act == kNone;
            float* y = direct ? out + i * os : buffer.data();
            const float s = row_scale[i * row_step], z = row_zero[i * row_step];
            const v16 sv = broadcast(s), szv = broadcast(s * z);
            const int32_t* a = acc + i * cols;
            int64_t j = 0;
            for (; j + 16 <= cols; j += 16) {
                v16 v = __builtin_convertvector(*(const i16vu*)(a + j), v16);
                store(y + j, v * (sv * load(weight_scale + j)) - szv * load(column_sums + j) + load(bias + j));
            }
            for (; j < cols; ++j) y[j] = (float)a[j] * (s * weight_scale[j]) - (s * z) * column_sums[j] + bias[j];
            if (residual) {
                const float* r = residual + i * rs;
                for (j = 0; j + 16 <= cols; j += 16) store(y + j, load(r + j) + load(y + j));
                for (; j < cols; ++j) y[j] = r[j] + y[j];
            }
            if (gamma) {
                v16 total{};
                for (j = 0; j + 16 <= cols; j += 16) total += load(y + j);
                float sum = sum_lanes(total);
                for (; j < cols; ++j) sum += y[j];
                const float mean = sum / cols;
                v16 squares{};
                for (j = 0; j + 16 <= cols; j += 16) {
                    v16 d = load(y + j) - mean;
                    squares += d * d;
                }
                float var = sum_lanes(squares);
                for (; j < cols; ++j) var += (y[j] - mean) * (y[j] - mean);
                var /= cols;
                const float rstd = 1.0f / __builtin_sqrtf(var + eps);
                for (j = 0; j + 16 <= cols; j += 16)
                    store(y + j, (load(y + j) - mean) * rstd * load(gamma + j) + load(beta + j));
                for (; j < cols; ++j) y[j] = (y[j] - mean) * rstd * gamma[j] + beta[j];
            }
            if (act != kNone) {
                // the tail of a row goes through the vector code too: y has 16 floats of slack
                for (int64_t t = cols; t < ((cols + 15) & ~(int64_t)15); ++t) y[t] = 0.f;
                for (j = 0; j < cols; j += 16) {
                    v16 v = load(y + j);
                    v = act == kGeluErf ? 0.5f * v * (1.0f + erf16(v * 0.70710678118654752f)) : (v > 0 ? v : v16{});
                    store(y + j, v);
                }
            }
            if (out && !direct) memcpy(out + i * os, y, cols * sizeof(float));
            if (q) {
                if (q_multiplier) quantize_static(y, cols, q_multiplier, q_static_zero, q + i * cols);
                else quantize_dynamic(y, cols, q + i * cols, q_scale + i, q_zero + i);
            }
        }
    }
    return 0;
}


// torch._int_mm from C++, through PyTorch's C shim (aoti_torch_*: the stable C ABI that
// AOTInductor's compiled libraries call), so a whole feed-forward runs in one call from Python,
// without taking the GIL between its steps. The shim's functions come from libtorch_cpu, found
// by the caller, given once to bertkit_int8_set_gemm.
typedef int32_t (*FromBlob)(void* data, int64_t ndim, const int64_t* sizes, const int64_t* strides,
                            int64_t storage_offset, int32_t dtype, int32_t device_type, int32_t device_index,
                            void** out);
typedef int32_t (*DeleteTensor)(void* tensor);
typedef int32_t (*IntMmOut)(void* out, void* self, void* mat2);
static FromBlob from_blob;
static DeleteTensor delete_tensor;
static IntMmOut int_mm_out;
static int32_t dtype_int8, dtype_int32, device_cpu;

int bertkit_int8_set_gemm(void* blob, void* del, void* mm, int32_t i8, int32_t i32, int32_t cpu) {
    from_blob = (FromBlob)blob, delete_tensor = (DeleteTensor)del, int_mm_out = (IntMmOut)mm;
    dtype_int8 = i8, dtype_int32 = i32, device_cpu = cpu;
    return 0;
}

// acc (m, n) = a (m, k) @ b (k, n): torch._int_mm(a, b, out=acc); b's rows b0 apart, columns b1.
static int int_mm(const int8_t* a, int64_t m, int64_t k, const int8_t* b, int64_t n, int64_t b0, int64_t b1,
                  int32_t* acc) {
    const int64_t a_sizes[2] = {m, k}, a_strides[2] = {k, 1}, b_sizes[2] = {k, n}, b_strides[2] = {b0, b1};
    const int64_t c_sizes[2] = {m, n}, c_strides[2] = {n, 1};
    void *ta = nullptr, *tb = nullptr, *tc = nullptr;
    int32_t error = from_blob((void*)a, 2, a_sizes, a_strides, 0, dtype_int8, device_cpu, 0, &ta);
    if (!error) error = from_blob((void*)b, 2, b_sizes, b_strides, 0, dtype_int8, device_cpu, 0, &tb);
    if (!error) error = from_blob(acc, 2, c_sizes, c_strides, 0, dtype_int32, device_cpu, 0, &tc);
    if (!error) error = int_mm_out(tc, ta, tb);
    for (void* t : {ta, tb, tc})
        if (t) delete_tensor(t);
    return error ? 2 : 0;
}

// One Linear of int8.py's Int8Linear: weight_t (in, out) int8, rows s0 apart, columns s1; its
// terms; multiplier non-null for a static input range (scale, zero (1,) and static_zero).
struct Int8LinearArgs {
    const int8_t* weight_t;
    int64_t in, out, s0, s1;
    const float* weight_scale;
    const float* column_sums;
    const float* bias;
    const float* multiplier;
    const float* scale;
    const float* zero;
    float static_zero;
};

struct Int8FeedForwardArgs {
    Int8LinearArgs attn_out, ffn_in, ffn_out;
    const float* gamma1;  // attn_norm
    const float* beta1;
    float eps1;
    const float* gamma2;  // ffn_norm
    const float* beta2;
    float eps2;
    int act;
};

// Int8EncoderLayer._native_feed_forward for one block of rows, in one call and the same steps:
// quantize y for attn_out, GEMM, epilogue (+ x, LayerNorm → a, quantized for ffn_in), GEMM,
// epilogue (activation, quantized for ffn_out), GEMM, epilogue (+ a, LayerNorm → out). Buffers:
// q0, q1 rows × max(H, I) int8, scales 4 × rows, acc rows × max(H, I) int32, a rows × H floats.
int bertkit_int8_feed_forward(const Int8FeedForwardArgs* f, const float* y, int64_t ys, const float* x, int64_t xs,
                              float* out, int64_t os, int64_t rows, int8_t* q0, int8_t* q1, float* scales,
                              int32_t* acc, float* a, int threads) {
    if (!int_mm_out) return 3;
    const Int8LinearArgs &l1 = f->attn_out, &l2 = f->ffn_in, &l3 = f->ffn_out;
    float *s_a = scales, *z_a = scales + rows, *s_b = scales + 2 * rows, *z_b = scales + 3 * rows;
    // the scale and zero point an epilogue reads for l's input: its static range, one for every row
    // (step 0), or the ones its quantization wrote per row at s and z
    struct Range { const float *scale, *zero; int64_t step; };
    auto range = [](const Int8LinearArgs& l, const float* s, const float* z) {
        return l.multiplier ? Range{l.scale, l.zero, 0} : Range{s, z, 1};
    };
    Range r = range(l1, s_a, z_a);
    int error = bertkit_int8_quantize(y, rows, l1.in, ys, q0, s_a, z_a, l1.multiplier, l1.static_zero, threads);
    if (!error) error = int_mm(q0, rows, l1.in, l1.weight_t, l1.out, l1.s0, l1.s1, acc);
    if (!error) error = bertkit_int8_epilogue(acc, rows, l1.out, r.scale, r.zero, r.step, l1.weight_scale,
                                              l1.column_sums, l1.bias, x, xs, f->gamma1, f->beta1, f->eps1, kNone, a,
                                              l1.out, q1, s_b, z_b, l2.multiplier, l2.static_zero, threads);
    r = range(l2, s_b, z_b);
    if (!error) error = int_mm(q1, rows, l2.in, l2.weight_t, l2.out, l2.s0, l2.s1, acc);
    if (!error) error = bertkit_int8_epilogue(acc, rows, l2.out, r.scale, r.zero, r.step, l2.weight_scale,
                                              l2.column_sums, l2.bias, nullptr, 0, nullptr, nullptr, 0.f, f->act,
                                              nullptr, 0, q0, s_a, z_a, l3.multiplier, l3.static_zero, threads);
    r = range(l3, s_a, z_a);
    if (!error) error = int_mm(q0, rows, l3.in, l3.weight_t, l3.out, l3.s0, l3.s1, acc);
    if (!error) error = bertkit_int8_epilogue(acc, rows, l3.out, r.scale, r.zero, r.step, l3.weight_scale,
                                              l3.column_sums, l3.bias, a, l3.out, f->gamma2, f->beta2, f->eps2, kNone,
                                              out, os, nullptr, nullptr, nullptr, nullptr, 0.f, threads);
    return error;
}

}  // extern "C"
