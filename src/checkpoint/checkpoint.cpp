// Saving (host copy, background write, rank 0's atomic commit and pruning), resuming with
// resharding and fallback, the start-up checks of --save and --load, and the stop signals. The
// format is in manifest.h and docs/CHECKPOINTS.md.
#include "triax/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/ranges.h>

#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>

#include "triax/core/clock.h"
#include "triax/core/env.h"
#include "triax/core/error.h"
#include "triax/core/log.h"
#include "triax/distributed/comm/comm.h"
#include "triax/io/atomic_file.h"
#include "triax/io/tensor_file.h"
#include "triax/io/sha256.h"
#include "triax/model/param_shards.h"

namespace triax {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) TRIAX_THROW(IoError, "{}: cannot open the directory to fsync it: {}", dir, std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) TRIAX_THROW(IoError, "{}: fsync of the directory failed: {}", dir, std::strerror(errno));
}

void write_text_atomic(const std::string& path, const std::string& text) {
  io::AtomicFile f(path);
  f.write(std::as_bytes(std::span<const char>(text)));
  f.commit();
}

std::string rank_file(int rank, const char* ext) { return fmt::format("rank_{:05d}.{}", rank, ext); }

int64_t numel_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// The tensors whose rows are the padded vocabulary (their row count depends on tp): the token
// embedding and the LM head (one tensor when tied).
bool is_vocab_rows(const GptConfig& m, const std::string& name) {
  return name == m.embedding_param() || name == m.lm_head_param();
}

// The tied embedding: held by the first and the last stage, the same tensor; the first writes it.
bool is_tied_embedding(const GptConfig& m, const std::string& name) {
  return m.tied_embeddings && name == m.embedding_param();
}

// How long rank 0 waits for the other ranks' shards before giving the save up: the collectives'
// timeout (TRIAX_COMM_TIMEOUT_S has one reader, default_comm_timeout).
std::chrono::milliseconds commit_timeout() { return default_comm_timeout(); }

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa{};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int stop_signal_received() { return static_cast<int>(g_stop_signal); }

// ------------------------------------------------------------------ saving

struct Checkpointer::Pending {
  std::thread thread;
  std::exception_ptr error;
  SaveStats stats;
  std::vector<std::byte> payload;  // this rank's shard file, back to staging_ when done
  std::atomic<bool> cancel{false};  // set when the run ends by an error: rank 0 stops waiting
};

