// NCCL backend: one owned stream per communicator, ordered after the caller's input stream by an
// event; each call enqueues NCCL work and records a completion event. Non-blocking NCCL (the
// default) returns ncclInProgress from init, split and every enqueue: we poll the communicator's
// state with a deadline, so nothing on the host waits without a bound. Any NCCL or CUDA error, and
// any timeout, aborts the NCCL communicator (ncclCommAbort; never ncclCommDestroy on that path).
#include "triax/distributed/comm/nccl_comm.h"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

#include "triax/core/cuda_check.h"
#include "triax/core/gpu_count.h"
#include "triax/core/log.h"
#include "triax/distributed/comm/rdma.h"

namespace triax {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::u8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;  // floats: pre-multiply by 1/n; integers: sum, then divide
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

std::string nccl_why(const char* what, ncclResult_t r) {
  const char* last = ncclGetLastError(nullptr);
  return fmt::format("{} returned {} ({}){}{}", what, static_cast<int>(r), ncclGetErrorString(r),
                     last && *last ? "; NCCL's last error: " : "", last ? last : "");
}

std::string cuda_why(const char* what, cudaError_t e) {
  return fmt::format("{} returned {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

// Sets the current device for the scope: NCCL and stream/event calls must run on the
// communicator's device, and the caller's choice is restored afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    TRIAX_CHECK_CUDA(cudaGetDevice(&prev_));
    if (prev_ != device) TRIAX_CHECK_CUDA(cudaSetDevice(device));
    else prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// Polling with back-off: yield for the first millisecond (enqueues and short collectives finish
// there), then sleep so that a hung peer does not burn a core.
class Poller {
 public:
  explicit Poller(std::chrono::milliseconds timeout) : start_(Clock::now()), deadline_(start_ + timeout) {}
  bool expired() const { return Clock::now() >= deadline_; }
  void pause() const {
    if (Clock::now() - start_ < std::chrono::milliseconds(1))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

 private:
  Clock::time_point start_, deadline_;
};

// Waits until comm leaves ncclInProgress (non-blocking init or split); returns its state, or
// ncclInProgress if the deadline passed first.
ncclResult_t wait_ready(ncclComm_t comm, std::chrono::milliseconds timeout) {
  Poller poll(timeout);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t r = ncclCommGetAsyncError(comm, &state); r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (poll.expired()) return ncclInProgress;
    poll.pause();
  }
}

// name must outlive the NCCL communicator: NCCL keeps the commName pointer, not a copy.
ncclConfig_t make_config(const NcclOptions& opts, const std::string& name) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = opts.blocking ? 1 : 0;
#if NCCL_VERSION_CODE >= 22703  // commName appeared in NCCL 2.27.3: NCCL's own logs name the group
  cfg.commName = name.c_str();
#else
  (void)name;
#endif
  return cfg;
}

std::chrono::milliseconds resolve_timeout(const NcclOptions& o) {
  return o.timeout.count() > 0 ? o.timeout : default_comm_timeout();
}

// Device memory released on scope exit (the split exchange).
struct DeviceArray {
  int64_t* ptr = nullptr;
  explicit DeviceArray(size_t n) { TRIAX_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(int64_t))); }
  ~DeviceArray() {
    if (ptr) (void)cudaFree(ptr);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

void warn_on_version_skew() {
  static const bool once = [] {
    int v = 0;
    if (ncclGetVersion(&v) == ncclSuccess && v / 100 != NCCL_VERSION_CODE / 100)
      log::warn("nccl: triax was compiled against NCCL {} but libnccl at run time is {}; check NCCL_ROOT / "
                "LD_LIBRARY_PATH", NCCL_VERSION_CODE, v);
    return true;
  }();
  (void)once;
}

}  // namespace

// ---- one in-flight call ----
class NcclCommunicator::NcclWork final : public WorkImpl {
 public:
  NcclWork(NcclCommunicator* comm, cudaEvent_t done, CallInfo info) : comm_(comm), done_(done), info_(std::move(info)) {}
  ~NcclWork() override {
    if (done_) (void)cudaEventDestroy(done_);
  }
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;

