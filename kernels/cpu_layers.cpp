// Fused elementwise layers for CPUs: RMSNorm (optionally adding the residual first), rotary
// embeddings applied in place, and the SiLU-gated product of Llama's MLP. In torch each is 6-12 small ops per layer, each one a
// dispatch plus a pass over memory; at decode batch sizes that overhead is most of their
// cost. The math is the torch modules' own (llmctl.engine.models.common.RMSNorm,
// llmctl.engine.layers.positions), in float32, and they stay the reference in the tests.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <type_traits>

namespace {

void check(bool ok, const char* message) { TORCH_CHECK(ok, "llmctl cpu layers: ", message); }

// out = weight * (x / rms(x)) over the last dim, rows in parallel; with `residual`, x += residual
// first (in place, so x becomes the new residual stream) as vLLM's fused_add_rms_norm does.
template <typename T>
void rms_rows(at::Tensor& out, at::Tensor& x, const c10::optional<at::Tensor>& residual, const at::Tensor& weight,
              double eps) {
  const int64_t rows = x.size(0), size = x.size(1);
  T* x_ptr = x.data_ptr<T>();
  T* out_ptr = out.data_ptr<T>();
  const T* r_ptr = residual.has_value() ? residual->data_ptr<T>() : nullptr;
  const T* w_ptr = weight.data_ptr<T>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      T* xr = x_ptr + row * size;
      if (r_ptr) {
        const T* rr = r_ptr + row * size;
        for (int64_t i = 0; i < size; ++i) xr[i] = static_cast<T>(static_cast<float>(xr[i]) + static_cast<float>(rr[i]));
      }
      float squares = 0.f;
#pragma omp simd reduction(+ : squares)
      for (int64_t i = 0; i < size; ++i) squares += static_cast<float>(xr[i]) * static_cast<float>(xr[i]);
      const float inverse = 1.f / std::sqrt(squares / static_cast<float>(size) + static_cast<float>(eps));
      T* o = out_ptr + row * size;
      for (int64_t i = 0; i < size; ++i) {  // as transformers: normalize in float32, cast, then scale
        o[i] = static_cast<T>(static_cast<float>(w_ptr[i]) * static_cast<float>(static_cast<T>(static_cast<float>(xr[i]) * inverse)));
      }
    }
  });
}

void rms_norm(at::Tensor out, at::Tensor x, const c10::optional<at::Tensor>& residual, const at::Tensor& weight,
              double eps) {
  check(x.dim() == 2 && x.is_contiguous() && out.is_contiguous() && out.sizes() == x.sizes(),
        "rms_norm takes contiguous [rows, size] tensors");
  check(weight.is_contiguous() && weight.numel() == x.size(1) && weight.scalar_type() == x.scalar_type(),
        "weight is [size] in x's dtype");
  check(!residual.has_value() || (residual->is_contiguous() && residual->sizes() == x.sizes() &&
                                  residual->scalar_type() == x.scalar_type()),
        "residual matches x");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm",
                                  [&] { rms_rows<scalar_t>(out, x, residual, weight, eps); });
}

// Rotate-half RoPE in place on the first `rotary` dims of each head: x [T, H, D] (rows of a
// token may be strided, dims contiguous), cos/sin [T, rotary] holding each frequency twice.
template <typename T>
void rotate_heads(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t tokens = x.size(0), heads = x.size(1), rotary = cos.size(1), half = rotary / 2;
  const int64_t token_stride = x.stride(0), head_stride = x.stride(1);
  T* x_ptr = x.data_ptr<T>();
  const T* c_ptr = cos.data_ptr<T>();
  const T* s_ptr = sin.data_ptr<T>();
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* c = c_ptr + t * rotary;
      const T* s = s_ptr + t * rotary;
      for (int64_t h = 0; h < heads; ++h) {
        T* v = x_ptr + t * token_stride + h * head_stride;
        for (int64_t i = 0; i < half; ++i) {
          const float a = static_cast<float>(v[i]), b = static_cast<float>(v[i + half]);
          v[i] = static_cast<T>(a * static_cast<float>(c[i]) - b * static_cast<float>(s[i]));
          v[i + half] = static_cast<T>(b * static_cast<float>(c[i + half]) + a * static_cast<float>(s[i + half]));
        }
      }
    }
  });
}

