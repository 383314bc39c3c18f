// Tokenizer and BPE trainer: clear errors for malformed tokenizer.json (file and key named, never a crash), round
// trips, the invalid-UTF-8 policy, trainer determinism, document readers. Id parity with Hugging Face is checked in
// tests/compat/test_tokenizer_hf.py.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>

#include "tessera/data/documents.h"
#include "tessera/data/tokenizer.h"
#include "test_util.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using tessera::testing::error_of;

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> docs = [] {
    std::vector<std::string> d;
    const char* base[] = {"The quick brown fox jumps over the lazy dog. ", "Hello, world! Hello again, world.\n",
                          "I'm sure you're right; they'll see it's 42.\n", "naïve café résumé — “quotes” 😀 中文\n",
                          "    indented code(x) + y ** 2\n\ttabs\r\n"};
    for (int i = 0; i < 60; ++i) d.push_back(std::string(base[i % 5]) + base[(i * 3 + 1) % 5] + std::to_string(i));
    return d;
  }();
  return docs;
}

const Tokenizer& trained() {
  static const Tokenizer tok = train_bpe_tokenizer(corpus(), {.vocab_size = 360, .min_frequency = 2});
  return tok;
}

Json valid_json() {
  return Json::parse(trained().to_json());
}

std::string load_error(const Json& j) {
  return error_of([&] { Tokenizer::from_json(j.dump(), "bad/tokenizer.json"); });
}

