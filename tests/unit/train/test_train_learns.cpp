// A few AdamW steps on a tiny model reduce the loss on the generated learnable language, and
// the datasets hand out the same samples by global index whatever asks for them.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "triax/distributed/comm/self_comm.h"
#include "triax/train/trainer.h"

using namespace triax;

TEST_CASE("AdamW steps on a tiny model reduce the loss on a learnable task", "[train]") {
  TrainConfig c;
  c.model = "tiny";
  c.layers = 2;
  c.seq = 32;
  c.micro_batch = 4;
  c.train_iters = 25;
  c.lr = 1e-2;
  c.warmup_iters = 2;
  Trainer t(std::shared_ptr<Communicator>(make_self_communicator()), c);
  std::vector<double> losses;
  int64_t peak = 0;
  t.train([&](const IterationMetrics& m) {
    REQUIRE(std::isfinite(m.loss));
    REQUIRE(m.grad_norm > 0);
    losses.push_back(m.loss);
    // The allocator's high-water mark: at least the weights, gradients and two Adam moments
    // (4 x 4 bytes per parameter), never falling, and in the JSON line as measured.
    REQUIRE(m.peak_mem_bytes >= std::max<int64_t>(peak, 1));
    peak = m.peak_mem_bytes;
    REQUIRE(nlohmann::json::parse(m.json())["peak_mem_bytes"].get<int64_t>() == m.peak_mem_bytes);
  });
  // tiny at 2 layers holds well over 100k parameters.
  REQUIRE(peak >= int64_t{16} * 100000);
  REQUIRE(losses.size() == 25);
  INFO("loss " << losses.front() << " -> " << losses.back());
  REQUIRE(losses.front() == Approx(std::log(256.0)).epsilon(0.05));  // a fresh model is near uniform
  REQUIRE(losses.back() < losses.front() - 1.5);
}

TEST_CASE("the synthetic dataset is deterministic and learnable by construction", "[data]") {
  auto a = make_synthetic_dataset(256, 7), b = make_synthetic_dataset(256, 7), c = make_synthetic_dataset(256, 8);
  std::vector<int32_t> x1, y1, x2, y2, x3, y3;
  a->batch(100, 4, 16, x1, y1);
  b->batch(100, 4, 16, x2, y2);
  c->batch(100, 4, 16, x3, y3);
  REQUIRE(x1 == x2);
  REQUIRE(y1 == y2);
  REQUIRE(x1 != x3);
  // Targets are the inputs shifted by one.
  for (int r = 0; r < 4; ++r)
    for (int t = 0; t + 1 < 16; ++t) REQUIRE(y1[r * 16 + t] == x1[r * 16 + t + 1]);
  // Most transitions follow the successor table: the same token is usually followed by the same one.
  std::map<int, std::map<int, int>> follow;
  std::vector<int32_t> x, y;
  a->batch(0, 64, 32, x, y);
  for (size_t i = 0; i < x.size(); ++i) follow[x[i]][y[i]]++;
  int top = 0, total = 0;
  for (auto& [tok, m] : follow) {
    int best = 0;
    for (auto& [n, cnt] : m) best = std::max(best, cnt), total += cnt;
    top += best;
  }
  REQUIRE(static_cast<double>(top) / total > 0.85);
}
