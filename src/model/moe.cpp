// MoE MLP with expert parallelism, every buffer and op on the Backend (routing on the host). Per micro-batch of N local tokens:
//   logits = x Wr^T (N, E); probs = softmax; top-k; gates; capacity slots   (route_tokens)
//   send rows: per chunk, per destination expert (ascending, so per owner rank), in slot order
//   counts:   one all_to_all of (chunks x E/ep) row counts per rank pair
//   per chunk c: dispatch all_to_all_v -> experts (C -> F -> C: GELU, or SwiGLU with the gate and
//             up projections in one GEMM over their fused (2F, C) view) -> combine all_to_all_v,
//             with chunk c+1's dispatch and chunk c-1's combine in flight during chunk c's GEMMs
//   y[n] = sum_j gate[n, j] * expert_j(x[n]) over the kept assignments, in choice order
// Backward runs the same exchange on the gradient rows (g * dy out, dx rows back), then the
// router: d gates (and the aux loss) -> d probs -> softmax backward -> dWr, dx.
#include "triax/model/moe.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "triax/backend/comm_ops.h"
#include "triax/core/clock.h"
#include "triax/model/param_shards.h"

namespace triax {

namespace {
using Clock = std::chrono::steady_clock;
// Expert GEMMs run in blocks of this many rows with a poll of the in-flight exchanges between
// blocks: MPI moves a nonblocking all-to-all only inside MPI calls, so without these polls the
// next chunk's dispatch would make no progress while the experts compute.
constexpr int kPollRows = 128;

// Row indices that move one chunk's blocks between the layout the exchange delivers (source rank
// major: for src, for local expert) and the layout the expert GEMMs want (expert major: for local
// expert, for src). cnt is (P, El) rows; row0 the chunk's first row. to_expert[i] is the
// exchange-layout row of expert-major row i; from_expert the inverse.
void permutation(const int64_t* cnt, int P, int El, int64_t row0, std::vector<int32_t>& to_expert,
                 std::vector<int32_t>& from_expert) {
  std::vector<int64_t> so(static_cast<size_t>(P) * El), eo(so.size());
  int64_t o = 0;
  for (int s = 0; s < P; ++s)
    for (int l = 0; l < El; ++l) {
      so[static_cast<size_t>(s) * El + l] = o;
      o += cnt[static_cast<size_t>(s) * El + l];
    }
  o = 0;
  for (int l = 0; l < El; ++l)
    for (int s = 0; s < P; ++s) {
      eo[static_cast<size_t>(s) * El + l] = o;
      o += cnt[static_cast<size_t>(s) * El + l];
    }
  const size_t base = to_expert.size();
  to_expert.resize(base + static_cast<size_t>(o));
  from_expert.resize(base + static_cast<size_t>(o));
  for (size_t i = 0; i < so.size(); ++i)
    for (int64_t t = 0; t < cnt[i]; ++t) {
      to_expert[base + static_cast<size_t>(eo[i] + t)] = static_cast<int32_t>(row0 + so[i] + t);
      from_expert[base + static_cast<size_t>(so[i] + t)] = static_cast<int32_t>(row0 + eo[i] + t);
    }
}
}  // namespace

void MoeConfig::validate(int ep) const {
  if (ep < 1) TRIAX_THROW(ConfigError, "MoE: expert-parallel size {} must be >= 1", ep);
  if (experts < 1 || experts % ep != 0)
    TRIAX_THROW(ConfigError, "MoE: {} experts cannot be split over an expert-parallel group of {} (need a positive "
                "multiple of ep)", experts, ep);
  if (top_k != 1 && top_k != 2) TRIAX_THROW(ConfigError, "MoE: top_k = {} is not supported (1 or 2)", top_k);
  if (top_k > experts) TRIAX_THROW(ConfigError, "MoE: top_k = {} exceeds the {} experts", top_k, experts);
  if (drop_tokens && !(capacity_factor > 0 && std::isfinite(capacity_factor)))
    TRIAX_THROW(ConfigError, "MoE: capacity_factor = {} must be positive and finite in drop mode", capacity_factor);
  if (!(aux_loss_coef >= 0 && std::isfinite(aux_loss_coef)))
    TRIAX_THROW(ConfigError, "MoE: aux_loss_coef = {} must be finite and >= 0", aux_loss_coef);
  if (chunks < 1) TRIAX_THROW(ConfigError, "MoE: chunks = {} must be >= 1", chunks);
}

int64_t expert_capacity(int64_t N, int E, int k, double capacity_factor) {
  if (N < 0 || E < 1 || k < 1)
    TRIAX_THROW(ConfigError, "expert_capacity: need N >= 0, E >= 1, k >= 1 (got {}, {}, {})", N, E, k);
  if (!(capacity_factor > 0 && std::isfinite(capacity_factor)))
    TRIAX_THROW(ConfigError, "expert_capacity: capacity factor {} must be positive and finite", capacity_factor);
  const double x = capacity_factor * static_cast<double>(N) * k / E;
  const double f = std::floor(x);
  // An x a few ulps above an integer is that integer written in binary (1.1 * 10 / 11).
  return static_cast<int64_t>(x - f <= 1e-9 * std::max(1.0, x) ? f : f + 1);
}

template <class Real>
Routing route_tokens(const Real* logits, int N, int E, int k, int64_t capacity) {
  if (N < 0 || E < 1 || k < 1 || k > E)
    TRIAX_THROW(ConfigError, "route_tokens: need N >= 0 and 1 <= k <= E (got N {}, E {}, k {})", N, E, k);
  if (N > 0 && !logits) TRIAX_THROW(ConfigError, "route_tokens: null logits for {} tokens", N);
  Routing R;
  R.N = N;
  R.E = E;
  R.k = k;
  const size_t NE = static_cast<size_t>(N) * E, Nk = static_cast<size_t>(N) * k;
  R.probs.resize(NE);
  R.expert.resize(Nk);
  R.gate.resize(Nk);
  R.slot.assign(Nk, -1);
  R.load.assign(static_cast<size_t>(E), 0);
  for (int n = 0; n < N; ++n) {
    const Real* l = logits + static_cast<size_t>(n) * E;
    double* p = R.probs.data() + static_cast<size_t>(n) * E;
    double m = static_cast<double>(l[0]);
    for (int e = 0; e < E; ++e) {
      if (!std::isfinite(l[e]))
        TRIAX_THROW(ConfigError, "route_tokens: token {} has a non-finite router logit {} for expert {}", n, l[e], e);
      m = std::max(m, static_cast<double>(l[e]));
    }
    double s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(static_cast<double>(l[e]) - m);
    for (int e = 0; e < E; ++e) p[e] = std::exp(static_cast<double>(l[e]) - m) / s;
    int32_t* sel = R.expert.data() + static_cast<size_t>(n) * k;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int i = 0; i < j; ++i) taken |= sel[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;  // strict: ties go to the lower index
      }
      sel[j] = best;
      ++R.load[static_cast<size_t>(best)];
    }
    double* g = R.gate.data() + static_cast<size_t>(n) * k;
    if (k == 1) {
      g[0] = p[sel[0]];
    } else {
      double S = 0;
      for (int j = 0; j < k; ++j) S += p[sel[j]];
      for (int j = 0; j < k; ++j) g[j] = p[sel[j]] / S;
    }
  }
  int64_t cap = capacity;
  if (cap < 0) cap = N == 0 ? 0 : *std::max_element(R.load.begin(), R.load.end());
  R.capacity = cap;
  std::vector<int64_t> fill(static_cast<size_t>(E), 0);
  for (int j = 0; j < k; ++j)
    for (int n = 0; n < N; ++n) {
      const size_t a = static_cast<size_t>(n) * k + j;
      int64_t& f = fill[static_cast<size_t>(R.expert[a])];
      if (f < cap)
        R.slot[a] = static_cast<int32_t>(f++);
      else
        ++R.dropped;
    }
  if (N > 0) {
    double aux = 0;
    for (int e = 0; e < E; ++e) {
      double P = 0;
      for (int n = 0; n < N; ++n) P += R.probs[static_cast<size_t>(n) * E + e];
      aux += static_cast<double>(R.load[static_cast<size_t>(e)]) / (static_cast<double>(N) * k) * (P / N);
    }
    R.aux_loss = aux * E;
  }
  return R;
}

