// The recurrent layers' decode step on CPUs: one token per sequence, each sequence's state read from its slot of the
// state cache and written back in place — where torch makes three to five passes over the state (decay, outer-product
// add, contraction with C or q) and gathers / scatters the slots. In float32; states in float32 or bfloat16. The
// torch functions stay the reference in the tests (llmctl.engine.layers.ssd.state_step,
// delta_rule.step_delta_rule, selective_scan.step), as the Triton kernels of kernels/recurrent_decode.py do on GPUs.
//
// - ssd_decode: Mamba2 — per head, dt = clamp(softplus(dt + bias)), h <- exp(dt·A)·h + dt·x ⊗ B, y = h·C + D·x.
// - delta_rule_decode: the gated delta rule — S <- exp(g)·S, S <- S + k ⊗ β(v − Sᵀk), y = Sᵀq (q, k prepared).
// - selective_scan_decode: Mamba (1) — per channel, h <- exp(dt·A)·h + dt·x·B, y = h·C + D·x (dt after softplus).
// - conv_decode: the causal depthwise convolution in front of them — out = w · [window, x] (+ bias), the slot's
//   window of the last K-1 inputs shifted by one in place (reference: llmctl.engine.layers.causal_conv.conv_step).
//
// A row whose slot is negative is a padding row of the graphs' static buffers (llmctl.engine.worker.cuda_graphs):
// it stores nothing and its outputs stay as the caller made them (zeros).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

void check(bool ok, const char* message) { TORCH_CHECK(ok, "llmctl cpu recurrent: ", message); }

float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

void check_common(const at::Tensor& states, const at::Tensor& slots, const at::Tensor& y) {
  check(states.is_contiguous() && (states.scalar_type() == at::kFloat || states.scalar_type() == at::kBFloat16),
        "states are a contiguous float32 or bfloat16 cache");
  check(slots.scalar_type() == at::kLong && slots.is_contiguous(), "slots are int64");
  check(y.scalar_type() == at::kFloat && y.is_contiguous(), "outputs are float32");
}

template <typename S>
void ssd_rows(S* state, int64_t head_dim, int64_t n, float decay, float dt, const float* x, const float* b,
              const float* c, float d, float* y) {
  for (int64_t p = 0; p < head_dim; ++p) {
    S* row = state + p * n;
    const float scaled = dt * x[p];
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) {
      const float h = static_cast<float>(row[i]) * decay + scaled * b[i];
      row[i] = static_cast<S>(h);
      sum += h * c[i];
    }
    y[p] = sum + d * x[p];
  }
}

// states [slots, h, p, n]; x [S, h, p], dt [S, h], B and C [S, g, n] float32; A, D, dt_bias [h] float32
void ssd_decode(at::Tensor states, const at::Tensor& slots, const at::Tensor& x, const at::Tensor& dt,
                const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, const at::Tensor& d,
                const at::Tensor& dt_bias, double dt_min, double dt_max, at::Tensor y) {
  check_common(states, slots, y);
  for (const auto* t : {&x, &dt, &a, &b, &c, &d, &dt_bias})
    check(t->scalar_type() == at::kFloat && t->is_contiguous(), "inputs are contiguous float32");
  const int64_t count = x.size(0), heads = x.size(1), head_dim = x.size(2), n = states.size(3), groups = b.size(1);
  check(states.size(1) == heads && states.size(2) == head_dim && heads % groups == 0, "shapes agree");
  const int64_t* slot = slots.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, states.scalar_type(), "ssd_decode", [&] {
    scalar_t* base = states.data_ptr<scalar_t>();
    at::parallel_for(0, count * heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t job = begin; job < end; ++job) {
        const int64_t seq = job / heads, head = job % heads, group = head / (heads / groups);
        if (slot[seq] < 0) continue;  // a padding row of the graphs' buffers: stores nothing
        float step = softplus(dt.data_ptr<float>()[job] + dt_bias.data_ptr<float>()[head]);
        step = std::min(std::max(step, static_cast<float>(dt_min)), static_cast<float>(dt_max));
        const float decay = std::exp(step * a.data_ptr<float>()[head]);
        ssd_rows(base + (slot[seq] * heads + head) * head_dim * n, head_dim, n, decay, step,
                 x.data_ptr<float>() + job * head_dim, b.data_ptr<float>() + (seq * groups + group) * n,
                 c.data_ptr<float>() + (seq * groups + group) * n, d.data_ptr<float>()[head],
                 y.data_ptr<float>() + job * head_dim);
      }
    });
  });
}

