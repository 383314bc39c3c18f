// The normalisation layers the families' blocks are built from (layers.h's Norm), in a header light enough for
// options structs.
#pragma once

namespace tessera::models {

// LayerNorm or RMSNorm, each also in the low-precision variant that runs in the autocast dtype (LLM Foundry's
// LPLayerNorm / LPRMSNorm).
enum class NormType { kLayerNorm, kLowPrecisionLayerNorm, kRMSNorm, kLowPrecisionRMSNorm };

}  // namespace tessera::models
