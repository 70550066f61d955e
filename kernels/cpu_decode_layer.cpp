// One Llama-shaped decoder layer in one call, for a step whose tokens all attend through the paged cache
// and whose linears are codes (GGUF, multiplied with int8 activations; GPTQ/AWQ 4-bit with float ones) or
// float32 weights (llmctl's panels or torch's linear): the ops the Python layer calls (rms_norm, q8_linear,
// int4_linear, panel_linear or linear, rotary, store_kv, paged_attention, silu_and_mul), one after another.
//
// Why: decoding SmolLM2-135M Q4_1 on two cores, a token's ~420 op calls spent about as long between the
// ops (Python, and the second thread starting again after each pause) as in them. The ops are the same
// ones, found through torch's dispatcher, so this file holds no arithmetic of its own; Python checks
// that a layer qualifies (llmctl/engine/models/coded_decode.py) and tests compare both ways.

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace {

using OptionalTensor = c10::optional<at::Tensor>;

template <class Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// How a linear multiplies (llmctl/engine/models/coded_decode.py names the same numbers).
enum Kernel : int64_t {
  Q8 = 0, Q8_WITH_OFFSETS = 1, INT4_FLOAT = 2, FLOAT_PLAIN = 3, FLOAT_PANELS = 4, Q8_PER_TOKEN = 5, INT8_FLOAT = 6
};

// A float32 linear as cpu_gemm.linear runs it: weight = [panels, plain weight, settings], the panels (or
// the plain weight again) with settings int64 [isa, use_amx]; the bias added after, as the Python layer adds it.
at::Tensor float_linear(const at::Tensor& x, at::TensorList weight, int64_t kernel, const OptionalTensor& bias) {
  static const auto panels = op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, const OptionalTensor&,
                                           bool, int64_t)>("llmctl_cpu::panel_linear");
  at::Tensor y;
  if (kernel == FLOAT_PANELS) {
    const int64_t* settings = weight[2].data_ptr<int64_t>();
    y = panels.call(x, weight[0], weight[1].size(0), c10::nullopt, settings[1] != 0, settings[0]);
  } else {
    y = at::linear(x, weight[1]);
  }
  return bias.has_value() ? y + *bias : y;
}

// A linear: weight = [codes, scales, offsets], by q8_linear (GGUF; W8A8 per token), int4_linear (GPTQ/AWQ) or
// int8_linear (W8A16); or a float one.
at::Tensor linear(const at::Tensor& x, at::TensorList weight, int64_t kernel, const OptionalTensor& bias) {
  static const auto q8 = op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       const OptionalTensor&, int64_t, bool, bool)>("llmctl_cpu::q8_linear");
  static const auto int4 = op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const OptionalTensor&, int64_t)>("llmctl_cpu::int4_linear");
  TORCH_CHECK(weight.size() == 3, "llmctl coded_decoder_layer: a linear is three tensors");
  if (kernel == FLOAT_PLAIN || kernel == FLOAT_PANELS) return float_linear(x, weight, kernel, bias);
  static const auto int8 = op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const OptionalTensor&, int64_t)>("llmctl_cpu::int8_linear");
  if (kernel == INT4_FLOAT) return int4.call(x, weight[0], weight[1], weight[2], bias, 0);
  if (kernel == INT8_FLOAT) return int8.call(x, weight[0], weight[1], weight[2], bias, 0);
  TORCH_CHECK(kernel == Q8 || kernel == Q8_WITH_OFFSETS || kernel == Q8_PER_TOKEN,
              "llmctl coded_decoder_layer: unknown kernel ", kernel);
  return q8.call(x, weight[0], weight[1], weight[2], bias, 0, kernel == Q8_WITH_OFFSETS, kernel == Q8_PER_TOKEN);
}

void rms_norm(const at::Tensor& out, const at::Tensor& x, const OptionalTensor& residual, const at::Tensor& weight, double eps) {
  static const auto norm = op<void(at::Tensor, at::Tensor, const OptionalTensor&, const at::Tensor&, double)>(
      "llmctl_cpu::rms_norm");
  norm.call(out, x, residual, weight, eps);
}

