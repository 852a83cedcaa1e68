// Bucketed, overlapped DP gradient synchronisation. Buckets start strictly in index order on
// every rank (collectives on one communicator must be issued in the same order everywhere),
// whatever order the executor marks parameters in; a bucket that is complete waits for its
// predecessors, never the other way round.
#include "triax/optim/grad_buffer.h"

#include "triax/core/trace.h"

#include "triax/backend/comm_ops.h"

#include <algorithm>
#include <limits>

#include "triax/core/clock.h"
#include "triax/core/log.h"

namespace triax {
namespace {

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
size_t round_down(size_t x, size_t a) { return x / a * a; }

// Buckets over the flat range [lo, hi), walking parameters from the end (the order in which
// backward completes them). A boundary goes at a parameter's start (rounded up to align, so the
// bucket above never depends on the parameter below) once the bucket holds >= target elements.
void split_region(const std::vector<ParamInfo>& params, size_t lo, size_t hi, size_t align, size_t target,
                  bool split_experts, std::vector<GradBucket>& out) {
  size_t end = hi;
  for (size_t k = params.size(); k-- > 0;) {
    const size_t o = params[k].offset;
    if (o >= end) continue;
    if (o <= lo) break;
    const size_t c = round_up(o, align);
    const bool kind_changes = split_experts && k > 0 && params[k - 1].spec.expert != params[k].spec.expert;
    if (c > lo && c < end && (end - c >= target || kind_changes)) {
      out.push_back(GradBucket{c, end, 0, {}, false});
      end = c;
    }
  }
  if (end > lo) out.push_back(GradBucket{lo, end, 0, {}, false});
}

}  // namespace

std::vector<GradBucket> plan_grad_buckets(const std::vector<ParamInfo>& params, size_t padded, size_t align,
                                          size_t target_elems, std::optional<size_t> tied_param,
                                          bool split_experts) {
  if (align == 0) TRIAX_THROW(ConfigError, "gradient buckets: alignment must be >= 1");
  if (split_experts && align != 1)
    TRIAX_THROW(ConfigError, "gradient buckets: separating expert parameters needs alignment 1, not {} "
                "(ZeRO-1 with expert parallelism is not supported)", align);
  const size_t used = params.empty() ? 0 : params.back().offset + params.back().numel;
  if (padded < used || padded % align != 0)
    TRIAX_THROW(ConfigError,
                "gradient buckets: the flat buffer has {} elements for {} parameter elements; it must hold them all "
                "and be a multiple of {} (finalize the ParamStore with pad_to = dp)",
                padded, used, align);
  if (tied_param && *tied_param >= params.size())
    TRIAX_THROW(ConfigError, "gradient buckets: tied parameter index {} out of range ({} parameters)", *tied_param,
                params.size());
  const size_t target = target_elems == 0 ? std::numeric_limits<size_t>::max() : target_elems;
  std::vector<GradBucket> out;
  if (padded == 0) return out;
  if (tied_param) {
    const auto& t = params[*tied_param];
    const size_t tb = round_down(t.offset, align), te = round_up(t.offset + t.numel, align);
    if (te < padded) split_region(params, te, padded, align, target, split_experts, out);
    if (tb > 0) split_region(params, 0, tb, align, target, split_experts, out);
    out.push_back(GradBucket{tb, te, 0, {}, true});
  } else {
    split_region(params, 0, padded, align, target, split_experts, out);
  }
  for (auto& b : out) {
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].offset < b.end && params[i].offset + params[i].numel > b.begin) b.params.push_back(i);
    b.expert = split_experts && !b.params.empty() && params[b.params.front()].spec.expert;
  }
  return out;
}