// one sequence's head: two passes over its state S [dk, dv]
template <typename S>
void delta_rule_head(S* s, int64_t dk, int64_t dv, const float* k, const float* q, const float* v, float decay,
                     float weight, float* remembered, float* out) {
  std::fill(remembered, remembered + dv, 0.f);
  for (int64_t i = 0; i < dk; ++i) {  // pass 1: decay, and Sᵀk
    S* row = s + i * dv;
#pragma omp simd
    for (int64_t j = 0; j < dv; ++j) {
      const float h = static_cast<float>(row[j]) * decay;
      row[j] = static_cast<S>(h);
      remembered[j] += k[i] * h;
    }
  }
  for (int64_t j = 0; j < dv; ++j) {
    remembered[j] = (v[j] - remembered[j]) * weight;  // the delta
    out[j] = 0.f;
  }
  for (int64_t i = 0; i < dk; ++i) {  // pass 2: + k ⊗ delta, and Sᵀq
    S* row = s + i * dv;
#pragma omp simd
    for (int64_t j = 0; j < dv; ++j) {
      const float h = static_cast<float>(row[j]) + k[i] * remembered[j];
      row[j] = static_cast<S>(h);
      out[j] += q[i] * h;
    }
  }
}

// states [slots, Hv, dk, dv]; q, k [S, Hv, dk], v [S, Hv, dv], g, beta [S, Hv], all float32
void delta_rule_decode(at::Tensor states, const at::Tensor& slots, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta, at::Tensor y) {
  check_common(states, slots, y);
  for (const auto* t : {&q, &k, &v, &g, &beta})
    check(t->scalar_type() == at::kFloat && t->is_contiguous(), "inputs are contiguous float32");
  const int64_t count = v.size(0), heads = v.size(1), dv = v.size(2), dk = q.size(2);
  check(states.size(1) == heads && states.size(2) == dk && states.size(3) == dv, "shapes agree");
  const int64_t* slot = slots.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, states.scalar_type(), "delta_rule_decode", [&] {
    scalar_t* base = states.data_ptr<scalar_t>();
    at::parallel_for(0, count * heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> remembered(dv);
      for (int64_t job = begin; job < end; ++job) {
        if (slot[job / heads] < 0) continue;  // a padding row of the graphs' buffers: stores nothing
        delta_rule_head(base + (slot[job / heads] * heads + job % heads) * dk * dv, dk, dv,
                        k.data_ptr<float>() + job * dk, q.data_ptr<float>() + job * dk,
                        v.data_ptr<float>() + job * dv, std::exp(g.data_ptr<float>()[job]),
                        beta.data_ptr<float>()[job], remembered.data(), y.data_ptr<float>() + job * dv);
      }
    });
  });
}

// one sequence's channels [first, last): one pass over their states
template <typename S>
void selective_scan_channels(S* states, int64_t first, int64_t last, int64_t n, const float* x, const float* dt,
                             const float* a, const float* b, const float* c, const float* d, float* y) {
  for (int64_t channel = first; channel < last; ++channel) {
    const float xi = x[channel], step = dt[channel];
    const float* aa = a + channel * n;
    S* h = states + channel * n;
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) {
      const float value = static_cast<float>(h[i]) * std::exp(step * aa[i]) + step * xi * b[i];
      h[i] = static_cast<S>(value);
      sum += value * c[i];
    }
    y[channel] = sum + d[channel] * xi;
  }
}

// states [slots, I, n]; x, dt [S, I], B and C [S, n], A [I, n], D [I], all float32
void selective_scan_decode(at::Tensor states, const at::Tensor& slots, const at::Tensor& x, const at::Tensor& dt,
                           const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, const at::Tensor& d,
                           at::Tensor y) {
  check_common(states, slots, y);
  for (const auto* t : {&x, &dt, &a, &b, &c, &d})
    check(t->scalar_type() == at::kFloat && t->is_contiguous(), "inputs are contiguous float32");
  const int64_t count = x.size(0), channels = x.size(1), n = states.size(2);
  check(states.size(1) == channels && a.size(0) == channels && a.size(1) == n, "shapes agree");
  const int64_t* slot = slots.data_ptr<int64_t>();
  constexpr int64_t kChannels = 64;  // channels per task
  const int64_t blocks = (channels + kChannels - 1) / kChannels;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, states.scalar_type(), "selective_scan_decode", [&] {
    scalar_t* base = states.data_ptr<scalar_t>();
    at::parallel_for(0, count * blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t job = begin; job < end; ++job) {
        const int64_t seq = job / blocks, first = (job % blocks) * kChannels;
        if (slot[seq] < 0) continue;  // a padding row of the graphs' buffers: stores nothing
        selective_scan_channels(base + slot[seq] * channels * n, first, std::min(channels, first + kChannels), n,
                                x.data_ptr<float>() + seq * channels, dt.data_ptr<float>() + seq * channels,
                                a.data_ptr<float>(), b.data_ptr<float>() + seq * n, c.data_ptr<float>() + seq * n,
                                d.data_ptr<float>(), y.data_ptr<float>() + seq * channels);
      }
    });
  });
}