// Attention of the normed hidden states h [T, hidden]: q/k/v, rotary, the new K/V into the cache, paged
// attention, o. `attention` holds: kv_cache, slots, block_tables, seq_lens, query_start_loc, cos, sin.
at::Tensor attend(const at::Tensor& h, at::TensorList qkv, at::TensorList o, at::IntArrayRef kernels,
                  const OptionalTensor& qkv_bias, at::TensorList attention, at::IntArrayRef heads, double scale,
                  int64_t window) {
  static const auto rotary = op<void(at::Tensor, at::Tensor, const at::Tensor&, const at::Tensor&)>(
      "llmctl_cpu::rotary");
  static const auto store = op<void(at::Tensor, const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
      "llmctl_cpu::store_kv");
  static const auto paged = op<void(at::Tensor, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                    const at::Tensor&, const at::Tensor&, double, const OptionalTensor&, int64_t,
                                    double, const OptionalTensor&, int64_t)>("llmctl_cpu::paged_attention");
  TORCH_CHECK(attention.size() == 7 && heads.size() == 3,
              "llmctl coded_decoder_layer: attention is [kv_cache, slots, block_tables, seq_lens, query_start_loc, "
              "cos, sin] and heads [query heads, KV heads, head size]");
  const int64_t tokens = h.size(0), num_heads = heads[0], kv_heads = heads[1], dim = heads[2];
  const at::Tensor fused = linear(h, qkv, kernels[0], qkv_bias);
  at::Tensor q = fused.narrow(1, 0, num_heads * dim).view({tokens, num_heads, dim});
  at::Tensor k = fused.narrow(1, num_heads * dim, kv_heads * dim).view({tokens, kv_heads, dim});
  const at::Tensor v = fused.narrow(1, (num_heads + kv_heads) * dim, kv_heads * dim).view({tokens, kv_heads, dim});
  rotary.call(q, k, attention[5], attention[6]);
  at::Tensor cache = attention[0];
  store.call(cache, attention[1], k, v);
  at::Tensor out = at::empty({tokens, num_heads, dim}, h.options());
  paged.call(out, q, cache, attention[2], attention[3], attention[4], scale, c10::nullopt, window, 0.0,
              c10::nullopt, 0);
  return linear(out.view({tokens, num_heads * dim}), o, kernels[1], c10::nullopt);
}

// x [T, hidden] → x + attention + MLP, as LlamaDecoderLayer.forward (x too becomes x + attention, as there).
// linears: qkv, o, gate_up, down, three tensors each; norms: input, post-attention.
at::Tensor coded_decoder_layer(const at::Tensor& x, at::TensorList norms, double eps, at::TensorList linears,
                               at::IntArrayRef kernels, const OptionalTensor& qkv_bias,
                               at::TensorList attention, at::IntArrayRef heads, double scale, int64_t window) {
  static const auto silu_and_mul = op<void(at::Tensor, const at::Tensor&)>("llmctl_cpu::silu_and_mul");
  TORCH_CHECK(norms.size() == 2 && linears.size() == 12 && kernels.size() == 4,
              "llmctl coded_decoder_layer: two norms, four linears of three tensors each");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "llmctl coded_decoder_layer: x is a contiguous float32 [T, hidden]");
  at::Tensor stream = x;  // updated in place after attention, as the Python layer's add_and_norm does
  at::Tensor normed = at::empty_like(x);
  rms_norm(normed, stream, c10::nullopt, norms[0], eps);
  const at::Tensor attended = attend(normed, linears.slice(0, 3), linears.slice(3, 3), kernels, qkv_bias,
                                     attention, heads, scale, window);
  rms_norm(normed, stream, attended, norms[1], eps);  // stream += attended, then normed
  const at::Tensor gate_up = linear(normed, linears.slice(6, 3), kernels[2], c10::nullopt);
  at::Tensor hidden = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  silu_and_mul.call(hidden, gate_up);
  return stream + linear(hidden, linears.slice(9, 3), kernels[3], c10::nullopt);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(llmctl_cpu, m) {
  m.def("coded_decoder_layer(Tensor x, Tensor[] norms, float eps, Tensor[] linears, int[] kernels, "
        "Tensor? qkv_bias, Tensor[] attention, int[] heads, float scale, int window) -> Tensor");
}

TORCH_LIBRARY_IMPL(llmctl_cpu, CPU, m) { m.impl("coded_decoder_layer", &coded_decoder_layer); }
