// Saving (host copy, background write, rank 0's atomic commit), resuming with resharding and
// fallback, and the stop signals. The format is in checkpoint_manifest.h and docs/CHECKPOINTS.md.
#include "triax/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

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

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) TRIAX_THROW(IoError, "{}: cannot be opened", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
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

bool is_wte(const std::string& name) { return name == "transformer.wte.weight"; }

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

Checkpointer::Checkpointer(Trainer& trainer) : t_(trainer) {}

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

void Checkpointer::save() {
  const auto t0 = Clock::now();
  const TrainConfig& cfg = t_.config();
  ProcessGrid& grid = t_.grid();
  Communicator& world = grid.world();
  const int rank = world.rank(), nranks = world.size();
  const int64_t iteration = t_.iteration();
  const std::string root = cfg.save;
  const std::string final_dir = (fs::path(root) / checkpoint_dir_name(iteration)).string();
  const std::string tmp_dir = final_dir + ".tmp";

  bool ok = join();
  if (rank == 0 && ok) {
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
  double bad = ok ? 0.0 : 1.0;
  world.all_reduce(std::span<double>(&bad, 1), ReduceOp::max).wait();  // also: tmp_dir exists now
  if (bad > 0) TRIAX_THROW(IoError, "--save {}: the checkpoint of iteration {} cannot be written (see the log)", root, iteration);

  const double t_sync = since(t0);
  // Copy what this rank owns into one host buffer: the blocking part of a save.
  ParamStore& store = t_.store();
  Optimizer& opt = t_.optimizer();
  const auto coord = grid.coord();
  const int tp = grid.tp().size();
  const bool zero1 = opt.zero1();
  // What this rank writes: per parameter, runs (begin, end) of its local tensor and where each
  // run starts in the Adam state. Replicated tensors are written by tp rank 0, the tied
  // embedding by the first stage; without ZeRO-1 DP rank 0 writes, with it each its own shard.
  // A MoE expert lives on one rank of each expert-parallel group: expert-DP rank 0 writes it
  // (under its global name, so any other ep can load it; ZeRO-1 runs only with ep 1).
  const int edp_rank = grid.expert_dp().rank();
  std::vector<std::pair<size_t, std::vector<std::array<size_t, 3>>>> plan;
  size_t total = kCheckpointShardMagic.size();
  for (size_t i = 0; i < store.size(); ++i) {
    const ParamInfo& info = store.info(i);
    if (info.spec.split == TpSplit::none && coord.tp != 0) continue;
    if (is_wte(info.spec.name) && coord.pp != 0) continue;
    std::vector<std::array<size_t, 3>> runs;
    if (!zero1) {
      if ((info.spec.expert ? edp_rank : coord.dp) == 0) runs.push_back({0, info.numel, info.offset});
    } else {
      for (const auto& r : opt.ranges()) {
        const size_t b = std::max(r.flat_offset, info.offset), e = std::min(r.flat_offset + r.count, info.offset + info.numel);
        if (b < e) runs.push_back({b - info.offset, e - info.offset, r.state_offset + (b - r.flat_offset)});
      }
    }
    for (const auto& run : runs) total += 3 * (run[1] - run[0]) * sizeof(float);
    if (!runs.empty()) plan.emplace_back(i, std::move(runs));
  }
  // One host buffer, kept from save to save: fresh pages are what makes a first copy slow.
  std::vector<std::byte> payload = std::move(staging_);
  payload.resize(total);
  std::memcpy(payload.data(), kCheckpointShardMagic.data(), kCheckpointShardMagic.size());
  CheckpointManifest part;
  const std::string file = rank_file(rank, "bin");
  size_t at = kCheckpointShardMagic.size();
  for (const auto& [i, runs] : plan) {
    const ParamInfo& info = store.info(i);
    for (const auto& [b, e, so] : runs) {
      // Straight from the backend into the reused buffer: no temporary host vectors.
      const size_t nbytes = (e - b) * sizeof(float);
      for (const StateKind kind : {StateKind::param, StateKind::exp_avg, StateKind::exp_avg_sq}) {
        part.slices.push_back({info.spec.name, kind, info.spec.full_shape, info.spec.split, coord.tp, tp,
                               static_cast<int64_t>(b), static_cast<int64_t>(e), file, at});
        const std::span<std::byte> dst(payload.data() + at, nbytes);
        if (kind == StateKind::param) store.param_to_host(i, b, e, dst);
        else opt.state_to_host(kind == StateKind::exp_avg ? 0 : 1, so, so + (e - b), dst);
        at += nbytes;
      }
    }
  }

  // The scalars of the whole state (the same on every rank; rank 0's copy becomes the manifest).
  part.iteration = iteration;
  part.consumed_samples = t_.consumed_samples();
  part.applied_steps = opt.applied_steps();
  part.skipped_steps = opt.skipped_steps();
  part.seed = cfg.seed;
  part.seq = *cfg.seq;
  part.model = t_.model_config();
  part.tp = cfg.tp, part.pp = cfg.pp, part.dp = grid.dp().size(), part.vpp = cfg.vpp, part.zero1 = zero1;
  part.schedule = std::string(schedule_kind_name(cfg.schedule));
  part.config_toml = to_toml(cfg);

  pending_ = std::make_unique<Pending>();
  pending_->stats.iteration = iteration;
  pending_->stats.bytes = total;
  pending_->stats.blocked_s = since(t0);
  pending_->stats.wait_s = t_sync;
  Pending* pd = pending_.get();
  const int keep = cfg.keep_last;
  pd->payload = std::move(payload);
  pd->thread = std::thread([=, part = std::move(part), committed = on_commit_]() mutable {
    const std::vector<std::byte>& payload = pd->payload;
    try {
      // Fault-injection hook for tests: hold the write back (tests/train/checkpoint_test.sh kill9).
      if (const auto ms = env_int_opt("TRIAX_CHECKPOINT_TEST_DELAY_MS", 0, 3'600'000))
        std::this_thread::sleep_for(std::chrono::milliseconds(*ms));
      const auto tw = Clock::now();
      {
        io::AtomicFile f((fs::path(tmp_dir) / file).string());
        f.write(payload);
        f.commit();
      }
      pd->stats.write_s = since(tw);
      part.files.push_back({file, payload.size(), io::sha256_hex(payload)});
      write_text_atomic((fs::path(tmp_dir) / rank_file(rank, "json")).string(), checkpoint_manifest_json(part));
      if (rank != 0) return;

      // Rank 0 commits: every rank's list of slices, then the manifest, then the rename.
      CheckpointManifest man = part;
      man.files.clear();
      man.slices.clear();
      const auto deadline = Clock::now() + commit_timeout();
      for (int r = 0; r < nranks; ++r) {
        const std::string p = (fs::path(tmp_dir) / rank_file(r, "json")).string();
        while (!fs::exists(p)) {
          if (pd->cancel) TRIAX_THROW(IoError, "{}: the run ended before every rank wrote its shard", tmp_dir);
          if (Clock::now() > deadline)
            TRIAX_THROW(IoError, "{}: rank {} did not finish its shard within {} s", tmp_dir, r,
                        std::chrono::duration<double>(commit_timeout()).count());
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        CheckpointManifest pr = parse_checkpoint_manifest(read_text(p), p);
        for (auto& f : pr.files) man.files.push_back(std::move(f));
        for (auto& s : pr.slices) man.slices.push_back(std::move(s));
      }
      write_text_atomic((fs::path(tmp_dir) / "manifest.json").string(), checkpoint_manifest_json(man));
      for (int r = 0; r < nranks; ++r) fs::remove(fs::path(tmp_dir) / rank_file(r, "json"));
      fsync_dir(tmp_dir);
      if (fs::exists(final_dir)) fs::remove_all(final_dir);  // an older save of this iteration
      fs::rename(tmp_dir, final_dir);
      fsync_dir(root);
      pd->stats.commit_s = since(t0);
      if (committed) {
        try {  // committed already: a metrics problem must not fail the save
          committed(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
        } catch (const std::exception& e) {
          log::warn("checkpoint {} committed, but reporting it to the metrics failed: {}", final_dir, e.what());
        }
      }
      uint64_t total = 0;
      for (const auto& f : man.files) total += f.bytes;
      log::info("saved checkpoint {} ({:.2f} MiB in {} files): training blocked {:.1f} ms ({:.1f} ms waiting for "
                "the previous save, {:.1f} ms host copy), rank 0 wrote {:.2f} MiB in {:.1f} ms ({:.0f} MiB/s), "
                "committed {:.1f} ms after the save began",
                final_dir, total / 1048576.0, man.files.size(), pd->stats.blocked_s * 1e3, pd->stats.wait_s * 1e3,
                (pd->stats.blocked_s - pd->stats.wait_s) * 1e3,
                pd->stats.bytes / 1048576.0, pd->stats.write_s * 1e3,
                pd->stats.bytes / 1048576.0 / std::max(pd->stats.write_s, 1e-9), pd->stats.commit_s * 1e3);
      // Old checkpoints go only now that the new one is committed.
      if (keep > 0) {
        const auto all = list_checkpoints(root);
        for (size_t k = static_cast<size_t>(keep); k < all.size(); ++k) fs::remove_all(all[k].second);
      }
    } catch (...) {
      pd->error = std::current_exception();
    }
  });
}

bool Checkpointer::after_iteration() {
  const TrainConfig& cfg = t_.config();
  if (cfg.save.empty()) return false;
  double sig = stop_signal_received();
  t_.grid().world().all_reduce(std::span<double>(&sig, 1), ReduceOp::max).wait();
  const int64_t it = t_.iteration();
  const bool stop = sig > 0 && it < cfg.train_iters;
  if (stop || it >= cfg.train_iters || (cfg.save_interval > 0 && it % cfg.save_interval == 0)) save();
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

struct Restored {
  std::vector<std::vector<float>> params;  // per store index
  std::vector<float> m, v;                 // the optimizer's layout
  const CheckpointManifest* manifest = nullptr;
};

class CheckpointReader {
 public:
  explicit CheckpointReader(std::string dir) : dir_(std::move(dir)) {
    const std::string path = (fs::path(dir_) / "manifest.json").string();
    man_ = parse_checkpoint_manifest(read_text(path), path);
    for (const auto& s : man_.slices) index_[{s.name, static_cast<int>(s.kind)}].push_back(&s);
    for (const auto& f : man_.files) files_[f.name] = &f;
  }
  const CheckpointManifest& manifest() const { return man_; }
  // Every file is verified by some rank, also those no rank needs slices from: file k by rank k % n.
  void verify_share(int rank, int nranks) {
    for (size_t k = 0; k < man_.files.size(); ++k)
      if (static_cast<int>(k % static_cast<size_t>(nranks)) == rank) bytes(man_.files[k].name);
  }

  // The tensor `name` of `kind` at its full shape `want` (assembled from the slices of every old
  // tp rank; the padded vocabulary rows may differ in number).
  std::vector<float> full(const std::string& name, StateKind kind, const std::vector<int64_t>& want, TpSplit split) {
    auto it = index_.find({name, static_cast<int>(kind)});
    if (it == index_.end())
      TRIAX_THROW(IoError, "{}: no slice of tensor '{}' ({}) in the manifest: a missing shard, or a checkpoint of "
                           "another model", dir_, name, state_kind_name(kind));
    const CheckpointSlice& s0 = *it->second.front();
    for (const auto* s : it->second)
      if (s->full_shape != s0.full_shape || s->split != s0.split || s->tp_size != s0.tp_size)
        TRIAX_THROW(IoError, "{}: the slices of tensor '{}' disagree on its shape, split or tp size", dir_, name);
    if (s0.split != split)
      TRIAX_THROW(IoError, "{}: tensor '{}' is split differently in the checkpoint than in this model: an "
                           "incompatible layout or another model", dir_, name);
    const auto& old = s0.full_shape;
    const int old_tp = s0.tp_size;
    const auto local_shape = shard_shape(old, split, old_tp, name);
    const size_t local_n = static_cast<size_t>(numel_of(local_shape));
    std::vector<float> full(static_cast<size_t>(numel_of(old)));
    const int ranks = split == TpSplit::none ? 1 : old_tp;
    for (int r = 0; r < ranks; ++r) {
      std::vector<float> local(local_n);
      std::vector<uint8_t> seen(local_n, 0);
      for (const auto* s : it->second) {
        if (s->tp_rank != r) continue;
        const auto vals = checkpoint_slice_values(bytes(s->file), *s);
        for (int64_t k = s->begin; k < s->end; ++k) {
          if (seen[static_cast<size_t>(k)])
            TRIAX_THROW(IoError, "{}: element {} of tensor '{}' ({}) of tp rank {} is in two slices", dir_, k, name,
                        state_kind_name(kind), r);
          seen[static_cast<size_t>(k)] = 1;
        }
        std::copy(vals.begin(), vals.end(), local.begin() + s->begin);
      }
      if (const auto hole = std::find(seen.begin(), seen.end(), 0); hole != seen.end())
        TRIAX_THROW(IoError, "{}: element {} of tensor '{}' ({}) of tp rank {} of {} is in no file: a missing shard",
                    dir_, hole - seen.begin(), name, state_kind_name(kind), r, old_tp);
      if (split == TpSplit::none) full = std::move(local);
      else place_shard(local, full, old, split, r, old_tp);
    }
    if (old == want) return full;
    // The padded vocabulary depends on tp: keep the real rows, the padding rows are zero.
    const bool rows_only = old.size() == want.size() && old.size() >= 1 &&
                           std::equal(old.begin() + 1, old.end(), want.begin() + 1);
    if (!is_wte(name) || !rows_only || std::min(old[0], want[0]) < man_.model.vocab)
      TRIAX_THROW(IoError, "{}: tensor '{}' has shape {} in the checkpoint but {} in this model", dir_, name,
                  io::shape_string(old), io::shape_string(want));
    const size_t row = static_cast<size_t>(numel_of(old) / old[0]);
    std::vector<float> out(static_cast<size_t>(numel_of(want)), 0.0f);
    const size_t keep = static_cast<size_t>(std::min(old[0], want[0])) * row;
    std::copy_n(full.begin(), keep, out.begin());
    return out;
  }

 private:
  const std::vector<std::byte>& bytes(const std::string& file) {
    auto c = cache_.find(file);
    if (c != cache_.end()) return c->second;
    return cache_.emplace(file, read_checkpoint_file(dir_, *files_.at(file))).first->second;
  }
  std::string dir_;
  CheckpointManifest man_;
  SliceIndex index_;
  std::map<std::string, const CheckpointFileInfo*> files_;
  std::map<std::string, std::vector<std::byte>> cache_;
};

// Everything this rank needs from checkpoint `dir`, read and checked before anything changes.
Restored read_state(CheckpointReader& rd, Trainer& t, const std::string& dir) {
  const CheckpointManifest& man = rd.manifest();
  const GptConfig& a = man.model;
  const GptConfig& b = t.model_config();
  if (a.n_layer != b.n_layer || a.n_head != b.n_head || a.n_embd != b.n_embd || a.ffn_size() != b.ffn_size() ||
      a.vocab != b.vocab || a.max_seq != b.max_seq || a.tied_embeddings != b.tied_embeddings)
    TRIAX_THROW(IoError, "{}: a checkpoint of another model: it holds {}, this run trains {}", dir, a.describe(),
                b.describe());
  const TrainConfig& cfg = t.config();
  if (man.seed != cfg.seed || man.seq != *cfg.seq)
    TRIAX_THROW(IoError, "{}: written with --seed {} and --seq-length {}, this run has --seed {} and --seq-length {} "
                         "(the data order and position depend on both)", dir, man.seed, man.seq, cfg.seed, *cfg.seq);
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
      const auto full = rd.full(info.spec.name, k, info.spec.full_shape, info.spec.split);
      return shard_of(full, info.spec.full_shape, info.spec.split, tr, tp);
    };
    r.params.push_back(local(StateKind::param));
    const auto lm = local(StateKind::exp_avg), lv = local(StateKind::exp_avg_sq);
    if (!opt.zero1()) {
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

}  // namespace

int64_t Checkpointer::resume() {
  const TrainConfig& cfg = t_.config();
  if (cfg.load.empty()) return -1;
  Communicator& world = t_.grid().world();
  const bool root = world.rank() == 0;
  const auto found = list_checkpoints(cfg.load);
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
    const std::string& dir = found[k].second;
    std::string err;
    std::optional<CheckpointReader> rd;
    Restored r;
    try {
      rd.emplace(dir);
      r = read_state(*rd, t_, dir);
      rd->verify_share(world.rank(), world.size());
    } catch (const Error& e) {
      err = e.what();
    }
    double bad = err.empty() ? 0.0 : 1.0;
    world.all_reduce(std::span<double>(&bad, 1), ReduceOp::max).wait();
    if (bad == 0) {
      const CheckpointManifest& m = *r.manifest;
      ParamStore& store = t_.store();
      for (size_t i = 0; i < store.size(); ++i) store.param_from_host(i, r.params[i]);
      t_.optimizer().state_from_host(0, r.m);
      t_.optimizer().state_from_host(1, r.v);
      t_.optimizer().set_step_counts(m.applied_steps, m.skipped_steps);
      t_.restore_progress(m.iteration, m.consumed_samples);
      if (root) {
        std::error_code ec;  // the manifest is written last: its time is the commit time
        const auto mt = fs::last_write_time(fs::path(dir) / "manifest.json", ec);
        if (!ec)
          loaded_commit_unix_s_ = std::chrono::duration<double>(
              std::chrono::file_clock::to_sys(mt).time_since_epoch()).count();
      }
      if (root)
        log::info("resumed from {}: iteration {}, {} consumed samples (written at tp {} pp {} dp {}{}, loaded at tp "
                  "{} pp {} dp {}{})", dir, m.iteration, m.consumed_samples, m.tp, m.pp, m.dp,
                  m.zero1 ? " zero1" : "", cfg.tp, cfg.pp, t_.grid().dp().size(), cfg.zero1 ? " zero1" : "");
      return m.iteration;
    }
    if (!err.empty()) log::warn("checkpoint {} refused: {}", dir, err);
    else if (root) log::warn("checkpoint {} refused by another rank (its log says why)", dir);
    if (root && k + 1 < found.size()) log::warn("falling back to the previous checkpoint {}", found[k + 1].second);
  }
  TRIAX_THROW(IoError, "--load {}: none of its {} checkpoints can be loaded (the log names each problem)", cfg.load,
              found.size());
}

}  // namespace triax