std::vector<ShardSegment> plan_shard_segments(std::vector<GradBucket>& buckets, const std::vector<ParamInfo>& params,
                                              int dp, int rank) {
  if (dp < 1 || rank < 0 || rank >= dp)
    TRIAX_THROW(ConfigError, "shard segments: rank {} is not in a data-parallel group of {}", rank, dp);
  const size_t d = static_cast<size_t>(dp), r = static_cast<size_t>(rank);
  std::vector<ShardSegment> segs;
  size_t shard = 0;
  for (auto& b : buckets) {
    if (b.size() % d != 0)
      TRIAX_THROW(ConfigError, "shard segments: bucket [{}, {}) of {} elements is not a multiple of dp {}", b.begin,
                  b.end, b.size(), dp);
    b.shard_offset = shard;
    const size_t piece = b.size() / d;
    const size_t pb = b.begin + r * piece, pe = pb + piece;
    for (size_t i : b.params) {
      const size_t lo = std::max(pb, params[i].offset), hi = std::min(pe, params[i].offset + params[i].numel);
      if (lo < hi) segs.push_back(ShardSegment{shard + (lo - pb), lo, hi - lo, i});
    }
    shard += piece;
  }
  return segs;
}

// ---- GradBuffer ----
GradBuffer::GradBuffer(ParamStore& store, Communicator& dp, GradBufferOptions opts)
    : store_(store), dp_(dp), opts_(std::move(opts)) {
  if (store_.size() > 0 && !store_.finalized())
    TRIAX_THROW(ConfigError, "GradBuffer: the ParamStore ({} parameters) is not finalized; call finalize() first",
                store_.size());
  if (opts_.op != ReduceOp::avg && opts_.op != ReduceOp::sum)
    TRIAX_THROW(ConfigError, "GradBuffer: gradient reduction must be avg or sum, not {}", reduce_op_name(opts_.op));
  const bool rs = opts_.sync == GradSync::reduce_scatter;
  const size_t align = rs ? static_cast<size_t>(dp_.size()) : 1;
  if (rs && store_.padded_numel() % align != 0)
    TRIAX_THROW(ConfigError,
                "ZeRO-1: the flat buffer of {} elements is not a multiple of the data-parallel size {} on {}; "
                "finalize the ParamStore with pad_to = {}",
                store_.padded_numel(), dp_.size(), dp_.describe(), dp_.size());
  if (opts_.tied_param && *opts_.tied_param >= store_.size())
    TRIAX_THROW(ConfigError, "GradBuffer: tied parameter index {} out of range ({} parameters)", *opts_.tied_param,
                store_.size());
  tied_active_ = opts_.tied_param && opts_.embedding && opts_.embedding->size() > 1;
  const ParamInfo* first_expert = nullptr;
  for (const auto& p : store_.infos())
    if (p.spec.expert && !first_expert) first_expert = &p;
  if (first_expert && dp_.size() > 1) {
    if (!opts_.expert_dp)
      TRIAX_THROW(ConfigError,
                  "GradBuffer: '{}' is a MoE expert parameter; set GradBufferOptions::expert_dp (grid.expert_dp()) "
                  "so experts are reduced over the ranks that hold them ({})",
                  first_expert->spec.name, dp_.describe());
    const int edp = opts_.expert_dp->size();
    if (dp_.size() % edp != 0)
      TRIAX_THROW(ConfigError, "GradBuffer: expert-data-parallel {} has {} ranks, which does not divide dp = {}",
                  opts_.expert_dp->describe(), edp, dp_.size());
    experts_split_ = edp != dp_.size();
    if (experts_split_ && rs)
      TRIAX_THROW(ConfigError, "GradBuffer: ZeRO-1 (reduce_scatter) with expert parallelism (ep = {}) is not "
                  "supported; use plain DP gradient sync for MoE models", dp_.size() / edp);
  }
  buckets_ = plan_grad_buckets(store_.infos(), store_.padded_numel(), align, opts_.bucket_bytes / sizeof(float),
                               tied_active_ ? opts_.tied_param : std::nullopt, experts_split_);
  if (rs) {
    segments_ = plan_shard_segments(buckets_, store_.infos(), dp_.size(), dp_.rank());
    shard_grads_ = store_.backend().zeros(Shape{static_cast<int64_t>(store_.padded_numel() / align)}, store_.dtype());
  }
  presync_bad_ = store_.backend().zeros(Shape{1}, DType::f64);
  buckets_of_param_.resize(store_.size());
  for (size_t b = 0; b < buckets_.size(); ++b)
    for (size_t p : buckets_[b].params) buckets_of_param_[p].push_back(b);
  state_.resize(buckets_.size());
  timings_.resize(buckets_.size());
  marked_.assign(store_.size(), 0);
  reset();
}

