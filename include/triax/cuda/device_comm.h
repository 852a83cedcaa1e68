// The communicator of a CUDA rank: one Communicator that takes host spans and device spans alike.
// It wraps the job's host communicator (MPI, Gloo or Self; host spans go there unchanged: the
// gradient norm, the trainer's metrics, checkpoints, weight files, fault checks, the metrics
// exporter, MoE counts) and, beside it, an NCCL communicator over the same ranks for device
// buffers (what Backend::comm_span hands out on the CUDA backend). Each call goes where its
// buffers live (cudaPointerGetAttributes); host and device buffers mixed in one call is a
// ConfigError naming the call.
//
// Device calls on NCCL are ordered after the compute stream (NcclCommunicator::set_input_stream).
// Work::wait() on a device call is a device-side dependency, not a host stall: the compute stream
// is made to wait for the NCCL call's completion event (wait_on_stream, WorkImpl::wait_on_device)
// and the host goes on, so no step waits on the host for communication. The NCCL Work itself stays
// outstanding: every later call of the communicator family (and poll()) tests it, and
// settle_device_waits() waits for it before the host blocks on the compute stream, so an NCCL error
// or a timeout is still raised on the host, naming the original call. Work::test() stays the plain
// question (true once NCCL has finished), so progress polling during backward never makes the
// compute stream wait early. A buffer freed right after wait() must be freed in the compute
// stream's order (the CUDA backend's stream-ordered allocator does).
//
// Without NCCL (DevicePath::staged) device buffers are staged through pinned host memory and
// travel on the host communicator: a device-to-host copy and a compute-stream synchronisation when
// the call starts, a host-to-device copy and another synchronisation when it completes. Correct on
// any host communicator, and slow; a fallback and a cross-check, not the training path.
//
// split() splits both communicators (collective over both, in the same order on every rank), so
// every group of a ProcessGrid carries both. CUDA builds only (TRIAX_HAVE_CUDA); this header
// includes no CUDA header.
#pragma once
#include <memory>

#include "triax/backend/backend.h"
#include "triax/cuda/stream.h"
#include "triax/distributed/comm/comm.h"

namespace triax::cuda {

// How device buffers travel: NCCL (the default; any world size, one rank included), or staged
// through pinned host memory on the host communicator.
enum class DevicePath { nccl, staged };

// TRIAX_DEVICE_COMM: nccl (default) or staged (docs/ENVIRONMENT.md); ConfigError for another word.
DevicePath device_path_from_env();

struct DeviceCommOptions {
  int device = 0;                  // the CUDA ordinal of this rank's buffers
  cudaStream_t stream = nullptr;   // the compute stream: device calls wait for it, and it for them
  DevicePath path = DevicePath::nccl;
};

// Collective over host (it builds the NCCL communicator on DevicePath::nccl). host must not be a
// device communicator itself.
std::shared_ptr<Communicator> make_device_communicator(std::shared_ptr<Communicator> host,
                                                       const DeviceCommOptions& opts);
// For a backend made by make_cuda_backend: its device and compute stream.
std::shared_ptr<Communicator> make_device_communicator(std::shared_ptr<Communicator> host, const Backend& be,
                                                       DevicePath path = DevicePath::nccl);

// Where a pointer's memory lives: device (device or managed memory of any GPU) or host (pageable,
// pinned, or anything CUDA cannot classify: also every pointer on a machine without a usable GPU).
enum class MemoryPlace { host, device };
MemoryPlace memory_place(const void* p) noexcept;

// Call before the host blocks on `stream` (a read-back, a synchronize): waits on the host, each
// until its own deadline, for the NCCL calls that `stream` was made to wait for by Work::wait().
// Without it, a peer that died during an all-reduce leaves the host in cudaStreamSynchronize for
// ever; with it, the call's TimeoutError (naming the call, group and peers; the NCCL communicator
// is aborted) ends the job as on the CPU path. Nothing outstanding: a lock and a scan. The CUDA
// backend calls it in its host read-backs (copy_to_host, sum, synchronize).
void settle_device_waits(cudaStream_t stream);

// Whether c is a device communicator with an NCCL communicator beside its host one (false for any
// other communicator, and on DevicePath::staged).
bool has_nccl(const Communicator& c);
// Tests the device calls still outstanding in c's family (every communicator split from the same
// root): throws the first one's CommError or TimeoutError. A no-op for other communicators.
void poll(Communicator& c);

}  // namespace triax::cuda