template Routing route_tokens<float>(const float*, int, int, int, int64_t);
template Routing route_tokens<double>(const double*, int, int, int, int64_t);

// Activations of one micro-batch. "Send layout": the rows this rank sends, chunk by chunk, each
// chunk ordered by destination expert then capacity slot. "Expert side": the rows this rank's
// experts process, chunk by chunk, each chunk expert major (for local expert, for source rank).
// Routing and row indices live on the host (they drive all_to_all_v's counts); rows on the backend.
struct MoeMlp::Slot {
  int N = 0;
  int chunks = 1;
  Tensor x;                       // (N, C) layer input
  Routing R;
  std::vector<int64_t> pos;       // (N, k) row of each assignment in the send layout; -1 dropped
  std::vector<int32_t> send_asg;  // (St) assignment n * k + j of each send row
  std::vector<int64_t> scount;    // (chunks, E) rows to each expert
  std::vector<int64_t> rcount;    // (chunks, P, El) rows from each source rank to each local expert
  std::vector<int64_t> soff, roff;  // (chunks + 1) row offsets of each chunk, send layout / expert side
  Tensor token_of;                // (St) i32 token row of each send row
  Tensor gate_of;                 // (St) gate of each send row
  Tensor to_expert, from_expert;  // (Rt) i32 row permutations of the exchange (see permutation())
  Tensor o;                       // (St, C) expert outputs, back at the source, send layout
  Tensor xe, h, a;                // (Rt, C), (Rt, Fh), (Rt, F) expert inputs, pre- and post-activation
                                  // (Fh = F, or 2F for SwiGLU's rows [gate | up])
  // The aux loss's terms over the micro-batch (summed over the CP group; R's own without CP).
  std::vector<double> aux_load;   // (E) assignments per expert
  double aux_N = 0;               // tokens
  double aux = 0;                 // E * sum_e f_e P_e of them
};

namespace {
// Rows [r0, r1) of a (rows, width) buffer; an empty range (a chunk with no rows) is a valid empty view.
Tensor rows_of(const Tensor& t, int64_t r0, int64_t r1, int64_t width) {
  if (r0 == r1) return Tensor::from_blob(nullptr, Shape{0}, t.dtype(), t.device());
  return t.slice(r0 * width, r1 * width);
}
}  // namespace

Tensor MoeMlp::grow(Tensor& t, size_t n, DType dtype) {
  if (!t.defined() || static_cast<size_t>(t.numel()) < n || t.dtype() != dtype)
    t = be_.empty(Shape{static_cast<int64_t>(std::max<size_t>(n, 1))}, dtype);
  return rows_of(t, 0, static_cast<int64_t>(n), 1);
}

Tensor MoeMlp::upload_i32(Tensor& t, const std::vector<int32_t>& v) {
  Tensor view = grow(t, v.size(), DType::i32);
  if (!v.empty()) be_.copy_from_host(view, v.data(), v.size() * sizeof(int32_t));
  return view;
}

