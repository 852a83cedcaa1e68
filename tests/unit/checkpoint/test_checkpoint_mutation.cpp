// A seeded mutation test of the manifest's NUMBERS (issue 24): every number of a complete
// manifest (offsets, sizes, shapes, ranks, iteration, consumed samples, steps, batch, layout) is
// changed one at a time, one digit at a time (replaced, deleted, inserted) and by +-1, and
//  - with the digest as written: every change is refused (manifest.sha256 no longer matches);
//  - with a forged digest (someone rewrote both): every change is refused by the structure
//    checks or the comparison with the run, or is provably harmless: a resume takes exactly the
//    same state from it (progress, batch settings, every tensor of every kind). The harmless
//    ones may only touch fields a resume does not use (listed below), or respell a number with
//    its own value (1e-05 as 1e-5), and the test says so.
#include <catch2/catch.hpp>

#include <cctype>
#include <cstdlib>
#include <map>
#include <random>
#include <set>

#include "manifest_sample.h"

using namespace triax;
using namespace triax::test;

namespace {

// A number token of the JSON text, outside strings: [begin, end) and the field it belongs to.
struct NumberToken {
  size_t begin, end;
  std::string key;
};

std::vector<NumberToken> number_tokens(const std::string& t) {
  std::vector<NumberToken> out;
  std::string last_key, last_string;
  for (size_t i = 0; i < t.size();) {
    if (t[i] == '"') {  // a string: skip it (escapes included), remember it as a possible key
      size_t j = i + 1;
      while (j < t.size() && t[j] != '"') j += t[j] == '\\' ? 2 : 1;
      last_string = t.substr(i + 1, j - i - 1);
      i = j + 1;
      continue;
    }
    if (t[i] == ':') last_key = last_string;
    if (std::isdigit(static_cast<unsigned char>(t[i])) || t[i] == '-') {
      size_t j = i + 1;
      while (j < t.size() && (std::isdigit(static_cast<unsigned char>(t[j])) || std::strchr("+-.eE", t[j]))) ++j;
      out.push_back({i, j, last_key});
      i = j;
      continue;
    }
    ++i;
  }
  return out;
}

// The mutations of one token: each digit position replaced (by a seeded other digit), a digit
// deleted and one inserted at a seeded position, and the value +1 and -1.
std::vector<std::string> mutations(const std::string& tok, std::mt19937_64& rng) {
  std::vector<std::string> out;
  for (size_t p = 0; p < tok.size(); ++p) {
    if (!std::isdigit(static_cast<unsigned char>(tok[p]))) continue;
    std::string m = tok;
    m[p] = static_cast<char>('0' + (tok[p] - '0' + 1 + static_cast<int>(rng() % 9)) % 10);
    out.push_back(m);
  }
  if (tok.size() > 1) out.push_back(std::string(tok).erase(rng() % tok.size(), 1));
  out.push_back(std::string(tok).insert(rng() % (tok.size() + 1), 1, static_cast<char>('0' + rng() % 10)));
  const long long v = std::stoll(tok);
  out.push_back(std::to_string(v + 1));
  out.push_back(std::to_string(v - 1));
  return out;
}

// The same number spelled otherwise ("1e-5" for "1e-05", "10000.00" for "10000.0"): no change
// of the manifest's content, so accepting it is no harm whatever the field.
bool same_number(const std::string& a, const std::string& b) {
  char* ea = nullptr;
  char* eb = nullptr;
  const double x = std::strtod(a.c_str(), &ea), y = std::strtod(b.c_str(), &eb);
  return *ea == '\0' && *eb == '\0' && x == y;
}

}  // namespace

TEST_CASE("checkpoint manifest: every change of a number is refused or harmless", "[checkpoint][fuzz]") {
  const ManifestSample s = manifest_sample();
  const std::string text = checkpoint_manifest_json(s.m);
  const std::string digest = checkpoint_manifest_digest(text);
  const auto original = load_sample(text, s);
  REQUIRE(original);
  // Fields a resume does not read: information about the writer's run (docs/CHECKPOINTS.md).
  const std::set<std::string> information = {"vpp", "vocab_pad_to"};

  const auto tokens = number_tokens(text);
  std::set<std::string> keys;
  for (const auto& t : tokens) keys.insert(t.key);
  for (const char* k : {"offset", "bytes", "begin", "end", "full_shape", "tp_rank", "tp_size", "iteration",
                        "consumed_samples", "applied_steps", "skipped_steps", "global_batch", "micro_batch",
                        "num_micro_batches", "since_iteration", "tp", "dp", "format_version", "seed", "n_kv_head",
                        "norm_eps", "rope_theta"})
    CHECK(keys.count(k) == 1);  // the tokenizer sees every kind of number

  std::mt19937_64 rng(24);
  int cases = 0, by_digest = 0, by_structure = 0, harmless = 0;
  std::map<std::string, int> harmless_by_key;
  for (const auto& tok : tokens) {
    const std::string old = text.substr(tok.begin, tok.end - tok.begin);
    for (const auto& m : mutations(old, rng)) {
      if (m == old) continue;
      const std::string t = text.substr(0, tok.begin) + m + text.substr(tok.end);
      ++cases;
      // The digest as written: refused, whatever the change.
      try {
        check_checkpoint_manifest_digest(t, digest, "manifest.sha256");
        FAIL_CHECK("the digest accepted " << tok.key << ": " << old << " -> " << m);
      } catch (const IoError&) {
        ++by_digest;
      }
      // A forged digest: the structure and the run decide.
      const auto got = load_sample(t, s);
      if (!got) {
        ++by_structure;
        continue;
      }
      INFO(tok.key << ": " << old << " -> " << m << " was accepted");
      CHECK(*got == *original);
      CHECK((information.count(tok.key) == 1 || same_number(old, m)));
      ++harmless, ++harmless_by_key[tok.key];
    }
  }
  WARN(cases << " changes of " << tokens.size() << " numbers: all refused by the digest; with a forged digest "
              << by_structure << " refused by the structure or the run, " << harmless << " harmless");
  CHECK(cases > 400);
  CHECK(by_digest == cases);
  CHECK(by_structure + harmless == cases);
  for (const auto& [k, n] : harmless_by_key) WARN("harmless: " << n << " changes of '" << k << "' (information only)");
}
