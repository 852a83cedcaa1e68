// Resident memory does not grow with the corpus: a sparse 9 GB set of llm.c shards and a sparse
// 8 GB Megatron dataset are opened and sampled (shuffled, all over the files), and the process's
// peak RSS (VmHWM) must stay within 12 MiB of what it was before. A corpus read whole would
// need GBs. Its own executable, so no other test's allocations raise the peak.
#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>

#include "unit/io_test_util.h"
#include "triax/io/indexed_dataset.h"
#include "triax/io/token_shard.h"
#include "triax/data/data.h"
#include "triax/data/token_corpus.h"

using namespace triax;

namespace {

// kB of a /proc/self/status field (VmHWM: peak resident set, VmRSS: now).
int64_t status_kb(const std::string& field) {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  FAIL("no " << field << " in /proc/self/status");
  return 0;
}

// A file of `size` bytes of which only `head` is written: the rest is a hole (reads as zeros).
void sparse_file(const std::string& path, const std::string& head, int64_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, head.data(), head.size()) == static_cast<ssize_t>(head.size()));
  REQUIRE(::ftruncate(fd, size) == 0);
  ::close(fd);
}

int64_t sample_all_over(const Dataset& ds, int T, int64_t count) {
  std::vector<int32_t> s(static_cast<size_t>(T) + 1);
  int64_t sum = 0;
  const int64_t stride = ds.num_samples(T) / count;
  for (int64_t g = 0; g < count; ++g) {
    ds.sample(g * stride + 3, T, s.data());
    for (int32_t t : s) sum += t;
  }
  return sum;
}

}  // namespace

TEST_CASE("multi-GB sparse corpora are sampled with a resident set independent of their size", "[data][rss]") {
  test::TempDir dir;
  const int64_t tokens_per_shard = 1'500'000'000;  // 3 GB each (the int32 count of the header allows 2^31)
  for (int i = 0; i < 3; ++i) {
    std::string h;
    for (int k = 0; k < 256; ++k) test::append_u32le(h, k == 0 ? 20240520 : k == 1 ? 1 : k == 2 ? tokens_per_shard : 0);
    sparse_file(dir.file(fmt::format("train_{:03d}.bin", i)), h, 1024 + 2 * tokens_per_shard);
  }
  // Megatron: 4 documents of 10^9 uint16 tokens, 8 GB of .bin (a hole), a real .idx.
  const std::string pre = dir.file("mega_text_document");
  {
    std::string idx("MMIDIDX\0\0", 9);
    test::append_u64le(idx, 1);
    idx.push_back(8);
    test::append_u64le(idx, 4);
    test::append_u64le(idx, 5);
    for (int d = 0; d < 4; ++d) test::append_u32le(idx, 1'000'000'000);
    for (int d = 0; d < 4; ++d) test::append_u64le(idx, static_cast<uint64_t>(d) * 2'000'000'000);
    for (int d = 0; d <= 4; ++d) test::append_u64le(idx, static_cast<uint64_t>(d));
    test::write_bytes(pre + ".idx", idx);
    sparse_file(pre + ".bin", "", 8'000'000'000);
  }
  const int64_t before = status_kb("VmHWM");
  auto llmc = open_dataset(dir.file("train_*.bin"), 50257, 1234);
  auto mega = open_dataset(pre, 50257, 1234, DataOptions{true, true});
  const int T = 1024;
  REQUIRE(llmc->num_samples(T) == (3 * tokens_per_shard - 1) / T);
  REQUIRE(mega->num_samples(T) == 4 * ((1'000'000'000 - 1) / T));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(sample_all_over(*llmc, T, 2000) == 0);  // holes read as token 0
  CHECK(sample_all_over(*mega, T, 2000) == 0);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const int64_t after = status_kb("VmHWM");
  const double corpus_gb = (3.0 * (1024 + 2 * tokens_per_shard) + 8e9) / 1e9;
  WARN(fmt::format("peak RSS {} kB before opening, {} kB after sampling 4000 samples of {} tokens from {:.1f} GB of "
                   "corpora ({:.1f} ms, {:.1f} us per sample)", before, after, T + 1, corpus_gb, ms, ms * 1e3 / 4000));
  // Each read drops its pages again (MappedFile::release_pages), so 4000 samples leave nothing
  // behind; a corpus read whole would be 17 GB, one left mapped page per sample 16-32 MB.
  CHECK(after - before < 12 * 1024);
}
