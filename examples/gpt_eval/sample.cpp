// gpt_eval --sample (see sample.h). The model runs as two chunks: embedding + every layer (its
// output is the last hidden state) and the head's final LayerNorm + tied embedding, whose logits
// are taken at the last position; no KV cache, each token re-runs the window of the last
// max_seq tokens, which is enough for looking at a small model's output.
#include "sample.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>

#include <triax/core/error.h>
#include <triax/distributed/comm/self_comm.h>
#include <triax/model/weight_file.h>
#include <triax/model/gpt.h>
#include <triax/ops/layernorm.h>
#include <triax/ops/linear.h>

void run_sample(const SampleRequest& r) {
  r.sampling.validate();
  triax::WeightFile wf(r.weights, r.heads);
  const triax::GptConfig cfg = wf.config();
  const bool byte_level = cfg.vocab == 256;
  std::vector<int> ctx = r.prompt_tokens;
  if (!r.prompt.empty()) {
    if (!byte_level)
      TRIAX_THROW(ConfigError, "--prompt is text for byte-level models (vocab 256); {} has vocab {}: give "
                  "--prompt-tokens instead", r.weights, cfg.vocab);
    for (unsigned char c : r.prompt) ctx.push_back(c);
  }
  if (ctx.empty()) TRIAX_THROW(ConfigError, "--sample needs a prompt (--prompt TEXT or --prompt-tokens 1,2,3)");
  for (size_t i = 0; i < ctx.size(); ++i)
    if (ctx[i] < 0 || ctx[i] >= cfg.vocab)
      TRIAX_THROW(ConfigError, "prompt token {} at position {} is outside the vocabulary [0, {}) of {}", ctx[i], i,
                  cfg.vocab, r.weights);
  auto tp = triax::make_self_communicator("tp", 0);
  triax::ParamStore body_store, head_store;
  triax::GptChunk body(cfg, {0, cfg.n_layer, true, false}, *tp, body_store, triax::Recompute::none);
  triax::GptChunk head(cfg, {cfg.n_layer, 0, false, true}, *tp, head_store, triax::Recompute::none);
  body_store.finalize();
  head_store.finalize();
  wf.load(body_store, cfg, *tp);
  wf.load(head_store, cfg, *tp);
  // The head's weights as host copies: the last position's LayerNorm and logits run on the host.
  const auto lnw = head_store.param_to_host(head_store.find("transformer.ln_f.weight"));
  const auto lnb = head_store.param_to_host(head_store.find("transformer.ln_f.bias"));
  const auto wte = head_store.param_to_host(head_store.find("transformer.wte.weight"));  // (padded vocab, C)
  triax::Backend& be = body_store.backend();
  const int C = cfg.n_embd, V = cfg.vocab;
  std::mt19937_64 rng(r.seed);
  const size_t prompt_len = ctx.size();
  std::vector<float> hidden, ln(static_cast<size_t>(C)), logits(static_cast<size_t>(V));
  float mean = 0, rstd = 0;
  for (int64_t n = 0; n < r.tokens; ++n) {
    const size_t start = ctx.size() > static_cast<size_t>(cfg.max_seq) ? ctx.size() - cfg.max_seq : 0;
    const std::vector<int32_t> window(ctx.begin() + static_cast<ptrdiff_t>(start), ctx.end());
    const int T = static_cast<int>(window.size());
    const triax::Tensor out = be.empty(triax::Shape{static_cast<int64_t>(T) * C}, triax::DType::f32);
    body.forward(0, 1, T, window, {}, triax::Tensor(), out, /*training=*/false);
    hidden = triax::to_host_f32(be, out);
    triax::ops::layernorm_forward(ln.data(), &mean, &rstd, hidden.data() + static_cast<size_t>(T - 1) * C, lnw.data(),
                                  lnb.data(), 1, C);
    triax::ops::linear_forward(logits.data(), ln.data(), wte.data(), static_cast<const float*>(nullptr), 1, C, V);
    ctx.push_back(triax::sample_token(logits, r.sampling, rng));
  }
  const std::vector<int> out(ctx.begin() + static_cast<ptrdiff_t>(prompt_len), ctx.end());
  if (r.json) {
    nlohmann::json j;
    j["prompt_tokens"] = std::vector<int>(ctx.begin(), ctx.begin() + static_cast<ptrdiff_t>(prompt_len));
    j["tokens"] = out;
    j["temperature"] = r.sampling.temperature;
    j["top_k"] = r.sampling.top_k;
    j["seed"] = r.seed;
    if (byte_level) j["text"] = triax::decode_bytes(out);
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  if (byte_level) {
    std::printf("%s%s\n", triax::decode_bytes(std::vector<int>(ctx.begin(), ctx.begin() + static_cast<ptrdiff_t>(prompt_len))).c_str(),
                triax::decode_bytes(out).c_str());
  } else {
    std::string s = "tokens";
    for (int t : out) s += fmt::format(" {}", t);
    std::printf("%s\n", s.c_str());
  }
  std::fflush(stdout);
}