Tensor MoeMlp::upload_real(Tensor& t, const std::vector<double>& v) {
  Tensor view = grow(t, v.size(), dt_);
  if (v.empty()) return view;
  auto put = [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = T(static_cast<float>(v[i]));
    be_.copy_from_host(view, h.data(), h.size() * sizeof(T));
  };
  switch (dt_) {
    case DType::f64: be_.copy_from_host(view, v.data(), v.size() * sizeof(double)); break;
    case DType::bf16: put(bf16{}); break;
    case DType::f16: put(f16{}); break;
    default: put(float{}); break;
  }
  return view;
}

// n values of a buffer of the activation type (f32, bf16 or f16) read back as floats.
std::vector<float> MoeMlp::host_f32(const Tensor& t, size_t n) {
  std::vector<float> out(n);
  auto get = [&](auto zero) {
    using T = decltype(zero);
    std::vector<T> h(n);
    be_.copy_to_host(h.data(), t, n * sizeof(T));
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(h[i]);
  };
  if (dt_ == DType::bf16)
    get(bf16{});
  else if (dt_ == DType::f16)
    get(f16{});
  else
    be_.copy_to_host(out.data(), t, n * sizeof(float));
  return out;
}

MoeMlp::MoeMlp(const MoeConfig& cfg, int layer, int C, int F, Communicator& ep, ParamStore& store, bool norm_owner)
    : cfg_(cfg), layer_(layer), C_(C), F_(F), ep_(ep), store_(store), be_(store.backend()), dt_(be_.compute_dtype()) {
  cfg_.validate(ep.size());
  if (C < 1 || F < 1) TRIAX_THROW(ConfigError, "MoE layer {}: hidden sizes C = {}, F = {} must be >= 1", layer, C, F);
  P_ = ep.size();
  El_ = cfg_.experts / P_;
  e0_ = ep.rank() * El_;
  const std::string p = cfg_.hf_names ? fmt::format("model.layers.{}.block_sparse_moe.", layer)
                                      : fmt::format("transformer.h.{}.moe.", layer);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool decay, bool expert) {
    ParamSpec ps{name, shape, TpSplit::none, decay, norm_owner};
    ps.expert = expert;
    const size_t i = store_.add(ps, shape);
    owned_.push_back(i);
    return i;
  };
  const int64_t E = cfg_.experts;
  router_ = add(p + (cfg_.hf_names ? "gate.weight" : "router.weight"), {E, C}, true, false);
  // Names of the (first) input matrix, SwiGLU's up matrix, and the output matrix.
  const bool hf = cfg_.hf_names, sw = cfg_.swiglu;
  const std::string in_name = hf ? "w1" : sw ? "gate_proj" : "c_fc", up_name = hf ? "w3" : "up_proj",
                    out_name = hf ? "w2" : sw ? "down_proj" : "c_proj";
  for (int l = 0; l < El_; ++l) {
    const std::string q = fmt::format("{}experts.{}.", p, e0_ + l);
    Expert x{kNone, kNone, kNone, kNone, {}};
    const size_t first = owned_.size();
    // SwiGLU: gate then up, weights and then biases adjacent, so each pair is one fused view.
    x.in = add(q + in_name + ".weight", {F, C}, true, true);
    if (sw) add(q + up_name + ".weight", {F, C}, true, true);
    if (cfg_.bias) {
      x.inb = add(q + in_name + ".bias", {F}, false, true);
      if (sw) add(q + up_name + ".bias", {F}, false, true);
    }
    x.out = add(q + out_name + ".weight", {C, F}, true, true);
    if (cfg_.bias) x.outb = add(q + out_name + ".bias", {C}, false, true);
    x.params.assign(owned_.begin() + static_cast<std::ptrdiff_t>(first), owned_.end());
    experts_.push_back(std::move(x));
  }
}

MoeMlp::~MoeMlp() = default;

void MoeMlp::set_chunks(int chunks) {
  if (chunks < 1) TRIAX_THROW(ConfigError, "MoE: chunks = {} must be >= 1", chunks);
  cfg_.chunks = chunks;
}

void MoeMlp::init_params(uint64_t seed, int n_layer) {
  if (n_layer < 1) TRIAX_THROW(ConfigError, "MoE init: n_layer = {} must be >= 1", n_layer);
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(n_layer));
  std::vector<char> is_out(store_.size(), 0);
  for (const Expert& x : experts_) is_out[x.out] = 1;
  for (size_t i : owned_) {
    const auto& info = store_.info(i);
    if (info.spec.name.ends_with(".bias")) {
      store_.param_from_host(i, std::vector<float>(info.numel, 0.0f));
      continue;
    }
    store_.param_from_host(i, init_normal(seed, info.spec.name, info.numel, is_out[i] ? proj_std : 0.02f));
  }
}

void MoeMlp::release(int s) {
  auto it = slots_.find(s);
  if (it == slots_.end()) return;
  free_slots_.push_back(std::move(it->second));
  slots_.erase(it);
}

void MoeMlp::ready(size_t idx) {
  if (grad_ready_) grad_ready_(idx);
}

