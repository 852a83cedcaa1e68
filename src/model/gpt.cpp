// GPT-2 chunk forward/backward with Megatron tensor parallelism, every buffer and op on the Backend.
// Per layer (N = B*T tokens, C hidden, Cl = C/tp, Fl = ffn/tp, NHl = heads/tp):
//   ln1 = LN(x); qkv = ln1 Wqkv^T + b            column-parallel (copy_to_tp: bwd all-reduce)
//   att = causal_attention(qkv)                   heads split over tp
//   y = att Wproj^T -> all-reduce -> + bproj      row-parallel (reduce_from_tp)
//   x2 = x + y; ln2 = LN(x2); h = ln2 Wfc^T + b   column-parallel
//   z = gelu(h) Wfp^T -> all-reduce -> + bfp; out = x2 + z
#include "triax/model/gpt.h"

#include <algorithm>
#include <cmath>

#include "triax/model/param_shards.h"
#include "triax/parallel/mappings.h"

namespace triax {

struct GptChunk::Layer {
  int index;
  size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b;
  size_t fcw = SIZE_MAX, fcb = SIZE_MAX, fpw = SIZE_MAX, fpb = SIZE_MAX;  // dense MLP
  std::unique_ptr<MoeMlp> moe;                                            // or a MoE MLP
};

// One layer's activations for one micro-batch (backend buffers). Which are kept depends on the
// recompute mode; a dropped one is an undefined Tensor (its memory returned to the backend).
struct GptChunk::Acts {
  Tensor x;            // (Nl, C) layer input (always kept)
  Tensor ln1, m1, r1;  // (N, C), (Nl), (Nl)
  Tensor qkv;          // (N, 3Cl)
  Tensor att, lse;     // (N, Cl), (B, NHl, T)
  Tensor x2;           // (Nl, C) residual after attention
  Tensor ln2, m2, r2;  // (N, C), (Nl), (Nl)
  Tensor h, g;         // (N, Fl) pre- and post-GELU
};

// A weight-gradient GEMM held back by ZB-H1's B pass: dW += dout^T inp.
struct GptChunk::Deferred {
  size_t w;
  Tensor dout, inp;
  int N, IC, OC;
};

// Buffers that live only inside one forward() or backward() call, reused from call to call:
// allocating and page-faulting them each time costs a few percent of a GPT-2-sized CPU step
// (the logits alone are (B*T, V/tp)).
struct GptChunk::Backs {
  Tensor dx2, dfull, dg, dln, dln_local, datt, dqkv;
  Tensor logits;
  Tensor cur, next, d, dnext, recomputed, ln_local, emb, spg, dwpe;
  Tensor lnf, mf, rf, rowmax, stats, losses, lse, dlnf, dlnf_local, targets;
};

struct GptChunk::Slot {
  int B = 0, T = 0;
  float dloss = 1.0f;  // the micro-batch's loss weight (MoE aux gradients)
  std::vector<Acts> acts;  // per layer
  Tensor tokens;           // (B, T) int32, embedding chunks
  Tensor dx_head;          // (Nl, C) gradient at the head's input, from the fused head backward
  // Deferred weight GEMMs of ZB-H1's B pass; entries [0, n_deferred) are live. Entries are kept
  // (with their buffers) across micro-batches: fresh pages for these copies every step made
  // B + W far slower than a fused backward.
  std::vector<Deferred> deferred;
  size_t n_deferred = 0;
  bool pending_weights = false;
  bool has_forward = false;
};

namespace {
// The first n elements of a dense buffer (itself when it holds exactly n).
Tensor head_of(const Tensor& t, size_t n) {
  return static_cast<size_t>(t.numel()) == n ? t : t.slice(0, static_cast<int64_t>(n));
}
}  // namespace

void GptChunk::ensure(Tensor& t, size_t n, DType dtype) {
  if (!t.defined() || static_cast<size_t>(t.numel()) != n || t.dtype() != dtype)
    t = be_.empty(Shape{static_cast<int64_t>(n)}, dtype);
}

// Parameter i's compute view (ParamStore::weight_t: the bf16/fp16 compute copy under mixed
// precision, else the master) or, with grad, its gradient's; made on first use; both caches
// follow the store's size.
const Tensor& GptChunk::view(size_t i, bool grad) {
  if (pview_.size() != store_.size() || gview_.size() != store_.size()) {
    pview_.assign(store_.size(), Tensor());
    gview_.assign(store_.size(), Tensor());
  }
  Tensor& v = grad ? gview_[i] : pview_[i];
  if (!v.defined()) v = grad ? store_.grad_t(i) : store_.weight_t(i);
  return v;
}

const Tensor& GptChunk::P(size_t i) { return view(i, false); }
const Tensor& GptChunk::G(size_t i) { return view(i, true); }

GptChunk::GptChunk(const GptConfig& cfg, const ChunkSpec& spec, Communicator& tp, ParamStore& store, Recompute rc,
                   bool wte_norm_owner, bool sequence_parallel, const ChunkMoe& moe)
    : cfg_(cfg), spec_(spec), tp_(tp), store_(store), be_(store.backend()), dt_(be_.compute_dtype()),
      st_(be_.compute_dtype() == DType::f64 ? DType::f64 : DType::f32), gt_(store.dtype()), rc_(rc), sp_(sequence_parallel && tp.size() > 1), moe_(moe),
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
    store_.param_from_host(i, shard_of(v, full, info.spec.split, r, tps));
  }
  store_.refresh_compute_copy();  // the layers read the copy (nothing to do without one)
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
void GptChunk::layernorm_gathered(const Tensor& x, size_t w, size_t b, Tensor& full, Tensor& mean, Tensor& rstd,
                                  int Nl) {
  const size_t NCl = static_cast<size_t>(Nl) * C_;
  ensure(mean, static_cast<size_t>(Nl), st_);
  ensure(rstd, static_cast<size_t>(Nl), st_);
  ensure(full, NCl * (sp_ ? tp_.size() : 1));
  if (!sp_) {
    be_.layernorm_forward(full, mean, rstd, x, P(w), P(b), Nl, C_);
    return;
  }
  Tensor& local = backs_->ln_local;
  ensure(local, NCl);
  be_.layernorm_forward(local, mean, rstd, x, P(w), P(b), Nl, C_);
  tp::gather_from_sequence_parallel(tp_, be_, local, full);
}

