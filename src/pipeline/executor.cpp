// The executor walks the list in order. Receives are posted where listed and waited for by the
// compute that consumes them; sends are started where listed and completed at the end (they are
// tested as we go so MPI keeps progressing). DP bucket marks are armed only for the last
// backward (B) and last weight pass (W) of each chunk in this step, so each parameter is marked once.
#include "triax/pipeline/executor.h"

#include <chrono>
#include <ctime>
#include <thread>

#include "triax/backend/comm_ops.h"
#include "triax/core/clock.h"
#include "triax/core/env.h"
#include "triax/core/trace.h"

#if defined(TRIAX_HAVE_CUDA)
#include "triax/cuda/nvtx.h"
#endif

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

// One instruction as the compute methods see it: its micro-batch and chunk, whether the chunk is
// the model's first or last virtual stage, and (for ExecEvent) when its busy time starts (seconds
// from the step's start), how long its receive blocked, and the thread's CPU clock at its start.
struct Instr {
  const PipeInstr& in;
  Key k;
  Stage& ch;
  bool first, last;
  double start = 0, waited = 0, cpu0 = 0;
  double tr0 = 0;  // the same start on the timeline's clock (--profile-steps; 0 while off)
};

#if defined(TRIAX_HAVE_CUDA)
// The NVTX range of an instruction (Nsight Systems): the timeline's points without its numbers.
const char* nvtx_name(PipeOp op) {
  switch (op) {
    case PipeOp::forward: return "pipeline forward";
    case PipeOp::backward: return "pipeline backward";
    case PipeOp::backward_input: return "pipeline backward_input";
    case PipeOp::backward_weight: return "pipeline backward_weight";
    case PipeOp::send_activation: return "pipeline send activation";
    case PipeOp::send_grad: return "pipeline send gradient";
    case PipeOp::recv_activation: return "pipeline post recv activation";
    case PipeOp::recv_grad: return "pipeline post recv gradient";
  }
  return "pipeline";
}
#endif

// The timeline's name of a compute instruction: "forward mb 3", "backward mb 0 chunk 1".
std::string span_name(const PipeInstr& in, int chunks) {
  return chunks > 1 ? fmt::format("{} mb {} chunk {}", pipe_op_name(in.op), in.mb, in.chunk)
                    : fmt::format("{} mb {}", pipe_op_name(in.op), in.mb);
}

