// Algorithm option schemas.
#include "tessera/algorithms/options.h"

namespace tessera::algorithms {

config::ComponentRegistry& algorithm_registry() {
  static config::ComponentRegistry* registry = [] {
    auto* r = new config::ComponentRegistry("algorithm");
    r->add("gradient_clipping", [](config::Section& s) -> std::any {
      GradientClippingOptions o;
      o.clipping_type = s.get_choice("clipping_type", o.clipping_type, {"norm", "value", "adaptive"});
      o.clipping_threshold = s.require_double("clipping_threshold");
      s.check(o.clipping_threshold > 0, "clipping_threshold", "must be positive");
      s.finish();
      return o;
    });
    r->add_foundry_names({"alibi", "low_precision_layernorm", "seq_length_warmup", "ema", "gated_linear_units",
                          "layer_freezing", "sam", "swa", "selective_backprop", "label_smoothing", "factorize",
                          "stochastic_depth", "low_precision_groupnorm", "lora", "gyro_dropout", "fused_layernorm"});
    return r;
  }();
  return *registry;
}

}  // namespace tessera::algorithms
