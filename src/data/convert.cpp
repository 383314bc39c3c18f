// Streaming, resumable, multi-threaded conversion of text corpora to MDS (convert.h).
#include "tessera/data/convert.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <limits>
#include <mutex>
#include <set>
#include <thread>

#include "tessera/data/mds.h"
#include "tessera/data/tokenizer.h"
#include "tessera/storage/storage.h"
#include "tessera/util/device.h"
#include "tessera/util/error.h"
#include "tessera/util/file_io.h"
#include "tessera/util/hf_hub.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
constexpr const char* kConvertComponent = "convert";
constexpr const char* kProgressFile = ".tessera-convert.json";
constexpr size_t kBlockBytes = size_t{4} << 20;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

bool goes_to_val(uint64_t seed, int64_t doc, double fraction) {
  if (fraction <= 0) return false;
  const uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(doc)));
  return static_cast<double>(h >> 11) * 0x1.0p-53 < fraction;
}

// Documents in input order, a block at a time, tokenized on worker threads while the next blocks are read.
struct Block {
  int64_t first_doc = 0;
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
  bool taken = false, ready = false;
};

class Pipeline {
 public:
  Pipeline(RecordStream& stream, std::string column, const Tokenizer* tok, int workers, int64_t first_doc,
           size_t block_docs)
      : stream_(stream), column_(std::move(column)), tok_(tok), next_doc_(first_doc), block_docs_(block_docs) {
    max_blocks_ = 2 * static_cast<size_t>(std::max(1, workers)) + 2;
    threads_.emplace_back([this] { guarded([this] { read_loop(); }); });
    if (tok_ != nullptr) {
      for (int w = 0; w < std::max(1, workers); ++w)
        threads_.emplace_back([this] { guarded([this] { work_loop(); }); });
    }
  }
  ~Pipeline() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // The next block, tokenized; nullptr after the last. Rethrows a reader's or worker's error.
  std::shared_ptr<Block> next() {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock,
             [&] { return error_ || (!blocks_.empty() && blocks_.front()->ready) || (blocks_.empty() && done_); });
    if (error_) std::rethrow_exception(error_);
    if (blocks_.empty()) return nullptr;
    auto b = std::move(blocks_.front());
    blocks_.pop_front();
    cv_.notify_all();
    return b;
  }
  uint64_t bytes_read() const { return bytes_read_.load(); }

 private:
  template <typename F>
  void guarded(F&& f) {
    try {
      f();
    } catch (...) {
      std::lock_guard<std::mutex> lock(m_);
      if (!error_) error_ = std::current_exception();
      cv_.notify_all();
    }
  }
  void read_loop() {
    std::vector<Record> rows;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return stop_ || error_ || blocks_.size() < max_blocks_; });
        if (stop_ || error_) return;
      }
      auto block = std::make_shared<Block>();
      block->first_doc = next_doc_;
      size_t bytes = 0;
      while (block->texts.size() < block_docs_ && bytes < kBlockBytes) {
        rows.clear();
        const size_t want = std::min<size_t>(256, block_docs_ - block->texts.size());
        const int64_t first = stream_.position();
        if (stream_.read(rows, want) == 0) break;
        for (size_t i = 0; i < rows.size(); ++i) {
          auto it = rows[i].find(column_);
          if (it == rows[i].end() || !it->is_string()) {
            throw Error(kConvertComponent, fmt::format("{}: column '{}' is {}, not a string",
                                                       stream_.where(first + static_cast<int64_t>(i)), column_,
                                                       it == rows[i].end() ? "missing" : it->type_name()));
          }
          block->texts.push_back(it->get<std::string>());
          bytes += block->texts.back().size();
        }
      }
      bytes_read_.store(stream_.bytes_read());
      next_doc_ += static_cast<int64_t>(block->texts.size());
      std::lock_guard<std::mutex> lock(m_);
      if (block->texts.empty()) {
        done_ = true;
        cv_.notify_all();
        return;
      }
      block->ready = tok_ == nullptr;
      blocks_.push_back(std::move(block));
      cv_.notify_all();
    }
  }
  void work_loop() {
    for (;;) {
      std::shared_ptr<Block> block;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] {
          if (stop_ || error_) return true;
          for (const auto& b : blocks_) {
            if (!b->taken) return true;
          }
          return done_;
        });
        if (stop_ || error_) return;
        for (const auto& b : blocks_) {
          if (!b->taken) {
            block = b;
            break;
          }
        }
        if (!block) return;  // done_ and nothing left
        block->taken = true;
      }
      block->ids.resize(block->texts.size());
      for (size_t i = 0; i < block->texts.size(); ++i) block->ids[i] = tok_->encode(block->texts[i], true);
      std::lock_guard<std::mutex> lock(m_);
      block->ready = true;
      cv_.notify_all();
    }
  }

  RecordStream& stream_;
  std::string column_;
  const Tokenizer* tok_;
  int64_t next_doc_;
  size_t block_docs_;
  size_t max_blocks_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Block>> blocks_;
  bool done_ = false, stop_ = false;
  std::exception_ptr error_;
  std::atomic<uint64_t> bytes_read_{0};
  std::vector<std::thread> threads_;  // last: joined before the rest is destroyed
};