  bool test() override {
    // After an abort nothing enqueued can be trusted, even if its event has fired.
    if (comm_->aborted_)
      comm_->fail(info_, "the NCCL communicator was aborted after an earlier error or timeout; the result is lost");
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) comm_->fail_abort(info_, cuda_why("cudaEventQuery on the completion event", q));
    // Still running: a peer may have failed (network error, remote abort) and left us spinning.
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t r = ncclCommGetAsyncError(comm_->comm_, &state); r != ncclSuccess)
      comm_->fail_abort(info_, nccl_why("ncclCommGetAsyncError", r));
    if (state != ncclSuccess && state != ncclInProgress)
      comm_->fail_abort(info_, nccl_why("an asynchronous NCCL error (ncclCommGetAsyncError)", state));
    return false;
  }

  cudaEvent_t event() const { return done_; }

 private:
  NcclCommunicator* comm_;
  cudaEvent_t done_;
  CallInfo info_;
};

// ---- creation ----
namespace {

// Rank 0's 128-byte ncclUniqueId reaches every rank through exchange (a broadcast from rank 0 of a
// string: the id, or an empty string when rank 0 could not make one, so no rank waits for an id
// that will never come). Collective over the ranks that exchange reaches.
using IdExchange = std::function<std::string(std::string_view rank0_bytes)>;

std::unique_ptr<Communicator> make_nccl(int rank, int size, std::vector<int> world, int cuda_device,
                                        std::string name, NcclOptions opts, const IdExchange& exchange) {
  std::string why;
  const int devices = cuda_device_count(&why);
  if (cuda_device < 0 || cuda_device >= devices)
    TRIAX_THROW(DeviceError, "NCCL communicator '{}' at rank {} of {}: CUDA device {} does not exist ({} visible{}{})",
                name, rank, size, cuda_device, devices, why.empty() ? "" : ": ", why);
  warn_on_version_skew();
  // HCAs, RoCE v2 GID index and socket interface from RDMA discovery, where the user set none.
  for (const auto& set : probe::apply_discovered_nccl_settings_once())
    if (rank == 0) log::info("nccl: {} (RDMA discovery; set it yourself to override)", set);
  const auto timeout = resolve_timeout(opts);
  DeviceGuard guard(cuda_device);  // NCCL binds the communicator to the current device

  ncclUniqueId id{};
  std::string failure;
  if (rank == 0) {
    if (const ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) failure = nccl_why("ncclGetUniqueId", r);
  }
  const std::string bytes =
      exchange(rank == 0 && failure.empty() ? std::string_view(id.internal, sizeof(id.internal)) : "");
  if (!failure.empty()) TRIAX_THROW(CommError, "NCCL communicator '{}' at rank 0: {}", name, failure);
  if (bytes.size() != sizeof(id.internal))
    TRIAX_THROW(CommError, "NCCL communicator '{}' at rank {}: rank 0 sent a unique id of {} bytes, expected {}{}",
                name, rank, bytes.size(), sizeof(id.internal), bytes.empty() ? " (rank 0 failed to create it)" : "");
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));

  auto nccl_name = std::make_unique<std::string>(name);
  ncclConfig_t cfg = make_config(opts, *nccl_name);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &cfg);
  const ncclResult_t state = (r == ncclSuccess || r == ncclInProgress) && comm ? wait_ready(comm, timeout) : r;
  if (state != ncclSuccess) {
    if (comm) (void)ncclCommAbort(comm);
    if (state == ncclInProgress)
      TRIAX_THROW(TimeoutError,
                  "NCCL communicator '{}' at rank {} of {} (device {}): ncclCommInitRankConfig did not complete within "
                  "{:.3f} s; another rank may have died or not called make_nccl_communicator. Aborted",
                  name, rank, size, cuda_device, timeout.count() / 1000.0);
    TRIAX_THROW(CommError, "NCCL communicator '{}' at rank {} of {} (device {}): {}", name, rank, size, cuda_device,
                nccl_why(r != ncclSuccess && r != ncclInProgress ? "ncclCommInitRankConfig" : "NCCL initialisation",
                         state));
  }
  return std::make_unique<NcclCommunicator>(comm, std::move(nccl_name), cuda_device, rank, size, std::move(name),
                                            std::move(world), opts);
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Bootstrap& boot, int cuda_device, std::string name,
                                                     NcclOptions opts) {
  std::vector<int> world(static_cast<size_t>(boot.world_size()));
  std::iota(world.begin(), world.end(), 0);
  return make_nccl(boot.rank(), boot.world_size(), std::move(world), cuda_device, std::move(name), opts,
                   [&](std::string_view bytes) { return boot.broadcast(bytes, 0); });
}

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, int cuda_device, std::string name,
                                                     NcclOptions opts) {
  // One fixed-size broadcast on the host communicator: a flag byte (1 = rank 0 made an id), then the id.
  constexpr size_t kId = sizeof(ncclUniqueId::internal);
  auto exchange = [&](std::string_view bytes) {
    std::vector<uint8_t> buf(1 + kId, 0);
    if (host.rank() == 0 && bytes.size() == kId) {
      buf[0] = 1;
      std::memcpy(buf.data() + 1, bytes.data(), kId);
    }
    host.broadcast(std::span<uint8_t>(buf), 0).wait();
    return buf[0] == 1 ? std::string(reinterpret_cast<const char*>(buf.data() + 1), kId) : std::string();
  };
  if (opts.timeout.count() == 0) opts.timeout = host.timeout();
  return make_nccl(host.rank(), host.size(), host.world_ranks(), cuda_device, std::move(name), opts, exchange);
}

