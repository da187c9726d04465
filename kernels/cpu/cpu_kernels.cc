// Raw float32 CPU kernels (see cpu_kernels.h). GEMM goes to OpenBLAS (blas.h); the other loops
// run on parallel.h's threads with fixed summation orders, so every call gives the same bits.
#include "kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/detail/loop_helpers.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_exp.h"
#include "kernels/philox.h"

namespace remat::kernels::cpu {

using detail::kGrain;
using detail::row_grain;
using detail::zero;

namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCoeff = 0.044715f;

// y[j] = exp(x[j] - shift) for j < n, in vector steps (Note [Vector exp] in vector_exp.h);
// x and y may be the same. Returns the sum of the y[j] in index order, in double.
double exp_shifted(const float* x, float shift, float* y, i64 n) {
  double sum = 0.0;
  for (i64 j = 0; j < n; j += 4) {
    const Float4 e = exp4(load4(x + j, n - j) - splat4(shift));
    store4(y + j, e, n - j);
    for (i64 l = 0; l < 4 && j + l < n; ++l) sum += static_cast<double>(e[l]);
  }
  return sum;
}

}  // namespace

void gemm(bool trans_a, bool trans_b, i64 m, i64 n, i64 k, float alpha, const float* a,
          const float* b, float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // op(A) op(B) is all zeros: C = beta * C (beta == 0 overwrites).
    const i64 total = m * n;
    if (beta == 0.0f) {
      zero(c, total);
    } else {
      for (i64 i = 0; i < total; ++i) c[i] *= beta;
    }
    return;
  }
  const i64 lda = trans_a ? m : k;
  const i64 ldb = trans_b ? k : n;
  blas_sgemm(trans_a, trans_b, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha,
             a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(n));
}

void bias_add(const float* x, const float* bias, float* y, i64 rows, i64 cols) {
  parallel_for(rows, row_grain(cols), [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      for (i64 j = 0; j < cols; ++j) yr[j] = xr[j] + bias[j];
    }
  });
}

void bias_grad(const float* dy, float* dbias, i64 rows, i64 cols) {
  if (cols <= 0) return;
  std::vector<double> acc(static_cast<std::size_t>(cols), 0.0);
  for (i64 r = 0; r < rows; ++r) {
    const float* dr = dy + r * cols;
    for (i64 j = 0; j < cols; ++j) acc[j] += dr[j];
  }
  for (i64 j = 0; j < cols; ++j) dbias[j] = static_cast<float>(acc[j]);
}

void fill_zero(void* p, std::size_t bytes) {
  if (bytes > 0) std::memset(p, 0, bytes);
}

