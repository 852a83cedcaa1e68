// Communicator: typed collectives and point-to-point calls on spans, each asynchronous, each
// numbered, each wait bounded by a timeout. Backends (MPI or Gloo on host memory, NCCL on device
// memory, Self for one process) implement the *_impl hooks on type-erased buffers; users never see void*.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "triax/core/dtype.h"
#include "triax/core/error.h"
#include "triax/distributed/failure/flight_recorder.h"
#include "triax/distributed/comm/wait_policy.h"

namespace triax {

enum class ReduceOp { sum, avg, max, min };
enum class CommBackend { self, mpi, nccl, gloo };

std::string_view reduce_op_name(ReduceOp op);
std::string_view backend_name(CommBackend b);

// A type-erased view of a typed span; built only by Communicator's templates.
struct Buffer {
  void* data = nullptr;
  size_t count = 0;  // elements, never bytes
  DType dtype = DType::f32;
  size_t bytes() const { return count * dtype_size(dtype); }
};

template <class T>
Buffer make_buffer(std::span<T> s) {
  return Buffer{const_cast<void*>(static_cast<const void*>(s.data())), s.size(), dtype_of<T>()};
}

// make_buffer's inverse: f(std::span<T>) for the Buffer's element type T (communicator wrappers
// that forward a call to a typed API). `who` names the caller in the error for an unknown dtype.
template <class F>
decltype(auto) with_span(const Buffer& b, const char* who, F&& f) {
  switch (b.dtype) {
    case DType::f32: return f(std::span<float>(static_cast<float*>(b.data), b.count));
    case DType::f64: return f(std::span<double>(static_cast<double*>(b.data), b.count));
    case DType::i32: return f(std::span<int32_t>(static_cast<int32_t*>(b.data), b.count));
    case DType::i64: return f(std::span<int64_t>(static_cast<int64_t*>(b.data), b.count));
    case DType::bf16: return f(std::span<bf16>(static_cast<bf16*>(b.data), b.count));
    case DType::f16: return f(std::span<f16>(static_cast<f16*>(b.data), b.count));
    case DType::u8: return f(std::span<uint8_t>(static_cast<uint8_t*>(b.data), b.count));
  }
  TRIAX_THROW(ConfigError, "{}: unknown dtype {}", who, static_cast<int>(b.dtype));
}

// Identifies one call for error and hang reports: "all_reduce #12 (float32 x 4096, sum)".
struct CallInfo {
  uint64_t seq = 0;
  std::string op;      // "all_reduce", "recv", ...
  std::string detail;  // dtype, count, op, peer
  int peer = -1;       // group rank of the peer for point-to-point calls, -1 otherwise
};

class Communicator;

// Backend-specific state of one in-flight call.
class WorkImpl {
 public:
  virtual ~WorkImpl() = default;
  // Advances the call; true once complete. Throws CommError on failure.
  virtual bool test() = 0;
  // Runs after completion, exactly once (e.g. divide for ReduceOp::avg).
  virtual void finish() {}
  // Work::wait() asks this first. An implementation that can order everything the caller does
  // next after the call without the host waiting (a device stream made to wait for it: the CUDA
  // layer's device communicator, cuda/device_comm.h) does so and returns true: the call then
  // counts as complete for the caller, and the implementation still reports its errors and
  // timeouts later. test() stays the plain question "has it completed?". Default: no.
  virtual bool wait_on_device() { return false; }
};

// Handle of an asynchronous call. wait() blocks until it completes or the timeout passes, then
// throws TimeoutError naming the call, its sequence number, the rank, the group and the peer.
class Work {
 public:
  Work() = default;
  Work(std::shared_ptr<WorkImpl> impl, Communicator* comm, CallInfo info);
  // True once complete (non-blocking).
  bool test();
  // Waits with the communicator's default timeout.
  void wait();
  void wait(std::chrono::milliseconds timeout);
  bool valid() const { return impl_ != nullptr; }
  const CallInfo& info() const { return info_; }
  // The backend state, for backend-specific helpers (e.g. wait_on_stream of the NCCL backend).
  WorkImpl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<WorkImpl> impl_;
  Communicator* comm_ = nullptr;
  CallInfo info_;
  bool finished_ = false;
};

// Waits for every handle in order.
void wait_all(std::span<Work> works);

// One half of a batched point-to-point exchange.
struct P2POp {
  enum class Kind { send, recv };
  Kind kind;
  Buffer buf;
  int peer;  // group rank
  int tag = 0;
  template <class T>
  static P2POp send(std::span<const T> s, int peer, int tag = 0) {
    return P2POp{Kind::send, make_buffer(s), peer, tag};
  }
  template <class T>
  static P2POp recv(std::span<T> s, int peer, int tag = 0) {
    return P2POp{Kind::recv, make_buffer(s), peer, tag};
  }
};

struct CommOptions {
  // Default timeout of every wait; TRIAX_COMM_TIMEOUT_S overrides the built-in 600 s.
  std::chrono::milliseconds timeout{0};
  // How waits poll (wait_policy.h); unset: wait_policy_from_env().
  std::optional<WaitPolicy> wait;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Name of the group ("world", "tp", "dp", ...), used in every error message.
  const std::string& name() const { return name_; }
  // World rank of each group rank.
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  int world_rank() const { return world_ranks_.at(rank_); }
  virtual CommBackend backend() const = 0;
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) {
    timeout_ = t;
    fr_->set_timeout(t);  // the watchdog's overdue check (find_overdue_call) uses it
  }
  // How Work::wait polls this communicator's calls: spin, then sleep (wait_policy.h).
  const WaitPolicy& wait_policy() const { return wait_; }
  void set_wait_policy(WaitPolicy p) { wait_ = p; }
  // Number of calls issued so far on this communicator (the next call gets seq = calls()).
  uint64_t calls() const { return seq_; }
  // "group 'dp' (world ranks [1,3,5,7]) at rank 3 (group rank 1)"
  std::string describe() const;
  // Once a call has failed or timed out, the communicator is unusable: later calls throw.
  bool poisoned() const { return poisoned_; }
  // The ring of this communicator's last calls (flight_recorder.h); never null.
  const FlightRecorder& flight_recorder() const { return *fr_; }
  // Collective mismatch check (TRIAX_DEBUG_COLLECTIVES=1 sets it for new communicators): before
  // each collective the group compares op, dtype and count and raises CommError naming both ranks
  // and the sequence number when they differ. Costs one small all-gather per collective.
  bool debug_collectives() const { return debug_; }
  void set_debug_collectives(bool on) { debug_ = on; }