// The chunked exchange shared by forward and backward: send (St, C) rows go to the experts'
// owners, fn maps each chunk's expert-major rows to as many output rows, which come back into
// back (St, C) in the send layout. ein (Rt, C) receives the expert-major inputs (forward keeps
// them for backward). Issue order, identical on every rank: D0, D1, C0, D2, C1, ..., C(K-1).
void MoeMlp::exchange(Slot& s, const Tensor& send, const Tensor& back, const Tensor& ein, const ExpertFn& fn,
                      MoeStats& st) {
  const int K = s.chunks;
  const int64_t C = C_;
  const size_t Rt = static_cast<size_t>(s.roff[K]);
  const Tensor recv = grow(recv_, Rt * C, dt_);
  const Tensor eout = grow(eout_, Rt * C, dt_);
  const Tensor ret = grow(ret_, Rt * C, dt_);
  std::vector<std::vector<int64_t>> sc(K, std::vector<int64_t>(P_, 0)), rc(K, std::vector<int64_t>(P_, 0));
  for (int c = 0; c < K; ++c)
    for (int r = 0; r < P_; ++r)
      for (int l = 0; l < El_; ++l) {
        sc[c][r] += s.scount[static_cast<size_t>(c) * cfg_.experts + r * El_ + l] * C_;
        rc[c][r] += s.rcount[(static_cast<size_t>(c) * P_ + r) * El_ + l] * C_;
      }
  std::vector<Work> disp(K), comb(K);
  auto start_dispatch = [&](int c) {
    const auto t = Clock::now();
    disp[c] = all_to_all_v(ep_, be_, rows_of(send, s.soff[c], s.soff[c + 1], C), std::span<const int64_t>(sc[c]),
                           rows_of(recv, s.roff[c], s.roff[c + 1], C), std::span<const int64_t>(rc[c]));
    st.a2a_call_s += since(t);
  };
  double poll_s = 0;
  const std::function<void()> poll = [&] {
    const auto t = Clock::now();
    for (auto& w : disp) w.test();
    for (auto& w : comb) w.test();
    poll_s += since(t);
  };
  auto wait = [&](Work& w) {
    const auto t = Clock::now();
    w.wait();
    const double d = since(t);
    st.a2a_wait_s += d;
    st.a2a_waits.push_back(d);
  };
  start_dispatch(0);
  for (int c = 0; c < K; ++c) {
    if (c + 1 < K) start_dispatch(c + 1);
    wait(disp[c]);
    const int64_t r0 = s.roff[c], r1 = s.roff[c + 1], m = r1 - r0;
    if (m > 0)
      be_.gather_rows(rows_of(ein, r0, r1, C), recv, s.to_expert.slice(r0, r1), static_cast<int>(m), C_);
    const auto t = Clock::now();
    const double p0 = poll_s;
    fn(c, ein, eout, poll);
    st.expert_s += since(t) - (poll_s - p0);
    if (m > 0)
      be_.gather_rows(rows_of(ret, r0, r1, C), eout, s.from_expert.slice(r0, r1), static_cast<int>(m), C_);
    const auto t2 = Clock::now();
    comb[c] = all_to_all_v(ep_, be_, rows_of(ret, r0, r1, C), std::span<const int64_t>(rc[c]),
                           rows_of(back, s.soff[c], s.soff[c + 1], C), std::span<const int64_t>(sc[c]));
    st.a2a_call_s += since(t2);
  }
  for (auto& w : comb) wait(w);
  st.a2a_call_s += poll_s;
}

namespace {
// Rows [0, M) in blocks of kPollRows: fn(first row, rows) for each, then a poll of the exchanges
// in flight.
template <class Fn>
void in_poll_blocks(int64_t M, const std::function<void()>& poll, Fn&& fn) {
  for (int64_t r = 0; r < M; r += kPollRows) {
    const int64_t b = std::min<int64_t>(kPollRows, M - r);
    fn(r, b);
    poll();
  }
}

// Each local expert l with rows in chunk c of a slot's expert side: fn(l, its first row, its rows M),
// in expert order (the rows of one expert are contiguous: expert major).
template <class SlotT, class Fn>
void for_each_expert_rows(const SlotT& s, int c, int P, int El, Fn&& fn) {
  int64_t off = 0;  // rows into the chunk
  for (int l = 0; l < El; ++l) {
    int64_t M = 0;
    for (int r = 0; r < P; ++r) M += s.rcount[(static_cast<size_t>(c) * P + r) * El + l];
    if (M == 0) continue;
    fn(l, s.roff[c] + off, M);
    off += M;
  }
}

// The counts a forward or backward reports besides its timings.
void count_rows(MoeStats& st, const Routing& R, int N, int k, size_t St, size_t Rt, double aux) {
  st.tokens = N;
  st.assignments = static_cast<int64_t>(N) * k;
  st.dropped = R.dropped;
  st.capacity = R.capacity;
  st.sent_rows = static_cast<int64_t>(St);
  st.recv_rows = static_cast<int64_t>(Rt);
  st.aux_loss = static_cast<float>(aux);
}

// The router's logit gradients (N, E) on the host: d probs from the gates' gradients dgate (N, k)
// and from the aux loss (weight daux; its loads and token count: load (E), Nt), then softmax
// backward.
std::vector<double> router_logit_grads(const Routing& R, const std::vector<double>& dgate, double daux,
                                       const std::vector<double>& load, double Nt) {
  const int N = R.N, E = R.E, k = R.k;
  std::vector<double> dlogit(static_cast<size_t>(N) * E, 0.0);
  std::vector<double> aux_dp(static_cast<size_t>(E));  // d aux / d probs[n, e] = E f_e / Nt
  for (int e = 0; e < E; ++e) aux_dp[static_cast<size_t>(e)] = daux * E * (load[static_cast<size_t>(e)] / (Nt * k)) / Nt;
  std::vector<double> dp(static_cast<size_t>(E));
  for (int n = 0; n < N; ++n) {
    const double* p = R.probs.data() + static_cast<size_t>(n) * E;
    for (int e = 0; e < E; ++e) dp[static_cast<size_t>(e)] = aux_dp[static_cast<size_t>(e)];
    const size_t a0 = static_cast<size_t>(n) * k;
    if (k == 1) {
      dp[static_cast<size_t>(R.expert[a0])] += dgate[a0];
    } else {
      // g_j = p_j / S, S = sum of the selected probs: d p_i = (d g_i - sum_j d g_j g_j) / S.
      double S = 0, sg = 0;
      for (int j = 0; j < k; ++j) {
        S += p[R.expert[a0 + j]];
        sg += dgate[a0 + j] * R.gate[a0 + j];
      }
      for (int j = 0; j < k; ++j) dp[static_cast<size_t>(R.expert[a0 + j])] += (dgate[a0 + j] - sg) / S;
    }
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[static_cast<size_t>(e)];
    double* dl = dlogit.data() + static_cast<size_t>(n) * E;
    for (int e = 0; e < E; ++e) dl[e] = p[e] * (dp[static_cast<size_t>(e)] - dot);
  }
  return dlogit;
}
}  // namespace

