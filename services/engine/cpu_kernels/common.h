// What every kernel file of the extension shares.
#pragma once

#include <torch/extension.h>

// Registration option of every kernel: it runs without holding Python's GIL.
inline const auto kReleaseGil = pybind11::call_guard<pybind11::gil_scoped_release>();
