// `eval`: in-context-learning evaluation of a model (HF folder or Tessera checkpoint) on LLM Foundry task files.
//
//   eval --recipe hf_eval.yaml [key=value ...]     (LLM Foundry's eval YAML: several models, their table)
//   eval --model runs/x/hf [--tokenizer tokenizer.json] --tasks tasks.yaml [--gauntlet gauntlet.yaml]
//        [--output results.json] [--nproc-per-node N] [--batch-size 8] [--device auto] [--precision auto]
//
// Exit codes: 0 success, 1 runtime failure (bad task file, model), 2 usage or task-config error.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "tessera/callbacks/checkpoint_saver.h"
#include "tessera/checkpoint/checkpoint.h"
#include "tessera/checkpoint/hf.h"
#include "tessera/config/component.h"
#include "tessera/core/engine.h"
#include "tessera/core/precision.h"
#include "tessera/data/tokenizer.h"
#include "tessera/distributed/communicator.h"
#include "tessera/distributed/fsdp.h"
#include "tessera/distributed/launcher.h"
#include "tessera/eval/eval_recipe.h"
#include "tessera/eval/gauntlet.h"
#include "tessera/eval/icl.h"
#include "tessera/loggers/options.h"
#include "tessera/trainer/precision_context.h"
#include "tessera/util/error.h"
#include "tessera/util/hf_hub.h"
#include "tessera/util/logging.h"
#include "tessera/util/redact.h"
#include "tessera/util/tool_main.h"

