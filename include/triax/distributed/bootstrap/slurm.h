// Slurm steps: Slurm's compact host lists ("gpu[01-04,07],login1") and the environment srun
// gives each task (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_STEP_NODELIST), turned into
// the TCP rendezvous of the env bootstrap (rank 0 on the step's first node) when no MPI is there.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "triax/distributed/bootstrap/bootstrap.h"

namespace triax {

// Expands a Slurm host list: comma-separated entries, each text with bracketed ranges
// ("n[1-3,5]", "rack[1-2]-n[01-02]": cartesian, zero padding kept from the lower bound).
// ConfigError naming the list and the position for malformed input.
std::vector<std::string> expand_slurm_hostlist(std::string_view list);

struct SlurmStep {
  int procid = 0;        // SLURM_PROCID: the task's rank in the step
  int ntasks = 1;        // SLURM_NTASKS (else SLURM_STEP_NUM_TASKS)
  int localid = 0;       // SLURM_LOCALID: the task's rank on its node
  std::vector<std::string> nodes;  // SLURM_STEP_NODELIST, expanded
  std::string job_id, step_id;     // SLURM_JOB_ID, SLURM_STEP_ID
  std::string master_addr;         // the first node
  int master_port = 0;             // TRIAX_MASTER_PORT, MASTER_PORT, SLURM_STEP_RESV_PORTS' first, or from the ids
  std::string port_desc;
};

// True when this process is a task of an srun step (SLURM_STEP_ID and SLURM_PROCID set); a batch
// script's own shell is not (it has no step id), so running a program there stays single.
bool in_slurm_step();
// Reads the step's variables; ConfigError naming the variable for a missing or bad one.
SlurmStep read_slurm_step();
// The env (TCP) bootstrap for a Slurm step: rank SLURM_PROCID of SLURM_NTASKS, rendezvous on the
// step's first node.
std::unique_ptr<Bootstrap> make_slurm_bootstrap(const BootstrapOptions& opts);

}  // namespace triax
