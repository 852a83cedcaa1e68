// GPT-2 chunk forward/backward with Megatron tensor parallelism on the CPU path.
// Per layer (N = B*T tokens, C hidden, Cl = C/tp, Fl = ffn/tp, NHl = heads/tp):
//   ln1 = LN(x); qkv = ln1 Wqkv^T + b            column-parallel (copy_to_tp: bwd all-reduce)
//   att = causal_attention(qkv)                   heads split over tp
//   y = att Wproj^T -> all-reduce -> + bproj      row-parallel (reduce_from_tp)
//   x2 = x + y; ln2 = LN(x2); h = ln2 Wfc^T + b   column-parallel
//   z = gelu(h) Wfp^T -> all-reduce -> + bfp; out = x2 + z
#include "triax/model/gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "triax/model/shard.h"
#include "triax/ops/attention.h"
#include "triax/ops/embedding.h"
#include "triax/ops/gelu.h"
#include "triax/ops/layernorm.h"
#include "triax/ops/linear.h"
#include "triax/ops/residual.h"
#include "triax/ops/softmax_xent.h"
#include "triax/parallel/mappings.h"

namespace triax {

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  TRIAX_THROW(ConfigError, "unknown recompute mode '{}' (none, selective, full)", s);
}

std::string_view recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

struct GptChunk::Layer {
  int index;
  size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b;
  size_t fcw = SIZE_MAX, fcb = SIZE_MAX, fpw = SIZE_MAX, fpb = SIZE_MAX;  // dense MLP
  std::unique_ptr<MoeMlp> moe;                                            // or a MoE MLP
};

// One layer's activations for one micro-batch. Which are kept depends on the recompute mode.
struct GptChunk::Acts {
  std::vector<float> x;            // (N, C) layer input (always kept)
  std::vector<float> ln1, m1, r1;  // (N, C), (N), (N)
  std::vector<float> qkv;          // (N, 3Cl)
  std::vector<float> att, lse;     // (N, Cl), (B, NHl, T)
  std::vector<float> x2;           // (N, C) residual after attention
  std::vector<float> ln2, m2, r2;  // (N, C), (N), (N)
  std::vector<float> h, g;         // (N, Fl) pre- and post-GELU
};

// A weight-gradient GEMM held back by ZB-H1's B pass: dW += dout^T inp.
struct GptChunk::Deferred {
  size_t w;
  std::vector<float> dout, inp;
  int N, IC, OC;
};

// Buffers that live only inside one forward() or backward() call, reused from call to call:
// allocating and page-faulting them each time costs a few percent of a GPT-2-sized CPU step
// (the logits alone are (B*T, V/tp)).
struct GptChunk::Backs {
  std::vector<float> dx2, dfull, dg, dln, dln_local, datt, dqkv;
  std::vector<float> logits;
};

struct GptChunk::Slot {
  int B = 0, T = 0;
  float dloss = 1.0f;            // the micro-batch's loss weight (MoE aux gradients)
  std::vector<Acts> acts;        // per layer
  std::vector<int32_t> tokens;   // (B, T) embedding chunks
  std::vector<float> dx_head;    // (N, C) gradient at the head's input, from the fused head backward
  // Deferred weight GEMMs of ZB-H1's B pass; entries [0, n_deferred) are live. Entries are kept
  // (with their buffers' capacity) across micro-batches: fresh pages for these copies every step
  // made B + W far slower than a fused backward.
  std::vector<Deferred> deferred;
  size_t n_deferred = 0;
  bool pending_weights = false;
  bool has_forward = false;
};

namespace {
template <class V>
void ensure(V& v, size_t n) {
  if (v.size() != n) v.resize(n);
}
void add_bias(float* y, const float* b, int N, int C) {
  for (int i = 0; i < N; ++i) {
    float* row = y + static_cast<size_t>(i) * C;
    for (int c = 0; c < C; ++c) row[c] += b[c];
  }
}
void colsum_add(float* db, const float* d, int N, int C) {
  // Fixed row order: the same bits on every run and every thread count.
  for (int i = 0; i < N; ++i) {
    const float* row = d + static_cast<size_t>(i) * C;
    for (int c = 0; c < C; ++c) db[c] += row[c];
  }
}
}  // namespace

