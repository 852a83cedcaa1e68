// Placeholder replaced by the TCP rendezvous (branch tcp).
#include "triax/dist/bootstrap.h"

namespace triax {
std::unique_ptr<Bootstrap> make_env_bootstrap(const BootstrapOptions&) {
  TRIAX_THROW(ConfigError, "the torchrun-style TCP rendezvous is not built yet");
}
}  // namespace triax
