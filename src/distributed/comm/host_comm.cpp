// TRIAX_COMM: which host communicator Bootstrap::world() builds (distributed/comm/host_comm.h).
#include "triax/distributed/comm/host_comm.h"

#include <cstdlib>
#include <string>

#include "triax/core/error.h"

namespace triax {

HostComm host_comm_choice() {
  const char* v = std::getenv("TRIAX_COMM");
  if (!v || !*v) return HostComm::automatic;
  const std::string s = v;
  if (s == "auto") return HostComm::automatic;
  if (s == "mpi") return HostComm::mpi;
  if (s == "gloo") return HostComm::gloo;
  TRIAX_THROW(ConfigError, "TRIAX_COMM='{}' is not a host communicator; expected auto, mpi or gloo", s);
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