GradBuffer::~GradBuffer() {
  // Nonblocking collectives cannot be cancelled and write into our buffers: let any that an
  // exception left in flight finish, unless the communicator has already failed.
  for (size_t b = 0; b < state_.size(); ++b) {
    auto& s = state_[b];
    try {
      if (s.tied_started && !s.tied_done && opts_.embedding && !opts_.embedding->poisoned()) s.tied_work.wait();
      if (s.started && !s.done && !comm_of(b).poisoned()) s.work.wait();
    } catch (const std::exception& e) {
      log::error("GradBuffer: a gradient collective failed while shutting down: {}", e.what());
    }
  }
}

std::span<float> GradBuffer::shard_grads() {
  if (!shard_grads_.defined()) return {};
  if (!store_.backend().host_accessible())
    TRIAX_THROW(ConfigError, "GradBuffer::shard_grads: backend '{}' is not host-accessible", store_.backend().name());
  return std::span<float>(shard_grads_.data<float>(), shard_size());
}
std::span<const float> GradBuffer::shard_grads() const { return const_cast<GradBuffer*>(this)->shard_grads(); }

size_t GradBuffer::piece_size(size_t b) const { return buckets_.at(b).size() / static_cast<size_t>(dp_.size()); }
size_t GradBuffer::piece_begin(size_t b) const {
  return buckets_.at(b).begin + static_cast<size_t>(dp_.rank()) * piece_size(b);
}

double GradBuffer::presync_nonfinite() const {
  double n = 0;
  store_.backend().copy_to_host(&n, presync_bad_, sizeof(n));
  return n;
}

double GradBuffer::now_s() const {
  return since(t0_);
}

void GradBuffer::reset() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    state_[b] = State{};
    state_[b].pending = buckets_[b].params.size();
  }
  std::fill(marked_.begin(), marked_.end(), 0);
  next_start_ = 0;
  step_open_ = false;
  progress_s_ = 0;
}

void GradBuffer::open_step() {
  step_open_ = true;
  store_.backend().fill(presync_bad_, 0.0);
  t0_ = std::chrono::steady_clock::now();
  std::fill(timings_.begin(), timings_.end(), BucketTiming{});
}

void GradBuffer::mark_ready(size_t p) {
  if (p >= store_.size())
    TRIAX_THROW(ConfigError, "GradBuffer::mark_ready: parameter index {} out of range ({} parameters)", p,
                store_.size());
  if (marked_[p])
    TRIAX_THROW(ConfigError, "GradBuffer::mark_ready: parameter '{}' (index {}) marked ready twice in one step",
                store_.info(p).spec.name, p);
  if (!step_open_) open_step();
  marked_[p] = 1;
  for (size_t b : buckets_of_param_[p]) --state_[b].pending;
  if (!opts_.overlap) return;
  if (tied_active_ && p == *opts_.tied_param) start_tied(buckets_.size() - 1);
  try_start(false);
}

void GradBuffer::start_tied(size_t b) {
  auto& s = state_[b];
  if (s.tied_started) return;
  if (opts_.sync == GradSync::all_reduce)
    store_.backend().count_nonfinite_into(presync_bad_, 0, store_.grad_t(*opts_.tied_param));
  s.tied_work = all_reduce(*opts_.embedding, store_.backend(), store_.grad_t(*opts_.tied_param), ReduceOp::sum);
  s.tied_started = true;
}

void GradBuffer::start_bucket(size_t b, bool in_finish) {
  const auto& bk = buckets_[b];
  Backend& be = store_.backend();
  const Tensor g = store_.grads_range(bk.begin, bk.end);
  auto& s = state_[b];
  if (opts_.sync == GradSync::all_reduce) {
    // Only an in-place all-reduce over several ranks overwrites this rank's own gradients (under
    // reduce_scatter they stay in the flat buffer, where the scan finds them). The tied bucket
    // holds only the tied embedding, counted before its cross-stage sum instead.
    if (comm_of(b).size() > 1 && !(tied_active_ && bk.tied)) be.count_nonfinite_into(presync_bad_, 0, g);
    if (bk.expert && experts_split_ && opts_.op == ReduceOp::avg) {
      // avg over expert_dp of (g * edp / dp) = sum over expert_dp / dp (see GradBufferOptions).
      const float f = static_cast<float>(opts_.expert_dp->size()) / static_cast<float>(dp_.size());
      be.scale(g, f);
    }
    s.work = all_reduce(comm_of(b), be, g, opts_.op);
  } else {
    const auto off = static_cast<int64_t>(bk.shard_offset);
    const Tensor out = shard_grads_.slice(off, off + static_cast<int64_t>(piece_size(b)));
    s.work = reduce_scatter(dp_, be, g, out, opts_.op);
  }
  s.started = true;
  timings_[b].start_s = now_s();
  timings_[b].started_in_finish = in_finish;
  if (hook_) hook_(b);
}