// One step of one stage: the buffers and in-flight messages of every micro-batch in the list, and
// what the step measures. PipelineExecutor::run makes one per call and hands it each instruction.
class StepState {
 public:
  StepState(const Schedule& sch, const std::vector<Stage*>& chunks, Communicator& pp, int B, int T, int C,
            const MicroBatchFn& data, GradReadySink* grads, float dloss, bool record, int64_t pad_us)
      : pad_us_(pad_us), sch_(sch), chunks_(chunks), pp_(pp), be_(chunks.front()->backend()), data_(data), grads_(grads),
        dloss_(dloss), record_(record), stage_(pp.rank()), B_(B), T_(T),
        // Hidden states crossing stages: (B*T, C), or this rank's B*T/tp rows under sequence parallelism.
        N_(static_cast<size_t>(chunks.front()->io_rows(B, T)) * C) {
    const auto& list = sch.lists.at(static_cast<size_t>(stage_));
    // The last backward-input pass and the last weight pass of each chunk arm the DP marks.
    last_b_.assign(chunks.size(), -1);
    last_w_.assign(chunks.size(), -1);
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& in = list[i];
      if (in.op == PipeOp::backward || in.op == PipeOp::backward_input) last_b_[static_cast<size_t>(in.chunk)] = static_cast<int>(i);
      if (in.op == PipeOp::backward || in.op == PipeOp::backward_weight) last_w_[static_cast<size_t>(in.chunk)] = static_cast<int>(i);
    }
  }

  void begin() {
    res_.micro_batches = sch_.micro_batches;
    t0_ = Clock::now();
    res_.origin_s = std::chrono::duration<double>(t0_.time_since_epoch()).count();
  }

  // The chunks' gradient-ready hook: marks reach the sink only inside an armed pass.
  void grad_ready(size_t idx) {
    // ZeRO-2/3 (every_backward) reduce each unit per backward pass, so every pass marks.
    if (!grads_ || !(armed_ || grads_->every_backward())) return;
    grads_->mark_ready(idx);
    // On the CPU backend a started all-reduce moves only while this rank is inside MPI: drive
    // the buckets already in flight at every parameter, or they all wait for finish() (the last
    // backward is one instruction, with no progress() call inside it).
    grads_->progress();
  }

  // Runs instruction i of this stage's list, records its event, and drives the messages in flight.
  void execute(size_t i, const PipeInstr& in) {
    const Key k{in.mb, in.chunk};
    Instr x{in, k, *chunks_.at(static_cast<size_t>(in.chunk)), sch_.is_first_virtual(stage_, in.chunk),
            sch_.is_last_virtual(stage_, in.chunk)};
    const int tag = message_tag(sch_, stage_, in);
#if defined(TRIAX_HAVE_CUDA)
    cuda::NvtxRange nvtx(nvtx_name(in.op));  // the whole instruction, its receive wait included
#endif
    x.start = since(t0_);
    x.cpu0 = record_ && is_compute(in.op) ? thread_cpu_s() : 0;
    if (trace::on()) x.tr0 = trace::now_us();
    switch (in.op) {
      case PipeOp::recv_activation: post_recv(act_in_, recv_act_, k, in.peer, tag); break;
      case PipeOp::recv_grad: post_recv(grad_in_, recv_grad_, k, in.peer, tag); break;
      case PipeOp::send_activation: start_send(act_out_, k, in.peer, tag); break;
      case PipeOp::send_grad: start_send(grad_out_, k, in.peer, tag); break;
      case PipeOp::forward: forward(x); break;
      case PipeOp::backward:
      case PipeOp::backward_input: backward(i, x); break;
      case PipeOp::backward_weight: backward_weight(i, x); break;
    }
    // TRIAX_PIPELINE_PAD_US: a fixed extra duration per compute (a full backward twice), inside
    // its busy interval; it sleeps, so ranks sharing cores all "compute" at once.
    if (pad_us_ > 0 && is_compute(in.op))
      std::this_thread::sleep_for(std::chrono::microseconds(in.op == PipeOp::backward ? 2 * pad_us_ : pad_us_));
    if (record_ && is_compute(in.op)) res_.events.push_back({in, x.start, since(t0_), x.waited, thread_cpu_s() - x.cpu0});
    if (trace::on() && is_compute(in.op))
      trace::record(trace::Lane::compute, span_name(in, sch_.chunks), x.tr0, trace::now_us(), in.mb, in.chunk);
    progress();
  }

  // Completes the sends still in flight (their wait counted from w0) and checks that every
  // received tensor was consumed.
  StepResult finish(Clock::time_point w0) {
    trace::Span span(trace::Lane::p2p, "wait sends");
    for (auto& p : sends_) p.work.wait();
    sends_.clear();
    res_.p2p_wait_s += since(w0);
    if (!recv_act_.empty() || !recv_grad_.empty())
      TRIAX_THROW(CommError, "pipeline stage {}: {} received tensors were never consumed by schedule '{}'", stage_,
                  recv_act_.size() + recv_grad_.size(), sch_.label());
    res_.wall_s = since(t0_);
    return std::move(res_);
  }

 private:
  // In-flight sends with the buffer each reads: a buffer is released as soon as its send
  // completes, so at most the schedule checker's bound of them is held, not one per micro-batch.
  struct Pending {
    Work work;
    Tensor buf;
  };

  Tensor buffer() {
    return be_.empty(Shape{static_cast<int64_t>(N_)}, be_.compute_dtype());  // activations and their gradients
  }

  // The busy interval of a compute that waited for its input starts when the wait ends.
  void restart(Instr& x) {
    x.start = since(t0_);
    if (record_) x.cpu0 = thread_cpu_s();
    if (trace::on()) x.tr0 = trace::now_us();
  }

  void post_recv(std::map<Key, Tensor>& bufs, std::map<Key, Work>& works, Key k, int peer, int tag) {
    auto& buf = bufs[k];
    buf = buffer();
    works[k] = recv(pp_, be_, buf, peer, tag);
  }

  double wait_recv(std::map<Key, Work>& works, Key k, const char* what, const char* span_name) {
    auto it = works.find(k);
    if (it == works.end())
      TRIAX_THROW(CommError, "pipeline stage {}: {} of micro-batch {} chunk {} was never received", stage_, what, k.mb,
                  k.chunk);
    const auto w0 = Clock::now();
    {
#if defined(TRIAX_HAVE_CUDA)
      cuda::NvtxRange nvtx(span_name);
#endif
      trace::Span span(trace::Lane::p2p, span_name, k.mb, k.chunk);
      it->second.wait();
    }
    const double waited = since(w0);
    res_.p2p_wait_s += waited;
    works.erase(it);
    return waited;
  }

  void start_send(std::map<Key, Tensor>& from, Key k, int peer, int tag) {
    auto it = from.find(k);
    if (it == from.end())
      TRIAX_THROW(CommError, "pipeline stage {}: nothing to send for micro-batch {} chunk {}", stage_, k.mb, k.chunk);
    trace::Span span(trace::Lane::p2p, &from == &act_out_ ? "send activation" : "send gradient", k.mb, k.chunk,
                     static_cast<int64_t>(it->second.nbytes()));
    Pending p{send(pp_, be_, it->second, peer, tag), std::move(it->second)};
    from.erase(it);
    sends_.push_back(std::move(p));
    res_.peak_send_buffers = std::max(res_.peak_send_buffers, sends_.size());
  }

  void progress() {
    if (grads_) grads_->progress();
    std::erase_if(sends_, [](Pending& p) { return p.work.test(); });
  }

  void forward(Instr& x) {
    const PipeInstr& in = x.in;
    const Key k = x.k;
    const bool first = x.first, last = x.last;
    Tensor x_in;
    if (!first) {
      x.waited = wait_recv(recv_act_, k, "the activation", "wait recv activation");
      x_in = act_in_[k];
      restart(x);
    }
    if (first || last) data_(in.mb, tokens_, targets_);
    Tensor x_out;
    if (!last) {
      auto& out = act_out_[k];
      out = buffer();
      x_out = out;
    }
    const auto c0 = Clock::now();
    const double loss = x.ch.forward(in.mb, B_, T_, first ? std::span<const int32_t>(tokens_) : std::span<const int32_t>(),
                                   last ? std::span<const int32_t>(targets_) : std::span<const int32_t>(), x_in, x_out,
                                   /*training=*/!sch_.forward_only, dloss_);
    res_.compute_s += since(c0);
    if (last) res_.loss_sum += loss;
    act_in_.erase(k);
  }

  void backward(size_t i, Instr& x) {
    const PipeInstr& in = x.in;
    const Key k = x.k;
    Tensor dx_out;
    if (!x.last) {
      x.waited = wait_recv(recv_grad_, k, "the output gradient", "wait recv gradient");
      dx_out = grad_in_[k];
      restart(x);
    }
    Tensor dx_in;
    if (!x.first) {
      auto& g = grad_out_[k];
      g = buffer();
      dx_in = g;
    }
    armed_ = static_cast<int>(i) == last_b_[static_cast<size_t>(in.chunk)];
    const auto c0 = Clock::now();
    x.ch.backward(in.mb, dx_out, dx_in, in.op == PipeOp::backward_input);
    res_.compute_s += since(c0);
    armed_ = false;
    grad_in_.erase(k);
  }

  void backward_weight(size_t i, Instr& x) {
    const PipeInstr& in = x.in;
    armed_ = static_cast<int>(i) == last_w_[static_cast<size_t>(in.chunk)];
    const auto c0 = Clock::now();
    x.ch.backward_weight(in.mb);
    res_.compute_s += since(c0);
    armed_ = false;
  }

  int64_t pad_us_;
  const Schedule& sch_;
  const std::vector<Stage*>& chunks_;
  Communicator& pp_;
  Backend& be_;
  const MicroBatchFn& data_;
  GradReadySink* grads_;
  float dloss_;
  bool record_;
  int stage_, B_, T_;
  size_t N_;
  std::vector<int> last_b_, last_w_;
  bool armed_ = false;  // inside the pass that gives a chunk's parameters their last gradients
  std::map<Key, Tensor> act_in_, act_out_, grad_in_, grad_out_;
  std::map<Key, Work> recv_act_, recv_grad_;
  std::vector<Pending> sends_;
  std::vector<int32_t> tokens_, targets_;
  StepResult res_;
  Clock::time_point t0_;
};
}  // namespace