GptChunk::GptChunk(const GptConfig& cfg, const ChunkSpec& spec, Communicator& tp, ParamStore& store, Recompute rc,
                   bool wte_norm_owner, bool sequence_parallel, const ChunkMoe& moe)
    : cfg_(cfg), spec_(spec), tp_(tp), store_(store), rc_(rc), sp_(sequence_parallel && tp.size() > 1), moe_(moe),
      backs_(std::make_unique<Backs>()) {
  if (moe.every > 0) {
    if (!moe.ep) TRIAX_THROW(ConfigError, "MoE layers need the expert-parallel communicator");
    moe.cfg.validate(moe.ep->size());
    if (sp_)
      TRIAX_THROW(ConfigError, "MoE layers are replicated over TP and need the whole sequence: sequence parallelism "
                  "with MoE is not supported");
  }
  const int tps = tp.size();
  cfg.validate(tps);
  if (spec.num_layers < 0 || spec.first_layer < 0 || spec.first_layer + spec.num_layers > cfg.n_layer)
    TRIAX_THROW(ConfigError, "chunk layers [{}, {}) outside the model's {} layers", spec.first_layer,
                spec.first_layer + spec.num_layers, cfg.n_layer);
  C_ = cfg.n_embd;
  F_ = cfg.ffn_size();
  NH_ = cfg.n_head;
  Cl_ = C_ / tps;
  Fl_ = F_ / tps;
  NHl_ = NH_ / tps;
  vp_ = cfg.padded_vocab(tps);
  v0_ = tp.rank() * (vp_ / tps);
  v1_ = v0_ + vp_ / tps;
  const bool tp0 = tp.rank() == 0;

  auto add = [&](const std::string& name, std::vector<int64_t> full, TpSplit split, bool decay) {
    ParamSpec ps{name, full, split, decay, split != TpSplit::none || tp0};
    const size_t i = store_.add(ps, shard_shape(full, split, tps, name));
    owned_.push_back(i);
    return i;
  };
  const int64_t C = C_, F = F_;
  if (spec.embedding) {
    wte_ = add("transformer.wte.weight", {vp_, C}, TpSplit::rows, true);
    owns_wte_ = true;
    wpe_ = add("transformer.wpe.weight", {cfg.max_seq, C}, TpSplit::none, true);
  }
  for (int l = spec.first_layer; l < spec.first_layer + spec.num_layers; ++l) {
    const std::string p = fmt::format("transformer.h.{}.", l);
    Layer L{};
    L.index = l;
    L.ln1w = add(p + "ln_1.weight", {C}, TpSplit::none, false);
    L.ln1b = add(p + "ln_1.bias", {C}, TpSplit::none, false);
    L.qkvw = add(p + "attn.c_attn.weight", {3 * C, C}, TpSplit::qkv_rows, true);
    L.qkvb = add(p + "attn.c_attn.bias", {3 * C}, TpSplit::qkv_rows, false);
    L.projw = add(p + "attn.c_proj.weight", {C, C}, TpSplit::cols, true);
    L.projb = add(p + "attn.c_proj.bias", {C}, TpSplit::none, false);
    L.ln2w = add(p + "ln_2.weight", {C}, TpSplit::none, false);
    L.ln2b = add(p + "ln_2.bias", {C}, TpSplit::none, false);
    if (moe.every > 0 && (l + 1) % moe.every == 0) {
      // Replicated over TP: every TP rank runs the whole block with its own EP group.
      L.moe = std::make_unique<MoeMlp>(moe.cfg, l, C_, F_, *moe.ep, store_, tp0);
      for (size_t i : L.moe->param_indices()) owned_.push_back(i);
      L.moe->set_grad_ready_hook([this](size_t i) { ready(i); });
    } else {
      L.fcw = add(p + "mlp.c_fc.weight", {F, C}, TpSplit::rows, true);
      L.fcb = add(p + "mlp.c_fc.bias", {F}, TpSplit::rows, false);
      L.fpw = add(p + "mlp.c_proj.weight", {C, F}, TpSplit::cols, true);
      L.fpb = add(p + "mlp.c_proj.bias", {C}, TpSplit::none, false);
    }
    layers_.push_back(std::move(L));
  }
  if (spec.head) {
    lnf_w_ = add("transformer.ln_f.weight", {C}, TpSplit::none, false);
    lnf_b_ = add("transformer.ln_f.bias", {C}, TpSplit::none, false);
    // The tied LM head: the embedding table itself. Registered here only when no chunk of this
    // store holds the embedding yet (another stage, or a later chunk of this one, may).
    bool found = false;
    for (size_t i = 0; i < store_.size(); ++i)
      if (store_.info(i).spec.name == "transformer.wte.weight") {
        wte_ = i;
        found = true;
      }
    // Another chunk of this store holds the embedding and runs its backward later: it marks the
    // shared gradient ready, not the head.
    head_marks_wte_ = !found || spec.embedding;
    if (spec.embedding) head_marks_wte_ = false;  // this chunk's own embedding backward marks it
    if (!found) {
      ParamSpec ps{"transformer.wte.weight", {vp_, C}, TpSplit::rows, true, wte_norm_owner};
      wte_ = store_.add(ps, shard_shape({vp_, C}, TpSplit::rows, tps, ps.name));
      owned_.push_back(wte_);
      owns_wte_ = true;
    }
  }
}

GptChunk::~GptChunk() = default;

