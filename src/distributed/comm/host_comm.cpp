// TRIAX_COMM: which host communicator Bootstrap::world() builds (distributed/comm/host_comm.h).
#include "triax/distributed/comm/host_comm.h"

#include <string>

#include "triax/core/env.h"

namespace triax {

HostComm host_comm_choice() {
  const std::string s = env_choice("TRIAX_COMM", {"auto", "mpi", "gloo"}, "auto");
  return s == "mpi" ? HostComm::mpi : s == "gloo" ? HostComm::gloo : HostComm::automatic;
}

std::string_view host_comm_name(HostComm c) {
  switch (c) {
    case HostComm::automatic: return "auto";
    case HostComm::mpi: return "mpi";
    case HostComm::gloo: return "gloo";
  }
  return "?";
}

}  // namespace triax