  template <class T>
  Work all_reduce(std::span<T> data, ReduceOp op = ReduceOp::sum) {
    return all_reduce_impl(make_buffer(data), op, next("all_reduce", data.size(), dtype_of<T>(), op));
  }
  // in holds size()*out.size() elements; group rank r receives the reduced block r.
  template <class T>
  Work reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    check_multiple(in.size(), out.size(), "reduce_scatter");
    return reduce_scatter_impl(make_buffer(in), make_buffer(out), op,
                               next("reduce_scatter", out.size(), dtype_of<T>(), op));
  }
  // out holds size()*in.size() elements, block r from group rank r.
  template <class T>
  Work all_gather(std::span<const T> in, std::span<T> out) {
    check_multiple(out.size(), in.size(), "all_gather");
    return all_gather_impl(make_buffer(in), make_buffer(out), next("all_gather", in.size(), dtype_of<T>()));
  }
  // in and out hold size() equal blocks; block r of in goes to group rank r.
  template <class T>
  Work all_to_all(std::span<const T> in, std::span<T> out) {
    check_equal_blocks(in.size(), out.size(), "all_to_all");
    return all_to_all_impl(make_buffer(in), make_buffer(out), next("all_to_all", in.size(), dtype_of<T>()));
  }
  // Variable blocks: send_counts[r] elements (contiguous, in rank order) go to rank r;
  // recv_counts[r] arrive from rank r. Counts are elements.
  template <class T>
  Work all_to_all_v(std::span<const T> in, std::span<const int64_t> send_counts, std::span<T> out,
                    std::span<const int64_t> recv_counts) {
    check_counts(in.size(), send_counts, out.size(), recv_counts);
    return all_to_all_v_impl(make_buffer(in), send_counts, make_buffer(out), recv_counts,
                             next("all_to_all_v", in.size(), dtype_of<T>()));
  }
  template <class T>
  Work broadcast(std::span<T> data, int root) {
    check_peer(root, "broadcast root");
    return broadcast_impl(make_buffer(data), root, next("broadcast", data.size(), dtype_of<T>(), root));
  }
  template <class T>
  Work send(std::span<const T> data, int peer, int tag = 0) {
    check_peer(peer, "send peer");
    return send_impl(make_buffer(data), peer, tag, next("send", data.size(), dtype_of<T>(), peer));
  }
  template <class T>
  Work recv(std::span<T> data, int peer, int tag = 0) {
    check_peer(peer, "recv peer");
    return recv_impl(make_buffer(data), peer, tag, next("recv", data.size(), dtype_of<T>(), peer));
  }
  // All sends and receives start together; completes when all have.
  Work batch_send_recv(std::span<const P2POp> ops);
  Work barrier() { return barrier_impl(next("barrier", 0, DType::i32)); }

  // A sub-communicator of the ranks that pass the same color, ordered by key (collective over
  // this communicator). color < 0: this rank joins none and gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) = 0;

 protected:
  Communicator(int rank, int size, std::string name, std::vector<int> world_ranks, CommOptions opts = {});

  virtual Work all_reduce_impl(Buffer data, ReduceOp op, CallInfo info) = 0;
  virtual Work reduce_scatter_impl(Buffer in, Buffer out, ReduceOp op, CallInfo info) = 0;
  virtual Work all_gather_impl(Buffer in, Buffer out, CallInfo info) = 0;
  virtual Work all_to_all_impl(Buffer in, Buffer out, CallInfo info) = 0;
  virtual Work all_to_all_v_impl(Buffer in, std::span<const int64_t> send_counts, Buffer out,
                                 std::span<const int64_t> recv_counts, CallInfo info) = 0;
  virtual Work broadcast_impl(Buffer data, int root, CallInfo info) = 0;
  virtual Work send_impl(Buffer data, int peer, int tag, CallInfo info) = 0;
  virtual Work recv_impl(Buffer data, int peer, int tag, CallInfo info) = 0;
  virtual Work batch_impl(std::span<const P2POp> ops, CallInfo info) = 0;
  virtual Work barrier_impl(CallInfo info) = 0;
  // Called when a wait times out: the backend may abort (NCCL) and must leave no dangling state.
  virtual void on_timeout(const CallInfo&) {}

  Work make_work(std::shared_ptr<WorkImpl> impl, CallInfo info) { return Work(std::move(impl), this, std::move(info)); }
  CallInfo next(const char* op, size_t count, DType dt);
  CallInfo next(const char* op, size_t count, DType dt, ReduceOp rop);
  CallInfo next(const char* op, size_t count, DType dt, int peer);
  // Records a numbered call in the flight recorder and, when asked, checks it across the group.
  CallInfo issued(CallInfo info, DType dt, size_t count, int op_code);
  [[noreturn]] void fail(const CallInfo& info, const std::string& why) const;
  // Poisons the communicator, calls on_timeout, throws TimeoutError naming the call and the peers.
  // Work::wait calls it; a backend calls it when a host-side step (e.g. NCCL's enqueue) overruns.
  [[noreturn]] void raise_timeout(const CallInfo& info, std::chrono::milliseconds t);

 private:
  friend class Work;
  void check_alive(const char* op) const;
  void check_peer(int peer, const char* what) const;
  void check_multiple(size_t big, size_t small, const char* op) const;
  void check_equal_blocks(size_t in, size_t out, const char* op) const;
  void check_counts(size_t in, std::span<const int64_t> sc, size_t out, std::span<const int64_t> rc) const;

  int rank_;
  int size_;
  std::string name_;
  std::vector<int> world_ranks_;
  std::chrono::milliseconds timeout_;
  WaitPolicy wait_;
  uint64_t seq_ = 0;
  mutable bool poisoned_ = false;
  bool debug_ = false;
  std::shared_ptr<FlightRecorder> fr_;
};

// True when TRIAX_DEBUG_COLLECTIVES is on (1, true, yes, on: core/env.h's env_flag).
bool debug_collectives_from_env();

// Default timeout: TRIAX_COMM_TIMEOUT_S (seconds, fractions allowed, in [0.001, 1e7]) if set, else
// 600 s. The only reader of that variable: checkpoint commits wait as long.
std::chrono::milliseconds default_comm_timeout();

}  // namespace triax
