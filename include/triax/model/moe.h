// MoeMlp: a mixture-of-experts MLP in place of a GPT layer's dense MLP - a linear router, top-k
// gating, per-expert capacity, the Switch load-balancing loss - with the experts split over the
// expert-parallel (EP) group and tokens moved by all_to_all_v, in chunks so that the exchange of
// one chunk overlaps the expert compute of another. Conventions: docs/MOE.md.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "triax/distributed/comm/comm.h"
#include "triax/params/param_store.h"

namespace triax {

struct MoeConfig {
  int experts = 8;  // E; a multiple of the EP group size
  int top_k = 2;    // 1 or 2
  // Drop mode: each expert takes at most ceil(capacity_factor * N * k / E) of the N local tokens'
  // N * k assignments (per source rank: every rank routes its own tokens).
  double capacity_factor = 1.25;
  // false: no-drop mode, capacity = the largest load, so no assignment is dropped. Dispatch is
  // variable-sized (all_to_all_v), so the padding up to that capacity is never sent or computed.
  bool drop_tokens = true;
  // Weight of the load-balancing loss in the training loss: total += aux_loss_coef * aux.
  float aux_loss_coef = 0.01f;
  // Token chunks pipelined through dispatch -> experts -> combine (1: no overlap). A knob of
  // speed only: any value gives the same results (up to float summation order of weight grads).
  int chunks = 1;
  // The experts' shape (set by GptChunk from GptConfig's swiglu, bias and !is_gpt2()).
  // swiglu: each expert is down(silu(gate(x)) * up(x)) (Mixtral), gate and up registered adjacent
  // so one GEMM runs over the fused (2F, C) view; false: c_proj(gelu(c_fc(x))) (GPT-2).
  bool swiglu = false;
  bool bias = true;       // expert biases (false: none registered, as in Mixtral)
  // Parameter names of HF Mixtral ("model.layers.{l}.block_sparse_moe.gate.weight",
  // "...experts.{e}.w1/w3/w2.weight") instead of triax's GPT-2 ones (docs/MOE.md lists both).
  bool hf_names = false;