// Where a split continues after its last finished shard.
struct SplitState {
  int64_t shards = 0, samples = 0;
  int64_t restart_doc = 0, restart_offset = 0;  // the first sample not in a finished shard starts here
  int64_t documents = 0;                        // documents of the split before restart_doc
  Json to_json() const {
    return Json{{"shards", shards},
                {"samples", samples},
                {"restart_doc", restart_doc},
                {"restart_offset", restart_offset},
                {"documents", documents}};
  }
  static SplitState from_json(const Json& j) {
    SplitState s;
    s.shards = j.at("shards").get<int64_t>();
    s.samples = j.at("samples").get<int64_t>();
    s.restart_doc = j.at("restart_doc").get<int64_t>();
    s.restart_offset = j.at("restart_offset").get<int64_t>();
    s.documents = j.at("documents").get<int64_t>();
    return s;
  }
};

struct Split {
  std::string name, location;
  std::unique_ptr<mds::MDSWriter> writer;
  SplitState state;  // as of the last finished shard
  // The running token buffer and the documents it came from: (document, tokens) segments, the first `front_skip`
  // tokens of the first one already emitted.
  std::vector<int32_t> buffer;
  size_t taken = 0;
  std::deque<std::pair<int64_t, int64_t>> segments;
  int64_t front_skip = 0;
  // The sample being written: where it starts, and the split's documents before that one.
  int64_t pending_doc = 0, pending_offset = 0, pending_documents = 0;
  int64_t documents = 0, samples = 0, tokens = 0;
};

void prepare_output(const std::string& dir, bool overwrite) {
  if (storage::is_remote(dir)) {
    const auto existing = storage::list(storage::join(dir, ""));
    if (existing.empty()) return;
    if (!overwrite) {
      throw ConfigError(kConvertComponent, fmt::format("{}: output location holds {} objects (pass --overwrite to "
                                                       "replace them)",
                                                       dir, existing.size()));
    }
    for (const auto& obj : existing) storage::remove(obj.uri);
    return;
  }
  if (fs::exists(dir) && !fs::is_empty(dir)) {
    if (!overwrite) {
      throw ConfigError(kConvertComponent,
                        fmt::format("{}: output directory is not empty (pass --overwrite to replace it)", dir));
    }
    fs::remove_all(dir);
  }
}

// Keeps the first `shards` shards of an interrupted split (as its index.json lists them) and deletes the rest.
Json keep_finished_shards(const std::string& dir, int64_t shards) {
  Json kept = Json::array();
  if (shards > 0) {
    const std::string index_path = (fs::path(dir) / "index.json").string();
    Json index;
    try {
      index = Json::parse(util::read_file(index_path, kConvertComponent));
    } catch (const Json::exception& e) {
      throw Error(kConvertComponent, fmt::format("{}: cannot resume: {}", index_path, e.what()));
    }
    const Json& listed = index.at("shards");
    if (static_cast<int64_t>(listed.size()) < shards) {
      throw Error(kConvertComponent, fmt::format("{}: lists {} shards, but {} says {} were finished", index_path,
                                                 listed.size(), kProgressFile, shards));
    }
    for (int64_t k = 0; k < shards; ++k) {
      const Json& s = listed[static_cast<size_t>(k)];
      const Json& file = s.at("zip_data").is_null() ? s.at("raw_data") : s.at("zip_data");
      const fs::path path = fs::path(dir) / file.at("basename").get<std::string>();
      std::error_code ec;
      if (fs::file_size(path, ec) != file.at("bytes").get<uint64_t>() || ec) {
        throw Error(kConvertComponent, fmt::format("{}: missing or of the wrong size; cannot resume (pass --overwrite "
                                                   "to start over)",
                                                   path.string()));
      }
      kept.push_back(s);
    }
  }
  std::set<std::string> keep{"index.json"};
  for (const auto& s : kept) {
    keep.insert(s.at("raw_data").at("basename").get<std::string>());
    if (!s.at("zip_data").is_null()) keep.insert(s.at("zip_data").at("basename").get<std::string>());
  }
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (!keep.count(entry.path().filename().string())) fs::remove_all(entry.path());
    }
  }
  return kept;
}

