// Transformer chunk forward/backward with Megatron tensor parallelism, every buffer and op on the
// Backend. Per layer (N = B*T tokens, C hidden, Cl = C/tp, Fl = ffn/tp, NHl = heads/tp, KVl =
// kv heads/tp, D head size):
//   ln1 = norm(x); qkv = ln1 Wqkv^T (+ b)          column-parallel (copy_to_tp: bwd all-reduce);
//                                                  (N, (NHl + 2 KVl) D), then RoPE on q and k
//   att = causal_attention(qkv)                     heads (and kv groups) split over tp
//   y = att Wproj^T -> all-reduce (-> + bproj)      row-parallel (reduce_from_tp)
//   x2 = x + y; ln2 = norm(x2); h = ln2 Wfc^T (+ b) column-parallel; SwiGLU: h = [gate | up]
//   z = act(h) Wfp^T -> all-reduce (-> + bfp); out = x2 + z   act: GELU, or silu(gate) * up
// norm is LayerNorm or RMSNorm; GPT-2 and the Llama family differ only in these choices.
#include "triax/model/gpt.h"

#include <algorithm>
#include <cmath>

#include "triax/model/param_shards.h"
#include "triax/parallel/mappings.h"

namespace triax {

struct GptChunk::Layer {
  int index;
  size_t ln1w, ln1b = SIZE_MAX, ln2w, ln2b = SIZE_MAX;  // norm biases: LayerNorm only
  ParamRef qkvw, qkvb, projw, projb;                    // biases undefined without them
  ParamRef fcw, fcb, fpw, fpb;                          // dense MLP (fcw: c_fc, or gate|up fused)
  std::unique_ptr<MoeMlp> moe;                          // or a MoE MLP
};

// One layer's activations for one micro-batch (backend buffers). Which are kept depends on the
// recompute mode; a dropped one is an undefined Tensor (its memory returned to the backend).
struct GptChunk::Acts {
  Tensor x;            // (Nl, C) layer input (always kept)
  Tensor ln1, m1, r1;  // (N, C), (Nl), (Nl); m1/m2 stay undefined under RMSNorm
  Tensor qkv;          // (N, Ql), q and k rotated when RoPE
  Tensor att, lse;     // (N, Cl), (B, NHl, T)
  Tensor x2;           // (Nl, C) residual after attention
  Tensor ln2, m2, r2;  // (N, C), (Nl), (Nl)
  Tensor h, g;         // (N, Hl) and (N, Fl): before and after the activation
};

// A weight-gradient GEMM held back by ZB-H1's B pass: dW += dout^T inp.
struct GptChunk::Deferred {
  ParamRef w;
  Tensor dout, inp;
  int N, IC, OC;
};

// Buffers that live only inside one forward() or backward() call, reused from call to call:
// allocating and page-faulting them each time costs a few percent of a GPT-2-sized CPU step
// (the logits alone are (B*T, V/tp)).
struct GptChunk::Backs {
  Tensor dx2, dfull, dg, dh, dln, dln_local, datt, dqkv;
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
Tensor GptChunk::view(size_t i, bool grad) {
  // A sharded store (ZeRO-2/3) serves views that move (gathered units, per-pass gradient buffers):
  // fetched on every use and never cached, so no old unit buffer stays alive through a cache.
  if (store_.views_move()) return grad ? store_.grad_t(i) : store_.weight_t(i);
  if (pview_.size() != store_.size() || gview_.size() != store_.size()) {
    pview_.assign(store_.size(), Tensor());
    gview_.assign(store_.size(), Tensor());
  }
  Tensor& v = grad ? gview_[i] : pview_[i];
  if (!v.defined()) v = grad ? store_.grad_t(i) : store_.weight_t(i);
  return v;
}

Tensor GptChunk::P(size_t i) { return view(i, false); }
Tensor GptChunk::G(size_t i) { return view(i, true); }

// The views of a fused weight span its parts in the flat buffers (adjacent by construction,
// checked in add_fused).
Tensor GptChunk::P(ParamRef r) {
  if (r.count == 1) return P(r.first);
  if (store_.views_move()) return store_.weights_of(r.first, r.count);
  if (fpview_.size() != store_.size()) fpview_.assign(store_.size(), Tensor());
  Tensor& v = fpview_[r.first];
  if (!v.defined()) v = store_.weights_of(r.first, r.count);
  return v;
}

Tensor GptChunk::G(ParamRef r) {
  if (r.count == 1) return G(r.first);
  if (store_.views_move()) return store_.grads_of(r.first, r.count);
  if (fgview_.size() != store_.size()) fgview_.assign(store_.size(), Tensor());
  Tensor& v = fgview_[r.first];
  if (!v.defined()) v = store_.grads_of(r.first, r.count);
  return v;
}

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
  KVl_ = cfg.kv_heads() / tps;
  D_ = cfg.head_dim();
  Ql_ = (NHl_ + 2 * KVl_) * D_;
  Hl_ = cfg.swiglu ? 2 * Fl_ : Fl_;
  vp_ = cfg.padded_vocab(tps);
  v0_ = tp.rank() * (vp_ / tps);
  v1_ = v0_ + vp_ / tps;
  if (spec.embedding) {
    store_.begin_unit("embedding");
    wte_ = add_param(cfg.embedding_param(), {vp_, C_}, TpSplit::rows, true, Init::vocab_normal);
    owns_wte_ = true;
    if (cfg.positions == PositionEmbedding::learned_absolute)
      wpe_ = add_param(cfg.is_gpt2() ? "transformer.wpe.weight" : "model.embed_positions.weight", {cfg.max_seq, C_},
                       TpSplit::none, true, Init::normal);
  }
  for (int l = spec.first_layer; l < spec.first_layer + spec.num_layers; ++l) register_layer(l, moe);
  if (spec.head) register_head(wte_norm_owner);
}

size_t GptChunk::add_param(const std::string& name, std::vector<int64_t> full, TpSplit split, bool decay, Init init) {
  const int tps = tp_.size();
  ParamSpec ps{name, full, split, decay, split != TpSplit::none || tp_.rank() == 0};
  const size_t i = store_.add(ps, shard_shape(full, split, tps, name));
  owned_.push_back(i);
  init_.emplace_back(i, init);
  return i;
}

// Parts registered back to back (each (rows, cols), or (rows) when cols is 0) form one weight.
GptChunk::ParamRef GptChunk::add_fused(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols,
                                       TpSplit split, bool decay, Init init) {
  ParamRef r;
  for (const auto& [name, rows] : parts) {
    std::vector<int64_t> full{rows};
    if (cols > 0) full.push_back(cols);
    const size_t i = add_param(name, full, split, decay, init);
    if (r.count == 0) r.first = i;
    const auto& prev = store_.info(i - (r.count > 0 ? 1 : 0));
    if (i != r.first + static_cast<size_t>(r.count) || (r.count > 0 && prev.offset + prev.numel != store_.info(i).offset))
      TRIAX_THROW(ConfigError, "parameter '{}' is not adjacent to '{}' in the store: a fused weight needs its parts "
                  "registered back to back", name, store_.info(r.first).spec.name);
    ++r.count;
  }
  return r;
}

void GptChunk::register_layer(int l, const ChunkMoe& moe) {
  const GptConfig& cfg = cfg_;
  const int64_t C = C_, F = F_, D = D_, NH = cfg.n_head, KV = cfg.kv_heads();
  const bool b = cfg.bias, ln_bias = cfg.norm_kind_has_bias();
  const auto single = [](size_t i) { return ParamRef{i, 1}; };
  Layer L{};
  L.index = l;
  store_.begin_unit(fmt::format("layer {}", l));  // the ZeRO-3 gather unit (its experts form their own)
  if (cfg.is_gpt2()) {
    const std::string p = fmt::format("transformer.h.{}.", l);
    L.ln1w = add_param(p + "ln_1.weight", {C}, TpSplit::none, false, Init::ones);
    L.ln1b = add_param(p + "ln_1.bias", {C}, TpSplit::none, false, Init::zeros);
    L.qkvw = single(add_param(p + "attn.c_attn.weight", {3 * C, C}, TpSplit::qkv_rows, true, Init::normal));
    L.qkvb = single(add_param(p + "attn.c_attn.bias", {3 * C}, TpSplit::qkv_rows, false, Init::zeros));
    L.projw = single(add_param(p + "attn.c_proj.weight", {C, C}, TpSplit::cols, true, Init::proj_normal));
    L.projb = single(add_param(p + "attn.c_proj.bias", {C}, TpSplit::none, false, Init::zeros));
    L.ln2w = add_param(p + "ln_2.weight", {C}, TpSplit::none, false, Init::ones);
    L.ln2b = add_param(p + "ln_2.bias", {C}, TpSplit::none, false, Init::zeros);
  } else {
    // The Llama family's names (HF LlamaForCausalLM); q/k/v shards adjacent: one fused GEMM.
    const std::string p = fmt::format("model.layers.{}.", l);
    L.ln1w = add_param(p + "input_layernorm.weight", {C}, TpSplit::none, false, Init::ones);
    if (ln_bias) L.ln1b = add_param(p + "input_layernorm.bias", {C}, TpSplit::none, false, Init::zeros);
    const std::string a = p + "self_attn.";
    L.qkvw = add_fused({{a + "q_proj.weight", NH * D}, {a + "k_proj.weight", KV * D}, {a + "v_proj.weight", KV * D}},
                       C, TpSplit::rows, true, Init::normal);
    if (b)
      L.qkvb = add_fused({{a + "q_proj.bias", NH * D}, {a + "k_proj.bias", KV * D}, {a + "v_proj.bias", KV * D}}, 0,
                         TpSplit::rows, false, Init::zeros);
    L.projw = single(add_param(a + "o_proj.weight", {C, C}, TpSplit::cols, true, Init::proj_normal));
    if (b) L.projb = single(add_param(a + "o_proj.bias", {C}, TpSplit::none, false, Init::zeros));
    L.ln2w = add_param(p + "post_attention_layernorm.weight", {C}, TpSplit::none, false, Init::ones);
    if (ln_bias) L.ln2b = add_param(p + "post_attention_layernorm.bias", {C}, TpSplit::none, false, Init::zeros);
  }
  if (moe.every > 0 && (l + 1) % moe.every == 0) {
    // Replicated over TP: every TP rank runs the whole block with its own EP group.
    MoeConfig mc = moe.cfg;
    mc.swiglu = cfg.swiglu;
    mc.bias = cfg.bias;
    mc.hf_names = !cfg.is_gpt2();
    L.moe = std::make_unique<MoeMlp>(mc, l, C_, F_, *moe.ep, store_, tp_.rank() == 0);
    L.moe->set_cp_group(moe.cp);
    for (size_t i : L.moe->param_indices()) owned_.push_back(i);
    L.moe->set_grad_ready_hook([this](size_t i) { ready(i); });
  } else if (cfg.is_gpt2()) {
    const std::string p = fmt::format("transformer.h.{}.mlp.", l);
    L.fcw = single(add_param(p + "c_fc.weight", {F, C}, TpSplit::rows, true, Init::normal));
    L.fcb = single(add_param(p + "c_fc.bias", {F}, TpSplit::rows, false, Init::zeros));
    L.fpw = single(add_param(p + "c_proj.weight", {C, F}, TpSplit::cols, true, Init::proj_normal));
    L.fpb = single(add_param(p + "c_proj.bias", {C}, TpSplit::none, false, Init::zeros));
  } else {
    const std::string p = fmt::format("model.layers.{}.mlp.", l);
    std::vector<std::pair<std::string, int64_t>> w, bs;
    if (cfg.swiglu) {
      w = {{p + "gate_proj.weight", F}, {p + "up_proj.weight", F}};
      bs = {{p + "gate_proj.bias", F}, {p + "up_proj.bias", F}};
    } else {
      w = {{p + "up_proj.weight", F}};
      bs = {{p + "up_proj.bias", F}};
    }
    L.fcw = add_fused(w, C, TpSplit::rows, true, Init::normal);
    if (b) L.fcb = add_fused(bs, 0, TpSplit::rows, false, Init::zeros);
    L.fpw = single(add_param(p + "down_proj.weight", {C, F}, TpSplit::cols, true, Init::proj_normal));
    if (b) L.fpb = single(add_param(p + "down_proj.bias", {C}, TpSplit::none, false, Init::zeros));
  }
  layers_.push_back(std::move(L));
}

void GptChunk::register_head(bool wte_norm_owner) {
  const GptConfig& cfg = cfg_;
  const std::string norm = cfg.is_gpt2() ? "transformer.ln_f." : "model.norm.";
  store_.begin_unit("head");
  lnf_w_ = add_param(norm + "weight", {C_}, TpSplit::none, false, Init::ones);
  if (cfg.norm_kind_has_bias()) lnf_b_ = add_param(norm + "bias", {C_}, TpSplit::none, false, Init::zeros);
  if (!cfg.tied_embeddings) {
    // The untied LM head: its own vocab-parallel matrix.
    head_w_ = add_param(cfg.lm_head_param(), {vp_, C_}, TpSplit::rows, true, Init::vocab_normal);
    return;
  }
  // The tied LM head: the embedding table itself. Registered here only when no chunk of this
  // store holds the embedding yet (another stage, or a later chunk of this one, may).
  const std::string name = cfg.embedding_param();
  bool found = false;
  for (size_t i = 0; i < store_.size(); ++i)
    if (store_.info(i).spec.name == name) {
      wte_ = i;
      found = true;
    }
  // Another chunk of this store holds the embedding and runs its backward later: it marks the
  // shared gradient ready, not the head.
  head_marks_wte_ = !found || spec_.embedding;
  if (spec_.embedding) head_marks_wte_ = false;  // this chunk's own embedding backward marks it
  if (!found) {
    store_.begin_unit("tied embedding");  // its own unit: the pipeline sums it over both stages
    ParamSpec ps{name, {vp_, C_}, TpSplit::rows, true, wte_norm_owner};
    wte_ = store_.add(ps, shard_shape({vp_, C_}, TpSplit::rows, tp_.size(), ps.name));
    owned_.push_back(wte_);
    init_.emplace_back(wte_, Init::vocab_normal);
    owns_wte_ = true;
  }
  head_w_ = wte_;
}

GptChunk::~GptChunk() = default;

void GptChunk::init_params(uint64_t seed) {
  const int tps = tp_.size(), r = tp_.rank();
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg_.n_layer));
  for (auto& L : layers_)
    if (L.moe) L.moe->init_params(seed, cfg_.n_layer);
  // Every parameter from (seed, name) on its full shape, then this rank's shard: the same model
  // whatever the layout. Matrices normal(0.02), output projections scaled by 1/sqrt(2 L),
  // embeddings and the LM head only on the real vocabulary (padded rows stay zero, so the padding
  // never changes the values of real rows whatever tp pads to), norms one, biases zero.
  for (const auto& [i, init] : init_) {
    const auto& info = store_.info(i);
    const auto& name = info.spec.name;
    const auto& full = info.spec.full_shape;
    size_t n = 1;
    for (auto d : full) n *= static_cast<size_t>(d);
    std::vector<float> v(n, init == Init::ones ? 1.0f : 0.0f);
    if (init == Init::vocab_normal) {
      auto real = init_normal(seed, name, static_cast<size_t>(cfg_.vocab) * C_, 0.02f);
      std::copy(real.begin(), real.end(), v.begin());
    } else if (init == Init::normal || init == Init::proj_normal) {
      v = init_normal(seed, name, n, init == Init::proj_normal ? proj_std : 0.02f);
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
  if (idx != SIZE_MAX && grad_ready_) grad_ready_(idx);
}

void GptChunk::ready(ParamRef r) {
  for (int k = r.count; k-- > 0;) ready(r.first + static_cast<size_t>(k));
}

// The norm (LayerNorm, or RMSNorm with no mean and no bias) of this rank's rows, gathered to all
// B*T rows when sequence parallel (the input of a column-parallel GEMM); mean and rstd are kept
// for this rank's rows.
void GptChunk::norm_gathered(const Tensor& x, size_t w, size_t b, Tensor& full, Tensor& mean, Tensor& rstd, int Nl) {
  const size_t NCl = static_cast<size_t>(Nl) * C_;
  const bool rms = cfg_.norm == Norm::rmsnorm;
  if (!rms) ensure(mean, static_cast<size_t>(Nl), st_);
  ensure(rstd, static_cast<size_t>(Nl), st_);
  ensure(full, NCl * (sp_ ? tp_.size() : 1));
  Tensor& out = sp_ ? backs_->ln_local : full;
  if (sp_) ensure(out, NCl);
  if (rms)
    be_.rmsnorm_forward(out, rstd, x, P(w), Nl, C_, cfg_.norm_eps);
  else
    be_.layernorm_forward(out, mean, rstd, x, P(w), P(b), Nl, C_);
  if (sp_) tp::gather_from_sequence_parallel(tp_, be_, out, full);
}

// Under SP, LayerNorm and row-parallel-bias gradients come from this rank's rows only: sum the
// micro-batch's partial gradients over TP, then add them to the store.
// params are (C)-sized, one per C slice of partial; SIZE_MAX skips an absent one (a bias).
void GptChunk::add_sp_grads(std::initializer_list<size_t> params, const Tensor& partial) {
  tp::sum_over_tp(tp_, be_, partial);
  int64_t off = 0;
  for (size_t p : params) {
    if (p != SIZE_MAX) be_.axpy(G(p), 1.0, partial.slice(off, off + C_));
    off += C_;
  }
}

// The true position of each of the T local rows of a sequence: 0..T-1, or the zigzag chunks'.
std::vector<int64_t> GptChunk::local_positions(int T) const {
  if (!cp_) {
    std::vector<int64_t> p(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) p[static_cast<size_t>(t)] = t;
    return p;
  }
  return cp_->zigzag(T * cp_->size()).positions();
}

const Tensor& GptChunk::cp_positions(int T) {
  auto it = cp_pos_.find(T);
  if (it == cp_pos_.end()) {
    const auto pos = local_positions(T);
    std::vector<int32_t> idx(pos.begin(), pos.end());
    Tensor t = be_.empty(Shape{T}, DType::i32);
    be_.copy_from_host(t, idx.data(), idx.size() * sizeof(int32_t));
    it = cp_pos_.emplace(T, t).first;
  }
  return it->second;
}

// RoPE's cos or sin table (T, D/2) in the statistics type: angle pos(t) * inv_freq[i] in double,
// pos(t) = t, or the true position of local row t under context parallelism.
const Tensor& GptChunk::rope_table(int T, bool sin) {
  auto it = rope_.find(T);
  if (it == rope_.end()) {
    const auto inv = cfg_.rope_inv_freq();
    const size_t half = inv.size(), n = static_cast<size_t>(T) * half;
    const auto pos = local_positions(T);
    std::vector<double> c(n), sn(n);
    for (int t = 0; t < T; ++t)
      for (size_t i = 0; i < half; ++i) {
        const double ang = static_cast<double>(pos[static_cast<size_t>(t)]) * inv[i];
        c[static_cast<size_t>(t) * half + i] = std::cos(ang);
        sn[static_cast<size_t>(t) * half + i] = std::sin(ang);
      }
    const auto upload = [&](const std::vector<double>& v) {
      Tensor x = be_.empty(Shape{static_cast<int64_t>(n)}, st_);
      if (st_ == DType::f64) {
        be_.copy_from_host(x, v.data(), n * sizeof(double));
      } else {
        std::vector<float> f(v.begin(), v.end());
        be_.copy_from_host(x, f.data(), n * sizeof(float));
      }
      return x;
    };
    it = rope_.emplace(T, std::make_pair(upload(c), upload(sn))).first;
  }
  return sin ? it->second.second : it->second.first;
}

// qkv (with RoPE on q and k) and the attention of one layer, from a.ln1 (N, C).
void GptChunk::attention_forward_block(Layer& L, Acts& a, int B, int T) {
  const int Nf = B * T;
  be_.linear_forward(a.qkv, a.ln1, P(L.qkvw), L.qkvb.defined() ? P(L.qkvb) : Tensor(), Nf, C_, Ql_);
  if (cfg_.positions == PositionEmbedding::rope)
    be_.rope_forward(a.qkv, rope_table(T, false), rope_table(T, true), B, T, NHl_, KVl_, D_);
  if (cp_)
    cp_->forward(a.att, a.lse, a.qkv, B, T, Cl_, NHl_, KVl_);
  else
    be_.attention_forward(a.att, a.lse, a.qkv, B, T, Cl_, NHl_, KVl_);
}

// The MLP's activation a.g (N, Fl) from a.h: GELU, or SwiGLU on h's [gate | up] halves.
void GptChunk::mlp_activation(Acts& a, int Nf) {
  ensure(a.g, static_cast<size_t>(Nf) * Fl_);
  if (cfg_.swiglu)
    be_.swiglu_forward(a.g, a.h, Nf, Fl_);
  else
    be_.gelu_forward(a.g, a.h);
}

// Runs one layer forward on this rank's rows x (Nl, C) into out (Nl, C). keep_all: store every
// activation (none-mode, or a recompute pass); otherwise store what the recompute mode keeps.
void GptChunk::layer_forward(Layer& L, Acts& a, int slot, const Tensor& x, const Tensor& out, int B, int T,
                             bool keep_all, bool training) {
  const int Nf = B * T, Nl = io_rows(B, T);
  const size_t NCf = static_cast<size_t>(Nf) * C_, NCl = static_cast<size_t>(Nl) * C_;
  ensure(a.x, NCl);
  if (a.x.raw_data() != x.raw_data()) be_.copy(a.x, x);
  ensure(a.qkv, static_cast<size_t>(Nf) * Ql_);
  ensure(a.att, static_cast<size_t>(Nf) * Cl_);
  ensure(a.lse, static_cast<size_t>(B) * NHl_ * T, st_);
  ensure(a.x2, NCl);
  ensure(scratch_, NCf);

  norm_gathered(x, L.ln1w, L.ln1b, a.ln1, a.m1, a.r1, Nl);  // copy_to_tp: identity forward
  attention_forward_block(L, a, B, T);
  // Row-parallel projection: partial sums over the TP shards, then all-reduce (or reduce-scatter).
  const Tensor& y = sp_ ? scratch_ : a.x2;
  be_.linear_forward(y, a.att, P(L.projw), Tensor(), Nf, Cl_, C_);
  if (sp_)
    tp::reduce_scatter_to_sequence_parallel(tp_, be_, scratch_, a.x2);
  else
    tp::reduce_from_tp_forward(tp_, be_, a.x2);
  if (L.projb.defined()) be_.add_bias(a.x2, P(L.projb), Nl, C_);
  be_.residual(a.x2, x, a.x2);
  norm_gathered(a.x2, L.ln2w, L.ln2b, a.ln2, a.m2, a.r2, Nl);
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
  ensure(a.h, static_cast<size_t>(Nf) * Hl_);
  be_.linear_forward(a.h, a.ln2, P(L.fcw), L.fcb.defined() ? P(L.fcb) : Tensor(), Nf, C_, Hl_);
  mlp_activation(a, Nf);
  const Tensor& z = sp_ ? scratch_ : out;
  be_.linear_forward(z, a.g, P(L.fpw), Tensor(), Nf, Fl_, C_);
  if (sp_)
    tp::reduce_scatter_to_sequence_parallel(tp_, be_, scratch_, out);
  else
    tp::reduce_from_tp_forward(tp_, be_, out);
  if (L.fpb.defined()) be_.add_bias(out, P(L.fpb), Nl, C_);
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

void GptChunk::linear_bwd(Slot& s, bool defer, const Tensor& dinp, ParamRef w, ParamRef b, const Tensor& dout,
                          const Tensor& inp, int N, int IC, int OC) {
  const Tensor dbias = b.defined() ? G(b) : Tensor();
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
    // re-run the all-to-alls); only the first norm's output is recomputed when dropped.
    if (rc_ != Recompute::none) norm_gathered(a.x, L.ln1w, L.ln1b, a.ln1, a.m1, a.r1, Nl);
  } else if (rc_ == Recompute::full) {
    // Recompute the whole layer (TP collectives included) from its saved input.
    Backs& S = *backs_;
    ensure(S.recomputed, static_cast<size_t>(Nl) * C_);
    layer_forward(L, a, slot, a.x, S.recomputed, B, T, true, true);
  } else if (rc_ == Recompute::selective) {
    norm_gathered(a.x, L.ln1w, L.ln1b, a.ln1, a.m1, a.r1, Nl);
    norm_gathered(a.x2, L.ln2w, L.ln2b, a.ln2, a.m2, a.r2, Nl);
    mlp_activation(a, B * T);
  }
}

// Under SP the replicated parameters' gradients (norms, row-parallel biases, the final
// norm) are partial: collected in this zeroed scratch of 6 C values, summed over TP by
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
  // An absent parameter (a bias of a bias-free model, RMSNorm's) gets no gradient buffer.
  const auto pick = [&](int k, bool present, auto store_grad) { return !present ? Tensor() : sp_ ? part(k) : store_grad(); };
  g.ln1w = pick(0, true, [&] { return G(L.ln1w); });
  g.ln1b = pick(1, L.ln1b != SIZE_MAX, [&] { return G(L.ln1b); });
  g.projb = pick(2, L.projb.defined(), [&] { return G(L.projb); });
  g.ln2w = pick(3, true, [&] { return G(L.ln2w); });
  g.ln2b = pick(4, L.ln2b != SIZE_MAX, [&] { return G(L.ln2b); });
  g.fpb = pick(5, !L.moe && L.fpb.defined(), [&] { return G(L.fpb); });
  return g;
}