// Under SP, LayerNorm and row-parallel-bias gradients come from this rank's rows only: sum the
// micro-batch's partial gradients over TP, then add them to the store.
void GptChunk::add_sp_grads(std::initializer_list<size_t> params, const Tensor& partial) {
  tp::sum_over_tp(tp_, be_, partial);
  int64_t off = 0;
  for (size_t p : params) {
    const Tensor& g = G(p);
    be_.axpy(g, 1.0, partial.slice(off, off + g.numel()));
    off += g.numel();
  }
}

// Runs one layer forward on this rank's rows x (Nl, C) into out (Nl, C). keep_all: store every
// activation (none-mode, or a recompute pass); otherwise store what the recompute mode keeps.
void GptChunk::layer_forward(Layer& L, Acts& a, int slot, const Tensor& x, const Tensor& out, int B, int T,
                             bool keep_all, bool training) {
  const int Nf = B * T, Nl = io_rows(B, T);
  const size_t NCf = static_cast<size_t>(Nf) * C_, NCl = static_cast<size_t>(Nl) * C_;
  ensure(a.x, NCl);
  if (a.x.raw_data() != x.raw_data()) be_.copy(a.x, x);
  ensure(a.qkv, static_cast<size_t>(Nf) * 3 * Cl_);
  ensure(a.att, static_cast<size_t>(Nf) * Cl_);
  ensure(a.lse, static_cast<size_t>(B) * NHl_ * T, st_);
  ensure(a.x2, NCl);
  ensure(scratch_, NCf);

  layernorm_gathered(x, L.ln1w, L.ln1b, a.ln1, a.m1, a.r1, Nl);  // copy_to_tp: identity forward
  be_.linear_forward(a.qkv, a.ln1, P(L.qkvw), P(L.qkvb), Nf, C_, 3 * Cl_);
  be_.attention_forward(a.att, a.lse, a.qkv, B, T, Cl_, NHl_);
  // Row-parallel projection: partial sums over the TP shards, then all-reduce (or reduce-scatter).
  const Tensor& y = sp_ ? scratch_ : a.x2;
  be_.linear_forward(y, a.att, P(L.projw), Tensor(), Nf, Cl_, C_);
  if (sp_)
    tp::reduce_scatter_to_sequence_parallel(tp_, be_, scratch_, a.x2);
  else
    tp::reduce_from_tp_forward(tp_, be_, a.x2);
  be_.add_bias(a.x2, P(L.projb), Nl, C_);
  be_.residual(a.x2, x, a.x2);
  layernorm_gathered(a.x2, L.ln2w, L.ln2b, a.ln2, a.m2, a.r2, Nl);
  if (L.moe) {
    // MoE MLP, replicated over TP (no TP collective): out = x2 + MoE(ln2). It keeps its own
    // activations in its slot under every recompute mode.
    aux_sum_ += L.moe->forward(slot, Nf, a.ln2, out, training);
    be_.residual(out, a.x2, out);
    a.h = Tensor();
    a.g = Tensor();
    if (!keep_all && rc_ != Recompute::none) a.ln2 = Tensor();
    return;
  }
  ensure(a.h, static_cast<size_t>(Nf) * Fl_);
  ensure(a.g, static_cast<size_t>(Nf) * Fl_);
  be_.linear_forward(a.h, a.ln2, P(L.fcw), P(L.fcb), Nf, C_, Fl_);
  be_.gelu_forward(a.g, a.h);
  const Tensor& z = sp_ ? scratch_ : out;
  be_.linear_forward(z, a.g, P(L.fpw), Tensor(), Nf, Fl_, C_);
  if (sp_)
    tp::reduce_scatter_to_sequence_parallel(tp_, be_, scratch_, out);
  else
    tp::reduce_from_tp_forward(tp_, be_, out);
  be_.add_bias(out, P(L.fpb), Nl, C_);
  be_.residual(out, a.x2, out);

  if (keep_all || rc_ == Recompute::none) return;
  drop_recomputed(a);
}

