// `generate`: tries a model (a fine-tuned one, typically) on prompts: greedy or sampled decoding with a KV cache, the
// tokenizer's chat template applied when asked.
//
//   generate --model runs/sft/hf --prompt "Tell me a fortune about art." [--chat] [--max-new-tokens 64]
//   generate --model M --prompt-file prompts.jsonl --output out.jsonl --sample --temperature 0.7 --top-p 0.9
//   echo "Once upon a time" | generate --model M
//
// Prompts: each --prompt; a --prompt-file (JSONL: one {"prompt": "..."} or {"messages": [...]} per line; any other
// file: its whole text is one prompt; `-`: standard input); else standard input. Exit codes: 0 success, 1 runtime
// failure, 2 usage error.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "tessera/checkpoint/hf.h"
#include "tessera/data/finetuning.h"
#include "tessera/data/tokenizer.h"
#include "tessera/models/generate.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/hf_hub.h"
#include "tessera/util/logging.h"
#include "tessera/util/tool_main.h"

namespace {

using Json = nlohmann::ordered_json;

// One prompt: plain text, or a conversation (chat).
struct Prompt {
  std::string text;
  Json messages;  // an array when the prompt is a conversation
};

std::vector<Prompt> read_prompt_file(const std::string& path) {
  const bool rows = path.size() > 6 && path.substr(path.size() - 6) == ".jsonl";
  if (!rows) {
    return {{path == "-" ? std::string(std::istreambuf_iterator<char>(std::cin), {})
                         : tessera::util::read_file(path, "generate"),
             Json()}};
  }
  std::vector<std::pair<Json, std::string>> read;
  tessera::data::append_json_rows(path, read);
  std::vector<Prompt> out;
  for (const auto& [row, where] : read) {
    if (row.contains("prompt") && row["prompt"].is_string()) {
      out.push_back({row["prompt"].get<std::string>(), Json()});
    } else if (row.contains("messages") && row["messages"].is_array()) {
      out.push_back({"", row["messages"]});
    } else {
      throw tessera::Error("generate",
                           fmt::format("{}: expected {{\"prompt\": string}} or {{\"messages\": [...]}}", where));
    }
  }
  return out;
}

int run(int argc, char** argv) {
  CLI::App app{"Generate text from a model (an HF folder, a Tessera checkpoint or save folder).", "generate"};
  tessera::util::add_plugin_option(app);
  std::string model_path, tokenizer_path, prompt_file, output, system, log_level = "warn";
  std::vector<std::string> prompts, stops;
  bool chat = false, stream = false;
  int64_t batch_size = 16;
  tessera::models::GenerationOptions g;
  g.max_new_tokens = 64;
  app.add_option("--model", model_path, "HF folder, Tessera checkpoint, save folder, or hub id in the local HF cache")
      ->required();
  app.add_option("--tokenizer", tokenizer_path,
                 "A tokenizer.json, its folder or a hub id in the local HF cache (default: the model folder's)");
  app.add_option("--prompt", prompts, "A prompt (repeatable)");
  app.add_option("--prompt-file", prompt_file,
                 "JSONL of {\"prompt\"} / {\"messages\"} rows, or a text file holding one prompt; - for stdin");
  app.add_flag("--chat", chat,
               "Render each prompt as a user message with the tokenizer's chat template (LLM Foundry's ChatML when it "
               "has none) and add the generation prompt");
  app.add_option("--system", system, "A system message before each prompt (with --chat)");
  app.add_option("--max-new-tokens", g.max_new_tokens, "Tokens to generate at most")->check(CLI::PositiveNumber);
  app.add_flag("--sample", g.do_sample, "Sample instead of greedy decoding");
  app.add_option("--temperature", g.temperature, "Sampling temperature")->check(CLI::PositiveNumber);
  app.add_option("--top-k", g.top_k, "Sample among the k most likely tokens (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", g.top_p, "Sample within the top-p probability mass")->check(CLI::Range(0.0, 1.0));
  app.add_option("--min-p", g.min_p, "Sample among tokens at least this fraction as likely as the likeliest (0: all)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--repetition-penalty", g.repetition_penalty,
                 "Divide (multiply, when negative) the logits of tokens already in the sequence by this (1: off)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", g.seed, "Sampling seed");
  app.add_option("--batch-size", batch_size,
                 "Prompts decoded together (left-padded; the output keeps the prompts' order)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--stream", stream,
               "Print each completion as its tokens come (prompts one at a time; without --output)");
  app.add_option("--stop", stops, "Stop a sequence when its tokens end with this text's tokens (repeatable)");
  app.add_option("--output", output, "Write {\"prompt\", \"completion\", \"tokens\"} rows as JSONL here");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off");
  if (auto code = tessera::util::parse_command_line(app, argc, argv)) return *code;
  tessera::util::init_logging(log_level);
  if (!system.empty() && !chat) throw tessera::ConfigError("generate", "--system needs --chat");
  if (stream && !output.empty())
    throw tessera::ConfigError("generate", "--stream prints to the terminal: drop --output");

  std::vector<Prompt> all;
  for (const std::string& p : prompts) all.push_back({p, Json()});
  if (!prompt_file.empty()) {
    for (Prompt& p : read_prompt_file(prompt_file)) all.push_back(std::move(p));
  }
  if (prompts.empty() && prompt_file.empty()) all = read_prompt_file("-");

  const std::filesystem::path tok_file = tessera::util::resolve_tool_tokenizer(tokenizer_path, model_path, "generate");
  const tessera::data::ChatTokenizer tok(tessera::data::Tokenizer::from_file(tok_file), "");
  const std::shared_ptr<tessera::models::CausalLM> model = tessera::checkpoint::load_any_model(model_path, "generate");

  std::vector<std::vector<int64_t>> ids;
  std::vector<std::string> shown;  // the prompt text as given to the model
  for (const Prompt& p : all) {
    std::string text = p.text;
    bool special = true;
    if (chat || p.messages.is_array()) {
      Json messages = p.messages.is_array() ? p.messages : Json::array();
      if (!p.messages.is_array()) {
        if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
        messages.push_back({{"role", "user"}, {"content", p.text}});
      }
      text = tok.apply_chat_template(messages, true);
      special = false;  // the template writes the special tokens (apply_chat_template's tokenization)
    }
    const std::vector<int32_t> t = tok.tokenizer().encode(text, special);
    if (t.empty()) throw tessera::ConfigError("generate", "an empty prompt (nothing to continue from)");
    ids.emplace_back(t.begin(), t.end());
    shown.push_back(text);
  }
  if (auto eos = tok.eos_token_id()) g.eos_token_id = *eos;
  g.pad_token_id = tok.pad_token_id().value_or(0);  // left padding is masked: any id will do
  for (const std::string& s : stops) {
    const std::vector<int32_t> t = tok.tokenizer().encode(s, false);
    g.stop_sequences.emplace_back(t.begin(), t.end());
  }
  std::ofstream rows;
  if (!output.empty()) {
    rows.open(output);
    if (!rows) throw tessera::Error("generate", fmt::format("cannot write {}", output));
  }
  auto decode = [&](const std::vector<int64_t>& t) {
    return tok.tokenizer().decode(std::vector<int32_t>(t.begin(), t.end()), /*skip_special_tokens=*/true);
  };
  // Batches of prompts of similar lengths (less padding), longest first; each batch's completions are written as
  // soon as it ends, in the prompts' order.
  std::vector<size_t> order(ids.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto batch = stream ? size_t{1} : static_cast<size_t>(batch_size);
  if (!stream) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ids[a].size() > ids[b].size(); });
  }
  std::vector<std::optional<std::vector<int64_t>>> done(ids.size());
  size_t next_out = 0;  // the first prompt not written yet
  for (size_t first = 0; first < order.size(); first += batch) {
    const size_t n = std::min(batch, order.size() - first);
    std::vector<std::vector<int64_t>> part;
    for (size_t b = 0; b < n; ++b) part.push_back(ids[order[first + b]]);
    tessera::models::GenerationOptions opts = g;
    std::vector<int64_t> so_far;
    std::string printed;
    if (stream) {
      if (all.size() > 1) std::cout << "=== " << order[first] + 1 << "\n";
      opts.on_token = [&](size_t, int64_t token) {
        // Print what the text gained, once it does not end inside a multi-byte character.
        so_far.push_back(token);
        const std::string text = decode(so_far);
        if (text.size() > printed.size() && text.compare(0, printed.size(), printed) == 0 &&
            text.find("\xEF\xBF\xBD", printed.size()) == std::string::npos) {
          std::cout << text.substr(printed.size()) << std::flush;
          printed = text;
        }
      };
    }
    const std::vector<std::vector<int64_t>> out = tessera::models::generate(*model, part, opts);
    for (size_t b = 0; b < n; ++b) done[order[first + b]] = out[b];
    if (stream) {
      const std::string text = decode(out[0]);
      std::cout << (text.compare(0, printed.size(), printed) == 0 ? text.substr(printed.size()) : "") << "\n";
      continue;
    }
    for (; next_out < done.size() && done[next_out]; ++next_out) {
      const std::vector<int64_t>& t = *done[next_out];
      const std::string completion = decode(t);
      if (rows.is_open()) {
        rows << nlohmann::json{{"prompt", shown[next_out]}, {"completion", completion}, {"tokens", t}}.dump() << "\n"
             << std::flush;
      } else {
        if (all.size() > 1) std::cout << "=== " << next_out + 1 << "\n";
        std::cout << completion << "\n" << std::flush;
      }
    }
  }
  return 0;
}

}  // namespace

int tessera::cli::generate_main(int argc, char** argv) {
  return tessera::util::tool_main([&] { return run(argc, argv); });
}