Json fingerprint(const ConvertOptions& o, const std::vector<std::string>& files) {
  Json inputs = Json::array();
  for (const std::string& f : files) {
    std::error_code ec;
    inputs.push_back(Json{{"file", f}, {"bytes", storage::is_remote(f) ? 0 : fs::file_size(f, ec)}});
  }
  return Json{{"inputs", inputs},
              {"format", o.format ? record_format_name(*o.format) : "auto"},
              {"text_column", o.text_column},
              {"tokenizer", o.tokenizer},
              {"concat_tokens", o.concat_tokens},
              {"bos_text", o.bos_text},
              {"eos_text", o.eos_text},
              {"no_wrap", o.no_wrap},
              {"compression", o.compression ? *o.compression : "none"},
              {"val_fraction", o.val_fraction},
              {"seed", o.seed},
              {"splits", Json::array({o.train_split, o.val_split})},
              {"size_limit", o.size_limit}};
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) {
    b /= 1000;
    ++u;
  }
  return fmt::format("{:.{}f} {}", b, u == 0 ? 0 : 2, units[u]);
}

std::string human_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e4) return fmt::format("{:.1f}k", n / 1e3);
  return fmt::format("{:.0f}", n);
}

}  // namespace

std::string format_convert_progress(const ConvertProgress& p) {
  const double secs = std::max(p.seconds, 1e-9);
  std::string head;
  if (p.total_bytes > 0) {
    head =
        fmt::format("{:5.1f}% {} / {}", 100.0 * static_cast<double>(p.bytes_read) / static_cast<double>(p.total_bytes),
                    human_bytes(static_cast<double>(p.bytes_read)), human_bytes(static_cast<double>(p.total_bytes)));
  } else {
    head = human_bytes(static_cast<double>(p.bytes_read));
  }
  std::string line = fmt::format(
      "{} | {} docs, {} tokens, {} samples | {}/s, {} docs/s, {} tokens/s", head,
      human_count(static_cast<double>(p.documents)), human_count(static_cast<double>(p.tokens)),
      human_count(static_cast<double>(p.samples)), human_bytes(static_cast<double>(p.bytes_read) / secs),
      human_count(static_cast<double>(p.documents) / secs), human_count(static_cast<double>(p.tokens) / secs));
  if (p.done) {
    line += fmt::format(" | done in {:.1f} s", p.seconds);
  } else if (p.total_bytes > 0 && p.bytes_read > 0) {
    const double eta = secs * static_cast<double>(p.total_bytes - std::min(p.total_bytes, p.bytes_read)) /
                       static_cast<double>(p.bytes_read);
    line += fmt::format(" | ETA {}:{:02d}", static_cast<int64_t>(eta) / 60, static_cast<int64_t>(eta) % 60);
  }
  return line;
}