namespace {

// What the background thread of one save needs; rank 0's part also commits and prunes.
struct SaveJob {
  std::string root, tmp_dir, final_dir, file;
  int rank = 0, nranks = 1, keep = 0;
  CheckpointManifest part;                // this rank's files and slices, the scalars
  std::string resumed_dir;                // never pruned
  std::vector<std::string> damaged_dirs;  // set aside after the commit
  std::function<void(double)> committed;
  Clock::time_point t0;
};

// This rank's shard and its part of the manifest (rank_r.json), both committed atomically.
void write_shard(SaveJob& job, const std::vector<std::byte>& payload, SaveStats& stats) {
  // Fault-injection hook for tests: hold the write back (tests/train/checkpoint_test.sh kill9).
  if (const auto ms = env_int_opt("TRIAX_CHECKPOINT_TEST_DELAY_MS", 0, 3'600'000))
    std::this_thread::sleep_for(std::chrono::milliseconds(*ms));
  const auto tw = Clock::now();
  {
    io::AtomicFile f((fs::path(job.tmp_dir) / job.file).string());
    f.write(payload);
    f.commit();
  }
  stats.write_s = since(tw);
  job.part.files.push_back({job.file, payload.size(), io::sha256_hex(payload)});
  write_text_atomic((fs::path(job.tmp_dir) / rank_file(job.rank, "json")).string(), checkpoint_manifest_json(job.part));
}

// Rank 0: every rank's part, in rank order, merged into the manifest and checked as a reader will.
CheckpointManifest merge_parts(const SaveJob& job, const std::atomic<bool>& cancel) {
  CheckpointManifest man = job.part;
  man.files.clear();
  man.slices.clear();
  const auto deadline = Clock::now() + commit_timeout();
  for (int r = 0; r < job.nranks; ++r) {
    const std::string p = (fs::path(job.tmp_dir) / rank_file(r, "json")).string();
    while (!fs::exists(p)) {
      if (cancel) TRIAX_THROW(IoError, "{}: the run ended before every rank wrote its shard", job.tmp_dir);
      if (Clock::now() > deadline)
        TRIAX_THROW(IoError, "{}: rank {} did not finish its shard within {} s", job.tmp_dir, r,
                    std::chrono::duration<double>(commit_timeout()).count());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    CheckpointManifest pr = parse_checkpoint_part(read_checkpoint_text(p), p);
    for (auto& f : pr.files) man.files.push_back(std::move(f));
    for (auto& s : pr.slices) man.slices.push_back(std::move(s));
  }
  check_checkpoint_manifest_structure(man, job.tmp_dir + " (being saved)");
  return man;
}

// Rank 0: manifest.json, then its digest (each atomic: a torn manifest never has a matching
// digest), then the rename that makes the checkpoint exist.
void commit(const SaveJob& job, const CheckpointManifest& man) {
  const std::string text = checkpoint_manifest_json(man);
  write_text_atomic((fs::path(job.tmp_dir) / kManifestName).string(), text);
  write_text_atomic((fs::path(job.tmp_dir) / kManifestDigestName).string(), checkpoint_manifest_digest(text));
  for (int r = 0; r < job.nranks; ++r) fs::remove(fs::path(job.tmp_dir) / rank_file(r, "json"));
  fsync_dir(job.tmp_dir);
  if (fs::exists(job.final_dir)) fs::remove_all(job.final_dir);  // an older save of this iteration
  fs::rename(job.tmp_dir, job.final_dir);
  fsync_dir(job.root);
}

void log_saved(const SaveJob& job, const CheckpointManifest& man, const SaveStats& st) {
  uint64_t total = 0;
  for (const auto& f : man.files) total += f.bytes;
  log::info("saved checkpoint {} ({:.2f} MiB in {} files): training blocked {:.1f} ms ({:.1f} ms waiting for "
            "the previous save, {:.1f} ms host copy), rank 0 wrote {:.2f} MiB in {:.1f} ms ({:.0f} MiB/s), "
            "committed {:.1f} ms after the save began",
            job.final_dir, total / 1048576.0, man.files.size(), st.blocked_s * 1e3, st.wait_s * 1e3,
            (st.blocked_s - st.wait_s) * 1e3, st.bytes / 1048576.0, st.write_s * 1e3,
            st.bytes / 1048576.0 / std::max(st.write_s, 1e-9), st.commit_s * 1e3);
}

bool same_path(const std::string& a, const std::string& b) {
  std::error_code ec;
  return !a.empty() && !b.empty() && fs::equivalent(a, b, ec) && !ec;
}

// Rank 0, after a commit: the checkpoints the resume refused as damaged are set aside (renamed
// iter_N.refused: never listed, loaded or pruned; a person decides), then all but the newest
// --keep-last are removed, except the one just committed and the one this run resumed from.
void prune(const SaveJob& job) {
  for (const auto& dir : job.damaged_dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    if (!same_path(fs::path(dir).parent_path().string(), job.root)) {
      log::warn("left {} in place (it failed verification when this run resumed, but is not under --save {})", dir,
                job.root);
      continue;
    }
    std::string to = dir + ".refused";
    for (int k = 2; fs::exists(to, ec); ++k) to = fmt::format("{}.refused.{}", dir, k);
    fs::rename(dir, to);
    log::warn("set aside {} as {}: it failed verification when this run resumed (the log above says why); it is "
              "never loaded or pruned: inspect it, then remove it by hand", dir, to);
  }
  if (job.keep <= 0) return;
  int kept = 0;
  for (const auto& [it, dir] : list_checkpoints(job.root)) {
    const bool newest = kept < job.keep;
    if (newest || dir == job.final_dir) {
      ++kept;
      continue;
    }
    if (same_path(dir, job.resumed_dir)) {
      log::info("kept {} beyond --keep-last {}: this run resumed from it", dir, job.keep);
      continue;
    }
    fs::remove_all(dir);
  }
}

void run_save_job(SaveJob& job, const std::vector<std::byte>& payload, SaveStats& stats,
                  const std::atomic<bool>& cancel) {
  write_shard(job, payload, stats);
  if (job.rank != 0) return;
  const CheckpointManifest man = merge_parts(job, cancel);
  commit(job, man);
  stats.commit_s = since(job.t0);
  if (job.committed) {
    try {  // committed already: a metrics problem must not fail the save
      job.committed(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
    } catch (const std::exception& e) {
      log::warn("checkpoint {} committed, but reporting it to the metrics failed: {}", job.final_dir, e.what());
    }
  }
  log_saved(job, man, stats);
  prune(job);  // old checkpoints go only now that the new one is committed
}

}  // namespace

Checkpointer::Checkpointer(Trainer& trainer) : t_(trainer), last_save_time_(Clock::now()) {}

Checkpointer::~Checkpointer() {
  // Reached with a save in flight only when the run ends by an error: the other ranks may never
  // write their shards, so rank 0 must not wait for them.
  if (pending_ && pending_->thread.joinable()) {
    pending_->cancel = true;
    pending_->thread.join();
  }
}

void Checkpointer::on_commit(std::function<void(double)> fn) {
  if (t_.grid().world().rank() != 0) return;
  if (pending_) TRIAX_THROW(ConfigError, "Checkpointer::on_commit must be set while no save is in flight");
  on_commit_ = std::move(fn);
  if (on_commit_ && loaded_commit_unix_s_ > 0) on_commit_(loaded_commit_unix_s_);
}

bool Checkpointer::join() {
  if (!pending_) return true;
  if (pending_->thread.joinable()) pending_->thread.join();
  last_ = pending_->stats;
  staging_ = std::move(pending_->payload);
  const std::exception_ptr e = pending_->error;
  pending_.reset();
  if (!e) return true;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    log::error("checkpoint save of iteration {} failed: {}", last_.iteration, ex.what());
  }
  return false;
}

void Checkpointer::finish() {
  const bool ok = join();
  double bad = ok ? 0.0 : 1.0;
  t_.grid().world().all_reduce(std::span<double>(&bad, 1), ReduceOp::max).wait();
  if (bad > 0)
    TRIAX_THROW(IoError, "--save {}: the checkpoint of iteration {} was not written (the failing rank says why)",
                t_.config().save, last_.iteration);
}

// Waits for the previous save and (rank 0) creates tmp_dir. The message names the iteration whose
// save failed: the previous one when its background write failed (a full disk), not this one.
void Checkpointer::prepare_save(const std::string& tmp_dir, int64_t iteration) {
  const std::string& root = t_.config().save;
  const bool had_previous = pending_ != nullptr;
  const bool previous_ok = join();
  bool ok = true;
  if (t_.grid().world().rank() == 0 && previous_ok) {
    try {
      fs::create_directories(root);
      // Saves that crashed earlier left iter_*.tmp directories: never loaded, removed here.
      for (const auto& e : fs::directory_iterator(root)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && n.starts_with("iter_") && n.ends_with(".tmp")) fs::remove_all(e.path());
      }
      fs::create_directory(tmp_dir);
    } catch (const std::exception& e) {
      log::error("--save {}: cannot create {}: {}", root, tmp_dir, e.what());
      ok = false;
    }
  }
  double bad[2] = {previous_ok ? 0.0 : 1.0, ok ? 0.0 : 1.0};
  t_.grid().world().all_reduce(std::span<double>(bad, 2), ReduceOp::max).wait();  // also: tmp_dir exists now
  if (bad[0] > 0 && had_previous)
    TRIAX_THROW(IoError, "--save {}: the checkpoint of iteration {} was not written (the failing rank says why); "
                "stopped at iteration {}", root, last_.iteration, iteration);
  if (bad[0] > 0 || bad[1] > 0)
    TRIAX_THROW(IoError, "--save {}: the checkpoint of iteration {} cannot be written (see the log)", root, iteration);
}

