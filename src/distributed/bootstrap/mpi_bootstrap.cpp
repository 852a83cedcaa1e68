// Bootstrap from mpirun: initialises MPI if nobody has, and gives the world communicator.
#include <mpi.h>

#include <cstdlib>
#include <exception>

#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/comm/gloo_comm.h"
#include "triax/distributed/comm/host_comm.h"
#include "triax/distributed/comm/mpi_comm.h"

namespace triax {
namespace {

class MpiBootstrap final : public Bootstrap {
 public:
  MpiBootstrap() {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        TRIAX_THROW(CommError, "MPI_Init_thread failed");
      owns_mpi_ = true;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_rank_);
    MPI_Comm_free(&node);
    MPI_Comm_dup(MPI_COMM_WORLD, &boot_);
    MPI_Comm_set_errhandler(boot_, MPI_ERRORS_RETURN);
  }
  ~MpiBootstrap() override {
    world_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // Unwinding from an error on this rank: the other ranks may be blocked in a collective, and
    // MPI_Finalize would wait for them forever. Leave MPI up so the program's main can end the
    // job (MPI_Abort); the library itself never aborts.
    if (std::uncaught_exceptions() > 0) return;
    MPI_Comm_free(&boot_);
    if (owns_mpi_) MPI_Finalize();
  }
  LaunchKind kind() const override { return LaunchKind::mpi; }
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  int local_rank() const override { return local_rank_; }

  std::vector<std::string> all_gather(std::string_view mine) override {
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
    check(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, boot_), "MPI_Allgather");
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      displs[static_cast<size_t>(r)] = total;
      total += lens[static_cast<size_t>(r)];
    }
    std::string all(static_cast<size_t>(total), '\0');
    check(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), MPI_CHAR, boot_),
          "MPI_Allgatherv");
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r)
      out.push_back(all.substr(static_cast<size_t>(displs[static_cast<size_t>(r)]),
                               static_cast<size_t>(lens[static_cast<size_t>(r)])));
    return out;
  }

  std::shared_ptr<Communicator> world() override {
    // TRIAX_COMM=gloo: Gloo over this bootstrap, so the Gloo backend runs under mpirun too.
    if (!world_)
      world_ = host_comm_choice() == HostComm::gloo ? std::shared_ptr<Communicator>(make_gloo_communicator(*this, "world"))
                                                    : std::shared_ptr<Communicator>(make_mpi_communicator(MPI_COMM_WORLD, "world"));
    return world_;
  }

 private:
  void check(int code, const char* what) {
    if (code != MPI_SUCCESS) TRIAX_THROW(CommError, "bootstrap {} failed at rank {}", what, rank_);
  }
  bool owns_mpi_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  MPI_Comm boot_ = MPI_COMM_NULL;
  std::shared_ptr<Communicator> world_;
};

}  // namespace

std::unique_ptr<Bootstrap> make_mpi_bootstrap() { return std::make_unique<MpiBootstrap>(); }

}  // namespace triax
