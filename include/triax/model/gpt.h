// GptChunk: a contiguous block of Transformer layers on one pipeline stage (plus the embedding on
// the first chunk and the final norm, LM head and vocab-parallel loss on the last), every layer
// tensor-parallel over the TP communicator as Megatron does it. One block for both families
// (GptConfig): GPT-2's (LayerNorm, GELU, learned positions, biases, tied head) or the Llama
// family's (RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases, untied head), or any mix. Hand-written forward and
// backward written once against the Backend seam (backend/backend.h): every buffer is a backend
// Tensor and every computation a backend op, so the same code runs on the CPU reference (fp32, or
// fp64 for gradient checks) and on devices. Activations are kept per in-flight micro-batch ("slot").
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <span>
#include <vector>

#include "triax/core/enum_names.h"
#include "triax/distributed/comm/comm.h"
#include "triax/model/config.h"
#include "triax/model/moe.h"
#include "triax/params/param_store.h"
#include "triax/model/stage.h"
#include "triax/parallel/context_parallel.h"

namespace triax {

// none: keep every activation; selective: keep GEMM inputs/outputs, recompute LayerNorm outputs
// and GELU in backward (attention never keeps its T x T scores in any mode: it recomputes them
// from the saved log-sum-exp); full: keep only each layer's input and recompute the whole layer,
// its TP all-reduces included, in backward.
// Recompute and its names are in core/enum_names.h (the planner prices the same modes).
inline Recompute parse_recompute(std::string_view s) { return parse_enum<Recompute>(s); }
inline std::string_view recompute_name(Recompute r) { return enum_name(r); }

struct ChunkSpec {
  int first_layer = 0;
  int num_layers = 0;
  bool embedding = false;  // token + position embedding at the start
  bool head = false;       // final norm, LM head and loss at the end
};

// Mixture-of-experts layers (docs/MOE.md): layer l uses a MoeMlp instead of the dense MLP when
// every > 0 and (l + 1) % every == 0. ep: the expert-parallel group (carved from DP). cp: the
// context-parallel group (null: none), over which the aux loss's terms are summed.
struct ChunkMoe {
  int every = 0;
  MoeConfig cfg;
  Communicator* ep = nullptr;
  Communicator* cp = nullptr;
};

class GptChunk final : public Stage {
 public:
  // Registers this chunk's parameters (TP-sharded) in store (the chunk computes on store's backend); call before store.finalize().
  // Several chunks of one stage may share a store; the tied embedding is registered once per store.
  // wte_norm_owner: whether this stage's copy of the tied embedding counts in the gradient norm
  // (false on the last stage when the first stage holds the other copy).
  // sequence_parallel: between the TP GEMMs the residual stream (and this chunk's input and
  // output) holds only this rank's B*T/tp rows; LayerNorm, dropout-free residual adds and the
  // embedding run on those rows, and all-gather / reduce-scatter replace the TP all-reduces.
  GptChunk(const GptConfig& cfg, const ChunkSpec& spec, Communicator& tp, ParamStore& store, Recompute rc,
           bool wte_norm_owner = true, bool sequence_parallel = false, const ChunkMoe& moe = {});
  ~GptChunk() override;
  GptChunk(const GptChunk&) = delete;
  GptChunk& operator=(const GptChunk&) = delete;

  // Fills this chunk's parameters from (seed, name) on the full shape, then takes the TP shard.
  void init_params(uint64_t seed);

  // Forward of one micro-batch of B sequences of T tokens. tokens (B, T) (host) when spec.embedding;
  // targets (B, T) (host) when spec.head; x_in (io_rows, C) otherwise; x_out (io_rows, C) is written
  // unless spec.head (io_rows = B*T, or B*T/tp with sequence parallelism); x_in and x_out are
  // buffers of the store's backend. Returns the mean cross-entropy of the micro-batch on head
  // chunks, else 0. training: keep activations in `slot` for backward. On head chunks the loss
  // gradient is known now (dloss = d total / d this micro-batch's mean loss), so the head's
  // backward runs fused with its forward and only the (B, T, C) input gradient is kept, never the logits.
  double forward(int slot, int B, int T, std::span<const int32_t> tokens, std::span<const int32_t> targets,
                const Tensor& x_in, const Tensor& x_out, bool training, float dloss = 1.0f) override;