NcclCommunicator::NcclCommunicator(ncclComm* comm, std::unique_ptr<std::string> nccl_name, int device, int rank,
                                   int size, std::string name, std::vector<int> world_ranks, NcclOptions opts)
    : Communicator(rank, size, std::move(name), std::move(world_ranks), CommOptions{opts.timeout}),
      comm_(comm), nccl_name_(std::move(nccl_name)), device_(device), opts_(opts) {
  try {
    DeviceGuard guard(device_);
    // Non-blocking: never implicitly synchronised with the legacy default stream, so ordering is
    // exactly the events we record.
    TRIAX_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TRIAX_CHECK_CUDA(cudaEventCreateWithFlags(&input_ready_, cudaEventDisableTiming));
    TRIAX_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&scratch_), sizeof(int32_t)));
    TRIAX_CHECK_CUDA(cudaMemsetAsync(scratch_, 0, sizeof(int32_t), stream_));
  } catch (...) {
    abort_comm();
    if (scratch_) (void)cudaFree(scratch_);
    if (input_ready_) (void)cudaEventDestroy(input_ready_);
    if (stream_) (void)cudaStreamDestroy(stream_);
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  (void)cudaSetDevice(device_);
  if (comm_ && !aborted_) {
    // Finalize flushes what is still enqueued; in non-blocking mode it returns ncclInProgress and
    // we wait for it with the communicator's timeout. If that fails, abort instead of hanging.
    ncclResult_t r = ncclCommFinalize(comm_);
    if (r == ncclSuccess || r == ncclInProgress) r = wait_ready(comm_, timeout());
    if (r == ncclSuccess) {
      (void)ncclCommDestroy(comm_);
    } else {
      log::warn("nccl: {}: finalize {} ({}); aborting the NCCL communicator", describe(),
                r == ncclInProgress ? "timed out" : "failed", ncclGetErrorString(r));
      (void)ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  if (stream_) (void)cudaStreamSynchronize(stream_);  // the scratch buffer may still be in use
  if (scratch_) (void)cudaFree(scratch_);
  if (input_ready_) (void)cudaEventDestroy(input_ready_);
  if (stream_) (void)cudaStreamDestroy(stream_);
  (void)cudaGetLastError();  // leave no error from teardown behind for the caller's next CUDA call
  if (prev >= 0) (void)cudaSetDevice(prev);
}

void NcclCommunicator::abort_comm() noexcept {
  if (comm_ && !aborted_) {
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    (void)cudaSetDevice(device_);
    if (const ncclResult_t r = ncclCommAbort(comm_); r != ncclSuccess) {
      try {
        log::warn("nccl: {}: ncclCommAbort returned {}", describe(), ncclGetErrorString(r));
      } catch (...) {
      }
    }
    if (prev >= 0) (void)cudaSetDevice(prev);
  }
  comm_ = nullptr;
  aborted_ = true;
}

void NcclCommunicator::on_timeout(const CallInfo& info) {
  try {
    log::warn("nccl: {}: {} #{} timed out; aborting the NCCL communicator", describe(), info.op, info.seq);
  } catch (...) {
  }
  abort_comm();
}

void NcclCommunicator::fail_abort(const CallInfo& info, const std::string& why) {
  abort_comm();
  fail(info, why + "; the NCCL communicator was aborted");
}

void NcclCommunicator::settle(int result, const CallInfo& info, const char* what) {
  const auto r = static_cast<ncclResult_t>(result);
  if (r != ncclSuccess && r != ncclInProgress) fail_abort(info, nccl_why(what, r));
  if (r == ncclSuccess && opts_.blocking) return;
  // Non-blocking: NCCL hands the launch to a helper thread. The stream must not be touched (the
  // completion event recorded) before the state is ncclSuccess again.
  Poller poll(timeout());
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (const ncclResult_t q = ncclCommGetAsyncError(comm_, &state); q != ncclSuccess)
      fail_abort(info, nccl_why("ncclCommGetAsyncError", q));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) fail_abort(info, nccl_why(what, state));
    if (poll.expired()) {
      CallInfo late = info;
      late.detail += fmt::format("; still being enqueued by {}", what);
      raise_timeout(late, timeout());  // on_timeout aborts
    }
    poll.pause();
  }
}