ConvertResult convert_to_mds(const ConvertOptions& o) {
  if (o.inputs.empty()) throw ConfigError(kConvertComponent, "no inputs");
  if (o.output.empty()) throw ConfigError(kConvertComponent, "no output");
  if (o.concat_tokens > 0 && o.tokenizer.empty())
    throw ConfigError(kConvertComponent, "--concat-tokens needs --tokenizer");
  if (o.concat_tokens == 0 && (!o.bos_text.empty() || !o.eos_text.empty() || o.no_wrap)) {
    throw ConfigError(kConvertComponent, "--bos-text, --eos-text and --no-wrap apply only with --concat-tokens");
  }
  if (o.val_fraction < 0 || o.val_fraction >= 1) {
    throw ConfigError(kConvertComponent, fmt::format("val_fraction {} is outside [0, 1)", o.val_fraction));
  }
  const std::vector<std::string> files = expand_record_inputs(o.inputs, o.format);
  if (files.empty()) throw Error(kConvertComponent, fmt::format("no input files in {}", fmt::join(o.inputs, ", ")));
  const int workers = o.workers > 0 ? o.workers : util::available_cores();

  std::optional<Tokenizer> tok;
  std::vector<int32_t> bos, eos;
  if (o.concat_tokens > 0) {
    tok = Tokenizer::from_file(util::resolve_hf_tokenizer(o.tokenizer));
    if (!tok->encode("", true).empty() && (!o.bos_text.empty() || !o.eos_text.empty())) {
      spdlog::warn("the tokenizer adds special tokens itself, and --bos-text/--eos-text add more; tokens may repeat");
    }
    if (!o.bos_text.empty()) bos = tok->encode(o.bos_text, false);
    if (!o.eos_text.empty()) eos = tok->encode(o.eos_text, false);
  }

  const bool local = !storage::is_remote(o.output);
  const std::string progress_path = local ? (fs::path(o.output) / kProgressFile).string() : "";
  const Json print = fingerprint(o, files);
  ConvertResult result;
  std::vector<Split> splits(o.val_fraction > 0 ? 2 : 1);
  splits[0].name = o.train_split;
  if (splits.size() > 1) splits[1].name = o.val_split;
  for (Split& s : splits) s.location = storage::join(o.output, s.name);

  Json saved;
  std::error_code ec;
  if (local && fs::exists(progress_path, ec) && !o.overwrite) {
    try {
      saved = Json::parse(util::read_file(progress_path, kConvertComponent));
    } catch (const Json::exception& e) {
      throw Error(kConvertComponent,
                  fmt::format("{}: unreadable ({}); pass --overwrite to start over", progress_path, e.what()));
    }
    if (saved.value("fingerprint", Json()) != print) {
      throw ConfigError(kConvertComponent, fmt::format("{}: holds an interrupted conversion of other inputs or options "
                                                       "(pass --overwrite to start over)",
                                                       progress_path));
    }
    result.resumed = true;
    // A kill while the progress file was being replaced leaves its temporary copy; the split folders are cleaned
    // below (keep_finished_shards).
    for (const auto& entry : fs::directory_iterator(o.output)) {
      if (entry.path().filename().string().rfind(std::string(kProgressFile) + ".tmp", 0) == 0) fs::remove(entry.path());
    }
  } else {
    if (local && o.overwrite) fs::remove(progress_path, ec);
    for (const Split& s : splits) prepare_output(s.location, o.overwrite);
  }

  const auto save_progress = [&] {
    Json state = Json::object();
    for (const Split& s : splits) state[s.name] = s.state.to_json();
    util::write_file_atomically(progress_path, Json{{"version", 1}, {"fingerprint", print}, {"splits", state}}.dump(1),
                                kConvertComponent);
  };

  int64_t start_doc = std::numeric_limits<int64_t>::max();
  for (Split& s : splits) {
    mds::WriterOptions w;
    w.out = s.location;
    w.compression = o.compression;
    w.size_limit = o.size_limit;
    w.exist_ok = true;
    w.columns = tok ? std::map<std::string, std::string>{{"tokens", "ndarray:int32"}}
                    : std::map<std::string, std::string>{{"text", "str"}};
    if (result.resumed) {
      s.state = SplitState::from_json(saved.at("splits").at(s.name));
      w.resume_shards = keep_finished_shards(s.location, s.state.shards);
      s.documents = s.state.documents;
      s.samples = s.state.samples;
      s.tokens = tok ? s.samples * o.concat_tokens : 0;
    }
    start_doc = std::min(start_doc, s.state.restart_doc);
    if (local) {
      w.index_every_shard = true;
      w.on_shard = [&s, &save_progress](int64_t shards, int64_t samples) {
        s.state = SplitState{shards, samples, s.pending_doc, s.pending_offset, s.pending_documents};
        save_progress();
      };
    }
    s.writer = std::make_unique<mds::MDSWriter>(std::move(w));
  }
  if (local && !result.resumed) {
    fs::create_directories(o.output);
    save_progress();
  }
  result.resumed_at_document = start_doc;
  if (result.resumed) {
    spdlog::info("[convert] resuming an interrupted conversion at document {} ({})", start_doc, progress_path);
  }

  RecordStream stream(files, o.format, {o.text_column});
  stream.skip(start_doc);
  const auto t0 = std::chrono::steady_clock::now();
  auto last_report = t0;
  int64_t documents = start_doc;
  const auto emit_progress = [&](uint64_t bytes, bool done) {
    ConvertProgress p;
    p.bytes_read = bytes;
    p.total_bytes = stream.total_bytes();
    p.documents = documents;
    for (const Split& s : splits) {
      p.samples += s.samples;
      p.tokens += s.tokens;
    }
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    p.done = done;
    result.progress = p;
    if (o.progress) o.progress(p);
  };

  const auto n = static_cast<size_t>(o.concat_tokens);
  {
    Pipeline pipeline(stream, o.text_column, tok ? &*tok : nullptr, workers, start_doc,
                      static_cast<size_t>(std::max<int64_t>(1, o.block_documents)));
    std::vector<int32_t> doc_tokens;
    while (auto block = pipeline.next()) {
      for (size_t i = 0; i < block->texts.size(); ++i) {
        const int64_t d = block->first_doc + static_cast<int64_t>(i);
        documents = d + 1;
        Split& s = splits[splits.size() > 1 && goes_to_val(o.seed, d, o.val_fraction) ? 1 : 0];
        if (d < s.state.restart_doc) continue;  // already in a finished shard (resuming)
        ++s.documents;
        if (!tok) {
          s.pending_doc = d;
          s.pending_offset = 0;
          s.pending_documents = s.documents - 1;
          s.writer->write({{"text", std::move(block->texts[i])}});
          ++s.samples;
          continue;
        }
        doc_tokens.clear();
        doc_tokens.insert(doc_tokens.end(), bos.begin(), bos.end());
        doc_tokens.insert(doc_tokens.end(), block->ids[i].begin(), block->ids[i].end());
        doc_tokens.insert(doc_tokens.end(), eos.begin(), eos.end());
        int64_t skip = 0;
        if (d == s.state.restart_doc)
          skip = std::min<int64_t>(s.state.restart_offset, static_cast<int64_t>(doc_tokens.size()));
        s.buffer.insert(s.buffer.end(), doc_tokens.begin() + skip, doc_tokens.end());
        s.segments.emplace_back(d, static_cast<int64_t>(doc_tokens.size()));
        if (s.segments.size() == 1) s.front_skip = skip;
        while (s.buffer.size() - s.taken >= n) {
          // Drop segments already emitted in full (documents without tokens left among them).
          while (!s.segments.empty() && s.front_skip >= s.segments.front().second) {
            s.front_skip -= s.segments.front().second;
            s.segments.pop_front();
          }
          s.pending_doc = s.segments.front().first;
          s.pending_offset = s.front_skip;
          s.pending_documents = s.documents - static_cast<int64_t>(s.segments.size());
          const at::Tensor t = at::from_blob(s.buffer.data() + s.taken, {static_cast<int64_t>(n)}, at::kInt).clone();
          s.writer->write({{"tokens", t}});
          ++s.samples;
          s.tokens += static_cast<int64_t>(n);
          if (o.no_wrap) {
            s.taken = s.buffer.size();
            s.segments.clear();
            s.front_skip = 0;
          } else {
            s.taken += n;
            s.front_skip += static_cast<int64_t>(n);
          }
        }
        s.buffer.erase(s.buffer.begin(), s.buffer.begin() + static_cast<std::ptrdiff_t>(s.taken));
        s.taken = 0;
      }
      const auto now = std::chrono::steady_clock::now();
      if (o.progress && std::chrono::duration<double>(now - last_report).count() >= o.progress_interval) {
        last_report = now;
        emit_progress(pipeline.bytes_read(), false);
      }
    }
  }
  for (Split& s : splits) {
    // The final flush records a state too; it is dropped with the progress file below.
    s.writer->finish();
    result.splits.push_back(ConvertSplitResult{s.name, s.location, s.documents, s.samples, s.tokens});
  }
  if (local) fs::remove(progress_path, ec);
  emit_progress(stream.bytes_read(), true);
  return result;
}

}  // namespace tessera::data
