// The communicator of a single process: every collective is a local copy (or nothing), so the
// CPU and CUDA paths run without MPI or NCCL when there is one rank.
#pragma once
#include <memory>

#include "triax/distributed/comm/comm.h"

namespace triax {

std::unique_ptr<Communicator> make_self_communicator(std::string name = "world", int world_rank = 0);

}  // namespace triax