TEST(Tokenizer, MalformedJsonNamesFileAndKey) {
  EXPECT_NE(error_of([] {
              Tokenizer::from_json("{\"model\": ", "x/tokenizer.json");
            }).find("x/tokenizer.json: malformed JSON"),
            std::string::npos);
  EXPECT_NE(load_error(Json::array()).find("bad/tokenizer.json: (root): expected an object"), std::string::npos);

  struct Case {
    std::function<void(Json&)> mutate;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](Json& j) { j.erase("model"); }, "bad/tokenizer.json: model: missing"},
      {[](Json& j) { j["model"]["type"] = "WordPiece"; }, "model.type: unsupported model \"WordPiece\""},
      {[](Json& j) { j["model"]["vocab"] = 3; }, "model.vocab: expected an object, got number"},
      {[](Json& j) { j["model"]["vocab"]["zz-new"] = 5; }, "model.vocab: tokens"},
      {[](Json& j) { j["model"]["vocab"]["zz-new"] = -1; }, "model.vocab.\"zz-new\": id -1 out of range"},
      {[](Json& j) { j["model"]["vocab"]["zz-new"] = "7"; }, "model.vocab.\"zz-new\": expected an integer id"},
      {[](Json& j) {
         j["model"]["merges"][0] = Json::array({"nope", "x"});
       },
       "model.merges[0]: merge names unknown token \"nope\""},
      {[](Json& j) { j["model"]["merges"][1] = 12; }, "model.merges[1]: expected a \"a b\" string"},
      {[](Json& j) { j["model"]["merges"][2] = "a b c"; }, "model.merges[2]: expected \"<left> <right>\""},
      {[](Json& j) { j["model"]["merges"][0] = "Q Z"; }, "model.merges[0]: merged token \"QZ\" is not in the vocab"},
      {[](Json& j) { j["model"]["byte_fallback"] = true; },
       "model.byte_fallback: must be false with a ByteLevel pre-tokenizer"},
      {[](Json& j) { j["model"]["unk_token"] = "<unk>"; }, "model.unk_token: \"<unk>\" is not in the vocab"},
      {[](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       "model.continuing_subword_prefix: must be null or empty"},
      {[](Json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout: must be null"},
      {[](Json& j) { j["truncation"] = Json::object(); }, "truncation: must be null"},
      {[](Json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer.type: unsupported normalizer \"Lowercase\""},
      {[](Json& j) {
         j["normalizer"] = {{"kind", "NFC"}};
       },
       "normalizer.type: missing"},
      {[](Json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer.type: unsupported pre_tokenizer"},
      {[](Json& j) {
         j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", "(unclosed"}}}, {"content", "x"}};
       },
       "normalizer.pattern.Regex: invalid regular expression"},
      {[](Json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}, {"prepend_scheme", "first"}};
       },
       "pre_tokenizer.replacement: expected one character, got \"ab\""},
      {[](Json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "sometimes"}};
       },
       "pre_tokenizer.prepend_scheme: unknown scheme \"sometimes\""},
      {[](Json& j) {
         j["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers", Json::array({j["pre_tokenizer"], {{"type", "Metaspace"}, {"replacement", "_"}}})}};
       },
       "pre_tokenizer: a ByteLevel pre-tokenizer must come last"},
      {[](Json& j) {
         j["decoder"] = {
             {"type", "Sequence"},
             {"decoders", Json::array({{{"type", "Strip"}, {"content", " "}, {"start", -1}, {"stop", 0}}})}};
       },
       "decoder.decoders[0].start: expected a non-negative integer"},
      {[](Json& j) {
         j["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers",
              Json::array({{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
                           j["pre_tokenizer"]})}};
       },
       "pre_tokenizer.pretokenizers[0].pattern.Regex: invalid regular expression"},
      {[](Json& j) { j["pre_tokenizer"]["add_prefix_space"] = "yes"; },
       "pre_tokenizer.add_prefix_space: expected a boolean"},
      {[](Json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder.type: unsupported decoder \"WordPiece\""},
      {[](Json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       "post_processor.type: unsupported post_processor"},
      {[](Json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"},
                                {"single", Json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                                {"special_tokens", Json::object()}};
       },
       "post_processor.special_tokens.\"<s>\": missing (named by post_processor.single[0])"},
      {[](Json& j) { j["added_tokens"][0]["id"] = 7; }, "added_tokens[0].id: \"<|endoftext|>\" has id 7"},
      {[](Json& j) { j["added_tokens"].push_back(j["added_tokens"][0]); },
       "added_tokens[1].content: duplicate added token"},
      {[](Json& j) { j["added_tokens"][0]["content"] = 5; }, "added_tokens[0].content: expected a string"},
      {[](Json& j) { j["added_tokens"][0].erase("id"); }, "added_tokens[0].id: missing"},
  };
  for (const Case& c : cases) {
    Json j = valid_json();
    c.mutate(j);
    const std::string error = load_error(j);
    EXPECT_NE(error.find("[tokenizer] bad/tokenizer.json: "), std::string::npos) << error;
    EXPECT_NE(error.find(c.expected), std::string::npos) << "expected \"" << c.expected << "\" in: " << error;
  }
}

TEST(Tokenizer, DamagedFilesNeverCrash) {
  const std::string good = trained().to_json();
  // Every truncation point in the first few KB, and byte flips across the file: an error or a tokenizer, no crash.
  int errors = 0;
  for (size_t n = 0; n < std::min<size_t>(good.size(), 3000); n += 7) {
    errors += error_of([&] { Tokenizer::from_json(good.substr(0, n), "t.json"); }) != "(no error)";
  }
  EXPECT_GT(errors, 300);
  std::mt19937 rng(1);
  for (int i = 0; i < 300; ++i) {
    std::string s = good;
    for (int k = 0; k < 3; ++k) s[rng() % s.size()] = static_cast<char>(rng() % 256);
    const std::string e = error_of([&] {
      const Tokenizer t = Tokenizer::from_json(s, "t.json");
      t.decode(t.encode("Hello, world! 😀"));
    });
    if (e != "(no error)") {
      EXPECT_NE(e.find("t.json"), std::string::npos) << e;
    }
  }
  EXPECT_NE(error_of([] {
              Tokenizer::from_file("/nonexistent/dir/tokenizer.json");
            }).find("/nonexistent/dir/tokenizer.json: cannot open"),
            std::string::npos);
}

TEST(Tokenizer, EmptyMergesEncodeBytes) {
  // Found by fuzz_tokenizer_json: a model without merges used to read an empty hash table.
  for (const Json& merges : {Json::array(), Json(nullptr)}) {
    Json j = valid_json();
    j["model"]["merges"] = merges;
    const Tokenizer t = Tokenizer::from_json(j.dump(), "no-merges.json");
    EXPECT_EQ(t.encode("ab").size(), 2U);
    EXPECT_EQ(t.decode(t.encode("héllo")), "héllo");
  }
}

TEST(Tokenizer, RoundTripsText) {
  const Tokenizer& t = trained();
  const std::vector<std::string> texts = {"",
                                          "Hello, world!",
                                          "  leading and trailing  \n",
                                          "naïve café 😀👨‍👩‍👧 中文 עברית e\u0301",
                                          "\t\r\n\x01\x7f",
                                          "<|endoftext|> special <|endoftext|>",
                                          std::string(1000, 'x')};
  for (const std::string& s : texts) EXPECT_EQ(t.decode(t.encode(s)), s) << s;
  for (const std::string& s : corpus()) EXPECT_EQ(t.decode(t.encode(s)), s);
  // The special token is split out before pre-tokenization and dropped by skip_special_tokens.
  const auto ids = t.encode("a<|endoftext|>b");
  ASSERT_EQ(ids.size(), 3U);
  EXPECT_EQ(ids[1], 0);
  EXPECT_EQ(t.decode(ids, /*skip_special_tokens=*/true), "ab");
  EXPECT_TRUE(t.encode("").empty());
  EXPECT_EQ(t.vocab_size(), 360);
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 0);
  EXPECT_EQ(t.id_to_token(0), "<|endoftext|>");
  EXPECT_EQ(t.token_to_id("\xC4\xA0"), t.encode(" ")[0]);  // "Ġ" is the space byte
  EXPECT_FALSE(t.token_to_id("not a token"));
  EXPECT_FALSE(t.id_to_token(360));
  EXPECT_FALSE(t.id_to_token(-1));
  EXPECT_EQ(t.decode({-5, 1 << 30}), "");  // unknown ids are skipped
}

TEST(Tokenizer, InvalidUtf8IsReplacedLikePython) {
  // Golden values: bytes.decode("utf-8", errors="replace") in Python 3.11.
  const std::string r = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\xFF", r},
      {"abc\xFF"
       "def",
       "abc" + r + "def"},
      {"\xC3", r},
      {"\xC3(", r + "("},
      {"\xE2\x82", r},
      {"\xE2\x82(", r + "("},
      {"\xED\xA0\x80", r + r + r},  // a surrogate: three maximal subparts
      {"\xF0\x9F\x98", r},
      {"\xF0\x9F\x98\x80\xF0\x9F", "\xF0\x9F\x98\x80" + r},
      {"\xC0\xAF", r + r},  // overlong
      {"\xF5\x80\x80\x80", r + r + r + r},
      {"\x80\x80", r + r},
      {"\xE0\x80\x80", r + r + r},
      {"\xF4\x90\x80\x80", r + r + r + r},  // above U+10FFFF
  };
  const Tokenizer& t = trained();
  for (const auto& [in, want] : cases) {
    EXPECT_EQ(sanitize_utf8(in), want);
    EXPECT_EQ(t.encode(in), t.encode(want));
    EXPECT_EQ(t.decode(t.encode(in)), want);
  }
  // A lone byte token decodes to U+FFFD (HF's ByteLevel decoder uses from_utf8_lossy).
  const auto high = t.token_to_id("\xC3\x83");  // byte-level character of byte 0xC3
  ASSERT_TRUE(high);
  EXPECT_EQ(t.decode({*high}), r);
}

