// The NCCL backend of Communicator (device memory, the CUDA path). Each communicator owns one
// CUDA stream; a call orders it after the caller's input stream with an event, enqueues the NCCL
// operation and records a completion event that Work::test polls together with NCCL's async error.
// On an error or a timeout the NCCL communicator is aborted (never destroyed) and the call raises
// an error naming the group, the rank and its sequence number. CUDA builds only (TRIAX_HAVE_CUDA).
#pragma once
#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <string>

#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/comm/comm.h"

struct ncclComm;  // NCCL's opaque communicator (ncclComm_t is ncclComm*): keeps nccl.h private

namespace triax {

struct NcclOptions {
  // Default timeout of every wait, of communicator creation and of each enqueue;
  // 0 = TRIAX_COMM_TIMEOUT_S or 600 s (as for every backend).
  std::chrono::milliseconds timeout{0};
  // NCCL's non-blocking mode (ncclConfig_t.blocking = 0, the default here): initialisation, split
  // and every enqueue return at once and are polled with a deadline, so a dead peer during
  // connection set-up becomes a TimeoutError instead of a hang. blocking = true trades that bound
  // for lower per-call host latency (NCCL starts a helper thread per non-blocking call).
  bool blocking = false;
};

// A communicator over every rank of the bootstrap, on CUDA device cuda_device of this process.
// Rank 0 creates the ncclUniqueId and the bootstrap broadcasts it. Collective over the bootstrap.
// Throws DeviceError for a bad device, TimeoutError when initialisation overruns the timeout.
std::unique_ptr<Communicator> make_nccl_communicator(Bootstrap& boot, int cuda_device, std::string name = "world",
                                                     NcclOptions opts = {});

// The same over the ranks of an existing host communicator (MPI, Gloo, Self): rank 0's id travels
// in one broadcast on host, and the NCCL communicator has host's ranks, size and world ranks (and
// its timeout unless opts gives one). Collective over host. What the CUDA layer's device
// communicator (cuda/device_comm.h) builds beside the host communicator of a job.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, int cuda_device, std::string name,
                                                     NcclOptions opts = {});

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of comm (initialised: ncclCommGetAsyncError says ncclSuccess) and of the
  // string its ncclConfig_t.commName points to (NCCL keeps the pointer); creates the stream,
  // event and scratch buffer on device. Use make_nccl_communicator or split().
  NcclCommunicator(ncclComm* comm, std::unique_ptr<std::string> nccl_name, int device, int rank, int size,
                   std::string name, std::vector<int> world_ranks, NcclOptions opts);
  // Finalizes and destroys the NCCL communicator (bounded by the timeout; aborts if that runs out),
  // or nothing more if it was aborted. Never throws.
  ~NcclCommunicator() override;

  CommBackend backend() const override { return CommBackend::nccl; }
  // ncclCommSplit; color < 0 joins none (NCCL_SPLIT_NOCOLOR) and returns nullptr. Collective over
  // this communicator; it spends one call number (an all_gather of color, key and world rank, so
  // every member knows the world ranks of its new group).
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;

  // The stream every call of this communicator runs on (cudaStreamNonBlocking, owned).
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  // Later calls wait (on the device, not the host) for the work enqueued so far on s, e.g. the
  // compute stream that produced the gradients. Default: the default stream (nullptr).
  void set_input_stream(cudaStream_t s) { input_stream_ = s; }
  cudaStream_t input_stream() const { return input_stream_; }
  // The NCCL handle (nullptr once aborted), for raw-NCCL comparisons in benchmarks.
  ncclComm* handle() const { return comm_; }
  bool aborted() const { return aborted_; }
  // ncclCommAbort now (idempotent): in-flight calls end, later calls throw. Never throws.
  void abort_comm() noexcept;

 protected:
  Work all_reduce_impl(Buffer data, ReduceOp op, CallInfo info) override;
  Work reduce_scatter_impl(Buffer in, Buffer out, ReduceOp op, CallInfo info) override;
  Work all_gather_impl(Buffer in, Buffer out, CallInfo info) override;
  Work all_to_all_impl(Buffer in, Buffer out, CallInfo info) override;
  Work all_to_all_v_impl(Buffer in, std::span<const int64_t> send_counts, Buffer out,
                         std::span<const int64_t> recv_counts, CallInfo info) override;
  Work broadcast_impl(Buffer data, int root, CallInfo info) override;
  Work send_impl(Buffer data, int peer, int tag, CallInfo info) override;
  Work recv_impl(Buffer data, int peer, int tag, CallInfo info) override;
  Work batch_impl(std::span<const P2POp> ops, CallInfo info) override;
  Work barrier_impl(CallInfo info) override;
  void on_timeout(const CallInfo& info) override;

 private:
  class NcclWork;
  friend void wait_on_stream(const Work& work, cudaStream_t consumer);
  // Orders stream_ after input_stream_, runs nccl_calls (returning ncclResult_t), settles it and
  // records the completion event that the returned Work polls. what names the NCCL call in errors.
  template <class F>
  Work enqueue(CallInfo info, const char* what, F&& nccl_calls);
  // Polls ncclCommGetAsyncError until the last NCCL call has left ncclInProgress; aborts and
  // raises (fail / raise_timeout) on an error or when the deadline passes.
  void settle(int result, const CallInfo& info, const char* what);
  [[noreturn]] void fail_abort(const CallInfo& info, const std::string& why);

  ncclComm* comm_ = nullptr;
  std::unique_ptr<std::string> nccl_name_;  // NCCL holds a pointer to its characters
  int device_ = 0;
  NcclOptions opts_;
  bool aborted_ = false;
  cudaStream_t stream_ = nullptr;
  cudaStream_t input_stream_ = nullptr;
  cudaEvent_t input_ready_ = nullptr;  // recorded on input_stream_, waited on by stream_
  int32_t* scratch_ = nullptr;         // (1) device int for barrier()
};

// Makes consumer wait (on the device) until the NCCL call behind work has completed, without
// blocking the host: the way to overlap communication with compute. work must come from an
// NcclCommunicator (ConfigError otherwise). The host should still test() or wait() the work
// eventually: that is where NCCL errors and timeouts are reported.
void wait_on_stream(const Work& work, cudaStream_t consumer);

}  // namespace triax
