// gpt_eval: the mean next-token cross-entropy of a GPT-2 checkpoint (HF safetensors or llm.c .bin)
// over K consecutive batches of a token corpus (llm.c shards or a glob of them, a Megatron indexed
// dataset: docs/DATA.md), forward only, tensor-, pipeline- and
// data-parallel. Batch k uses tokens [k*B*T, k*B*T + B*T + 1): inputs and next-token targets.
//   mpirun -np 4 gpt_eval --tp 4 --weights gpt2.safetensors --data val.bin --batch 4 --seq 64 --batches 8
// The last line of stdout is "loss <value>"; --json prints a JSON object line before it.
// --sample N continues a prompt instead (--prompt TEXT for byte-level models or --prompt-tokens,
// --temperature, --top-k, --sample-seed), in one process: see sample.h.
// --save FILE also writes the loaded weights (gathered over the layout) as HF safetensors or, for
// a .bin name, an llm.c checkpoint: a converter between the two formats (a Llama-family model: an
// HF model directory).
// --weights DIR reads an HF LlamaForCausalLM directory (config.json + safetensors, hf_dir.h).
// --grads-out FILE also writes the gradient of the first batch's mean loss for every parameter, by
// name, full shape (gathered over TP and stages), as float32 safetensors: a reference check.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include <triax/backend/comm_ops.h>
#include <triax/core/env.h>
#include <triax/core/error.h>
#include <triax/core/log.h>
#include <triax/distributed/bootstrap/bootstrap.h>
#include <triax/distributed/grid.h>
#include <triax/distributed/failure/job_failure.h>
#include <triax/data/data.h>
#include <triax/data/token_corpus.h>
#include <triax/model/hf_dir.h>
#include <triax/model/weight_file.h>
#include <triax/io/safetensors.h>
#include <triax/model/gpt.h>

#include "sample.h"

namespace {

struct Options {
  std::string weights, data;
  int batch = 0, seq = 0;
  int64_t batches = 0;  // 0 = every whole batch in the shard
  int tp = 1, pp = 1, heads = 0;
  bool json = false;
  std::string save;  // write the loaded weights here (.bin: llm.c, else safetensors)
  std::string grads_out;  // write the first batch's parameter gradients here (f32 safetensors)
};

// Before MPI starts, the launcher's environment says whether this process is rank 0: only it
// prints command-line errors, so mpirun -np 8 shows one message, not eight.
bool launcher_rank0() { return triax::launcher_rank() == 0; }

// A whole-number flag of at least 1, with a message that says so (CLI::PositiveNumber printed
// "Value 0 not in range 0.000000 to 1797693134862...").
const CLI::Validator kAtLeastOne(
    [](std::string& s) -> std::string {
      long long v = 0;
      const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec != std::errc() || p != s.data() + s.size()) return fmt::format("'{}' is not an integer; expected an integer >= 1", s);
      if (v < 1) return fmt::format("{} is out of range; expected an integer >= 1", s);
      return {};
    },
    "INT>=1");

struct Result {
  std::vector<double> per_batch;  // (K) mean loss of each batch
  double seconds = 0;
};

// Runs the forward passes of this rank's share of the batches. Batch k belongs to data-parallel
// replica k % dp; inside a replica the activations flow stage to stage, and the last stage's TP
// rank 0 records the batch's loss. The per-batch losses are then summed over the world, so every
// rank holds all K of them.
Result evaluate(const Options& o, triax::ProcessGrid& grid, const triax::GptConfig& cfg, triax::GptChunk& chunk,
                const triax::Dataset& data, int64_t K) {
  const int B = o.batch, T = o.seq;
  const size_t N = static_cast<size_t>(B) * T, NC = N * static_cast<size_t>(cfg.n_embd);
  const auto co = grid.coord();
  const int dp = grid.layout().size(triax::Axis::dp);
  const bool first = grid.is_first_stage(), last = grid.is_last_stage();
  const bool reporter = last && co.tp == 0;
  std::vector<int32_t> inputs(N), targets(N);
  triax::Backend& be = chunk.backend();
  triax::Tensor x_in, x_out;  // (B, T, C) on the chunk's backend
  if (!first) x_in = be.empty(triax::Shape{static_cast<int64_t>(NC)}, triax::DType::f32);
  if (!last) x_out = be.empty(triax::Shape{static_cast<int64_t>(NC)}, triax::DType::f32);
  Result r;
  r.per_batch.assign(static_cast<size_t>(K), 0.0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t k = 0; k < K; ++k) {
    if (k % dp != co.dp) continue;
    const auto tb = std::chrono::steady_clock::now();
    data.batch(k * B, B, T, inputs, targets);  // samples kB..kB+B-1: tokens [kBT, kBT + BT + 1)
    if (!first) triax::recv(grid.pp(), be, x_in, grid.prev_stage()).wait();
    const float loss = static_cast<float>(chunk.forward(0, B, T, first ? std::span<const int32_t>(inputs) : std::span<const int32_t>(),
                                                        last ? std::span<const int32_t>(targets) : std::span<const int32_t>(),
                                                        x_in, x_out, false));
    if (!last) triax::send(grid.pp(), be, x_out, grid.next_stage()).wait();
    if (reporter) {
      r.per_batch[static_cast<size_t>(k)] = loss;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - tb).count();
      std::fprintf(stderr, "gpt_eval: batch %lld/%lld loss %.6f (%.1f ms)\n", static_cast<long long>(k + 1),
                   static_cast<long long>(K), static_cast<double>(loss), ms);
    }
  }
  grid.world().all_reduce(std::span<double>(r.per_batch), triax::ReduceOp::sum).wait();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// The full shapes of the gradients --grads-out writes, by name: the vocabulary rows cut to the real
