// Every entry of a Megatron index is validated at open, whatever the sampling mode (issue 24: all-
// zero pointers and negative lengths were accepted without --data-respect-eod): the message names
// the .idx file, the byte offset and the first bad entry.
#include <catch2/catch.hpp>

#include "unit/io_test_util.h"
#include "triax/data/data.h"
#include "triax/io/indexed_dataset.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {

// An index with the given lengths and pointers (uint16 tokens, one sequence per document unless
// docs is given), field by field as Megatron writes it.
std::string idx_with(const std::vector<int32_t>& lengths, const std::vector<int64_t>& pointers,
                     std::vector<int64_t> docs = {}) {
  if (docs.empty())
    for (size_t d = 0; d <= lengths.size(); ++d) docs.push_back(static_cast<int64_t>(d));
  std::string s("MMIDIDX\0\0", 9);
  test::append_u64le(s, 1);
  s.push_back(static_cast<char>(8));
  test::append_u64le(s, lengths.size());
  test::append_u64le(s, docs.size());
  for (int32_t l : lengths) test::append_u32le(s, static_cast<uint32_t>(l));
  for (int64_t p : pointers) test::append_u64le(s, static_cast<uint64_t>(p));
  for (int64_t d : docs) test::append_u64le(s, static_cast<uint64_t>(d));
  return s;
}

}  // namespace

TEST_CASE("indexed dataset: every pointer, length and document index is checked at open", "[data]") {
  test::TempDir dir;
  const std::string pre = dir.file("ds");
  std::string bin;
  for (int t = 0; t < 12; ++t) test::append_u16le(bin, static_cast<uint16_t>(7 * t + 1));
  test::write_bytes(pre + ".bin", bin);
  const auto open = [&](const std::string& idx) {
    test::write_bytes(pre + ".idx", idx);
    return test::io_error_of([&] { io::IndexedDataset ds(pre); });
  };
  // A good one: sequences of 3, 4 and 5 tokens back to back.
  test::write_bytes(pre + ".idx", idx_with({3, 4, 5}, {0, 6, 14}));
  CHECK(io::IndexedDataset(pre).num_tokens() == 12);
  // All-zero pointers: the second sequence overlaps the first (pointer of sequence 1 at 34 + 12 + 8).
  CHECK_THAT(open(idx_with({3, 4, 5}, {0, 0, 0})),
             Contains(pre + ".idx: offset 54: sequence 1 starts at byte 0") && Contains("overlaps sequence 0") &&
                 Contains("first bad entry"));
  // A negative length in the middle (length of sequence 1 at 34 + 4).
  CHECK_THAT(open(idx_with({3, -2, 5}, {0, 6, 14})),
             Contains(pre + ".idx: offset 38: sequence 1 has a negative length -2"));
  // A pointer that is not token-aligned, and one past the data (only the last was checked before).
  CHECK_THAT(open(idx_with({3, 4, 5}, {0, 7, 14})), Contains("sequence 1") && Contains("not a token-aligned offset"));
  CHECK_THAT(open(idx_with({3, 40, 5}, {0, 6, 14})), Contains("sequence 1") && Contains("points past its data file"));
  // Document indices that go backwards (offset 34 + 12 + 24 + 8 x 2).
  CHECK_THAT(open(idx_with({3, 4, 5}, {0, 6, 14}, {0, 2, 1, 3})),
             Contains(pre + ".idx: offset 86: document index 2 is 1 after 2"));
  // The trainer's path without --data-respect-eod refuses it too.
  test::write_bytes(pre + ".idx", idx_with({3, 4, 5}, {0, 0, 0}));
  CHECK_THAT(test::io_error_of([&] { (void)open_dataset(pre, 256, 1, DataOptions{true, false}); }),
             Contains("overlaps sequence 0"));
}