void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void add(const float* a, const float* b, float* y, i64 n) {
  for (i64 i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void mul(const float* a, const float* b, float* y, i64 n) {
  for (i64 i = 0; i < n; ++i) y[i] = a[i] * b[i];
}

void scale(const float* x, float s, float* y, i64 n) {
  for (i64 i = 0; i < n; ++i) y[i] = x[i] * s;
}

// Note [GELU as a sigmoid]
// The tanh approximation, 0.5 v (1 + tanh(z)) with z = sqrt(2/pi) (v + 0.044715 v^3), is
// v * sigmoid(2z) = v / (1 + exp(-2z)): one vector exp (vector_exp.h) instead of a scalar
// tanhf, and accurate where 1 + tanh(z) is tiny (large negative v). The derivative follows
// from s = sigmoid(2z): 0.5 (1 + tanh z) = s and 1 - tanh^2 z = 4 s (1 - s).
Float4 gelu_sigmoid(Float4 v) {
  const Float4 z = splat4(kGeluScale) * (v + splat4(kGeluCoeff) * v * v * v);
  return splat4(1.0f) / (splat4(1.0f) + exp4(splat4(-2.0f) * z));
}

void gelu_forward(const float* x, float* y, i64 n) {
  parallel_for(
      n, kGrain / 4,
      [&](i64 i0, i64 i1) {
        for (i64 i = i0; i < i1; i += 4) {
          const Float4 v = load4(x + i, i1 - i);
          store4(y + i, v * gelu_sigmoid(v), i1 - i);
        }
      },
      4);
}

void gelu_backward(const float* x, const float* dy, float* dx, i64 n) {
  parallel_for(
      n, kGrain / 4,
      [&](i64 i0, i64 i1) {
        for (i64 i = i0; i < i1; i += 4) {
          const Float4 v = load4(x + i, i1 - i);
          const Float4 s = gelu_sigmoid(v);
          const Float4 dz = splat4(kGeluScale) * (splat4(1.0f) + splat4(3.0f * kGeluCoeff) * v * v);
          const Float4 local = s + splat4(2.0f) * v * s * (splat4(1.0f) - s) * dz;
          store4(dx + i, local * load4(dy + i, i1 - i), i1 - i);
        }
      },
      4);
}

void relu_forward(const float* x, float* y, i64 n) {
  for (i64 i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void relu_backward(const float* x, const float* dy, float* dx, i64 n) {
  for (i64 i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

void sigmoid_forward(const float* x, float* y, i64 n) {
  for (i64 i = 0; i < n; ++i) {
    const float v = x[i];
    if (v >= 0.0f) {
      y[i] = 1.0f / (1.0f + std::exp(-v));
    } else {
      const float e = std::exp(v);
      y[i] = e / (1.0f + e);
    }
  }
}

void sigmoid_backward(const float* y, const float* dy, float* dx, i64 n) {
  for (i64 i = 0; i < n; ++i) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

void tanh_forward(const float* x, float* y, i64 n) {
  for (i64 i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}

void tanh_backward(const float* y, const float* dy, float* dx, i64 n) {
  for (i64 i = 0; i < n; ++i) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

void sum(const float* x, float* y, i64 n) {
  double acc = 0.0;
  for (i64 i = 0; i < n; ++i) acc += x[i];
  y[0] = static_cast<float>(acc);
}

void layernorm_forward(const float* x, const float* w, const float* b, float* y, float* mean,
                       float* rstd, i64 rows, i64 c, float eps) {
  parallel_for(rows, row_grain(c), [&](i64 r0, i64 r1) {
    for (i64 r = r0; r < r1; ++r) {
      const float* xr = x + r * c;
      float* yr = y + r * c;
      double m = 0.0;
      for (i64 j = 0; j < c; ++j) m += xr[j];
      m = c > 0 ? m / static_cast<double>(c) : 0.0;
      double var = 0.0;
      for (i64 j = 0; j < c; ++j) {
        const double d = xr[j] - m;
        var += d * d;
      }
      var = c > 0 ? var / static_cast<double>(c) : 0.0;
      const float mf = static_cast<float>(m);
      const float sf = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
      for (i64 j = 0; j < c; ++j) yr[j] = (xr[j] - mf) * sf * w[j] + b[j];
      mean[r] = mf;
      rstd[r] = sf;
    }
  });
}

void layernorm_backward(const float* dy, const float* x, const float* w, const float* mean,
                        const float* rstd, float* dx, float* dw, float* db, i64 rows, i64 c) {
  if (c <= 0) return;
  std::vector<double> dw_acc(static_cast<std::size_t>(c), 0.0);
  std::vector<double> db_acc(static_cast<std::size_t>(c), 0.0);
  for (i64 r = 0; r < rows; ++r) {
    const float* dyr = dy + r * c;
    const float* xr = x + r * c;
    float* dxr = dx + r * c;
    const float mf = mean[r];
    const float sf = rstd[r];
    double dnorm_mean = 0.0;
    double dnorm_norm_mean = 0.0;
    for (i64 j = 0; j < c; ++j) {
      const float norm = (xr[j] - mf) * sf;
      const float dnorm = w[j] * dyr[j];
      dnorm_mean += dnorm;
      dnorm_norm_mean += static_cast<double>(dnorm) * norm;
      dw_acc[j] += static_cast<double>(dyr[j]) * norm;
      db_acc[j] += dyr[j];
    }
    const float a = static_cast<float>(dnorm_mean / static_cast<double>(c));
    const float bm = static_cast<float>(dnorm_norm_mean / static_cast<double>(c));
    for (i64 j = 0; j < c; ++j) {
      const float norm = (xr[j] - mf) * sf;
      dxr[j] = (w[j] * dyr[j] - a - norm * bm) * sf;
    }
  }
  for (i64 j = 0; j < c; ++j) {
    dw[j] = static_cast<float>(dw_acc[j]);
    db[j] = static_cast<float>(db_acc[j]);
  }
}

void softmax_forward(const float* x, float* y, i64 rows, i64 cols) {
  for (i64 r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    if (cols <= 0) continue;
    float mx = -INFINITY;
    for (i64 j = 0; j < cols; ++j) mx = std::max(mx, xr[j]);
    const double s = exp_shifted(xr, mx, yr, cols);
    const float inv = static_cast<float>(1.0 / s);
    for (i64 j = 0; j < cols; ++j) yr[j] *= inv;
  }
}

void softmax_backward(const float* y, const float* dy, float* dx, i64 rows, i64 cols) {
  for (i64 r = 0; r < rows; ++r) {
    const float* yr = y + r * cols;
    const float* dyr = dy + r * cols;
    float* dxr = dx + r * cols;
    double dot = 0.0;
    for (i64 j = 0; j < cols; ++j) dot += static_cast<double>(yr[j]) * dyr[j];
    const float d = static_cast<float>(dot);
    for (i64 j = 0; j < cols; ++j) dxr[j] = yr[j] * (dyr[j] - d);
  }
}

// Note [Attention as GEMMs]
// Per (batch, head) the attention is three matrix products over strided views of qkv (a
// head's q, k and v are hs columns of rows 3C apart, which BLAS takes as a leading
// dimension): scores = sc q k^T, out = att v; and backward dv = att^T dout, datt = dout v^T,
// dq = dpre k, dk = dpre^T q. The products cover the whole t x t square, twice the causal
// triangle's work, at GEMM speed instead of one dot product at a time; the masked half of
// att is zero, so it adds nothing. Each product has a fixed shape and OpenBLAS a fixed thread
// count, so a recomputation gives the same bits.
void attention_forward(const float* qkv, float* out, float* att, i64 b, i64 t, i64 c, i64 nh) {
  if (nh <= 0 || t <= 0) return;
  const i64 hs = c / nh;
  const i64 c3 = 3 * c;
  const float sc = hs > 0 ? 1.0f / std::sqrt(static_cast<float>(hs)) : 1.0f;
  const int ti = static_cast<int>(t), hi = static_cast<int>(hs);
  for (i64 bi = 0; bi < b; ++bi) {
    for (i64 h = 0; h < nh; ++h) {
      const float* q = qkv + bi * t * c3 + h * hs;
      const float* k = q + c;
      const float* v = q + 2 * c;
      float* a = att + (bi * nh + h) * t * t;
      if (hs > 0)
        blas_sgemm(false, true, ti, ti, hi, sc, q, static_cast<int>(c3), k, static_cast<int>(c3),
                   0.0f, a, ti);
      else
        zero(a, t * t);
      // A stable softmax over each row's causal prefix; the rest of the row is zero.
      parallel_for(t, row_grain(t), [&](i64 r0, i64 r1) {
        for (i64 r = r0; r < r1; ++r) {
          float* row = a + r * t;
          float mx = -INFINITY;
          for (i64 j = 0; j <= r; ++j) mx = std::max(mx, row[j]);
          const float inv = static_cast<float>(1.0 / exp_shifted(row, mx, row, r + 1));
          for (i64 j = 0; j <= r; ++j) row[j] *= inv;
          for (i64 j = r + 1; j < t; ++j) row[j] = 0.0f;
        }
      });
      if (hs > 0)
        blas_sgemm(false, false, ti, hi, ti, 1.0f, a, ti, v, static_cast<int>(c3), 0.0f,
                   out + bi * t * c + h * hs, static_cast<int>(c));
    }
  }
}

void attention_backward(const float* dout, const float* qkv, const float* att, float* dqkv, i64 b,
                        i64 t, i64 c, i64 nh) {
  zero(dqkv, b * t * 3 * c);
  if (nh <= 0 || t <= 0) return;
  const i64 hs = c / nh;
  if (hs <= 0) return;
  const i64 c3 = 3 * c;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const int ti = static_cast<int>(t), hi = static_cast<int>(hs), ld3 = static_cast<int>(c3),
            ld = static_cast<int>(c);
  std::vector<float> dpre(static_cast<std::size_t>(t * t));
  for (i64 bi = 0; bi < b; ++bi) {
    for (i64 h = 0; h < nh; ++h) {
      const float* q = qkv + bi * t * c3 + h * hs;
      const float* k = q + c;
      const float* v = q + 2 * c;
      float* dq = dqkv + bi * t * c3 + h * hs;
      float* dk = dq + c;
      float* dv = dq + 2 * c;
      const float* a = att + (bi * nh + h) * t * t;
      const float* dout_h = dout + bi * t * c + h * hs;
      // Through out = att v.
      blas_sgemm(true, false, ti, hi, ti, 1.0f, a, ti, dout_h, ld, 0.0f, dv, ld3);
      blas_sgemm(false, true, ti, ti, hi, 1.0f, dout_h, ld, v, ld3, 0.0f, dpre.data(), ti);
      // Through the softmax and the scale: dpre = att (datt - sum(att datt)) sc.
      parallel_for(t, row_grain(t), [&](i64 r0, i64 r1) {
        for (i64 r = r0; r < r1; ++r) {
          const float* arow = a + r * t;
          float* drow = dpre.data() + r * t;
          float dsum = 0.0f;
          for (i64 j = 0; j <= r; ++j) dsum += arow[j] * drow[j];
          for (i64 j = 0; j <= r; ++j) drow[j] = arow[j] * (drow[j] - dsum) * sc;
          for (i64 j = r + 1; j < t; ++j) drow[j] = 0.0f;
        }
      });
      // Through the scores: dq = dpre k, dk = dpre^T q.
      blas_sgemm(false, false, ti, hi, ti, 1.0f, dpre.data(), ti, k, ld3, 0.0f, dq, ld3);
      blas_sgemm(true, false, ti, hi, ti, 1.0f, dpre.data(), ti, q, ld3, 0.0f, dk, ld3);
    }
  }
}

void embedding_forward(const std::int32_t* idx, const float* wte, const float* wpe, float* out,
                       i64 b, i64 t, i64 c) {
  for (i64 bi = 0; bi < b; ++bi) {
    for (i64 ti = 0; ti < t; ++ti) {
      const i64 row = bi * t + ti;
      const float* e = wte + static_cast<i64>(idx[row]) * c;
      float* o = out + row * c;
      if (wpe != nullptr) {
        const float* p = wpe + ti * c;
        for (i64 j = 0; j < c; ++j) o[j] = e[j] + p[j];
      } else {
        for (i64 j = 0; j < c; ++j) o[j] = e[j];
      }
    }
  }
}

void embedding_backward(const float* dout, const std::int32_t* idx, float* dwte, float* dwpe, i64 b,
                        i64 t, i64 c, i64 v) {
  zero(dwte, v * c);
  if (dwpe != nullptr) zero(dwpe, t * c);
  for (i64 bi = 0; bi < b; ++bi) {
    for (i64 ti = 0; ti < t; ++ti) {
      const i64 row = bi * t + ti;
      const float* d = dout + row * c;
      float* e = dwte + static_cast<i64>(idx[row]) * c;
      for (i64 j = 0; j < c; ++j) e[j] += d[j];
      if (dwpe != nullptr) {
        float* p = dwpe + ti * c;
        for (i64 j = 0; j < c; ++j) p[j] += d[j];
      }
    }
  }
}

// Rows are independent: each is one thread's, in a fixed order (Note [Deterministic
// threading]). The exponentials are float (exp_shifted), their sums double.
void cross_entropy_forward(const float* logits, const std::int32_t* targets, float* losses, i64 n,
                           i64 v) {
  parallel_for(n, row_grain(v), [&](i64 i0, i64 i1) {
    std::vector<float> e(static_cast<std::size_t>(v));
    for (i64 i = i0; i < i1; ++i) {
      const float* l = logits + i * v;
      float mx = -INFINITY;
      for (i64 j = 0; j < v; ++j) mx = std::max(mx, l[j]);
      const double s = exp_shifted(l, mx, e.data(), v);
      losses[i] = static_cast<float>(std::log(s) - static_cast<double>(l[targets[i]] - mx));
    }
  });
}

void cross_entropy_backward(const float* logits, const std::int32_t* targets, const float* dloss,
                            float scale, float* dlogits, i64 n, i64 v) {
  const float g = n > 0 ? dloss[0] * scale : 0.0f;
  parallel_for(n, row_grain(v), [&](i64 i0, i64 i1) {
    for (i64 i = i0; i < i1; ++i) {
      const float* l = logits + i * v;
      float* d = dlogits + i * v;
      float mx = -INFINITY;
      for (i64 j = 0; j < v; ++j) mx = std::max(mx, l[j]);
      const double inv = 1.0 / exp_shifted(l, mx, d, v);
      const i64 tgt = targets[i];
      for (i64 j = 0; j < v; ++j) {
        const double p = static_cast<double>(d[j]) * inv;
        d[j] = static_cast<float>((p - (j == tgt ? 1.0 : 0.0)) * static_cast<double>(g));
      }
    }
  });
}

void dropout_forward(const float* x, float* y, std::uint8_t* mask, i64 n, float p,
                     std::uint64_t seed, std::uint64_t offset) {
  const Philox rng(seed, offset);
  const float keep = 1.0f - p;
  // Element i uses word i % 4 of block i / 4: the same number Philox::uniform(i) returns,
  // with one block computed per four elements (so chunks start at multiples of four).
  parallel_for(
      n, kGrain,
      [&](i64 i0, i64 i1) {
        for (i64 base = i0; base < i1; base += 4) {
          const PhiloxBlock blk = rng.block(static_cast<std::uint64_t>(base) / 4);
          const i64 end = std::min<i64>(base + 4, i1);
          for (i64 i = base; i < end; ++i) {
            const float u = static_cast<float>(blk.w[i - base] >> 8) * (1.0f / 16777216.0f);
            const bool kept = u >= p;
            mask[i] = kept ? 1 : 0;
            y[i] = kept ? x[i] / keep : 0.0f;
          }
        }
      },
      /*align=*/4);
}

void dropout_backward(const float* dy, const std::uint8_t* mask, float* dx, i64 n, float p) {
  const float keep = 1.0f - p;
  parallel_for(n, kGrain, [&](i64 i0, i64 i1) {
    for (i64 i = i0; i < i1; ++i) dx[i] = mask[i] ? dy[i] / keep : 0.0f;
  });
}

void adamw_update(float* param, float* m, float* v, const float* grad, i64 n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t) {
  const float bc1 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta1), t));
  const float bc2 = 1.0f - static_cast<float>(std::pow(static_cast<double>(beta2), t));
  parallel_for(n, kGrain, [&](i64 i0, i64 i1) {
    for (i64 i = i0; i < i1; ++i) {
      const float g = grad[i];
      const float mi = beta1 * m[i] + (1.0f - beta1) * g;
      const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
      m[i] = mi;
      v[i] = vi;
      const float mhat = mi / bc1;
      const float vhat = vi / bc2;
      param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
    }
  });
}

}  // namespace remat::kernels::cpu
