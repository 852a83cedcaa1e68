// One message per job: classify an exception into an exit code and agree among the failing
// ranks (a nonblocking all-reduce on MPI's world with a deadline) who prints it.
#include "triax/distributed/failure/job_failure.h"

#include <fmt/format.h>

#include <cstdlib>
#include <functional>
#include <limits>
#include <new>
#include <thread>

#include "triax/core/env.h"
#include "triax/core/error.h"
#include "triax/distributed/bootstrap/bootstrap.h"

#if defined(TRIAX_HAVE_MPI)
#include <mpi.h>
#endif

namespace triax {

int exit_code_for(const std::exception& e) {
  if (dynamic_cast<const ConfigError*>(&e)) return kExitUsage;
  if (dynamic_cast<const IoError*>(&e)) return kExitData;
  if (dynamic_cast<const CommError*>(&e)) return kExitComm;
  if (dynamic_cast<const OutOfMemoryError*>(&e) || dynamic_cast<const std::bad_alloc*>(&e)) return kExitMemory;
  return kExitOther;
}

std::string_view exit_code_name(int code) {
  switch (code) {
    case kExitUsage: return "configuration error";
    case kExitData: return "data or file error";
    case kExitComm: return "communication error";
    case kExitMemory: return "out of memory";
    case kExitStopped: return "stopped early";
    default: return "error";
  }
}

int launcher_rank() {
  // Runs while an error is being reported: a missing or malformed variable is skipped, never thrown.
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"}) {
    try {
      if (const auto r = env_int_opt(v, 0, std::numeric_limits<int>::max())) return static_cast<int>(*r);
    } catch (const ConfigError&) {
    }
  }
  return 0;
}

int exit_before_mpi(int code, std::chrono::milliseconds linger) {
  if (code != 0 && launcher_rank() != 0) std::this_thread::sleep_for(linger);
  return code;
}

JobFailure settle_failure(std::string_view program, const std::exception& e, std::chrono::milliseconds wait) {
  JobFailure f;
  f.exit_code = exit_code_for(e);
  const std::string what = dynamic_cast<const std::bad_alloc*>(&e) ? std::string("std::bad_alloc (an allocation failed)")
                                                                   : std::string(e.what());
  auto line = [&](int code) { return fmt::format("{}: {}: {}", program, exit_code_name(code), what); };
#if defined(TRIAX_HAVE_MPI)
  int inited = 0, finalized = 0, rank = 0, size = 1;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  if (size > 1) {
    // Sum of {rank 0's message hash, rank 0's code, 1 per failing rank}: completes only when
    // every rank failed and called this; otherwise the deadline says "not everyone".
    const auto hash = static_cast<long long>(std::hash<std::string>{}(what) >> 1);
    long long mine[3] = {rank == 0 ? hash : 0, rank == 0 ? f.exit_code : 0, 1};
    long long sum[3] = {0, 0, 0};
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_Iallreduce(mine, sum, 3, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD, &req);
    const auto deadline = std::chrono::steady_clock::now() + wait;
    int done = 0;
    while (!done && std::chrono::steady_clock::now() < deadline) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (done && sum[2] == size) {
      f.exit_code = static_cast<int>(sum[1]);
      if (rank == 0) f.message = line(f.exit_code);
      else if (hash != sum[0]) f.message = fmt::format("{}: rank {} (host {}): {}: {}", program, rank, host_name(),
                                                       exit_code_name(exit_code_for(e)), what);
      return f;
    }
    // Some rank is still running (or blocked waiting for this one): report alone, end the job.
    f.abort_job = true;
    f.message = fmt::format("{}: rank {} (host {}): {}: {}", program, rank, host_name(), exit_code_name(f.exit_code), what);
    return f;
  }
#endif
  (void)wait;
  f.message = line(f.exit_code);
  return f;
}

}  // namespace triax