void GptChunk::init_params(uint64_t seed) {
  const int tps = tp_.size(), r = tp_.rank();
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg_.n_layer));
  for (auto& L : layers_)
    if (L.moe) L.moe->init_params(seed, cfg_.n_layer);
  for (size_t i : owned_) {
    const auto& info = store_.info(i);
    const auto& name = info.spec.name;
    if (info.spec.expert || name.find(".moe.") != std::string::npos) continue;  // MoeMlp's own
    const auto& full = info.spec.full_shape;
    size_t n = 1;
    for (auto d : full) n *= static_cast<size_t>(d);
    std::vector<float> v(n, 0.0f);
    const bool is_bias = name.ends_with(".bias");
    if (name.find("ln_") != std::string::npos) {
      if (!is_bias) std::fill(v.begin(), v.end(), 1.0f);
    } else if (name == "transformer.wte.weight") {
      // Only the real vocabulary is random; padded rows stay zero, so the padding never changes
      // the values of real rows whatever tp pads to.
      auto real = init_normal(seed, name, static_cast<size_t>(cfg_.vocab) * C_, 0.02f);
      std::copy(real.begin(), real.end(), v.begin());
    } else if (!is_bias) {
      const bool proj = name.ends_with("c_proj.weight");
      v = init_normal(seed, name, n, proj ? proj_std : 0.02f);
    }
    const auto sh = shard_of(v, full, info.spec.split, r, tps);
    auto dst = store_.param(i);
    std::copy(sh.begin(), sh.end(), dst.begin());
  }
}

GptChunk::Slot& GptChunk::slot(int s, bool create) {
  auto it = slots_.find(s);
  if (it != slots_.end()) return *it->second;
  if (!create) TRIAX_THROW(ConfigError, "backward of micro-batch slot {} that has no forward activations", s);
  std::unique_ptr<Slot> p;
  if (!free_slots_.empty()) {
    p = std::move(free_slots_.back());
    free_slots_.pop_back();
  } else {
    p = std::make_unique<Slot>();
  }
  auto& ref = *p;
  slots_[s] = std::move(p);
  return ref;
}

void GptChunk::release(int s) {
  auto it = slots_.find(s);
  if (it == slots_.end()) return;
  it->second->n_deferred = 0;
  it->second->pending_weights = false;
  it->second->has_forward = false;
  free_slots_.push_back(std::move(it->second));
  slots_.erase(it);
}

void GptChunk::ready(size_t idx) {
  if (grad_ready_) grad_ready_(idx);
}

// LayerNorm of this rank's rows, gathered to all B*T rows when sequence parallel (the input of
// a column-parallel GEMM); mean and rstd are kept for this rank's rows.
void GptChunk::layernorm_gathered(const float* x, size_t w, size_t b, std::vector<float>& full,
                                  std::vector<float>& mean, std::vector<float>& rstd, int Nl) {
  const size_t NCl = static_cast<size_t>(Nl) * C_;
  ensure(mean, static_cast<size_t>(Nl));
  ensure(rstd, static_cast<size_t>(Nl));
  ensure(full, NCl * (sp_ ? tp_.size() : 1));
  if (!sp_) {
    ops::layernorm_forward(full.data(), mean.data(), rstd.data(), x, store_.param(w).data(), store_.param(b).data(),
                           Nl, C_);
    return;
  }
  std::vector<float> local(NCl);
  ops::layernorm_forward(local.data(), mean.data(), rstd.data(), x, store_.param(w).data(), store_.param(b).data(), Nl,
                         C_);
  tp::gather_from_sequence_parallel(tp_, local, full);
}

// Under SP, LayerNorm and row-parallel-bias gradients come from this rank's rows only: sum the
// micro-batch's partial gradients over TP, then add them to the store.
void GptChunk::add_sp_grads(std::initializer_list<size_t> params, std::vector<float>& partial) {
  tp::sum_over_tp(tp_, partial);
  size_t off = 0;
  for (size_t p : params) {
    auto g = store_.grad(p);
    for (size_t i = 0; i < g.size(); ++i) g[i] += partial[off + i];
    off += g.size();
  }
}

