// Test fixture for gpt_eval: writes a random GPT-2 (HF safetensors and the same model as an llm.c
// checkpoint) and a random token shard, and computes the reference loss with a slow, plain
// double-precision GPT-2 forward that reads the HF (Conv1D) tensors directly, sharing no code with
// the model or the loader under test. Also compares a loss with the reference.
//   eval_fixture write DIR B T K         -> DIR/{model.safetensors, model.bin, truncated.bin, tokens.bin,
//                                           reference.txt}
//   eval_fixture compare DIR LOSS TOL    -> exit 1 unless |LOSS - ref| <= TOL * |ref|
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "triax/io/indexed_dataset.h"
#include "triax/io/safetensors.h"
#include "triax/io/token_shard.h"
#include "triax/model/weight_file.h"
#include "unit/checkpoint_test_util.h"

namespace {

using Mat = std::vector<double>;

// 3 layers (pp = 2 splits them unevenly), 4 heads (tp up to 4), vocab 101 (pads at every tp).
triax::GptConfig fixture_cfg() {
  triax::GptConfig c;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab = 101;
  c.max_seq = 32;
  c.vocab_pad_to = 8;
  return c;
}

struct Ref {
  triax::io::SafetensorsReader f;
  int L, C, NH, V, F;
  Mat get(const std::string& n) {
    auto v = f.read("transformer." + n);
    return Mat(v.begin(), v.end());
  }
};

void layernorm(const double* x, const Mat& w, const Mat& b, double* y, int C) {
  double m = 0, v = 0;
  for (int c = 0; c < C; ++c) m += x[c];
  m /= C;
  for (int c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
  v /= C;
  const double r = 1.0 / std::sqrt(v + 1e-5);
  for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * r * w[c] + b[c];
}

// y (out) = x (in) @ W (in, out) + b: HF's Conv1D.
void conv1d(const double* x, const Mat& W, const Mat& b, double* y, int in, int out) {
  for (int o = 0; o < out; ++o) {
    double s = b[o];
    for (int i = 0; i < in; ++i) s += x[i] * W[static_cast<size_t>(i) * out + o];
    y[o] = s;
  }
}

// The residual stream after the last block (T, C) of one sequence, in double precision.
Mat hidden_states(Ref& R, const std::vector<int>& tok) {
  const int T = static_cast<int>(tok.size()), C = R.C, NH = R.NH, hd = C / NH, F = R.F;
  const Mat wte = R.get("wte.weight"), wpe = R.get("wpe.weight");
  Mat x(static_cast<size_t>(T) * C);
  for (int t = 0; t < T; ++t)
    for (int c = 0; c < C; ++c) x[t * C + c] = wte[static_cast<size_t>(tok[t]) * C + c] + wpe[t * C + c];
  Mat ln(C), qkv(static_cast<size_t>(T) * 3 * C), y(static_cast<size_t>(T) * C), tmp(C), h(F);
  for (int l = 0; l < R.L; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    const Mat ln1w = R.get(p + "ln_1.weight"), ln1b = R.get(p + "ln_1.bias");
    const Mat aw = R.get(p + "attn.c_attn.weight"), ab = R.get(p + "attn.c_attn.bias");
    const Mat pw = R.get(p + "attn.c_proj.weight"), pb = R.get(p + "attn.c_proj.bias");
    const Mat ln2w = R.get(p + "ln_2.weight"), ln2b = R.get(p + "ln_2.bias");
    const Mat fw = R.get(p + "mlp.c_fc.weight"), fb = R.get(p + "mlp.c_fc.bias");
    const Mat mw = R.get(p + "mlp.c_proj.weight"), mb = R.get(p + "mlp.c_proj.bias");
    for (int t = 0; t < T; ++t) {
      layernorm(&x[t * C], ln1w, ln1b, ln.data(), C);
      conv1d(ln.data(), aw, ab, &qkv[static_cast<size_t>(t) * 3 * C], C, 3 * C);
    }
    for (int t = 0; t < T; ++t)
      for (int hh = 0; hh < NH; ++hh) {
        const double* q = &qkv[static_cast<size_t>(t) * 3 * C + hh * hd];
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int u = 0; u <= t; ++u) {
          const double* k = &qkv[static_cast<size_t>(u) * 3 * C + C + hh * hd];
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[i] * k[i];
          s[u] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[u]);
        }
        double z = 0;
        for (auto& v : s) z += (v = std::exp(v - mx));
        for (int i = 0; i < hd; ++i) {
          double acc = 0;
          for (int u = 0; u <= t; ++u) acc += s[u] / z * qkv[static_cast<size_t>(u) * 3 * C + 2 * C + hh * hd + i];
          y[t * C + hh * hd + i] = acc;
        }
      }
    for (int t = 0; t < T; ++t) {
      conv1d(&y[t * C], pw, pb, tmp.data(), C, C);
      for (int c = 0; c < C; ++c) x[t * C + c] += tmp[c];
      layernorm(&x[t * C], ln2w, ln2b, ln.data(), C);
      conv1d(ln.data(), fw, fb, h.data(), C, F);
      for (auto& v : h) v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
      conv1d(h.data(), mw, mb, tmp.data(), F, C);
      for (int c = 0; c < C; ++c) x[t * C + c] += tmp[c];
    }
  }
  return x;
}

