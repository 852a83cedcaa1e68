// The MPI backend of Communicator (host memory, the CPU path): nonblocking MPI-3 collectives on
// a private duplicate of the parent communicator, errors returned (never MPI's abort handler).
#pragma once
#if defined(TRIAX_HAVE_MPI)
#include <mpi.h>

#include <memory>

#include "triax/distributed/comm/comm.h"

namespace triax {

// Wraps a duplicate of comm (the caller keeps ownership of comm).
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name, CommOptions opts = {});

// The MPI communicator under a triax communicator of the MPI backend (for raw-MPI comparisons in
// benchmarks); throws CommError for other backends.
MPI_Comm mpi_handle(const Communicator& c);

}  // namespace triax
#endif
