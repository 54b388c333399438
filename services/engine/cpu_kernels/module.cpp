// The extension module: one registration function per kernel file.
//
// Every kernel is registered with kReleaseGil (common.h): it touches no Python object, so the
// engine's asyncio thread (gRPC, streaming tokens out) runs while a step's kernels do.

#include <torch/extension.h>

void register_paged_decode(pybind11::module& m);
void register_paged_prefill(pybind11::module& m);
void register_elementwise(pybind11::module& m);
void register_packed_linear(pybind11::module& m);
void register_decoder(pybind11::module& m);
void register_argmax(pybind11::module& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  register_paged_decode(m);
  register_paged_prefill(m);
  register_elementwise(m);
  register_packed_linear(m);
  register_decoder(m);
  register_argmax(m);
}