// Drops what backward recomputes under the recompute mode (the memory goes back to the backend).
void GptChunk::drop_recomputed(Acts& a) {
  a.ln1 = Tensor();
  a.ln2 = Tensor();
  a.g = Tensor();
  if (rc_ == Recompute::full) {
    a.m1 = Tensor(); a.r1 = Tensor(); a.qkv = Tensor(); a.att = Tensor(); a.lse = Tensor();
    a.x2 = Tensor(); a.m2 = Tensor(); a.r2 = Tensor(); a.h = Tensor();
  }
}

void GptChunk::linear_bwd(Slot& s, bool defer, const Tensor& dinp, size_t w, size_t b, const Tensor& dout,
                          const Tensor& inp, int N, int IC, int OC) {
  const Tensor dbias = b == SIZE_MAX ? Tensor() : G(b);
  if (!defer) {
    be_.linear_backward(dinp, G(w), dbias, dout, inp, P(w), N, IC, OC);
    return;
  }
  be_.linear_backward(dinp, Tensor(), dbias, dout, inp, P(w), N, IC, OC);
  if (s.n_deferred == s.deferred.size()) s.deferred.emplace_back();
  Deferred& d = s.deferred[s.n_deferred++];
  d.w = w;
  const size_t no = static_cast<size_t>(N) * OC, ni = static_cast<size_t>(N) * IC;
  ensure(d.dout, no);
  ensure(d.inp, ni);
  be_.copy(d.dout, head_of(dout, no));
  be_.copy(d.inp, head_of(inp, ni));
  d.N = N;
  d.IC = IC;
  d.OC = OC;
}

