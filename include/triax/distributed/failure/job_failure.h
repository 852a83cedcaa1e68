// How a program's main turns an exception into one clear message per job and a documented exit
// code (docs/ERRORS.md): errors every rank hits alike are printed once, by the lowest rank;
// errors of one rank are printed by that rank with its host. The library never exits itself.
#pragma once
#include <chrono>
#include <exception>
#include <string>
#include <string_view>

namespace triax {

// The exit codes of triax programs, the same under every launcher.
enum ExitCode : int {
  kExitOk = 0,
  kExitOther = 1,   // anything else (a bug, a device error)
  kExitUsage = 2,   // bad flags or configuration (ConfigError)
  kExitData = 3,    // a data, weight or output file that cannot be read or written (IoError)
  kExitComm = 4,    // communication or peer failure, timeouts (CommError)
  kExitMemory = 5,  // out of memory (OutOfMemoryError, std::bad_alloc)
  kExitStopped = 6, // under torchrun's elastic agent: a stop signal ended the run early with its state
                    // saved; not 0, which would tell the agent the job is done (docs/FAULTS.md)
};

int exit_code_for(const std::exception& e);
// "configuration error", "data or file error", ... for the message's prefix.
std::string_view exit_code_name(int code);

// This process's rank as the launcher numbers it before MPI starts (OMPI_COMM_WORLD_RANK,
// PMIX_RANK, PMI_RANK, SLURM_PROCID, RANK), or 0. Errors found before MPI starts (flags, config
// files) are the same on every rank: only this rank 0 prints them.
int launcher_rank();

// The exit status for an error found before MPI starts, which every rank found alike and only
// launcher rank 0 printed. Rank 0 returns `code` at once; any other rank waits up to `linger`
// first. Under mpirun the first rank to exit non-zero makes the launcher kill the rest: had rank
// 1 gone first, rank 0 could be killed before its message was written. Rank 0's exit ends the
// linger (the launcher kills the waiting ranks), so a job under mpirun pays nothing for it.
int exit_before_mpi(int code, std::chrono::milliseconds linger = std::chrono::seconds(10));

struct JobFailure {
  int exit_code = kExitOther;
  std::string message;     // the line to print on stderr; empty when another rank prints it
  bool abort_job = false;  // other ranks may still be running or blocked: end the job (MPI_Abort)
};

// Called by every rank that caught `e` (a collective among failing ranks, on MPI's world when MPI
// is up). When every rank fails within `wait`, rank 0 reports for all (ranks whose message
// differs add theirs), everyone exits with rank 0's code, and no abort is needed. Otherwise this
// rank reports its own failure with its rank and host, and the job must be aborted.
JobFailure settle_failure(std::string_view program, const std::exception& e,
                          std::chrono::milliseconds wait = std::chrono::seconds(5));

}  // namespace triax