// vocabulary.
std::vector<std::pair<std::string, std::vector<int64_t>>> grad_shapes(const triax::GptConfig& cfg) {
  auto shapes = cfg.is_gpt2() ? triax::gpt_param_shapes(cfg) : triax::hf_param_shapes(cfg);
  for (auto& [name, shape] : shapes)
    if (name == cfg.embedding_param() || name == "lm_head.weight") shape[0] = cfg.vocab;
  return shapes;
}

// --grads-out: forward and backward of batch 0 (dloss 1: the gradient of its mean loss) on
// data-parallel replica 0, stage to stage; then every parameter's gradient, gathered to full
// shape over TP and stages, written by world rank 0 as float32 safetensors.
void write_grads(const Options& o, triax::ProcessGrid& grid, const triax::GptConfig& cfg, triax::GptChunk& chunk,
                 triax::ParamStore& store, const triax::Dataset& data) {
  const int B = o.batch, T = o.seq;
  const bool first = grid.is_first_stage(), last = grid.is_last_stage();
  store.zero_grads();
  if (grid.coord().dp == 0) {
    std::vector<int32_t> inputs, targets;
    data.batch(0, B, T, inputs, targets);
    triax::Backend& be = chunk.backend();
    const triax::Shape io{static_cast<int64_t>(chunk.io_rows(B, T)) * cfg.n_embd};
    triax::Tensor x_in, x_out, dx_in, dx_out;
    if (!first) x_in = be.empty(io, triax::DType::f32), dx_in = be.empty(io, triax::DType::f32);
    if (!last) x_out = be.empty(io, triax::DType::f32), dx_out = be.empty(io, triax::DType::f32);
    if (!first) triax::recv(grid.pp(), be, x_in, grid.prev_stage()).wait();
    (void)chunk.forward(0, B, T, first ? std::span<const int32_t>(inputs) : std::span<const int32_t>(),
                        last ? std::span<const int32_t>(targets) : std::span<const int32_t>(), x_in, x_out, true, 1.0f);
    if (!last) {
      triax::send(grid.pp(), be, x_out, grid.next_stage()).wait();
      triax::recv(grid.pp(), be, dx_out, grid.next_stage()).wait();
    }
    chunk.backward(0, dx_out, dx_in, false);
    if (!first) triax::send(grid.pp(), be, dx_in, grid.prev_stage()).wait();
    chunk.release(0);
  }
  const triax::FullWeights g = triax::gather_full_tensors(
      store, grid.tp(), grid.world(), [&](size_t i) { return triax::to_host_f32(store.backend(), store.grad_t(i)); });
  triax::write_on_rank0(grid.world(), [&] {
    triax::io::SafetensorsWriter wr;
    wr.add_metadata("format", "pt");
    wr.add_metadata("what", "gradient of the mean loss of batch 0");
    for (const auto& [name, shape] : grad_shapes(cfg)) {
      const auto it = g.find(name);
      if (it == g.end()) TRIAX_THROW(ConfigError, "no gradient gathered for parameter '{}'", name);
      size_t n = 1;
      for (auto d : shape) n *= static_cast<size_t>(d);
      if (it->second.size() < n)
        TRIAX_THROW(ConfigError, "parameter '{}': {} gradient values, expected {}", name, it->second.size(), n);
      wr.add(name, shape, std::span<const float>(it->second.data(), n));
    }
    wr.write(o.grads_out);
  });
}