// The logits (V) at position t of hidden states x: final LayerNorm, then the tied embedding.
std::vector<double> logits_at(Ref& R, const Mat& x, int t) {
  const int C = R.C;
  const Mat lfw = R.get("ln_f.weight"), lfb = R.get("ln_f.bias"), wte = R.get("wte.weight");
  Mat ln(C);
  layernorm(&x[static_cast<size_t>(t) * C], lfw, lfb, ln.data(), C);
  std::vector<double> logit(R.V);
  for (int v = 0; v < R.V; ++v) {
    double d = 0;
    for (int c = 0; c < C; ++c) d += ln[c] * wte[static_cast<size_t>(v) * C + c];
    logit[v] = d;
  }
  return logit;
}

// Mean cross-entropy of one sequence of T tokens with next-token targets.
double sequence_loss(Ref& R, const std::vector<int>& tok, const std::vector<int>& tgt) {
  const int T = static_cast<int>(tok.size());
  const Mat x = hidden_states(R, tok);
  double total = 0;
  for (int t = 0; t < T; ++t) {
    const std::vector<double> logit = logits_at(R, x, t);
    double mx = -1e300;
    for (double d : logit) mx = std::max(mx, d);
    double z = 0;
    for (double d : logit) z += std::exp(d - mx);
    total += (std::log(z) + mx) - logit[tgt[t]];
  }
  return total / T;
}

