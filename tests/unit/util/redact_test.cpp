// util/redact.h: which keys and URI parts are secrets, and that a redacted config keeps its shape.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tessera/util/redact.h"

namespace redact_test {
namespace {

using tessera::util::is_secret;
using tessera::util::redact_secrets;
using tessera::util::redact_uri;

TEST(Redact, UriUserInfoIsHiddenAnywhereInAText) {
  EXPECT_EQ(redact_uri("http://alice:hunter2@mlflow.internal:5000"), "http://***@mlflow.internal:5000");
  EXPECT_EQ(redact_uri("https://ghp_abc123@github.com/org/repo.git"), "https://***@github.com/org/repo.git");
  // A password holding '@' (user-info ends at the last one before the path).
  EXPECT_EQ(redact_uri("s3+http://k:p@ss@host/bucket"), "s3+http://***@host/bucket");
  // Inside a message, several URIs, quoted or not; the rest of the text is kept byte for byte.
  EXPECT_EQ(redact_uri("GET http://a:b@h:1/api/2.0/x?experiment_name=e: refused; tracking_uri 'https://c:d@h2' "
                       "(see \"ftp://e:f@h3/p\")"),
            "GET http://***@h:1/api/2.0/x?experiment_name=e: refused; tracking_uri 'https://***@h2' "
            "(see \"ftp://***@h3/p\")");
  // Query parameters that carry a secret; others, and the fragment, stay.
  EXPECT_EQ(redact_uri("https://h/f.bin?token=abc&page=2&X-Amz-Signature=deadbeef&sig=xyz#token=frag"),
            "https://h/f.bin?token=***&page=2&X-Amz-Signature=***&sig=***#token=frag");
  EXPECT_EQ(redact_uri("https://h/x?api_key=k1&access_token=t1&X-Amz-Security-Token=t2&X-Amz-Credential=c"),
            "https://h/x?api_key=***&access_token=***&X-Amz-Security-Token=***&X-Amz-Credential=***");
  // Nothing to hide: unchanged.
  for (const char* same :
       {"http://127.0.0.1:5000/api", "s3://bucket/key@v2", "mlflow-artifacts:/1/abc/artifacts", "/data/run@2/ckpt",
        "user@example.com", "a://", "://x@y", "https://h/x?eos_token=%3C%2Fs%3E", "plain text"}) {
    EXPECT_EQ(redact_uri(same), same);
  }
}

TEST(Redact, SecretKeysAndTheKeysThatOnlyLookLikeThem) {
  const nlohmann::json s = "hf_AbCdEf123";
  for (const char* key : {"token",
                          "hf_token",
                          "HF_TOKEN",
                          "use_auth_token",
                          "auth_token",
                          "api_token",
                          "access_token",
                          "hfToken",
                          "MLFLOW_TRACKING_TOKEN",
                          "DATABRICKS_TOKEN",
                          "password",
                          "db_password",
                          "MLFLOW_TRACKING_PASSWORD",
                          "passwd",
                          "secret",
                          "client_secret",
                          "aws_secret_access_key",
                          "aws_access_key_id",
                          "aws_session_token",
                          "api_key",
                          "apiKey",
                          "WANDB_API_KEY",
                          "apikey",
                          "private_key",
                          "credentials",
                          "auth",
                          "Authorization"}) {
    EXPECT_TRUE(is_secret(key, s)) << key;
  }
  for (const char* key : {"tokenizer", "tokenizer_name", "max_tokens", "num_tokens", "tokens", "pad_token_id",
                          "eos_token_id", "bos_token_id", "author", "key", "save_ignore_keys", "token_encoding_type",
                          "web_identity_token_file", "max_seq_len", "name"}) {
    EXPECT_FALSE(is_secret(key, s)) << key;
  }
  // A tokenizer's special tokens are tokens of the vocabulary, not credentials.
  for (const char* key : {"eos_token", "bos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token"}) {
    EXPECT_FALSE(is_secret(key, "</s>")) << key;
    EXPECT_FALSE(is_secret(key, "endoftext")) << key;
  }
  EXPECT_FALSE(is_secret("im_start_token", "<|im_start|>"));
  EXPECT_FALSE(is_secret("token", "[PAD]"));
  // Only a string can be a token; a count under a *_token key is not one; booleans and nulls never are.
  EXPECT_FALSE(is_secret("flops_per_token", 6.0e9));
  EXPECT_FALSE(is_secret("token", 17));
  EXPECT_TRUE(is_secret("password", 1234));
  EXPECT_FALSE(is_secret("use_auth_token", true));
  EXPECT_FALSE(is_secret("password", nullptr));
}

TEST(Redact, ARedactedConfigKeepsItsKeysShapeAndOrder) {
  const auto config = nlohmann::ordered_json::parse(R"({
    "run_name": "r",
    "variables": {"hf_token": "hf_SECRET", "data": "https://u:SECRET@h/x?token=SECRET&n=1"},
    "model": {"name": "hf_causal_lm", "use_auth_token": "hf_SECRET", "trust_remote_code": false},
    "tokenizer": {"name": "gpt2", "kwargs": {"eos_token": "<|endoftext|>", "pad_token_id": 0}},
    "train_loader": {"dataset": {"hf_kwargs": {"token": "hf_SECRET", "revision": "main"}}},
    "loggers": {"mlflow": {"tracking_uri": "http://alice:SECRET@host:5000", "tags": {"team": "x"}}},
    "credentials": {"user": "bob", "key": "SECRET", "n": 3, "enabled": true, "none": null},
    "list": ["http://a:SECRET@h", {"password": "SECRET"}],
    "max_tokens": 4096
  })");
  const nlohmann::ordered_json got = redact_secrets(config);
  const auto want = nlohmann::ordered_json::parse(R"({
    "run_name": "r",
    "variables": {"hf_token": "***", "data": "https://***@h/x?token=***&n=1"},
    "model": {"name": "hf_causal_lm", "use_auth_token": "***", "trust_remote_code": false},
    "tokenizer": {"name": "gpt2", "kwargs": {"eos_token": "<|endoftext|>", "pad_token_id": 0}},
    "train_loader": {"dataset": {"hf_kwargs": {"token": "***", "revision": "main"}}},
    "loggers": {"mlflow": {"tracking_uri": "http://***@host:5000", "tags": {"team": "x"}}},
    "credentials": {"user": "***", "key": "***", "n": "***", "enabled": true, "none": null},
    "list": ["http://***@h", {"password": "***"}],
    "max_tokens": 4096
  })");
  EXPECT_EQ(got.dump(), want.dump());  // dump compares the order too
  EXPECT_EQ(got.dump().find("SECRET"), std::string::npos);
  // The plain-json overload does the same.
  EXPECT_EQ(redact_secrets(nlohmann::json::parse(config.dump())), nlohmann::json::parse(want.dump()));
}

}  // namespace
}  // namespace redact_test
