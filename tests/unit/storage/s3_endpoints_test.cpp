// The S3 client and the credentials chain against endpoints that answer badly, served by a small HTTP server on
// 127.0.0.1 in the test: a credentials document the parser chokes on, 5xx answers whose bodies are garbage, a
// container endpoint URI that only looks like loopback. (tests/compat/test_s3_*.py test the well-behaved protocols
// against moto.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "loopback_http.h"
#include "tessera/storage/s3.h"
#include "test_util.h"

namespace tessera::storage::s3_endpoints_test {
namespace {

namespace fs = std::filesystem;
using tessera::testing::error_of;
using tessera::testing::ScopedEnv;

// The endpoints of these tests (loopback_http.h): each request is answered as application/xml with what `answer`
// returns for its request line ("GET /path HTTP/1.1").
class LoopbackServer : public tessera::testing::LoopbackHttpServer {
 public:
  struct Answer {
    int status = 200;
    std::string body;
  };
  explicit LoopbackServer(std::function<Answer(const std::string&)> answer)
      : LoopbackHttpServer([answer = std::move(answer)](const Request& r) {
          Answer a = answer(r.line);
          return Response{a.status, "application/xml", std::move(a.body), {}};
        }) {}
};

// No credentials anywhere but what a test sets: no keys, no profiles, no web identity, no instance metadata.
void isolate_credentials(ScopedEnv& env, const fs::path& dir) {
  for (const char* v : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                        "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
                        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                        "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"}) {
    env.unset(v);
  }
  env.set("AWS_EC2_METADATA_DISABLED", "true");
  env.set("AWS_SHARED_CREDENTIALS_FILE", (dir / "no-credentials").string());
  env.set("AWS_CONFIG_FILE", (dir / "no-config").string());
}

fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "tessera_s3_endpoints" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// `f()` on another thread, failing the test (instead of hanging it) if it has not returned within `seconds`.
template <typename T>
std::optional<T> within(double seconds, std::function<T()> f) {
  auto done = std::make_shared<std::promise<T>>();
  std::future<T> result = done->get_future();
  std::thread([f = std::move(f), done] {
    try {
      done->set_value(f());
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (result.wait_for(std::chrono::duration<double>(seconds * tessera::testing::time_scale())) !=
      std::future_status::ready) {
    ADD_FAILURE() << "no answer within " << seconds << " s";
    return std::nullopt;
  }
  return result.get();
}

const char* kGoodDocument = R"({"AccessKeyId": "AKIDGOOD", "SecretAccessKey": "secret", "Token": "tok"})";

TEST(S3Endpoints, ARefreshThatThrowsAnythingLeavesNoCallerWaiting) {
  // A refresh that threw something other than tessera::Error left the provider "refreshing" for good: every later
  // get() waited forever. Now any exception is an Error naming the source, and the next get() fetches again.
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto provider = refreshing_credentials("the test's source", [calls]() -> S3Credentials {
    if (++*calls == 1) return {nlohmann::json(5).get<std::string>(), "s", "", "test", std::nullopt};
    if (*calls == 2) throw 42;  // not even an exception class
    return {"AKID", "secret", "", "test", std::chrono::system_clock::now() + std::chrono::hours(1)};
  });
  const std::string first = error_of([&] { provider->get(); });
  EXPECT_NE(first.find("[s3 credentials] the test's source: [json.exception.type_error"), std::string::npos) << first;
  const auto second = within<std::string>(5, [provider] { return error_of([&] { provider->get(); }); });
  ASSERT_TRUE(second.has_value());
  EXPECT_NE(second->find("the test's source: the refresh failed with an unknown exception"), std::string::npos)
      << *second;
  const auto third = within<std::string>(5, [provider] { return provider->get().access_key_id; });
  ASSERT_TRUE(third.has_value());
  EXPECT_EQ(*third, "AKID");
  EXPECT_EQ(calls->load(), 3);
}

TEST(S3Endpoints, BadCredentialDocumentsAreErrorsAndTheNextRefreshWorks) {
  const fs::path dir = temp_dir("documents");
  ScopedEnv env;
  isolate_credentials(env, dir);
  // The container endpoint answers with a non-string AccessKeyId first (nlohmann's type_error escaped the
  // refresher), then with good credentials.
  std::atomic<int> served{0};
  LoopbackServer creds([&](const std::string&) -> LoopbackServer::Answer {
    return {200, ++served == 1 ? R"({"AccessKeyId": 5, "SecretAccessKey": "s"})" : kGoodDocument};
  });
  env.set("AWS_CONTAINER_CREDENTIALS_FULL_URI", creds.url() + "/creds");
  auto provider = default_credential_provider();
  const std::string err = error_of([&] { provider->get(); });
  EXPECT_NE(err.find("the container credentials endpoint " + creds.url() +
                     "/creds: AccessKeyId in the answer is not "
                     "a string"),
            std::string::npos)
      << err;
  const auto key = within<std::string>(5, [provider] { return provider->get().access_key_id; });
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(*key, "AKIDGOOD");
  EXPECT_EQ(creds.request_lines(), (std::vector<std::string>{"GET /creds HTTP/1.1", "GET /creds HTTP/1.1"}));

  // A credential_process printing a Version that is not 1 (a string made nlohmann's value() throw) or keys that are
  // not strings.
  env.unset("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  std::ofstream(dir / "config") << "[profile text-version]\ncredential_process = printf '{\"Version\": \"1\"}'\n"
                                << "[profile number-key]\ncredential_process = printf '{\"Version\": 1, "
                                   "\"AccessKeyId\": [1], \"SecretAccessKey\": \"s\"}'\n";
  env.set("AWS_CONFIG_FILE", (dir / "config").string());
  env.set("AWS_PROFILE", "text-version");
  EXPECT_NE(error_of([] { load_credentials(); }).find("profile [text-version]"), std::string::npos);
  EXPECT_NE(error_of([] { load_credentials(); }).find("its output must be a JSON object with \"Version\": 1"),
            std::string::npos);
  env.set("AWS_PROFILE", "number-key");
  EXPECT_NE(error_of([] { load_credentials(); }).find("credential_process: AccessKeyId in the answer is not a string"),
            std::string::npos)
      << error_of([] { load_credentials(); });
}

S3Config loopback_config(const LoopbackServer& s3) {
  S3Config c;
  c.endpoint = s3.url();
  c.addressing = S3Config::Addressing::kPath;
  c.max_attempts = 5;
  c.backoff_base_s = 0.001;
  c.backoff_max_s = 0.01;
  return c;
}

TEST(S3Endpoints, FiveHundredsAreRetriedWhateverTheirBody) {
  // A 503 whose body held a malformed character reference (std::stoul threw out of the client, unretried), a 502
  // with an HTML body, a 507 (not retried before), then the object.
  std::atomic<int> served{0};
  LoopbackServer s3([&](const std::string&) -> LoopbackServer::Answer {
    switch (++served) {
      case 1:
        return {503, "<Error><Code>&#;</Code><Message>&#99999999999999999999; &#xZZ;</Message></Error>"};
      case 2:
        return {502, "<html><body>Bad Gateway</body></html>"};
      case 3:
        return {507, "\x01\xff garbage"};
      default:
        return {200, "the object"};
    }
  });
  S3Client client(loopback_config(s3), S3Credentials{"AKID", "secret", "", "test", std::nullopt});
  EXPECT_EQ(client.get("bucket", "key"), "the object");
  EXPECT_EQ(client.requests_sent(), 4);
  EXPECT_EQ(s3.requests().size(), 4u);
}

TEST(S3Endpoints, MalformedAnswersAreErrorsNamingTheObject) {
  std::atomic<int> served{0};
  LoopbackServer s3([&](const std::string& line) -> LoopbackServer::Answer {
    ++served;
    if (line.find("prefix=k") != std::string::npos) {
      // Namespaced and prefixed names, as S3-compatible stores write them; an XML declaration after spaces.
      return {200,
              "  \n<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult "
              "xmlns:s3=\"http://s3.amazonaws.com/doc/2006-03-01/\"><s3:Contents><Key>k&#65;</Key>"
              "<Size>99999999999999999999999</Size></s3:Contents></ListBucketResult>"};
    }
    if (line.find("list-type") != std::string::npos) {
      return {200, "<ListBucketResult><Contents><Key>k&#;</Key><Size>1</Size></Contents></ListBucketResult>"};
    }
    if (line.find("/bucket/not-implemented") != std::string::npos) return {501, "<Error><Code>&#xD800;</Code></Error>"};
    if (line.find("/bucket/laughs") != std::string::npos) {
      return {400,
              "<!DOCTYPE Error [<!ENTITY a \"aaaaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;\">]>"
              "<Error><Code>&b;</Code></Error>"};
    }
    if (line.find("/bucket/malformed") != std::string::npos) return {400, "<Error><Code>&#;</Code></Error>"};
    return {400, "<Error><Code>Bad</Code><Message>bad &amp; &#65;<![CDATA[ <x>]]></Message></Error>"};
  });
  S3Client client(loopback_config(s3), S3Credentials{"AKID", "secret", "", "test", std::nullopt});
  // An error's code and message, entities, character references and CDATA decoded.
  std::string err = error_of([&] { client.get("bucket", "key"); });
  EXPECT_NE(err.find("s3://bucket/key: GET HTTP 400 Bad: bad & A <x>"), std::string::npos) << err;
  // A malformed error body (a reference that is not one, a DTD declaring entities) gives the status alone.
  for (const char* key : {"malformed", "laughs"}) {
    err = error_of([&] { client.get("bucket", key); });
    EXPECT_NE(err.find(fmt::format("s3://bucket/{}: GET HTTP 400", key)), std::string::npos) << err;
    EXPECT_EQ(err.find("aaaa"), std::string::npos) << err;
  }
  // 501 Not Implemented is not retried.
  served = 0;
  err = error_of([&] { client.get("bucket", "not-implemented"); });
  EXPECT_NE(err.find("s3://bucket/not-implemented: GET HTTP 501"), std::string::npos) << err;
  EXPECT_EQ(served.load(), 1);
  err = error_of([&] { client.list("bucket", "k"); });
  EXPECT_NE(err.find("s3://bucket/kA: the server sent a listing Size '99999999999999999999999', not a byte count"),
            std::string::npos)
      << err;
  err = error_of([&] { client.list("bucket", "m"); });
  EXPECT_NE(err.find("s3://bucket/m: a listing: malformed XML (line 1: "), std::string::npos) << err;
}

TEST(S3Endpoints, TheContainerEndpointOverHttpMustResolveToLoopback) {
  const fs::path dir = temp_dir("container");
  ScopedEnv env;
  isolate_credentials(env, dir);
  // Hosts the old text-prefix check let through, or that are not loopback: refused before any request, naming the
  // variable and the host.
  for (const auto& [uri, host] :
       std::vector<std::pair<std::string, std::string>>{{"http://127.evil.example/creds", "127.evil.example"},
                                                        {"http://127.0.0.1@10.1.2.3/creds", "10.1.2.3"},
                                                        {"http://127.0.0.1:80@10.1.2.3/creds", "10.1.2.3"},
                                                        {"http://[::ffff:10.0.0.1]/creds", "::ffff:10.0.0.1"},
                                                        {"http://169.254.169.254/latest", "169.254.169.254"},
                                                        {"http://10.0.0.1/127.0.0.1", "10.0.0.1"}}) {
    env.set("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri);
    const std::string err = error_of([] { default_credential_provider(); });
    EXPECT_NE(err.find("[s3 credentials] AWS_CONTAINER_CREDENTIALS_FULL_URI=" + uri +
                       ": over http the host must "
                       "resolve only to loopback addresses"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("host " + host + " "), std::string::npos) << err;
  }
  env.set("AWS_CONTAINER_CREDENTIALS_FULL_URI", "file:///etc/passwd");
  EXPECT_NE(error_of([] { default_credential_provider(); }).find("AWS_CONTAINER_CREDENTIALS_FULL_URI=file:///etc"),
            std::string::npos);
  env.unset("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  env.set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "@10.1.2.3/creds");
  EXPECT_NE(error_of([] {
              default_credential_provider();
            }).find("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI=@10.1.2.3/creds (http://169.254.170.2@10.1.2.3/creds)"),
            std::string::npos)
      << error_of([] { default_credential_provider(); });
  env.unset("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  // Loopback in every spelling, the ECS and EKS endpoints, and https to any host are accepted (nothing is fetched
  // until get()).
  for (const char* uri : {"http://127.0.0.1:9/creds", "http://127.1.2.3/creds", "http://localhost:9/creds",
                          "http://[::1]:9/creds", "http://169.254.170.2/v2/credentials", "http://169.254.170.23/v1",
                          "http://[fd00:ec2::23]/v1", "https://credentials.example.com/creds"}) {
    env.set("AWS_CONTAINER_CREDENTIALS_FULL_URI", uri);
    EXPECT_EQ(error_of([] { default_credential_provider(); }), "(no error)") << uri;
  }
}

}  // namespace
}  // namespace tessera::storage::s3_endpoints_test