template <class F>
Work NcclCommunicator::enqueue(CallInfo info, const char* what, F&& nccl_calls) {
  if (aborted_) fail(info, "the NCCL communicator was aborted after an earlier error or timeout");
  DeviceGuard guard(device_);
  if (cudaError_t e = cudaEventRecord(input_ready_, input_stream_); e != cudaSuccess)
    fail_abort(info, cuda_why("cudaEventRecord on the input stream", e));
  if (cudaError_t e = cudaStreamWaitEvent(stream_, input_ready_, 0); e != cudaSuccess)
    fail_abort(info, cuda_why("cudaStreamWaitEvent", e));
  settle(static_cast<int>(nccl_calls()), info, what);
  cudaEvent_t done = nullptr;
  if (cudaError_t e = cudaEventCreateWithFlags(&done, cudaEventDisableTiming); e != cudaSuccess)
    fail_abort(info, cuda_why("cudaEventCreateWithFlags", e));
  if (cudaError_t e = cudaEventRecord(done, stream_); e != cudaSuccess) {
    (void)cudaEventDestroy(done);
    fail_abort(info, cuda_why("cudaEventRecord on the communicator stream", e));
  }
  auto work = std::make_shared<NcclWork>(this, done, info);
  return make_work(std::move(work), std::move(info));
}

namespace {
// Runs the sends and receives of fn inside one NCCL group: all start together. If one fails to
// queue, the group is still closed (NCCL requires it) and the first error is returned.
template <class F>
ncclResult_t grouped(F&& fn) {
  if (const ncclResult_t r = ncclGroupStart(); r != ncclSuccess) return r;
  const ncclResult_t first = fn();
  const ncclResult_t end = ncclGroupEnd();
  return first != ncclSuccess ? first : end;
}

void refuse_u8_reduction(DType t, const CallInfo& info) {
  if (t == DType::u8) TRIAX_THROW(CommError, "{} #{}: uint8 buffers move but cannot be reduced", info.op, info.seq);
}

std::byte* at(void* base, size_t elements, DType t) { return static_cast<std::byte*>(base) + elements * dtype_size(t); }
}  // namespace

// ---- collectives ----
Work NcclCommunicator::all_reduce_impl(Buffer d, ReduceOp op, CallInfo info) {
  refuse_u8_reduction(d.dtype, info);
  return enqueue(std::move(info), "ncclAllReduce", [&] {
    if (d.count == 0) return ncclSuccess;
    return ncclAllReduce(d.data, d.data, d.count, nccl_type(d.dtype), nccl_op(op), comm_, stream_);
  });
}

Work NcclCommunicator::reduce_scatter_impl(Buffer in, Buffer out, ReduceOp op, CallInfo info) {
  refuse_u8_reduction(in.dtype, info);
  return enqueue(std::move(info), "ncclReduceScatter", [&] {
    if (out.count == 0) return ncclSuccess;
    return ncclReduceScatter(in.data, out.data, out.count, nccl_type(in.dtype), nccl_op(op), comm_, stream_);
  });
}

Work NcclCommunicator::all_gather_impl(Buffer in, Buffer out, CallInfo info) {
  return enqueue(std::move(info), "ncclAllGather", [&] {
    if (in.count == 0) return ncclSuccess;
    return ncclAllGather(in.data, out.data, in.count, nccl_type(in.dtype), comm_, stream_);
  });
}