// What this rank owns, copied into one host buffer (staging_, kept from save to save: fresh
// pages are what makes a first copy slow): the blocking part of a save. Per parameter, runs
// (begin, end) of its local tensor and where each run starts in the Adam state. Replicated
// tensors are written by tp rank 0, the tied embedding by the first stage; without ZeRO-1 DP
// rank 0 writes, with ZeRO-1/2/3 each its own shard (under ZeRO-3 the parameter values too come
// from the rank's master shard; with HSDP only the first replica group writes). A MoE expert lives
// on one rank of each expert-parallel group: without ZeRO expert-DP rank 0 writes it, under ZeRO-2/3
// each expert-DP rank its piece (under its global name either way, so any other ep can load it).
CheckpointManifest Checkpointer::stage_shard(const std::string& file) {
  ParamStore& store = t_.store();
  Optimizer& opt = t_.optimizer();
  ProcessGrid& grid = t_.grid();
  const auto coord = grid.coord();
  const int tp = grid.tp().size();
  // One writer per weight replica: dp x cp ranks hold the same weights (context parallelism).
  const int edp_rank = grid.expert_dp_cp().rank(), dp_rank = grid.dp_cp().rank();
  std::vector<std::pair<size_t, std::vector<std::array<size_t, 3>>>> plan;
  size_t total = kCheckpointShardMagic.size();
  for (size_t i = 0; i < store.size(); ++i) {
    const ParamInfo& info = store.info(i);
    if (info.spec.split == TpSplit::none && coord.tp != 0) continue;
    if (is_tied_embedding(t_.model_config(), info.spec.name) && coord.pp != 0) continue;
    std::vector<std::array<size_t, 3>> runs;
    if (!opt.sharded_state()) {
      if ((info.spec.expert ? edp_rank : dp_rank) == 0) runs.push_back({0, info.numel, info.offset});
    } else if (opt.replica_writer()) {  // HSDP: the first replica group writes the shards
      for (const auto& r : opt.ranges()) {
        const size_t b = std::max(r.flat_offset, info.offset), e = std::min(r.flat_offset + r.count, info.offset + info.numel);
        if (b < e) runs.push_back({b - info.offset, e - info.offset, r.state_offset + (b - r.flat_offset)});
      }
    }
    for (const auto& run : runs) total += 3 * (run[1] - run[0]) * sizeof(float);
    if (!runs.empty()) plan.emplace_back(i, std::move(runs));
  }
  staging_.resize(total);
  std::memcpy(staging_.data(), kCheckpointShardMagic.data(), kCheckpointShardMagic.size());
  CheckpointManifest part;
  size_t at = kCheckpointShardMagic.size();
  for (const auto& [i, runs] : plan) {
    const ParamInfo& info = store.info(i);
    for (const auto& [b, e, so] : runs) {
      // Straight from the backend into the reused buffer: no temporary host vectors.
      const size_t nbytes = (e - b) * sizeof(float);
      for (const StateKind kind : {StateKind::param, StateKind::exp_avg, StateKind::exp_avg_sq}) {
        part.slices.push_back({info.spec.name, kind, info.spec.full_shape, info.spec.split, coord.tp, tp,
                               static_cast<int64_t>(b), static_cast<int64_t>(e), file, at});
        const std::span<std::byte> dst(staging_.data() + at, nbytes);
        if (kind == StateKind::param) store.param_to_host(i, b, e, dst);
        else opt.state_to_host(kind == StateKind::exp_avg ? 0 : 1, so, so + (e - b), dst);
        at += nbytes;
      }
    }
  }
  return part;
}

