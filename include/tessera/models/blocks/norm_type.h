// The normalisation layers the families' blocks are built from (layers.h's Norm), in a header light enough for
// options structs.
#pragma once

namespace tessera::models {

// LayerNorm or RMSNorm, each also in the low-precision variant that runs in the autocast dtype (LLM Foundry's
// LPLayerNorm / LPRMSNorm); Gemma's RMSNorm, computed in float32 and scaled by (1 + weight), its weight 0 at
// initialisation; and Nemotron's LayerNorm1P.
enum class NormType {
  kLayerNorm,
  kLowPrecisionLayerNorm,
  kRMSNorm,
  kLowPrecisionRMSNorm,
  kOffsetRMSNorm,
  kLayerNorm1P,  // Nemotron's LayerNorm1P: a LayerNorm scaled by (1 + weight), in the autocast dtype with autocast off
};

}  // namespace tessera::models
