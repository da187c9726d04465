// Raw float32 CPU kernels of convolutional nets (see cpu_kernels.h): convolution as im2col
// and GEMM, batch norm, max and average pooling. Fixed summation orders, as in cpu_kernels.cc.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/detail/loop_helpers.h"
#include "kernels/cpu/parallel.h"

namespace remat::kernels::cpu {

using detail::kGrain;
using detail::row_grain;
using detail::zero;

namespace {

// Output size of a window sliding over `in` (padded by 2*pad), 0 when the window never fits.
i64 out_dim(i64 in, i64 pad, i64 k, i64 stride) {
  const i64 span = in + 2 * pad - k;
  return (span < 0 || k <= 0 || stride <= 0) ? 0 : span / stride + 1;
}

// cols[(c*KH + ki)*KW + kj, oh*OW + ow] = x[c, oh*s - pad + ki, ow*s - pad + kj] (0 outside).
void im2col(const float* x, float* cols, i64 ic, i64 h, i64 wd, i64 kh, i64 kw, i64 stride, i64 pad,
            i64 oh, i64 ow) {
  const i64 p = oh * ow;
  for (i64 c = 0; c < ic; ++c) {
    const float* xc = x + c * h * wd;
    for (i64 ki = 0; ki < kh; ++ki) {
      for (i64 kj = 0; kj < kw; ++kj) {
        float* row = cols + ((c * kh + ki) * kw + kj) * p;
        for (i64 y = 0; y < oh; ++y) {
          float* dst = row + y * ow;
          const i64 ih = y * stride - pad + ki;
          if (ih < 0 || ih >= h) {
            zero(dst, ow);
            continue;
          }
          const float* src = xc + ih * wd;
          for (i64 x0 = 0; x0 < ow; ++x0) {
            const i64 iw = x0 * stride - pad + kj;
            dst[x0] = (iw >= 0 && iw < wd) ? src[iw] : 0.0f;
          }
        }
      }
    }
  }
}

// The adjoint of im2col: dx (zeroed here) receives the sum of every column entry it fed.
void col2im(const float* cols, float* dx, i64 ic, i64 h, i64 wd, i64 kh, i64 kw, i64 stride,
            i64 pad, i64 oh, i64 ow) {
  zero(dx, ic * h * wd);
  const i64 p = oh * ow;
  for (i64 c = 0; c < ic; ++c) {
    float* dxc = dx + c * h * wd;
    for (i64 ki = 0; ki < kh; ++ki) {
      for (i64 kj = 0; kj < kw; ++kj) {
        const float* row = cols + ((c * kh + ki) * kw + kj) * p;
        for (i64 y = 0; y < oh; ++y) {
          const i64 ih = y * stride - pad + ki;
          if (ih < 0 || ih >= h) continue;
          const float* src = row + y * ow;
          float* dst = dxc + ih * wd;
          for (i64 x0 = 0; x0 < ow; ++x0) {
            const i64 iw = x0 * stride - pad + kj;
            if (iw >= 0 && iw < wd) dst[iw] += src[x0];
          }
        }
      }
    }
  }
}

}  // namespace

void conv2d_forward(const float* x, const float* w, const float* bias, float* y, float* cols, i64 n,
                    i64 ic, i64 h, i64 wd, i64 oc, i64 kh, i64 kw, i64 stride, i64 pad) {
  const i64 oh = out_dim(h, pad, kh, stride);
  const i64 ow = out_dim(wd, pad, kw, stride);
  const i64 p = oh * ow;
  const i64 kdim = ic * kh * kw;
  for (i64 ni = 0; ni < n; ++ni) {
    const float* xi = x + ni * ic * h * wd;
    float* yi = y + ni * oc * p;
    im2col(xi, cols, ic, h, wd, kh, kw, stride, pad, oh, ow);
    gemm(false, false, oc, p, kdim, 1.0f, w, cols, 0.0f, yi);
    if (bias != nullptr) {
      for (i64 o = 0; o < oc; ++o) {
        float* yo = yi + o * p;
        const float bo = bias[o];
        for (i64 j = 0; j < p; ++j) yo[j] += bo;
      }
    }
  }
}

void conv2d_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     float* dbias, float* cols, i64 n, i64 ic, i64 h, i64 wd, i64 oc, i64 kh,
                     i64 kw, i64 stride, i64 pad) {
  const i64 oh = out_dim(h, pad, kh, stride);
  const i64 ow = out_dim(wd, pad, kw, stride);
  const i64 p = oh * ow;
  const i64 kdim = ic * kh * kw;
  zero(dw, oc * kdim);
  std::vector<double> db_acc(dbias != nullptr ? static_cast<std::size_t>(oc) : 0, 0.0);
  for (i64 ni = 0; ni < n; ++ni) {
    const float* xi = x + ni * ic * h * wd;
    const float* dyi = dy + ni * oc * p;
    // dw += dy_i (OC x P) @ cols_i^T (P x K), accumulated image by image in order.
    im2col(xi, cols, ic, h, wd, kh, kw, stride, pad, oh, ow);
    gemm(false, true, oc, kdim, p, 1.0f, dyi, cols, 1.0f, dw);
    if (dbias != nullptr) {
      for (i64 o = 0; o < oc; ++o) {
        const float* d = dyi + o * p;
        double s = 0.0;
        for (i64 j = 0; j < p; ++j) s += d[j];
        db_acc[o] += s;
      }
    }
    if (dx != nullptr) {
      // dcols = w^T (K x OC) @ dy_i (OC x P), scattered back by col2im.
      gemm(true, false, kdim, p, oc, 1.0f, w, dyi, 0.0f, cols);
      col2im(cols, dx + ni * ic * h * wd, ic, h, wd, kh, kw, stride, pad, oh, ow);
    }
  }
  if (dbias != nullptr) {
    for (i64 o = 0; o < oc; ++o) dbias[o] = static_cast<float>(db_acc[o]);
  }
}