void Checkpointer::save() {
  const auto t0 = Clock::now();
  last_save_time_ = t0;
  if (on_save_start_) on_save_start_(t_.iteration());
  const TrainConfig& cfg = t_.config();
  Communicator& world = t_.grid().world();
  const int64_t iteration = t_.iteration();
  SaveJob job;
  job.root = cfg.save;
  job.final_dir = (fs::path(job.root) / checkpoint_dir_name(iteration)).string();
  job.tmp_dir = job.final_dir + ".tmp";
  prepare_save(job.tmp_dir, iteration);
  const double t_sync = since(t0);

  job.rank = world.rank(), job.nranks = world.size(), job.keep = cfg.keep_last;
  job.file = checkpoint_shard_name(job.rank);
  job.part = stage_shard(job.file);
  // The scalars of the whole state (the same on every rank; rank 0's copy becomes the manifest).
  CheckpointManifest& part = job.part;
  Optimizer& opt = t_.optimizer();
  part.iteration = iteration;
  part.consumed_samples = t_.consumed_samples();
  part.applied_steps = opt.applied_steps();
  part.skipped_steps = opt.skipped_steps();
  part.seed = cfg.seed;
  part.seq = *cfg.seq;
  part.model = t_.model_config();
  part.tp = cfg.tp, part.pp = cfg.pp, part.dp = t_.grid().dp().size(), part.vpp = cfg.vpp, part.cp = cfg.cp;
  part.zero = opt.zero_level(), part.zero1 = part.zero >= 1;
  part.schedule = std::string(schedule_kind_name(cfg.schedule));
  part.config_toml = to_toml(cfg);
  const BatchPlan& plan = t_.batch_plan();
  part.batch = CheckpointBatch{*cfg.global_batch, *cfg.micro_batch, plan.num_micro_batches, cfg.rampup,
                               batch_since_iteration_, batch_since_consumed_, plan.shares};
  job.resumed_dir = resumed_dir_;
  job.damaged_dirs = std::move(damaged_dirs_);  // set aside once, by the first commit
  damaged_dirs_.clear();
  job.committed = on_commit_;
  job.t0 = t0;

  pending_ = std::make_unique<Pending>();
  Pending* pd = pending_.get();
  pd->stats.iteration = iteration;
  pd->stats.bytes = staging_.size();
  pd->stats.blocked_s = since(t0);
  pd->stats.wait_s = t_sync;
  pd->payload = std::move(staging_);
  pd->thread = std::thread([pd, job = std::move(job)]() mutable {
    try {
      run_save_job(job, pd->payload, pd->stats, pd->cancel);
    } catch (...) {
      pd->error = std::current_exception();
    }
  });
}

