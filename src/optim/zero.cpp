// ZeRO-1 update ranges and the parameter all-gather.
#include "triax/optim/zero.h"

#include "triax/backend/comm_ops.h"
#include "triax/core/clock.h"

#include <algorithm>
#include <chrono>

namespace triax {
namespace {
void push_merged(std::vector<UpdateRange>& out, UpdateRange r) {
  if (!out.empty()) {
    auto& b = out.back();
    if (b.decay == r.decay && b.flat_offset + b.count == r.flat_offset && b.state_offset + b.count == r.state_offset) {
      b.count += r.count;
      return;
    }
  }
  out.push_back(r);
}
}  // namespace

std::vector<UpdateRange> update_ranges(const ParamStore& store) {
  std::vector<UpdateRange> out;
  for (const auto& p : store.infos()) push_merged(out, {p.offset, p.offset, p.numel, p.spec.weight_decay});
  return out;
}

std::vector<UpdateRange> update_ranges(const ParamStore& store, const GradBuffer& zero) {
  if (zero.options().sync != GradSync::reduce_scatter)
    TRIAX_THROW(ConfigError, "update_ranges: the GradBuffer does not reduce-scatter (not ZeRO-1)");
  return update_ranges(store, zero.shard_segments());
}

std::vector<UpdateRange> update_ranges(const ParamStore& store, std::span<const ShardSegment> segments) {
  std::vector<UpdateRange> out;
  for (const auto& s : segments)
    push_merged(out, {s.flat_offset, s.shard_offset, s.count, store.info(s.param).spec.weight_decay});
  return out;
}

namespace {
void need_zero(const GradBuffer& zero, const char* what) {
  if (zero.options().sync != GradSync::reduce_scatter)
    TRIAX_THROW(ConfigError, "{}: the GradBuffer does not reduce-scatter (not ZeRO-1)", what);
}

// All-gathers every bucket of the flat buffer `flat` (the masters or the compute copy) over DP: a
// collective per bucket, all in flight together.
void gather_flat(GradBuffer& zero, Tensor& staging, const Tensor& flat) {
  Backend& be = zero.store().backend();
  if (!staging.defined() || static_cast<size_t>(staging.numel()) != zero.shard_size() || staging.dtype() != flat.dtype())
    staging = be.empty(Shape{static_cast<int64_t>(zero.shard_size())}, flat.dtype());
  auto at = [](const Tensor& t, size_t off, size_t n) {
    return t.slice(static_cast<int64_t>(off), static_cast<int64_t>(off + n));
  };
  std::vector<Work> works;
  works.reserve(zero.num_buckets());
  for (size_t b = 0; b < zero.num_buckets(); ++b) {
    const auto& bk = zero.bucket(b);
    const size_t n = zero.piece_size(b);
    // The collective's input may not alias its output, so this rank's piece goes via staging.
    const Tensor mine = at(staging, bk.shard_offset, n);
    be.copy(mine, at(flat, zero.piece_begin(b), n));
    works.push_back(all_gather(zero.dp(), be, mine, at(flat, bk.begin, bk.size())));
  }
  wait_all(works);
}
}  // namespace

double zero_all_gather_params(GradBuffer& zero, Tensor& staging) {
  need_zero(zero, "zero_all_gather_params");
  const auto t0 = std::chrono::steady_clock::now();
  ParamStore& store = zero.store();
  gather_flat(zero, staging, store.weights_t());
  if (store.has_compute_copy() && zero.dp().size() > 1) {
    // Only the copy travelled: the masters are current in this rank's shard alone.
    std::vector<std::pair<size_t, size_t>> mine;
    for (const auto& s : zero.shard_segments()) {
      if (!mine.empty() && mine.back().second == s.flat_offset) mine.back().second += s.count;  // runs on
      else mine.emplace_back(s.flat_offset, s.flat_offset + s.count);
    }
    store.mark_masters_sharded(std::move(mine));
  }
  return since(t0);
}

double zero_all_gather_masters(GradBuffer& zero, Tensor& staging) {
  need_zero(zero, "zero_all_gather_masters");
  const auto t0 = std::chrono::steady_clock::now();
  ParamStore& store = zero.store();
  if (store.masters_current()) return since(t0);  // nothing stale: the same on every DP rank
  gather_flat(zero, staging, store.params_t());
  store.mark_masters_current();
  return since(t0);
}

}  // namespace triax