void batchnorm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, i64 n, i64 c, i64 hw, float eps) {
  const i64 count = n * hw;
  for (i64 ch = 0; ch < c; ++ch) {
    double m = 0.0;
    for (i64 ni = 0; ni < n; ++ni) {
      const float* xp = x + (ni * c + ch) * hw;
      for (i64 i = 0; i < hw; ++i) m += xp[i];
    }
    m = count > 0 ? m / static_cast<double>(count) : 0.0;
    double var = 0.0;
    for (i64 ni = 0; ni < n; ++ni) {
      const float* xp = x + (ni * c + ch) * hw;
      for (i64 i = 0; i < hw; ++i) {
        const double d = xp[i] - m;
        var += d * d;
      }
    }
    var = count > 0 ? var / static_cast<double>(count) : 0.0;
    const float mf = static_cast<float>(m);
    const float sf = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    const float g = gamma[ch] * sf;
    const float bt = beta[ch];
    for (i64 ni = 0; ni < n; ++ni) {
      const float* xp = x + (ni * c + ch) * hw;
      float* yp = y + (ni * c + ch) * hw;
      for (i64 i = 0; i < hw; ++i) yp[i] = (xp[i] - mf) * g + bt;
    }
    mean[ch] = mf;
    rstd[ch] = sf;
  }
}

void batchnorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, float* dx, float* dgamma, float* dbeta, i64 n, i64 c,
                        i64 hw) {
  const i64 count = n * hw;
  for (i64 ch = 0; ch < c; ++ch) {
    const float mf = mean[ch];
    const float sf = rstd[ch];
    double sdy = 0.0;
    double sdy_xhat = 0.0;
    for (i64 ni = 0; ni < n; ++ni) {
      const float* xp = x + (ni * c + ch) * hw;
      const float* dyp = dy + (ni * c + ch) * hw;
      for (i64 i = 0; i < hw; ++i) {
        const float xhat = (xp[i] - mf) * sf;
        sdy += dyp[i];
        sdy_xhat += static_cast<double>(dyp[i]) * xhat;
      }
    }
    dbeta[ch] = static_cast<float>(sdy);
    dgamma[ch] = static_cast<float>(sdy_xhat);
    if (count == 0) continue;
    const float mdy = static_cast<float>(sdy / static_cast<double>(count));
    const float mdy_xhat = static_cast<float>(sdy_xhat / static_cast<double>(count));
    const float g = gamma[ch] * sf;
    for (i64 ni = 0; ni < n; ++ni) {
      const float* xp = x + (ni * c + ch) * hw;
      const float* dyp = dy + (ni * c + ch) * hw;
      float* dxp = dx + (ni * c + ch) * hw;
      for (i64 i = 0; i < hw; ++i) {
        const float xhat = (xp[i] - mf) * sf;
        dxp[i] = g * (dyp[i] - mdy - xhat * mdy_xhat);
      }
    }
  }
}

