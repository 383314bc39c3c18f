// `train`: train a recipe, or validate it and print its plan (--dry-run).
//
//   train --recipe recipes/mpt-125m.yaml --dry-run [optimizer.lr=3e-4 ...]
//   train --recipe recipes/mpt-tiny-cpu.yaml --nproc-per-node 2      (2 local ranks; or run under torchrun / srun)
//   train --recipe recipes/mpt-tiny-cpu.yaml --nproc-per-node 2 --max-restarts 3 --watchdog-timeout 300
//                                                                     (restart after a crash or a hang; resume needs
//                                                                      the recipe's autoresume: true)
//   train --recipe R --nnodes 2:3 --nproc-per-node 8 --rdzv-endpoint node0:29400 [--rdzv-host] --max-restarts 3
//                                                                     (elastic: one launcher per node, the one with
//                                                                      --rdzv-host on node0; a lost node is excluded
//                                                                      and the job goes on on the others)
//
// Exit codes: 0 success, 1 runtime failure, 2 usage or recipe error, 75 stopped for a preemption signal after saving
// a checkpoint (recipe key preemption_signals); under the launcher, a failed rank's code (128 +
// signal for a signal) or 124 when the watchdog found the job hung; 76 stopped by the health monitor; 77 this node was
// excluded from an elastic job (or its ranks marked it bad).
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "tessera/distributed/launcher.h"
#include "tessera/planner/cluster.h"
#include "tessera/planner/jobs.h"
#include "tessera/planner/perf_model.h"
#include "tessera/trainer/plan.h"
#include "tessera/trainer/preflight.h"
#include "tessera/trainer/train_config.h"
#include "tessera/trainer/trainer.h"
#include "tessera/util/allocator.h"
#include "tessera/util/device.h"
#include "tessera/util/error.h"
#include "tessera/util/logging.h"
#include "tessera/util/preemption.h"
#include "tessera/util/tool_main.h"

namespace {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  try {
    return std::stoll(v);
  } catch (const std::exception&) {
    throw tessera::ConfigError("train", fmt::format("environment variable {}=\"{}\" is not an integer", name, v));
  }
}

// --nnodes: "N" (a fixed number of nodes) or "MIN:MAX" (an elastic job).
void parse_nnodes(const std::string& text, tessera::dist::LaunchOptions& launch) {
  auto number = [&](const std::string& part) {
    if (part.empty() || part.size() > 6 || part.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(part) < 1) {
      throw tessera::ConfigError("train", fmt::format("--nnodes '{}' must be N or MIN:MAX (positive integers)", text));
    }
    return std::stoi(part);
  };
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    launch.nnodes = number(text);
    return;
  }
  launch.min_nodes = number(text.substr(0, colon));
  launch.max_nodes = number(text.substr(colon + 1));
}