namespace {

namespace fs = std::filesystem;

// One row of LLM Foundry's results table (command_utils/eval.py's calculate_markdown_results).
struct TableRow {
  std::string category, benchmark, subtask;  // "" where Foundry's cell is None
  double accuracy = 0;
  std::string shots;  // "0-shot"
  std::string model;
};

// Foundry's table for one model's results: by few-shot count (in the order first evaluated), then benchmark, then
// metric; a task with categories gives an "Average" row and one row per category (its Benchmark cell empty). The
// Category column is the benchmark's gauntlet category.
std::vector<TableRow> foundry_table(const std::vector<tessera::eval::IclResult>& all,
                                    const std::optional<tessera::eval::GauntletConfig>& gauntlet,
                                    const std::string& model) {
  std::map<std::string, std::string> taxonomy;
  if (gauntlet) {
    for (const auto& c : gauntlet->categories) {
      for (const auto& b : c.benchmarks) taxonomy[b.name] = c.name;
    }
  }
  struct Sub {
    double value;
    std::string category;
  };
  // shots -> benchmark -> metric -> subscores, each level in first-seen order.
  std::vector<std::pair<std::string,
                        std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::vector<Sub>>>>>>>
      results;
  auto at = [](auto& v, const std::string& key) -> auto& {
    for (auto& [k, x] : v) {
      if (k == key) return x;
    }
    v.emplace_back(key, typename std::decay_t<decltype(v)>::value_type::second_type{});
    return v.back().second;
  };
  for (const auto& r : all) {
    at(at(at(results, fmt::format("{}-shot", r.num_fewshot)), r.task), r.metric).push_back({r.accuracy(), r.category});
  }
  std::vector<TableRow> rows;
  for (const auto& [shots, benchmarks] : results) {
    for (const auto& [benchmark, metrics] : benchmarks) {
      const std::string category = taxonomy.count(benchmark) ? taxonomy.at(benchmark) : "";
      for (const auto& [metric, subs] : metrics) {
        if (subs.size() == 1) {
          rows.push_back({category, benchmark, "", subs[0].value, shots, model});
          continue;
        }
        double sum = 0;
        for (const Sub& sub : subs) sum += sub.value;
        rows.push_back({category, benchmark, "Average", sum / static_cast<double>(subs.size()), shots, model});
        for (const Sub& sub : subs) rows.push_back({category, "", sub.category, sub.value, shots, model});
      }
    }
  }
  return rows;
}

// A table as pandas' to_markdown(index=False) prints it (tabulate's "pipe" format): every column at least its header's
// width plus 2; the `numeric` columns right-aligned with their decimal points lined up (tabulate's "decimal"
// alignment: a number without a point ends where the points are), the others left-aligned.
std::string markdown(const std::vector<std::string>& head, std::vector<std::vector<std::string>> cells,
                     const std::vector<bool>& numeric) {
  // Characters after the point (or the exponent's e), -1 without one (an integer, nan, inf).
  auto after_point = [](const std::string& v) -> int64_t {
    size_t pos = v.rfind('.');
    if (pos == std::string::npos) pos = v.find_first_of("eE");
    if (pos == std::string::npos || v == "nan" || v == "inf" || v == "-inf") return -1;
    return static_cast<int64_t>(v.size() - pos - 1);
  };
  for (size_t c = 0; c < head.size(); ++c) {
    if (!numeric[c] || cells.empty()) continue;
    int64_t most = -1;
    for (const auto& row : cells) most = std::max(most, after_point(row[c]));
    for (auto& row : cells) row[c] += std::string(static_cast<size_t>(most - after_point(row[c])), ' ');
  }
  std::vector<size_t> width;
  for (size_t c = 0; c < head.size(); ++c) {
    size_t w = head[c].size() + 2;
    for (const auto& row : cells) w = std::max(w, row[c].size());
    width.push_back(w);
  }
  auto line = [&](const std::vector<std::string>& v) {
    std::string out = "|";
    for (size_t c = 0; c < v.size(); ++c) {
      out += numeric[c] ? fmt::format(" {:>{}} |", v[c], width[c]) : fmt::format(" {:<{}} |", v[c], width[c]);
    }
    return out + "\n";
  };
  std::string out = line(head) + "|";
  for (size_t c = 0; c < head.size(); ++c) {
    out += numeric[c] ? std::string(width[c] + 1, '-') + ":|" : ":" + std::string(width[c] + 1, '-') + "|";
  }
  out += "\n";
  for (const auto& row : cells) out += line(row);
  return out;
}

// LLM Foundry's results table (calculate_markdown_results).
std::string markdown(const std::vector<TableRow>& rows) {
  std::vector<std::vector<std::string>> cells;
  for (const TableRow& r : rows) {
    cells.push_back({r.category, r.benchmark, r.subtask, fmt::format("{:g}", r.accuracy), r.shots, r.model});
  }
  return markdown({"Category", "Benchmark", "Subtask", "Accuracy", "Number few shot", "Model"}, cells,
                  {false, false, false, true, false, false});
}

// LLM Foundry's gauntlet table (eval.py's eval_gauntlet_df): a row per model, its averages and then its categories
// (a category with no benchmark scored: nan), sorted by the first average, highest first (nan last).
std::string gauntlet_markdown(const tessera::eval::GauntletConfig& gauntlet,
                              std::vector<std::pair<std::string, std::map<std::string, double>>> rows) {
  std::vector<std::string> head = {"model_name"};
  for (const auto& [name, categories] : gauntlet.averages) head.push_back(name);
  for (const auto& c : gauntlet.categories) head.push_back(c.name);
  auto score = [](const std::map<std::string, double>& scores, const std::string& name) {
    const auto it = scores.find(name);
    return it == scores.end() ? std::nan("") : it->second;
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const auto& a, const auto& b) {
    const double x = score(a.second, head[1]), y = score(b.second, head[1]);
    return std::isnan(y) ? !std::isnan(x) : x > y;
  });
  std::vector<std::vector<std::string>> cells;
  for (const auto& [model, scores] : rows) {
    std::vector<std::string> row = {model};
    for (size_t c = 1; c < head.size(); ++c) row.push_back(fmt::format("{:g}", score(scores, head[c])));
    cells.push_back(std::move(row));
  }
  std::vector<bool> numeric(head.size(), true);
  numeric[0] = false;
  return markdown(head, cells, numeric);
}

// The recipe's `loggers` over one model's evaluation, driven as Composer's Trainer.eval drives them in LLM Foundry's
// eval.py (one Trainer, so one logger run, per model): INIT (a tracker's run starts), the resolved recipe as
// hyperparameters, EVAL_STANDALONE_START, each evaluator's `metrics/<label>/<metric>` at step 0 and its EVAL_END, the
// gauntlet's `icl/metrics/eval_gauntlet/<name>`, EVAL_STANDALONE_END (the run finished), close. Destroyed without
// finish() (a failed evaluation), the loggers close and mark their runs failed.
class EvalLoggers {
 public:
  EvalLoggers(const std::vector<tessera::config::ComponentOptions>& specs, const nlohmann::json& hparams,
              const std::string& run_name, const tessera::dist::Rendezvous& rv)
      : logger_(state_) {
    state_.run_name = run_name;
    state_.rank = rv.rank;
    state_.world_size = rv.world_size;
    state_.local_rank = rv.local_rank;
    const tessera::core::RunContext run{run_name, rv.rank, rv.world_size};
    for (auto& c : tessera::config::build_components(specs, tessera::loggers::logger_registry(), run)) {
      if (auto d = std::dynamic_pointer_cast<tessera::core::LoggerDestination>(c)) logger_.add_destination(d);
      state_.callbacks.push_back(std::move(c));
    }
    engine_ = std::make_unique<tessera::core::Engine>(state_, logger_);
    engine_->run_event(tessera::core::Event::kInit);
    logger_.log_hyperparameters(hparams);
    engine_->run_event(tessera::core::Event::kEvalStandaloneStart);
  }
  void evaluator(const tessera::core::Metrics& metrics) {
    engine_->run_event(tessera::core::Event::kEvalStart);
    logger_.log_metrics(metrics);
    engine_->run_event(tessera::core::Event::kEvalEnd);
  }
  void log(const tessera::core::Metrics& metrics) { logger_.log_metrics(metrics); }
  void finish() {
    engine_->run_event(tessera::core::Event::kEvalStandaloneEnd);
    engine_->close();
  }