// The backward of norm_gathered: dfull (N, C) holds the partial sums of the norm output's
// gradient from the column-parallel GEMM after it; reduce-scattered to this rank's rows under SP
// (into dlocal), all-reduced otherwise, then the norm's backward into dx (Nl, C).
void GptChunk::norm_backward_scattered(Tensor& dfull, Tensor& dlocal, const Tensor& dx, const Tensor& gw,
                                       const Tensor& gb, const Tensor& x, size_t w, const Tensor& mean,
                                       const Tensor& rstd, int Nl, ops::GradMode mode) {
  if (sp_) {
    ensure(dlocal, static_cast<size_t>(Nl) * C_);
    tp::reduce_scatter_to_sequence_parallel(tp_, be_, dfull, dlocal);
  } else {
    tp::copy_to_tp_backward(tp_, be_, dfull);
  }
  const Tensor& d = sp_ ? dlocal : dfull;
  if (cfg_.norm == Norm::rmsnorm)
    be_.rmsnorm_backward(dx, gw, d, x, P(w), rstd, Nl, C_, mode);
  else
    be_.layernorm_backward(dx, gw, gb, d, x, P(w), mean, rstd, Nl, C_, mode);
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
    if (cfg_.norm == Norm::rmsnorm)
      be_.rmsnorm_backward(dx2, G(L.ln2w), dln2, a.x2, P(L.ln2w), a.r2, Nl, C_, ops::GradMode::accumulate);
    else
      be_.layernorm_backward(dx2, G(L.ln2w), G(L.ln2b), dln2, a.x2, P(L.ln2w), a.m2, a.r2, Nl, C_,
                             ops::GradMode::accumulate);
    return;
  }
  if (g.fpb.defined()) be_.bias_grad(g.fpb, dout, Nl, C_);
  Tensor dz = dout;
  if (sp_) {
    ensure(S.dfull, NCf);
    tp::gather_from_sequence_parallel(tp_, be_, head_of(dout, NCl), S.dfull);
    dz = S.dfull;
  }
  Tensor& dg = S.dg;
  ensure(dg, static_cast<size_t>(Nf) * Fl_);
  linear_bwd(s, defer, dg, L.fpw, ParamRef{}, dz, a.g, Nf, Fl_, C_);
  if (!defer) ready(L.fpw);
  Tensor dh = dg;  // GELU's backward runs in place
  if (cfg_.swiglu) {
    ensure(S.dh, static_cast<size_t>(Nf) * Hl_);
    be_.swiglu_backward(S.dh, dg, a.h, Nf, Fl_);
    dh = S.dh;
  } else {
    be_.gelu_backward(dg, a.h, dg);
  }
  Tensor& dln2 = S.dln;
  ensure(dln2, NCf);
  linear_bwd(s, defer, dln2, L.fcw, L.fcb, dh, a.ln2, Nf, C_, Hl_);
  ready(L.fcb);
  if (!defer) ready(L.fcw);
  norm_backward_scattered(dln2, S.dln_local, dx2, g.ln2w, g.ln2b, a.x2, L.ln2w, a.m2, a.r2, Nl,
                          ops::GradMode::accumulate);
}

