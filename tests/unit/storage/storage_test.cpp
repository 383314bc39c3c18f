// The storage layer without a server: URI parsing, the local backend's semantics, Signature Version 4 against AWS's
// published example, and where credentials and settings come from. The S3 backend itself is tested against a real
// S3-API server in tests/compat/test_s3_storage.py.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tessera/storage/s3.h"
#include "tessera/storage/storage.h"
#include "tessera/util/http.h"
#include "test_util.h"

namespace tessera::storage {
namespace {

namespace fs = std::filesystem;
using tessera::testing::error_of;
using tessera::testing::ScopedEnv;

TEST(Storage, ParsesUris) {
  const Uri s3 = parse_uri("s3://my-bucket/a/b/c.mds");
  EXPECT_EQ(s3.scheme, Uri::Scheme::kS3);
  EXPECT_EQ(s3.bucket, "my-bucket");
  EXPECT_EQ(s3.key, "a/b/c.mds");
  EXPECT_EQ(s3.str(), "s3://my-bucket/a/b/c.mds");
  EXPECT_EQ(parse_uri("s3://bucket").key, "");
  EXPECT_EQ(parse_uri("file:///data/x").key, "/data/x");
  EXPECT_EQ(parse_uri("rel/path").key, "rel/path");
  EXPECT_TRUE(is_remote("s3://b/k"));
  EXPECT_FALSE(is_remote("/local/s3://"));
  EXPECT_EQ(join("s3://b/prefix/", "/index.json"), "s3://b/prefix/index.json");
  EXPECT_EQ(join("dir", "f"), "dir/f");
  const Uri gs = parse_uri("gs://gcs-bucket/x/y.bin");
  EXPECT_EQ(gs.scheme, Uri::Scheme::kGcs);
  EXPECT_EQ(gs.bucket, "gcs-bucket");
  EXPECT_EQ(gs.key, "x/y.bin");
  EXPECT_EQ(gs.str(), "gs://gcs-bucket/x/y.bin");
  EXPECT_TRUE(is_remote("gs://b/k"));
  const Uri hf = parse_uri("hf://datasets/org/name@v1/mds/index.json");
  EXPECT_EQ(hf.scheme, Uri::Scheme::kHf);
  EXPECT_EQ(hf.str(), "hf://datasets/org/name@v1/mds/index.json");
  const Uri abfss = parse_uri("abfss://fs@account.dfs.core.windows.net/a/b");
  EXPECT_EQ(abfss.scheme, Uri::Scheme::kAbfss);
  EXPECT_EQ(abfss.bucket, "fs@account.dfs.core.windows.net");
  EXPECT_EQ(abfss.str(), "abfss://fs@account.dfs.core.windows.net/a/b");
  EXPECT_EQ(parse_uri("azure-dl://fs/k").str(), "azure-dl://fs/k");
  EXPECT_TRUE(is_remote("azure://container/key"));
  const Uri volume = parse_uri("dbfs:/Volumes/main/default/data/a/b.mds");
  EXPECT_EQ(volume.scheme, Uri::Scheme::kDbfs);
  EXPECT_EQ(volume.bucket, "Volumes");
  EXPECT_EQ(volume.key, "main/default/data/a/b.mds");
  EXPECT_EQ(volume.str(), "dbfs:/Volumes/main/default/data/a/b.mds");
  EXPECT_EQ(join("dbfs:/Volumes/c/s/v", "x"), "dbfs:/Volumes/c/s/v/x");
  EXPECT_TRUE(is_remote("dbfs:/Volumes/c/s/v"));
  EXPECT_NE(error_of([] { parse_uri("dbfs:/tmp/x"); }).find("dbfs:/tmp/x: only Unity Catalog volumes"),
            std::string::npos);
  EXPECT_EQ(parse_uri("oci://bucket@ns/a/b").str(), "oci://bucket@ns/a/b");
  const std::string unsupported = error_of([] { parse_uri("ftp://bucket/key"); });
  EXPECT_NE(unsupported.find("ftp://bucket/key: unsupported scheme \"ftp://\" (supported: s3://, gs://, hf://, "
                             "azure://, azure-dl://, abfs://, abfss://, dbfs:/Volumes/, oci://, file://, local paths"),
            std::string::npos)
      << unsupported;
  EXPECT_NE(error_of([] { parse_uri("gs:///key"); }).find("no bucket"), std::string::npos);
  EXPECT_NE(error_of([] { parse_uri("s3:///key"); }).find("no bucket"), std::string::npos);
}

TEST(Storage, LocalBackendPublishesListsAndDeletes) {
  const fs::path root = fs::temp_directory_path() / "tessera_storage_local";
  fs::remove_all(root);
  const std::string base = "file://" + root.string();
  write(join(base, "a/one.txt"), "first");
  write(join(base, "a/two.txt"), "second");
  write(join(base, "b.txt"), "third");
  EXPECT_EQ(read(join(base, "a/two.txt")), "second");
  EXPECT_EQ(read_range(join(base, "a/two.txt"), 1, 3), "eco");
  EXPECT_NE(error_of([&] { read_range(join(base, "a/two.txt"), 4, 9); }).find("shorter"), std::string::npos);
  download(join(base, "b.txt"), (root / "copy/b.txt").string());
  EXPECT_EQ(read((root / "copy/b.txt").string()), "third");
  std::vector<std::string> names;
  for (const auto& o : list((root / "a").string())) names.push_back(o.uri);
  EXPECT_EQ(names, (std::vector<std::string>{(root / "a/one.txt").string(), (root / "a/two.txt").string()}));
  names.clear();
  for (const auto& o : list((root / "b").string())) names.push_back(o.uri);  // a name prefix
  EXPECT_EQ(names, (std::vector<std::string>{(root / "b.txt").string()}));
  EXPECT_EQ(stat(join(base, "a/one.txt"))->size, 5u);
  remove(join(base, "a/one.txt"));
  remove(join(base, "a/one.txt"));  // missing: not an error
  EXPECT_FALSE(stat(join(base, "a/one.txt")).has_value());
  EXPECT_NE(error_of([&] { read(join(base, "nothing")); }).find("nothing"), std::string::npos);
}

// upload_tree over an older copy: every file arrives, and with `replace` what the new tree lacks is gone.
TEST(Storage, UploadTreeReplacesAnOlderTree) {
  const fs::path root = fs::temp_directory_path() / "tessera_storage_tree";
  fs::remove_all(root);
  write((root / "src/config.json").string(), "{}");
  write((root / "src/sub/w.bin").string(), "weights");
  write((root / "dst/sub/old.bin").string(), "an older export's file");
  write((root / "dst/config.json").string(), "older");
  upload_tree((root / "src").string(), (root / "dst").string(), {"config.json"});
  EXPECT_EQ(read((root / "dst/config.json").string()), "{}");
  EXPECT_TRUE(stat((root / "dst/sub/old.bin").string()).has_value());  // kept without `replace`
  upload_tree((root / "src").string(), "file://" + (root / "dst").string(), {"config.json"}, /*replace=*/true);
  std::vector<std::string> names;
  for (const auto& o : list((root / "dst").string())) names.push_back(o.uri);
  EXPECT_EQ(names, (std::vector<std::string>{(root / "dst/config.json").string(), (root / "dst/sub/w.bin").string()}));
  EXPECT_EQ(read((root / "dst/sub/w.bin").string()), "weights");
  fs::remove_all(root);
}

// https://docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html, "Example: GET Object".
TEST(Storage, SigV4MatchesAwsPublishedExample) {
  const S3Credentials creds{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "", "test", {}};
  const std::string empty = sigv4::sha256_hex("");
  EXPECT_EQ(empty, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  sigv4::Request req{"GET",
                     "/test.txt",
                     {},
                     {{"Host", "examplebucket.s3.amazonaws.com"},
                      {"Range", "bytes=0-9"},
                      {"x-amz-content-sha256", empty},
                      {"x-amz-date", "20130524T000000Z"}},
                     empty};
  EXPECT_EQ(sigv4::canonical_request(req),
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\nx-amz-content-sha256:" + empty +
                "\nx-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n" + empty);
  EXPECT_EQ(sigv4::authorization(req, creds, "us-east-1", "s3", "20130524T000000Z"),
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
  EXPECT_EQ(tessera::util::url_encode("a b/c+d~é", true), "a%20b/c%2Bd~%C3%A9");
  EXPECT_EQ(tessera::util::url_encode("a/b", false), "a%2Fb");
}

TEST(Storage, UrlsAreReadAsLibcurlReadsThem) {
  using tessera::util::parse_url;
  const auto plain = parse_url("http://127.0.0.1:9000");
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->scheme, "http");
  EXPECT_EQ(plain->host, "127.0.0.1");
  EXPECT_EQ(plain->authority, "127.0.0.1:9000");
  EXPECT_EQ(plain->path, "/");
  const auto v6 = parse_url("HTTPS://user:pw@[::1]:8443/a/b?x=1#f");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->scheme, "https");
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->authority, "[::1]:8443");
  EXPECT_EQ(v6->path, "/a/b");
  // The host a text prefix would have got wrong: the user name is not the host.
  EXPECT_EQ(parse_url("http://127.0.0.1@evil.example/")->host, "evil.example");
  EXPECT_EQ(parse_url("https://s3.us-west-2.amazonaws.com/")->authority, "s3.us-west-2.amazonaws.com");
  EXPECT_FALSE(parse_url("not a url"));
  EXPECT_FALSE(parse_url("/just/a/path"));
}

TEST(Storage, CredentialsAndSettingsFollowTheAwsPrecedence) {
  const fs::path dir = fs::temp_directory_path() / "tessera_storage_aws";
  fs::create_directories(dir);
  std::ofstream(dir / "credentials") << "[default]\naws_access_key_id = DEFAULTKEY\naws_secret_access_key = d\n"
                                     << "[work]\naws_access_key_id = WORKKEY\naws_secret_access_key = w\n"
                                     << "aws_session_token = tok\n";
  std::ofstream(dir / "config") << "[default]\nregion = eu-west-1\n[profile work]\nregion = ap-south-1\n"
                                << "s3 =\n  addressing_style = path\n"
                                << "[profile cfgonly]\naws_access_key_id = CFGKEY\naws_secret_access_key = c\n";
  ScopedEnv env;
  for (const char* v :
       {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
        "AWS_REGION", "AWS_DEFAULT_REGION", "S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL",
        "TESSERA_S3_ADDRESSING_STYLE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"}) {
    env.unset(v);
  }
  env.set("AWS_EC2_METADATA_DISABLED", "true");  // on a cloud VM the metadata address may answer
  env.set("AWS_SHARED_CREDENTIALS_FILE", (dir / "credentials").string());
  env.set("AWS_CONFIG_FILE", (dir / "config").string());

  EXPECT_EQ(load_credentials().access_key_id, "DEFAULTKEY");
  EXPECT_EQ(S3Config::from_environment().region, "eu-west-1");
  EXPECT_EQ(S3Config::from_environment().endpoint, "");
  env.set("AWS_PROFILE", "work");
  const S3Credentials work = load_credentials();
  EXPECT_EQ(work.access_key_id, "WORKKEY");
  EXPECT_EQ(work.session_token, "tok");
  EXPECT_NE(work.source.find("[work]"), std::string::npos);
  EXPECT_EQ(S3Config::from_environment().region, "ap-south-1");
  env.set("AWS_PROFILE", "cfgonly");
  EXPECT_EQ(load_credentials().access_key_id, "CFGKEY");
  env.set("AWS_ACCESS_KEY_ID", "ENVKEY");
  env.set("AWS_SECRET_ACCESS_KEY", "e");
  EXPECT_EQ(load_credentials().access_key_id, "ENVKEY");
  EXPECT_EQ(load_credentials().source, "environment");
  env.set("AWS_REGION", "us-west-2");
  env.set("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/");
  env.set("S3_ENDPOINT_URL", "http://localhost:9999");
  EXPECT_EQ(S3Config::from_environment().region, "us-west-2");
  EXPECT_EQ(S3Config::from_environment().endpoint, "http://localhost:9999");  // Streaming's variable wins
  env.set("TESSERA_S3_ADDRESSING_STYLE", "sideways");
  EXPECT_NE(error_of([] { S3Config::from_environment(); }).find("TESSERA_S3_ADDRESSING_STYLE=sideways"),
            std::string::npos);
  env.unset("AWS_ACCESS_KEY_ID");
  env.set("AWS_PROFILE", "nobody");
  EXPECT_NE(error_of([] { load_credentials(); }).find("profile [nobody]"), std::string::npos);
}

}  // namespace
}  // namespace tessera::storage