  // ConfigError naming the field unless experts % ep == 0, top_k in {1, 2} and <= experts,
  // capacity_factor > 0 (drop mode), aux_loss_coef >= 0 and finite, chunks >= 1.
  void validate(int ep) const;
};

// Routing of N tokens over E experts from router logits: the pure, single-process first step of
// MoeMlp::forward (public so tests can check it against hand-computed cases).
struct Routing {
  int N = 0, E = 0, k = 0;
  std::vector<double> probs;    // (N, E) softmax of the logits
  std::vector<int32_t> expert;  // (N, k) selected experts, descending probability, ties to the lower index
  std::vector<double> gate;     // (N, k) k = 1: the raw probability; k = 2: renormalised to sum 1
  std::vector<int32_t> slot;    // (N, k) position in the expert's capacity buffer; -1 = dropped
  std::vector<int64_t> load;    // (E) assignments per expert before capacity (what the router asked)
  int64_t capacity = 0;         // per expert
  int64_t dropped = 0;          // assignments over capacity
  double aux_loss = 0;          // E * sum_e f_e P_e, f_e = load_e / (N k), P_e = mean_n probs[n, e]
  bool kept(int n, int j) const { return slot[static_cast<size_t>(n) * k + j] >= 0; }
};

// ceil(capacity_factor * N * k / E), computed so that decimal factors (1.1 x 10 / 11) do not round
// an exact integer up.
int64_t expert_capacity(int64_t N, int E, int k, double capacity_factor);

// Softmax, top-k, gates, capacity slots (priority: every token's first choice in token order,
// then every second choice in token order) and the aux loss. capacity < 0: no-drop (the largest
// load). logits (N, E).
// Computed in double whatever the logits' type (float, or double on a float64 backend).
template <class Real>
Routing route_tokens(const Real* logits, int N, int E, int k, int64_t capacity);

// What one forward or backward did on this rank (seconds, steady clock).
struct MoeStats {
  int64_t tokens = 0;       // N
  int64_t assignments = 0;  // N * k
  int64_t dropped = 0;      // assignments dropped by capacity (forward)
  int64_t capacity = 0;
  int64_t sent_rows = 0;    // token rows sent to expert owners (this rank included)
  int64_t recv_rows = 0;    // token rows this rank's experts processed
  float aux_loss = 0;       // unweighted, of the micro-batch (its whole sequences under CP)
  double a2a_wait_s = 0;    // blocked in Work::wait on the counts, dispatch and combine exchanges:
                            // the exposed all-to-all time
  double a2a_call_s = 0;    // inside the calls that start or test them (driving MPI)
  // Each wait in issue order (forward: counts, then dispatch / combine waits; backward: dispatch /
  // combine waits). The same length on every EP rank, so a benchmark can take the minimum over
  // ranks: the last rank to arrive waits only for the transfer, not for a slower peer.
  std::vector<double> a2a_waits;
  double expert_s = 0;      // expert GEMMs and activation (GELU or SwiGLU)
  double total_s = 0;
};

class MoeMlp {
 public:
  // Registers the router (E, C), replicated, and this EP rank's experts e in
  // [rank * E/ep, (rank + 1) * E/ep), marked ParamSpec::expert, with the global index e in their
  // names. Names (docs/MOE.md), triax / hf_names:
  //   router            transformer.h.{l}.moe.router.weight / model.layers.{l}.block_sparse_moe.gate.weight
  //   expert prefix     transformer.h.{l}.moe.experts.{e}.  / model.layers.{l}.block_sparse_moe.experts.{e}.
  //   GELU (C->F->C)    c_fc, c_proj                        / w1, w2
  //   SwiGLU gate, up   gate_proj, up_proj (F, C)            / w1, w3
  //   SwiGLU down       down_proj (C, F)                     / w2
  // each ".weight", plus ".bias" when cfg.bias. Per expert the order is: gate.weight, up.weight
  // (adjacent: one GEMM over both), gate.bias, up.bias, down.weight, down.bias (GELU: c_fc.weight,
  // c_fc.bias, c_proj.weight, c_proj.bias). Call before store.finalize(). norm_owner: whether this
  // copy counts in the gradient norm (false on tp ranks > 0: MoE layers are replicated over TP).
  // ep: the expert-parallel group (carved from DP).
  MoeMlp(const MoeConfig& cfg, int layer, int C, int F, Communicator& ep, ParamStore& store,
         bool norm_owner = true);
  ~MoeMlp();
  MoeMlp(const MoeMlp&) = delete;
  MoeMlp& operator=(const MoeMlp&) = delete;

  // From (seed, name) on each tensor's full shape: router, c_fc (gate, up) weights N(0, 0.02),
  // c_proj (down) weights N(0, 0.02 / sqrt(2 n_layer)) as in GPT-2, biases 0. The same model for
  // every ep.
  void init_params(uint64_t seed, int n_layer);

  // y (N, C) = MoE(x (N, C)). Collective over the EP group: every rank calls it for the same
  // slots in the same order (N may differ between ranks). Returns the unweighted aux loss of
  // these tokens; the trainer adds aux_loss_coef * it to the micro-batch's loss. training: keep
  // activations in `slot` for backward.
  double forward(int slot, int N, const Tensor& x, const Tensor& y, bool training);
  // The same on host memory (copies through the store's backend): for tests and tools.
  double forward(int slot, int N, const float* x, float* y, bool training);

  // dx (N, C) (written) from dy (N, C) for the micro-batch in slot, collective like forward.
  // dloss: d total / d this micro-batch's loss (e.g. 1 / micro-batches); the aux loss's gradient
  // is aux_loss_coef * dloss. Parameter gradients accumulate into the store; the slot is released.
  void backward(int slot, const Tensor& dy, const Tensor& dx, float dloss = 1.0f);
  void backward(int slot, const float* dy, float* dx, float dloss = 1.0f);
  void release(int slot);

  // Called after each parameter's gradient is final for this backward (experts, then router).
  void set_grad_ready_hook(std::function<void(size_t param_index)> hook) { grad_ready_ = std::move(hook); }

