// The executor walks the list in order. Receives are posted where listed and waited for by the
// compute that consumes them; sends are started where listed and completed at the end (they are
// tested as we go so MPI keeps progressing). DP bucket marks are armed only for the last
// backward (B) and last weight pass (W) of each chunk in this step, so each parameter is marked once.
#include "triax/pipeline/executor.h"

#include <chrono>
#include <ctime>

#include "triax/backend/comm_ops.h"
#include "triax/core/clock.h"

namespace triax {
namespace {
using Clock = std::chrono::steady_clock;
// CPU seconds of this thread (the one running the compute: BLAS and ops use the caller's thread
// when OMP_NUM_THREADS=1, as under mpirun).
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Key {
  int mb, chunk;
  bool operator<(const Key& o) const { return mb != o.mb ? mb < o.mb : chunk < o.chunk; }
};
}  // namespace

PipelineExecutor::PipelineExecutor(std::vector<Stage*> chunks, Communicator& pp, int micro_batch, int seq,
                                   int hidden)
    : chunks_(std::move(chunks)), pp_(pp), B_(micro_batch), T_(seq), C_(hidden) {
  if (chunks_.empty()) TRIAX_THROW(ConfigError, "a pipeline stage needs at least one model chunk");
  for (auto* c : chunks_)
    if (&c->backend() != &chunks_.front()->backend())
      TRIAX_THROW(ConfigError, "the chunks of one pipeline stage must share one backend");
}

StepResult PipelineExecutor::run(const Schedule& sch, const MicroBatchFn& data, GradReadySink* grads, float dloss,
                                 bool record) {
  const int stage = pp_.rank();
  if (sch.stages != pp_.size())
    TRIAX_THROW(ConfigError, "schedule '{}' has {} stages but the pipeline group has {} ranks", sch.label(),
                sch.stages, pp_.size());
  if (sch.chunks != static_cast<int>(chunks_.size()))
    TRIAX_THROW(ConfigError, "schedule '{}' has {} chunks per stage but this stage holds {}", sch.label(), sch.chunks,
                chunks_.size());
  const auto& list = sch.lists.at(static_cast<size_t>(stage));
  // Hidden states crossing stages: (B*T, C), or this rank's B*T/tp rows under sequence parallelism.
  const size_t N = static_cast<size_t>(chunks_.front()->io_rows(B_, T_)) * C_;

  // The last backward-input pass and the last weight pass of each chunk arm the DP marks.
  std::vector<int> last_b(chunks_.size(), -1), last_w(chunks_.size(), -1);
  for (size_t i = 0; i < list.size(); ++i) {
    const auto& in = list[i];
    if (in.op == PipeOp::backward || in.op == PipeOp::backward_input) last_b[static_cast<size_t>(in.chunk)] = static_cast<int>(i);
    if (in.op == PipeOp::backward || in.op == PipeOp::backward_weight) last_w[static_cast<size_t>(in.chunk)] = static_cast<int>(i);
  }
  bool armed = false;
  // The hook captures locals of this call: cleared on every way out (an exception included).
  struct HookGuard {
    std::vector<Stage*>& chunks;
    ~HookGuard() {
      for (auto* c : chunks) c->set_grad_ready_hook(nullptr);
    }
  } hook_guard{chunks_};
  for (auto* c : chunks_)
    c->set_grad_ready_hook([&armed, grads](size_t idx) {
      if (!armed || !grads) return;
      grads->mark_ready(idx);
      // On the CPU backend a started all-reduce moves only while this rank is inside MPI: drive
      // the buckets already in flight at every parameter, or they all wait for finish() (the last
      // backward is one instruction, with no progress() call inside it).
      grads->progress();
    });

  Backend& be = chunks_.front()->backend();
  auto buffer = [&] { return be.empty(Shape{static_cast<int64_t>(N)}, be.compute_dtype() == DType::f64 ? DType::f64 : DType::f32); };
  std::map<Key, Tensor> act_in, act_out, grad_in, grad_out;
  std::map<Key, Work> recv_act, recv_grad;
  // In-flight sends with the buffer each reads: a buffer is released as soon as its send
  // completes, so at most the schedule checker's bound of them is held, not one per micro-batch.
  struct Pending {
    Work work;
    Tensor buf;
  };
  std::vector<Pending> sends;
  std::vector<int32_t> tokens, targets;
  StepResult res;
  res.micro_batches = sch.micro_batches;
  const auto t0 = Clock::now();
  res.origin_s = std::chrono::duration<double>(t0.time_since_epoch()).count();

  auto wait_recv = [&](std::map<Key, Work>& works, Key k, const char* what) {
    auto it = works.find(k);
    if (it == works.end())
      TRIAX_THROW(CommError, "pipeline stage {}: {} of micro-batch {} chunk {} was never received", stage, what, k.mb,
                  k.chunk);
    const auto w0 = Clock::now();
    it->second.wait();
    const double waited = since(w0);
    res.p2p_wait_s += waited;
    works.erase(it);
    return waited;
  };
  auto reap = [&] {
    std::erase_if(sends, [](Pending& p) { return p.work.test(); });
  };
  auto progress = [&] {
    if (grads) grads->progress();
    reap();
  };
  auto start_send = [&](std::map<Key, Tensor>& from, Key k, int peer, int tag) {
    auto it = from.find(k);
    if (it == from.end())
      TRIAX_THROW(CommError, "pipeline stage {}: nothing to send for micro-batch {} chunk {}", stage, k.mb, k.chunk);
    Pending p{send(pp_, be, it->second, peer, tag), std::move(it->second)};
    from.erase(it);
    sends.push_back(std::move(p));
    res.peak_send_buffers = std::max(res.peak_send_buffers, sends.size());
  };

  count_.store(list.size(), std::memory_order_relaxed);
  for (size_t i = 0; i < list.size(); ++i) {
    const PipeInstr& in = list[i];
    pos_.store((uint64_t{i} & 0xffffff) << 40 | uint64_t{static_cast<uint8_t>(in.op)} << 32 |
                   (static_cast<uint64_t>(in.mb) & 0xfffff) << 12 | (static_cast<uint64_t>(in.chunk) & 0xfff),
               std::memory_order_relaxed);
    const Key k{in.mb, in.chunk};
    Stage& ch = *chunks_.at(static_cast<size_t>(in.chunk));
    const bool first = sch.is_first_virtual(stage, in.chunk);
    const bool last = sch.is_last_virtual(stage, in.chunk);
    const int tag = message_tag(sch, stage, in);
    double start = since(t0), waited = 0;
    double cpu0 = record && is_compute(in.op) ? thread_cpu_s() : 0;
    switch (in.op) {
      case PipeOp::recv_activation: {
        auto& buf = act_in[k];
        buf = buffer();
        recv_act[k] = recv(pp_, be, buf, in.peer, tag);
        break;
      }
      case PipeOp::recv_grad: {
        auto& buf = grad_in[k];
        buf = buffer();
        recv_grad[k] = recv(pp_, be, buf, in.peer, tag);
        break;
      }
      case PipeOp::send_activation:
        start_send(act_out, k, in.peer, tag);
        break;
      case PipeOp::send_grad:
        start_send(grad_out, k, in.peer, tag);
        break;
      case PipeOp::forward: {
        Tensor x_in;
        if (!first) {
          waited = wait_recv(recv_act, k, "the activation");
          x_in = act_in[k];
          start = since(t0);
          if (record) cpu0 = thread_cpu_s();
        }
        if (first || last) data(in.mb, tokens, targets);
        Tensor x_out;
        if (!last) {
          auto& out = act_out[k];
          out = buffer();
          x_out = out;
        }
        const auto c0 = Clock::now();
        const double loss = ch.forward(in.mb, B_, T_, first ? std::span<const int32_t>(tokens) : std::span<const int32_t>(),
                                      last ? std::span<const int32_t>(targets) : std::span<const int32_t>(), x_in, x_out,
                                      /*training=*/!sch.forward_only, dloss);
        res.compute_s += since(c0);
        if (last) res.loss_sum += loss;
        act_in.erase(k);
        break;
      }
      case PipeOp::backward:
      case PipeOp::backward_input: {
        Tensor dx_out;
        if (!last) {
          waited = wait_recv(recv_grad, k, "the output gradient");
          dx_out = grad_in[k];
          start = since(t0);
          if (record) cpu0 = thread_cpu_s();
        }
        Tensor dx_in;
        if (!first) {
          auto& g = grad_out[k];
          g = buffer();
          dx_in = g;
        }
        armed = static_cast<int>(i) == last_b[static_cast<size_t>(in.chunk)];
        const auto c0 = Clock::now();
        ch.backward(in.mb, dx_out, dx_in, in.op == PipeOp::backward_input);
        res.compute_s += since(c0);
        armed = false;
        grad_in.erase(k);
        break;
      }
      case PipeOp::backward_weight: {
        armed = static_cast<int>(i) == last_w[static_cast<size_t>(in.chunk)];
        const auto c0 = Clock::now();
        ch.backward_weight(in.mb);
        res.compute_s += since(c0);
        armed = false;
        break;
      }
    }
    if (record && is_compute(in.op)) res.events.push_back({in, start, since(t0), waited, thread_cpu_s() - cpu0});
    progress();
  }
  const auto w0 = Clock::now();
  pos_.store(~uint64_t{0}, std::memory_order_relaxed);
  for (auto& p : sends) p.work.wait();
  sends.clear();
  res.p2p_wait_s += since(w0);
  if (!recv_act.empty() || !recv_grad.empty())
    TRIAX_THROW(CommError, "pipeline stage {}: {} received tensors were never consumed by schedule '{}'", stage,
                recv_act.size() + recv_grad.size(), sch.label());
  res.wall_s = since(t0);
  return res;
}

std::string PipelineExecutor::position() const {
  const uint64_t p = pos_.load(std::memory_order_relaxed);
  if (p == ~uint64_t{0}) return {};
  return fmt::format("instruction {} of {}: {} mb {} chunk {}", (p >> 40) + 1, count_.load(std::memory_order_relaxed),
                     pipe_op_name(static_cast<PipeOp>((p >> 32) & 0xff)), (p >> 12) & 0xfffff, p & 0xfff);
}

}  // namespace triax
