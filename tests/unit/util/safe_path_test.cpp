// util::confined_path: untrusted names joined onto a trusted folder (docs/security.md).
#include <gtest/gtest.h>

#include <filesystem>

#include "tessera/util/safe_path.h"
#include "test_util.h"

namespace tessera::util::safe_path_test {
namespace {

namespace fs = std::filesystem;
using tessera::testing::error_of;

TEST(SafePath, RelativeNamesStayAndEverythingElseIsRefusedNamingItsSource) {
  const fs::path root = fs::temp_directory_path() / "tessera_safe_path" / "root";
  fs::remove_all(root.parent_path());
  fs::create_directories(root / "sub");
  for (const char* ok : {"a", "shard.00000.mds", "sub/x.mds", "sub/deeper/x", "..a", "a..", ".hidden", "a b"}) {
    EXPECT_EQ(confined_path(root, ok, "idx.json", "test"), root / ok) << ok;
  }
  const std::pair<std::string, const char*> bad[] = {
      {"", "is empty"},
      {"/etc/passwd", "is absolute"},
      {"..", "has a \"..\" segment"},
      {"../x", "has a \"..\" segment"},
      {"sub/../../x", "has a \"..\" segment"},
      {"a/./b", "has a \".\" segment"},
      {"a//b", "has an empty segment"},
      {"a/", "has an empty segment"},
      {std::string("a\0b", 3), "contains a NUL byte"},
      {std::string(5000, 'a'), "is 5000 bytes long"},
  };
  for (const auto& [name, why] : bad) {
    const std::string e = error_of([&] { confined_path(root, name, "idx.json", "test", "basename"); });
    EXPECT_EQ(e.rfind("[test] idx.json: basename \"", 0), 0u) << e;
    EXPECT_NE(e.find(why), std::string::npos) << e;
    EXPECT_NE(e.find("refusing to use it as a path under " + root.string()), std::string::npos) << e;
    EXPECT_TRUE(unsafe_name_reason(name).has_value());
  }
  const std::string control = error_of([&] { confined_path(root, "a\nb\x01", "s", "t"); });
  EXPECT_NE(control.find("\"a\\x0ab\\x01\" contains a control character"), std::string::npos) << control;
}

TEST(SafePath, ResolvedNamesDoNotLeaveThroughALinkButLexicalOnesMay) {
  const fs::path base = fs::temp_directory_path() / "tessera_safe_path_links";
  fs::remove_all(base);
  const fs::path root = base / "root";
  fs::create_directories(root / "sub");
  fs::create_directories(base / "elsewhere");
  fs::create_directory_symlink(base / "elsewhere", root / "out");
  fs::create_directory_symlink("sub", root / "in");
  fs::create_symlink(base / "elsewhere" / "file", root / "leaf");
  // Links that stay inside are fine, and so is a name whose parents do not exist yet.
  EXPECT_EQ(confined_path(root, "in/x", "s", "t"), root / "in/x");
  EXPECT_EQ(confined_path(root, "new/dir/x", "s", "t"), root / "new/dir/x");
  for (const char* escape : {"out", "out/x", "out/new/x", "leaf"}) {
    EXPECT_NE(error_of([&] { confined_path(root, escape, "s", "t"); }).find("through a symbolic link"),
              std::string::npos)
        << escape;
    // An HF hub snapshot links every file into ../../blobs: reading through the folder's own links is allowed.
    EXPECT_EQ(confined_path(root, escape, "s", "t", "name", Confine::kLexical), root / escape);
  }
  // The folder itself may be reached through a link.
  fs::create_directory_symlink(root, base / "alias");
  EXPECT_EQ(confined_path(base / "alias", "in/x", "s", "t"), base / "alias" / "in/x");
  EXPECT_NE(error_of([&] { confined_path(base / "alias", "out/x", "s", "t"); }).find("through a symbolic link"),
            std::string::npos);
}

}  // namespace
}  // namespace tessera::util::safe_path_test
