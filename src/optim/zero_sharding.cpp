// ZeRO-2/3: per-unit gradient reduce-scatter, ZeRO-3 unit gathers with prefetch, HSDP.
#include "triax/optim/zero_sharding.h"

#include <algorithm>
#include <cstring>

#include "triax/backend/comm_ops.h"
#include "triax/core/clock.h"
#include "triax/core/trace.h"
#include "triax/optim/zero.h"

namespace triax {
using Clock = std::chrono::steady_clock;
namespace {
Tensor range(const Tensor& t, size_t b, size_t e) { return t.slice(static_cast<int64_t>(b), static_cast<int64_t>(e)); }
Tensor sized(const Tensor& t, size_t off, size_t n) { return range(t, off, off + n); }

// The unit holding flat element b (units are sorted by begin and cover the padded store).
size_t unit_at(const ParamStore& store, size_t b, size_t e) {
  const auto& us = store.units();
  const auto it = std::upper_bound(us.begin(), us.end(), b, [](size_t x, const ParamUnit& u) { return x < u.begin; });
  if (it == us.begin() || e > (it - 1)->end || b >= e)
    TRIAX_THROW(ConfigError, "flat range [{}, {}) is not inside one unit of the sharded store", b, e);
  return static_cast<size_t>(it - us.begin()) - 1;
}
}  // namespace

ZeroSharding::ZeroSharding(ParamStore& store, Communicator& shard, ZeroShardingOptions opts)
    : store_(store), shard_(shard), opts_(opts) {
  if (store.zero_level() < 2 || !store.finalized())
    TRIAX_THROW(ConfigError, "ZeroSharding needs a store laid out for ZeRO-2 or 3 (ParamStore::finalize_sharded)");
  const auto& us = store.units();
  for (size_t u = 0; u < us.size(); ++u) {
    Communicator& c = comm_of(u);
    if (us[u].group != c.size() || us[u].rank != c.rank())
      TRIAX_THROW(ConfigError, "unit '{}' is laid out for a group of {} (rank {}) but shards over {}", us[u].name,
                  us[u].group, us[u].rank, c.describe());
  }
  if (opts_.max_resident < 1) opts_.max_resident = 1;
  if (opts_.max_reducing < 1) opts_.max_reducing = 1;
  if (opts_.tied_param && opts_.embedding && opts_.embedding->size() > 1) tied_unit_ = store.unit_of(*opts_.tied_param);
  shard_grads_ = store.backend().zeros(Shape{static_cast<int64_t>(store.shard_size())}, store.dtype());
  open_grads_.assign(us.size(), Tensor());
  marked_.resize(us.size());
  for (size_t u = 0; u < us.size(); ++u) marked_[u].assign(us[u].count, 0);
  marked_count_.assign(us.size(), 0);
  store_.set_provider(this);
}

ZeroSharding::~ZeroSharding() {
  store_.set_provider(nullptr);
  try {  // nothing may still write into buffers that are about to go
    for (auto& r : resident_)
      if (r.in_flight) r.work.wait();
    for (auto& r : reducing_) r.work.wait();
  } catch (...) {
  }
}

Communicator& ZeroSharding::comm_of(size_t unit) {
  return store_.units().at(unit).expert && opts_.expert_shard ? *opts_.expert_shard : shard_;
}

double ZeroSharding::now_s() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

void ZeroSharding::open_step() {
  if (step_open_) return;
  step_open_ = true;
  t0_ = Clock::now();
  sync_ = GradSyncStats{};
}

// ---- gradients -------------------------------------------------------------------------------

Tensor ZeroSharding::grads(size_t begin, size_t end) {
  const size_t u = unit_at(store_, begin, end);
  open_step();
  progress();  // a layer fetches its views op by op: drive the collectives in flight between its ops
  Tensor& g = open_grads_[u];
  if (!g.defined()) g = store_.backend().zeros(Shape{static_cast<int64_t>(store_.units()[u].size())}, store_.dtype());
  const size_t b0 = store_.units()[u].begin;
  return range(g, begin - b0, end - b0);
}

void ZeroSharding::mark_ready(size_t param_index) {
  const size_t u = store_.unit_of(param_index);
  if ((tied_unit_ && u == *tied_unit_) || !opts_.overlap || !open_grads_[u].defined()) return;
  const ParamUnit& unit = store_.units()[u];
  char& m = marked_[u].at(param_index - unit.first);
  if (!m) {
    m = 1;
    ++marked_count_[u];
  }
  if (marked_count_[u] == unit.count) start_reduce(u);
}

// Closes unit u's gradient buffer and reduce-scatters it (avg) into a piece; at most max_reducing
// in flight (the oldest is waited for: that wait is exposed).
void ZeroSharding::start_reduce(size_t u) {
  Backend& be = store_.backend();
  const ParamUnit& unit = store_.units()[u];
  Reducing r;
  r.unit = u;
  r.grads = std::move(open_grads_[u]);
  open_grads_[u] = Tensor();
  std::fill(marked_[u].begin(), marked_[u].end(), char{0});
  marked_count_[u] = 0;
  if (unit.expert && opts_.expert_shard) be.scale(r.grads, opts_.expert_scale);
  const double w0 = now_s();
  drain(opts_.max_reducing - 1);
  sync_.exposed_s += now_s() - w0;
  r.piece = be.empty(Shape{static_cast<int64_t>(unit.piece())}, store_.dtype());
  r.issued_s = now_s();
  r.work = reduce_scatter(comm_of(u), be, r.grads, r.piece, ReduceOp::avg);
  ++sync_.buckets;
  sync_.bytes += unit.size() * r.grads.element_size();
  reducing_.push_back(std::move(r));
}

// Moves r on: reduce-scatter -> (HSDP) replica all-reduce -> added into the shard. Returns when r
// is done (block) or as far as it goes without waiting.
void ZeroSharding::advance(Reducing& r, bool block) {
  Backend& be = store_.backend();
  for (;;) {
    if (block) r.work.wait();
    else if (!r.work.test()) return;
    if (r.stage == 0 && opts_.replicate) {
      r.stage = 1;
      r.grads = Tensor();  // the unit buffer is no longer needed
      r.work = all_reduce(*opts_.replicate, be, r.piece, ReduceOp::avg);
      continue;
    }
    const ParamUnit& unit = store_.units()[r.unit];
    be.axpy(sized(shard_grads_, unit.shard_offset, unit.piece()), 1.0, r.piece);
    const double done = now_s();
    sync_.bucket_sum_s += done - r.issued_s;
    sync_.comm_span_s = std::max(sync_.comm_span_s, done);
    r.stage = 2;
    return;
  }
}

// Completes reductions in issue order (so the replica all-reduces start in the same order on every
// rank) until at most `keep` are in flight.
void ZeroSharding::drain(size_t keep) {
  while (reducing_.size() > keep) {
    advance(reducing_.front(), true);
    reducing_.pop_front();
  }
}

void ZeroSharding::progress() {
  const double p0 = step_open_ ? now_s() : 0;
  for (auto& r : resident_)
    if (r.in_flight && r.work.test()) gather_done(r);
  while (!reducing_.empty()) {
    advance(reducing_.front(), false);
    if (reducing_.front().stage != 2) break;
    reducing_.pop_front();
  }
  if (step_open_) sync_.progress_s += now_s() - p0;
}

GradSyncStats ZeroSharding::finish() {
  open_step();
  const double f0 = now_s();
  const size_t early = sync_.buckets;
  const auto& us = store_.units();
  if (tied_unit_) {
    // Both copies of the tied embedding (first and last stage) hold part of its gradient: sum them.
    Tensor& g = open_grads_[*tied_unit_];
    if (!g.defined()) g = store_.backend().zeros(Shape{static_cast<int64_t>(us[*tied_unit_].size())}, store_.dtype());
    const ParamInfo& p = store_.info(*opts_.tied_param);  // the two stages' units differ around it
    const size_t off = p.offset - us[*tied_unit_].begin;
    all_reduce(*opts_.embedding, store_.backend(), sized(g, off, p.numel), ReduceOp::sum).wait();
  }
  for (size_t u = us.size(); u-- > 0;)  // what is left, last unit first (as backward finishes them)
    if (open_grads_[u].defined()) start_reduce(u);
  drain(0);
  sync_.started_early = early;
  sync_.exposed_s += now_s() - f0;
  if (sync_.buckets == 0) sync_.comm_span_s = 0;
  step_open_ = false;
  GradSyncStats out = sync_;
  sync_ = GradSyncStats{};
  return out;
}

void ZeroSharding::zero_grads() {
  store_.backend().fill(shard_grads_, 0.0);
  for (auto& g : open_grads_) g = Tensor();
  for (size_t u = 0; u < marked_.size(); ++u) {
    std::fill(marked_[u].begin(), marked_[u].end(), char{0});
    marked_count_[u] = 0;
  }
}

// ---- ZeRO-3 weights --------------------------------------------------------------------------

ZeroSharding::Resident* ZeroSharding::find_resident(size_t unit) {
  for (auto& r : resident_)
    if (r.unit == unit) return &r;
  return nullptr;
}

void ZeroSharding::wait_resident(Resident& r) {
  if (!r.in_flight) return;
  const auto w0 = Clock::now();
  const double tr0 = trace::on() ? trace::now_us() : 0;
  r.work.wait();
  gstats_.exposed_s += since(w0);
  if (trace::on())
    trace::record(trace::Lane::dp, fmt::format("zero3 gather wait unit {} (exposed)", r.unit), tr0, trace::now_us());
  gather_done(r);
}

// A gather seen complete (by progress() or a wait): its issue-to-completion time, and its span.
void ZeroSharding::gather_done(Resident& r) {
  r.in_flight = false;
  const double done = now_s();
  gstats_.total_s += done - r.issued_s;
  if (trace::on()) {
    const double tr = trace::now_us();
    trace::record(trace::Lane::dp, fmt::format("zero3 all-gather unit {}", r.unit), tr - (done - r.issued_s) * 1e6, tr,
                  -1, -1, static_cast<int64_t>(r.buf.nbytes()));
  }
}

void ZeroSharding::evict_for_one_more() {
  while (resident_.size() >= opts_.max_resident) {
    auto lru = std::min_element(resident_.begin(), resident_.end(), [](const Resident& a, const Resident& b) { return a.used < b.used; });
    if (lru->in_flight) lru->work.wait();  // a gather still writing may not lose its buffer
    resident_.erase(lru);
  }
}

ZeroSharding::Resident& ZeroSharding::gather(size_t u, bool prefetch) {
  if (!step_open_ && resident_.empty()) t0_ = Clock::now();  // forward-only passes have a time origin too
  evict_for_one_more();
  Backend& be = store_.backend();
  const ParamUnit& unit = store_.units()[u];
  Resident r;
  r.unit = u;
  r.buf = be.empty(Shape{static_cast<int64_t>(unit.size())}, store_.compute_dtype());
  r.staging = be.empty(Shape{static_cast<int64_t>(unit.piece())}, store_.compute_dtype());
  be.cast(r.staging, sized(store_.params_t(), unit.shard_offset, unit.piece()));
  r.issued_s = std::chrono::duration<double>(Clock::now() - t0_).count();
  r.work = all_gather(comm_of(u), be, r.staging, r.buf);
  r.in_flight = true;
  r.used = ++clock_;
  ++gstats_.gathers;
  if (prefetch) ++gstats_.prefetched;
  gstats_.bytes += (unit.size() - unit.piece()) * r.buf.element_size();
  resident_.push_back(std::move(r));
  gstats_.peak_resident = std::max(gstats_.peak_resident, resident_.size());
  Resident& back = resident_.back();
  if (!prefetch) wait_resident(back);
  return back;
}

Tensor ZeroSharding::weights(size_t begin, size_t end) {
  if (store_.zero_level() != 3) TRIAX_THROW(ConfigError, "ZeroSharding::weights: the store is not ZeRO-3");
  const size_t u = unit_at(store_, begin, end);
  // On the CPU backend a started gather moves only while this rank is inside MPI; the model fetches
  // each op's weights just before the op, so testing here drives the prefetch between a unit's ops.
  progress();
  Resident* r = find_resident(u);
  if (!r) r = &gather(u, false);
  wait_resident(*r);
  r->used = ++clock_;
  const size_t b0 = store_.units()[u].begin;
  Tensor view = range(r->buf, begin - b0, end - b0);
  // Prefetch the neighbour in the direction of travel (resident_ may move: r is not used after).
  // At the first or last unit the direction is known without a previous touch: a pass starts
  // there (so the second unit of a step's first forward is prefetched too).
  const long n = static_cast<long>(store_.units().size());
  long dir = last_unit_ && *last_unit_ != u ? (u > *last_unit_ ? 1 : -1) : 0;
  if (u == 0) dir = 1;
  else if (static_cast<long>(u) == n - 1) dir = -1;
  if (opts_.overlap && opts_.prefetch && opts_.max_resident >= 2 && dir != 0) {
    const long next = static_cast<long>(u) + dir;
    if (next >= 0 && next < n && !find_resident(static_cast<size_t>(next))) gather(static_cast<size_t>(next), true);
  }
  last_unit_ = u;
  return view;
}

void ZeroSharding::weights_changed() {
  for (auto& r : resident_)
    if (r.in_flight) r.work.wait();
  resident_.clear();
  last_unit_.reset();
}

GatherStats ZeroSharding::take_gather_stats() {
  GatherStats s = gstats_;
  gstats_ = GatherStats{};
  return s;
}

// ---- ZeRO-2 weights after the update, and whole masters --------------------------------------

// Every unit as a range each rank of its group holds a piece of (zero.h's all_gather_pieces).
std::vector<PieceRange> ZeroSharding::unit_ranges() {
  std::vector<PieceRange> out;
  const auto& us = store_.units();
  for (size_t u = 0; u < us.size(); ++u)
    out.push_back({us[u].begin, us[u].end, us[u].piece_begin(), us[u].piece(), us[u].shard_offset, &comm_of(u)});
  return out;
}

double ZeroSharding::gather_weights() {
  const auto t0 = Clock::now();
  if (store_.zero_level() != 2) return 0.0;
  Tensor staging;  // transient: the memory model counts it against the unit gradient buffers, never alive together
  all_gather_pieces(store_.backend(), unit_ranges(), store_.weights_t(), staging, store_.shard_size());
  // Only the copy travelled: the masters are current in this rank's pieces alone.
  if (store_.has_compute_copy() && shard_.size() > 1) store_.mark_masters_sharded(segment_ranges(store_.shard_segments()));
  return since(t0);
}

double ZeroSharding::gather_masters() {
  const auto t0 = Clock::now();
  if (store_.zero_level() != 2 || store_.masters_current()) return since(t0);
  Tensor staging;
  all_gather_pieces(store_.backend(), unit_ranges(), store_.params_t(), staging, store_.shard_size());
  store_.mark_masters_current();
  return since(t0);
}

std::vector<float> ZeroSharding::full_master(size_t i) {
  if (store_.zero_level() == 2) {
    gather_masters();
    return store_.param_to_host(i);
  }
  Backend& be = store_.backend();
  const ParamInfo& p = store_.info(i);
  const size_t u = store_.unit_of(i);
  const ParamUnit& unit = store_.units()[u];
  const Tensor whole = be.empty(Shape{static_cast<int64_t>(unit.size())}, store_.dtype());
  const Tensor mine = be.empty(Shape{static_cast<int64_t>(unit.piece())}, store_.dtype());
  be.copy(mine, sized(store_.params_t(), unit.shard_offset, unit.piece()));
  all_gather(comm_of(u), be, mine, whole).wait();
  const Tensor part = sized(whole, p.offset - unit.begin, p.numel);
  std::vector<float> out(p.numel);
  if (store_.dtype() == DType::f32) {
    be.copy_to_host(out.data(), part, out.size() * sizeof(float));
  } else {
    std::vector<double> d(p.numel);
    be.copy_to_host(d.data(), part, d.size() * sizeof(double));
    std::transform(d.begin(), d.end(), out.begin(), [](double x) { return static_cast<float>(x); });
  }
  return out;
}

}  // namespace triax
