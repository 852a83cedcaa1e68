// Memory-mapped corpora and sample order: a hand-built Megatron index read against its
// documented layout, writer round trips, llm.c shards by glob, the seeded per-epoch permutation,
// samples inside documents, and every kind of bad data naming its file and offset.
#include <catch2/catch.hpp>
#include <algorithm>
#include <numeric>
#include <set>

#include "unit/io_test_util.h"
#include "triax/io/indexed_dataset.h"
#include "triax/io/token_shard.h"
#include "triax/data/data.h"
#include "triax/data/sample_order.h"
#include "triax/data/token_corpus.h"

using namespace triax;
using Catch::Matchers::Contains;
using test::config_error_of;
using test::io_error_of;
using test::TempDir;

namespace {

// The .idx bytes as Megatron's _IndexWriter lays them out, written field by field here (not by
// the library's writer), for uint16 tokens and one sequence per document.
std::string idx_bytes(const std::vector<int32_t>& lengths, uint64_t version = 1, uint8_t dtype = 8) {
  std::string s("MMIDIDX\0\0", 9);
  test::append_u64le(s, version);
  s.push_back(static_cast<char>(dtype));
  test::append_u64le(s, lengths.size());
  test::append_u64le(s, lengths.size() + 1);
  for (int32_t l : lengths) test::append_u32le(s, static_cast<uint32_t>(l));
  int64_t ptr = 0;
  for (int32_t l : lengths) {
    test::append_u64le(s, static_cast<uint64_t>(ptr));
    ptr += 2 * l;
  }
  for (size_t d = 0; d <= lengths.size(); ++d) test::append_u64le(s, d);
  return s;
}

std::string u16_bytes(const std::vector<int>& toks) {
  std::string s;
  for (int t : toks) test::append_u16le(s, static_cast<uint16_t>(t));
  return s;
}

std::vector<int32_t> read_all(const TokenCorpus& c) {
  std::vector<int32_t> v(static_cast<size_t>(c.size()));
  c.read(0, static_cast<int>(v.size()), v.data());
  return v;
}

}  // namespace

TEST_CASE("indexed dataset: a hand-built Megatron index reads back", "[data]") {
  TempDir dir;
  const std::string pre = dir.file("corpus_text_document");
  test::write_bytes(pre + ".idx", idx_bytes({3, 5, 2}));
  test::write_bytes(pre + ".bin", u16_bytes({10, 11, 12, 20, 21, 22, 23, 24, 30, 31}));
  io::IndexedDataset ds(pre);
  CHECK(ds.dtype_code() == 8);
  CHECK(ds.num_sequences() == 3);
  CHECK(ds.num_documents() == 3);
  CHECK(ds.num_tokens() == 10);
  CHECK(ds.document_range(1) == std::pair<int64_t, int64_t>{3, 8});
  CHECK(ds.document_range(2) == std::pair<int64_t, int64_t>{8, 10});
  auto c = open_corpus(pre, 100);  // the prefix, as Megatron names it
  CHECK(read_all(*c) == std::vector<int32_t>{10, 11, 12, 20, 21, 22, 23, 24, 30, 31});
  CHECK(c->num_documents() == 3);
  // The same dataset named by its .bin or .idx.
  CHECK(open_corpus(pre + ".bin", 100)->size() == 10);
  CHECK(open_corpus(pre + ".idx", 100)->size() == 10);
}

TEST_CASE("indexed dataset: the writer round-trips random documents (uint16 and int32)", "[data]") {
  const uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  TempDir dir;
  for (int code : {8, 4}) {
    std::vector<std::vector<int32_t>> docs(1 + rng() % 20);
    std::vector<int32_t> flat;
    for (auto& d : docs) {
      d.resize(1 + rng() % 50);
      for (auto& t : d) t = static_cast<int32_t>(rng() % (code == 8 ? 65536 : 100000));
      flat.insert(flat.end(), d.begin(), d.end());
    }
    std::vector<std::span<const int32_t>> spans(docs.begin(), docs.end());
    const std::string pre = dir.file(fmt::format("rt{}", code));
    io::write_indexed_dataset(pre, spans, code);
    auto c = open_indexed_corpus(pre, 100000);
    CHECK(read_all(*c) == flat);
    REQUIRE(c->num_documents() == static_cast<int64_t>(docs.size()));
    int64_t at = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      CHECK(c->document(static_cast<int64_t>(d)) == std::pair<int64_t, int64_t>{at, at + static_cast<int64_t>(docs[d].size())});
      at += static_cast<int64_t>(docs[d].size());
    }
  }
}