// Before a layer's backward: whatever the recompute mode dropped in forward, computed again.
void GptChunk::recompute_for_backward(Layer& L, Acts& a, int slot, int B, int T) {
  const int Nl = io_rows(B, T);
  if (L.moe) {
    // MoE layers keep the attention half's activations whatever the mode (recomputing would
    // re-run the all-to-alls); only the first LayerNorm output is recomputed when dropped.
    if (rc_ != Recompute::none) layernorm_gathered(a.x, L.ln1w, L.ln1b, a.ln1, a.m1, a.r1, Nl);
  } else if (rc_ == Recompute::full) {
    // Recompute the whole layer (TP collectives included) from its saved input.
    Backs& S = *backs_;
    ensure(S.recomputed, static_cast<size_t>(Nl) * C_);
    layer_forward(L, a, slot, a.x, S.recomputed, B, T, true, true);
  } else if (rc_ == Recompute::selective) {
    layernorm_gathered(a.x, L.ln1w, L.ln1b, a.ln1, a.m1, a.r1, Nl);
    layernorm_gathered(a.x2, L.ln2w, L.ln2b, a.ln2, a.m2, a.r2, Nl);
    ensure(a.g, static_cast<size_t>(a.h.numel()));
    be_.gelu_forward(a.g, a.h);
  }
}

// Under SP the replicated parameters' gradients (LayerNorms, row-parallel biases, the final
// LayerNorm) are partial: collected in this zeroed scratch of 6 C values, summed over TP by
// add_sp_grads. Undefined without SP.
Tensor GptChunk::sp_partial_grads() {
  if (!sp_) return Tensor();
  Backs& S = *backs_;
  ensure(S.spg, 6 * static_cast<size_t>(C_), gt_);
  be_.fill(S.spg, 0.0);
  return S.spg;
}

// Where a layer's replicated parameters' gradients go: the store, or the SP partial scratch.
struct GptChunk::LayerGrads {
  Tensor spg;  // the SP partials (undefined without SP)
  Tensor ln1w, ln1b, projb, ln2w, ln2b, fpb;
};

GptChunk::LayerGrads GptChunk::layer_grads(const Layer& L) {
  LayerGrads g;
  g.spg = sp_partial_grads();
  auto part = [&](int k) { return g.spg.slice(static_cast<int64_t>(k) * C_, static_cast<int64_t>(k + 1) * C_); };
  g.ln1w = sp_ ? part(0) : G(L.ln1w);
  g.ln1b = sp_ ? part(1) : G(L.ln1b);
  g.projb = sp_ ? part(2) : G(L.projb);
  g.ln2w = sp_ ? part(3) : G(L.ln2w);
  g.ln2b = sp_ ? part(4) : G(L.ln2b);
  g.fpb = sp_ || L.moe ? (sp_ ? part(5) : Tensor()) : G(L.fpb);
  return g;
}

// The backward of layernorm_gathered: dfull (N, C) holds the partial sums of the LayerNorm
// output's gradient from the column-parallel GEMM after it; reduce-scattered to this rank's rows
// under SP (into dlocal), all-reduced otherwise, then LayerNorm backward into dx (Nl, C).
void GptChunk::layernorm_backward_scattered(Tensor& dfull, Tensor& dlocal, const Tensor& dx, const Tensor& gw,
                                            const Tensor& gb, const Tensor& x, size_t w, const Tensor& mean,
                                            const Tensor& rstd, int Nl, ops::GradMode mode) {
  if (sp_) {
    ensure(dlocal, static_cast<size_t>(Nl) * C_);
    tp::reduce_scatter_to_sequence_parallel(tp_, be_, dfull, dlocal);
  } else {
    tp::copy_to_tp_backward(tp_, be_, dfull);
  }
  be_.layernorm_backward(dx, gw, gb, sp_ ? dlocal : dfull, x, P(w), mean, rstd, Nl, C_, mode);
}