template <typename S>
void conv_channels(S* window, int64_t first, int64_t last, int64_t taps, const float* x, const float* weight,
                   const float* bias, float* out) {
  const int64_t kept = taps - 1;
  for (int64_t channel = first; channel < last; ++channel) {
    S* row = window + channel * kept;
    const float* w = weight + channel * taps;
    float sum = bias != nullptr ? bias[channel] : 0.f;
    for (int64_t k = 0; k < kept; ++k) sum += w[k] * static_cast<float>(row[k]);
    sum += w[kept] * x[channel];
    for (int64_t k = 0; k + 1 < kept; ++k) row[k] = row[k + 1];
    if (kept > 0) row[kept - 1] = static_cast<S>(x[channel]);
    out[channel] = sum;
  }
}

// windows [slots, C, K-1] (float32, bfloat16 or float16); x [S, C], weight [C, K], bias [C] or empty: float32
void conv_decode(at::Tensor windows, const at::Tensor& slots, const at::Tensor& x, const at::Tensor& weight,
                 const at::Tensor& bias, at::Tensor out) {
  check(windows.is_contiguous(), "windows are a contiguous cache");
  check(slots.scalar_type() == at::kLong && slots.is_contiguous(), "slots are int64");
  for (const auto* t : {&x, &weight, &bias})
    check(t->scalar_type() == at::kFloat && t->is_contiguous(), "inputs are contiguous float32");
  check(out.scalar_type() == at::kFloat && out.is_contiguous(), "outputs are float32");
  const int64_t count = x.size(0), channels = x.size(1), taps = weight.size(1);
  check(windows.size(1) == channels && windows.size(2) == taps - 1 && weight.size(0) == channels, "shapes agree");
  check(bias.numel() == 0 || bias.numel() == channels, "one bias per channel");
  const int64_t* slot = slots.data_ptr<int64_t>();
  const float* bias_data = bias.numel() > 0 ? bias.data_ptr<float>() : nullptr;
  constexpr int64_t kChannels = 256;  // channels per task
  const int64_t blocks = (channels + kChannels - 1) / kChannels;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, windows.scalar_type(), "conv_decode", [&] {
    scalar_t* base = windows.data_ptr<scalar_t>();
    at::parallel_for(0, count * blocks, 4, [&](int64_t begin, int64_t end) {
      for (int64_t job = begin; job < end; ++job) {
        const int64_t seq = job / blocks, first = (job % blocks) * kChannels;
        if (slot[seq] < 0) continue;  // a padding row of the graphs' buffers: stores nothing
        conv_channels(base + slot[seq] * channels * (taps - 1), first, std::min(channels, first + kChannels), taps,
                      x.data_ptr<float>() + seq * channels, weight.data_ptr<float>(), bias_data,
                      out.data_ptr<float>() + seq * channels);
      }
    });
  });
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(llmctl_cpu, m) {
  m.def("conv_decode(Tensor(a!) windows, Tensor slots, Tensor x, Tensor weight, Tensor bias, Tensor(b!) out) -> ()");
  m.def("ssd_decode(Tensor(a!) states, Tensor slots, Tensor x, Tensor dt, Tensor a, Tensor b, Tensor c, Tensor d, "
        "Tensor dt_bias, float dt_min, float dt_max, Tensor(b!) y) -> ()");
  m.def("delta_rule_decode(Tensor(a!) states, Tensor slots, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta, "
        "Tensor(b!) y) -> ()");
  m.def("selective_scan_decode(Tensor(a!) states, Tensor slots, Tensor x, Tensor dt, Tensor a, Tensor b, Tensor c, "
        "Tensor d, Tensor(b!) y) -> ()");
}

TORCH_LIBRARY_IMPL(llmctl_cpu, CPU, m) {
  m.impl("ssd_decode", &ssd_decode);
  m.impl("delta_rule_decode", &delta_rule_decode);
  m.impl("selective_scan_decode", &selective_scan_decode);
  m.impl("conv_decode", &conv_decode);
}
