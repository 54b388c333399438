// A Llama-family decoder's layers, whole, in one call: the same kernels, in the same order, as
// the model's modules call them one by one from Python (services/engine/models/llama.py), so the
// output is the same to the bit; what goes is the Python between them. On this project's 2-core
// machine that was 2.5-3 ms of a 12 ms batch-1 bfloat16 decode step (~25 module and tensor calls
// a layer) and ~5 ms of a 25 ms 16-way one (docs/benchmarks.md). The call also releases the GIL
// for the whole forward, so the engine's asyncio thread streams tokens out while it runs.
//
// Per layer (T tokens, hidden H, Hq / Hkv heads of D, intermediate I):
//   hidden, residual = add_rms_norm(hidden, residual, input_norm)    (the first layer: rms_norm)
//   q, k, v          = split(packed_linear(hidden, qkv))              (T, Hq|Hkv|Hkv, D) views
//   q, k             = rotary(q, cos, sin), rotary(k, cos, sin)
//   cache[slots]     = k, v                                           (index_copy_, as _store)
//   hidden           = packed_linear(paged_decode or paged_prefill(q, caches, ...), o)
//   hidden, residual = add_rms_norm(hidden, residual, post_attention_norm)
//   gate_up          = packed_linear(hidden, gate_up)                 (T, 2I)
//   hidden           = packed_linear(silu_mul(gate_up), down)
// and forward returns (hidden, residual) of the last layer: the model's final norm adds them.

#include <torch/extension.h>

#include "common.h"
#include "ops.h"

#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace {

struct Projection {
  torch::Tensor packed;  // pack_linear's layout
  int64_t out;
  c10::optional<torch::Tensor> bias;

  torch::Tensor operator()(const torch::Tensor& x) const { return turnout_cpu::packed_linear(x, packed, out, bias); }
};

struct Layer {
  torch::Tensor input_norm, post_attention_norm;  // (H,) in the model dtype
  Projection qkv, o, gate_up, down;
};