// MLP backward (dense or MoE) from the layer's output gradient dout, accumulated into the
// residual branch's gradient S.dx2 (which holds dout on entry).
void GptChunk::mlp_backward(Layer& L, Acts& a, Slot& s, int slot, const Tensor& dout, const LayerGrads& g, int B,
                            int T, bool defer) {
  const int Nf = B * T, Nl = io_rows(B, T);
  const size_t NCf = static_cast<size_t>(Nf) * C_, NCl = static_cast<size_t>(Nl) * C_;
  Backs& S = *backs_;
  Tensor& dx2 = S.dx2;
  if (L.moe) {
    // The MoE output's gradient is whole on every TP rank, and so is dln2: no TP collective.
    Tensor& dln2 = S.dln;
    ensure(dln2, NCf);
    L.moe->backward(slot, dout, dln2, s.dloss);
    be_.layernorm_backward(dx2, G(L.ln2w), G(L.ln2b), dln2, a.x2, P(L.ln2w), a.m2, a.r2, Nl, C_,
                           ops::GradMode::accumulate);
    return;
  }
  be_.bias_grad(g.fpb, dout, Nl, C_);
  Tensor dz = dout;
  if (sp_) {
    ensure(S.dfull, NCf);
    tp::gather_from_sequence_parallel(tp_, be_, head_of(dout, NCl), S.dfull);
    dz = S.dfull;
  }
  Tensor& dg = S.dg;
  ensure(dg, static_cast<size_t>(Nf) * Fl_);
  linear_bwd(s, defer, dg, L.fpw, SIZE_MAX, dz, a.g, Nf, Fl_, C_);
  if (!defer) ready(L.fpw);
  be_.gelu_backward(dg, a.h, dg);
  Tensor& dln2 = S.dln;
  ensure(dln2, NCf);
  linear_bwd(s, defer, dln2, L.fcw, L.fcb, dg, a.ln2, Nf, C_, Fl_);
  ready(L.fcb);
  if (!defer) ready(L.fcw);
  layernorm_backward_scattered(dln2, S.dln_local, dx2, g.ln2w, g.ln2b, a.x2, L.ln2w, a.m2, a.r2, Nl,
                               ops::GradMode::accumulate);
}

void GptChunk::layer_backward(Layer& L, Acts& a, Slot& s, int slot, const Tensor& dout, const Tensor& dx, int B,
                              int T, bool defer) {
  const int Nf = B * T, Nl = io_rows(B, T);
  const size_t NCf = static_cast<size_t>(Nf) * C_, NCl = static_cast<size_t>(Nl) * C_;
  Backs& S = *backs_;
  recompute_for_backward(L, a, slot, B, T);
  const LayerGrads g = layer_grads(L);

  // MLP: out = x2 + (gelu(h) Wfp^T + bfp). The row-parallel output's gradient reaches every
  // shard whole: identity (all-reduce's backward) or all-gather (reduce-scatter's backward).
  Tensor& dx2 = S.dx2;  // residual branch
  ensure(dx2, NCl);
  be_.copy(dx2, head_of(dout, NCl));
  mlp_backward(L, a, s, slot, dout, g, B, T, defer);
  // Attention: x2 = x + (att Wproj^T + bproj)
  be_.copy(head_of(dx, NCl), dx2);
  be_.bias_grad(g.projb, dx2, Nl, C_);
  Tensor dy = dx2;
  if (sp_) {
    ensure(S.dfull, NCf);
    tp::gather_from_sequence_parallel(tp_, be_, dx2, S.dfull);
    dy = S.dfull;
  }
  Tensor& datt = S.datt;
  ensure(datt, static_cast<size_t>(Nf) * Cl_);
  linear_bwd(s, defer, datt, L.projw, SIZE_MAX, dy, a.att, Nf, Cl_, C_);
  if (!defer) ready(L.projw);
  Tensor& dqkv = S.dqkv;
  ensure(dqkv, static_cast<size_t>(Nf) * 3 * Cl_);
  be_.attention_backward(dqkv, datt, a.qkv, a.att, a.lse, B, T, Cl_, NHl_);
  Tensor& dln1 = S.dln;
  ensure(dln1, NCf);
  linear_bwd(s, defer, dln1, L.qkvw, L.qkvb, dqkv, a.ln1, Nf, C_, 3 * Cl_);
  ready(L.qkvb);
  if (!defer) ready(L.qkvw);
  layernorm_backward_scattered(dln1, S.dln_local, head_of(dx, NCl), g.ln1w, g.ln1b, a.x, L.ln1w, a.m1, a.r1, Nl,
                               ops::GradMode::accumulate);
  if (sp_) {
    if (L.moe)
      add_sp_grads({L.ln1w, L.ln1b, L.projb}, g.spg.slice(0, 3 * static_cast<int64_t>(C_)));
    else
      add_sp_grads({L.ln1w, L.ln1b, L.projb, L.ln2w, L.ln2b, L.fpb}, g.spg);
  }
  if (!L.moe) ready(L.fpb);
  for (size_t p : {L.ln2b, L.ln2w, L.projb, L.ln1b, L.ln1w}) ready(p);
  if (rc_ != Recompute::none) drop_recomputed(a);
}