// Runs one layer forward on this rank's rows x (Nl, C) into out (Nl, C). keep_all: store every
// activation (none-mode, or a recompute pass); otherwise store what the recompute mode keeps.
void GptChunk::layer_forward(Layer& L, Acts& a, int slot, const float* x, float* out, int B, int T, bool keep_all,
                             bool training) {
  const int Nf = B * T, Nl = io_rows(B, T);
  const size_t NCf = static_cast<size_t>(Nf) * C_, NCl = static_cast<size_t>(Nl) * C_;
  auto& P = store_;
  ensure(a.x, NCl);
  if (a.x.data() != x) std::memcpy(a.x.data(), x, NCl * sizeof(float));
  ensure(a.qkv, static_cast<size_t>(Nf) * 3 * Cl_);
  ensure(a.att, static_cast<size_t>(Nf) * Cl_);
  ensure(a.lse, static_cast<size_t>(B) * NHl_ * T);
  ensure(a.x2, NCl);
  ensure(a.h, static_cast<size_t>(Nf) * Fl_);
  ensure(a.g, static_cast<size_t>(Nf) * Fl_);
  ensure(scratch_, NCf);

  layernorm_gathered(x, L.ln1w, L.ln1b, a.ln1, a.m1, a.r1, Nl);  // copy_to_tp: identity forward
  ops::linear_forward(a.qkv.data(), a.ln1.data(), P.param(L.qkvw).data(), P.param(L.qkvb).data(), Nf, C_, 3 * Cl_);
  ops::attention_forward(a.att.data(), a.lse.data(), a.qkv.data(), B, T, Cl_, NHl_);
  // Row-parallel projection: partial sums over the TP shards, then all-reduce (or reduce-scatter).
  float* y = sp_ ? scratch_.data() : a.x2.data();
  ops::linear_forward(y, a.att.data(), P.param(L.projw).data(), static_cast<const float*>(nullptr), Nf, Cl_, C_);
  if (sp_)
    tp::reduce_scatter_to_sequence_parallel(tp_, scratch_, a.x2);
  else
    tp::reduce_from_tp_forward(tp_, a.x2);
  add_bias(a.x2.data(), P.param(L.projb).data(), Nl, C_);
  ops::residual_forward(a.x2.data(), x, a.x2.data(), static_cast<int64_t>(NCl));
  layernorm_gathered(a.x2.data(), L.ln2w, L.ln2b, a.ln2, a.m2, a.r2, Nl);
  if (L.moe) {
    // MoE MLP, replicated over TP (no TP collective): out = x2 + MoE(ln2). It keeps its own
    // activations in its slot under every recompute mode.
    aux_sum_ += L.moe->forward(slot, Nf, a.ln2.data(), out, training);
    ops::residual_forward(out, a.x2.data(), out, static_cast<int64_t>(NCl));
    std::vector<float>().swap(a.h);
    std::vector<float>().swap(a.g);
    if (!keep_all && rc_ != Recompute::none) std::vector<float>().swap(a.ln2);
    return;
  }
  ops::linear_forward(a.h.data(), a.ln2.data(), P.param(L.fcw).data(), P.param(L.fcb).data(), Nf, C_, Fl_);
  ops::gelu_forward(a.g.data(), a.h.data(), static_cast<int64_t>(a.h.size()));
  float* z = sp_ ? scratch_.data() : out;
  ops::linear_forward(z, a.g.data(), P.param(L.fpw).data(), static_cast<const float*>(nullptr), Nf, Fl_, C_);
  if (sp_)
    tp::reduce_scatter_to_sequence_parallel(tp_, scratch_, std::span<float>(out, NCl));
  else
    tp::reduce_from_tp_forward(tp_, std::span<float>(out, NCl));
  add_bias(out, P.param(L.fpb).data(), Nl, C_);
  ops::residual_forward(out, a.x2.data(), out, static_cast<int64_t>(NCl));

  if (keep_all || rc_ == Recompute::none) return;
  // Drop what backward recomputes (capacity too, so the memory is really returned).
  auto drop = [](std::vector<float>& v) { std::vector<float>().swap(v); };
  drop(a.ln1);
  drop(a.ln2);
  drop(a.g);
  if (rc_ == Recompute::full) {
    drop(a.m1); drop(a.r1); drop(a.qkv); drop(a.att); drop(a.lse); drop(a.x2); drop(a.m2); drop(a.r2); drop(a.h);
  }
}

void GptChunk::linear_bwd(Slot& s, bool defer, float* dinp, size_t w, size_t b, const float* dout, const float* inp,
                          int N, int IC, int OC) {
  auto& P = store_;
  float* dbias = b == SIZE_MAX ? nullptr : P.grad(b).data();
  if (!defer) {
    ops::linear_backward(dinp, P.grad(w).data(), dbias, dout, inp, P.param(w).data(), N, IC, OC);
    return;
  }
  ops::linear_backward(dinp, static_cast<float*>(nullptr), dbias, dout, inp, P.param(w).data(), N, IC, OC);
  if (s.n_deferred == s.deferred.size()) s.deferred.emplace_back();
  Deferred& d = s.deferred[s.n_deferred++];
  d.w = w;
  d.dout.assign(dout, dout + static_cast<size_t>(N) * OC);
  d.inp.assign(inp, inp + static_cast<size_t>(N) * IC);
  d.N = N;
  d.IC = IC;
  d.OC = OC;
}