void GradBuffer::try_start(bool in_finish) {
  while (next_start_ < buckets_.size()) {
    const size_t b = next_start_;
    auto& s = state_[b];
    if (s.pending > 0) return;
    if (tied_active_ && buckets_[b].tied) {
      start_tied(b);
      if (!s.tied_done) {
        if (in_finish) s.tied_work.wait();
        else if (!s.tied_work.test()) return;
        s.tied_done = true;
      }
    }
    start_bucket(b, in_finish);
    ++next_start_;
  }
}

void GradBuffer::poll() {
  for (size_t b = 0; b < next_start_; ++b) {
    auto& s = state_[b];
    if (!s.done && s.work.test()) {
      s.done = true;
      timings_[b].done_s = now_s();
    }
  }
  if (tied_active_) {
    auto& s = state_.back();
    if (s.tied_started && !s.tied_done && s.tied_work.test()) s.tied_done = true;
  }
}

void GradBuffer::progress() {
  if (!step_open_ || !opts_.overlap) return;
  const auto a = std::chrono::steady_clock::now();
  poll();
  try_start(false);
  progress_s_ += since(a);
}

// The step's buckets on the timeline (--profile-steps): each from its start to when this rank saw
// it complete, and the exposed wait of finish() (its last exposed_s seconds).
void GradBuffer::trace_buckets(double exposed_s) const {
  const double tr_now = trace::now_us(), s_now = now_s();
  auto at = [&](double s) { return tr_now - (s_now - s) * 1e6; };
  trace::record(trace::Lane::dp, "dp sync wait (exposed)", tr_now - exposed_s * 1e6, tr_now);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto& t = timings_[b];
    if (t.start_s < 0 || t.done_s < 0) continue;
    trace::record(trace::Lane::dp,
                  fmt::format("dp {} bucket {}", opts_.sync == GradSync::all_reduce ? "all-reduce" : "reduce-scatter", b),
                  at(t.start_s), at(t.done_s), -1, -1, static_cast<int64_t>(buckets_[b].size() * sizeof(float)));
  }
}

GradSyncStats GradBuffer::finish() {
  if (!step_open_) open_step();
  const auto enter = std::chrono::steady_clock::now();
  // Backward is over: whatever was not marked is complete too.
  for (auto& s : state_) s.pending = 0;
  std::fill(marked_.begin(), marked_.end(), 1);
  try_start(true);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    poll();
    auto& s = state_[b];
    if (!s.done) {
      s.work.wait();
      s.done = true;
      timings_[b].done_s = now_s();
    }
  }
  GradSyncStats st;
  st.exposed_s = since(enter);
  st.buckets = buckets_.size();
  st.progress_s = progress_s_;
  double first = std::numeric_limits<double>::max(), last = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto& t = timings_[b];
    first = std::min(first, t.start_s);
    last = std::max(last, t.done_s);
    st.bucket_sum_s += t.done_s - t.start_s;
    if (!t.started_in_finish) ++st.started_early;
    st.bytes += buckets_[b].size() * sizeof(float);
  }
  if (!buckets_.empty()) st.comm_span_s = last - first;
  if (trace::on()) trace_buckets(st.exposed_s);
  reset();  // the timings stay readable until the next step opens
  return st;
}

void all_reduce_tied_embedding(ParamStore& store, size_t param_index, Communicator* embedding) {
  if (param_index >= store.size())
    TRIAX_THROW(ConfigError, "all_reduce_tied_embedding: parameter index {} out of range ({} parameters)",
                param_index, store.size());
  if (!embedding || embedding->size() == 1) return;
  all_reduce(*embedding, store.backend(), store.grad_t(param_index), ReduceOp::sum).wait();
}

}  // namespace triax
