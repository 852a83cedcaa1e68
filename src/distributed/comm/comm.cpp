// Backend-independent half of Communicator: argument checks, call numbering, waits with
// deadlines and the error messages that name the call, the rank, the group and the peer.
#include "triax/distributed/comm/comm.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <thread>

#include "triax/core/env.h"

namespace triax {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

std::string_view backend_name(CommBackend b) {
  switch (b) {
    case CommBackend::self: return "self";
    case CommBackend::mpi: return "mpi";
    case CommBackend::nccl: return "nccl";
    case CommBackend::gloo: return "gloo";
  }
  return "?";
}

// The one reader of TRIAX_COMM_TIMEOUT_S (checkpoint commits use it too): 1 ms to ~116 days.
std::chrono::milliseconds default_comm_timeout() {
  const double s = env_seconds("TRIAX_COMM_TIMEOUT_S", 0.001, 1e7, 600.0);
  return std::chrono::milliseconds(std::llround(s * 1000.0));
}

Communicator::Communicator(int rank, int size, std::string name, std::vector<int> world_ranks, CommOptions opts)
    : rank_(rank), size_(size), name_(std::move(name)), world_ranks_(std::move(world_ranks)),
      timeout_(opts.timeout.count() > 0 ? opts.timeout : default_comm_timeout()),
      wait_(opts.wait ? *opts.wait : wait_policy_from_env()),
      debug_(debug_collectives_from_env()) {
  if (size_ <= 0 || rank_ < 0 || rank_ >= size_ || static_cast<int>(world_ranks_.size()) != size_)
    TRIAX_THROW(CommError, "communicator '{}': rank {} of size {} with {} world ranks is inconsistent", name_, rank_,
                size_, world_ranks_.size());
  fr_ = make_flight_recorder(name_, rank_, world_ranks_.at(rank_), world_ranks_, flight_recorder_capacity());
  fr_->set_timeout(timeout_);
}

bool debug_collectives_from_env() { return env_flag("TRIAX_DEBUG_COLLECTIVES", false); }

namespace {
// A small stable code per operation name for the mismatch check (FNV-1a).
int64_t op_hash(std::string_view op) {
  uint64_t h = 1469598103934665603ull;
  for (char c : op) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return static_cast<int64_t>(h >> 8);
}
}  // namespace

CallInfo Communicator::issued(CallInfo info, DType dt, size_t count, int op_code) {
  if (!debug_ || size_ == 1 || info.peer >= 0 || backend() == CommBackend::nccl) {
    fr_->enqueued(info, dt, count);
    return info;
  }
  // Every rank contributes {seq, op, dtype, count} through the backend's own all-gather (host
  // memory; not numbered, so the check never shifts the sequence it checks).
  const int64_t mine[4] = {static_cast<int64_t>(info.seq), op_hash(info.op) * 16 + op_code, static_cast<int64_t>(dt),
                           info.op == "all_to_all_v" ? -1 : static_cast<int64_t>(count)};
  std::vector<int64_t> all(4 * static_cast<size_t>(size_));
  CallInfo check{info.seq, "collective check of " + info.op, "int64 x 4", -1};
  // The check completes before the call is recorded, so its completion cannot mark the call done.
  Work w = all_gather_impl(make_buffer(std::span<const int64_t>(mine)), make_buffer(std::span<int64_t>(all)), check);
  w.wait();
  fr_->enqueued(info, dt, count);
  for (int r = 0; r < size_; ++r) {
    const int64_t* o = &all[4 * static_cast<size_t>(r)];
    if (std::equal(o, o + 4, mine)) continue;
    const std::string theirs =
        o[0] != mine[0] ? fmt::format("call #{}", o[0])
        : o[1] != mine[1] ? std::string("a different operation (or reduce op)")
                          : fmt::format("{} x {}", dtype_name(static_cast<DType>(o[2])), o[3]);
    fr_->ended(info.seq, FrState::failed);
    poisoned_ = true;
    dump_flight_recorder(fmt::format("collective mismatch on group '{}' #{}", name_, info.seq));
    TRIAX_THROW(CommError,
                "collective mismatch (TRIAX_DEBUG_COLLECTIVES) at {} #{} on {}: group rank {} (world rank {}) called "
                "{} ({}) but group rank {} (world rank {}) called {}",
                info.op, info.seq, describe(), rank_, world_rank(), info.op, info.detail, r, world_ranks_.at(r),
                theirs);
  }
  return info;
}

std::string Communicator::describe() const {
  return fmt::format("group '{}' (world ranks [{}]) at world rank {} (group rank {})", name_,
                     fmt::join(world_ranks_, ","), world_rank(), rank_);
}

CallInfo Communicator::next(const char* op, size_t count, DType dt) {
  check_alive(op);
  return issued(CallInfo{seq_++, op, fmt::format("{} x {}", dtype_name(dt), count), -1}, dt, count, 0);
}
CallInfo Communicator::next(const char* op, size_t count, DType dt, ReduceOp rop) {
  check_alive(op);
  // Refused here, before numbering, so every backend agrees (Self would otherwise copy silently).
  // Integer avg is allowed: it truncates like NCCL's ncclAvg.
  if (dt == DType::u8)
    TRIAX_THROW(CommError, "{} ({}) on {}: uint8 buffers move but cannot be reduced", op, reduce_op_name(rop),
                describe());
  return issued(CallInfo{seq_++, op, fmt::format("{} x {}, {}", dtype_name(dt), count, reduce_op_name(rop)), -1}, dt,
                count, 1 + static_cast<int>(rop));
}
CallInfo Communicator::next(const char* op, size_t count, DType dt, int peer) {
  check_alive(op);
  const bool p2p = std::string_view(op) == "send" || std::string_view(op) == "recv";
  return issued(CallInfo{seq_++, op,
                         fmt::format("{} x {}, {} {} (world rank {})", dtype_name(dt), count, p2p ? "peer" : "root",
                                     peer, world_ranks_.at(peer)),
                         p2p ? peer : -1},
                dt, count, 8 + peer);
}

void Communicator::check_alive(const char* op) const {
  if (poisoned_)
    TRIAX_THROW(CommError, "{} on {}: the communicator failed or timed out earlier and cannot be used again", op,
                describe());
}

void Communicator::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_)
    TRIAX_THROW(CommError, "{} {} is out of range for {} of size {}", what, peer, describe(), size_);
}