Work NcclCommunicator::all_to_all_impl(Buffer in, Buffer out, CallInfo info) {
  const size_t block = in.count / static_cast<size_t>(size());
  return enqueue(std::move(info), "ncclSend/ncclRecv group (all_to_all)", [&] {
    if (block == 0) return ncclSuccess;
    return grouped([&] {
      const ncclDataType_t t = nccl_type(in.dtype);
      for (int r = 0; r < size(); ++r) {
        const size_t off = block * static_cast<size_t>(r);
        if (ncclResult_t e = ncclSend(at(in.data, off, in.dtype), block, t, r, comm_, stream_); e != ncclSuccess)
          return e;
        if (ncclResult_t e = ncclRecv(at(out.data, off, out.dtype), block, t, r, comm_, stream_); e != ncclSuccess)
          return e;
      }
      return ncclSuccess;
    });
  });
}

Work NcclCommunicator::all_to_all_v_impl(Buffer in, std::span<const int64_t> send_counts, Buffer out,
                                         std::span<const int64_t> recv_counts, CallInfo info) {
  return enqueue(std::move(info), "ncclSend/ncclRecv group (all_to_all_v)", [&] {
    return grouped([&] {
      const ncclDataType_t t = nccl_type(in.dtype);
      size_t soff = 0, roff = 0;
      for (int r = 0; r < size(); ++r) {
        const auto sc = static_cast<size_t>(send_counts[static_cast<size_t>(r)]);
        const auto rc = static_cast<size_t>(recv_counts[static_cast<size_t>(r)]);
        // A zero count is skipped on both sides: my send count to r is r's receive count from me.
        if (sc) {
          if (ncclResult_t e = ncclSend(at(in.data, soff, in.dtype), sc, t, r, comm_, stream_); e != ncclSuccess)
            return e;
        }
        if (rc) {
          if (ncclResult_t e = ncclRecv(at(out.data, roff, out.dtype), rc, t, r, comm_, stream_); e != ncclSuccess)
            return e;
        }
        soff += sc;
        roff += rc;
      }
      return ncclSuccess;
    });
  });
}

Work NcclCommunicator::broadcast_impl(Buffer d, int root, CallInfo info) {
  return enqueue(std::move(info), "ncclBroadcast", [&] {
    if (d.count == 0) return ncclSuccess;
    return ncclBroadcast(d.data, d.data, d.count, nccl_type(d.dtype), root, comm_, stream_);
  });
}

// NCCL has no tags: messages between two ranks match in the order they were issued.
Work NcclCommunicator::send_impl(Buffer d, int peer, int, CallInfo info) {
  return enqueue(std::move(info), "ncclSend",
                 [&] { return ncclSend(d.data, d.count, nccl_type(d.dtype), peer, comm_, stream_); });
}

Work NcclCommunicator::recv_impl(Buffer d, int peer, int, CallInfo info) {
  return enqueue(std::move(info), "ncclRecv",
                 [&] { return ncclRecv(d.data, d.count, nccl_type(d.dtype), peer, comm_, stream_); });
}

Work NcclCommunicator::batch_impl(std::span<const P2POp> ops, CallInfo info) {
  return enqueue(std::move(info), "ncclSend/ncclRecv group (batch)", [&] {
    return grouped([&] {
      for (const auto& o : ops) {
        const ncclResult_t e = o.kind == P2POp::Kind::send
                                   ? ncclSend(o.buf.data, o.buf.count, nccl_type(o.buf.dtype), o.peer, comm_, stream_)
                                   : ncclRecv(o.buf.data, o.buf.count, nccl_type(o.buf.dtype), o.peer, comm_, stream_);
        if (e != ncclSuccess) return e;
      }
      return ncclSuccess;
    });
  });
}

Work NcclCommunicator::barrier_impl(CallInfo info) {
  // A one-element all-reduce completes on a rank only after every rank has joined it (max of
  // zeros: the scratch value never changes, however many barriers run).
  return enqueue(std::move(info), "ncclAllReduce (barrier)",
                 [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclMax, comm_, stream_); });
}

