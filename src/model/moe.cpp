// MoE MLP with expert parallelism on the CPU path (fp32). Per micro-batch of N local tokens:
//   logits = x Wr^T (N, E); probs = softmax; top-k; gates; capacity slots   (route_tokens)
//   send rows: per chunk, per destination expert (ascending, so per owner rank), in slot order
//   counts:   one all_to_all of (chunks x E/ep) row counts per rank pair
//   per chunk c: dispatch all_to_all_v -> experts (C -> F -> C, GELU) -> combine all_to_all_v,
//             with chunk c+1's dispatch and chunk c-1's combine in flight during chunk c's GEMMs
//   y[n] = sum_j gate[n, j] * expert_j(x[n]) over the kept assignments, in choice order
// Backward runs the same exchange on the gradient rows (g * dy out, dx rows back), then the
// router: d gates (and the aux loss) -> d probs -> softmax backward -> dWr, dx.
#include "triax/model/moe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "triax/model/shard.h"
#include "triax/ops/gelu.h"
#include "triax/ops/linear.h"

namespace triax {

namespace {
using Clock = std::chrono::steady_clock;
// Expert GEMMs run in blocks of this many rows with a poll of the in-flight exchanges between
// blocks: MPI moves a nonblocking all-to-all only inside MPI calls, so without these polls the
// next chunk's dispatch would make no progress while the experts compute.
constexpr int kPollRows = 128;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Copies the blocks of rows of one chunk between the layout the exchange delivers (source rank
// major: for src, for local expert) and the layout the expert GEMMs want (expert major: for local
// expert, for src). cnt is (P, El) rows.
// Grows v to at least n elements (never shrinks: the capacity is reused by the next call).
float* scratch(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

void permute_rows(const float* in, float* out, const int64_t* cnt, int P, int El, size_t width, bool to_expert_major) {
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
  for (size_t i = 0; i < so.size(); ++i) {
    const size_t n = static_cast<size_t>(cnt[i]) * width;
    if (n == 0) continue;
    const size_t a = static_cast<size_t>(so[i]) * width, b = static_cast<size_t>(eo[i]) * width;
    if (to_expert_major)
      std::memcpy(out + b, in + a, n * sizeof(float));
    else
      std::memcpy(out + a, in + b, n * sizeof(float));
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

Routing route_tokens(const float* logits, int N, int E, int k, int64_t capacity) {
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
    const float* l = logits + static_cast<size_t>(n) * E;
    float* p = R.probs.data() + static_cast<size_t>(n) * E;
    float m = l[0];
    for (int e = 0; e < E; ++e) {
      if (!std::isfinite(l[e]))
        TRIAX_THROW(ConfigError, "route_tokens: token {} has a non-finite router logit {} for expert {}", n, l[e], e);
      m = std::max(m, l[e]);
    }
    double s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(static_cast<double>(l[e]) - m);
    for (int e = 0; e < E; ++e) p[e] = static_cast<float>(std::exp(static_cast<double>(l[e]) - m) / s);
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
    float* g = R.gate.data() + static_cast<size_t>(n) * k;
    if (k == 1) {
      g[0] = p[sel[0]];
    } else {
      float S = 0;
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
    R.aux_loss = static_cast<float>(aux * E);
  }
  return R;
}

// Activations of one micro-batch. "Send layout": the rows this rank sends, chunk by chunk, each
// chunk ordered by destination expert then capacity slot. "Expert side": the rows this rank's
// experts process, chunk by chunk, each chunk expert major (for local expert, for source rank).
struct MoeMlp::Slot {
  int N = 0;
  int chunks = 1;
  std::vector<float> x;           // (N, C) layer input
  Routing R;
  std::vector<int64_t> pos;       // (N, k) row of each assignment in the send layout; -1 dropped
  std::vector<int32_t> send_asg;  // (St) assignment n * k + j of each send row
  std::vector<int64_t> scount;    // (chunks, E) rows to each expert
  std::vector<int64_t> rcount;    // (chunks, P, El) rows from each source rank to each local expert
  std::vector<int64_t> soff, roff;  // (chunks + 1) row offsets of each chunk, send layout / expert side
  std::vector<float> o;           // (St, C) expert outputs, back at the source, send layout
  std::vector<float> xe, h, a;    // (Rt, C), (Rt, F), (Rt, F) expert inputs, pre- and post-GELU
};

MoeMlp::MoeMlp(const MoeConfig& cfg, int layer, int C, int F, Communicator& ep, ParamStore& store, bool norm_owner)
    : cfg_(cfg), layer_(layer), C_(C), F_(F), ep_(ep), store_(store) {
  cfg_.validate(ep.size());
  if (C < 1 || F < 1) TRIAX_THROW(ConfigError, "MoE layer {}: hidden sizes C = {}, F = {} must be >= 1", layer, C, F);
  P_ = ep.size();
  El_ = cfg_.experts / P_;
  e0_ = ep.rank() * El_;
  const std::string p = fmt::format("transformer.h.{}.moe.", layer);
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool decay, bool expert) {
    ParamSpec ps{name, shape, TpSplit::none, decay, norm_owner};
    ps.expert = expert;
    const size_t i = store_.add(ps, shape);
    owned_.push_back(i);
    return i;
  };
  const int64_t E = cfg_.experts;
  router_ = add(p + "router.weight", {E, C}, true, false);
  for (int l = 0; l < El_; ++l) {
    const std::string q = fmt::format("{}experts.{}.", p, e0_ + l);
    Expert x{};
    x.fcw = add(q + "c_fc.weight", {F, C}, true, true);
    x.fcb = add(q + "c_fc.bias", {F}, false, true);
    x.pw = add(q + "c_proj.weight", {C, F}, true, true);
    x.pb = add(q + "c_proj.bias", {C}, false, true);
    experts_.push_back(x);
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
  for (size_t i : owned_) {
    const auto& info = store_.info(i);
    auto dst = store_.param(i);
    if (info.spec.name.ends_with(".bias")) {
      std::fill(dst.begin(), dst.end(), 0.0f);
      continue;
    }
    const bool proj = info.spec.name.ends_with("c_proj.weight");
    const auto v = init_normal(seed, info.spec.name, info.numel, proj ? proj_std : 0.02f);
    std::copy(v.begin(), v.end(), dst.begin());
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
void MoeMlp::exchange(Slot& s, const float* send, float* back, float* ein, const ExpertFn& fn, MoeStats& st) {
  const int K = s.chunks;
  const size_t C = static_cast<size_t>(C_);
  const size_t Rt = static_cast<size_t>(s.roff[K]);
  float* recv = scratch(recv_, Rt * C);
  float* eout = scratch(eout_, Rt * C);
  float* ret = scratch(ret_, Rt * C);
  std::vector<std::vector<int64_t>> sc(K, std::vector<int64_t>(P_, 0)), rc(K, std::vector<int64_t>(P_, 0));
  for (int c = 0; c < K; ++c)
    for (int r = 0; r < P_; ++r)
      for (int l = 0; l < El_; ++l) {
        sc[c][r] += s.scount[static_cast<size_t>(c) * cfg_.experts + r * El_ + l] * C_;
        rc[c][r] += s.rcount[(static_cast<size_t>(c) * P_ + r) * El_ + l] * C_;
      }
  std::vector<Work> disp(K), comb(K);
  auto chunk = [&](auto* base, const std::vector<int64_t>& off, int c) {
    return std::span(base + off[c] * C, static_cast<size_t>(off[c + 1] - off[c]) * C);
  };
  auto start_dispatch = [&](int c) {
    const auto t = Clock::now();
    disp[c] = ep_.all_to_all_v(std::span<const float>(chunk(send, s.soff, c)), std::span<const int64_t>(sc[c]),
                               chunk(recv, s.roff, c), std::span<const int64_t>(rc[c]));
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
    const int64_t* cnt = s.rcount.data() + static_cast<size_t>(c) * P_ * El_;
    permute_rows(recv + s.roff[c] * C, ein + s.roff[c] * C, cnt, P_, El_, C, true);
    const auto t = Clock::now();
    const double p0 = poll_s;
    fn(c, ein + s.roff[c] * C, eout + s.roff[c] * C, poll);
    st.expert_s += since(t) - (poll_s - p0);
    permute_rows(eout + s.roff[c] * C, ret + s.roff[c] * C, cnt, P_, El_, C, false);
    const auto t2 = Clock::now();
    comb[c] = ep_.all_to_all_v(std::span<const float>(chunk(ret, s.roff, c)), std::span<const int64_t>(rc[c]),
                               chunk(back, s.soff, c), std::span<const int64_t>(sc[c]));
    st.a2a_call_s += since(t2);
  }
  for (auto& w : comb) wait(w);
  st.a2a_call_s += poll_s;
}

float MoeMlp::forward(int sl, int N, const float* x, float* y, bool training) {
  if (N < 1) TRIAX_THROW(ConfigError, "MoE layer {} forward: {} tokens (need >= 1)", layer_, N);
  if (!x || !y) TRIAX_THROW(ConfigError, "MoE layer {} forward: null input or output", layer_);
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
  const int E = cfg_.experts, k = cfg_.top_k, K = cfg_.chunks;
  const size_t C = static_cast<size_t>(C_), F = static_cast<size_t>(F_);
  s.N = N;
  s.chunks = K;
  s.x.assign(x, x + static_cast<size_t>(N) * C);

  std::vector<float> logits(static_cast<size_t>(N) * E);
  ops::linear_forward(logits.data(), x, store_.param(router_).data(), static_cast<const float*>(nullptr), N, C_, E);
  s.R = route_tokens(logits.data(), N, E, k,
                     cfg_.drop_tokens ? expert_capacity(N, E, k, cfg_.capacity_factor) : int64_t{-1});
  const Routing& R = s.R;

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
  float* xs = scratch(send_, St * C);
  for (size_t r = 0; r < St; ++r)
    std::memcpy(xs + r * C, x + static_cast<size_t>(s.send_asg[r] / k) * C, C * sizeof(float));

  // Row counts for every chunk in one exchange: block r holds (chunks, El) counts for rank r.
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
  }
  const size_t Rt = static_cast<size_t>(s.roff[K]);
  s.xe.resize(Rt * C);
  s.h.resize(Rt * F);
  s.a.resize(Rt * F);
  s.o.resize(St * C);  // every row is written by the combine

  auto expert_fwd = [&](int c, const float* in, float* out, const std::function<void()>& poll) {
    size_t off = 0;  // rows into the chunk
    for (int l = 0; l < El_; ++l) {
      int64_t M = 0;
      for (int r = 0; r < P_; ++r) M += s.rcount[(static_cast<size_t>(c) * P_ + r) * El_ + l];
      if (M == 0) continue;
      const Expert& X = experts_[static_cast<size_t>(l)];
      const size_t row = static_cast<size_t>(s.roff[c]) + off;
      float* h = s.h.data() + row * F;
      float* a = s.a.data() + row * F;
      const int m = static_cast<int>(M);
      for (int r = 0; r < m; r += kPollRows) {
        const int b = std::min(kPollRows, m - r);
        ops::linear_forward(h + r * F, in + (off + r) * C, store_.param(X.fcw).data(), store_.param(X.fcb).data(), b,
                            C_, F_);
        poll();
      }
      ops::gelu_forward(a, h, M * F_);
      for (int r = 0; r < m; r += kPollRows) {
        const int b = std::min(kPollRows, m - r);
        ops::linear_forward(out + (off + r) * C, a + r * F, store_.param(X.pw).data(), store_.param(X.pb).data(), b,
                            F_, C_);
        poll();
      }
      off += static_cast<size_t>(M);
    }
  };
  exchange(s, xs, s.o.data(), s.xe.data(), expert_fwd, st);

  // Combine: weighted sum of each token's kept expert outputs, in choice order.
  std::fill(y, y + static_cast<size_t>(N) * C, 0.0f);
  for (int n = 0; n < N; ++n) {
    float* yr = y + static_cast<size_t>(n) * C;
    for (int j = 0; j < k; ++j) {
      const size_t a = static_cast<size_t>(n) * k + j;
      if (s.pos[a] < 0) continue;
      const float g = R.gate[a];
      const float* o = s.o.data() + static_cast<size_t>(s.pos[a]) * C;
      for (size_t i = 0; i < C; ++i) yr[i] += g * o[i];
    }
  }

  st.tokens = N;
  st.assignments = static_cast<int64_t>(N) * k;
  st.dropped = R.dropped;
  st.capacity = R.capacity;
  st.sent_rows = static_cast<int64_t>(St);
  st.recv_rows = static_cast<int64_t>(Rt);
  st.aux_loss = R.aux_loss;
  st.total_s = since(t0);
  fwd_stats_ = st;
  last_routing_ = R;
  const float aux = R.aux_loss;
  if (training)
    slots_[sl] = std::move(sp);
  else
    free_slots_.push_back(std::move(sp));
  return aux;
}

void MoeMlp::backward(int sl, const float* dy, float* dx, float dloss) {
  auto it = slots_.find(sl);
  if (it == slots_.end())
    TRIAX_THROW(ConfigError, "MoE layer {}: backward of micro-batch slot {} that has no forward activations", layer_, sl);
  if (!dy || !dx) TRIAX_THROW(ConfigError, "MoE layer {} backward: null gradient pointer", layer_);
  if (!std::isfinite(dloss)) TRIAX_THROW(ConfigError, "MoE layer {} backward: dloss = {} is not finite", layer_, dloss);
  const auto t0 = Clock::now();
  MoeStats st;
  Slot& s = *it->second;
  const Routing& R = s.R;
  const int N = s.N, E = cfg_.experts, k = cfg_.top_k, K = s.chunks;
  const size_t C = static_cast<size_t>(C_), F = static_cast<size_t>(F_);
  const size_t St = s.send_asg.size(), Rt = static_cast<size_t>(s.roff[K]);

  // d gate = dy . expert output; the expert output's gradient is gate * dy.
  std::vector<float> dgate(R.slot.size(), 0.0f);
  float* ds = scratch(send_, St * C);
  float* dxs = scratch(back_, St * C);
  float* de = scratch(ein_, Rt * C);
  for (size_t r = 0; r < St; ++r) {
    const int32_t a = s.send_asg[r];
    const float* d = dy + static_cast<size_t>(a / k) * C;
    const float* o = s.o.data() + r * C;
    double dot = 0;
    for (size_t i = 0; i < C; ++i) dot += static_cast<double>(d[i]) * o[i];
    dgate[static_cast<size_t>(a)] = static_cast<float>(dot);
    const float g = R.gate[static_cast<size_t>(a)];
    float* out = ds + r * C;
    for (size_t i = 0; i < C; ++i) out[i] = g * d[i];
  }

  auto expert_bwd = [&](int c, const float* in, float* out, const std::function<void()>& poll) {
    size_t off = 0;
    std::vector<float> da;
    for (int l = 0; l < El_; ++l) {
      int64_t M = 0;
      for (int r = 0; r < P_; ++r) M += s.rcount[(static_cast<size_t>(c) * P_ + r) * El_ + l];
      if (M == 0) continue;
      const Expert& X = experts_[static_cast<size_t>(l)];
      const size_t row = static_cast<size_t>(s.roff[c]) + off;
      const int m = static_cast<int>(M);
      da.resize(static_cast<size_t>(M) * F);
      for (int r = 0; r < m; r += kPollRows) {
        const int b = std::min(kPollRows, m - r);
        ops::linear_backward(da.data() + r * F, store_.grad(X.pw).data(), store_.grad(X.pb).data(),
                             in + (off + r) * C, s.a.data() + (row + r) * F, store_.param(X.pw).data(), b, F_, C_);
        poll();
      }
      ops::gelu_backward(da.data(), s.h.data() + row * F, da.data(), M * F_);
      for (int r = 0; r < m; r += kPollRows) {
        const int b = std::min(kPollRows, m - r);
        ops::linear_backward(out + (off + r) * C, store_.grad(X.fcw).data(), store_.grad(X.fcb).data(),
                             da.data() + r * F, s.xe.data() + (row + r) * C, store_.param(X.fcw).data(), b, C_, F_);
        poll();
      }
      off += static_cast<size_t>(M);
    }
  };
  exchange(s, ds, dxs, de, expert_bwd, st);
  for (size_t l = experts_.size(); l-- > 0;) {
    ready(experts_[l].pb);
    ready(experts_[l].pw);
    ready(experts_[l].fcb);
    ready(experts_[l].fcw);
  }

  // Router: d probs from the gates and from the aux loss, then softmax backward.
  std::vector<float> dlogit(static_cast<size_t>(N) * E, 0.0f);
  const double daux = static_cast<double>(cfg_.aux_loss_coef) * dloss;
  std::vector<double> aux_dp(static_cast<size_t>(E));  // d aux / d probs[n, e] = E f_e / N
  for (int e = 0; e < E; ++e)
    aux_dp[static_cast<size_t>(e)] =
        daux * E * (static_cast<double>(R.load[static_cast<size_t>(e)]) / (static_cast<double>(N) * k)) / N;
  std::vector<double> dp(static_cast<size_t>(E));
  for (int n = 0; n < N; ++n) {
    const float* p = R.probs.data() + static_cast<size_t>(n) * E;
    for (int e = 0; e < E; ++e) dp[static_cast<size_t>(e)] = aux_dp[static_cast<size_t>(e)];
    const size_t a0 = static_cast<size_t>(n) * k;
    if (k == 1) {
      dp[static_cast<size_t>(R.expert[a0])] += dgate[a0];
    } else {
      // g_j = p_j / S, S = sum of the selected probs: d p_i = (d g_i - sum_j d g_j g_j) / S.
      double S = 0, sg = 0;
      for (int j = 0; j < k; ++j) {
        S += p[R.expert[a0 + j]];
        sg += static_cast<double>(dgate[a0 + j]) * R.gate[a0 + j];
      }
      for (int j = 0; j < k; ++j) dp[static_cast<size_t>(R.expert[a0 + j])] += (dgate[a0 + j] - sg) / S;
    }
    double dot = 0;
    for (int e = 0; e < E; ++e) dot += p[e] * dp[static_cast<size_t>(e)];
    float* dl = dlogit.data() + static_cast<size_t>(n) * E;
    for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(p[e] * (dp[static_cast<size_t>(e)] - dot));
  }
  ops::linear_backward(dx, store_.grad(router_).data(), static_cast<float*>(nullptr), dlogit.data(), s.x.data(),
                       store_.param(router_).data(), N, C_, E);
  ready(router_);
  // The expert paths' input gradients, in choice order.
  for (int n = 0; n < N; ++n) {
    float* dr = dx + static_cast<size_t>(n) * C;
    for (int j = 0; j < k; ++j) {
      const int64_t p = s.pos[static_cast<size_t>(n) * k + j];
      if (p < 0) continue;
      const float* g = dxs + static_cast<size_t>(p) * C;
      for (size_t i = 0; i < C; ++i) dr[i] += g[i];
    }
  }
  st.tokens = N;
  st.assignments = static_cast<int64_t>(N) * k;
  st.dropped = R.dropped;
  st.capacity = R.capacity;
  st.sent_rows = static_cast<int64_t>(St);
  st.recv_rows = static_cast<int64_t>(Rt);
  st.aux_loss = R.aux_loss;
  st.total_s = since(t0);
  bwd_stats_ = st;
  release(sl);
}

}  // namespace triax
