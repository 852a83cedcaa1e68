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

void all_gather_pieces(Backend& be, std::span<const PieceRange> ranges, const Tensor& flat, Tensor& staging,
                       size_t shard_size) {
  if (!staging.defined() || static_cast<size_t>(staging.numel()) != shard_size || staging.dtype() != flat.dtype())
    staging = be.empty(Shape{static_cast<int64_t>(shard_size)}, flat.dtype());
  auto at = [](const Tensor& t, size_t off, size_t n) {
    return t.slice(static_cast<int64_t>(off), static_cast<int64_t>(off + n));
  };
  std::vector<Work> works;
  works.reserve(ranges.size());
  for (const auto& r : ranges) {
    const Tensor mine = at(staging, r.shard_offset, r.piece);
    be.copy(mine, at(flat, r.piece_begin, r.piece));
    works.push_back(all_gather(*r.comm, be, mine, at(flat, r.begin, r.end - r.begin)));
  }
  wait_all(works);
}

std::vector<std::pair<size_t, size_t>> segment_ranges(std::span<const ShardSegment> segments) {
  std::vector<std::pair<size_t, size_t>> out;
  for (const auto& s : segments) {
    if (!out.empty() && out.back().second == s.flat_offset) out.back().second += s.count;  // runs on
    else out.emplace_back(s.flat_offset, s.flat_offset + s.count);
  }
  return out;
}

namespace {
void need_zero(const GradBuffer& zero, const char* what) {
  if (zero.options().sync != GradSync::reduce_scatter)
    TRIAX_THROW(ConfigError, "{}: the GradBuffer does not reduce-scatter (not ZeRO-1)", what);
}

// All-gathers every bucket of the flat buffer `flat` (the masters or the compute copy) over DP.
void gather_flat(GradBuffer& zero, Tensor& staging, const Tensor& flat) {
  std::vector<PieceRange> ranges;
  for (size_t b = 0; b < zero.num_buckets(); ++b) {
    const auto& bk = zero.bucket(b);
    ranges.push_back({bk.begin, bk.end, zero.piece_begin(b), zero.piece_size(b), bk.shard_offset, &zero.dp()});
  }
  all_gather_pieces(zero.store().backend(), ranges, flat, staging, zero.shard_size());
}
}  // namespace

double zero_all_gather_params(GradBuffer& zero, Tensor& staging) {
  need_zero(zero, "zero_all_gather_params");
  const auto t0 = std::chrono::steady_clock::now();
  ParamStore& store = zero.store();
  gather_flat(zero, staging, store.weights_t());
  if (store.has_compute_copy() && zero.dp().size() > 1) {
    // Only the copy travelled: the masters are current in this rank's shard alone.
    store.mark_masters_sharded(segment_ranges(zero.shard_segments()));
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
