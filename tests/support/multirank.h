// Shared state of a multi-rank test executable: the bootstrap and world communicator that
// multirank_main.cpp creates before Catch2 runs (mpirun, or one process without a launcher).
#pragma once
#include <memory>

#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/comm/comm.h"

namespace triax::test {

Bootstrap& bootstrap();
Communicator& world();
std::shared_ptr<Communicator> world_ptr();

}  // namespace triax::test