class CpuDecoder {
 public:
  CpuDecoder(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale)
      : num_heads_(num_heads),
        num_kv_heads_(num_kv_heads),
        head_dim_(head_dim),
        eps_(eps),
        scale_(scale) {
    TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0 && head_dim > 0,
                "bad head shape");
  }

  void add_layer(torch::Tensor input_norm, torch::Tensor post_attention_norm, torch::Tensor qkv, int64_t qkv_out,
                 c10::optional<torch::Tensor> qkv_bias, torch::Tensor o, int64_t o_out,
                 c10::optional<torch::Tensor> o_bias, torch::Tensor gate_up, int64_t gate_up_out,
                 c10::optional<torch::Tensor> gate_up_bias, torch::Tensor down, int64_t down_out,
                 c10::optional<torch::Tensor> down_bias) {
    TORCH_CHECK(qkv_out == (num_heads_ + 2 * num_kv_heads_) * head_dim_, "qkv has ", qkv_out, " outputs, the heads ",
                (num_heads_ + 2 * num_kv_heads_) * head_dim_);
    TORCH_CHECK(gate_up_out % 2 == 0, "gate_up's outputs must be gate then up, of equal size");
    layers_.push_back(Layer{std::move(input_norm), std::move(post_attention_norm),
                            Projection{std::move(qkv), qkv_out, std::move(qkv_bias)},
                            Projection{std::move(o), o_out, std::move(o_bias)},
                            Projection{std::move(gate_up), gate_up_out, std::move(gate_up_bias)},
                            Projection{std::move(down), down_out, std::move(down_bias)}});
  }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

  // hidden (T, H): the embeddings; k_caches / v_caches: one (N, block_size, Hkv, D) per layer;
  // cos / sin (T, D/2) float32; slots (T,) int64; tables (B, max_blocks) and lens (B,) per
  // sequence; query_start_loc (B+1,) for a step with prompt chunks (attention by paged_prefill),
  // none for a decode-only step (paged_decode). Returns (hidden, residual) after the last layer.
  std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& embeddings,
                                                   const std::vector<torch::Tensor>& k_caches,
                                                   const std::vector<torch::Tensor>& v_caches,
                                                   const torch::Tensor& cos, const torch::Tensor& sin,
                                                   const torch::Tensor& slots, const torch::Tensor& tables,
                                                   const torch::Tensor& lens,
                                                   const c10::optional<torch::Tensor>& query_start_loc) const {
    TORCH_CHECK(!layers_.empty(), "the decoder has no layers");
    TORCH_CHECK(k_caches.size() == layers_.size() && v_caches.size() == layers_.size(), "one K and V cache per layer");
    TORCH_CHECK(embeddings.dim() == 2, "hidden must be (T, hidden)");
    const int64_t tokens = embeddings.size(0);
    const int64_t q_width = num_heads_ * head_dim_, kv_width = num_kv_heads_ * head_dim_;
    torch::Tensor hidden = embeddings, residual;
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& layer = layers_[i];
      if (i == 0) {
        residual = hidden;
        hidden = turnout_cpu::rms_norm(hidden, layer.input_norm, eps_);
      } else {
        std::tie(hidden, residual) = turnout_cpu::add_rms_norm(hidden, residual, layer.input_norm, eps_);
      }
      const torch::Tensor qkv = layer.qkv(hidden);  // (T, (Hq + 2 Hkv) D)
      const auto q = qkv.narrow(1, 0, q_width).view({tokens, num_heads_, head_dim_});
      const auto k = qkv.narrow(1, q_width, kv_width).view({tokens, num_kv_heads_, head_dim_});
      const auto v = qkv.narrow(1, q_width + kv_width, kv_width).view({tokens, num_kv_heads_, head_dim_});
      const torch::Tensor q_rotated = turnout_cpu::rotary(q, cos, sin);
      const torch::Tensor k_rotated = turnout_cpu::rotary(k, cos, sin);
      const torch::Tensor& k_cache = k_caches[i];
      const torch::Tensor& v_cache = v_caches[i];
      k_cache.view({-1, num_kv_heads_, head_dim_}).index_copy_(0, slots, k_rotated);
      v_cache.view({-1, num_kv_heads_, head_dim_}).index_copy_(0, slots, v);
      const torch::Tensor attended =
          query_start_loc.has_value()
              ? turnout_cpu::paged_prefill(q_rotated, k_cache, v_cache, tables, lens, *query_start_loc, scale_)
              : turnout_cpu::paged_decode(q_rotated, k_cache, v_cache, tables, lens, scale_);
      hidden = layer.o(attended.view({tokens, q_width}));
      std::tie(hidden, residual) = turnout_cpu::add_rms_norm(hidden, residual, layer.post_attention_norm, eps_);
      const torch::Tensor gate_up = layer.gate_up(hidden);  // (T, 2I)
      const torch::Tensor activated = turnout_cpu::silu_mul(gate_up);
      hidden = layer.down(activated);
    }
    return {hidden, residual};
  }

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
  double eps_, scale_;
  std::vector<Layer> layers_;
};

}  // namespace

void register_decoder(pybind11::module& m) {
  pybind11::class_<CpuDecoder>(m, "CpuDecoder", "A Llama-family decoder's layers run in one call (CPU)")
      .def(pybind11::init<int64_t, int64_t, int64_t, double, double>(), pybind11::arg("num_heads"),
           pybind11::arg("num_kv_heads"), pybind11::arg("head_dim"), pybind11::arg("eps"), pybind11::arg("scale"))
      .def("add_layer", &CpuDecoder::add_layer)
      .def_property_readonly("num_layers", &CpuDecoder::num_layers)
      .def("forward", &CpuDecoder::forward, pybind11::arg("embeddings"), pybind11::arg("k_caches"),
           pybind11::arg("v_caches"), pybind11::arg("cos"), pybind11::arg("sin"), pybind11::arg("slots"),
           pybind11::arg("tables"), pybind11::arg("lens"), pybind11::arg("query_start_loc") = pybind11::none(),
           kReleaseGil);
}
