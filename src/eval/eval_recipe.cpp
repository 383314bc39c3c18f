// LLM Foundry's evaluation YAML (see eval_recipe.h).
#include "tessera/eval/eval_recipe.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>

#include "tessera/config/reader.h"
#include "tessera/util/error.h"

namespace tessera::eval {

namespace {

namespace fs = std::filesystem;

// A relative path from a recipe: from the current directory when it exists there, else beside the recipe.
std::string resolve_beside(const std::string& path, const std::string& base_dir) {
  if (fs::path(path).is_absolute() || fs::exists(path)) return path;
  const fs::path beside = fs::path(base_dir) / path;
  return fs::exists(beside) ? beside.string() : path;
}

// One `models` entry: {model_name, model: {...}, tokenizer: {name, kwargs}, load_path}.
EvalModelSpec parse_model(config::Section& m) {
  EvalModelSpec spec;
  m.reject_unknown({"model_name", "model", "tokenizer", "load_path"});
  config::Section model = m.section("model");
  m.check(model.present(), "model", "expected a mapping with `name` (hf_causal_lm, or a Tessera model with load_path)");
  spec.model_type = model.require_string("name");
  spec.model_name = m.get_string("model_name", spec.model_type);
  spec.load_path = m.get_string("load_path", "");
  if (spec.model_type == "hf_causal_lm") {
    spec.pretrained_model_name_or_path = model.get_string("pretrained_model_name_or_path", "");
    const bool pretrained = model.get_bool("pretrained", true);
    model.check(!spec.pretrained_model_name_or_path.empty() || !spec.load_path.empty(), "pretrained_model_name_or_path",
                "missing (an HF folder or a hub id in the local HF cache)");
    model.check(pretrained || !spec.load_path.empty(), "pretrained",
                "false asks for random weights: give load_path for the weights to evaluate");
    model.python_only("init_device", "the model is loaded on the CPU and then moved to the device");
    model.python_only("trust_remote_code", "Tessera runs no remote code; the architecture is its own");
    model.python_only("use_auth_token", "models come from local folders or the local HF cache");
    model.python_only("use_flash_attention_2", "attention kernels are chosen per device");
    model.finish({"config_overrides", "peft_config", "pretrained_lora_id_or_path", "attn_implementation"});
  } else {
    m.check(!spec.load_path.empty(), "load_path",
            fmt::format("missing: a `{}` model is evaluated from a Tessera checkpoint (its hf_config gives the "
                        "architecture)",
                        spec.model_type));
    std::vector<std::string> unread;
    for (const std::string& key : model.keys()) {
      if (key != "name") {
        model.raw(key);
        unread.push_back(key);
      }
    }
    if (!unread.empty()) {
      spdlog::warn("{}: {}: the checkpoint's own hf_config gives the architecture; these keys are not read: {}",
                   m.context().file(), model.path(), fmt::join(unread, ", "));
    }
  }
  config::Section tok = m.section("tokenizer");
  m.check(tok.present(), "tokenizer", "expected a mapping with `name` (a tokenizer.json, its folder or a hub id)");
  spec.tokenizer = tok.require_string("name");
  config::Section kwargs = tok.section("kwargs");
  // The prompts are bounded by max_seq_len (and each task's), as Foundry's are; the tokenizer's own limit only warns.
  kwargs.python_only("model_max_length", "prompts are bounded by max_seq_len");
  kwargs.python_only("trust_remote_code", "Tessera runs no remote code");
  kwargs.finish();
  tok.finish();
  m.finish();
  return spec;
}

}  // namespace

std::vector<IclTaskConfig> icl_tasks_from(const config::Value& value, const std::string& base_dir) {
  if (value.is_scalar()) return load_icl_tasks(resolve_beside(value.text(), base_dir));
  if (!value.is_sequence()) {
    throw ConfigError("eval", fmt::format("{}: icl_tasks: expected a path to a tasks YAML or a list of tasks, got {}",
                                          value.origin().describe(), value.type_name()));
  }
  std::vector<IclTaskConfig> tasks;
  for (const config::Value& entry : value.items()) tasks.push_back(parse_icl_task(entry, base_dir));
  return tasks;
}

GauntletConfig gauntlet_from(const config::Value& value, const std::string& base_dir) {
  if (value.is_map()) return parse_gauntlet(value);
  if (!value.is_scalar()) {
    throw ConfigError("eval", fmt::format("{}: eval_gauntlet: expected a path to a gauntlet YAML or a mapping, got {}",
                                          value.origin().describe(), value.type_name()));
  }
  const std::string path = resolve_beside(value.text(), base_dir);
  if (!fs::exists(path)) {
    throw ConfigError("eval",
                      fmt::format("{}: eval_gauntlet: {} does not exist", value.origin().describe(), value.text()));
  }
  return load_gauntlet(path);
}

EvalRecipe load_eval_recipe(const std::string& path, const std::vector<std::string>& overrides,
                            const std::function<void(config::Section& root)>& loggers) {
  config::Value root = config::load_yaml_file(path);
  for (const std::string& o : overrides) config::apply_override(root, o);
  config::resolve_interpolations(root);
  // Foundry's allow_toplevel_keys: `model` / `tokenizer` / `load_path` / `model_name` at the top level are one
  // `models` entry.
  if (const config::Value* model = root.find("model")) {
    if (root.find("models") != nullptr) {
      throw ConfigError("recipe",
                        fmt::format("{}: give either `model` or `models`, not both", model->origin().describe()));
    }
    config::Value entry = config::Value::map(model->origin());
    for (const char* key : {"model", "tokenizer", "load_path", "model_name"}) {
      if (const config::Value* v = root.find(key)) entry.set(key, *v);
    }
    config::Value models = config::Value::sequence(model->origin());
    models.items().push_back(std::move(entry));
    config::Value rest = config::Value::map(root.origin());
    for (const auto& [key, v] : root.entries()) {
      if (key != "model" && key != "tokenizer" && key != "load_path" && key != "model_name") rest.set(key, v);
    }
    rest.set("models", std::move(models));
    root = std::move(rest);
  }

  config::ParseContext ctx(path);
  config::Section s(&root, "", ctx);
  const std::string base_dir = fs::path(path).parent_path().string();
  EvalRecipe r;
  r.path = path;
  // A misspelt key is reported as such (with the key it is close to), not as the required key it was meant to be.
  s.reject_unknown({"variables",
                    "models",
                    "max_seq_len",
                    "device_eval_batch_size",
                    "precision",
                    "seed",
                    "icl_tasks",
                    "icl_tasks_str",
                    "eval_gauntlet",
                    "eval_gauntlet_str",
                    "fsdp_config",
                    "run_name",
                    "eval_subset_num_batches",
                    "dist_timeout",
                    "metadata",
                    "python_log_level",
                    "console_log_interval",
                    "log_config",
                    "code_paths",
                    "eval_loader",
                    "eval_loaders",
                    "icl_subset_num_batches",
                    "loggers",
                    "callbacks"});
  s.raw("variables");  // interpolated above
  const config::Value* models = s.raw("models");
  s.check(models != nullptr && models->is_sequence() && !models->items().empty(), "models",
          "expected a list of models ({model_name, model, tokenizer, load_path}) or a top-level `model`");
  for (size_t i = 0; i < models->items().size(); ++i) {
    config::Section m(&models->items()[i], fmt::format("models.{}", i), ctx);
    s.check(m.present(), "models", fmt::format("entry {} is not a mapping", i));
    r.models.push_back(parse_model(m));
  }
  r.max_seq_len = s.require_int("max_seq_len");
  s.check(r.max_seq_len > 0, "max_seq_len", "must be positive");
  r.device_eval_batch_size = s.require_int("device_eval_batch_size");
  s.check(r.device_eval_batch_size > 0, "device_eval_batch_size", "must be positive (rows per forward pass)");
  r.precision = s.get_choice("precision", r.precision, {"fp32", "amp_bf16", "amp_fp16", "auto"});
  r.seed = s.get_int("seed", r.seed);

  const config::Value* tasks = s.raw("icl_tasks");
  if (tasks == nullptr) tasks = s.raw("icl_tasks_str");
  s.check(tasks != nullptr, "icl_tasks",
          "missing: a tasks YAML path or a list of tasks (evaluation loaders are not "
          "supported yet)");
  r.icl_tasks = icl_tasks_from(*tasks, base_dir);
  for (IclTaskConfig& t : r.icl_tasks) {
    if (t.max_seq_len == 0) t.max_seq_len = r.max_seq_len;
  }
  const config::Value* gauntlet = s.raw("eval_gauntlet");
  if (gauntlet == nullptr) gauntlet = s.raw("eval_gauntlet_str");
  if (gauntlet != nullptr) r.gauntlet = gauntlet_from(*gauntlet, base_dir);

  if (const config::Value* fsdp = s.raw("fsdp_config"); fsdp != nullptr) {
    s.check(fsdp->is_map(), "fsdp_config", "expected a mapping (Composer's FSDP config), got " + fsdp->brief());
    config::Section section = s.section("fsdp_config");
    r.fsdp = dist::parse_sharding_options(section);
  }
  if (auto name = s.get_optional_string("run_name")) {
    r.run_name = *name;
  } else if (const char* env = std::getenv("RUN_NAME"); env != nullptr && *env != '\0') {
    r.run_name = env;
  } else {
    r.run_name = fs::path(path).stem().string();
  }
  if (loggers) {
    loggers(s);
  } else {
    s.raw("loggers");
  }
  // Each evaluator's batches per rank (icl_subset_num_batches_for: eval.py's standalone evaluation).
  const int64_t eval_subset = s.get_int("eval_subset_num_batches", -1);
  s.check(eval_subset == -1 || eval_subset > 0, "eval_subset_num_batches", "must be -1 (every batch) or positive");
  std::optional<int64_t> icl_subset;
  if (const config::Value* v = s.raw("icl_subset_num_batches"); v != nullptr && !v->is_null()) {
    icl_subset = v->as_int();
    s.check(icl_subset && *icl_subset > 0, "icl_subset_num_batches",
            "expected a positive integer or null, got " + v->brief());
  }
  for (IclTaskConfig& t : r.icl_tasks) {
    t.subset_num_batches = icl_subset_num_batches_for(t.has_categories, icl_subset, eval_subset, true);
  }
  s.get_double("dist_timeout", 600.0);
  s.raw("metadata");
  s.python_only("python_log_level", "use --log-level");
  s.python_only("console_log_interval", "each task's result is printed when it is done");
  s.python_only("log_config", "the results JSON (--output) holds the results");
  s.finish({"code_paths", "eval_loader", "eval_loaders", "callbacks"});
  ctx.throw_if_unsupported();
  r.resolved = std::move(root);
  return r;
}

}  // namespace tessera::eval
