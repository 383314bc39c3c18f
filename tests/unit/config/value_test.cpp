// Recipe trees: YAML loading with provenance, overrides, OmegaConf-style interpolation.
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "tessera/config/value.h"
#include "tessera/util/error.h"
#include "test_util.h"

namespace tessera::config {
namespace {

Value load(const std::string& yaml) {
  Origin o;
  o.file = "test.yaml";
  Value v = parse_yaml(yaml, o);
  return v;
}

Value resolved(const std::string& yaml) {
  Value v = load(yaml);
  resolve_interpolations(v);
  return v;
}

using tessera::testing::error_of;

TEST(Value, ScalarTypingFollowsYaml11AndOmegaConf) {
  Value v = load("a: 17\nb: 6.0e-4\nc: 1.0e-08\nd: 1e-8\ne: true\nf: off\ng: '16'\nh: flash\ni: 1_000\nj: .inf\nk:\n");
  EXPECT_EQ(v.find("a")->as_int(), 17);
  EXPECT_DOUBLE_EQ(*v.find("b")->as_double(), 6.0e-4);
  EXPECT_DOUBLE_EQ(*v.find("c")->as_double(), 1.0e-8);
  EXPECT_DOUBLE_EQ(*v.find("d")->as_double(), 1e-8);
  EXPECT_EQ(v.find("e")->as_bool(), true);
  EXPECT_EQ(v.find("f")->as_bool(), false);
  EXPECT_FALSE(v.find("g")->as_int().has_value()) << "a quoted scalar is a string";
  EXPECT_EQ(v.find("h")->type_name(), "a string");
  EXPECT_EQ(v.find("i")->as_int(), 1000);
  EXPECT_TRUE(std::isinf(*v.find("j")->as_double()));
  EXPECT_TRUE(v.find("k")->is_null());
  EXPECT_EQ(v.find("b")->as_int(), std::nullopt);
}

TEST(Value, FloatsOutOfDoubleRangeReadAsPythonReadsThem) {
  // Python's float(): 1.0e+999 -> inf, -1.0e+999 -> -inf, 1.0e-999 -> 0.0 (a recipe with these once crashed the
  // loader with std::out_of_range).
  Value v = load("a: 1.0e+999\nb: -1.0e+999\nc: 1.0e-999\nd: 4.9e-324\n");
  EXPECT_EQ(*v.find("a")->as_double(), std::numeric_limits<double>::infinity());
  EXPECT_EQ(*v.find("b")->as_double(), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(*v.find("c")->as_double(), 0.0);
  EXPECT_EQ(*v.find("d")->as_double(), std::numeric_limits<double>::denorm_min());
  EXPECT_NO_THROW(v.to_json());
}

TEST(Value, KeepsLineNumbers) {
  Value v = load("a: 1\nb:\n  c: 2\n  d: [1, 2]\n");
  EXPECT_EQ(v.find("a")->origin().line, 1);
  EXPECT_EQ(v.find("b")->find("c")->origin().line, 3);
  EXPECT_EQ(v.find("b")->find("d")->origin().describe(), "test.yaml:4");
}

TEST(Interpolation, WholeValueTakesTheReferencedNodeAndType) {
  Value v = resolved(
      "variables: {n: 2048, seed: 17, betas: [0.9, 0.95], blank: , nested: {x: 1}}\n"
      "a: ${variables.n}\nb: ${variables.betas}\nc: ${variables.blank}\nd: ${variables.nested}\n");
  EXPECT_EQ(v.find("a")->as_int(), 2048);
  ASSERT_TRUE(v.find("b")->is_sequence());
  EXPECT_DOUBLE_EQ(*v.find("b")->items()[1].as_double(), 0.95);
  EXPECT_TRUE(v.find("c")->is_null());
  EXPECT_EQ(v.find("d")->find("x")->as_int(), 1);
}

TEST(Interpolation, InsideStringsChainsAndLists) {
  Value v = resolved(
      "variables:\n  name: run\n  root: /data/${variables.name}\n  deep: ${variables.root}/x\n  n: 3\n"
      "path: ${variables.deep}/shard-${variables.n}.mds\n"
      "list: [a, '${variables.n}', '${list.0}']\n"
      "escaped: 'cost \\${variables.n}'\n");
  EXPECT_EQ(v.find("path")->text(), "/data/run/x/shard-3.mds");
  EXPECT_EQ(v.find("list")->items()[1].as_int(), 3) << "a whole-value reference keeps the referenced type";
  EXPECT_EQ(v.find("list")->items()[2].text(), "a");
  EXPECT_EQ(v.find("escaped")->text(), "cost ${variables.n}");
}

TEST(Interpolation, ErrorsNameKeyFileLineAndReference) {
  EXPECT_EQ(error_of([] { resolved("variables: {a: 1}\nmodel:\n  d: ${variables.b}\n"); }),
            "[recipe] test.yaml:3: model.d: cannot resolve ${variables.b}: key 'variables.b' not found");
  EXPECT_NE(error_of([] { resolved("a: ${b}\nb: ${a}\n"); }).find("interpolation cycle"), std::string::npos);
  EXPECT_NE(error_of([] { resolved("a:\n  b: ${a}\n"); }).find("interpolation cycle"), std::string::npos);
  EXPECT_NE(error_of([] { resolved("a: x${b\n"); }).find("unterminated interpolation"), std::string::npos);
  EXPECT_NE(error_of([] { resolved("a: ${oc.env:HOME}\n"); }).find("not supported"), std::string::npos);
  EXPECT_NE(error_of([] { resolved("a: [1]\nb: x-${a}\n"); }).find("cannot insert a list"), std::string::npos);
}

TEST(Overrides, ReplaceAddAndIndex) {
  Value v = load("optimizer: {lr: 0.1, betas: [0.9, 0.95]}\nvariables: {n: 1}\nm: ${variables.n}\n");
  apply_override(v, "optimizer.lr=3e-4");
  apply_override(v, "optimizer.betas.1=0.99");
  apply_override(v, "optimizer.extra.deep=[1, 2]");
  apply_override(v, "variables.n=64");
  apply_override(v, "run_name=");
  resolve_interpolations(v);
  EXPECT_DOUBLE_EQ(*v.find("optimizer")->find("lr")->as_double(), 3e-4);
  EXPECT_DOUBLE_EQ(*v.find("optimizer")->find("betas")->items()[1].as_double(), 0.99);
  EXPECT_EQ(v.find("optimizer")->find("extra")->find("deep")->items().size(), 2u);
  EXPECT_EQ(v.find("m")->as_int(), 64) << "overrides apply before interpolation";
  EXPECT_TRUE(v.find("run_name")->is_null());
  EXPECT_EQ(v.find("optimizer")->find("lr")->origin().describe(), "command line `optimizer.lr=3e-4`");
}

// Where a value came from is printed in messages: a secret set on the command line is not.
TEST(Overrides, TheirOriginHidesSecrets) {
  Value v = load("a: 1\n");
  apply_override(v, "loggers.mlflow.tracking_uri=http://alice:hunter2@mlflow:5000");
  apply_override(v, "train_loader.dataset.hf_kwargs.token=hf_abc123");
  EXPECT_EQ(v.find("loggers")->find("mlflow")->find("tracking_uri")->origin().describe(),
            "command line `loggers.mlflow.tracking_uri=http://***@mlflow:5000`");
  EXPECT_EQ(v.find("train_loader")->find("dataset")->find("hf_kwargs")->find("token")->origin().describe(),
            "command line `train_loader.dataset.hf_kwargs.token=***`");
}

TEST(Overrides, MalformedAssignmentsAreErrors) {
  Value v = load("a: {b: 1}\nl: [1]\n");
  EXPECT_NE(error_of([&] { apply_override(v, "a.b"); }).find("key.sub=value"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(v, "=3"); }).find("key.sub=value"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(v, "a..b=3"); }).find("empty key segment"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(v, "a.b.c=3"); }).find("cannot override inside an integer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(v, "l.5=3"); }).find("no such list element"), std::string::npos);
}

TEST(YamlFile, SyntaxErrorsDuplicatesAndMissingFiles) {
  EXPECT_EQ(error_of([] { load_yaml_file("/nonexistent/recipe.yaml"); }),
            "[recipe] /nonexistent/recipe.yaml: cannot open the recipe file");
  EXPECT_NE(error_of([] { load("a: 1\nb: [1, 2\nc: 3\n"); }).find("test.yaml:"), std::string::npos);
  EXPECT_NE(error_of([] { load("a: 1\nb: [1, 2\nc: 3\n"); }).find("invalid YAML"), std::string::npos);
  EXPECT_EQ(error_of([] { load("a: 1\nb: 2\na: 3\n"); }), "[recipe] test.yaml:3: a: duplicate key");
  const auto path = std::filesystem::temp_directory_path() / "tessera_list_recipe.yaml";
  std::ofstream(path) << "- 1\n- 2\n";
  EXPECT_NE(error_of([&] { load_yaml_file(path.string()); }).find("must be a YAML mapping"), std::string::npos);
}

TEST(YamlFile, TextThatIsNotUtf8IsAnErrorNamingTheLine) {
  // Latin-1 "café" on line 2 (found by fuzz_recipe_yaml: it used to pass until the resolved recipe was first written
  // as JSON, at the first checkpoint, and then end the run with a JSON library exception).
  EXPECT_EQ(error_of([] { load("a: 1\nrun_name: caf\xe9\n"); }),
            "[recipe] test.yaml:2: not valid UTF-8 (byte 0xE9); save the recipe as UTF-8");
  EXPECT_NE(error_of([] { load("a: \xed\xa0\x80\n"); }).find("not valid UTF-8 (byte 0xED)"), std::string::npos)
      << "a UTF-16 surrogate";
  EXPECT_NE(error_of([] { load("a: \xc0\xaf\n"); }).find("not valid UTF-8"), std::string::npos) << "overlong";
  Value v = load("a: 1\n");
  EXPECT_NE(error_of([&] { apply_override(v, "run_name=caf\xe9"); }).find("command line"), std::string::npos);
  EXPECT_EQ(load("name: \"caf\xc3\xa9 \xf0\x9f\x98\x80\"\n").find("name")->text(), "caf\xc3\xa9 \xf0\x9f\x98\x80");
}

TEST(Json, MatchesTypedValues) {
  Value v = resolved("variables: {s: 128}\nmax_seq_len: ${variables.s}\nname: \"x\"\nlr: 6.0e-4\nf: [true, ~]\n");
  const nlohmann::ordered_json j = v.to_json();
  EXPECT_EQ(j["max_seq_len"], 128);
  EXPECT_EQ(j["name"], "x");
  EXPECT_DOUBLE_EQ(j["lr"].get<double>(), 6.0e-4);
  EXPECT_EQ(j["f"][0], true);
  EXPECT_TRUE(j["f"][1].is_null());
  EXPECT_EQ(j.begin().key(), "variables") << "keys keep the recipe's order";
}

}  // namespace
}  // namespace tessera::config
