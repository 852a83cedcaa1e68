// Whether a backward op writes (=) or adds (+=) an input gradient. Parameter gradients are always
// accumulated (so micro-batches sum); input gradients are written unless the caller asks to add,
// which saves a pass where an input feeds two branches (a residual stream into a LayerNorm).
#pragma once
#include <cstdint>

namespace triax::ops {

enum class GradMode : uint8_t { overwrite, accumulate };

}  // namespace triax::ops