// The micro-batch's first activation in S.cur: the token embedding (vocab-parallel) plus the
// positions, of this rank's rows.
void GptChunk::embed(Slot& s, std::span<const int32_t> tokens, int B, int T) {
  const int Nf = B * T, Nl = io_rows(B, T);
  const size_t NCf = static_cast<size_t>(Nf) * C_;
  const int row0 = sp_ ? tp_.rank() * Nl : 0;  // first global row of this rank's rows
  Backs& S = *backs_;
  for (int i = 0; i < Nf; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab)
      TRIAX_THROW(ConfigError, "token {} at position {} is outside the vocabulary [0, {})", tokens[i], i, cfg_.vocab);
  ensure(s.tokens, static_cast<size_t>(Nf), DType::i32);
  be_.copy_from_host(s.tokens, tokens.data(), static_cast<size_t>(Nf) * sizeof(int32_t));
  // Vocab-parallel lookup: rows outside this shard give zeros, the all-reduce (or
  // reduce-scatter) fills them in.
  Tensor& emb = sp_ ? S.emb : S.cur;
  ensure(emb, NCf);
  be_.embedding_forward(emb, s.tokens, P(wte_), Nf, C_, v0_, v1_);
  if (sp_)
    tp::reduce_scatter_to_sequence_parallel(tp_, be_, emb, S.cur);
  else
    tp::reduce_from_tp_forward(tp_, be_, S.cur);
  be_.add_rows_periodic(S.cur, P(wpe_), Nl, C_, row0, T);
}