// ---- split ----
std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, std::string name) {
  const int n = size();
  const int64_t my_color = color < 0 ? -1 : color;
  std::vector<int64_t> mine = {my_color, key, world_rank()};
  std::vector<int64_t> all(3 * static_cast<size_t>(n));
  CallInfo info;
  {
    // Every member must know the world ranks of its new group, which NCCL does not report: gather
    // (color, key, world rank) over this communicator first. It is one numbered call.
    DeviceGuard guard(device_);
    DeviceArray dev(3 + all.size());  // (3) mine, then (n, 3) everyone's
    TRIAX_CHECK_CUDA(cudaMemcpyAsync(dev.ptr, mine.data(), 3 * sizeof(int64_t), cudaMemcpyHostToDevice, stream_));
    Work w = all_gather(std::span<const int64_t>(dev.ptr, 3), std::span<int64_t>(dev.ptr + 3, all.size()));
    w.wait();
    TRIAX_CHECK_CUDA(
        cudaMemcpyAsync(all.data(), dev.ptr + 3, all.size() * sizeof(int64_t), cudaMemcpyDeviceToHost, stream_));
    TRIAX_CHECK_CUDA(cudaStreamSynchronize(stream_));
    info = w.info();
  }
  info.op = "split";
  info.detail = fmt::format("color {}, key {} into '{}'", color, key, name);

  // NCCL orders the new group by key, then by rank in this group.
  std::vector<int> members;
  if (my_color >= 0) {
    for (int p = 0; p < n; ++p)
      if (all[3 * static_cast<size_t>(p)] == my_color) members.push_back(p);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return all[3 * static_cast<size_t>(a) + 1] < all[3 * static_cast<size_t>(b) + 1];
    });
  }

  // Non-blocking split writes the new handle from NCCL's helper thread when it finishes, and the
  // child keeps the commName pointer: both must outlive a failed or timed-out split, so they are
  // released to us only once the split has settled (and leaked, a few bytes, if it never does).
  auto child_name = std::make_unique<std::string>(name);
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  ncclConfig_t cfg = make_config(opts_, *child_name);
  {
    DeviceGuard guard(device_);
    const ncclResult_t r = ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, slot.get(), &cfg);
    ncclComm_t* leaked_slot = slot.release();
    std::string* leaked_name = child_name.release();
    settle(static_cast<int>(r), info, "ncclCommSplit");
    slot.reset(leaked_slot);
    child_name.reset(leaked_name);
  }
  ncclComm_t child = *slot;
  if (my_color < 0) {
    if (child) (void)ncclCommAbort(child);
    return nullptr;
  }
  if (!child) fail_abort(info, "ncclCommSplit completed without a new communicator");
  if (const ncclResult_t s = wait_ready(child, timeout()); s != ncclSuccess) {
    (void)ncclCommAbort(child);
    if (s == ncclInProgress) raise_timeout(info, timeout());
    fail_abort(info, nccl_why("initialisation of the split communicator", s));
  }
  const auto it = std::find(members.begin(), members.end(), rank());
  const int new_rank = static_cast<int>(it - members.begin());
  int nccl_rank = -1, nccl_size = -1;
  if (ncclCommUserRank(child, &nccl_rank) != ncclSuccess || ncclCommCount(child, &nccl_size) != ncclSuccess ||
      nccl_rank != new_rank || nccl_size != static_cast<int>(members.size())) {
    (void)ncclCommAbort(child);
    fail_abort(info, fmt::format("NCCL placed this rank at {} of {}, the gathered colors and keys say {} of {}",
                                 nccl_rank, nccl_size, new_rank, members.size()));
  }
  std::vector<int> world;
  for (int p : members) world.push_back(static_cast<int>(all[3 * static_cast<size_t>(p) + 2]));
  NcclOptions child_opts = opts_;
  child_opts.timeout = timeout();
  auto c = std::make_unique<NcclCommunicator>(child, std::move(child_name), device_, new_rank,
                                              static_cast<int>(members.size()), std::move(name), std::move(world),
                                              child_opts);
  c->set_input_stream(input_stream_);
  return c;
}

// ---- overlap ----
void wait_on_stream(const Work& work, cudaStream_t consumer) {
  auto* w = dynamic_cast<NcclCommunicator::NcclWork*>(work.impl());
  if (!w)
    TRIAX_THROW(ConfigError, "wait_on_stream: {} #{} is not a call of an NCCL communicator{}", work.info().op,
                work.info().seq, work.valid() ? "" : " (empty Work)");
  TRIAX_CHECK_CUDA(cudaStreamWaitEvent(consumer, w->event(), 0));
}

}  // namespace triax