 private:
  tessera::core::State state_;
  tessera::core::Logger logger_;
  std::unique_ptr<tessera::core::Engine> engine_;
};

// Sharded evaluation (the recipe's fsdp_config on more than one rank, which LLM Foundry's eval.py hands to Composer's
// Trainer): the model is built on the meta device, sharded by the training engine (dist::parallelize materialises one
// unit at a time) and each rank reads only its shard of the weights (callbacks::load_checkpoint, what train's
// load_path and pretrained weights use), so no rank ever holds the whole model; each forward pass gathers one unit at
// a time. Fills `state` (its model, engine and communicator).
void load_sharded(tessera::core::State& state, const std::string& path, const tessera::dist::ShardingOptions& fsdp,
                  tessera::core::Precision precision, at::Device device, const tessera::dist::Rendezvous& rv,
                  std::shared_ptr<tessera::dist::Communicator> comm, int64_t seed) {
  const tessera::checkpoint::ModelSource src = tessera::checkpoint::resolve_model_source(path, "eval");
  state.rank = rv.rank;
  state.world_size = rv.world_size;
  state.local_rank = rv.local_rank;
  state.local_world_size = rv.local_world_size;
  state.device = device;
  state.comm = std::move(comm);
  state.model = tessera::models::build_from_hf_config(src.config, src.config_file, "meta");
  tessera::dist::ParallelOptions po;
  po.sharding = tessera::dist::sharding_for_world(fsdp, rv.world_size);
  std::tie(po.param_dtype, po.reduce_dtype) =
      tessera::dist::mixed_precision_dtypes(po.sharding.mixed_precision, tessera::core::autocast_dtype(precision));
  po.ranks_per_node =
      static_cast<int>(tessera::dist::shard_group_size(po.sharding, rv.world_size, rv.local_world_size));
  po.device = device;
  po.init_seed = static_cast<uint64_t>(seed);
  state.parallel = tessera::dist::parallelize(*state.model, po, state.comm);
  tessera::callbacks::LoadOptions lo;
  lo.weights_only = true;
  lo.restore_progress = false;
  tessera::callbacks::load_checkpoint(state, src.path, lo);
  int64_t total = 0;
  for (const auto& [name, shape] : state.parallel->parameter_shapes()) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    total += n;
  }
  spdlog::info("{} over {} ranks: this rank holds {} of the model's {} parameter bytes (fp32)",
               tessera::dist::to_string(po.sharding.strategy), rv.world_size, state.parallel->memory().param_bytes,
               total * 4);
}

// --dump-rows: every scored row's token ids for one task and few-shot count.
void dump_task_rows(std::ofstream& out, const tessera::eval::IclTaskConfig& task, int64_t k,
                    const tessera::data::Tokenizer& tokenizer, const tessera::models::CausalLM& model) {
  const int64_t max_seq_len = task.max_seq_len > 0 ? task.max_seq_len : model.max_seq_len();
  const auto data =
      tessera::eval::load_icl_dataset(task.dataset_uri, task.icl_task_type, task.strip_dataset, task.has_categories);
  for (const auto& [category, examples] : tessera::eval::split_by_category(task, data)) {
    const auto prepared = tessera::eval::prepare_icl_examples(task, examples, k, tokenizer, max_seq_len);
    for (size_t i = 0; i < prepared.size(); ++i) {
      for (const auto& row : prepared[i].rows) {
        nlohmann::json j{{"label", task.label}, {"num_fewshot", k}};
        if (task.has_categories) j["category"] = category;
        j["example"] = i;
        j["context"] = row.context;
        j["continuation"] = row.continuation;
        out << j.dump() << "\n";
      }
    }
  }
}

