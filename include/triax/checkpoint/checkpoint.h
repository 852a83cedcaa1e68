// Checkpoints of the whole training state (docs/CHECKPOINTS.md): each rank writes what it owns
// on a background thread, rank 0 commits the directory atomically (manifest last, rename), and a
// resume reshards onto any layout the model allows, falling back past a broken checkpoint.
// Stop signals (SIGTERM, SIGUSR1) end a run at an iteration boundary with a saved state.
#pragma once
#include <cstdint>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "triax/checkpoint/manifest.h"
#include "triax/train/trainer.h"

namespace triax {

// Timings of one save. blocked: the training loop's wait (previous save's end + copying the state
// to host memory); write: the background thread's writing, fsync and (rank 0) commit.
struct SaveStats {
  int64_t iteration = 0;
  double blocked_s = 0;
  double wait_s = 0;    // of blocked_s: the previous save still writing
  double write_s = 0;   // this rank's shard: write + fsync
  double commit_s = 0;  // rank 0: from the start of the save to the renamed directory
  uint64_t bytes = 0;   // this rank's shard file
};

class Checkpointer {
 public:
  explicit Checkpointer(Trainer& trainer);
  ~Checkpointer();  // waits for a save in flight (without collectives)
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective. With --load DIR: restores the newest complete checkpoint under DIR that every
  // rank reads without error, logging each one refused and why; returns its iteration, or -1
  // when DIR is absent or holds none (a fresh start, said in the log). IoError when DIR holds
  // checkpoints but none loads, or DIR is not a directory. Logs a change of the batch settings
  // against the checkpoint's, and a checkpoint already at or past --train-iters. Checkpoints
  // refused as damaged (digest, structure, files) are set aside as iter_N.refused by the first
  // save into the same directory; the one resumed from is never pruned by this run.
  int64_t resume();
  // Collective: waits for the previous save, copies the state to host memory and starts writing
  // checkpoint_dir_name(iteration) under --save in the background. IoError (on every rank) when
  // the previous save failed on any rank (naming its iteration) or the directory cannot be made.
  void save();
  // Collective: waits until the save in flight is committed (IoError on every rank if it failed
  // on any).
  void finish();
  // Collective, after every iteration: saves every --save-interval iterations, when
  // --save-interval-minutes passed since the last save (or the start) by rank 0's clock, at the
  // last iteration, and when any rank received a stop signal; returns true to stop then.
  bool after_iteration();

  const SaveStats& last_save() const { return last_; }
  // The stop signal after_iteration acted on: the largest any rank received (0: none yet). A rank
  // that got none itself still knows which one stopped the run.
  int stop_signal() const { return stop_signal_; }

  // Rank 0: called with the unix time of every checkpoint it commits (on the writer thread, so it
  // must be thread-safe), and at once with the commit time of the checkpoint resume() loaded:
  // what the Prometheus checkpoint-age metric shows. Never called on other ranks.
  void on_commit(std::function<void(double unix_s)> fn);
  // Every rank: called by save() with the iteration whose state it starts to save (the elastic
  // progress record keeps when each save began: train/elastic.h).
  void on_save_start(std::function<void(int64_t iteration)> fn) { on_save_start_ = std::move(fn); }

 private:
  struct Pending;
  bool join();  // this rank's thread; false if it failed (the error is logged)
  void prepare_save(const std::string& tmp_dir, int64_t iteration);  // save(): join, make tmp_dir
  CheckpointManifest stage_shard(const std::string& file);            // save(): the host copy
  void announce_resume(const std::string& dir, const CheckpointManifest& m);  // resume(): the log, batch_since_
  Trainer& t_;
  std::unique_ptr<Pending> pending_;
  std::vector<std::byte> staging_;  // the host copy of this rank's shard, reused by every save
  SaveStats last_;
  std::function<void(double)> on_commit_;
  std::function<void(int64_t)> on_save_start_;
  int stop_signal_ = 0;
  std::chrono::steady_clock::time_point last_save_time_;  // construction or the last save() (--save-interval-minutes)
  double loaded_commit_unix_s_ = 0;  // the resumed checkpoint's manifest time (rank 0)
  // For pruning (rank 0): the checkpoint this run resumed from (never pruned by it), and those
  // its resume refused as damaged (set aside by the next commit into the same directory).
  std::string resumed_dir_;
  std::vector<std::string> damaged_dirs_;
  // Where this run's batch settings began (written to every manifest: consumed samples check).
  int64_t batch_since_iteration_ = 0, batch_since_consumed_ = 0;
};

// Collective, at start-up before anything is built: --load must be a directory where it exists,
// and --save a directory (created if absent) in which every rank can create files. IoError on
// every rank naming the path and the problem, instead of a failure at the first save.
void check_checkpoint_paths(const TrainConfig& cfg, Communicator& world);

// With --load: cfg with the batch settings of the newest checkpoint under --load whose manifest
// reads, where cfg leaves them open: the global batch, the micro-batch (unless the number of
// micro-batches is given) and the ramp-up. Logged (when `announce`) with what was taken. cfg as
// it is without --load, a checkpoint, or batch settings in it (format version 1).
TrainConfig with_checkpoint_batch(const TrainConfig& cfg, bool announce);

// SIGTERM and SIGUSR1 set a flag instead of ending the process (what Slurm and Kubernetes send
// before killing a job); Checkpointer::after_iteration acts on it.
void install_stop_signal_handlers();
// The signal received (SIGTERM or SIGUSR1), 0 if none.
int stop_signal_received();

}  // namespace triax