void GptChunk::layer_backward(Layer& L, Acts& a, Slot& s, int slot, const float* dout, float* dx, int B, int T,
                              bool defer) {
  const int Nf = B * T, Nl = io_rows(B, T);
  const size_t NCf = static_cast<size_t>(Nf) * C_, NCl = static_cast<size_t>(Nl) * C_;
  auto& P = store_;
  if (L.moe) {
    // MoE layers keep the attention half's activations whatever the mode (recomputing would
    // re-run the all-to-alls); only the first LayerNorm output is recomputed when dropped.
    if (rc_ != Recompute::none) layernorm_gathered(a.x.data(), L.ln1w, L.ln1b, a.ln1, a.m1, a.r1, Nl);
  } else if (rc_ == Recompute::full) {
    // Recompute the whole layer (TP collectives included) from its saved input.
    std::vector<float> out(NCl);
    layer_forward(L, a, slot, a.x.data(), out.data(), B, T, true, true);
  } else if (rc_ == Recompute::selective) {
    layernorm_gathered(a.x.data(), L.ln1w, L.ln1b, a.ln1, a.m1, a.r1, Nl);
    layernorm_gathered(a.x2.data(), L.ln2w, L.ln2b, a.ln2, a.m2, a.r2, Nl);
    ensure(a.g, a.h.size());
    ops::gelu_forward(a.g.data(), a.h.data(), static_cast<int64_t>(a.h.size()));
  }
  // Under SP the replicated parameters' gradients (LayerNorms, row-parallel biases) are partial:
  // collected here, summed over TP at the end of the layer.
  std::vector<float> spg(sp_ ? 6 * static_cast<size_t>(C_) : 0, 0.0f);
  float* g_ln1w = sp_ ? spg.data() : P.grad(L.ln1w).data();
  float* g_ln1b = sp_ ? spg.data() + C_ : P.grad(L.ln1b).data();
  float* g_projb = sp_ ? spg.data() + 2 * C_ : P.grad(L.projb).data();
  float* g_ln2w = sp_ ? spg.data() + 3 * C_ : P.grad(L.ln2w).data();
  float* g_ln2b = sp_ ? spg.data() + 4 * C_ : P.grad(L.ln2b).data();
  float* g_fpb = sp_ ? spg.data() + 5 * C_ : P.grad(L.fpb).data();

  // MLP: out = x2 + (gelu(h) Wfp^T + bfp). The row-parallel output's gradient reaches every
  // shard whole: identity (all-reduce's backward) or all-gather (reduce-scatter's backward).
  Backs& S = *backs_;
  std::vector<float>& dx2 = S.dx2;  // residual branch
  dx2.assign(dout, dout + NCl);
  std::vector<float>& dfull = S.dfull;
  if (L.moe) {
    // The MoE output's gradient is whole on every TP rank, and so is dln2: no TP collective.
    std::vector<float>& dln2 = S.dln;
    ensure(dln2, NCf);
    L.moe->backward(slot, dout, dln2.data(), s.dloss);
    ops::layernorm_backward(dx2.data(), P.grad(L.ln2w).data(), P.grad(L.ln2b).data(), dln2.data(), a.x2.data(),
                            P.param(L.ln2w).data(), a.m2.data(), a.r2.data(), Nl, C_, ops::GradMode::accumulate);
  } else {
  colsum_add(g_fpb, dout, Nl, C_);
  const float* dz = dout;
  if (sp_) {
    dfull.resize(NCf);
    tp::gather_from_sequence_parallel(tp_, std::span<const float>(dout, NCl), dfull);
    dz = dfull.data();
  }
  std::vector<float>& dg = S.dg;
  ensure(dg, static_cast<size_t>(Nf) * Fl_);
  linear_bwd(s, defer, dg.data(), L.fpw, SIZE_MAX, dz, a.g.data(), Nf, Fl_, C_);
  if (!defer) ready(L.fpw);
  ops::gelu_backward(dg.data(), a.h.data(), dg.data(), static_cast<int64_t>(dg.size()));
  std::vector<float>& dln2 = S.dln;
  std::vector<float>& dln2_local = S.dln_local;
  ensure(dln2, NCf);
  linear_bwd(s, defer, dln2.data(), L.fcw, L.fcb, dg.data(), a.ln2.data(), Nf, C_, Fl_);
  ready(L.fcb);
  if (!defer) ready(L.fcw);
  if (sp_) {
    dln2_local.resize(NCl);
    tp::reduce_scatter_to_sequence_parallel(tp_, dln2, dln2_local);
  } else {
    tp::copy_to_tp_backward(tp_, dln2);
  }
  ops::layernorm_backward(dx2.data(), g_ln2w, g_ln2b, sp_ ? dln2_local.data() : dln2.data(), a.x2.data(),
                          P.param(L.ln2w).data(), a.m2.data(), a.r2.data(), Nl, C_, ops::GradMode::accumulate);
  }
  // Attention: x2 = x + (att Wproj^T + bproj)
  std::memcpy(dx, dx2.data(), NCl * sizeof(float));
  colsum_add(g_projb, dx2.data(), Nl, C_);
  const float* dy = dx2.data();
  if (sp_) {
    tp::gather_from_sequence_parallel(tp_, dx2, dfull);
    dy = dfull.data();
  }
  std::vector<float>& datt = S.datt;
  ensure(datt, static_cast<size_t>(Nf) * Cl_);
  linear_bwd(s, defer, datt.data(), L.projw, SIZE_MAX, dy, a.att.data(), Nf, Cl_, C_);
  if (!defer) ready(L.projw);
  std::vector<float>& dqkv = S.dqkv;
  ensure(dqkv, static_cast<size_t>(Nf) * 3 * Cl_);
  ops::attention_backward(dqkv.data(), datt.data(), a.qkv.data(), a.lse.data(), B, T, Cl_, NHl_);
  std::vector<float>& dln1 = S.dln;
  std::vector<float>& dln1_local = S.dln_local;
  ensure(dln1, NCf);
  linear_bwd(s, defer, dln1.data(), L.qkvw, L.qkvb, dqkv.data(), a.ln1.data(), Nf, C_, 3 * Cl_);
  ready(L.qkvb);
  if (!defer) ready(L.qkvw);
  if (sp_) {
    dln1_local.resize(NCl);
    tp::reduce_scatter_to_sequence_parallel(tp_, dln1, dln1_local);
  } else {
    tp::copy_to_tp_backward(tp_, dln1);
  }
  ops::layernorm_backward(dx, g_ln1w, g_ln1b, sp_ ? dln1_local.data() : dln1.data(), a.x.data(),
                          P.param(L.ln1w).data(), a.m1.data(), a.r1.data(), Nl, C_, ops::GradMode::accumulate);
  if (sp_) add_sp_grads({L.ln1w, L.ln1b, L.projb, L.ln2w, L.ln2b, L.fpb}, spg);
  if (!L.moe) ready(L.fpb);
  for (size_t p : {L.ln2b, L.ln2w, L.projb, L.ln1b, L.ln1w}) ready(p);
  if (rc_ != Recompute::none) {
    auto drop = [](std::vector<float>& v) { std::vector<float>().swap(v); };
    drop(a.ln1); drop(a.ln2); drop(a.g);
    if (rc_ == Recompute::full) {
      drop(a.m1); drop(a.r1); drop(a.qkv); drop(a.att); drop(a.lse); drop(a.x2); drop(a.m2); drop(a.r2); drop(a.h);
    }
  }
}