// Router logits on the backend; the routing itself on the host: its counts drive the exchange.
void MoeMlp::route(Slot& s, const Tensor& xin, int N) {
  const int E = cfg_.experts, k = cfg_.top_k;
  const Tensor logits = grow(logits_, static_cast<size_t>(N) * E, dt_);
  be_.linear_forward(logits, xin, P(router_), Tensor(), N, C_, E);
  const int64_t cap = cfg_.drop_tokens ? expert_capacity(N, E, k, cfg_.capacity_factor) : int64_t{-1};
  if (dt_ == DType::f64) {
    std::vector<double> hl(static_cast<size_t>(N) * E);
    be_.copy_to_host(hl.data(), logits, hl.size() * sizeof(double));
    s.R = route_tokens(hl.data(), N, E, k, cap);
  } else {
    s.R = route_tokens(host_f32(logits, static_cast<size_t>(N) * E).data(), N, E, k, cap);
  }
}

// The send layout of the slot's routing (send_asg, pos, scount, soff), each send row's token and
// gate uploaded, and the rows gathered from xin. Returns {token_of, rows to send}.
std::pair<Tensor, Tensor> MoeMlp::lay_out_sends(Slot& s, const Tensor& xin) {
  const Routing& R = s.R;
  const int N = s.N, E = cfg_.experts, k = cfg_.top_k, K = s.chunks;
  const int64_t C = C_;
  // Kept assignments of each expert in slot order.
  std::vector<std::vector<int32_t>> by_expert(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e)
    by_expert[static_cast<size_t>(e)].resize(static_cast<size_t>(std::min(R.load[static_cast<size_t>(e)], R.capacity)));
  for (size_t a = 0; a < R.slot.size(); ++a)
    if (R.slot[a] >= 0) by_expert[static_cast<size_t>(R.expert[a])][static_cast<size_t>(R.slot[a])] = static_cast<int32_t>(a);

  // Send layout: chunk c holds the assignments of tokens [N c / K, N (c + 1) / K).
  s.pos.assign(R.slot.size(), -1);
  s.scount.assign(static_cast<size_t>(K) * E, 0);
  s.soff.assign(static_cast<size_t>(K) + 1, 0);
  for (int c = 0; c < K; ++c) {
    const int64_t lo = int64_t{N} * c / K, hi = int64_t{N} * (c + 1) / K;
    s.soff[c] = static_cast<int64_t>(s.send_asg.size());
    for (int e = 0; e < E; ++e)
      for (int32_t a : by_expert[static_cast<size_t>(e)]) {
        const int n = a / k;
        if (n < lo || n >= hi) continue;
        s.pos[static_cast<size_t>(a)] = static_cast<int64_t>(s.send_asg.size());
        s.send_asg.push_back(a);
        ++s.scount[static_cast<size_t>(c) * E + e];
      }
  }
  const size_t St = s.send_asg.size();
  s.soff[K] = static_cast<int64_t>(St);
  std::vector<int32_t> tok(St);
  std::vector<double> gate(St);
  for (size_t r = 0; r < St; ++r) {
    tok[r] = s.send_asg[r] / k;
    gate[r] = R.gate[static_cast<size_t>(s.send_asg[r])];
  }
  const Tensor token_of = upload_i32(s.token_of, tok);
  upload_real(s.gate_of, gate);
  const Tensor xs = grow(send_, St * C, dt_);
  if (St > 0) be_.gather_rows(xs, xin, token_of, static_cast<int>(St), C_);
  return {token_of, xs};
}

// The aux loss of the micro-batch from its per-expert loads and probability sums and its token
// count, summed over the CP group (each rank holds T/cp rows of every sequence). Without CP: R's
// own, in route_tokens' order of operations (the same bits as R.aux_loss).
void MoeMlp::aux_terms(Slot& s) {
  const Routing& R = s.R;
  const int E = cfg_.experts;
  std::vector<double> v(2 * static_cast<size_t>(E) + 1, 0.0);
  for (int e = 0; e < E; ++e) {
    v[static_cast<size_t>(e)] = static_cast<double>(R.load[static_cast<size_t>(e)]);
    double P = 0;
    for (int n = 0; n < R.N; ++n) P += R.probs[static_cast<size_t>(n) * E + e];
    v[static_cast<size_t>(E + e)] = P;
  }
  v[2 * static_cast<size_t>(E)] = R.N;
  if (cp_) cp_->all_reduce(std::span<double>(v), ReduceOp::sum).wait();
  s.aux_load.assign(v.begin(), v.begin() + E);
  s.aux_N = v[2 * static_cast<size_t>(E)];
  const double N = s.aux_N;
  double aux = 0;
  for (int e = 0; e < E; ++e) aux += v[static_cast<size_t>(e)] / (N * R.k) * (v[static_cast<size_t>(E + e)] / N);
  s.aux = N > 0 ? aux * E : 0.0;
}

