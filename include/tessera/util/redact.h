// Secrets written into a recipe (a password in a URI, an access token under `hf_kwargs.token`) hidden from whatever
// leaves the process: log lines, error messages, what loggers record and checkpoint metadata. Components keep the
// real values; only the copies that are shown or stored go through these functions. Thread-safe (pure functions).
//
//   util::redact_uri("http://alice:hunter2@mlflow:5000/api")   // "http://***@mlflow:5000/api"
//   util::redact_secrets(config_json)                          // {"hf_kwargs": {"token": "***"}, ...}
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <string_view>

namespace tessera::util {

// What a hidden value reads as. A string, so that a redacted config is still a config (a stored recipe reloads).
inline constexpr const char* kRedacted = "***";

// `text` with every URI's user-info hidden ("scheme://user:pass@host" -> "scheme://***@host", also a user name
// alone: a token is often passed as one) and the values of its query parameters that name a secret hidden
// ("?token=abc&x=1" -> "?token=***&x=1"; also `sig` and `signature`, which sign a pre-signed URL). URIs are found
// anywhere in the text ("GET http://u:p@h/x: refused" works), so that messages can be passed through whole.
std::string redact_uri(std::string_view text);

// Whether the value of the configuration key `key` is a secret. Case-insensitive, over the key's words (split at
// '_', '-', '.' and a lower-to-upper change: `hfToken` is hf + token):
// - always, when the key contains password, passwd, passphrase, secret, credential, apikey / api_key, access_key or
//   private_key, or has the word auth, oauth, authorization or authentication (`use_auth_token`);
// - when `value` is a string, for a key whose last word is `token` (`token`, `hf_token`, `api_token`,
//   MLFLOW_TRACKING_TOKEN) unless it is a tokenizer's special token: the word before is a role such as pad, eos, bos,
//   unk, sep, cls or mask, or the value is a literal like "<|endoftext|>" or "[PAD]". Counts and ids (`max_tokens`,
//   `pad_token_id`, `tokenizer`) never match.
// Booleans and nulls are never secrets (`use_auth_token: true` says to use the stored token).
bool is_secret(std::string_view key, const nlohmann::json& value);

// A copy of `config` for logs, loggers and checkpoints: every value that is_secret() (and every scalar inside such a
// map or list) replaced by kRedacted, and redact_uri() applied to every other string. Keys and shape are kept.
nlohmann::json redact_secrets(const nlohmann::json& config);
nlohmann::ordered_json redact_secrets(const nlohmann::ordered_json& config);

}  // namespace tessera::util
