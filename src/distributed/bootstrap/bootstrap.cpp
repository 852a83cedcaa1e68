// Launcher detection and the single-process bootstrap. The MPI bootstrap lives in
// mpi_bootstrap.cpp, the TCP rendezvous in tcp_bootstrap.cpp.
#include "triax/distributed/bootstrap/bootstrap.h"

#include <unistd.h>

#include <climits>

#include "triax/core/env.h"
#include "triax/distributed/comm/gloo_comm.h"
#include "triax/distributed/comm/host_comm.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/distributed/bootstrap/slurm.h"

namespace triax {

std::string_view launch_kind_name(LaunchKind k) {
  switch (k) {
    case LaunchKind::single: return "single";
    case LaunchKind::mpi: return "mpi";
    case LaunchKind::env: return "env";
    case LaunchKind::slurm: return "slurm";
  }
  return "?";
}

namespace {
std::optional<std::string> host_name_from_env() { return env_string_opt("TRIAX_HOSTNAME", "a host name"); }
}  // namespace

std::string host_name() {
  // Failure messages and flight-recorder dumps ask for it while another error is on its way, so
  // it never throws: a bad TRIAX_HOSTNAME is refused once, up front, by Bootstrap::create.
  try {
    if (auto h = host_name_from_env()) return *h;
  } catch (const ConfigError&) {
  }
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

std::string Bootstrap::broadcast(std::string_view data, int root) {
  if (root < 0 || root >= world_size())
    TRIAX_THROW(ConfigError, "bootstrap broadcast: root {} out of range for world size {}", root, world_size());
  auto all = all_gather(rank() == root ? data : std::string_view{});
  return std::move(all[static_cast<size_t>(root)]);
}

namespace {

class SingleBootstrap final : public Bootstrap {
 public:
  LaunchKind kind() const override { return LaunchKind::single; }
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  std::vector<std::string> all_gather(std::string_view mine) override { return {std::string(mine)}; }
  std::shared_ptr<Communicator> world() override {
    if (!world_)
      world_ = host_comm_choice() == HostComm::gloo ? std::shared_ptr<Communicator>(make_gloo_communicator(*this, "world"))
                                                    : std::shared_ptr<Communicator>(make_self_communicator("world", 0));
    return world_;
  }

 private:
  std::shared_ptr<Communicator> world_;
};

}  // namespace

std::unique_ptr<Bootstrap> make_single_bootstrap() { return std::make_unique<SingleBootstrap>(); }

std::unique_ptr<Bootstrap> Bootstrap::create(const BootstrapOptions& opts) {
  host_name_from_env();  // refuses a bad TRIAX_HOSTNAME (host_name() itself falls back)
  LaunchKind kind = LaunchKind::single;
  if (opts.force) {
    kind = opts.kind;
  } else if (env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK") || env_set("PMI_RANK")) {
    kind = LaunchKind::mpi;
  } else if (env_set("RANK") && env_set("WORLD_SIZE")) {
    kind = LaunchKind::env;
  } else if (in_slurm_step()) {
    kind = LaunchKind::slurm;
  }
  switch (kind) {
    case LaunchKind::single: return make_single_bootstrap();
    case LaunchKind::env: return make_env_bootstrap(opts);
    case LaunchKind::slurm: return make_slurm_bootstrap(opts);
    case LaunchKind::mpi:
#if defined(TRIAX_HAVE_MPI)
      return make_mpi_bootstrap();
#else
      TRIAX_THROW(ConfigError,
                  "launched by mpirun (OMPI_COMM_WORLD_SIZE={}) but this triax was built with TRIAX_WITH_MPI=OFF",
                  env_string("OMPI_COMM_WORLD_SIZE", "?"));
#endif
  }
  TRIAX_THROW(ConfigError, "unknown launch kind");
}

}  // namespace triax
