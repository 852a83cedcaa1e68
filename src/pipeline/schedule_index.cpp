// Builds the lookup tables of schedule_index.h.
#include "schedule_index.h"

namespace triax::detail {

ScheduleIndex index_schedule(const Schedule& s) {
  ScheduleIndex ix;
  ix.chunks = s.chunks;
  const size_t keys = static_cast<size_t>(s.micro_batches) * s.chunks;
  ix.pos.resize(s.lists.size());
  for (size_t st = 0; st < s.lists.size(); ++st) {
    for (auto& table : ix.pos[st]) table.assign(keys, -1);
    for (size_t i = 0; i < s.lists[st].size(); ++i) {
      const auto& in = s.lists[st][i];
      int& slot = ix.pos[st][static_cast<size_t>(in.op)][static_cast<size_t>(in.mb) * s.chunks + in.chunk];
      if (slot < 0) slot = static_cast<int>(i);
    }
  }
  ix.match.resize(s.lists.size());
  ix.consumes.resize(s.lists.size());
  for (int st = 0; st < static_cast<int>(s.lists.size()); ++st) {
    const auto& list = s.lists[st];
    ix.match[st].assign(list.size(), {-1, -1});
    ix.consumes[st].assign(list.size(), -1);
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& in = list[i];
      switch (in.op) {
        case PipeOp::send_activation: {  // to the next virtual stage, which receives it for its chunk
          if (s.is_last_virtual(st, in.chunk)) break;
          const auto nv = next_virtual(s, st, in.chunk);
          ix.match[st][i] = {nv.stage, ix.at(nv.stage, PipeOp::recv_activation, in.mb, nv.chunk)};
          break;
        }
        case PipeOp::recv_activation: {
          if (s.is_first_virtual(st, in.chunk)) break;
          const auto pv = prev_virtual(s, st, in.chunk);
          ix.match[st][i] = {pv.stage, ix.at(pv.stage, PipeOp::send_activation, in.mb, pv.chunk)};
          break;
        }
        case PipeOp::send_grad: {
          if (s.is_first_virtual(st, in.chunk)) break;
          const auto pv = prev_virtual(s, st, in.chunk);
          ix.match[st][i] = {pv.stage, ix.at(pv.stage, PipeOp::recv_grad, in.mb, pv.chunk)};
          break;
        }
        case PipeOp::recv_grad: {
          if (s.is_last_virtual(st, in.chunk)) break;
          const auto nv = next_virtual(s, st, in.chunk);
          ix.match[st][i] = {nv.stage, ix.at(nv.stage, PipeOp::send_grad, in.mb, nv.chunk)};
          break;
        }
        case PipeOp::forward:
          ix.consumes[st][i] = ix.at(st, PipeOp::recv_activation, in.mb, in.chunk);
          break;
        case PipeOp::backward:
        case PipeOp::backward_input:
          ix.consumes[st][i] = ix.at(st, PipeOp::recv_grad, in.mb, in.chunk);
          break;
        case PipeOp::backward_weight: break;
      }
      if (ix.match[st][i].second < 0) ix.match[st][i] = {-1, -1};
    }
  }
  return ix;
}

}  // namespace triax::detail
