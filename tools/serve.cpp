// `serve`: an OpenAI-compatible HTTP server for a model (serve/server.h): /v1/completions, /v1/chat/completions,
// /v1/models, with continuous batching of concurrent requests (serve/engine.h). What lm-evaluation-harness's
// `local-completions` model, OpenAI's client libraries and curl talk to.
//
//   tessera serve --model runs/sft/hf [--port 8000] [--host 127.0.0.1] [--max-batch 32] [--precision auto]
//   curl -s localhost:8000/v1/completions -d '{"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0}'
//
// Prints "serving NAME at http://HOST:PORT/v1" on standard output once it listens; SIGINT or SIGTERM stop it (exit
// 0). Exit codes: 0 success, 1 runtime failure, 2 usage error.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "commands.h"
#include "tessera/checkpoint/hf.h"
#include "tessera/core/precision.h"
#include "tessera/data/finetuning.h"
#include "tessera/data/tokenizer.h"
#include "tessera/serve/server.h"
#include "tessera/util/error.h"
#include "tessera/util/hf_hub.h"
#include "tessera/util/logging.h"
#include "tessera/util/tool_main.h"

namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) {
  g_stop = true;
}

int run(int argc, char** argv) {
  CLI::App app{"Serve a model over OpenAI's HTTP API (completions, chat completions, models).", "serve"};
  tessera::util::add_plugin_option(app);
  std::string model_path, tokenizer_path, name, device_name = "auto", precision_name = "auto", api_key_env,
                                                log_level = "info";
  tessera::serve::ServerOptions so;
  tessera::serve::EngineOptions eo;
  double max_body_mib = 8;
  app.add_option("--model", model_path, "HF folder, Tessera checkpoint, save folder, or hub id in the local HF cache")
      ->required();
  app.add_option("--tokenizer", tokenizer_path,
                 "A tokenizer.json, its folder or a hub id in the local HF cache (default: the model folder's)");
  app.add_option("--served-model-name", name, "The name requests' `model` gives (default: the model folder's name)");
  app.add_option("--host", so.host, "Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)");
  app.add_option("--port", so.port, "Port to listen on (0: a free one, printed)")->check(CLI::Range(0, 65535));
  app.add_option("--max-batch", eo.max_batch, "Sequences decoded together (continuous batching)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-prefill-tokens", eo.max_prefill_tokens,
                 "Padded prompt tokens admitted per step (at least one request)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-waiting", eo.max_waiting, "Requests waiting for a row beyond which new ones get 503")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-body-mib", max_body_mib, "Largest request body (larger ones get 413)")
      ->check(CLI::PositiveNumber);
  app.add_option("--request-timeout", so.request_timeout_s, "Seconds before an unanswered request gets 504")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", so.threads, "Connections served at once")->check(CLI::PositiveNumber);
  app.add_option("--api-key-env", api_key_env,
                 "An environment variable holding the API key requests must send (Authorization: Bearer ...)");
  app.add_option("--device", device_name, "auto (a GPU when there is one), cpu or gpu")
      ->check(CLI::IsMember({"auto", "cpu", "gpu"}));
  app.add_option("--precision", precision_name,
                 "fp32, amp_bf16, amp_fp16 (GPU) or auto (amp_bf16 on a GPU or a CPU with native bf16, else fp32)")
      ->check(CLI::IsMember({"auto", "fp32", "amp_bf16", "amp_fp16"}));
  app.add_option("--log-level", log_level, "trace, debug (one line per request), info, warn, error or off");
  if (auto code = tessera::util::parse_command_line(app, argc, argv)) return *code;
  tessera::util::init_logging(log_level);
  so.max_body_bytes = static_cast<size_t>(max_body_mib * 1024 * 1024);
  if (!api_key_env.empty()) {
    const char* key = std::getenv(api_key_env.c_str());
    if (key == nullptr || *key == '\0') {
      throw tessera::ConfigError("serve", fmt::format("--api-key-env {}: the variable is not set", api_key_env));
    }
    so.api_key = key;
  }

  // The model is loaded (and the precision probed) on a thread that ends before the engine's starts: LibTorch's
  // OpenMP keeps a team of worker threads per thread that ran a parallel region, and with two teams on the machine's
  // cores libgomp stops spinning between regions and puts its workers to sleep, which made every decoding step on a
  // 2-core CPU twice as slow (14.1 against 6.2-7.2 ms a token on a small Llama). A team ends with its thread.
  at::Device device = at::kCPU;
  tessera::serve::ServedModel served;
  // std::async's thread is joined when its future goes, here at the end of the statement; get() rethrows a failure.
  const std::shared_ptr<tessera::models::CausalLM> model =
      std::async(std::launch::async, [&] {
        device = tessera::core::device_from_flag(device_name, 0, "serve");
        eo.precision = tessera::core::precision_from_flag(precision_name, device, "serve");
        const std::filesystem::path tok_file =
            tessera::util::resolve_tool_tokenizer(tokenizer_path, model_path, "serve");
        served.tokenizer =
            std::make_shared<const tessera::data::ChatTokenizer>(tessera::data::Tokenizer::from_file(tok_file), "");
        auto m = tessera::checkpoint::load_any_model(model_path, "serve");
        if (device.is_cuda()) m->to(device);
        return m;
      }).get();
  served.name = name.empty() ? std::filesystem::path(model_path).lexically_normal().filename().string() : name;
  if (served.name.empty()) {
    served.name = std::filesystem::path(model_path).lexically_normal().parent_path().filename().string();
  }
  served.max_seq_len = model->max_seq_len();
  served.vocab_size = model->vocab_size();
  served.created =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto engine = std::make_shared<tessera::serve::Engine>(model, eo);
  tessera::serve::Server server(so, engine, served);

  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done) {
      if (g_stop) {
        server.stop();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  spdlog::info("serving {} ({}) on {} in {}, up to {} sequences per batch", served.name, model->describe(),
               device.str(), tessera::core::to_string(eo.precision), eo.max_batch);
  std::cout << fmt::format("serving {} at http://{}:{}/v1", served.name, so.host, server.port()) << std::endl;
  server.run();
  done = true;
  watcher.join();
  spdlog::info("serve: stopped");
  return tessera::kExitOk;
}

}  // namespace

int tessera::cli::serve_main(int argc, char** argv) {
  return tessera::util::tool_main([&] { return run(argc, argv); });
}