int run(int argc, char** argv) {
  CLI::App app{"Evaluate a model on in-context-learning tasks (LLM Foundry's task format).", "eval"};
  tessera::util::add_plugin_option(app);
  std::string model_dir;
  std::string tokenizer_path;
  std::string tasks_path;
  std::string gauntlet_path;
  std::string output;
  std::string dump_rows;
  std::string log_level = "info";
  int64_t batch_size = 8;
  std::string device_name = "auto";
  std::string precision_name = "auto";
  std::string recipe_path;
  std::vector<std::string> overrides;
  app.add_option("--recipe", recipe_path,
                 "LLM Foundry's eval YAML (scripts/eval/yamls/hf_eval.yaml: models, icl_tasks, eval_gauntlet, "
                 "device_eval_batch_size, max_seq_len, precision); key=value arguments override it");
  app.add_option("overrides", overrides, "key=value overrides of the --recipe (e.g. device_eval_batch_size=16)");
  app.add_option("--model", model_dir,
                 "HF folder (config.json + safetensors), Tessera checkpoint directory, or a save folder (its newest "
                 "valid checkpoint)");
  app.add_option("--tokenizer", tokenizer_path,
                 "A tokenizer.json, its folder or a hub id in the local HF cache (default: the model folder's)");
  app.add_option("--tasks", tasks_path, "Tasks YAML with `icl_tasks` (LLM Foundry's tasks_v0.3.yaml format)");
  app.add_option("--gauntlet", gauntlet_path, "Eval Gauntlet YAML (LLM Foundry's eval_gauntlet_v0.3.yaml format)");
  app.add_option("--output", output, "Write the results as JSON to this file");
  app.add_option("--dump-rows", dump_rows,
                 "Write every scored row's token ids as JSONL (label, num_fewshot, example, context, continuation)");
  app.add_option(
         "--batch-size", batch_size,
         "Rows scored per forward pass (LLM Foundry's device_eval_batch_size; generation: prompts), right-padded; "
         "the scores do not depend on it")
      ->check(CLI::PositiveNumber);
  app.add_option("--device", device_name, "auto (a GPU when there is one: local rank i on GPU i), cpu or gpu")
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}));
  app.add_option("--precision", precision_name,
                 "fp32, amp_bf16, amp_fp16 (GPU) or auto (training's rule: amp_bf16 on a GPU or a CPU with native "
                 "bf16, else fp32); fp32 gives the same scores on every host")
      ->check(CLI::IsMember({"auto", "fp32", "amp_bf16", "amp_fp16"}));
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off");
  int nproc_per_node = 0;
  tessera::dist::LaunchOptions launch;
  app.add_option("--nproc-per-node", nproc_per_node,
                 "Split the evaluation over this many local ranks (the launcher; also runs under torchrun or srun)")
      ->check(CLI::PositiveNumber);
  app.add_option("--master-port", launch.master_port,
                 "Rendezvous port (with --nproc-per-node; default 29500; 0: the launcher binds a free port)")
      ->check(CLI::Range(0, 65535));
  if (auto code = tessera::util::parse_command_line(app, argc, argv)) return *code;
  if (!recipe_path.empty()) {
    for (const char* flag : {"--model", "--tokenizer", "--tasks", "--gauntlet", "--batch-size", "--precision"}) {
      if (app.count(flag) > 0) {
        throw tessera::ConfigError("eval", fmt::format("{} with --recipe: the recipe says it (override it with "
                                                       "key=value, e.g. device_eval_batch_size=16 precision=fp32)",
                                                       flag));
      }
    }
  } else if (model_dir.empty() || tasks_path.empty() || !overrides.empty()) {
    throw tessera::ConfigError(
        "eval", overrides.empty() ? "give --model and --tasks, or --recipe" : "key=value overrides need --recipe");
  }
  if (nproc_per_node > 0) {
    tessera::util::init_logging(log_level);
    // The ranks run this command line without the launcher's flags; only rank 0 prints and writes.
    launch.nproc_per_node = nproc_per_node;
    launch.prefix_output = false;
    launch.argv = tessera::util::self_command("eval");
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--nproc-per-node" || a == "--master-port") {
        ++i;
      } else if (a.rfind("--nproc-per-node=", 0) != 0 && a.rfind("--master-port=", 0) != 0) {
        launch.argv.push_back(a);
      }
    }
    return tessera::dist::launch(launch);
  }
  const tessera::dist::Rendezvous rv = tessera::dist::rendezvous_from_env();
  tessera::util::init_logging(rv.rank == 0 ? log_level : "warn");
  const bool lead = rv.rank == 0;

  // What to evaluate: one model from the flags, or each of the recipe's `models`.
  struct Job {
    std::string model_name;      // the table's Model column
    std::string model_path;      // HF folder, Tessera checkpoint or save folder
    std::string tokenizer_path;  // "" = the model folder's
  };
  std::vector<Job> jobs;
  std::vector<tessera::eval::IclTaskConfig> tasks;
  std::optional<tessera::eval::GauntletConfig> gauntlet;
  std::vector<tessera::config::ComponentOptions> logger_specs;
  nlohmann::json hparams;
  std::string run_name;
  std::optional<tessera::dist::ShardingOptions> fsdp;
  int64_t seed = 17;
  if (!recipe_path.empty()) {
    const tessera::eval::EvalRecipe recipe =
        tessera::eval::load_eval_recipe(recipe_path, overrides, [&](tessera::config::Section& root) {
          logger_specs = tessera::config::parse_components(root, "loggers", tessera::loggers::logger_registry());
        });
    // Secrets (a tracking URI's password, a token) are hidden from what the loggers record.
    hparams = tessera::util::redact_secrets(recipe.resolved.to_json());
    run_name = recipe.run_name;
    for (const tessera::eval::EvalModelSpec& m : recipe.models) {
      jobs.push_back({m.model_name, m.load_path.empty() ? m.pretrained_model_name_or_path : m.load_path, m.tokenizer});
    }
    tasks = recipe.icl_tasks;
    gauntlet = recipe.gauntlet;
    batch_size = recipe.device_eval_batch_size;
    precision_name = recipe.precision;
    fsdp = recipe.fsdp;
    seed = recipe.seed;
  } else {
    jobs.push_back({model_dir, model_dir, tokenizer_path});
    tasks = tessera::eval::load_icl_tasks(tasks_path);
    if (!gauntlet_path.empty()) gauntlet = tessera::eval::load_gauntlet(gauntlet_path);
  }
  const at::Device device = tessera::core::device_from_flag(device_name, rv.local_rank, "eval");
  const tessera::core::Precision precision = tessera::core::precision_from_flag(precision_name, device, "eval");
  std::shared_ptr<tessera::dist::Communicator> comm;
  tessera::eval::IclRanks ranks{rv.rank, rv.world_size, nullptr};
  if (rv.world_size > 1) {
    comm = tessera::dist::Communicator::connect(rv, device, std::chrono::minutes(10));
    ranks.sum = [&comm, device](std::vector<double>& v) {
      at::Tensor t = at::tensor(v, at::kDouble).to(device);
      comm->all_reduce(t).wait();
      t = t.cpu();
      v.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    };
  }
  const bool sharded = fsdp.has_value() && tessera::dist::applies_fsdp(rv.world_size);

  std::ofstream rows_out;
  if (!dump_rows.empty() && lead) {
    rows_out.open(dump_rows);
    if (!rows_out) throw tessera::Error("eval", fmt::format("cannot write {}", dump_rows));
  }
  nlohmann::ordered_json per_model = nlohmann::ordered_json::array();
  std::vector<TableRow> table;
  std::vector<std::pair<std::string, std::map<std::string, double>>> gauntlet_rows;  // model -> score by name
  for (const Job& job : jobs) {
    const std::filesystem::path tokenizer_file =
        tessera::util::resolve_tool_tokenizer(job.tokenizer_path, job.model_path, "eval");
    const tessera::data::Tokenizer tokenizer = tessera::data::Tokenizer::from_file(tokenizer_file);
    tessera::core::State shards;  // the sharded model's engine and communicator (sharded evaluation)
    std::shared_ptr<tessera::models::CausalLM> model;
    if (sharded) {
      load_sharded(shards, job.model_path, *fsdp, precision, device, rv, comm, seed);
      model = shards.model;
    } else {
      model = tessera::checkpoint::load_any_model(job.model_path, "eval");
      if (device.is_cuda()) model->to(device);
    }
    spdlog::info("evaluating {} on {} in {}, {} rows per forward pass", job.model_name, device.str(),
                 tessera::core::to_string(precision), batch_size);
    std::optional<EvalLoggers> loggers;
    if (!logger_specs.empty()) loggers.emplace(logger_specs, hparams, run_name, rv);
    std::vector<tessera::eval::IclResult> all;
    nlohmann::ordered_json results = nlohmann::ordered_json::array();
    for (const auto& task : tasks) {
      for (int64_t k : task.num_fewshot) {
        if (rows_out.is_open()) dump_task_rows(rows_out, task, k, tokenizer, *model);
        const auto started = std::chrono::steady_clock::now();
        std::vector<tessera::eval::IclResult> rs;
        {
          // Autocast as in training (fp32: off); the weights stay as loaded.
          const tessera::trainer::AutocastGuard autocast(precision, device.type());
          rs = tessera::eval::evaluate_icl_task(*model, tokenizer, task, k, ranks, batch_size);
        }
        // Every rank holds the summed results; a logger writes on the ranks it was built for.
        all.insert(all.end(), rs.begin(), rs.end());
        if (loggers) {
          tessera::core::Metrics metrics;
          for (const tessera::eval::IclResult& r : rs) {
            metrics[fmt::format("metrics/{}/{}", r.label, r.metric)] = r.accuracy();
          }
          loggers->evaluator(metrics);
        }
        if (!lead) continue;
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        int64_t examples = 0;
        for (const tessera::eval::IclResult& r : rs) examples += r.total;
        for (const tessera::eval::IclResult& r : rs) {
          std::cout << fmt::format("metrics/{}/{}: {:.4f} ({}/{})\n", r.label, r.metric, r.accuracy(), r.correct,
                                   r.total);
          nlohmann::ordered_json entry{{"label", r.task}, {"num_fewshot", r.num_fewshot}};
          if (!r.category.empty()) entry["category"] = r.category;
          entry["metric"] = r.metric;
          entry["correct"] = r.correct;
          entry["total"] = r.total;
          entry["accuracy"] = r.accuracy();
          // A task's categories share its time by their number of examples.
          entry["seconds"] =
              seconds * static_cast<double>(r.total) / static_cast<double>(std::max<int64_t>(1, examples));
          results.push_back(entry);
        }
        spdlog::info("{}/{}-shot: {} examples in {:.2f} s ({:.1f} examples/s)", task.label, k, examples, seconds,
                     static_cast<double>(examples) / seconds);
      }
    }
    nlohmann::ordered_json doc{{"model_name", job.model_name}, {"results", results}};
    std::map<std::string, double> gauntlet_scores;
    if (gauntlet) {
      nlohmann::ordered_json scores = nlohmann::ordered_json::object();
      tessera::core::Metrics logged;
      for (const auto& [name, score] : tessera::eval::compute_gauntlet(*gauntlet, all)) {
        if (lead) std::cout << fmt::format("icl/metrics/eval_gauntlet/{}: {:.4f}\n", name, score);
        scores[name] = score;
        gauntlet_scores[name] = score;
        logged[fmt::format("icl/metrics/eval_gauntlet/{}", name)] = score;
      }
      if (loggers) loggers->log(logged);
      doc["eval_gauntlet"] = scores;
    }
    if (loggers) loggers->finish();
    if (!lead) continue;
    per_model.push_back(doc);
    for (TableRow& row : foundry_table(all, gauntlet, job.model_name)) table.push_back(std::move(row));
    if (recipe_path.empty()) continue;
    // LLM Foundry's eval.py prints its tables after each model, for all models so far: the gauntlet's (when there is
    // one), then the results (calculate_markdown_results).
    if (gauntlet) {
      gauntlet_rows.emplace_back(job.model_name, std::move(gauntlet_scores));
      std::cout << "Printing gauntlet results for all models\n" << gauntlet_markdown(*gauntlet, gauntlet_rows);
    }
    std::cout << "Printing complete results for all models\n" << markdown(table) << std::flush;
  }
  if (!lead) return tessera::kExitOk;
  if (!output.empty()) {
    nlohmann::ordered_json doc;
    if (recipe_path.empty()) {  // one model: its results at the top level
      doc = per_model.at(0);
      doc.erase("model_name");
    } else {
      doc["models"] = per_model;
    }
    std::ofstream out(output);
    out << doc.dump(2) << "\n";
    if (!out) throw tessera::Error("eval", fmt::format("cannot write {}", output));
  }
  return tessera::kExitOk;
}

}  // namespace

int tessera::cli::eval_main(int argc, char** argv) {
  return tessera::util::tool_main([&] { return run(argc, argv); });
}