void batchnorm_running_update(float* running_mean, float* running_var, const float* mean,
                              const float* rstd, i64 c, i64 count, float momentum, float eps) {
  // With a single sample the unbiased variance is undefined; the biased one is used instead.
  const double correction =
      count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1) : 1.0;
  const double mom = momentum;
  for (i64 ch = 0; ch < c; ++ch) {
    const double r = rstd[ch];
    const double var = (1.0 / (r * r) - static_cast<double>(eps)) * correction;
    running_mean[ch] = static_cast<float>((1.0 - mom) * running_mean[ch] + mom * mean[ch]);
    running_var[ch] = static_cast<float>((1.0 - mom) * running_var[ch] + mom * var);
  }
}

void maxpool2d_forward(const float* x, float* y, std::int32_t* argmax, i64 n, i64 c, i64 h, i64 wd,
                       i64 k, i64 s) {
  const i64 oh = out_dim(h, 0, k, s);
  const i64 ow = out_dim(wd, 0, k, s);
  for (i64 plane = 0; plane < n * c; ++plane) {
    const float* xp = x + plane * h * wd;
    float* yp = y + plane * oh * ow;
    std::int32_t* ap = argmax + plane * oh * ow;
    for (i64 oy = 0; oy < oh; ++oy) {
      for (i64 ox = 0; ox < ow; ++ox) {
        const i64 y0 = oy * s;
        const i64 x0 = ox * s;
        i64 best_idx = y0 * wd + x0;
        float best = xp[best_idx];
        for (i64 ky = 0; ky < k; ++ky) {
          const float* row = xp + (y0 + ky) * wd + x0;
          for (i64 kx = 0; kx < k; ++kx) {
            if (row[kx] > best) {  // strict: the first maximum wins ties
              best = row[kx];
              best_idx = (y0 + ky) * wd + x0 + kx;
            }
          }
        }
        yp[oy * ow + ox] = best;
        ap[oy * ow + ox] = static_cast<std::int32_t>(best_idx);
      }
    }
  }
}

void maxpool2d_backward(const float* dy, const std::int32_t* argmax, float* dx, i64 n, i64 c, i64 h,
                        i64 wd, i64 k, i64 s) {
  zero(dx, n * c * h * wd);
  const i64 oh = out_dim(h, 0, k, s);
  const i64 ow = out_dim(wd, 0, k, s);
  const i64 p = oh * ow;
  for (i64 plane = 0; plane < n * c; ++plane) {
    float* dxp = dx + plane * h * wd;
    const float* dyp = dy + plane * p;
    const std::int32_t* ap = argmax + plane * p;
    for (i64 j = 0; j < p; ++j) dxp[ap[j]] += dyp[j];
  }
}

void avgpool_forward(const float* x, float* y, i64 n, i64 c, i64 hw) {
  for (i64 plane = 0; plane < n * c; ++plane) {
    const float* xp = x + plane * hw;
    double s = 0.0;
    for (i64 i = 0; i < hw; ++i) s += xp[i];
    y[plane] = hw > 0 ? static_cast<float>(s / static_cast<double>(hw)) : 0.0f;
  }
}

void avgpool_backward(const float* dy, float* dx, i64 n, i64 c, i64 hw) {
  if (hw <= 0) return;
  const float inv = 1.0f / static_cast<float>(hw);
  for (i64 plane = 0; plane < n * c; ++plane) {
    const float g = dy[plane] * inv;
    float* dxp = dx + plane * hw;
    for (i64 i = 0; i < hw; ++i) dxp[i] = g;
  }
}

}  // namespace remat::kernels::cpu