void GptChunk::attention_backward_block(Layer& L, Acts& a, Slot& s, int B, int T, bool defer) {
  const int Nf = B * T;
  Backs& S = *backs_;
  Tensor& dqkv = S.dqkv;
  ensure(dqkv, static_cast<size_t>(Nf) * Ql_);
  if (cp_)
    cp_->backward(dqkv, S.datt, a.qkv, a.att, a.lse, B, T, Cl_, NHl_, KVl_);
  else
    be_.attention_backward(dqkv, S.datt, a.qkv, a.att, a.lse, B, T, Cl_, NHl_, KVl_);
  if (cfg_.positions == PositionEmbedding::rope)
    be_.rope_backward(dqkv, rope_table(T, false), rope_table(T, true), B, T, NHl_, KVl_, D_);
  Tensor& dln1 = S.dln;
  ensure(dln1, static_cast<size_t>(Nf) * C_);
  linear_bwd(s, defer, dln1, L.qkvw, L.qkvb, dqkv, a.ln1, Nf, C_, Ql_);
  ready(L.qkvb);
  if (!defer) ready(L.qkvw);
}

void GptChunk::layer_backward(Layer& L, Acts& a, Slot& s, int slot, const Tensor& dout, const Tensor& dx, int B,
                              int T, bool defer) {
  const int Nf = B * T, Nl = io_rows(B, T);
  const size_t NCf = static_cast<size_t>(Nf) * C_, NCl = static_cast<size_t>(Nl) * C_;
  Backs& S = *backs_;
  recompute_for_backward(L, a, slot, B, T);
  const LayerGrads g = layer_grads(L);

  // MLP: out = x2 + (act(h) Wfp^T + bfp). The row-parallel output's gradient reaches every
  // shard whole: identity (all-reduce's backward) or all-gather (reduce-scatter's backward).
  Tensor& dx2 = S.dx2;  // residual branch
  ensure(dx2, NCl);
  be_.copy(dx2, head_of(dout, NCl));
  mlp_backward(L, a, s, slot, dout, g, B, T, defer);
  // Attention: x2 = x + (att Wproj^T + bproj)
  be_.copy(head_of(dx, NCl), dx2);
  if (g.projb.defined()) be_.bias_grad(g.projb, dx2, Nl, C_);
  Tensor dy = dx2;
  if (sp_) {
    ensure(S.dfull, NCf);
    tp::gather_from_sequence_parallel(tp_, be_, dx2, S.dfull);
    dy = S.dfull;
  }
  ensure(S.datt, static_cast<size_t>(Nf) * Cl_);
  linear_bwd(s, defer, S.datt, L.projw, ParamRef{}, dy, a.att, Nf, Cl_, C_);
  if (!defer) ready(L.projw);
  attention_backward_block(L, a, s, B, T, defer);
  norm_backward_scattered(S.dln, S.dln_local, head_of(dx, NCl), g.ln1w, g.ln1b, a.x, L.ln1w, a.m1, a.r1, Nl,
                          ops::GradMode::accumulate);
  const size_t projb = L.projb.defined() ? L.projb.first : SIZE_MAX, fpb = L.fpb.defined() ? L.fpb.first : SIZE_MAX;
  if (sp_) {
    if (L.moe)
      add_sp_grads({L.ln1w, L.ln1b, projb}, g.spg.slice(0, 3 * static_cast<int64_t>(C_)));
    else
      add_sp_grads({L.ln1w, L.ln1b, projb, L.ln2w, L.ln2b, fpb}, g.spg);
  }
  if (!L.moe) ready(fpb);
  for (size_t p : {L.ln2b, L.ln2w, projb, L.ln1b, L.ln1w}) ready(p);
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
  if (wpe_ == SIZE_MAX) return;
  if (cp_) {
    // The table rows of this rank's true positions, then added periodically like the plain table.
    ensure(cp_wpe_, static_cast<size_t>(T) * C_);
    be_.gather_rows(cp_wpe_, P(wpe_), cp_positions(T), T, C_);
    be_.add_rows_periodic(S.cur, cp_wpe_, Nl, C_, row0, T);
  } else {
    be_.add_rows_periodic(S.cur, P(wpe_), Nl, C_, row0, T);
  }
}