TEST_CASE("indexed dataset: bad files name the file and the offset", "[data]") {
  TempDir dir;
  const std::string pre = dir.file("bad");
  test::write_bytes(pre + ".bin", u16_bytes({1, 2, 3, 4, 5}));
  const auto err = [&](const std::string& idx) {
    test::write_bytes(pre + ".idx", idx);
    return io_error_of([&] { io::IndexedDataset ds(pre); (void)ds.num_tokens(); });
  };
  CHECK_THAT(err("MMIDIDX"), Contains(pre + ".idx") && Contains("shorter than"));
  std::string wrong = idx_bytes({5});
  wrong[0] = 'X';
  CHECK_THAT(err(wrong), Contains(pre + ".idx") && Contains("offset 0") && Contains("magic"));
  CHECK_THAT(err(idx_bytes({5}, 2)), Contains("offset 9") && Contains("version 2"));
  CHECK_THAT(err(idx_bytes({5}, 1, 7)), Contains("offset 17") && Contains("float32"));
  std::string trunc = idx_bytes({2, 3});
  trunc.resize(trunc.size() - 3);
  CHECK_THAT(err(trunc), Contains("truncated"));
  // The last sequence runs past the 5 tokens of .bin: its pointer entry (34 + 4*2 + 8*1 = 50).
  CHECK_THAT(err(idx_bytes({2, 4})), Contains(pre + ".idx") && Contains("offset 50") && Contains("points past") &&
                                         Contains(pre + ".bin"));
  // A .bin of another element size (3 bytes is not whole uint16 tokens).
  test::write_bytes(pre + ".idx", idx_bytes({1}));
  test::write_bytes(pre + ".bin", "abc");
  CHECK_THAT(io_error_of([&] { io::IndexedDataset ds(pre); }), Contains(pre + ".bin") && Contains("whole number"));
  // Missing data file.
  std::filesystem::remove(pre + ".bin");
  CHECK_THAT(io_error_of([&] { io::IndexedDataset ds(pre); }), Contains(pre + ".bin"));
}

TEST_CASE("llm.c shards by glob: sorted, concatenated, read across files", "[data]") {
  TempDir dir;
  const std::vector<std::vector<uint16_t>> parts = {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}};
  for (size_t i = 0; i < parts.size(); ++i)  // written out of order: the glob sorts
    io::write_token_shard(dir.file(fmt::format("fineweb_train_{:06d}.bin", parts.size() - 1 - i)),
                          parts[parts.size() - 1 - i]);
  auto c = open_corpus(dir.file("fineweb_train_*.bin"), 10);
  CHECK(read_all(*c) == std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9});
  std::vector<int32_t> mid(4);
  c->read(2, 4, mid.data());
  CHECK(mid == std::vector<int32_t>{3, 4, 5, 6});
  CHECK_THAT(c->describe(), Contains("fineweb_train_000002.bin"));
  CHECK(c->num_documents() == 0);
  // A comma list mixing a glob and a file.
  CHECK(open_corpus(dir.file("fineweb_train_000000.bin") + "," + dir.file("fineweb_train_00000[12].bin"), 10)->size() == 9);
  CHECK_THAT(io_error_of([&] { open_corpus(dir.file("nothing_*.bin"), 10); }), Contains(dir.file("nothing_*.bin")));
  // A token >= vocab: named when read, with its file and byte offset (header 1024 + 2 * position).
  auto small = open_corpus(dir.file("fineweb_train_*.bin"), 8);
  std::vector<int32_t> buf(9);
  CHECK_THAT(io_error_of([&] { small->read(0, 9, buf.data()); }),
             Contains("fineweb_train_000002.bin") && Contains("token 8 at position 2") && Contains("byte offset 1028") &&
                 Contains("[0, 8)"));
}

TEST_CASE("llm.c shards: a file of another format or version is refused, naming it", "[data]") {
  TempDir dir;
  const std::vector<int32_t> doc = {1, 2, 3, 4};
  std::vector<std::span<const int32_t>> one{std::span<const int32_t>(doc)};
  io::write_indexed_dataset(dir.file("mega"), one);
  std::filesystem::rename(dir.file("mega.idx"), dir.file("elsewhere.idx"));  // no .idx beside: read as llm.c
  CHECK_THAT(io_error_of([&] { open_corpus(dir.file("mega.bin"), 10); }), Contains(dir.file("mega.bin")));
  std::string v2;
  for (int i = 0; i < 256; ++i) test::append_u32le(v2, i == 0 ? 20240520 : i == 1 ? 2 : i == 2 ? 1 : 0);
  test::append_u16le(v2, 1);
  test::write_bytes(dir.file("v2.bin"), v2);
  CHECK_THAT(io_error_of([&] { open_corpus(dir.file("v2.bin"), 10); }), Contains(dir.file("v2.bin")) && Contains("version 2"));
}