TEST(Tokenizer, SaveLoadAndThreads) {
  const fs::path dir = fs::temp_directory_path() / "tessera_tokenizer_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  trained().save(dir / "tokenizer.json");
  const Tokenizer loaded = Tokenizer::from_file(dir);  // a directory holding tokenizer.json
  EXPECT_EQ(loaded.to_json(), trained().to_json());
  std::vector<std::vector<int32_t>> want;
  for (const auto& d : corpus()) want.push_back(loaded.encode(d));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep) {
        for (size_t i = 0; i < corpus().size(); ++i) mismatches += loaded.encode(corpus()[i]) != want[i];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, 0);
  fs::remove_all(dir);
}

// tokenizer_config.json / special_tokens_map.json in a folder: the special tokens transformers reads (the map wins),
// and errors naming the file and key for a token the vocab lacks or a malformed file.
TEST(Tokenizer, FolderConfigNamesSpecialTokens) {
  const fs::path dir = fs::temp_directory_path() / "tessera_tokenizer_config_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  trained().save(dir / "tokenizer.json");
  const auto write = [&](const char* name, const std::string& text) { std::ofstream(dir / name) << text; };
  write("tokenizer_config.json",
        R"({"bos_token": "<|endoftext|>", "eos_token": {"content": "<|endoftext|>", "__type": "AddedToken"},
            "pad_token": null, "tokenizer_class": "GPT2Tokenizer"})");
  Tokenizer t = Tokenizer::from_file(dir);
  EXPECT_EQ(t.bos_token_id(), trained().token_to_id("<|endoftext|>"));
  EXPECT_EQ(t.eos_token(), "<|endoftext|>");
  EXPECT_FALSE(t.pad_token_id());
  EXPECT_EQ(t.encode("ab"), trained().encode("ab"));  // only LlamaTokenizer(Fast) rebuilds the template
  EXPECT_FALSE(Tokenizer::from_file(dir / "tokenizer.json").bos_token());  // a file alone: tokenizers' from_file

  write("special_tokens_map.json", R"({"pad_token": "<|endoftext|>"})");
  EXPECT_EQ(Tokenizer::from_file(dir).pad_token_id(), trained().token_to_id("<|endoftext|>"));

  write("tokenizer_config.json", R"({"tokenizer_class": "LlamaTokenizerFast", "add_eos_token": true,
                                     "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})");
  const int32_t eot = *trained().token_to_id("<|endoftext|>");
  const std::vector<int32_t> body = trained().encode("ab", false);
  std::vector<int32_t> want = {eot};
  want.insert(want.end(), body.begin(), body.end());
  want.push_back(eot);
  EXPECT_EQ(Tokenizer::from_file(dir).encode("ab"), want);

  write("special_tokens_map.json", R"({"eos_token": "<nope>"})");
  std::string error = error_of([&] { Tokenizer::from_file(dir); });
  EXPECT_NE(error.find(dir.string() + ": eos_token \"<nope>\" is not a token of"), std::string::npos) << error;
  write("special_tokens_map.json", R"({"eos_token": 3})");
  error = error_of([&] { Tokenizer::from_file(dir); });
  EXPECT_NE(error.find("special_tokens_map.json: eos_token: expected a string"), std::string::npos) << error;
  fs::remove(dir / "special_tokens_map.json");
  write("tokenizer_config.json", R"({"tokenizer_class": "LlamaTokenizer"})");
  error = error_of([&] { Tokenizer::from_file(dir); });
  EXPECT_NE(error.find("tokenizer_config.json: bos_token: add_bos_token is true but bos_token is not set"),
            std::string::npos)
      << error;
  write("tokenizer_config.json", "{");
  error = error_of([&] { Tokenizer::from_file(dir); });
  EXPECT_NE(error.find("tokenizer_config.json: malformed JSON"), std::string::npos) << error;
  fs::remove_all(dir);
}