bool Checkpointer::after_iteration() {
  const TrainConfig& cfg = t_.config();
  if (cfg.save.empty()) return false;
  // {the stop signal of any rank, rank 0's verdict that --save-interval-minutes passed}: one
  // all-reduce, so every rank stops and saves at the same iteration.
  std::array<double, 2> flags{static_cast<double>(stop_signal_received()), 0.0};
  if (cfg.save_interval_minutes > 0 && t_.grid().world().rank() == 0)
    flags[1] = std::chrono::duration<double>(Clock::now() - last_save_time_).count() >= cfg.save_interval_minutes * 60;
  t_.grid().world().all_reduce(std::span<double>(flags), ReduceOp::max).wait();
  const double sig = flags[0];
  const int64_t it = t_.iteration();
  const bool stop = sig > 0 && it < cfg.train_iters;
  if (stop) stop_signal_ = static_cast<int>(sig);
  if (stop || it >= cfg.train_iters || (cfg.save_interval > 0 && it % cfg.save_interval == 0) || flags[1] > 0) save();
  if (stop) {
    finish();
    if (t_.grid().world().rank() == 0)
      log::info("received {}: saved the state of iteration {} under {}; exiting", sig == SIGTERM ? "SIGTERM" : "SIGUSR1",
                it, cfg.save);
  }
  return stop;
}

// ------------------------------------------------------------------ loading

namespace {

using SliceIndex = std::map<std::pair<std::string, int>, std::vector<const CheckpointSlice*>>;

// A checkpoint that failed verification (its digest, structure or files), as opposed to one that
// is intact but does not fit this run: only the damaged are set aside.
class DamagedCheckpoint : public IoError {
 public:
  using IoError::IoError;
};

struct Restored {
  std::vector<std::vector<float>> params;  // per store index
  std::vector<float> m, v;                 // the optimizer's layout
  const CheckpointManifest* manifest = nullptr;
};

class CheckpointReader {
 public:
  CheckpointReader(std::string dir, int64_t dir_iteration) : dir_(std::move(dir)) {
    try {
      man_ = read_checkpoint_manifest(dir_, dir_iteration, &digest_checked_);
    } catch (const IoError& e) {
      throw DamagedCheckpoint(e.what());
    }
    for (const auto& s : man_.slices) index_[{s.name, static_cast<int>(s.kind)}].push_back(&s);
    for (const auto& f : man_.files) files_[f.name] = &f;
  }
  const CheckpointManifest& manifest() const { return man_; }
  bool digest_checked() const { return digest_checked_; }
  // Every file is verified by some rank, also those no rank needs slices from: file k by rank k % n.
  void verify_share(int rank, int nranks) {
    for (size_t k = 0; k < man_.files.size(); ++k)
      if (static_cast<int>(k % static_cast<size_t>(nranks)) == rank) bytes(man_.files[k].name);
  }

  // This rank's shard (tp rank tr of tp) of tensor `name` when the checkpoint holds it at the same
  // tp and full shape: only the slices of old tp rank tr are read, not every rank's (a resume at
  // the same tp reads 1/tp of the tensors). nullopt when the layouts differ: full() and cut it.
  std::optional<std::vector<float>> same_tp_shard(const std::string& name, StateKind kind,
                                                  const std::vector<int64_t>& want, TpSplit split, int tr, int tp) {
    auto it = index_.find({name, static_cast<int>(kind)});
    if (it == index_.end()) return std::nullopt;  // full() says what is missing
    const CheckpointSlice& s0 = *it->second.front();
    if (s0.split != split || s0.full_shape != want || (split != TpSplit::none && s0.tp_size != tp)) return std::nullopt;
    return old_shard(it->second, split == TpSplit::none ? 0 : tr, name);
  }

  // The tensor `name` of `kind` at its full shape `want` (assembled from the slices of every old
  // tp rank, which the manifest's structure check proved to cover each element once; the padded
  // vocabulary rows may differ in number).
  std::vector<float> full(const std::string& name, StateKind kind, const std::vector<int64_t>& want, TpSplit split) {
    auto it = index_.find({name, static_cast<int>(kind)});
    if (it == index_.end())
      TRIAX_THROW(IoError, "{}: no slice of tensor '{}' ({}) in the manifest: a checkpoint of another model", dir_,
                  name, state_kind_name(kind));
    const CheckpointSlice& s0 = *it->second.front();
    if (s0.split != split)
      TRIAX_THROW(IoError, "{}: tensor '{}' is split differently in the checkpoint than in this model: an "
                           "incompatible layout or another model", dir_, name);
    const auto& old = s0.full_shape;
    const int old_tp = s0.tp_size;
    std::vector<float> full(static_cast<size_t>(numel_of(old)));
    const int ranks = split == TpSplit::none ? 1 : old_tp;
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> local = old_shard(it->second, r, name);
      if (split == TpSplit::none) full = std::move(local);
      else place_shard(local, full, old, split, r, old_tp);
    }
    if (old == want) return full;
    // The padded vocabulary depends on tp: keep the real rows, the padding rows are zero.
    const bool rows_only = old.size() == want.size() && old.size() >= 1 &&
                           std::equal(old.begin() + 1, old.end(), want.begin() + 1);
    if (!is_vocab_rows(man_.model, name) || !rows_only || std::min(old[0], want[0]) < man_.model.vocab)
      TRIAX_THROW(IoError, "{}: tensor '{}' has shape {} in the checkpoint but {} in this model", dir_, name,
                  io::shape_string(old), io::shape_string(want));
    const size_t row = static_cast<size_t>(numel_of(old) / old[0]);
    std::vector<float> out(static_cast<size_t>(numel_of(want)), 0.0f);
    const size_t keep = static_cast<size_t>(std::min(old[0], want[0])) * row;
    std::copy_n(full.begin(), keep, out.begin());
    return out;
  }

