// Qwen3.5's entries: the `qwen3_5` recipe, its text models' model_types (qwen3_5_text, qwen3_5_moe_text) and the
// published multimodal folders' (qwen3_5, qwen3_5_moe), read as their text models.
#include "tessera/models/family.h"
#include "models/qwen3_5/qwen3_5.h"

namespace tessera::models {

void register_family_qwen3_5(FamilyRegistrar& r) {
  add_keyed_family<Qwen35ForCausalLM>(r, qwen3_5_keys(), {.recipes = {"qwen3_5"}});
  // transformers 5's rope_parameters; mrope_section and mrope_interleaved place image and video positions, which a
  // text model never has (its three position rows are the same), so they change nothing here.
  for (const char* type : {"qwen3_5_text", "qwen3_5_moe_text"}) {
    r.config_forms[type] = {.rope = HfConfigForm::Rope{.partial_key = "partial_rotary_factor", .scaling = false},
                            .rope_ignored = {"mrope_section", "mrope_interleaved"}};
  }
  // Qwen's published checkpoints are Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration folders:
  // the text model under model.language_model, the vision tower under model.visual and the multi-token-prediction
  // heads under mtp, which transformers' AutoModelForCausalLM leaves aside (_keys_to_ignore_on_load_unexpected) and
  // so does Tessera (a fine-tuned model's export is the text model, Qwen3_5ForCausalLM, without them).
  const std::set<std::string> inert = {"vision_config",         "image_token_id",      "video_token_id",
                                       "vision_start_token_id", "vision_end_token_id", "language_model_only"};
  for (const auto& [type, text] :
       {std::pair{"qwen3_5", "qwen3_5_text"}, std::pair{"qwen3_5_moe", "qwen3_5_moe_text"}}) {
    add_multimodal_text_model(r, type,
                              HfAdapter{.text_model_type = text,
                                        .text_prefix = {"model.", "model.language_model."},
                                        .ignored_prefixes = {"model.visual.", "mtp."}},
                              inert);
  }
}

}  // namespace tessera::models