int write(const std::string& dir, int B, int T, int K) {
  // A fresh directory: files saved by an earlier run must not stand in for this run's.
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto cfg = fixture_cfg();
  const auto hf = triax::test::random_hf_model(cfg, 20240520, 0.15f);
  const std::string st = dir + "/model.safetensors";
  triax::test::write_hf_file(st, hf, "transformer.", {{"n_head", std::to_string(cfg.n_head)}, {"format", "pt"}});
  triax::FullWeights w;
  for (const auto& [name, shape] : triax::gpt_param_shapes(cfg)) w[name] = triax::test::triax_layout(hf, name, cfg.vocab);
  triax::write_llmc_checkpoint(dir + "/model.bin", cfg, w);
  {  // The llm.c file cut short by 100 bytes: gpt_eval must refuse it, naming the file.
    std::ifstream in(dir + "/model.bin", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(dir + "/truncated.bin", std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 100));
  }
  // Tokens: K whole batches, their +1 target, and a few more that must not be read.
  const int64_t n = static_cast<int64_t>(K) * B * T + 1 + 7;
  std::mt19937 rng(4711);
  std::uniform_int_distribution<int> u(0, cfg.vocab - 1);
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = static_cast<uint16_t>(u(rng));
  triax::io::write_token_shard(dir + "/tokens.bin", tokens);
  {  // The same tokens as a Megatron indexed dataset (two documents), and a shard with a token
     // past the vocabulary at position 40.
    const std::vector<int32_t> all(tokens.begin(), tokens.end());
    const size_t half = all.size() / 2;
    const std::vector<std::span<const int32_t>> docs = {std::span<const int32_t>(all).first(half),
                                                        std::span<const int32_t>(all).subspan(half)};
    triax::io::write_indexed_dataset(dir + "/tokens_text_document", docs);
    auto bad = tokens;
    bad[40] = 150;
    triax::io::write_token_shard(dir + "/bad_tokens.bin", bad);
  }

  Ref R{triax::io::SafetensorsReader(st), cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab, cfg.ffn_size()};
  double sum = 0;
  for (int k = 0; k < K; ++k) {
    double batch = 0;
    for (int b = 0; b < B; ++b) {
      const size_t s = static_cast<size_t>(k) * B * T + static_cast<size_t>(b) * T;
      std::vector<int> tok(T), tgt(T);
      for (int t = 0; t < T; ++t) {
        tok[t] = tokens[s + t];
        tgt[t] = tokens[s + t + 1];
      }
      batch += sequence_loss(R, tok, tgt) / B;
    }
    sum += batch;
  }
  const double ref = sum / K;
  std::ofstream(dir + "/reference.txt") << std::to_string(B) << " " << T << " " << K << " " << fmt::format("{:.17g}", ref)
                                        << "\n";
  std::printf("reference loss %.9g (B %d T %d K %d)\n", ref, B, T, K);
  return 0;
}

int compare(const std::string& dir, double loss, double tol) {
  std::ifstream in(dir + "/reference.txt");
  int B = 0, T = 0, K = 0;
  double ref = 0;
  if (!(in >> B >> T >> K >> ref)) {
    std::fprintf(stderr, "eval_fixture: cannot read %s/reference.txt\n", dir.c_str());
    return 2;
  }
  const double rel = std::abs(loss - ref) / std::abs(ref);
  std::printf("gpt_eval %.9g reference %.9g relative difference %.3g (tolerance %.1g)\n", loss, ref, rel, tol);
  return rel <= tol ? 0 : 1;
}

// The greedy continuation (argmax of the double-precision logits) of a prompt by N tokens, as
// "tokens a b c": what gpt_eval --sample N --top-k 1 must print.
int greedy(const std::string& dir, const std::string& prompt, int N) {
  const auto cfg = fixture_cfg();
  Ref R{triax::io::SafetensorsReader(dir + "/model.safetensors"), cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab,
        cfg.ffn_size()};
  std::vector<int> ctx;
  for (size_t at = 0; at < prompt.size();) {
    size_t end = prompt.find(',', at);
    if (end == std::string::npos) end = prompt.size();
    ctx.push_back(std::stoi(prompt.substr(at, end - at)));
    at = end + 1;
  }
  std::string out = "tokens";
  for (int n = 0; n < N; ++n) {
    const size_t start = ctx.size() > static_cast<size_t>(cfg.max_seq) ? ctx.size() - cfg.max_seq : 0;
    const std::vector<int> window(ctx.begin() + static_cast<ptrdiff_t>(start), ctx.end());
    const auto logit = logits_at(R, hidden_states(R, window), static_cast<int>(window.size()) - 1);
    const int best = static_cast<int>(std::max_element(logit.begin(), logit.end()) - logit.begin());
    ctx.push_back(best);
    out += " " + std::to_string(best);
  }
  std::printf("%s\n", out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "write" && argc == 6) return write(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
    if (cmd == "compare" && argc == 5) return compare(argv[2], std::atof(argv[3]), std::atof(argv[4]));
    if (cmd == "greedy" && argc == 5) return greedy(argv[2], argv[3], std::atoi(argv[4]));
    std::fprintf(stderr, "usage: eval_fixture write DIR B T K | compare DIR LOSS TOL | greedy DIR PROMPT(1,2,3) N\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "eval_fixture: %s\n", e.what());
    return 2;
  }
}