 private:
  // Old tp rank r's shard of a tensor, from its slices (which the manifest's structure check proved
  // to cover each element once).
  std::vector<float> old_shard(const std::vector<const CheckpointSlice*>& slices, int r, const std::string& name) {
    const CheckpointSlice& s0 = *slices.front();
    std::vector<float> local(static_cast<size_t>(numel_of(shard_shape(s0.full_shape, s0.split, s0.tp_size, name))));
    for (const auto* s : slices) {
      if (s->tp_rank != r) continue;
      const auto vals = checkpoint_slice_values(bytes(s->file), *s);
      std::copy(vals.begin(), vals.end(), local.begin() + s->begin);
    }
    return local;
  }
  const std::vector<std::byte>& bytes(const std::string& file) {
    auto c = cache_.find(file);
    if (c != cache_.end()) return c->second;
    try {
      return cache_.emplace(file, read_checkpoint_file(dir_, *files_.at(file))).first->second;
    } catch (const IoError& e) {
      throw DamagedCheckpoint(e.what());
    }
  }
  std::string dir_;
  CheckpointManifest man_;
  bool digest_checked_ = false;
  SliceIndex index_;
  std::map<std::string, const CheckpointFileInfo*> files_;
  std::map<std::string, std::vector<std::byte>> cache_;
};

// Everything this rank needs from checkpoint `dir`, read and checked before anything changes.
Restored read_state(CheckpointReader& rd, Trainer& t, const std::string& dir) {
  const CheckpointManifest& man = rd.manifest();
  const TrainConfig& cfg = t.config();
  check_checkpoint_matches_run(man, t.model_config(), cfg.seed, *cfg.seq, dir);
  ParamStore& store = t.store();
  Optimizer& opt = t.optimizer();
  ProcessGrid& grid = t.grid();
  const int tp = grid.tp().size(), tr = grid.coord().tp;
  Restored r;
  r.manifest = &man;
  r.m.assign(opt.state_to_host(0).size(), 0.0f);
  r.v.assign(r.m.size(), 0.0f);
  for (size_t i = 0; i < store.size(); ++i) {
    const ParamInfo& info = store.info(i);
    auto local = [&](StateKind k) {
      if (auto mine = rd.same_tp_shard(info.spec.name, k, info.spec.full_shape, info.spec.split, tr, tp))
        return std::move(*mine);
      const auto full = rd.full(info.spec.name, k, info.spec.full_shape, info.spec.split);
      return shard_of(full, info.spec.full_shape, info.spec.split, tr, tp);
    };
    r.params.push_back(local(StateKind::param));
    const auto lm = local(StateKind::exp_avg), lv = local(StateKind::exp_avg_sq);
    if (!opt.sharded_state()) {
      std::copy(lm.begin(), lm.end(), r.m.begin() + static_cast<std::ptrdiff_t>(info.offset));
      std::copy(lv.begin(), lv.end(), r.v.begin() + static_cast<std::ptrdiff_t>(info.offset));
      continue;
    }
    for (const auto& u : opt.ranges()) {
      const size_t b0 = std::max(u.flat_offset, info.offset), e0 = std::min(u.flat_offset + u.count, info.offset + info.numel);
      if (b0 >= e0) continue;
      const size_t so = u.state_offset + (b0 - u.flat_offset);
      std::copy(lm.begin() + (b0 - info.offset), lm.begin() + (e0 - info.offset), r.m.begin() + so);
      std::copy(lv.begin() + (b0 - info.offset), lv.begin() + (e0 - info.offset), r.v.begin() + so);
    }
  }
  return r;
}

std::string describe_batch(int64_t global_batch, int64_t micro_batch, const std::optional<BatchRampup>& ramp) {
  return fmt::format("global batch {}, micro-batch {}{}", global_batch, micro_batch,
                     ramp ? fmt::format(", ramp-up {} {} {}", ramp->start, ramp->increment, ramp->samples) : "");
}

bool same_ramp(const std::optional<BatchRampup>& a, const std::optional<BatchRampup>& b) {
  if (!a || !b) return !a && !b;
  return a->start == b->start && a->increment == b->increment && a->samples == b->samples;
}

