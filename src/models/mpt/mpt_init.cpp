// MPT's parameter initialisation: LLM Foundry's schemes (llmfoundry/models/utils/param_init_fns.py).
#include <ATen/ATen.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <functional>
#include <string>

#include "models/mpt/mpt.h"
#include "tessera/util/error.h"

namespace tessera::models {
namespace {

struct Fans {
  double in, out;
};

Fans fans(const at::Tensor& w) {
  return {static_cast<double>(w.size(1)), static_cast<double>(w.size(0))};
}

double gain(const InitOptions& o) {
  if (o.init_nonlinearity == "relu") return std::sqrt(2.0);
  if (o.init_nonlinearity == "leaky_relu") return std::sqrt(2.0 / (1.0 + o.init_gain * o.init_gain));
  return 1.0;  // linear
}

// Applies the scheme's init function to a 2-D weight (or a slice of one).
void init_fn(const MPTOptions& mo, at::Tensor w, at::Generator& gen) {
  const InitOptions& o = mo.init;
  const Fans f = fans(w);
  const double fan = o.fan_mode == "fan_in" ? f.in : f.out;
  if (o.name == "kaiming_normal_") {
    normal_from(w, 0.0, gain(o) / std::sqrt(fan), gen);
  } else if (o.name == "kaiming_uniform_") {
    const double bound = gain(o) * std::sqrt(3.0 / fan);
    uniform_from(w, -bound, bound, gen);
  } else if (o.name == "xavier_uniform_") {
    const double bound = o.init_gain * std::sqrt(6.0 / (f.in + f.out));
    uniform_from(w, -bound, bound, gen);
  } else if (o.name == "xavier_normal_") {
    normal_from(w, 0.0, o.init_gain * std::sqrt(2.0 / (f.in + f.out)), gen);
  } else if (o.name == "baseline_") {
    normal_from(w, 0.0, *o.init_std, gen);
  } else if (o.name == "small_init_" || o.name == "neox_init_") {
    normal_from(w, 0.0, std::sqrt(2.0 / (5.0 * static_cast<double>(mo.d_model))), gen);
  } else {
    throw Error("model", "unknown init scheme " + o.name);
  }
}

double residual_divisor(const MPTOptions& o) {
  if (o.init.name == "neox_init_") return static_cast<double>(o.n_layers) / std::sqrt(10.0);
  return init_div_is_residual(o);
}

// torch's reset_parameters(), for init_config.name: default_.
void torch_default(torch::nn::Module& m, at::Generator& gen) {
  if (auto* lin = m.as<LinearImpl>()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(lin->in_features));
    uniform_from(lin->weight, -bound, bound, gen);  // kaiming_uniform_(a=sqrt(5))
    if (lin->bias.defined()) uniform_from(lin->bias, -bound, bound, gen);
  } else if (auto* emb = m.as<EmbeddingImpl>()) {
    normal_from(emb->weight, 0.0, 1.0, gen);
  } else if (auto* norm = m.as<NormImpl>()) {
    norm->weight.fill_(1.0);
    if (norm->bias.defined()) norm->bias.zero_();
  } else if (auto* experts = m.as<MoEExpertWeightsImpl>()) {
    // No reset_parameters(): LLM Foundry's experts keep the torch.rand values they were built with.
    for (at::Tensor* w : {&experts->w1, &experts->v1, &experts->w2}) {
      if (w->defined()) uniform_from(*w, 0.0, 1.0, gen);
    }
  } else if (auto* layer = m.as<MoEExpertsImpl>()) {
    if (layer->bias.defined()) layer->bias.zero_();
  }
}

}  // namespace

void init_mpt_weights(MPTForCausalLMImpl& model, uint64_t seed, const std::function<bool(const std::string&)>& select) {
  at::NoGradGuard no_grad;
  const MPTOptions& o = model.options();
  const int64_t hd = o.head_dim();
  for (const auto& item : model.named_modules()) {
    if (select && !select(item.key())) continue;
    torch::nn::Module& m = *item.value();
    if (m.parameters(/*recurse=*/false).empty()) continue;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(module_seed(seed, item.key()));
    if (o.init.name == "default_") {
      torch_default(m, gen);
      continue;
    }
    if (auto* lin = m.as<LinearImpl>()) {
      if (item.key().ends_with("Wqkv")) {  // fused: initialise the Q, K and V slices separately
        const int64_t rows[3] = {o.n_heads * hd, o.attn.kv_n_heads * hd, o.attn.kv_n_heads * hd};
        int64_t start = 0;
        for (int64_t r : rows) {
          init_fn(o, lin->weight.narrow(0, start, r), gen);
          start += r;
        }
      } else {
        init_fn(o, lin->weight, gen);
      }
      if (lin->is_residual) lin->weight.div_(residual_divisor(o));
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* emb = m.as<EmbeddingImpl>()) {
      if (o.init.emb_init_std) {
        normal_from(emb->weight, 0.0, *o.init.emb_init_std, gen);
      } else if (o.init.emb_init_uniform_lim) {
        uniform_from(emb->weight, -*o.init.emb_init_uniform_lim, *o.init.emb_init_uniform_lim, gen);
      } else {
        init_fn(o, emb->weight, gen);
      }
    } else if (auto* norm = m.as<NormImpl>()) {
      norm->weight.fill_(1.0);
      if (norm->bias.defined()) norm->bias.zero_();
    } else if (auto* experts = m.as<MoEExpertWeightsImpl>()) {
      // LLM Foundry's moe_init: its torch_dmoe weights whole, as (E F, d) matrices; MegaBlocks' (mb_*) expert by
      // expert, with w2 divided as a residual projection.
      const bool megablocks = o.ffn.moe && o.ffn.moe->ffn_type != "torch_dmoe";
      const int64_t e_count = o.ffn.moe ? o.ffn.moe->num_experts : 1;
      for (at::Tensor* w : {&experts->w1, &experts->v1, &experts->w2}) {
        if (!w->defined()) continue;
        if (!megablocks) {
          init_fn(o, *w, gen);
          continue;
        }
        const int64_t rows = w->size(0) / e_count;
        for (int64_t e = 0; e < e_count; ++e) init_fn(o, w->narrow(0, e * rows, rows), gen);
        if (w == &experts->w2) w->div_(residual_divisor(o));
      }
    } else if (auto* layer = m.as<MoEExpertsImpl>()) {
      if (layer->bias.defined()) layer->bias.zero_();
    }
  }
}

}  // namespace tessera::models