// Row counts for every chunk in one exchange (block r holds (chunks, El) counts for rank r), then
// the expert side's layout: rcount, roff and the row permutations of each chunk.
void MoeMlp::exchange_counts(Slot& s, MoeStats& st) {
  const int E = cfg_.experts, K = s.chunks;
  const size_t blk = static_cast<size_t>(K) * El_;
  std::vector<int64_t> cin(blk * P_), cout(blk * P_);
  for (int r = 0; r < P_; ++r)
    for (int c = 0; c < K; ++c)
      for (int l = 0; l < El_; ++l) cin[r * blk + c * El_ + l] = s.scount[static_cast<size_t>(c) * E + r * El_ + l];
  {
    auto t = Clock::now();
    Work w = ep_.all_to_all(std::span<const int64_t>(cin), std::span<int64_t>(cout));
    st.a2a_call_s += since(t);
    t = Clock::now();
    w.wait();
    st.a2a_wait_s += since(t);
    st.a2a_waits.push_back(st.a2a_wait_s);
  }
  s.rcount.assign(static_cast<size_t>(K) * P_ * El_, 0);
  s.roff.assign(static_cast<size_t>(K) + 1, 0);
  std::vector<int32_t> to_e, from_e;
  for (int c = 0; c < K; ++c) {
    int64_t rows = 0;
    for (int r = 0; r < P_; ++r)
      for (int l = 0; l < El_; ++l) {
        const int64_t v = cout[r * blk + c * El_ + l];
        if (v < 0) TRIAX_THROW(CommError, "MoE layer {}: rank {} of {} announced {} rows", layer_, r, ep_.describe(), v);
        s.rcount[(static_cast<size_t>(c) * P_ + r) * El_ + l] = v;
        rows += v;
      }
    s.roff[c + 1] = s.roff[c] + rows;
    permutation(s.rcount.data() + static_cast<size_t>(c) * P_ * El_, P_, El_, s.roff[c], to_e, from_e);
  }
  upload_i32(s.to_expert, to_e);
  upload_i32(s.from_expert, from_e);
}

double MoeMlp::forward(int sl, int N, const Tensor& x, const Tensor& y, bool training) {
  if (N < 1) TRIAX_THROW(ConfigError, "MoE layer {} forward: {} tokens (need >= 1)", layer_, N);
  if (!x.defined() || !y.defined()) TRIAX_THROW(ConfigError, "MoE layer {} forward: null input or output", layer_);
  if (slots_.count(sl)) TRIAX_THROW(ConfigError, "MoE layer {}: micro-batch slot {} already holds a forward pass", layer_, sl);
  const auto t0 = Clock::now();
  MoeStats st;
  std::unique_ptr<Slot> sp;
  if (!free_slots_.empty()) {
    sp = std::move(free_slots_.back());
    free_slots_.pop_back();
  } else {
    sp = std::make_unique<Slot>();
  }
  Slot& s = *sp;
  s.send_asg.clear();
  const int k = cfg_.top_k, K = cfg_.chunks;
  const int64_t C = C_, F = F_;
  s.N = N;
  s.chunks = K;
  const Tensor xin = x.slice(0, N * C);
  const Tensor xs_keep = grow(s.x, static_cast<size_t>(N * C), dt_);
  be_.copy(xs_keep, xin);

  route(s, xin, N);
  touch_experts(false);  // after the router's weights: the experts are the last unit fetched
  aux_terms(s);
  const Routing& R = s.R;
  const auto [token_of, xs] = lay_out_sends(s, xin);
  const size_t St = s.send_asg.size();
  exchange_counts(s, st);
  const size_t Rt = static_cast<size_t>(s.roff[K]);
  const int64_t Fh = F * in_parts();
  const Tensor xe = grow(s.xe, Rt * C, dt_);
  const Tensor hh = grow(s.h, Rt * Fh, dt_);
  const Tensor aa = grow(s.a, Rt * F, dt_);
  const Tensor o = grow(s.o, St * C, dt_);  // every row is written by the combine

  // Experts: C -> Fh (bias), GELU or SwiGLU, F -> C (bias), on each local expert's rows of the chunk.
  auto expert_fwd = [&](int c, const Tensor& in, const Tensor& out, const std::function<void()>& poll) {
    for_each_expert_rows(s, c, P_, El_, [&](int l, int64_t row, int64_t M) {
      const Expert& X = experts_[static_cast<size_t>(l)];
      const Tensor win = PN(X.in, in_parts()), bin = PN(X.inb, in_parts());
      in_poll_blocks(M, poll, [&](int64_t r, int64_t b) {
        be_.linear_forward(rows_of(hh, row + r, row + r + b, Fh), rows_of(in, row + r, row + r + b, C), win, bin,
                           static_cast<int>(b), C_, static_cast<int>(Fh));
      });
      if (cfg_.swiglu)
        be_.swiglu_forward(rows_of(aa, row, row + M, F), rows_of(hh, row, row + M, Fh), static_cast<int>(M), F_);
      else
        be_.gelu_forward(rows_of(aa, row, row + M, F), rows_of(hh, row, row + M, F));
      const Tensor wout = PN(X.out, 1), bout = PN(X.outb, 1);
      in_poll_blocks(M, poll, [&](int64_t r, int64_t b) {
        be_.linear_forward(rows_of(out, row + r, row + r + b, C), rows_of(aa, row + r, row + r + b, F), wout, bout,
                           static_cast<int>(b), F_, C_);
      });
    });
  };
  exchange(s, xs, o, xe, expert_fwd, st);

  // Combine: weighted sum of each token's kept expert outputs (at most two terms per token, so
  // the order of the sum does not change its bits).
  const Tensor yv = y.slice(0, N * C);
  be_.fill(yv, 0.0);
  if (St > 0) be_.scatter_add_rows(yv, o, token_of, s.gate_of.slice(0, static_cast<int64_t>(St)), static_cast<int>(St), C_);

  count_rows(st, R, N, k, St, Rt, s.aux);
  st.total_s = since(t0);
  fwd_stats_ = st;
  last_routing_ = R;
  const double aux = s.aux;
  if (training)
    slots_[sl] = std::move(sp);
  else
    free_slots_.push_back(std::move(sp));
  return aux;
}

