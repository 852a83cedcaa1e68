// Weight files under mpirun: each TP rank's load equals the shard of the full (naive HF -> triax)
// tensor, for tp = world size (vocab 67 pads differently at each tp), from safetensors and llm.c;
// and saving from any tp x pp x dp layout gathers the same file the model was loaded from.
#include <catch2/catch.hpp>

#include <filesystem>

#include "support/multirank.h"
#include "support/shared_dir.h"
#include "triax/distributed/grid.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/io/safetensors.h"
#include "triax/model/weight_file.h"
#include "triax/model/gpt.h"
#include "triax/model/param_shards.h"
#include "unit/checkpoint_test_util.h"

using namespace triax;

namespace {

using test::SharedDir;

GptConfig test_cfg() {
  GptConfig c = GptConfig::preset("nano");  // 2 layers, 4 heads, C 32, vocab 67, padded only to tp
  return c;
}

// Writes the same random model as HF safetensors and as an llm.c checkpoint (rank 0), and returns
// the HF-layout model (every rank builds it from the same seed).
test::HfModel write_files(Communicator& world, const SharedDir& dir, const GptConfig& cfg) {
  auto hf = test::random_hf_model(cfg, 777);
  if (world.rank() == 0) {
    test::write_hf_file(dir.file("m.safetensors"), hf, "transformer.", {{"n_head", std::to_string(cfg.n_head)}});
    FullWeights w;
    for (const auto& [name, shape] : gpt_param_shapes(cfg)) w[name] = test::triax_layout(hf, name, cfg.vocab);
    write_llmc_checkpoint(dir.file("m.bin"), cfg, w);
  }
  world.barrier().wait();
  return hf;
}

}  // namespace

TEST_CASE("each TP rank loads exactly its shard", "[checkpoint][tp]") {
  auto& world = test::world();
  SharedDir dir(world);
  const GptConfig cfg = test_cfg();
  const auto hf = write_files(world, dir, cfg);
  ProcessGrid grid(test::world_ptr(), {world.size(), 1, 1, 1, "tp-dp-pp"});
  const int tp = world.size(), r = grid.tp().rank();
  for (const char* file : {"m.safetensors", "m.bin"}) {
    INFO(file << " tp " << tp);
    WeightFile wf(dir.file(file));
    REQUIRE(wf.config().n_head == cfg.n_head);
    ParamStore store;
    GptChunk chunk(cfg, {0, cfg.n_layer, true, true}, grid.tp(), store, Recompute::none);
    store.finalize();
    std::fill(store.flat_params().begin(), store.flat_params().end(), 1e9f);  // poison
    wf.load(store, cfg, grid.tp());
    REQUIRE(store.size() == gpt_param_shapes(cfg).size());
    for (size_t i = 0; i < store.size(); ++i) {
      const auto& info = store.info(i);
      INFO(info.spec.name);
      const auto full = test::triax_layout(hf, info.spec.name, cfg.padded_vocab(tp));
      const auto want = shard_of(full, info.spec.full_shape, info.spec.split, r, tp);
      const auto got = store.param(i);
      REQUIRE(got.size() == want.size());
      CHECK(std::equal(got.begin(), got.end(), want.begin()));
    }
  }
}

TEST_CASE("saving from any tp x pp x dp layout writes the model it loaded", "[checkpoint][tp][pp]") {
  auto& world = test::world();
  SharedDir dir(world);
  const GptConfig cfg = test_cfg();
  write_files(world, dir, cfg);
  const int W = world.size();
  std::vector<GridShape> layouts = {{W, 1, 1, 1, "tp-dp-pp"}, {1, 1, W, 1, "tp-dp-pp"}};
  if (W % 2 == 0) layouts.push_back({W / 2, 2, 1, 1, "tp-dp-pp"});
  if (W == 4) layouts.push_back({1, 2, 2, 1, "pp-tp-dp"});
  int n = 0;
  for (const auto& shape : layouts) {
    INFO("tp " << shape.tp << " pp " << shape.pp << " dp " << shape.dp << " order " << shape.order);
    ProcessGrid grid(test::world_ptr(), shape);
    const int pp = shape.pp, s = grid.coord().pp;
    const int per = cfg.n_layer / pp;
    ChunkSpec spec{s * per, per, s == 0, s == pp - 1};
    ParamStore store;
    GptChunk chunk(cfg, spec, grid.tp(), store, Recompute::none);
    store.finalize();
    WeightFile(dir.file("m.safetensors")).load(store, cfg, grid.tp());
    for (WeightFormat f : {WeightFormat::safetensors, WeightFormat::llmc}) {
      const std::string out = dir.file(fmt::format("saved{}.{}", n++, f == WeightFormat::llmc ? "bin" : "safetensors"));
      save_weights(out, f, cfg, store, grid);
      // Every rank reloads the saved file into its own chunk: the same parameters, bit for bit.
      ParamStore again;
      GptChunk chunk2(cfg, spec, grid.tp(), again, Recompute::none);
      again.finalize();
      WeightFile(out).load(again, cfg, grid.tp());
      CHECK(std::equal(again.flat_params().begin(), again.flat_params().end(), store.flat_params().begin()));
      if (f == WeightFormat::safetensors && world.rank() == 0) {
        // Same tensors, shapes and values as the HF-layout file the model came from.
        io::SafetensorsReader a(dir.file("m.safetensors")), b(out);
        REQUIRE(b.tensors().size() == a.tensors().size());
        for (const auto& t : a.tensors()) {
          INFO(t.name);
          CHECK(b.info(t.name).shape == t.shape);
          CHECK(b.read(t.name) == a.read(t.name));
        }
      }
    }
  }
}