float GptChunk::forward(int sl, int B, int T, const int32_t* tokens, const int32_t* targets, const float* x_in,
                        float* x_out, bool training, float dloss) {
  if (B < 1 || T < 1 || T > cfg_.max_seq)
    TRIAX_THROW(ConfigError, "micro-batch {} x {} tokens: need B >= 1 and 1 <= T <= max_seq {}", B, T, cfg_.max_seq);
  if (sp_ && (B * T) % tp_.size() != 0)
    TRIAX_THROW(ConfigError, "sequence parallelism splits the {} x {} = {} tokens of a micro-batch over tp={}: not divisible",
                B, T, B * T, tp_.size());
  if (spec_.embedding && !tokens) TRIAX_THROW(ConfigError, "the embedding chunk needs tokens");
  if (!spec_.embedding && !x_in) TRIAX_THROW(ConfigError, "a chunk without the embedding needs its input x_in");
  if (spec_.head && !targets) TRIAX_THROW(ConfigError, "the head chunk needs targets");
  Slot& s = slot(sl, true);
  if (s.has_forward) TRIAX_THROW(ConfigError, "micro-batch slot {} already holds a forward pass", sl);
  s.has_forward = true;
  s.B = B;
  s.T = T;
  const int Nf = B * T, Nl = io_rows(B, T);
  const size_t NCf = static_cast<size_t>(Nf) * C_, NCl = static_cast<size_t>(Nl) * C_;
  const int row0 = sp_ ? tp_.rank() * Nl : 0;  // first global row of this rank's rows
  auto& P = store_;
  s.acts.resize(layers_.size());

  std::vector<float> cur(NCl), next(NCl);
  if (spec_.embedding) {
    for (int i = 0; i < Nf; ++i)
      if (tokens[i] < 0 || tokens[i] >= cfg_.vocab)
        TRIAX_THROW(ConfigError, "token {} at position {} is outside the vocabulary [0, {})", tokens[i], i,
                    cfg_.vocab);
    s.tokens.assign(tokens, tokens + Nf);
    // Vocab-parallel lookup: rows outside this shard give zeros, the all-reduce (or
    // reduce-scatter) fills them in.
    std::vector<float> emb(NCf);
    ops::embedding_forward(emb.data(), tokens, P.param(wte_).data(), static_cast<const float*>(nullptr), B, T, C_, vp_,
                           v0_, v1_);
    if (sp_) {
      tp::reduce_scatter_to_sequence_parallel(tp_, emb, cur);
    } else {
      tp::reduce_from_tp_forward(tp_, emb);
      cur.swap(emb);
    }
    const float* wpe = P.param(wpe_).data();
    for (int i = 0; i < Nl; ++i) {
      float* row = cur.data() + static_cast<size_t>(i) * C_;
      const float* pos = wpe + static_cast<size_t>((row0 + i) % T) * C_;
      for (int c = 0; c < C_; ++c) row[c] += pos[c];
    }
  } else {
    std::memcpy(cur.data(), x_in, NCl * sizeof(float));
  }
  s.dloss = dloss;
  if (training) {
    for (size_t l = 0; l < layers_.size(); ++l) {
      layer_forward(layers_[l], s.acts[l], sl, cur.data(), next.data(), B, T, false, true);
      std::swap(cur, next);
    }
  } else {
    // Forward only: one scratch set of activations serves every layer.
    s.acts.resize(1);
    for (auto& L : layers_) {
      layer_forward(L, s.acts[0], sl, cur.data(), next.data(), B, T, true, false);
      std::swap(cur, next);
    }
    s.acts.clear();
  }
  float loss = 0.0f;
  if (!spec_.head) {
    std::memcpy(x_out, cur.data(), NCl * sizeof(float));
  } else {
    for (int i = 0; i < Nf; ++i)
      if (targets[i] < 0 || targets[i] >= cfg_.vocab)
        TRIAX_THROW(ConfigError, "target {} at position {} is outside the vocabulary [0, {})", targets[i], i,
                    cfg_.vocab);
    std::vector<float> lnf, mf, rf;
    layernorm_gathered(cur.data(), lnf_w_, lnf_b_, lnf, mf, rf, Nl);  // lnf: (Nf, C)
    const int Vl = v1_ - v0_;
    std::vector<float>& logits = backs_->logits;  // (N, V/tp): never gathered
    ensure(logits, static_cast<size_t>(Nf) * Vl);
    ops::linear_forward(logits.data(), lnf.data(), P.param(wte_).data(), static_cast<const float*>(nullptr), Nf, C_,
                        Vl);
    std::vector<float> rowmax(Nf), stats(2 * static_cast<size_t>(Nf)), losses(Nf), lse(Nf);
    ops::xent_shard_max(rowmax.data(), logits.data(), Nf, Vl, v0_, cfg_.vocab);
    tp::max_over_tp(tp_, rowmax);
    ops::xent_shard_sumexp(stats.data(), logits.data(), rowmax.data(), Nf, Vl, v0_, cfg_.vocab);
    ops::xent_shard_target_logit(stats.data() + Nf, logits.data(), targets, Nf, Vl, v0_, cfg_.vocab);
    tp::sum_over_tp(tp_, stats);
    ops::xent_loss_from_stats(losses.data(), lse.data(), rowmax.data(), stats.data(), stats.data() + Nf, Nf);
    double sum = 0.0;
    for (float l : losses) sum += l;
    loss = static_cast<float>(sum / Nf);
    if (training) {
      // Fused head backward: the loss gradient is known now.
      ops::xent_shard_backward(logits.data(), logits.data(), lse.data(), targets, dloss / static_cast<float>(Nf), Nf,
                               Vl, v0_, cfg_.vocab);
      std::vector<float> dlnf(NCf), dlnf_local;
      ops::linear_backward(dlnf.data(), P.grad(wte_).data(), static_cast<float*>(nullptr), logits.data(), lnf.data(),
                           P.param(wte_).data(), Nf, C_, Vl);
      if (sp_) {
        dlnf_local.resize(NCl);
        tp::reduce_scatter_to_sequence_parallel(tp_, dlnf, dlnf_local);
      } else {
        tp::copy_to_tp_backward(tp_, dlnf);
      }
      ensure(s.dx_head, NCl);
      std::vector<float> spg(sp_ ? 2 * static_cast<size_t>(C_) : 0, 0.0f);
      ops::layernorm_backward(s.dx_head.data(), sp_ ? spg.data() : P.grad(lnf_w_).data(),
                              sp_ ? spg.data() + C_ : P.grad(lnf_b_).data(), sp_ ? dlnf_local.data() : dlnf.data(),
                              cur.data(), P.param(lnf_w_).data(), mf.data(), rf.data(), Nl, C_);
      if (sp_) add_sp_grads({lnf_w_, lnf_b_}, spg);
    }
  }
  if (!training) release(sl);
  return loss;
}