void Communicator::check_multiple(size_t big, size_t small, const char* op) const {
  if (big != small * static_cast<size_t>(size_))
    TRIAX_THROW(CommError, "{} on {}: the full buffer has {} elements but must hold {} blocks of {} = {}", op,
                describe(), big, size_, small, small * size_);
}

void Communicator::check_equal_blocks(size_t in, size_t out, const char* op) const {
  if (in != out || in % static_cast<size_t>(size_) != 0)
    TRIAX_THROW(CommError, "{} on {}: in ({}) and out ({}) must be equal and divisible by the group size {}", op,
                describe(), in, out, size_);
}

void Communicator::check_counts(size_t in, std::span<const int64_t> sc, size_t out,
                                std::span<const int64_t> rc) const {
  if (sc.size() != static_cast<size_t>(size_) || rc.size() != static_cast<size_t>(size_))
    TRIAX_THROW(CommError, "all_to_all_v on {}: {} send counts and {} receive counts, expected {} each", describe(),
                sc.size(), rc.size(), size_);
  for (size_t i = 0; i < sc.size(); ++i)
    if (sc[i] < 0 || rc[i] < 0)
      TRIAX_THROW(CommError, "all_to_all_v on {}: negative count for rank {}", describe(), i);
  const auto ssum = std::accumulate(sc.begin(), sc.end(), int64_t{0});
  const auto rsum = std::accumulate(rc.begin(), rc.end(), int64_t{0});
  if (static_cast<size_t>(ssum) != in || static_cast<size_t>(rsum) != out)
    TRIAX_THROW(CommError,
                "all_to_all_v on {}: send counts sum to {} for a buffer of {}, receive counts to {} for a buffer of {}",
                describe(), ssum, in, rsum, out);
}

Work Communicator::batch_send_recv(std::span<const P2POp> ops) {
  check_alive("batch_send_recv");
  size_t sends = 0, recvs = 0;
  for (const auto& o : ops) {
    check_peer(o.peer, o.kind == P2POp::Kind::send ? "batch send peer" : "batch recv peer");
    (o.kind == P2POp::Kind::send ? sends : recvs) += 1;
  }
  CallInfo info{seq_++, "batch_send_recv", fmt::format("{} sends, {} receives", sends, recvs), -1};
  if (ops.size() == 1) info.peer = ops[0].peer;
  fr_->enqueued(info, DType::u8, 0);
  return batch_impl(ops, std::move(info));
}

void Communicator::fail(const CallInfo& info, const std::string& why) const {
  poisoned_ = true;
  fr_->ended(info.seq, FrState::failed);
  dump_flight_recorder(fmt::format("{} #{} failed on group '{}': {}", info.op, info.seq, name_, why));
  TRIAX_THROW(CommError, "{} #{} ({}) on {} failed: {}", info.op, info.seq, info.detail, describe(), why);
}

