// Bootstrap: how the processes of a job find each other at start-up. From mpirun (Open MPI),
// from a torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)
// through a small TCP rendezvous, or a single process with no launcher. It carries start-up
// bytes only (host names, the NCCL unique id); training traffic goes through Communicators.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "triax/distributed/comm/comm.h"

namespace triax {

enum class LaunchKind { single, mpi, env, slurm };

struct BootstrapOptions {
  // How long to wait for the rendezvous (TCP: until every rank has connected to the master).
  std::chrono::milliseconds timeout{60'000};
  // Force a kind instead of detecting it from the environment.
  bool force = false;
  LaunchKind kind = LaunchKind::single;
};

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual LaunchKind kind() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Rank on this host and number of ranks on this host (from the launcher or host names).
  virtual int local_rank() const = 0;
  // Every rank contributes bytes; every rank receives all contributions in rank order.
  virtual std::vector<std::string> all_gather(std::string_view mine) = 0;
  std::string broadcast(std::string_view data, int root);
  void barrier() { all_gather({}); }
  // The host communicator over all ranks: MPI under mpirun, Gloo over the TCP rendezvous, Self
  // for one process; TRIAX_COMM=gloo forces Gloo under any launcher (distributed/comm/host_comm.h).
  virtual std::shared_ptr<Communicator> world() = 0;
  // Peer death without mpirun (docs/FAULTS.md): the TCP rendezvous keeps its connections under
  // TCP keepalive (a kernel heartbeat: a silent host is noticed within ~5 s) and a thread watches
  // them; when a rank dies, rank 0 names it to every other rank, and on every live rank
  // on_death(message) is called from that thread (a program ends the job there). Ranks leaving
  // normally say goodbye first. Every rank must call it; mpirun and a single process need none
  // (the launcher ends the job), so there it does nothing.
  virtual void watch_peers(std::function<void(const std::string& message)> on_death) { (void)on_death; }

  // Detects the launcher: OMPI_COMM_WORLD_SIZE (or PMI/PMIX vars) -> MPI; RANK and WORLD_SIZE
  // -> TCP rendezvous on MASTER_ADDR:MASTER_PORT; an srun step (SLURM_STEP_ID, SLURM_PROCID)
  // -> the same rendezvous on the step's first node (distributed/bootstrap/slurm.h); otherwise a single process.
  static std::unique_ptr<Bootstrap> create(const BootstrapOptions& opts = {});
};

std::string_view launch_kind_name(LaunchKind k);

// One process, no launcher: world() is a Self communicator.
std::unique_ptr<Bootstrap> make_single_bootstrap();
#if defined(TRIAX_HAVE_MPI)
// Initialises MPI (MPI_THREAD_FUNNELED or better) if needed; finalizes it on destruction if
// it initialised it.
std::unique_ptr<Bootstrap> make_mpi_bootstrap();
#endif
// torchrun-style: reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; rank 0 listens,
// the others connect with retries until opts.timeout, then throw CommError naming the address.
std::unique_ptr<Bootstrap> make_env_bootstrap(const BootstrapOptions& opts);

// The TCP rendezvous with explicit values: what make_env_bootstrap reads from the environment,
// and what other launchers' variables map to (a Slurm step: distributed/bootstrap/slurm.h).
struct TcpLaunch {
  int rank = 0;
  int world_size = 1;
  std::optional<int> local_rank;
  std::string master_addr;
  int master_port = 0;
  std::string port_desc;  // where master_port came from, for messages: "MASTER_PORT=29500"
  std::string job;        // the job token every rank of one launch shares; ranks of different jobs refuse each other
  std::string job_desc;   // where it came from, for messages: "TRIAX_JOB_ID"
  LaunchKind kind = LaunchKind::env;
};
std::unique_ptr<Bootstrap> make_tcp_bootstrap(TcpLaunch launch, const BootstrapOptions& opts);

// This process's host name: TRIAX_HOSTNAME if set (containers, tests), else gethostname(). Never
// throws (error paths ask for it); Bootstrap::create refuses an empty TRIAX_HOSTNAME.
std::string host_name();

}  // namespace triax