// --sample: one process; the launcher's world must be one rank.
int sample_main(const Options& o, SampleRequest sr, const std::string& prompt_tokens) {
  try {
    if (triax::env_int("OMPI_COMM_WORLD_SIZE", 1, 1 << 20, 1) != 1 || o.tp != 1 || o.pp != 1)
      TRIAX_THROW(ConfigError, "--sample runs in one process with --tp 1 --pp 1");
    if (triax::is_hf_dir(o.weights))
      TRIAX_THROW(ConfigError, "--sample reads GPT-2 weight files (.safetensors, .bin); {} is an HF Llama directory, "
                  "which only the loss evaluation reads", o.weights);
    sr.weights = o.weights;
    sr.heads = o.heads;
    sr.json = o.json;
    for (size_t at = 0; at < prompt_tokens.size();) {
      size_t end = prompt_tokens.find(',', at);
      if (end == std::string::npos) end = prompt_tokens.size();
      const std::string t = prompt_tokens.substr(at, end - at);
      size_t used = 0;
      int v = -1;
      try {
        v = std::stoi(t, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (t.empty() || used != t.size())
        TRIAX_THROW(ConfigError, "--prompt-tokens '{}': '{}' is not a token id", prompt_tokens, t);
      sr.prompt_tokens.push_back(v);
      at = end + 1;
    }
    run_sample(sr);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_eval: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpt_eval: mean cross-entropy of a GPT-2 checkpoint on a token corpus (forward only)"};
  Options o;
  app.add_option("--weights", o.weights, "weights: HF GPT-2 .safetensors, llm.c .bin (format read from the file), or "
                 "an HF LlamaForCausalLM directory (config.json + safetensors)")
      ->required();
  app.add_option("--data", o.data, "llm.c token shards (a.bin,b.bin or a glob) or a Megatron indexed dataset "
                 "(PREFIX); required unless --sample");
  app.add_option("--batch", o.batch, "sequences per batch (B); required unless --sample")->check(kAtLeastOne);
  app.add_option("--seq", o.seq, "tokens per sequence (T), at most the model's positions; required unless --sample")
      ->check(kAtLeastOne);
  SampleRequest sr;
  std::string prompt_tokens;
  app.add_option("--sample", sr.tokens, "instead of a loss: continue the prompt with N sampled tokens (one process)")
      ->check(kAtLeastOne);
  app.add_option("--prompt", sr.prompt, "--sample's prompt as text (byte-level models, vocab 256)");
  app.add_option("--prompt-tokens", prompt_tokens, "--sample's prompt as token ids, e.g. 464,3290");
  app.add_option("--temperature", sr.sampling.temperature, "--sample: softmax temperature (0: greedy)")->capture_default_str();
  app.add_option("--top-k", sr.sampling.top_k, "--sample: draw from the k most likely tokens (0: all)")->capture_default_str();
  app.add_option("--sample-seed", sr.seed, "--sample: seed of the draws")->capture_default_str();
  app.add_option("--batches", o.batches, "consecutive batches to average (default: every whole batch in the shard)")
      ->check(kAtLeastOne);
  app.add_option("--tp", o.tp, "tensor-parallel size")->check(kAtLeastOne);
  app.add_option("--pp", o.pp, "pipeline-parallel size (layers split evenly, earlier stages take the remainder)")
      ->check(kAtLeastOne);
  app.add_option("--heads", o.heads, "attention heads, for safetensors files without n_head metadata whose hidden "
                                     "size is not a GPT-2 size")
      ->check(kAtLeastOne);
  app.add_option("--save", o.save,
                 "also write the loaded weights to this file before evaluating (a format converter): .bin -> "
                 "llm.c checkpoint, anything else -> HF safetensors");
  app.add_option("--grads-out", o.grads_out,
                 "also write the gradient of the first batch's mean loss for every parameter (full shapes, by name) "
                 "to this float32 safetensors file");
  app.add_flag("--json", o.json, "also print one JSON object line (before the final 'loss' line)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (launcher_rank0()) std::fprintf(stderr, "gpt_eval: error: %s\nRun with --help for the options.\n", e.what());
    return triax::exit_before_mpi(2);
  }
  if (sr.tokens > 0) return sample_main(o, sr, prompt_tokens);
  for (const auto& [missing, name] : {std::pair{o.data.empty(), "--data"}, {o.batch == 0, "--batch"}, {o.seq == 0, "--seq"}})
    if (missing) {
      if (launcher_rank0()) std::fprintf(stderr, "gpt_eval: error: %s is required (unless --sample)\n", name);
      return triax::exit_before_mpi(2);
    }

  std::unique_ptr<triax::Bootstrap> boot;
  std::shared_ptr<triax::Communicator> world;
  try {
    boot = triax::Bootstrap::create();
    world = boot->world();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_eval: error: start-up failed: %s\n", e.what());
    return triax::exit_code_for(e);
  }
  triax::log::set_rank(world->size() > 1 ? world->rank() : -1);
  const int W = world->size();

  // Set-up (flags against the world, files, model) may fail on some ranks only; they agree before
  // anyone goes on, and the lowest failing rank prints its message.
  std::optional<triax::ProcessGrid> grid;
  std::optional<triax::WeightFile> wf;
  std::unique_ptr<triax::Dataset> data;
  triax::ParamStore store;  // its backend owns the chunk's buffers: declared first, destroyed last
  std::unique_ptr<triax::GptChunk> chunk;
  triax::GptConfig cfg;
  int64_t K = 0;
  std::string error;
  int code = 0;
  try {
    if (W % (o.tp * o.pp) != 0)
      TRIAX_THROW(ConfigError, "--tp {} x --pp {} = {} does not divide the {} processes", o.tp, o.pp,
                  o.tp * o.pp, W);
    if (triax::is_hf_dir(o.weights)) {
      cfg = triax::read_hf_config(o.weights);
      if (o.heads != 0 && o.heads != cfg.n_head)
        TRIAX_THROW(ConfigError, "--heads {} but {}/config.json says {} heads", o.heads, o.weights, cfg.n_head);
    } else {
      wf.emplace(o.weights, o.heads);
      cfg = wf->config();
    }
    if (o.seq > cfg.max_seq)
      TRIAX_THROW(ConfigError, "--seq {} is longer than the model's {} positions ({})", o.seq, cfg.max_seq,
                  o.weights);
    if (!o.grads_out.empty() && o.pp > 1 && cfg.tied_embeddings)
      TRIAX_THROW(ConfigError, "--grads-out with a tied embedding needs --pp 1 (its gradient is split over two stages)");
    if (o.pp > cfg.n_layer)
      TRIAX_THROW(ConfigError, "--pp {} is more than the model's {} layers", o.pp, cfg.n_layer);
    cfg.validate(o.tp);
    // In file order; token values are checked (file and offset named) as batches are read.
    data = triax::make_corpus_dataset(triax::open_corpus(o.data, cfg.vocab), 0, triax::DataOptions{false, false});
    const int64_t avail = data->num_samples(o.seq) / o.batch;
    K = o.batches > 0 ? o.batches : avail;
    if (avail < 1 || K > avail)
      TRIAX_THROW(IoError, "{} holds {} whole batches of {} x {} (+1 target), {} asked for", data->describe(), avail,
                  o.batch, o.seq, o.batches > 0 ? o.batches : 1);
    {  // Every rank checks the tokens of all K batches now, where set-up errors are agreed on, so a
       // token past the vocabulary stops the job here instead of inside the pipeline.
      std::vector<int32_t> x, y;
      for (int64_t k = 0; k < K; ++k) data->batch(k * o.batch, o.batch, o.seq, x, y);
    }
    grid.emplace(world, triax::GridShape{o.tp, o.pp, W / (o.tp * o.pp), 1, "tp-dp-pp"});
    const int s = grid->coord().pp;
    const int per = cfg.n_layer / o.pp, extra = cfg.n_layer % o.pp;
    const int first_layer = s * per + std::min(s, extra);
    const triax::ChunkSpec spec{first_layer, per + (s < extra ? 1 : 0), s == 0, s == o.pp - 1};
    chunk = std::make_unique<triax::GptChunk>(cfg, spec, grid->tp(), store, triax::Recompute::none);
    store.finalize();
    if (wf)
      wf->load(store, cfg, grid->tp());
    else
      triax::load_hf_dir(o.weights, store, cfg, grid->tp().rank(), grid->tp().size());
    if (!o.save.empty() && !cfg.is_gpt2()) {
      triax::save_hf_dir(o.save, cfg, store, *grid);
      if (world->rank() == 0) std::fprintf(stderr, "gpt_eval: wrote %s (HF model directory)\n", o.save.c_str());
    } else if (!o.save.empty()) {
      const auto fmt_out = triax::weight_format_for_path(o.save);
      triax::save_weights(o.save, fmt_out, cfg, store, *grid);
      if (world->rank() == 0)
        std::fprintf(stderr, "gpt_eval: wrote %s (%s)\n", o.save.c_str(),
                     std::string(triax::weight_format_name(fmt_out)).c_str());
    }
  } catch (const std::exception& e) {
    error = e.what();
    code = triax::exit_code_for(e);
  }
  int first_bad[1] = {code ? world->rank() : W};
  world->all_reduce(std::span<int>(first_bad), triax::ReduceOp::min).wait();
  if (first_bad[0] < W) {
    if (world->rank() == first_bad[0]) std::fprintf(stderr, "gpt_eval: error: %s\n", error.c_str());
    // Every rank exits with the reporting rank's code (docs/ERRORS.md).
    int codes[1] = {world->rank() == first_bad[0] ? code : 0};
    world->all_reduce(std::span<int>(codes), triax::ReduceOp::max).wait();
    return codes[0];
  }
  {
    // Weights full of NaN evaluate to "loss nan": say where it comes from.
    int64_t bad[1] = {0};
    for (float v : store.flat_params().first(store.numel())) bad[0] += !std::isfinite(v);
    world->all_reduce(std::span<int64_t>(bad), triax::ReduceOp::sum).wait();
    if (bad[0] > 0 && world->rank() == 0)
      std::fprintf(stderr, "gpt_eval: warning: %s: %lld parameter values are NaN or infinite (over all ranks); the loss "
                           "will not be finite\n", o.weights.c_str(), static_cast<long long>(bad[0]));
  }

  const std::string format = wf ? std::string(triax::weight_format_name(wf->format())) : "HF directory";
  try {
    if (!o.grads_out.empty()) {
      write_grads(o, *grid, cfg, *chunk, store, *data);
      if (world->rank() == 0) std::fprintf(stderr, "gpt_eval: wrote the gradients to %s\n", o.grads_out.c_str());
    }
    if (world->rank() == 0)
      std::fprintf(stderr, "gpt_eval: %s (%s): %s; tp %d pp %d dp %d; %lld batches of %d x %d\n", o.weights.c_str(),
                   format.c_str(), cfg.describe().c_str(), o.tp, o.pp,
                   W / (o.tp * o.pp), static_cast<long long>(K), o.batch, o.seq);
    const Result r = evaluate(o, *grid, cfg, *chunk, *data, K);
    double sum = 0;
    for (double l : r.per_batch) sum += l;  // fixed order: the same on every layout
    const double loss = sum / static_cast<double>(K);
    if (world->rank() == 0) {
      if (o.json) {
        nlohmann::json j;
        j["loss"] = loss;
        j["batch_losses"] = r.per_batch;
        j["batches"] = K;
        j["batch"] = o.batch;
        j["seq"] = o.seq;
        j["tokens"] = K * o.batch * o.seq;
        j["seconds"] = r.seconds;
        j["tokens_per_second"] = r.seconds > 0 ? static_cast<double>(K * o.batch * o.seq) / r.seconds : 0.0;
        j["weights"] = o.weights;
        j["format"] = format;
        j["data"] = o.data;
        j["layout"] = {{"tp", o.tp}, {"pp", o.pp}, {"dp", W / (o.tp * o.pp)}, {"world", W}};
        j["model"] = {{"n_layer", cfg.n_layer}, {"n_head", cfg.n_head},   {"n_embd", cfg.n_embd},
                      {"ffn", cfg.ffn_size()},  {"vocab", cfg.vocab},     {"padded_vocab", cfg.padded_vocab(o.tp)},
                      {"max_seq", cfg.max_seq}, {"params", cfg.num_params()}};
        std::printf("%s\n", j.dump().c_str());
      }
      if (!std::isfinite(loss))
        std::fprintf(stderr, "gpt_eval: warning: the mean loss is %s (non-finite weights, or logits that overflow)\n",
                     std::isnan(loss) ? "NaN" : "infinite");
      std::printf("loss %.9g\n", loss);
      std::fflush(stdout);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_eval: error (rank %d, host %s): %s\n", world->rank(), triax::host_name().c_str(), e.what());
    return triax::exit_code_for(e);
  }
}
