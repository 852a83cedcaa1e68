// Elastic training under torchrun's elastic agent (docs/FAULTS.md, "Elastic training"). The agent
// restarts the workers when one fails or a node joins, and re-forms the world with the nodes that
// are there; each start of the workers is an attempt. triax is the worker: it takes the layout that
// fits the world it was given (--tp/--pp lists, config/train_config.h), resumes from the newest
// checkpoint, and says what happened. The progress it needs for that lives under --save, in
// elastic/ beside the checkpoints (the volume every node shares):
//   elastic/state.json            rank 0, after every iteration: attempt, world, layout, the last
//                                 iteration and when it ended, when recent saves began
//   elastic/interrupted.<A>.json  the first rank of attempt A to see it end (a failure, a peer's
//                                 death, a stall, a stop signal): who, when, what
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "triax/distributed/comm/comm.h"

namespace triax {

// What torchrun's agent tells a worker, from its environment.
struct ElasticLaunch {
  std::string run_id;        // TORCHELASTIC_RUN_ID (the rendezvous id)
  int restart_count = 0;     // TORCHELASTIC_RESTART_COUNT: failures restarted so far (joins do not count)
  int max_restarts = 0;      // TORCHELASTIC_MAX_RESTARTS
  int group_rank = 0;        // GROUP_RANK: this node's agent among the agents
  int local_world_size = 1;  // LOCAL_WORLD_SIZE: workers on this node
  int max_world_size = 0;    // the most ranks the job may grow to (max_world_size_from_env)
  std::string error_file;    // TORCHELASTIC_ERROR_FILE ("" when unset)
};

// nullopt when the process was not started by torchrun's agent (TORCHELASTIC_RUN_ID unset);
// ConfigError naming the variable for a malformed or inconsistent value.
// `rank`: this process's world rank (for the records it may write on the way out).
std::optional<ElasticLaunch> elastic_launch_from_env(int rank, int world_size);

// The largest world the job may have: TRIAX_MAX_WORLD_SIZE, else the maximum of torchrun's
// PET_NNODES ("MIN:MAX" or "N", how --nnodes is given through the environment) times
// local_world_size, else world_size. ConfigError for a malformed value or one below world_size.
int max_world_size_from_env(int world_size, int local_world_size);

// "tp 2 x pp 1 x dp 2" (with " x cp N" when cp > 1).
std::string describe_layout(int tp, int pp, int dp, int cp = 1);

// Under torchrun: this worker gets SIGTERM when its agent process dies (Linux PR_SET_PDEATHSIG),
// so it saves at the next iteration boundary with the others and leaves instead of running on
// without an agent. Does nothing elsewhere.
void end_with_agent();

// The seconds an elastic worker that stopped for another rank's signal waits for its own agent's
// SIGTERM before it leaves (the agents poll their workers every --monitor_interval, 5 s unless
// PET_MONITOR_INTERVAL says otherwise): the agent's own restart then does not count as a failure.
double agent_signal_grace_s();

// A record of the previous attempt's progress (elastic/state.json).
struct ElasticState {
  std::string run_id;
  int attempt = 0;
  int world = 0;
  std::string layout;
  double attempt_start_unix_s = 0;
  int64_t iteration = -1;          // the last iteration completed (-1: none)
  double iteration_unix_s = 0;     // when it ended
  double mean_iteration_s = 0;     // of this attempt's iterations
  std::vector<std::pair<int64_t, double>> saves;  // (iteration, unix time its save began), the newest last
};
// nlohmann-json text of s, and back; IoError naming `source` and the field for a malformed text.
std::string elastic_state_json(const ElasticState& s);
ElasticState parse_elastic_state(std::string_view text, const std::string& source);

// The first report of how an attempt ended.
struct Interruption {
  int attempt = 0;
  int rank = -1;
  double unix_s = 0;
  std::string what;
};

// What the line at a (re)start says, from the previous attempt's state (nullopt on a first start
// or another run's state) and the checkpoint resumed from (-1: none).
struct ElasticStart {
  int attempt = 1;
  std::string line;           // "elastic: ..." (rank 0 prints it)
  int64_t lost_iterations = 0;
  double lost_s = 0;          // the training time those iterations took
};
ElasticStart describe_elastic_start(const ElasticLaunch& launch, const std::optional<ElasticState>& prev,
                                    const std::optional<Interruption>& why, const std::string& layout, int world,
                                    int64_t resumed_iteration);

// One worker's part in an elastic run: train_gpt makes one after the resume when torchrun
// launched it. Rank 0 reads and writes the state; every rank may record the interruption.
class ElasticRun {
 public:
  // Collective over world (rank 0's attempt number is broadcast). save_dir "": nothing is kept
  // (every restart starts over; the line says so).
  // process_start_unix_s: when this worker process started (the recovery line splits the time
  // into the agent's part, before it, and the worker's start-up and resume, after it).
  ElasticRun(ElasticLaunch launch, std::string save_dir, Communicator& world, std::string layout,
             int64_t resumed_iteration, double process_start_unix_s);
  ~ElasticRun();
  const ElasticStart& start() const { return start_; }
  // Rank 0, after every iteration: writes the state; returns the recovery line after the first
  // iteration of a restarted attempt ("elastic: training resumed 12.3 s after ..."), else "".
  std::string iteration_done(int64_t iteration);
  // Rank 0: a save of `iteration` begins now.
  void save_started(int64_t iteration);
  // Rank 0: the recovery time printed by iteration_done (negative before it).
  double recovery_s() const { return recovery_s_; }

 private:
  void write_state();
  ElasticLaunch launch_;
  std::string dir_;  // save_dir/elastic, "" without --save
  bool root_ = false;
  ElasticState state_;
  ElasticStart start_;
  std::optional<Interruption> why_;
  std::optional<ElasticState> prev_;
  double first_iteration_start_unix_s_ = 0;
  double process_start_unix_s_ = 0;
  double last_iteration_unix_s_ = 0;
  int64_t iterations_ = 0;
  double recovery_s_ = -1;
};

// Any rank, on the way out (never throws): the first interruption record of the running attempt
// (when an ElasticRun exists and --save was given) and the agent's error file
// (TORCHELASTIC_ERROR_FILE, the JSON torch's own error handler writes, so that torchrun's failure
// summary names the fault). Only the first call of a process writes.
void elastic_note_interruption(std::string_view what) noexcept;

}  // namespace triax
