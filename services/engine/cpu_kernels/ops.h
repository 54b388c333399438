// The kernels other kernel files call directly (the decoder runs a whole forward through them).
// Each is also registered for Python under the same name; see its file for shapes and numerics.
#pragma once

#include <torch/extension.h>

#include <tuple>

namespace turnout_cpu {

// packed_linear.cpp
torch::Tensor pack_linear(const torch::Tensor& weight);
torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& packed, int64_t out,
                            const c10::optional<torch::Tensor>& bias);
// paged_decode.cpp
torch::Tensor paged_decode(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                           const torch::Tensor& block_tables, const torch::Tensor& seq_lens, double scale);
// paged_prefill.cpp
torch::Tensor paged_prefill(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                            const torch::Tensor& block_tables, const torch::Tensor& seq_lens,
                            const torch::Tensor& query_start_loc, double scale);
// elementwise.cpp
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
std::tuple<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& x, const torch::Tensor& residual,
                                                      const torch::Tensor& weight, double eps);
torch::Tensor silu_mul(const torch::Tensor& gate_up);
torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace turnout_cpu