// A rank's verdict on a checkpoint, all-reduced by max: loaded; refused, intact but not for this
// run; refused, damaged.
constexpr double kLoaded = 0, kIncompatible = 1, kDamaged = 2;

}  // namespace

// The log of a resume (rank 0), and where this run's batch settings began: a change of the batch
// against the checkpoint's is announced and restarts the consumed-samples count.
void Checkpointer::announce_resume(const std::string& dir, const CheckpointManifest& m) {
  const TrainConfig& cfg = t_.config();
  const bool root = t_.grid().world().rank() == 0;
  const std::string now = describe_batch(*cfg.global_batch, *cfg.micro_batch, cfg.rampup);
  batch_since_iteration_ = m.iteration;
  batch_since_consumed_ = m.consumed_samples;
  if (m.batch && *cfg.global_batch == m.batch->global_batch && same_ramp(cfg.rampup, m.batch->rampup)) {
    batch_since_iteration_ = m.batch->since_iteration;
    batch_since_consumed_ = m.batch->since_consumed_samples;
  }
  if (!root) return;
  const auto cp = [](int n) { return n > 1 ? fmt::format(" cp {}", n) : std::string(); };
  log::info("resumed from {}: iteration {}, {} consumed samples (written at tp {}{} pp {} dp {} zero {}, loaded at "
            "tp {}{} pp {} dp {} zero {}{})", dir, m.iteration, m.consumed_samples, m.tp, cp(m.cp), m.pp, m.dp, m.zero,
            cfg.tp, cp(cfg.cp), cfg.pp, t_.grid().dp().size(), t_.optimizer().zero_level(),
            cfg.zero_shard_size > 0 ? fmt::format(" shard size {}", cfg.zero_shard_size) : std::string());
  if (!m.batch)
    log::warn("{} (format version 1) does not record its batch settings: this run uses {} (give the original run's "
              "--global-batch-size to keep its batch)", dir, now);
  else if (const std::string then = describe_batch(m.batch->global_batch, m.batch->micro_batch, m.batch->rampup); then != now)
    log::warn("the batch settings change on resume: the checkpoint was trained with {}, this run uses {} (given on "
              "the command line or in --config)", then, now);
  if (m.iteration >= cfg.train_iters)
    log::warn("{} is already at iteration {}, {} --train-iters {}: nothing to train (raise --train-iters to "
              "continue)", dir, m.iteration, m.iteration == cfg.train_iters ? "which is" : "past", cfg.train_iters);
}

int64_t Checkpointer::resume() {
  const TrainConfig& cfg = t_.config();
  if (cfg.load.empty()) return -1;
  Communicator& world = t_.grid().world();
  const bool root = world.rank() == 0;
  std::error_code ec;
  if (fs::exists(cfg.load, ec) && !fs::is_directory(cfg.load, ec))
    TRIAX_THROW(IoError, "--load {}: not a directory (give the directory --save wrote, which holds iter_N/ "
                         "checkpoints)", cfg.load);
  const auto found = checkpoints_to_load(cfg.load);
  double n = static_cast<double>(found.size()), nmax = n;
  world.all_reduce(std::span<double>(&n, 1), ReduceOp::min).wait();
  world.all_reduce(std::span<double>(&nmax, 1), ReduceOp::max).wait();
  if (n != nmax) TRIAX_THROW(IoError, "--load {}: the ranks see different checkpoints ({} vs {}): not one shared "
                                      "file system?", cfg.load, n, nmax);
  if (found.empty()) {
    if (root) log::info("--load {}: no complete checkpoint there (absent directory or none inside): starting fresh", cfg.load);
    return -1;
  }
  for (size_t k = 0; k < found.size(); ++k) {
    const auto& [iteration, dir] = found[k];
    const auto t_load = std::chrono::steady_clock::now();
    std::string err;
    double verdict = kLoaded;
    std::optional<CheckpointReader> rd;
    Restored r;
    try {
      rd.emplace(dir, iteration);
      r = read_state(*rd, t_, dir);
      rd->verify_share(world.rank(), world.size());
    } catch (const DamagedCheckpoint& e) {
      err = e.what(), verdict = kDamaged;
    } catch (const Error& e) {
      err = e.what(), verdict = kIncompatible;
    }
    world.all_reduce(std::span<double>(&verdict, 1), ReduceOp::max).wait();
    if (verdict == kLoaded) {
      const CheckpointManifest& m = *r.manifest;
      ParamStore& store = t_.store();
      for (size_t i = 0; i < store.size(); ++i) store.param_from_host(i, r.params[i]);
      store.refresh_compute_copy();  // every master is current again; the layers read the copy
      t_.optimizer().state_from_host(0, r.m);
      t_.optimizer().state_from_host(1, r.v);
      t_.optimizer().set_step_counts(m.applied_steps, m.skipped_steps);
      t_.restore_progress(m.iteration, m.consumed_samples);
      resumed_dir_ = dir;
      if (root) {
        const auto mt = fs::last_write_time(fs::path(dir) / kManifestName, ec);  // the commit time
        if (!ec)
          loaded_commit_unix_s_ = std::chrono::duration<double>(
              std::chrono::file_clock::to_sys(mt).time_since_epoch()).count();
        if (!rd->digest_checked())
          log::warn("{}: no {} (written by a triax before manifest digests, format version 1): its structure was "
                    "checked, its manifest's integrity cannot be", dir, kManifestDigestName);
      }
      announce_resume(dir, m);
      if (root) {
        // Every rank read its share of the files: the whole checkpoint over rank 0's load time.
        uint64_t total = 0;
        for (const auto& f : m.files) total += f.bytes;
        const double secs = since(t_load);
        log::info("loaded checkpoint {} ({:.2f} MiB in {} files) in {:.1f} ms ({:.0f} MiB/s)", dir,
                  total / 1048576.0, m.files.size(), secs * 1e3, total / 1048576.0 / std::max(secs, 1e-9));
      }
      return m.iteration;
    }
    if (verdict == kDamaged) damaged_dirs_.push_back(dir);
    if (!err.empty()) log::warn("checkpoint {} refused{}: {}", dir, verdict == kDamaged ? " as damaged" : "", err);
    else if (root) log::warn("checkpoint {} refused by another rank (its log says why)", dir);
    if (root && k + 1 < found.size()) log::warn("falling back to the previous checkpoint {}", found[k + 1].second);
  }
  TRIAX_THROW(IoError, "--load {}: none of its {} checkpoints can be loaded (the log names each problem)", cfg.load,
              found.size());
}