TEST(BpeTrainer, DeterministicAndIndependentOfDocumentOrder) {
  const BpeTrainerOptions o{.vocab_size = 350, .min_frequency = 2, .special_tokens = {"<|endoftext|>", "<pad>"}};
  const Tokenizer a = train_bpe_tokenizer(corpus(), o);
  const Tokenizer b = train_bpe_tokenizer(corpus(), o);
  std::vector<std::string> reversed(corpus().rbegin(), corpus().rend());
  const Tokenizer c = train_bpe_tokenizer(reversed, o);
  EXPECT_EQ(a.to_json(), b.to_json());
  EXPECT_EQ(a.to_json(), c.to_json());
  EXPECT_EQ(a.vocab_size(), 350);
  EXPECT_EQ(a.token_to_id("<pad>"), 1);
  // Byte tokens follow the specials in code point order of their byte-level characters: '!' (byte 0x21) first.
  EXPECT_EQ(a.token_to_id("!"), 2);
  // min_frequency above every pair count: no merges, just specials + 256 bytes.
  const Tokenizer none = train_bpe_tokenizer(corpus(), {.vocab_size = 1000, .min_frequency = 1000000});
  EXPECT_EQ(none.vocab_size(), 257);
  EXPECT_NE(error_of([] { train_bpe_tokenizer({}, {.vocab_size = 0}); }).find("vocab_size 0 out of range"),
            std::string::npos);
}

TEST(Documents, ReadsFortunesTextAndJsonl) {
  const fs::path dir = fs::temp_directory_path() / "tessera_documents_test";
  fs::remove_all(dir);
  fs::create_directories(dir / "f");
  std::ofstream(dir / "f" / "jokes") << "first\nline two\n%\nsecond\n%\n%\nthird";
  std::ofstream(dir / "f" / "jokes.dat") << "binary index";
  EXPECT_EQ(read_documents({dir / "f"}, DocumentFormat::kFortunes),
            (std::vector<std::string>{"first\nline two\n", "second\n", "third"}));
  std::ofstream(dir / "a.txt") << "doc a";
  EXPECT_EQ(read_documents({dir / "a.txt"}, DocumentFormat::kText), std::vector<std::string>{"doc a"});
  std::ofstream(dir / "d.jsonl") << "{\"text\": \"one\"}\n\n{\"text\": \"two\\n\", \"id\": 3}\n";
  EXPECT_EQ(read_documents({dir / "d.jsonl"}, DocumentFormat::kJsonl), (std::vector<std::string>{"one", "two\n"}));
  std::ofstream(dir / "bad.jsonl") << "{\"text\": \"one\"}\n{\"txt\": 1}\n";
  EXPECT_NE(
      error_of([&] { read_documents({dir / "bad.jsonl"}, DocumentFormat::kJsonl); }).find("bad.jsonl:2: expected"),
      std::string::npos);
  std::ofstream(dir / "broken.jsonl") << "{\"text\": \n";
  EXPECT_NE(error_of([&] {
              read_documents({dir / "broken.jsonl"}, DocumentFormat::kJsonl);
            }).find("broken.jsonl:1: malformed JSON"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_documents({dir / "missing"}, DocumentFormat::kText); }).find("no such file"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_document_format("csv"); }).find("unknown document format \"csv\""), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tessera::data