void MoeMlp::backward(int sl, const Tensor& dy, const Tensor& dx, float dloss) {
  auto it = slots_.find(sl);
  if (it == slots_.end())
    TRIAX_THROW(ConfigError, "MoE layer {}: backward of micro-batch slot {} that has no forward activations", layer_, sl);
  if (!dy.defined() || !dx.defined()) TRIAX_THROW(ConfigError, "MoE layer {} backward: null gradient pointer", layer_);
  if (!std::isfinite(dloss)) TRIAX_THROW(ConfigError, "MoE layer {} backward: dloss = {} is not finite", layer_, dloss);
  const auto t0 = Clock::now();
  MoeStats st;
  Slot& s = *it->second;
  const Routing& R = s.R;
  const int N = s.N, k = cfg_.top_k, K = s.chunks;
  const int64_t C = C_, F = F_;
  const size_t St = s.send_asg.size(), Rt = static_cast<size_t>(s.roff[K]);
  const Tensor dyv = dy.slice(0, N * C), dxv = dx.slice(0, N * C);
  touch_experts(true);

  // d gate = dy . expert output; the expert output's gradient is gate * dy.
  std::vector<double> dgate(R.slot.size(), 0.0);
  const Tensor dys = grow(ein_, St * C, dt_);  // dy of each send row (reused below as de)
  const Tensor ds = grow(send_, St * C, dt_);
  const Tensor dxs = grow(back_, St * C, dt_);
  if (St > 0) {
    const Tensor token_of = s.token_of.slice(0, static_cast<int64_t>(St));
    be_.gather_rows(dys, dyv, token_of, static_cast<int>(St), C_);
    const Tensor dots = grow(dots_, St, DType::f64);
    be_.row_dots(dots, dys, s.o.slice(0, static_cast<int64_t>(St) * C), static_cast<int>(St), C_);
    std::vector<double> hd(St);
    be_.copy_to_host(hd.data(), dots, St * sizeof(double));
    for (size_t r = 0; r < St; ++r) dgate[static_cast<size_t>(s.send_asg[r])] = hd[r];
    be_.scale_rows(ds, dys, s.gate_of.slice(0, static_cast<int64_t>(St)), static_cast<int>(St), C_);
  }
  const Tensor de = grow(ein2_, Rt * C, dt_);

  // Experts backward, mirror of the forward: c_proj (down), GELU or SwiGLU, c_fc (gate and up fused).
  const int64_t Fh = F * in_parts();
  auto expert_bwd = [&](int c, const Tensor& in, const Tensor& out, const std::function<void()>& poll) {
    for_each_expert_rows(s, c, P_, El_, [&](int l, int64_t row, int64_t M) {
      const Expert& X = experts_[static_cast<size_t>(l)];
      const Tensor da = grow(da_, static_cast<size_t>(M * F), dt_);
      const Tensor wout = PN(X.out, 1);
      const Tensor gout = GN(X.out, 1), gbout = GN(X.outb, 1);
      in_poll_blocks(M, poll, [&](int64_t r, int64_t b) {
        be_.linear_backward(rows_of(da, r, r + b, F), gout, gbout, rows_of(in, row + r, row + r + b, C),
                            rows_of(s.a, row + r, row + r + b, F), wout, static_cast<int>(b), F_, C_);
      });
      Tensor dh = da;  // GELU's backward runs in place
      if (cfg_.swiglu) {
        dh = grow(dh_, static_cast<size_t>(M * Fh), dt_);
        be_.swiglu_backward(dh, da, rows_of(s.h, row, row + M, Fh), static_cast<int>(M), F_);
      } else {
        be_.gelu_backward(da, rows_of(s.h, row, row + M, F), da);
      }
      const Tensor win = PN(X.in, in_parts()), gin = GN(X.in, in_parts()), gbin = GN(X.inb, in_parts());
      in_poll_blocks(M, poll, [&](int64_t r, int64_t b) {
        be_.linear_backward(rows_of(out, row + r, row + r + b, C), gin, gbin, rows_of(dh, r, r + b, Fh),
                            rows_of(s.xe, row + r, row + r + b, C), win, static_cast<int>(b), C_, static_cast<int>(Fh));
      });
    });
  };
  exchange(s, ds, dxs, de, expert_bwd, st);
  for (size_t l = experts_.size(); l-- > 0;)
    for (size_t j = experts_[l].params.size(); j-- > 0;) ready(experts_[l].params[j]);

  // Router (host: the routing lives there), then its GEMMs on the backend. Under CP this rank's
  // tokens carry their share of the micro-batch's aux gradient times cp: the dp x cp average of
  // the weight gradients sums the shares (as the token losses' mean over T/cp rows does).
  const double daux = static_cast<double>(cfg_.aux_loss_coef) * dloss * (cp_ ? cp_->size() : 1);
  const std::vector<double> dlogit = router_logit_grads(R, dgate, daux, s.aux_load, s.aux_N);
  const Tensor dlt = upload_real(dlogit_, dlogit);
  be_.linear_backward(dxv, G(router_), Tensor(), dlt, s.x.slice(0, N * C), P(router_), N, C_, cfg_.experts);
  ready(router_);
  // The expert paths' input gradients.
  if (St > 0) be_.scatter_add_rows(dxv, dxs, s.token_of.slice(0, static_cast<int64_t>(St)), Tensor(), static_cast<int>(St), C_);
  count_rows(st, R, N, k, St, Rt, s.aux);
  st.total_s = since(t0);
  bwd_stats_ = st;
  release(sl);
}