// The head on the last activation S.cur: final LayerNorm, tied LM head (vocab-parallel logits,
// never gathered) and the cross-entropy loss; when training, the head's backward fused in (its
// input gradient kept in s.dx_head). Returns the micro-batch's mean loss.
double GptChunk::head_forward(Slot& s, std::span<const int32_t> targets, int B, int T, bool training, float dloss) {
  const int Nf = B * T, Nl = io_rows(B, T);
  const size_t NCf = static_cast<size_t>(Nf) * C_, NCl = static_cast<size_t>(Nl) * C_;
  Backs& S = *backs_;
  for (int i = 0; i < Nf; ++i)
    if (targets[i] < 0 || targets[i] >= cfg_.vocab)
      TRIAX_THROW(ConfigError, "target {} at position {} is outside the vocabulary [0, {})", targets[i], i,
                  cfg_.vocab);
  ensure(S.targets, static_cast<size_t>(Nf), DType::i32);
  be_.copy_from_host(S.targets, targets.data(), static_cast<size_t>(Nf) * sizeof(int32_t));
  layernorm_gathered(S.cur, lnf_w_, lnf_b_, S.lnf, S.mf, S.rf, Nl);  // lnf: (Nf, C)
  const int Vl = v1_ - v0_;
  Tensor& logits = S.logits;  // (N, V/tp): never gathered
  ensure(logits, static_cast<size_t>(Nf) * Vl);
  be_.linear_forward(logits, S.lnf, P(wte_), Tensor(), Nf, C_, Vl);
  ensure(S.rowmax, static_cast<size_t>(Nf), st_);
  ensure(S.stats, 2 * static_cast<size_t>(Nf), st_);
  ensure(S.losses, static_cast<size_t>(Nf), st_);
  ensure(S.lse, static_cast<size_t>(Nf), st_);
  const Tensor sumexp = S.stats.slice(0, Nf), tlogit = S.stats.slice(Nf, 2 * static_cast<int64_t>(Nf));
  be_.xent_shard_max(S.rowmax, logits, Nf, Vl, v0_, cfg_.vocab);
  tp::max_over_tp(tp_, be_, S.rowmax);
  be_.xent_shard_sumexp(sumexp, logits, S.rowmax, Nf, Vl, v0_, cfg_.vocab);
  be_.xent_shard_target_logit(tlogit, logits, S.targets, Nf, Vl, v0_, cfg_.vocab);
  tp::sum_over_tp(tp_, be_, S.stats);
  be_.xent_loss_from_stats(S.losses, S.lse, S.rowmax, sumexp, tlogit, Nf);
  const double loss = be_.sum(S.losses) / Nf;  // the step's one read-back per micro-batch
  if (!training) return loss;
  // Fused head backward: the loss gradient is known now.
  be_.xent_shard_backward(logits, logits, S.lse, S.targets, static_cast<double>(dloss / static_cast<float>(Nf)), Nf,
                          Vl, v0_, cfg_.vocab);
  ensure(S.dlnf, NCf);
  be_.linear_backward(S.dlnf, G(wte_), Tensor(), logits, S.lnf, P(wte_), Nf, C_, Vl);
  ensure(s.dx_head, NCl);
  Tensor spg = sp_partial_grads();
  if (sp_) spg = spg.slice(0, 2 * static_cast<int64_t>(C_));
  layernorm_backward_scattered(S.dlnf, S.dlnf_local, s.dx_head, sp_ ? spg.slice(0, C_) : G(lnf_w_),
                               sp_ ? spg.slice(C_, 2 * C_) : G(lnf_b_), S.cur, lnf_w_, S.mf, S.rf, Nl,
                               ops::GradMode::overwrite);
  if (sp_) add_sp_grads({lnf_w_, lnf_b_}, spg);
  return loss;
}

double GptChunk::forward(int sl, int B, int T, std::span<const int32_t> tokens, std::span<const int32_t> targets,
                        const Tensor& x_in, const Tensor& x_out, bool training, float dloss) {
  if (B < 1 || T < 1 || T > cfg_.max_seq)
    TRIAX_THROW(ConfigError, "micro-batch {} x {} tokens: need B >= 1 and 1 <= T <= max_seq {}", B, T, cfg_.max_seq);
  if (sp_ && (B * T) % tp_.size() != 0)
    TRIAX_THROW(ConfigError, "sequence parallelism splits the {} x {} = {} tokens of a micro-batch over tp={}: not divisible",
                B, T, B * T, tp_.size());
  const int Nf = B * T, Nl = io_rows(B, T);
  const size_t NCl = static_cast<size_t>(Nl) * C_;
  if (spec_.embedding && tokens.size() < static_cast<size_t>(Nf))
    TRIAX_THROW(ConfigError, "the embedding chunk needs {} tokens, got {}", Nf, tokens.size());
  if (!spec_.embedding && !x_in.defined()) TRIAX_THROW(ConfigError, "a chunk without the embedding needs its input x_in");
  if (spec_.head && targets.size() < static_cast<size_t>(Nf))
    TRIAX_THROW(ConfigError, "the head chunk needs {} targets, got {}", Nf, targets.size());
  if (!spec_.head && !x_out.defined()) TRIAX_THROW(ConfigError, "a chunk without the head needs its output x_out");
  Slot& s = slot(sl, true);
  if (s.has_forward) TRIAX_THROW(ConfigError, "micro-batch slot {} already holds a forward pass", sl);
  s.has_forward = true;
  s.B = B;
  s.T = T;
  Backs& S = *backs_;
  s.acts.resize(layers_.size());

  ensure(S.cur, NCl);
  ensure(S.next, NCl);
  if (spec_.embedding)
    embed(s, tokens, B, T);
  else
    be_.copy(S.cur, head_of(x_in, NCl));
  s.dloss = dloss;
  if (training) {
    for (size_t l = 0; l < layers_.size(); ++l) {
      layer_forward(layers_[l], s.acts[l], sl, S.cur, S.next, B, T, false, true);
      std::swap(S.cur, S.next);
    }
  } else {
    // Forward only: one scratch set of activations serves every layer.
    s.acts.resize(1);
    for (auto& L : layers_) {
      layer_forward(L, s.acts[0], sl, S.cur, S.next, B, T, true, false);
      std::swap(S.cur, S.next);
    }
    s.acts.clear();
  }
  double loss = 0.0;
  if (!spec_.head)
    be_.copy(head_of(x_out, NCl), S.cur);
  else
    loss = head_forward(s, targets, B, T, training, dloss);
  if (!training) release(sl);
  return loss;
}

