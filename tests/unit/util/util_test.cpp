// Hash digests, Python-compatible JSON and XML documents, against values computed by Python (hashlib, xxhash, json).
#include <dlfcn.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tessera/util/error.h"
#include "tessera/util/hashing.h"
#include "tessera/util/python_json.h"
#include "tessera/util/xml.h"

namespace tessera::util {
namespace {

TEST(Hashing, GoldenDigestsOfAbc) {
  EXPECT_EQ(hex_digest("sha1", "abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
  EXPECT_EQ(hex_digest("xxh64", "abc"), "44bc2cf5ad770999");
  EXPECT_EQ(hex_digest("xxh3_64", "abc"), "78af5f94892f3950");
  EXPECT_EQ(hex_digest("sha1", ""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
  EXPECT_EQ(hex_digest("sha1", std::string(1000000, 'a')), "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
  EXPECT_EQ(hex_digest("sha256", "abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // The same digest over a file held in several buffers (an LFS object id), empty buffers included.
  EXPECT_EQ(sha256_hex({"a", "", "bc"}), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex({}), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  // Python's hashlib and xxhash on b"abc" (hashlib.<name>(b"abc").hexdigest(), xxhash.<name>(...).hexdigest()).
  EXPECT_EQ(hex_digest("md5", "abc"), "900150983cd24fb0d6963f7d28e17f72");
  EXPECT_EQ(
      hex_digest("blake2b", "abc"),
      "ba80a53f981c4d0d6a2797b69f12f6e94c212f14685ac4b74b12bb6fdbffa2d17d87c5392aab792dc252d5de4533cc9518d38aa8dbf"
      "1925ab92386edd4009923");
  EXPECT_EQ(hex_digest("blake2s", "abc"), "508c5e8c327c14e2e1a72ba34eeb452f37458b209ed63a294d999b4c86675982");
  EXPECT_EQ(hex_digest("sha3_256", "abc"), "3a985da74fe225b2045c172d6bd390bd855f086e3e9d525b46bfe24511431532");
  EXPECT_EQ(hex_digest("xxh32", "abc"), "32d153ff");
  EXPECT_EQ(hex_digest("xxh128", "abc"), "06b05ab6733a618578af5f94892f3950");
  EXPECT_EQ(hex_digest("xxh3_128", "abc"), "06b05ab6733a618578af5f94892f3950");
  EXPECT_EQ(supported_hashes().size(), 17U);
  for (const std::string& name : supported_hashes()) EXPECT_TRUE(hash_supported(name)) << name;
  EXPECT_FALSE(hash_supported("sm3"));
  EXPECT_THROW(hex_digest("sm3", "abc"), tessera::Error);
  EXPECT_THROW(hex_digest("shake_128", "abc"), tessera::Error);
}

TEST(Xml, ParsesWhatS3AndStsSendAndRefusesWhatTheyDoNot) {
  const XmlElement doc = parse_xml(
      " \r\n<?xml version=\"1.0\"?>\n<a:Root xmlns:a=\"urn:x\"><Item><Key>x &lt;&amp;&gt; &#233;&#x1F600;</Key></Item>"
      "<Item><Key><![CDATA[<raw>]]></Key></Item><Deep><Deeper><Credentials><Id>7</Id></Credentials></Deeper></Deep>"
      "</a:Root>",
      "test", "doc");
  EXPECT_EQ(doc.name, "Root");
  ASSERT_EQ(doc.children_named("Item").size(), 2U);
  EXPECT_EQ(doc.children_named("Item")[0]->child_text("Key"), "x <&> \u00e9\U0001F600");
  EXPECT_EQ(doc.children_named("Item")[1]->child_text("Key"), "<raw>");
  EXPECT_EQ(doc.child_text("Missing"), "");
  EXPECT_EQ(doc.child("Credentials"), nullptr);
  ASSERT_NE(doc.find("Credentials"), nullptr);
  EXPECT_EQ(doc.find("Credentials")->child_text("Id"), "7");
  // Refused: malformed documents, two roots, entity declarations (no expansion at all), external entities, nesting
  // past the limit.
  std::string deep;
  for (int i = 0; i <= kMaxXmlDepth + 1; ++i) deep += "<d>";
  for (int i = 0; i <= kMaxXmlDepth + 1; ++i) deep += "</d>";
  for (const std::string& bad :
       {std::string("<a><b></a>"), std::string("<a>&#;</a>"), std::string("<a/><b/>"), std::string(""),
        std::string("<!DOCTYPE a [<!ENTITY x \"y\">]><a>&x;</a>"),
        std::string("<!DOCTYPE a [<!ENTITY x SYSTEM \"file:///etc/passwd\">]><a>&x;</a>"), deep}) {
    EXPECT_FALSE(try_parse_xml(bad).has_value()) << bad;
  }
  try {
    parse_xml("<a><b></a>", "s3", "s3://b/k: a listing");
    FAIL();
  } catch (const tessera::Error& e) {
    EXPECT_NE(std::string(e.what()).find("s3://b/k: a listing: malformed XML (line 1: mismatched tag)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(xml_escape("\"a\" <&> 'b'"), "&quot;a&quot; &lt;&amp;&gt; &apos;b&apos;");
  EXPECT_EQ(parse_xml("<e>" + xml_escape("<&>\"'") + "</e>", "t", "t").text, "<&>\"'");
}

TEST(PythonJson, FloatReprMatchesPython) {
  // repr() of each value in CPython.
  const std::pair<double, const char*> cases[] = {{1.5, "1.5"},
                                                  {100.0, "100.0"},
                                                  {1e16, "1e+16"},
                                                  {1.5e-5, "1.5e-05"},
                                                  {0.0001, "0.0001"},
                                                  {1e15, "1000000000000000.0"},
                                                  {123456789012345678.0, "1.2345678901234568e+17"},
                                                  {0.1, "0.1"},
                                                  {6e-4, "0.0006"},
                                                  {1e-8, "1e-08"},
                                                  {-2.0, "-2.0"},
                                                  {1e22, "1e+22"},
                                                  {5e-324, "5e-324"},
                                                  {0.0, "0.0"},
                                                  {1.0 / 3, "0.3333333333333333"},
                                                  {2.5e-4, "0.00025"}};
  for (const auto& [v, repr] : cases) EXPECT_EQ(python_float_repr(v), repr) << repr;
}

TEST(PythonJson, DumpsLikePython) {
  // json.dumps({"b": [1, 2.0, None, True], "a": "é\"\n😀", "c": {}}, sort_keys=True)
  const nlohmann::ordered_json v = {
      {"b", {1, 2.0, nullptr, true}}, {"a", "\u00e9\"\n\U0001F600"}, {"c", nlohmann::ordered_json::object()}};
  EXPECT_EQ(python_json_dumps(v, true), R"({"a": "\u00e9\"\n\ud83d\ude00", "b": [1, 2.0, null, true], "c": {}})");
  EXPECT_EQ(python_json_dumps(v, false).substr(0, 6), R"({"b": )");
}

}  // namespace
}  // namespace tessera::util

#include "tessera/util/numpy_random.h"

namespace tessera::util {
namespace {

// Golden values from numpy (../shared/specs/streaming-mds.md §5.8).
TEST(NumpyRandom, SeedSequenceAndPcg64MatchNumpy) {
  NumpyGenerator g(9176);
  const auto [state, inc] = g.state();
  EXPECT_EQ(state.first, 0xf1ef16c822beaeb8ULL);
  EXPECT_EQ(state.second, 0xbac9a92f5966dea5ULL);
  EXPECT_EQ(inc.first, 0x03bbe0d53f448498ULL);
  EXPECT_EQ(inc.second, 0x02b882f126e3fb37ULL);
  EXPECT_EQ(g.next_uint64(), 0xce488e5ff4c10304ULL);
  EXPECT_EQ(g.next_uint64(), 0x233a25e3fe3960b0ULL);
  EXPECT_EQ(g.next_uint64(), 0xbc04ca4c34b5a59cULL);
}

TEST(NumpyRandom, GeneratorMethodsMatchNumpy) {
  EXPECT_EQ(NumpyGenerator(9176).permutation(10), (std::vector<int64_t>{8, 1, 2, 7, 5, 6, 9, 3, 0, 4}));
  EXPECT_EQ(NumpyGenerator(0).permutation(10), (std::vector<int64_t>{4, 6, 2, 7, 3, 5, 9, 0, 8, 1}));
  NumpyGenerator g(9176);
  std::vector<int64_t> ints;
  for (int i = 0; i < 5; ++i) ints.push_back(g.integers(6, 10));
  EXPECT_EQ(ints, (std::vector<int64_t>{9, 9, 9, 6, 6}));
  NumpyGenerator u(9176);
  EXPECT_DOUBLE_EQ(u.uniform(-1.5, 2.5), 1.7231784760542865);
  EXPECT_DOUBLE_EQ(u.uniform(-1.5, 2.5), -0.9495759271149868);
  EXPECT_DOUBLE_EQ(u.uniform(-1.5, 2.5), 1.4377923721502501);
  EXPECT_EQ(NumpyGenerator(9176).choice_without_replacement(10, 3), (std::vector<int64_t>{8, 9, 7}));
  const auto big = NumpyGenerator(9176).choice_without_replacement(20000, 1000);
  EXPECT_EQ(std::vector<int64_t>(big.begin(), big.begin() + 5), (std::vector<int64_t>{14588, 3615, 2131, 3219, 4352}));
}

}  // namespace
}  // namespace tessera::util

#include "tessera/util/device.h"

namespace tessera::util {
namespace {

TEST(Device, DescribesThreadsAndTheLibTorchBuild) {
  const DeviceInfo info = device_info();
  EXPECT_GE(info.cpu_threads, 1);
  EXPECT_EQ(info.torch_version.substr(0, 5), "2.11.");
  const std::string line = describe(info);
  EXPECT_NE(line.find(fmt::format("cpu ({} threads)", info.cpu_threads)), std::string::npos) << line;
  EXPECT_NE(line.find(info.cuda_devices > 0 ? "device(s)" : "cuda: no device"), std::string::npos) << line;
}

}  // namespace
}  // namespace tessera::util

#include <filesystem>
#include <thread>
#include <vector>

#include "tessera/util/file_io.h"

namespace tessera::util {
namespace {

// The local ranks of a job decompress the same MDS shard into the same cache path at once: every writer must
// succeed and the file end up whole (with one shared temporary name, one writer's rename took the other's file).
TEST(FileIo, ConcurrentAtomicWritesOfOnePathAllSucceed) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / fmt::format("tessera_io_{}", getpid());
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "shard.00000.mds").string();
  const std::string content(1 << 16, 'x');
  std::vector<std::thread> writers;
  std::vector<int> failures(8, 0);
  for (int w = 0; w < 8; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; i < 20; ++i) {
        try {
          write_file_atomically(path, content, "mds");
        } catch (const Error&) {
          ++failures[w];
        }
      }
    });
  }
  for (auto& t : writers) t.join();
  for (int w = 0; w < 8; ++w) EXPECT_EQ(failures[w], 0) << "writer " << w;
  EXPECT_EQ(read_file(path), content);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1) << "no temporary file left behind";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::util

#include <cstdlib>
#include <fstream>
#include <optional>

#include "tessera/util/hf_hub.h"
#include "tessera/util/nvml.h"
#include "test_util.h"

namespace tessera::util {
namespace {

using tessera::testing::ScopedEnv;

TEST(HfHub, HubIdsResolveToTheMainSnapshotOfTheCacheTheEnvironmentNames) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "tessera_hf_hub_test";
  fs::remove_all(root);
  const fs::path repo = root / "home" / "hub" / "models--org--model";
  fs::create_directories(repo / "snapshots" / "c0ffee");
  fs::create_directories(repo / "snapshots" / "old");
  fs::create_directories(repo / "refs");
  std::ofstream(repo / "refs" / "main") << "c0ffee\n";  // huggingface_hub writes no newline; tolerate one
  std::ofstream(repo / "snapshots" / "c0ffee" / "tokenizer.json") << "{}";

  const ScopedEnv hub("HF_HUB_CACHE", std::nullopt), legacy("HUGGINGFACE_HUB_CACHE", std::nullopt),
      xdg("XDG_CACHE_HOME", std::nullopt);
  const ScopedEnv home("HF_HOME", (root / "home").string());
  EXPECT_EQ(hf_hub_cache(), root / "home" / "hub");
  EXPECT_EQ(resolve_hf_folder("org/model"), repo / "snapshots" / "c0ffee");
  EXPECT_EQ(resolve_hf_tokenizer("org/model"),
            repo / "snapshots" / "c0ffee");  // the folder: its tokenizer_config.json applies
  // A local folder or file is itself.
  EXPECT_EQ(resolve_hf_folder(repo.string()), repo);
  EXPECT_EQ(resolve_hf_tokenizer((repo / "snapshots" / "c0ffee" / "tokenizer.json").string()),
            repo / "snapshots" / "c0ffee" / "tokenizer.json");
  // HF_HUB_CACHE wins over HF_HOME; an id missing there names the file looked for.
  const ScopedEnv other("HF_HUB_CACHE", (root / "elsewhere").string()), offline("HF_HUB_OFFLINE", "1");
  EXPECT_EQ(hf_hub_cache(), root / "elsewhere");
  try {
    resolve_hf_folder("org/model");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find((root / "elsewhere" / "models--org--model" / "refs" / "main").string()),
              std::string::npos)
        << e.message();
  }
  EXPECT_THROW(resolve_hf_folder("not/a/hub/id"), Error);
  fs::remove_all(root);
}

TEST(HfHub, ARefThatIsNotACommitNameIsRefused) {
  // refs/main names the snapshot folder; "../../../decoy" once resolved the hub id to a folder outside the cache.
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / "tessera_hf_hub_ref_test";
  fs::remove_all(root);
  const fs::path repo = root / "hub" / "models--org--model", decoy = root / "decoy";
  fs::create_directories(repo / "snapshots" / "c0ffee");
  fs::create_directories(repo / "refs");
  fs::create_directories(decoy);
  std::ofstream(decoy / "config.json") << "{}";
  const ScopedEnv hub("HF_HUB_CACHE", (root / "hub").string());
  ASSERT_TRUE(fs::is_directory(repo / "snapshots" / "../../../decoy"));  // where the ref below would lead
  for (const std::string& bad :
       {std::string("../../../decoy"), decoy.string(), std::string("c0ffee/../../../../decoy"), std::string("..")}) {
    std::ofstream(repo / "refs" / "main") << bad;
    try {
      resolve_hf_folder("org/model");
      ADD_FAILURE() << "expected an error for " << bad;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find((repo / "refs" / "main").string() + ": holds \"" + bad + "\", not a commit name"),
                std::string::npos)
          << e.message();
    }
  }
  std::ofstream(repo / "refs" / "main") << "c0ffee";
  EXPECT_EQ(resolve_hf_folder("org/model"), repo / "snapshots" / "c0ffee");
  fs::remove_all(root);
}

// ---- NVML: the hang report's GPU clause, and a machine without the driver ----

TEST(Nvml, DescribesAHungNodesGpus) {
  EXPECT_EQ(describe_gpu_hang({}), "");
  EXPECT_EQ(describe_gpu_hang({5}), "GPU 0 is 5% busy");
  EXPECT_EQ(describe_gpu_hang({100, 0}),
            "GPU 0 is 100% busy, GPU 1 0%: a GPU busy while no rank makes progress runs a kernel or NCCL collective "
            "that does not finish (a GPU hang, or a peer that never joins)");
  EXPECT_NE(describe_gpu_hang({3, 91}).find(": a GPU busy while no rank makes progress"), std::string::npos);
}

TEST(Nvml, WithoutTheDriverItIsAbsentAndSaysWhy) {
  if (void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
    ::dlclose(lib);
    GTEST_SKIP() << "this machine has the NVIDIA driver (Gpu.NvmlReads* covers it)";
  }
  std::string why;
  EXPECT_EQ(Nvml::open(&why), nullptr);
  EXPECT_NE(why.find("libnvidia-ml.so.1"), std::string::npos) << why;
  EXPECT_EQ(Nvml::open(nullptr), nullptr);
}

}  // namespace
}  // namespace tessera::util