void Communicator::raise_timeout(const CallInfo& info, std::chrono::milliseconds t) {
  poisoned_ = true;
  fr_->ended(info.seq, FrState::timed_out);
  dump_flight_recorder(fmt::format("{} #{} timed out on group '{}'", info.op, info.seq, name_));
  on_timeout(info);
  std::string who;
  if (info.peer >= 0)
    who = fmt::format("; waiting for peer group rank {} (world rank {})", info.peer, world_ranks_.at(info.peer));
  else
    who = fmt::format("; waiting for the other members of the group (world ranks [{}])", fmt::join(world_ranks_, ","));
  TRIAX_THROW(TimeoutError, "{} #{} ({}) on {} timed out after {:.3f} s{}. A rank may have died, be stuck, or "
              "have issued a different call sequence on this group",
              info.op, info.seq, info.detail, describe(), t.count() / 1000.0, who);
}

// ---- Work ----
Work::Work(std::shared_ptr<WorkImpl> impl, Communicator* comm, CallInfo info)
    : impl_(std::move(impl)), comm_(comm), info_(std::move(info)) {}

bool Work::test() {
  if (!impl_ || finished_) return true;
  if (!impl_->test()) return false;
  finished_ = true;
  impl_->finish();
  if (comm_) comm_->fr_->ended(info_.seq, FrState::completed);
  return true;
}

void Work::wait() { wait(comm_ ? comm_->timeout() : default_comm_timeout()); }

void Work::wait(std::chrono::milliseconds timeout) {
  if (!impl_ || finished_) return;
  if (comm_) comm_->fr_->started(info_.seq);
  if (impl_->wait_on_device()) {  // a device-side dependency instead of a host wait
    finished_ = true;
    impl_->finish();
    if (comm_) comm_->fr_->ended(info_.seq, FrState::completed);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout;
  // Spin for wait_policy().spin (50 us), and on up to spin_idle (1 s) while this thread is not
  // preempted; then sleep 1/8 of the time waited so far, 10 us to 100 us, between polls. Why not
  // always spin: when ranks outnumber free cores (np 4 on 2 cores, or other processes on the
  // node) a spinning rank holds the core the rank it waits for needs, until the scheduler
  // preempts it. Why keep spinning while not preempted: then no thread of similar priority
  // wants the core, and a wake-up from a sleep costs tens of microseconds per wait, which
  // pipeline P2P pays many times per step. Why sleep rather than sched_yield: a yield hands the
  // core to any runnable process for a whole time slice (after every poll, that made 1 MiB
  // calls 10-40x slower on the shared machine), while a sleeper that wakes runs again promptly.
  using Clock = std::chrono::steady_clock;
  // Per thread: preempted soon after spinning started, in a recent wait: spin short until then.
  // A preemption after a long stretch of spinning (over kRarePreemption of spin since the last
  // one) is left alone: the competitor is a niced or occasional process, not a rank.
  thread_local Clock::time_point contended_until{};
  thread_local Clock::duration spun_since_preempted{};
  const WaitPolicy policy = comm_ ? comm_->wait_policy() : WaitPolicy{};
  const auto spin_end = start + (start < contended_until ? policy.spin : std::max(policy.spin, policy.spin_idle));
  long preempted_seen = spin_end > start + policy.spin ? thread_preemptions() : 0;
  auto next_check = start + policy.spin;
  auto stretch = start;  // start of the spinning not yet added to spun_since_preempted
  bool spinning = true;
  while (!test()) {
    const auto now = Clock::now();
    if (now >= deadline) comm_->raise_timeout(info_, timeout);
    if (spinning && now >= next_check) {
      if (now >= spin_end) {
        spinning = false;
      } else if (const long p = thread_preemptions(); p != preempted_seen) {
        preempted_seen = p;
        const auto spun = spun_since_preempted + (now - stretch);
        spun_since_preempted = {};
        stretch = now;
        if (spun < kRarePreemption) {
          spinning = false;
          contended_until = now + kContendedFor;
        }
      }
      if (!spinning) spun_since_preempted += now - stretch;
      next_check = now + kPreemptCheckEvery;
    }
    if (!spinning)
      std::this_thread::sleep_for(std::min<Clock::duration>(wait_pause(policy, now - start), deadline - now));
  }
  if (spinning) spun_since_preempted += Clock::now() - stretch;
}

void wait_all(std::span<Work> works) {
  for (auto& w : works) w.wait();
}

}  // namespace triax