PipelineExecutor::PipelineExecutor(std::vector<Stage*> chunks, Communicator& pp, int micro_batch, int seq,
                                   int hidden)
    : chunks_(std::move(chunks)), pp_(pp), B_(micro_batch), T_(seq), C_(hidden),
      pad_us_(env_int("TRIAX_PIPELINE_PAD_US", 0, 10'000'000, 0)) {
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
  StepState step(sch, chunks_, pp_, B_, T_, C_, data, grads, dloss, record, pad_us_);
  // The hook refers to this call's step: cleared on every way out (an exception included).
  struct HookGuard {
    std::vector<Stage*>& chunks;
    ~HookGuard() {
      for (auto* c : chunks) c->set_grad_ready_hook(nullptr);
    }
  } hook_guard{chunks_};
  for (auto* c : chunks_) c->set_grad_ready_hook([&step](size_t idx) { step.grad_ready(idx); });
  step.begin();

  count_.store(list.size(), std::memory_order_relaxed);
  for (size_t i = 0; i < list.size(); ++i) {
    const PipeInstr& in = list[i];
    pos_.store((uint64_t{i} & 0xffffff) << 40 | uint64_t{static_cast<uint8_t>(in.op)} << 32 |
                   (static_cast<uint64_t>(in.mb) & 0xfffff) << 12 | (static_cast<uint64_t>(in.chunk) & 0xfff),
               std::memory_order_relaxed);
    step.execute(i, in);
  }
  const auto w0 = Clock::now();
  pos_.store(~uint64_t{0}, std::memory_order_relaxed);
  return step.finish(w0);
}

std::string PipelineExecutor::position() const {
  const uint64_t p = pos_.load(std::memory_order_relaxed);
  if (p == ~uint64_t{0}) return {};
  return fmt::format("instruction {} of {}: {} mb {} chunk {}", (p >> 40) + 1, count_.load(std::memory_order_relaxed),
                     pipe_op_name(static_cast<PipeOp>((p >> 32) & 0xff)), (p >> 12) & 0xfffff, p & 0xfff);
}

}  // namespace triax