TEST_CASE("sample order: a seeded permutation per epoch, the same for every caller", "[data]") {
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
    CAPTURE(n);
    SampleOrder o(n, 1234, true), same(n, 1234, true), other(n, 99, true), plain(n, 1234, false);
    std::vector<int64_t> e0, e1;
    for (int64_t g = 0; g < n; ++g) e0.push_back(o(g));
    for (int64_t g = n; g < 2 * n; ++g) e1.push_back(o(g));
    std::vector<int64_t> s0 = e0, s1 = e1, iota(static_cast<size_t>(n));
    std::iota(iota.begin(), iota.end(), 0);
    std::sort(s0.begin(), s0.end());
    std::sort(s1.begin(), s1.end());
    CHECK(s0 == iota);  // a permutation of [0, n) in every epoch
    CHECK(s1 == iota);
    for (int64_t g = 0; g < 2 * n; ++g) {
      CHECK(same(g) == o(g));
      CHECK(plain(g) == g % n);
    }
    if (n >= 7) {
      CHECK(e0 != e1);  // epochs differ
      CHECK(e0 != iota);
      std::vector<int64_t> eo;
      for (int64_t g = 0; g < n; ++g) eo.push_back(other(g));
      CHECK(eo != e0);  // seeds differ
    }
  }
}

TEST_CASE("corpus dataset: shuffled samples are the corpus at the permuted offsets", "[data]") {
  TempDir dir;
  std::vector<uint16_t> toks(1000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 7) % 500);
  io::write_token_shard(dir.file("a.bin"), toks);
  const int T = 16;
  auto ds = open_dataset(dir.file("a.bin"), 500, 42);
  REQUIRE(ds->num_samples(T) == 999 / 16);
  SampleOrder order(ds->num_samples(T), 42, true);
  std::vector<int32_t> s(T + 1);
  std::set<int64_t> seen;
  for (int64_t g = 0; g < 3 * ds->num_samples(T); ++g) {
    ds->sample(g, T, s.data());
    const int64_t r = order(g);
    for (int i = 0; i <= T; ++i) REQUIRE(s[static_cast<size_t>(i)] == toks[static_cast<size_t>(r * T + i)]);
    if (g < ds->num_samples(T)) seen.insert(s[0]);
  }
  auto plain = open_dataset(dir.file("a.bin"), 500, 42, DataOptions{false, false});
  plain->sample(5, T, s.data());
  CHECK(s[0] == toks[5 * T]);
  // Too short for one sample: names the file and the counts.
  io::write_token_shard(dir.file("short.bin"), std::vector<uint16_t>(8, 3));
  auto sh = open_dataset(dir.file("short.bin"), 500, 1);
  CHECK(sh->num_samples(T) == 0);
  CHECK_THAT(io_error_of([&] { sh->sample(0, T, s.data()); }),
             Contains(dir.file("short.bin")) && Contains("8 tokens") && Contains("16 + 1"));
  // Documents need a format that has them.
  CHECK_THAT(config_error_of([&] { open_dataset(dir.file("a.bin"), 500, 1, DataOptions{true, true}); }),
             Contains("no document boundaries"));
}

TEST_CASE("corpus dataset: samples respect document boundaries when asked", "[data]") {
  TempDir dir;
  // Documents of 9, 4, 20 tokens; T = 4: (9-1)/4 = 2, (4-1)/4 = 0, (20-1)/4 = 4 samples.
  std::vector<std::vector<int32_t>> docs = {std::vector<int32_t>(9), std::vector<int32_t>(4), std::vector<int32_t>(20)};
  for (size_t d = 0; d < docs.size(); ++d)
    for (size_t i = 0; i < docs[d].size(); ++i) docs[d][i] = static_cast<int32_t>(100 * d + i);
  std::vector<std::span<const int32_t>> spans(docs.begin(), docs.end());
  io::write_indexed_dataset(dir.file("docs"), spans);
  auto ds = open_dataset(dir.file("docs"), 300, 7, DataOptions{true, true});
  const int T = 4;
  REQUIRE(ds->num_samples(T) == 6);
  std::set<int32_t> firsts;
  std::vector<int32_t> s(T + 1);
  for (int64_t g = 0; g < 6; ++g) {
    ds->sample(g, T, s.data());
    const int32_t doc = s[0] / 100;
    for (int i = 0; i <= T; ++i) REQUIRE(s[static_cast<size_t>(i)] / 100 == doc);  // never crosses a document
    CHECK(s[0] % 100 % T == 0);
    firsts.insert(s[0]);
  }
  CHECK(firsts == std::set<int32_t>{0, 4, 200, 204, 208, 212});
  // Without EOD respect the same corpus is one stream of 33 tokens: 8 samples.
  CHECK(open_dataset(dir.file("docs"), 300, 7)->num_samples(T) == 8);
}