// Host-memory convenience for tests and tools: copies through the backend.
double MoeMlp::forward(int sl, int N, const float* x, float* y, bool training) {
  if (N < 1) TRIAX_THROW(ConfigError, "MoE layer {} forward: {} tokens (need >= 1)", layer_, N);
  if (!x || !y) TRIAX_THROW(ConfigError, "MoE layer {} forward: null input or output", layer_);
  if (dt_ != DType::f32) TRIAX_THROW(ConfigError, "MoE host forward needs a float32 store");
  const size_t n = static_cast<size_t>(N) * C_;
  Tensor xt = be_.empty(Shape{static_cast<int64_t>(n)}, DType::f32), yt = be_.empty(Shape{static_cast<int64_t>(n)}, DType::f32);
  be_.copy_from_host(xt, x, n * sizeof(float));
  const double aux = forward(sl, N, xt, yt, training);
  be_.copy_to_host(y, yt, n * sizeof(float));
  return aux;
}

void MoeMlp::backward(int sl, const float* dy, float* dx, float dloss) {
  if (!dy || !dx) TRIAX_THROW(ConfigError, "MoE layer {} backward: null gradient pointer", layer_);
  auto it = slots_.find(sl);
  if (it == slots_.end())
    TRIAX_THROW(ConfigError, "MoE layer {}: backward of micro-batch slot {} that has no forward activations", layer_, sl);
  const size_t n = static_cast<size_t>(it->second->N) * C_;
  Tensor dyt = be_.empty(Shape{static_cast<int64_t>(n)}, DType::f32), dxt = be_.empty(Shape{static_cast<int64_t>(n)}, DType::f32);
  be_.copy_from_host(dyt, dy, n * sizeof(float));
  backward(sl, dyt, dxt, dloss);
  be_.copy_to_host(dx, dxt, n * sizeof(float));
}

// ZeRO-2/3 (views move): fetching a unit's view gathers its weights (ZeRO-3) or opens its
// gradient buffer, whose reduce-scatter starts once every parameter is ready; both are collective
// over the expert shard group. Experts that receive no rows in a micro-batch are never fetched by
// the exchange, and a rank whose local experts all get none would skip the collective its peers
// make (a hang; likelier under CP, with T/cp tokens per rank). So every rank fetches its experts'
// weights (and, in backward, gradients) just before the exchange, at the same point of every
// forward / backward: the exchange then only refetches the unit fetched last (no prefetch, the
// same LRU order of ZeRO-3's resident units on every rank).
void MoeMlp::touch_experts(bool grads) {
  if (!store_.views_move()) return;
  for (const Expert& X : experts_) {
    (void)PN(X.in, in_parts());
    (void)PN(X.out, 1);
    if (grads) (void)GN(X.in, in_parts()), (void)GN(X.out, 1);
  }
}

Tensor MoeMlp::P(size_t i) {
  if (store_.views_move()) return store_.weight_t(i);  // ZeRO-2/3: views move, never cached
  auto it = pview_.find(i);
  if (it == pview_.end()) it = pview_.emplace(i, store_.weight_t(i)).first;  // the compute view
  return it->second;
}

Tensor MoeMlp::PN(size_t i, int n) {
  if (i == kNone) return Tensor();
  if (store_.views_move()) return store_.weights_of(i, static_cast<size_t>(n));
  auto it = pnview_.find({i, n});
  if (it == pnview_.end()) {
    const auto& first = store_.info(i);
    const auto& last = store_.info(i + static_cast<size_t>(n) - 1);
    it = pnview_.emplace(std::make_pair(i, n), store_.weights_t().slice(static_cast<int64_t>(first.offset),
                                                                         static_cast<int64_t>(last.offset + last.numel)))
             .first;
  }
  return it->second;
}

Tensor MoeMlp::GN(size_t i, int n) {
  if (i == kNone) return Tensor();
  if (store_.views_move()) return store_.grads_of(i, static_cast<size_t>(n));
  auto it = gnview_.find({i, n});
  if (it == gnview_.end()) {
    const auto& first = store_.info(i);
    const auto& last = store_.info(i + static_cast<size_t>(n) - 1);
    it = gnview_.emplace(std::make_pair(i, n), store_.grads_t().slice(static_cast<int64_t>(first.offset),
                                                                       static_cast<int64_t>(last.offset + last.numel)))
             .first;
  }
  return it->second;
}

Tensor MoeMlp::G(size_t i) {
  if (store_.views_move()) return store_.grad_t(i);
  auto it = gview_.find(i);
  if (it == gview_.end()) it = gview_.emplace(i, store_.grad_t(i)).first;
  return it->second;
}

}  // namespace triax