void GptChunk::backward(int sl, const float* dx_out, float* dx_in, bool defer) {
  Slot& s = slot(sl, false);
  if (!s.has_forward) TRIAX_THROW(ConfigError, "backward of micro-batch slot {} before its forward", sl);
  const int B = s.B, T = s.T, Nl = io_rows(B, T);
  const size_t NCl = static_cast<size_t>(Nl) * C_;
  if (!spec_.embedding && !dx_in) TRIAX_THROW(ConfigError, "a chunk without the embedding must return dx_in");
  std::vector<float> d(NCl), dnext(NCl);
  if (spec_.head) {
    // The head's gradients were accumulated in forward; they are final now.
    ready(lnf_b_);
    ready(lnf_w_);
    if (head_marks_wte_) ready(wte_);
    std::memcpy(d.data(), s.dx_head.data(), NCl * sizeof(float));
  } else {
    if (!dx_out) TRIAX_THROW(ConfigError, "a chunk without the head needs dx_out");
    std::memcpy(d.data(), dx_out, NCl * sizeof(float));
  }
  for (size_t l = layers_.size(); l-- > 0;) {
    layer_backward(layers_[l], s.acts[l], s, sl, d.data(), dnext.data(), B, T, defer);
    std::swap(d, dnext);
  }
  if (spec_.embedding) {
    if (sp_) {
      // Position gradients from this rank's rows, summed over TP; the vocab-parallel table needs
      // every row's gradient (all-gather: reduce-scatter's backward).
      std::vector<float> dwpe(static_cast<size_t>(T) * C_, 0.0f);
      const int row0 = tp_.rank() * Nl;
      for (int i = 0; i < Nl; ++i) {
        float* dst = dwpe.data() + static_cast<size_t>((row0 + i) % T) * C_;
        const float* src = d.data() + static_cast<size_t>(i) * C_;
        for (int c = 0; c < C_; ++c) dst[c] += src[c];
      }
      tp::sum_over_tp(tp_, dwpe);
      auto g = store_.grad(wpe_);
      for (size_t i = 0; i < dwpe.size(); ++i) g[i] += dwpe[i];
      std::vector<float> dfull(static_cast<size_t>(B) * T * C_);
      tp::gather_from_sequence_parallel(tp_, d, dfull);
      ops::embedding_backward(store_.grad(wte_).data(), static_cast<float*>(nullptr), dfull.data(), s.tokens.data(), B,
                              T, C_, vp_, v0_, v1_);
    } else {
      // reduce_from_tp's backward is the identity: every TP rank holds the full d.
      ops::embedding_backward(store_.grad(wte_).data(), store_.grad(wpe_).data(), d.data(), s.tokens.data(), B, T, C_,
                              vp_, v0_, v1_);
    }
    ready(wpe_);
    ready(wte_);
  } else {
    std::memcpy(dx_in, d.data(), NCl * sizeof(float));
  }
  if (defer && s.n_deferred > 0) {
    s.pending_weights = true;
    s.acts.clear();
    s.has_forward = false;
  } else {
    release(sl);
  }
}