void GptChunk::backward(int sl, const Tensor& dx_out, const Tensor& dx_in, bool defer) {
  Slot& s = slot(sl, false);
  if (!s.has_forward) TRIAX_THROW(ConfigError, "backward of micro-batch slot {} before its forward", sl);
  const int B = s.B, T = s.T, Nl = io_rows(B, T), Nf = B * T;
  const size_t NCl = static_cast<size_t>(Nl) * C_;
  if (!spec_.embedding && !dx_in.defined()) TRIAX_THROW(ConfigError, "a chunk without the embedding must return dx_in");
  Backs& S = *backs_;
  ensure(S.d, NCl);
  ensure(S.dnext, NCl);
  if (spec_.head) {
    // The head's gradients were accumulated in forward; they are final now.
    ready(lnf_b_);
    ready(lnf_w_);
    if (head_marks_wte_) ready(wte_);
    be_.copy(S.d, s.dx_head);
  } else {
    if (!dx_out.defined()) TRIAX_THROW(ConfigError, "a chunk without the head needs dx_out");
    be_.copy(S.d, head_of(dx_out, NCl));
  }
  for (size_t l = layers_.size(); l-- > 0;) {
    layer_backward(layers_[l], s.acts[l], s, sl, S.d, S.dnext, B, T, defer);
    std::swap(S.d, S.dnext);
  }
  if (spec_.embedding) {
    if (sp_) {
      // Position gradients from this rank's rows, summed over TP; the vocab-parallel table needs
      // every row's gradient (all-gather: reduce-scatter's backward).
      ensure(S.dwpe, static_cast<size_t>(T) * C_, gt_);
      be_.fill(S.dwpe, 0.0);
      be_.sum_rows_periodic(S.dwpe, S.d, Nl, C_, tp_.rank() * Nl, T);
      tp::sum_over_tp(tp_, be_, S.dwpe);
      be_.axpy(G(wpe_).slice(0, static_cast<int64_t>(T) * C_), 1.0, S.dwpe);
      ensure(S.dfull, static_cast<size_t>(Nf) * C_);
      tp::gather_from_sequence_parallel(tp_, be_, S.d, S.dfull);
      be_.embedding_backward(G(wte_), S.dfull, s.tokens, Nf, C_, v0_, v1_);
    } else {
      // reduce_from_tp's backward is the identity: every TP rank holds the full d.
      be_.embedding_backward(G(wte_), S.d, s.tokens, Nf, C_, v0_, v1_);
      be_.sum_rows_periodic(G(wpe_), S.d, Nf, C_, 0, T);
    }
    ready(wpe_);
    ready(wte_);
  } else {
    be_.copy(head_of(dx_in, NCl), S.d);
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
    be_.linear_backward(Tensor(), G(d.w), Tensor(), d.dout, d.inp, P(d.w), d.N, d.IC, d.OC);
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