int run(int argc, char** argv) {
  CLI::App app{"Train a causal language model (any registered family) from an LLM Foundry-style recipe.", "train"};
  tessera::util::add_plugin_option(app);
  std::string recipe;
  std::vector<std::string> overrides;
  bool dry_run = false;
  bool print_config = false;
  bool verbose = false;
  int64_t world_size = 0;
  int64_t ranks_per_node = 0;
  std::string log_level = "info";
  app.add_option("--recipe", recipe, "Recipe YAML (LLM Foundry schema)")->required();
  app.add_option("overrides", overrides, "Overrides key.sub=value, applied over the recipe (lists: key=[1,2])");
  app.add_flag("--dry-run", dry_run, "Validate the recipe and print the plan; build and train nothing");
  app.add_flag("--print-config", print_config, "Print the resolved recipe as JSON (secrets hidden) and exit");
  app.add_flag("--verbose", verbose,
               "Console: every metric on each line by its full name (default: loss, lr, grad norm, tokens/s, MFU, "
               "ETA; every metric is in the JSONL and TensorBoard logs either way)");
  bool no_preflight = false;
  app.add_flag("--no-preflight", no_preflight,
               "Skip the pre-flight checks of data, tokenizer, checkpoints, eval files and outputs (before the first "
               "step, and in --dry-run: a plan for a recipe whose data is elsewhere); what is wrong then fails when "
               "the run reaches it");
  app.add_option("--world-size", world_size, "World size to plan for (default: $WORLD_SIZE, else 1)")
      ->check(CLI::PositiveNumber);
  app.add_option("--ranks-per-node", ranks_per_node,
                 "Ranks per node to plan for (default: $LOCAL_WORLD_SIZE, else the world size)")
      ->check(CLI::PositiveNumber);
  // Checkpoint-interval advice (--dry-run): given figures, else estimates.
  tessera::trainer::CheckpointCostInputs costs;
  app.add_option("--mtbf-hours", costs.mtbf_hours,
                 "Dry run: the job's mean time between failures, for the checkpoint-interval advice (default: Llama "
                 "3's failure rate per GPU over the world size)")
      ->check(CLI::PositiveNumber);
  app.add_option("--save-seconds", costs.save_seconds,
                 "Dry run: one save's time, measured (default: estimated from the save folder's write rate)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--save-blocking-seconds", costs.blocking_seconds,
                 "Dry run: training time one save blocks, measured (checkpoint/blocking_seconds)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--step-seconds", costs.step_seconds,
                 "Dry run: one optimizer step's time, measured (default: estimated from FLOPs)")
      ->check(CLI::PositiveNumber);
  std::string cluster_path;
  app.add_option("--cluster", cluster_path,
                 "Dry run: a cluster description (docs/planner.md#the-cluster-file); plans for all its devices and "
                 "prints the performance model's step time, throughput, scaling efficiency and time to train");
  CLI::Option* log_level_flag =
      app.add_option("--log-level", log_level,
                     "trace, debug, info, warn, error or off (default: the recipe's python_log_level, else info)");
  // The launcher (torchrun's flags): spawn this many ranks here, each running this command without these flags.
  tessera::dist::LaunchOptions launch;
  int nproc_per_node = 0;
  app.add_option("--nproc-per-node", nproc_per_node,
                 "Spawn this many local ranks (torchrun's launcher): rank-prefixed output, one dead rank stops all")
      ->check(CLI::PositiveNumber);
  std::string nnodes;
  app.add_option("--nnodes", nnodes,
                 "Nodes in the job: N, or MIN:MAX for an elastic job that goes on without lost nodes (needs "
                 "--rdzv-endpoint; default 1)");
  app.add_option("--node-rank", launch.node_rank, "This node's index (with --nproc-per-node; default 0)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr", launch.master_addr, "Address of node 0 (with --nproc-per-node; default 127.0.0.1)");
  app.add_option("--master-port", launch.master_port,
                 "Rendezvous port on node 0 (with --nproc-per-node; default 29500; 0: one node, the launcher binds a "
                 "free port and hands it to rank 0)")
      ->check(CLI::Range(0, 65535));
  app.add_option("--rdzv-endpoint", launch.rdzv_endpoint,
                 "Elastic job (--nnodes MIN:MAX): HOST:PORT of the rendezvous, run by the launcher with --rdzv-host");
  app.add_flag("--rdzv-host", launch.rdzv_host,
               "Elastic job: this launcher runs the rendezvous on the endpoint's port, and is node 0");
  app.add_option("--node-id", launch.node_id, "Elastic job: this node's name (default: the host name)");
  app.add_option("--rdzv-timeout", launch.rdzv_timeout_seconds,
                 "Elastic job: seconds to wait for MIN nodes, or for the rendezvous host (default 600)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rdzv-last-call", launch.rdzv_last_call_seconds,
                 "Elastic job: once MIN nodes have joined, seconds to wait for more, up to MAX (default 3)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-restarts", launch.max_restarts,
                 "Restart all ranks up to this many times after a rank fails or hangs (launcher; implies "
                 "--nproc-per-node 1 when that is not given; default 0)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--watchdog-timeout", launch.watchdog_timeout_seconds,
                 "Seconds without progress (no rank's heartbeat changed) after which the launcher reports the stuck "
                 "rank and stops the job, then restarts it if --max-restarts allows (launcher; implies "
                 "--nproc-per-node 1 when that is not given; default 0: off)")
      ->check(CLI::NonNegativeNumber);
  bool fork_ranks = false;
  app.add_flag("--fork-ranks", fork_ranks,
               "Start each rank as a fork of the launcher instead of a new program: each start and restart skips "
               "LibTorch's start-up, about 0.5 s of CPU per rank (launcher; the ranks' /proc/PID/environ and cmdline "
               "show the launcher's; docs/distributed.md#ranks-as-forks)");
  app.add_flag("--bind-cores", launch.bind_cores,
               "Bind each local rank, with its threads, to its own equal slice of the CPUs (launcher; as DeepSpeed's "
               "--bind_cores_to_rank; docs/distributed.md#launching)");
  app.add_option("--stop-grace", launch.stop_grace_seconds,
                 "After a rank fails or hangs, or on a signal: seconds the other ranks get to exit after SIGTERM "
                 "before the launcher SIGKILLs them (launcher; default 5)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--watchdog-step-multiple", launch.watchdog_step_multiple,
                 "Derive the watchdog's timeout from the job's pace: this many times the longest step seen, and at "
                 "least --watchdog-timeout (60 s when that is not given) (launcher; implies --nproc-per-node 1 when "
                 "that is not given; default 0: off)")
      ->check(CLI::NonNegativeNumber);
  if (auto code = tessera::util::parse_command_line(app, argc, argv)) return *code;
  tessera::util::init_logging(log_level);
  tessera::util::configure_host_allocator();
  if (!nnodes.empty()) parse_nnodes(nnodes, launch);
  if (launch.node_id.empty()) launch.node_id = tessera::util::host_name();

  tessera::trainer::TrainConfig cfg = tessera::trainer::load_train_config(recipe, overrides);
  cfg.console_verbose = verbose;
  cfg.preflight = !no_preflight;
  if (log_level_flag->count() == 0 && !cfg.log_level.empty()) tessera::util::init_logging(cfg.log_level);
  if (print_config) {
    std::cout << tessera::trainer::recorded_config(cfg).dump(2) << "\n";
    return tessera::kExitOk;
  }
  // The supervisor's flags need the launcher: one local rank unless told otherwise.
  if (nproc_per_node == 0 && (launch.max_restarts > 0 || launch.watchdog_timeout_seconds > 0 ||
                              launch.watchdog_step_multiple > 0 || launch.min_nodes > 0)) {
    nproc_per_node = 1;
  }
  if (nproc_per_node > 0 && !dry_run) {
    // Launcher: the ranks run this same command line minus the launcher's flags.
    launch.nproc_per_node = nproc_per_node;
    if (cfg.save_folder) launch.preemption_signals = cfg.preemption_signals;
    launch.argv = tessera::util::self_command("train");
    // The rank's command is argv[1] (`train`) onwards: train_main with it as argv[0].
    if (fork_ranks) launch.fork_entry = [](int n, char** args) { return tessera::cli::train_main(n - 1, args + 1); };
    const std::vector<std::string> launcher_flags = {
        "--nproc-per-node", "--nnodes",       "--node-rank",        "--master-addr",
        "--master-port",    "--max-restarts", "--watchdog-timeout", "--rdzv-endpoint",
        "--node-id",        "--rdzv-timeout", "--rdzv-last-call",   "--watchdog-step-multiple"};
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      bool skip = false;
      for (const std::string flag : {"--rdzv-host", "--fork-ranks", "--bind-cores"}) {  // flags without a value
        skip = skip || a == flag || a.rfind(flag + "=", 0) == 0;
      }
      for (const auto& f : launcher_flags) {
        if (a == f) {
          skip = true;
          ++i;  // and its value
        } else if (a.rfind(f + "=", 0) == 0) {
          skip = true;
        }
      }
      if (!skip) launch.argv.push_back(a);
    }
    if (cfg.preflight) tessera::trainer::require_preflight(cfg, {.rank = 0, .probe_writes = true});  // before any rank
    return tessera::dist::launch(launch);
  }
  std::optional<tessera::planner::Cluster> cluster;
  if (!cluster_path.empty()) {
    cluster = tessera::planner::load_cluster(cluster_path);
    if (world_size == 0) world_size = cluster->devices();
    if (ranks_per_node == 0) ranks_per_node = std::min(world_size, cluster->devices_per_node);
  }
  if (world_size == 0 && nproc_per_node > 0) {
    world_size = int64_t{nproc_per_node} * (launch.max_nodes > 0 ? launch.max_nodes : launch.nnodes);
  }
  if (ranks_per_node == 0 && nproc_per_node > 0) ranks_per_node = nproc_per_node;
  if (world_size == 0) world_size = env_int("WORLD_SIZE", 1);
  if (ranks_per_node == 0) ranks_per_node = env_int("LOCAL_WORLD_SIZE", world_size);
  const tessera::trainer::Plan plan = tessera::trainer::make_plan(cfg, world_size, ranks_per_node);
  if (dry_run) {
    std::cout << tessera::trainer::render_plan(cfg, plan, tessera::util::describe(tessera::util::device_info()));
    if (cluster) {
      const tessera::planner::JobProfile job = tessera::planner::profile_config(cfg, cfg.run_name);
      const int64_t tp = cfg.fsdp.tensor_parallel_degree, cp = cfg.fsdp.context_parallel_degree;
      if (job.global_batch % (world_size / (tp * cp)) != 0) {
        throw tessera::ConfigError("train", fmt::format("--cluster: {} data-parallel ranks do not divide "
                                                        "global_train_batch_size {}",
                                                        world_size / (tp * cp), job.global_batch));
      }
      const int64_t microbatch = plan.auto_microbatch ? plan.device_train_batch_size : plan.microbatch_size;
      const tessera::planner::ScalingEstimate e = tessera::planner::estimate_scaling(
          job, *cluster, world_size, cfg.fsdp.strategy, cfg.fsdp.activation_checkpointing, microbatch, tp, cp);
      std::cout << "\n" << tessera::planner::render_estimate(e, job, *cluster);
      std::cout << tessera::planner::render_recommendation(job, *cluster, world_size, e.config);
    }
    // Checkpoint advice for a run that checkpoints, or when asked for with a failure rate.
    if (cfg.save_folder || costs.mtbf_hours) {
      std::vector<std::string> sources;
      const tessera::trainer::CheckpointCosts c =
          tessera::trainer::estimate_checkpoint_costs(cfg, plan, costs, sources);
      std::cout << tessera::trainer::render_checkpoint_advice(cfg, c, sources);
    }
    // The inputs and outputs, as the run would check them before its first step (exit 2 with every problem).
    if (cfg.preflight) {
      tessera::trainer::require_preflight(cfg, {.rank = 0, .probe_writes = true});
      std::cout << "\npre-flight: data, tokenizer, checkpoints, eval files and outputs checked: no problem found\n";
    }
    return tessera::kExitOk;
  }
  spdlog::info("{}", tessera::util::describe(tessera::util::device_info()));
  tessera::trainer::Trainer trainer(cfg);
  trainer.fit();
  using Stop = tessera::core::State::StopReason;
  switch (trainer.stop_reason()) {
    case Stop::kNodeBad:
      return tessera::util::kExitNodeBad;
    case Stop::kUnhealthy:
      return tessera::util::kExitUnhealthy;
    case Stop::kPreempted:
      return tessera::util::kExitPreempted;
    case Stop::kNone:
    case Stop::kRequested:
      break;
  }
  return tessera::kExitOk;
}

}  // namespace

int tessera::cli::train_main(int argc, char** argv) {
  return tessera::util::tool_main([&] { return run(argc, argv); });
}