void GptChunk::backward_weight(int sl) {
  auto it = slots_.find(sl);
  if (it == slots_.end() || !it->second->pending_weights) {
    return;  // nothing deferred (the B pass ran without deferral, or there are no layers)
  }
  Slot& s = *it->second;
  for (size_t i = 0; i < s.n_deferred; ++i) {
    Deferred& d = s.deferred[i];
    ops::linear_backward(static_cast<float*>(nullptr), store_.grad(d.w).data(), static_cast<float*>(nullptr),
                         d.dout.data(), d.inp.data(), store_.param(d.w).data(), d.N, d.IC, d.OC);
    ready(d.w);
  }
  release(sl);
}

double GptChunk::take_aux_loss() {
  const double a = aux_sum_;
  aux_sum_ = 0;
  return a;
}

int GptChunk::moe_layers() const {
  int n = 0;
  for (const auto& L : layers_) n += L.moe != nullptr;
  return n;
}

size_t GptChunk::activation_floats(int B, int T) const {
  const size_t N = static_cast<size_t>(B) * T, Nl = static_cast<size_t>(io_rows(B, T)), C = C_;
  size_t per_layer = Nl * C;  // x: this rank's rows under sequence parallelism
  if (rc_ != Recompute::full) {
    // mean/rstd x2, qkv, att, lse, x2, h
    per_layer += 4 * Nl + N * 3 * Cl_ + N * Cl_ + static_cast<size_t>(B) * NHl_ * T + Nl * C + N * Fl_;
    if (rc_ == Recompute::none) per_layer += 2 * N * C + N * Fl_;  // gathered LayerNorm outputs, gelu
  }
  size_t total = per_layer * layers_.size();
  if (spec_.embedding) total += N;       // tokens (int32, counted as one float each)
  if (spec_.head) total += Nl * C;       // dx_head
  return total;
}

}  // namespace triax