void check_checkpoint_paths(const TrainConfig& cfg, Communicator& world) {
  std::string err;
  std::error_code ec;
  if (!cfg.load.empty() && fs::exists(cfg.load, ec) && !fs::is_directory(cfg.load, ec))
    err = fmt::format("--load {}: not a directory (give the directory --save wrote, which holds iter_N/ "
                      "checkpoints)", cfg.load);
  if (err.empty() && !cfg.save.empty()) {
    // Every rank writes its shard there: each one proves it can create a file, now rather than at
    // the first save after hours of training.
    const fs::path probe = fs::path(cfg.save) / fmt::format(".triax-write-test.{}.{}", world.rank(), ::getpid());
    std::error_code isdir;
    if (fs::create_directories(cfg.save, ec); ec && !fs::is_directory(cfg.save, isdir))
      err = fmt::format("--save {}: cannot create the directory: {}", cfg.save, ec.message());
    else if (const int fd = ::open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644); fd < 0)
      err = fmt::format("--save {}: cannot create files there: {}", cfg.save, std::strerror(errno));
    else
      ::close(fd), fs::remove(probe, ec);
  }
  double bad = err.empty() ? 0.0 : 1.0;
  world.all_reduce(std::span<double>(&bad, 1), ReduceOp::max).wait();
  if (!err.empty()) throw IoError(err + " (checked at start-up, before training)");
  if (bad > 0) TRIAX_THROW(IoError, "--save {} / --load {}: refused on another rank (its message says why)", cfg.save,
                           cfg.load);
}

TrainConfig with_checkpoint_batch(const TrainConfig& cfg, bool announce) {
  if (cfg.load.empty()) return cfg;
  for (const auto& [iteration, dir] : checkpoints_to_load(cfg.load)) {
    CheckpointManifest m;
    try {
      m = read_checkpoint_manifest(dir, iteration);
    } catch (const Error&) {
      continue;  // resume() refuses it and says why
    }
    if (!m.batch) return cfg;  // version 1: resume() says so
    TrainConfig out = cfg;
    std::vector<std::string> taken;
    const CheckpointBatch& b = *m.batch;
    if (!cfg.global_batch) {
      out.global_batch = b.global_batch;
      taken.push_back(fmt::format("--global-batch-size {}", b.global_batch));
    }
    if (!cfg.micro_batch && !cfg.num_micro_batches) {
      out.micro_batch = b.micro_batch;
      taken.push_back(fmt::format("--micro-batch-size {}", b.micro_batch));
    }
    if (!cfg.rampup && b.rampup) {
      out.rampup = b.rampup;
      taken.push_back(fmt::format("--rampup-batch-size {} {} {}", b.rampup->start, b.rampup->increment, b.rampup->samples));
    }
    if (announce && !taken.empty())
      log::info("--load {}: batch settings from {} (not given for this run): {}", cfg.load, dir,
                fmt::join(taken, " "));
    return out;
  }
  return cfg;
}

}  // namespace triax
