// Test driver for tests/compat: runs Tessera's MPT on inputs prepared by Python and writes the results, so pytest can
// compare them with Hugging Face transformers and the plain-PyTorch reference.
//
//   tessera_compat_driver forward DIR INPUTS.safetensors OUT.safetensors [--reference]
//       loads the HF folder DIR, runs forward on input_ids (and attention_mask / sequence_id if given), computes the
//       next-token loss on input_ids, backpropagates, and writes logits, loss and grad.<parameter> for every parameter
//   tessera_compat_driver export DIR OUT_DIR [bf16]    loads DIR and writes it back with save_hf_model
//   tessera_compat_driver generate DIR INPUTS.safetensors OUT.safetensors MAX_NEW [EOS]
//       greedy generation for each row of input_ids; writes tokens (B, n) padded with -1
#include <iostream>
#include <map>
#include <string>

#include "tessera/checkpoint/hf.h"
#include "tessera/checkpoint/safetensors.h"
#include "tessera/models/generate.h"
#include "tessera/models/mpt.h"
#include "tessera/util/error.h"

namespace {

using tessera::checkpoint::SafetensorsFile;

int forward(const std::string& dir, const std::string& inputs_path, const std::string& out_path, bool reference) {
  auto model = tessera::checkpoint::load_hf_model(dir);
  model->eval();  // dropout off; the compared configurations use no dropout
  SafetensorsFile inputs(inputs_path);
  const at::Tensor ids = inputs.load("input_ids", at::kLong);
  tessera::models::ForwardOptions fo;
  fo.reference_attention = reference;
  if (inputs.contains("attention_mask")) fo.attention_mask = inputs.load("attention_mask", at::kBool);
  if (inputs.contains("sequence_id")) fo.sequence_id = inputs.load("sequence_id", at::kLong);
  const at::Tensor logits = model->forward(ids, fo);
  const at::Tensor labels = inputs.contains("labels") ? inputs.load("labels", at::kLong) : ids;
  const at::Tensor loss = tessera::models::causal_lm_loss(logits, labels);
  loss.backward();
  std::map<std::string, at::Tensor> out = {{"logits", logits.detach()}, {"loss", loss.detach().reshape({1})}};
  for (const auto& p : model->named_parameters()) out["grad." + p.key()] = p.value().grad();
  tessera::checkpoint::save_safetensors(out_path, out);
  return 0;
}

int generate(const std::string& dir, const std::string& inputs_path, const std::string& out_path, int64_t max_new,
             std::optional<int64_t> eos) {
  auto model = tessera::checkpoint::load_hf_model(dir);
  SafetensorsFile inputs(inputs_path);
  const at::Tensor ids = inputs.load("input_ids", at::kLong);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t b = 0; b < ids.size(0); ++b) {
    const at::Tensor row = ids[b].contiguous();
    prompts.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }
  tessera::models::GenerationOptions g;
  g.max_new_tokens = max_new;
  g.eos_token_id = eos;
  const auto result = tessera::models::generate(model, prompts, g);
  at::Tensor tokens = at::full({ids.size(0), max_new}, -1, at::kLong);
  for (size_t b = 0; b < result.size(); ++b) {
    for (size_t t = 0; t < result[b].size(); ++t)
      tokens[static_cast<int64_t>(b)][static_cast<int64_t>(t)] = result[b][t];
  }
  tessera::checkpoint::save_safetensors(out_path, {{"tokens", tokens}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "forward" && argc >= 5)
      return forward(argv[2], argv[3], argv[4], argc > 5 && std::string(argv[5]) == "--reference");
    if (cmd == "export" && argc >= 4) {
      auto model = tessera::checkpoint::load_hf_model(argv[2]);
      tessera::checkpoint::save_hf_model(model, argv[3],
                                         argc > 4 && std::string(argv[4]) == "bf16" ? at::kBFloat16 : at::kFloat);
      return 0;
    }
    if (cmd == "generate" && argc >= 6) {
      return generate(argv[2], argv[3], argv[4], std::stoll(argv[5]),
                      argc > 6 ? std::optional<int64_t>(std::stoll(argv[6])) : std::nullopt);
    }
    std::cerr << "usage: see the comment at the top of tests/compat/mpt_driver.cpp\n";
    return 2;
  } catch (const tessera::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return e.exit_code();
  }
}