// The head on the last activation S.cur: final norm, LM head (vocab-parallel logits,
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
  norm_gathered(S.cur, lnf_w_, lnf_b_, S.lnf, S.mf, S.rf, Nl);  // lnf: (Nf, C)
  const int Vl = v1_ - v0_;
  Tensor& logits = S.logits;  // (N, V/tp): never gathered
  ensure(logits, static_cast<size_t>(Nf) * Vl);
  be_.linear_forward(logits, S.lnf, P(head_w_), Tensor(), Nf, C_, Vl);
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
  be_.linear_backward(S.dlnf, G(head_w_), Tensor(), logits, S.lnf, P(head_w_), Nf, C_, Vl);
  ensure(s.dx_head, NCl);
  Tensor spg = sp_partial_grads();
  if (sp_) spg = spg.slice(0, 2 * static_cast<int64_t>(C_));
  const Tensor gb = lnf_b_ == SIZE_MAX ? Tensor() : sp_ ? spg.slice(C_, 2 * C_) : G(lnf_b_);
  norm_backward_scattered(S.dlnf, S.dlnf_local, s.dx_head, sp_ ? spg.slice(0, C_) : G(lnf_w_), gb, S.cur, lnf_w_,
                          S.mf, S.rf, Nl, ops::GradMode::overwrite);
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
    if (head_w_ != wte_) ready(head_w_);  // the untied LM head
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
      if (wpe_ != SIZE_MAX) {
        ensure(S.dwpe, static_cast<size_t>(T) * C_, gt_);
        be_.fill(S.dwpe, 0.0);
        be_.sum_rows_periodic(S.dwpe, S.d, Nl, C_, tp_.rank() * Nl, T);
        tp::sum_over_tp(tp_, be_, S.dwpe);
        if (cp_)
          be_.scatter_add_rows(G(wpe_), S.dwpe, cp_positions(T), Tensor(), T, C_);
        else
          be_.axpy(G(wpe_).slice(0, static_cast<int64_t>(T) * C_), 1.0, S.dwpe);
      }
      ensure(S.dfull, static_cast<size_t>(Nf) * C_);
      tp::gather_from_sequence_parallel(tp_, be_, S.d, S.dfull);
      be_.embedding_backward(G(wte_), S.dfull, s.tokens, Nf, C_, v0_, v1_);
    } else {
      // reduce_from_tp's backward is the identity: every TP rank holds the full d.
      be_.embedding_backward(G(wte_), S.d, s.tokens, Nf, C_, v0_, v1_);
      if (wpe_ != SIZE_MAX && cp_) {
        ensure(S.dwpe, static_cast<size_t>(T) * C_, gt_);
        be_.fill(S.dwpe, 0.0);
        be_.sum_rows_periodic(S.dwpe, S.d, Nf, C_, 0, T);
        be_.scatter_add_rows(G(wpe_), S.dwpe, cp_positions(T), Tensor(), T, C_);
      } else if (wpe_ != SIZE_MAX) {
        be_.sum_rows_periodic(G(wpe_), S.d, Nf, C_, 0, T);
      }
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
    // norm statistics x2 (mean and rstd, or RMSNorm's rstd), qkv, att, lse, x2, h
    const size_t stats = cfg_.norm == Norm::rmsnorm ? 2 * Nl : 4 * Nl;
    per_layer += stats + N * static_cast<size_t>(Ql_) + N * Cl_ + static_cast<size_t>(B) * NHl_ * T + Nl * C +
                 N * static_cast<size_t>(Hl_);
    if (rc_ == Recompute::none) per_layer += 2 * N * C + N * Fl_;  // gathered norm outputs, activation
  }
  size_t total = per_layer * layers_.size();
  if (spec_.embedding) total += N;       // tokens (int32, counted as one float each)
  if (spec_.head) total += Nl * C;       // dx_head
  return total;
}

}  // namespace triax