void rotary(at::Tensor query, at::Tensor key, const at::Tensor& cos, const at::Tensor& sin) {
  check(cos.dim() == 2 && cos.is_contiguous() && sin.is_contiguous() && cos.sizes() == sin.sizes(),
        "cos and sin are contiguous [T, rotary]");
  for (const at::Tensor* x : {&query, &key}) {
    check(x->dim() == 3 && x->stride(2) == 1 && x->size(0) == cos.size(0) && x->size(2) >= cos.size(1),
          "query and key are [T, heads, D] with contiguous dims");
    check(x->scalar_type() == cos.scalar_type(), "cos/sin in the query's dtype");
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "rotary", [&] {
    rotate_heads<scalar_t>(query, cos, sin);
    rotate_heads<scalar_t>(key, cos, sin);
  });
}

// out [M, I] = silu(x[:, :I]) * x[:, I:] for the fused gate/up output x [M, 2I] (Llama's MLP):
// one pass instead of a split, a silu and a product, each writing an [M, I] temporary.
template <typename T>
void silu_rows(at::Tensor& out, const at::Tensor& x) {
  const int64_t rows = x.size(0), width = out.size(1), row_stride = x.stride(0);
  const T* x_ptr = x.data_ptr<T>();
  T* out_ptr = out.data_ptr<T>();
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const T* gate = x_ptr + row * row_stride;
      const T* up = gate + width;
      T* o = out_ptr + row * width;
      if constexpr (std::is_same_v<T, float>) {  // vectorized, exp through libmvec
#pragma omp simd
        for (int64_t i = 0; i < width; ++i) o[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
      } else {  // as torch: silu rounded to T, then the product
        for (int64_t i = 0; i < width; ++i) {
          const float g = static_cast<float>(gate[i]);
          o[i] = static_cast<T>(static_cast<float>(static_cast<T>(g / (1.f + std::exp(-g)))) * static_cast<float>(up[i]));
        }
      }
    }
  });
}

void silu_and_mul(at::Tensor out, const at::Tensor& x) {
  check(x.dim() == 2 && x.stride(1) == 1 && out.is_contiguous() && out.dim() == 2, "silu_and_mul takes [M, 2I] rows");
  check(x.size(1) == 2 * out.size(1) && x.size(0) == out.size(0) && x.scalar_type() == out.scalar_type(),
        "out is [M, I] in x's dtype");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "silu_and_mul",
                                  [&] { silu_rows<scalar_t>(out, x); });
}

// out [M, I] = gelu_tanh(x[:, :I]) * x[:, I:] (Gemma's GeGLU), as silu_rows does for SiLU.
template <typename T>
void gelu_tanh_rows(at::Tensor& out, const at::Tensor& x) {
  const int64_t rows = x.size(0), width = out.size(1), row_stride = x.stride(0);
  const T* x_ptr = x.data_ptr<T>();
  T* out_ptr = out.data_ptr<T>();
  constexpr float k = 0.7978845608028654f;  // √(2/π)
  auto gelu = [](float g) { return 0.5f * g * (1.f + std::tanh(k * (g + 0.044715f * g * g * g))); };
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const T* gate = x_ptr + row * row_stride;
      const T* up = gate + width;
      T* o = out_ptr + row * width;
      if constexpr (std::is_same_v<T, float>) {
#pragma omp simd
        for (int64_t i = 0; i < width; ++i) o[i] = gelu(gate[i]) * up[i];
      } else {  // as torch: gelu rounded to T, then the product
        for (int64_t i = 0; i < width; ++i) {
          o[i] = static_cast<T>(static_cast<float>(static_cast<T>(gelu(static_cast<float>(gate[i])))) *
                                static_cast<float>(up[i]));
        }
      }
    }
  });
}

void gelu_tanh_and_mul(at::Tensor out, const at::Tensor& x) {
  check(x.dim() == 2 && x.stride(1) == 1 && out.is_contiguous() && out.dim() == 2, "gelu_tanh_and_mul takes [M, 2I] rows");
  check(x.size(1) == 2 * out.size(1) && x.size(0) == out.size(0) && x.scalar_type() == out.scalar_type(),
        "out is [M, I] in x's dtype");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "gelu_tanh_and_mul",
                                  [&] { gelu_tanh_rows<scalar_t>(out, x); });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(llmctl_cpu, m) {
  m.def("rms_norm(Tensor(a!) out, Tensor(b!) x, Tensor? residual, Tensor weight, float eps) -> ()");
  m.def("rotary(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin) -> ()");
  m.def("silu_and_mul(Tensor(a!) out, Tensor x) -> ()");
  m.def("gelu_tanh_and_mul(Tensor(a!) out, Tensor x) -> ()");
}

TORCH_LIBRARY_IMPL(llmctl_cpu, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("rotary", &rotary);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("gelu_tanh_and_mul", &gelu_tanh_and_mul);
}
