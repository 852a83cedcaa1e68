// Atomic replacement: a failed write (file-size limit hit mid-write, temp file not creatable,
// missing directory) leaves an existing file byte-identical and no temp file behind.
#include <signal.h>
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "unit/io_test_util.h"
#include "triax/io/atomic_file.h"
#include "triax/io/safetensors.h"
#include "triax/io/token_shard.h"

using namespace triax::io;
using triax::test::io_error_of;
using triax::test::TempDir;
using Catch::Matchers::Contains;

namespace {

// Lowers the soft file-size limit so writes past `bytes` fail with EFBIG (SIGXFSZ ignored):
// a real mid-write failure, without a test hook in the library.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved_) == 0);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim = saved_;
    lim.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit saved_{};
  sighandler_t old_handler_{};
};

}  // namespace

TEST_CASE("atomic write: success replaces the file and leaves no temp file", "[io][atomic]") {
  TempDir dir;
  const std::string path = dir.file("f.bin");
  triax::test::write_bytes(path, "old contents");
  {
    AtomicFile f(path);
    REQUIRE(f.tmp_path() == path + ".tmp");
    const std::string s = "new";
    f.write(std::as_bytes(std::span(s)));
    REQUIRE(f.bytes_written() == 3);
    REQUIRE(triax::test::read_bytes(path) == "old contents");  // not visible before commit
    f.commit();
  }
  REQUIRE(triax::test::read_bytes(path) == "new");
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_CASE("atomic write: abandoning (no commit) keeps the old file", "[io][atomic]") {
  TempDir dir;
  const std::string path = dir.file("f.bin");
  triax::test::write_bytes(path, "keep me");
  {
    AtomicFile f(path);
    const std::string s = "partial";
    f.write(std::as_bytes(std::span(s)));
  }
  REQUIRE(triax::test::read_bytes(path) == "keep me");
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_CASE("atomic write: a write that fails midway keeps the existing file", "[io][atomic]") {
  const uint64_t seed = triax::test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  SafetensorsWriter small;
  small.add("a", {4}, triax::test::random_floats(4, rng));
  small.write(path);
  const std::string before = triax::test::read_bytes(path);

  SafetensorsWriter big;
  big.add("a", {256, 256}, triax::test::random_floats(256 * 256, rng));  // 256 KiB > the limit
  std::string msg;
  {
    FileSizeLimit limit(64 * 1024);
    msg = io_error_of([&] { big.write(path); });
  }
  CHECK_THAT(msg, Contains(path + ".tmp") && Contains("write failed") && Contains("untouched"));
  REQUIRE(triax::test::read_bytes(path) == before);
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));
  SafetensorsReader r(path);  // still a valid file
  REQUIRE(r.tensors().size() == 1);

  // the same for a token shard
  const std::string shard = dir.file("tokens.bin");
  std::vector<uint16_t> toks(100, 7);
  write_token_shard(shard, toks);
  const std::string shard_before = triax::test::read_bytes(shard);
  std::vector<uint16_t> many(100000, 9);
  {
    FileSizeLimit limit(16 * 1024);
    CHECK_THAT(io_error_of([&] { write_token_shard(shard, many); }), Contains(shard) && Contains("write failed"));
  }
  REQUIRE(triax::test::read_bytes(shard) == shard_before);
  REQUIRE_FALSE(std::filesystem::exists(shard + ".tmp"));
}

TEST_CASE("atomic write: a temp file that cannot be created keeps the existing file", "[io][atomic]") {
  TempDir dir;
  const std::string path = dir.file("f.safetensors");
  triax::test::write_bytes(path, "precious");
  std::filesystem::create_directory(path + ".tmp");  // open(O_WRONLY) on a directory fails, even as root
  SafetensorsWriter w;
  w.add("a", {1}, std::vector<float>{1.0f});
  CHECK_THAT(io_error_of([&] { w.write(path); }), Contains(path) && Contains("cannot create temporary file"));
  REQUIRE(triax::test::read_bytes(path) == "precious");

  const std::string nodir = dir.file("no/such/dir/f.safetensors");
  CHECK_THAT(io_error_of([&] { w.write(nodir); }), Contains(nodir) && Contains("cannot create"));
}

TEST_CASE("atomic write: a rename that fails keeps the existing target", "[io][atomic]") {
  TempDir dir;
  // The target is a non-empty directory: rename(file, dir) fails, the directory stays.
  const std::string path = dir.file("target");
  std::filesystem::create_directory(path);
  triax::test::write_bytes(path + "/inside", "x");
  AtomicFile f(path);
  const std::string s = "data";
  f.write(std::as_bytes(std::span(s)));
  CHECK_THAT(io_error_of([&] { f.commit(); }), Contains(path) && Contains("cannot rename"));
  REQUIRE(std::filesystem::is_directory(path));
  REQUIRE(triax::test::read_bytes(path + "/inside") == "x");
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));
}
