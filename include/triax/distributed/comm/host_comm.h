// Which communicator carries the CPU path's host collectives: MPI under mpirun, Gloo when the
// processes met through the TCP rendezvous (torchrun-style env, a Slurm --mpi=none step, a
// Volcano pod), Self for one process. TRIAX_COMM=mpi|gloo forces one (auto or unset: detect).
#pragma once
#include <string_view>

namespace triax {

enum class HostComm { automatic, mpi, gloo };

// Reads TRIAX_COMM; any other value than auto, mpi or gloo is a ConfigError naming it.
HostComm host_comm_choice();
std::string_view host_comm_name(HostComm c);

}  // namespace triax