  // Backward of the micro-batch in slot: dx_out (io_rows, C) unless spec.head; writes dx_in
  // (io_rows, C) unless spec.embedding. Parameter gradients accumulate into the store.
  // defer_weight_grads (ZB-H1's B pass): weight-gradient GEMMs wait for backward_weight(slot).
  void backward(int slot, const Tensor& dx_out, const Tensor& dx_in, bool defer_weight_grads = false) override;
  void backward_weight(int slot) override;
  // Drops a slot's activations (e.g. after a forward-only pass).
  void release(int slot) override;

  // Called after each parameter's gradient is final for this backward (reverse order), so
  // data-parallel buckets can start reducing while backward goes on.
  void set_grad_ready_hook(std::function<void(size_t param_index)> hook) override { grad_ready_ = std::move(hook); }
  Backend& backend() override { return be_; }
  int hidden() const override { return C_; }

  // Sum of the MoE layers' (unweighted) load-balancing losses over forwards since the last call;
  // resets it. Zero without MoE layers.
  double take_aux_loss();
  int moe_layers() const;
  // Rows of the hidden states this chunk takes and returns (B*T, or B*T/tp under SP).
  int io_rows(int B, int T) const override { return sp_ ? B * T / tp_.size() : B * T; }
  bool sequence_parallel() const { return sp_; }
  // Context parallelism (parallel/context_parallel.h): forward and backward then take this rank's
  // T = seq / cp rows of every sequence (its two zigzag chunks), positions (learned or RoPE) follow
  // the chunks' true offsets, and attention runs over the CP group. Null: off. Must outlive the chunk.
  void set_context_parallel(ContextParallel* cp) { cp_ = cp; }
  ContextParallel* context_parallel() const { return cp_; }
  // Floats of activations one in-flight micro-batch keeps, for this recompute mode.
  size_t activation_floats(int B, int T) const;
  const ChunkSpec& spec() const { return spec_; }
  // Store indices of this chunk's parameters in forward order.
  const std::vector<size_t>& param_indices() const { return owned_; }
  // Vocabulary rows [v0, v1) of the padded vocab held by this TP rank.
  int vocab_begin() const { return v0_; }
  int vocab_end() const { return v1_; }
  int padded_vocab() const { return vp_; }

