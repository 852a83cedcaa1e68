// A Slurm step without MPI: the task's place comes from srun's variables and the rendezvous is
// the env bootstrap's TCP star, rooted on the step's first node. The port must be the same in
// every task without talking: an explicit one, Slurm's reserved step ports, or one derived from
// the job and step ids (different steps of a job get different ports).
#include <fmt/format.h>

#include "triax/core/env.h"
#include "triax/core/error.h"
#include "triax/distributed/bootstrap/slurm.h"

namespace triax {
namespace {

std::string need(const char* name, const char* alt = nullptr) {
  if (auto v = env_string_opt(name)) return *v;
  if (alt)
    if (auto v = env_string_opt(alt)) return *v;
  TRIAX_THROW(ConfigError, "{} is not set: an srun step sets SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and "
                           "SLURM_STEP_NODELIST for every task", name);
}

}  // namespace

bool in_slurm_step() { return env_set("SLURM_STEP_ID") && env_set("SLURM_PROCID"); }

SlurmStep read_slurm_step() {
  SlurmStep s;
  s.ntasks = static_cast<int>(parse_env_int("SLURM_NTASKS", need("SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"), 1, 1 << 20));
  s.procid = static_cast<int>(parse_env_int("SLURM_PROCID", need("SLURM_PROCID"), 0, s.ntasks - 1));
  s.localid = static_cast<int>(parse_env_int("SLURM_LOCALID", need("SLURM_LOCALID"), 0, s.ntasks - 1));
  s.nodes = expand_slurm_hostlist(need("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"));
  s.job_id = env_string("SLURM_JOB_ID", "");
  s.step_id = env_string("SLURM_STEP_ID", "");
  s.master_addr = env_string("TRIAX_MASTER_ADDR", s.nodes.front());
  if (auto p = env_port_opt("TRIAX_MASTER_PORT")) {
    s.master_port = *p;
    s.port_desc = fmt::format("TRIAX_MASTER_PORT={}", s.master_port);
  } else if (auto mp = env_port_opt("MASTER_PORT")) {
    s.master_port = *mp;
    s.port_desc = fmt::format("MASTER_PORT={}", s.master_port);
  } else if (auto resv = env_string_opt("SLURM_STEP_RESV_PORTS")) {
    // "12000-12003" or "12000,12005": the first port Slurm reserved for this step (MpiParams=ports=).
    const std::string first = resv->substr(0, resv->find_first_of("-,"));
    s.master_port = static_cast<int>(parse_env_int("SLURM_STEP_RESV_PORTS", first, 1, 65535));
    s.port_desc = fmt::format("SLURM_STEP_RESV_PORTS={} (first)", *resv);
  } else {
    const long long job = s.job_id.empty() ? 0 : parse_env_int("SLURM_JOB_ID", s.job_id, 0, 1LL << 40);
    const long long step = s.step_id.empty() ? 0 : parse_env_int("SLURM_STEP_ID", s.step_id, 0, 1LL << 40);
    s.master_port = static_cast<int>(20000 + (job * 97 + step) % 30000);
    s.port_desc = fmt::format("port {} derived from SLURM_JOB_ID={} SLURM_STEP_ID={} (set TRIAX_MASTER_PORT to choose)",
                              s.master_port, s.job_id, s.step_id);
  }
  return s;
}

std::unique_ptr<Bootstrap> make_slurm_bootstrap(const BootstrapOptions& opts) {
  const SlurmStep s = read_slurm_step();
  TcpLaunch t;
  t.rank = s.procid;
  t.world_size = s.ntasks;
  t.local_rank = s.localid;
  t.master_addr = s.master_addr;
  t.master_port = s.master_port;
  t.port_desc = s.port_desc;
  t.job = fmt::format("slurm-{}.{}", s.job_id, s.step_id);
  t.job_desc = "SLURM_JOB_ID.SLURM_STEP_ID";
  t.kind = LaunchKind::slurm;
  return make_tcp_bootstrap(std::move(t), opts);
}

}  // namespace triax
