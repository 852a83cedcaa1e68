// The Gloo backend of Communicator (host memory, the CPU path without mpirun): Gloo's collectives
// (libgloo, PyTorch's CPU collectives) over its TCP transport, the pairs' addresses exchanged
// through triax's bootstrap. docs/CLUSTER.md says what it composes and how it picks the address.
#pragma once
#include <memory>
#include <string>

#include "triax/distributed/comm/comm.h"

namespace triax {

class Bootstrap;

// True when this triax was built with Gloo (Debian's libgloo-dev).
bool gloo_available();

// Connects a full mesh of Gloo TCP pairs among the ranks of boot (collective over boot: every
// rank calls it). Throws ConfigError when triax was built without Gloo, CommError when a peer
// cannot be reached within the bootstrap's timeout.
std::unique_ptr<Communicator> make_gloo_communicator(Bootstrap& boot, std::string name = "world", CommOptions opts = {});

}  // namespace triax