  const MoeConfig& config() const { return cfg_; }
  // Knob of speed only; every EP rank must use the same value for a slot's forward and backward.
  void set_chunks(int chunks);
  // Context parallelism: the group whose ranks hold the other rows of this rank's sequences (null
  // or size 1: off). Routing stays token-local (capacity too: drop mode only matches one process
  // when nothing is dropped), but the aux loss becomes the micro-batch's: forward all-reduces the
  // per-expert loads, probability sums and N over the group (every rank must call forward for the
  // same slots in the same order), and backward scales the aux gradient of this rank's tokens by
  // the group size, so that the dp x cp gradient average is the one-process gradient.
  void set_cp_group(Communicator* cp) { cp_ = cp && cp->size() > 1 ? cp : nullptr; }
  int local_experts() const { return El_; }
  int first_expert() const { return e0_; }
  // Store indices: router, then per local expert its parameters in registration order (above).
  const std::vector<size_t>& param_indices() const { return owned_; }
  size_t router_param() const { return router_; }
  // The routing of the last forward (for tests and metrics): this rank's tokens only (its aux_loss
  // too; forward returns the CP group's).
  const Routing& last_routing() const { return last_routing_; }
  const MoeStats& forward_stats() const { return fwd_stats_; }
  const MoeStats& backward_stats() const { return bwd_stats_; }

 private:
  // Store indices of one expert. in: the first matrix (GELU c_fc; SwiGLU gate, followed by up,
  // so the fused (2F, C) view starts there); inb likewise for its bias; none = kNone.
  struct Expert {
    size_t in, inb, out, outb;
    std::vector<size_t> params;  // registration order
  };
  static constexpr size_t kNone = static_cast<size_t>(-1);
  struct Slot;
  using ExpertFn = std::function<void(int chunk, const Tensor& in, const Tensor& out, const std::function<void()>& poll)>;
  void exchange(Slot& s, const Tensor& send, const Tensor& back, const Tensor& ein, const ExpertFn& fn, MoeStats& st);
  // forward's steps before the exchange, in order (moe.cpp says what each fills in the slot).
  void route(Slot& s, const Tensor& xin, int N);
  std::pair<Tensor, Tensor> lay_out_sends(Slot& s, const Tensor& xin);
  void exchange_counts(Slot& s, MoeStats& st);
  void aux_terms(Slot& s);
  void touch_experts(bool grads);
  void ready(size_t idx);
  // The first n elements of t, regrown (never shrunk) to hold them.
  Tensor grow(Tensor& t, size_t n, DType dtype);
  std::vector<float> host_f32(const Tensor& t, size_t n);
  Tensor upload_i32(Tensor& t, const std::vector<int32_t>& v);
  Tensor upload_real(Tensor& t, const std::vector<double>& v);
  Tensor P(size_t i);
  Tensor G(size_t i);
  // Views of n consecutive parameters starting at i (weights and grads), or undefined for kNone:
  // the fused gate/up of a SwiGLU expert (n = 2) or one parameter (n = 1).
  Tensor PN(size_t i, int n);
  Tensor GN(size_t i, int n);
  int in_parts() const { return cfg_.swiglu ? 2 : 1; }

  MoeConfig cfg_;
  int layer_;
  int C_, F_;
  Communicator& ep_;
  Communicator* cp_ = nullptr;
  ParamStore& store_;
  Backend& be_;
  DType dt_;  // activations (the backend's compute type); gradients go to the store's
  std::map<size_t, Tensor> pview_, gview_;
  std::map<std::pair<size_t, int>, Tensor> pnview_, gnview_;
  int P_, El_, e0_;
  size_t router_ = 0;
  std::vector<Expert> experts_;
  std::vector<size_t> owned_;
  std::map<int, std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<Slot>> free_slots_;  // released slots keep their buffers' capacity
  // Scratch reused by every call (grow-only: fresh pages for tens of MB per call cost more than
  // the copies themselves). Exchange: received rows, expert outputs, rows going back; forward /
  // backward: rows to send, rows coming back, expert-side gradient rows.
  Tensor recv_, eout_, ret_, send_, back_, ein_, ein2_, logits_, dots_, da_, dh_, dlogit_;
  Routing last_routing_;
  MoeStats fwd_stats_, bwd_stats_;
  std::function<void(size_t)> grad_ready_;
};

}  // namespace triax