 private:
  // One or more store parameters used as one weight: the Llama family's q/k/v (and gate/up)
  // projections are registered back to back, so their TP shards are adjacent in the flat store
  // and a single GEMM runs over the fused view. count 0: absent (a bias of a bias-free model).
  struct ParamRef {
    size_t first = SIZE_MAX;
    int count = 0;
    bool defined() const { return count > 0; }
  };
  enum class Init { ones, zeros, normal, proj_normal, vocab_normal };
  struct Layer;
  struct Acts;
  struct Slot;
  struct Deferred;
  struct Backs;
  Slot& slot(int s, bool create);
  void layer_forward(Layer& L, Acts& a, int slot, const Tensor& x, const Tensor& out, int B, int T, bool keep_all,
                     bool training);
  void layer_backward(Layer& L, Acts& a, Slot& s, int slot, const Tensor& dout, const Tensor& dx, int B, int T,
                      bool defer);
  void norm_gathered(const Tensor& x, size_t w, size_t b, Tensor& full, Tensor& mean, Tensor& rstd, int Nl);
  // The steps of forward, layer_backward and layer_forward (gpt.cpp says what each does).
  struct LayerGrads;
  void embed(Slot& s, std::span<const int32_t> tokens, int B, int T);
  double head_forward(Slot& s, std::span<const int32_t> targets, int B, int T, bool training, float dloss);
  void recompute_for_backward(Layer& L, Acts& a, int slot, int B, int T);
  LayerGrads layer_grads(const Layer& L);
  void mlp_backward(Layer& L, Acts& a, Slot& s, int slot, const Tensor& dout, const LayerGrads& g, int B, int T,
                    bool defer);
  Tensor sp_partial_grads();
  void norm_backward_scattered(Tensor& dfull, Tensor& dlocal, const Tensor& dx, const Tensor& gw,
                                    const Tensor& gb, const Tensor& x, size_t w, const Tensor& mean,
                                    const Tensor& rstd, int Nl, ops::GradMode mode);
  void drop_recomputed(Acts& a);
  void add_sp_grads(std::initializer_list<size_t> params, const Tensor& partial);
  void linear_bwd(Slot& s, bool defer, const Tensor& dinp, ParamRef w, ParamRef b, const Tensor& dout,
                  const Tensor& inp, int N, int IC, int OC);
  void ready(size_t idx);
  void ready(ParamRef r);
  size_t add_param(const std::string& name, std::vector<int64_t> full, TpSplit split, bool decay, Init init);
  ParamRef add_fused(const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols, TpSplit split, bool decay,
                     Init init);
  void register_layer(int l, const ChunkMoe& moe);
  void register_head(bool wte_norm_owner);
  void attention_forward_block(Layer& L, Acts& a, int B, int T);
  void attention_backward_block(Layer& L, Acts& a, Slot& s, int B, int T, bool defer);
  const Tensor& rope_table(int T, bool sin);
  void mlp_activation(Acts& a, int Nf);
  // Buffer t holds exactly n elements of dtype (reallocated only when the size changes).
  void ensure(Tensor& t, size_t n, DType dtype);
  void ensure(Tensor& t, size_t n) { ensure(t, n, dt_); }
  Tensor P(size_t i);  // parameter i's compute view (ParamStore::weight_t, cached unless the store shards)
  Tensor G(size_t i);  // its gradient view
  Tensor view(size_t i, bool grad);
  Tensor P(ParamRef r);  // a fused weight's compute view (a single parameter's when count is 1)
  Tensor G(ParamRef r);

  GptConfig cfg_;
  ChunkSpec spec_;
  Communicator& tp_;
  ParamStore& store_;
  Backend& be_;
  DType dt_;  // activations and their gradients: the backend's compute type
  DType st_;  // statistics (LayerNorm mean/rstd, attention lse, xent stats, losses): f32, f64 on an f64 backend
  DType gt_;  // parameter-gradient scratch (SP partials, dwpe): the store's gradient type
  std::vector<Tensor> pview_, gview_;
  Recompute rc_;
  bool sp_ = false;
  Tensor scratch_;  // (B*T, C) partial sums before a reduce-scatter
  int C_, F_, NH_, Cl_, Fl_, NHl_;
  int KVl_, D_, Ql_;  // kv heads per TP rank, head size, local fused QKV width (NHl + 2 KVl) * D
  int Hl_;            // local width of the MLP's first GEMM: Fl, or 2 Fl for SwiGLU's [gate | up]
  int vp_, v0_, v1_;
  std::vector<Layer> layers_;
  size_t wte_ = SIZE_MAX, wpe_ = SIZE_MAX, lnf_w_ = SIZE_MAX, lnf_b_ = SIZE_MAX;
  size_t head_w_ = SIZE_MAX;  // the LM head's matrix: wte_ when tied, lm_head.weight otherwise
  std::vector<std::pair<size_t, Init>> init_;  // how init_params fills each parameter registered here
  std::map<int, std::pair<Tensor, Tensor>> rope_;  // RoPE cos/sin tables (T, D/2) by sequence length
  ContextParallel* cp_ = nullptr;
  std::map<int, Tensor> cp_pos_;  // i32 (T): the true position of each local row, by local T
  Tensor cp_wpe_;                 // (T, C) the position rows of this rank's local rows
  const Tensor& cp_positions(int T);
  std::vector<int64_t> local_positions(int T) const;
  std::vector<Tensor> fpview_, fgview_;  // fused views by first index
  bool owns_wte_ = false;
  bool head_marks_wte_ = false;
  std::vector<size_t> owned_;
  std::map<int, std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<Slot>> free_slots_;
  std::function<void(size_t)> grad_ready_;
  ChunkMoe moe_;
  double aux_sum_ = 0;
  std::unique_ptr<Backs> backs_;  // transient buffers of forward/backward, reused
};

}  // namespace triax
