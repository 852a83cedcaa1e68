// Elastic training under torchrun's agent: the worker's side (include/triax/train/elastic.h).
#include "triax/train/elastic.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <exception>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "triax/core/env.h"
#include "triax/core/error.h"
#include "triax/core/log.h"
#include "triax/io/atomic_file.h"
#include "triax/train/metrics_exporter.h"  // unix_now_s

namespace triax {

namespace fs = std::filesystem;

namespace {

// What elastic_note_interruption needs on the way out, set at start-up (no environment reads and
// no allocation-heavy work on a failure path).
struct ExitRecord {
  std::mutex mu;
  std::string error_file;   // TORCHELASTIC_ERROR_FILE
  std::string dir;          // --save/elastic ("" : none)
  int attempt = 0;
  int rank = -1;
  bool written = false;
};
ExitRecord& exit_record() {
  static ExitRecord r;
  return r;
}

// Writes `text` to `path` through a temporary file and link(2): the first writer wins, a later
// one (EEXIST) leaves the record alone. Never throws.
void write_first(const std::string& path, const std::string& text) noexcept {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (ok) (void)::link(tmp.c_str(), path.c_str());
  ::unlink(tmp.c_str());
}

std::string interruption_path(const std::string& dir, int attempt) {
  return (fs::path(dir) / fmt::format("interrupted.{}.json", attempt)).string();
}

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string clock_time(double unix_s) {
  const auto t = static_cast<std::time_t>(unix_s);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::array<char, 32> buf{};
  std::strftime(buf.data(), buf.size(), "%H:%M:%S UTC", &tm);
  return buf.data();
}

}  // namespace

std::optional<ElasticLaunch> elastic_launch_from_env(int rank, int world_size) {
  const auto run_id = env_string_opt("TORCHELASTIC_RUN_ID", "torchrun's rendezvous id");
  if (!run_id) return std::nullopt;
  ElasticLaunch l;
  l.run_id = *run_id;
  l.restart_count = static_cast<int>(env_int("TORCHELASTIC_RESTART_COUNT", 0, 1 << 30, 0));
  l.max_restarts = static_cast<int>(env_int("TORCHELASTIC_MAX_RESTARTS", 0, 1 << 30, 0));
  if (l.restart_count > l.max_restarts)
    TRIAX_THROW(ConfigError, "TORCHELASTIC_RESTART_COUNT={} exceeds TORCHELASTIC_MAX_RESTARTS={}", l.restart_count,
                l.max_restarts);
  l.local_world_size = static_cast<int>(env_int("LOCAL_WORLD_SIZE", 1, world_size, 1));
  l.group_rank = static_cast<int>(env_int("GROUP_RANK", 0, world_size - 1, 0));
  env_int_opt("LOCAL_RANK", 0, l.local_world_size - 1,
              fmt::format("0 <= LOCAL_RANK < LOCAL_WORLD_SIZE={}", l.local_world_size));
  l.error_file = env_string("TORCHELASTIC_ERROR_FILE", "");
  l.max_world_size = max_world_size_from_env(world_size, l.local_world_size);
  std::lock_guard lock(exit_record().mu);
  exit_record().error_file = l.error_file;
  exit_record().rank = rank;
  return l;
}

int max_world_size_from_env(int world_size, int local_world_size) {
  if (const auto m = env_int_opt("TRIAX_MAX_WORLD_SIZE", 1, 1 << 24, "the most ranks the job may grow to")) {
    if (*m < world_size)
      TRIAX_THROW(ConfigError, "TRIAX_MAX_WORLD_SIZE={} is below the world size {}; expected the most ranks the job "
                  "may grow to", *m, world_size);
    return static_cast<int>(*m);
  }
  if (const auto n = env_string_opt("PET_NNODES", "torchrun's --nnodes, N or MIN:MAX")) {
    const size_t colon = n->find(':');
    const std::string max_text = colon == std::string::npos ? *n : n->substr(colon + 1);
    const int64_t nodes = parse_env_int("PET_NNODES", max_text, 1, 1 << 20, "N or MIN:MAX with 1 <= MAX");
    if (colon != std::string::npos) {
      (void)parse_env_int("PET_NNODES", n->substr(0, colon), 1, nodes, "MIN:MAX with 1 <= MIN <= MAX");
    }
    return std::max(world_size, static_cast<int>(nodes) * std::max(local_world_size, 1));
  }
  return world_size;
}

std::string describe_layout(int tp, int pp, int dp, int cp) {
  return cp > 1 ? fmt::format("tp {} x cp {} x pp {} x dp {}", tp, cp, pp, dp)
                : fmt::format("tp {} x pp {} x dp {}", tp, pp, dp);
}

void end_with_agent() {
  if (!env_set("TORCHELASTIC_RUN_ID")) return;
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The agent may have died before the call: then the parent is already someone else.
  if (::getppid() != parent || parent == 1) ::raise(SIGTERM);
}

double agent_signal_grace_s() {
  return env_seconds("PET_MONITOR_INTERVAL", 0, 3600, 5.0) + 1.0;
}

std::string elastic_state_json(const ElasticState& s) {
  nlohmann::json j{{"run_id", s.run_id},
                   {"attempt", s.attempt},
                   {"world", s.world},
                   {"layout", s.layout},
                   {"attempt_start_unix_s", s.attempt_start_unix_s},
                   {"iteration", s.iteration},
                   {"iteration_unix_s", s.iteration_unix_s},
                   {"mean_iteration_s", s.mean_iteration_s},
                   {"saves", s.saves}};
  return j.dump() + "\n";
}

ElasticState parse_elastic_state(std::string_view text, const std::string& source) {
  ElasticState s;
  try {
    const auto j = nlohmann::json::parse(text);
    s.run_id = j.at("run_id").get<std::string>();
    s.attempt = j.at("attempt").get<int>();
    s.world = j.at("world").get<int>();
    s.layout = j.at("layout").get<std::string>();
    s.attempt_start_unix_s = j.at("attempt_start_unix_s").get<double>();
    s.iteration = j.at("iteration").get<int64_t>();
    s.iteration_unix_s = j.at("iteration_unix_s").get<double>();
    s.mean_iteration_s = j.at("mean_iteration_s").get<double>();
    s.saves = j.at("saves").get<std::vector<std::pair<int64_t, double>>>();
  } catch (const nlohmann::json::exception& e) {
    TRIAX_THROW(IoError, "{}: not an elastic state record: {}", source, e.what());
  }
  if (s.attempt < 1 || s.world < 1)
    TRIAX_THROW(IoError, "{}: not an elastic state record: attempt {} and world {} must be >= 1", source, s.attempt,
                s.world);
  return s;
}

ElasticStart describe_elastic_start(const ElasticLaunch& launch, const std::optional<ElasticState>& prev,
                                    const std::optional<Interruption>& why, const std::string& layout, int world,
                                    int64_t resumed_iteration) {
  ElasticStart s;
  const bool same_run = prev && prev->run_id == launch.run_id;
  s.attempt = same_run ? prev->attempt + 1 : 1;
  const std::string restart = fmt::format("restart {} of {}", launch.restart_count, launch.max_restarts);
  const std::string now = fmt::format("{} (world {})", layout, world);
  const std::string from = resumed_iteration >= 0 ? fmt::format("resumed from iteration {}", resumed_iteration)
                                                   : std::string("no checkpoint: starting at iteration 0");
  if (!same_run) {
    s.line = fmt::format("elastic: attempt 1 of run '{}' ({}): {}; {}", launch.run_id, restart, now, from);
    if (prev && prev->iteration >= 0)
      s.line += fmt::format(" (the progress record under --save is of run '{}', not this one)", prev->run_id);
    return s;
  }
  s.line = fmt::format("elastic: attempt {} of run '{}' ({}): {} (world {}) -> {}; {}", s.attempt, launch.run_id,
                       restart, prev->layout, prev->world, now, from);
  const int64_t base = std::max<int64_t>(resumed_iteration, 0);
  if (prev->iteration >= base) {
    s.lost_iterations = prev->iteration - base;
    const auto save = std::find_if(prev->saves.rbegin(), prev->saves.rend(),
                                   [&](const auto& p) { return p.first == base; });
    bool estimated = false;
    if (s.lost_iterations == 0) {
      s.lost_s = 0;
    } else if (save != prev->saves.rend()) {
      s.lost_s = std::max(0.0, prev->iteration_unix_s - save->second);
    } else if (base == 0 && prev->attempt_start_unix_s > 0 && prev->attempt == 1) {
      s.lost_s = std::max(0.0, prev->iteration_unix_s - prev->attempt_start_unix_s);
    } else {
      s.lost_s = static_cast<double>(s.lost_iterations) * prev->mean_iteration_s;
      estimated = true;
    }
    s.line += fmt::format("; lost {} iteration{} ({}{:.1f} s of training) done after the last save", s.lost_iterations,
                          s.lost_iterations == 1 ? "" : "s", estimated ? "about " : "", s.lost_s);
  }
  if (why)
    s.line += fmt::format("; attempt {} ended at {}: rank {}: {}", prev->attempt, clock_time(why->unix_s), why->rank,
                          why->what);
  return s;
}

ElasticRun::ElasticRun(ElasticLaunch launch, std::string save_dir, Communicator& world, std::string layout,
                       int64_t resumed_iteration, double process_start_unix_s)
    : launch_(std::move(launch)), root_(world.rank() == 0), process_start_unix_s_(process_start_unix_s) {
  if (!save_dir.empty()) dir_ = (fs::path(save_dir) / "elastic").string();
  double attempt = 1;
  if (root_) {
    if (!dir_.empty()) {
      std::error_code ec;
      fs::create_directories(dir_, ec);
      if (ec) TRIAX_THROW(IoError, "--save {}: cannot create {}: {}", save_dir, dir_, ec.message());
      if (const auto text = read_text((fs::path(dir_) / "state.json").string())) {
        try {
          prev_ = parse_elastic_state(*text, (fs::path(dir_) / "state.json").string());
        } catch (const IoError& e) {
          log::warn("elastic: {} (ignored: this attempt counts as the first)", e.what());
        }
      }
      if (prev_ && prev_->run_id == launch_.run_id) {
        if (const auto text = read_text(interruption_path(dir_, prev_->attempt))) {
          try {
            const auto j = nlohmann::json::parse(*text);
            why_ = Interruption{j.at("attempt").get<int>(), j.at("rank").get<int>(), j.at("unix_s").get<double>(),
                                j.at("what").get<std::string>()};
          } catch (const nlohmann::json::exception&) {
            // a record cut short by a dying node: the line goes without it
          }
        }
      }
    }
    start_ = describe_elastic_start(launch_, prev_, why_, layout, world.size(), resumed_iteration);
    if (dir_.empty()) start_.line += "; no --save: a restart starts over from iteration 0";
    attempt = start_.attempt;
  }
  world.all_reduce(std::span<double>(&attempt, 1), ReduceOp::max).wait();
  start_.attempt = static_cast<int>(attempt);
  state_.run_id = launch_.run_id;
  state_.attempt = start_.attempt;
  state_.world = world.size();
  state_.layout = std::move(layout);
  state_.attempt_start_unix_s = unix_now_s();
  if (prev_ && prev_->run_id == launch_.run_id) state_.saves = prev_->saves;
  first_iteration_start_unix_s_ = state_.attempt_start_unix_s;
  {
    std::lock_guard lock(exit_record().mu);
    exit_record().dir = dir_;
    exit_record().attempt = start_.attempt;
    exit_record().rank = world.rank();
  }
  if (root_ && !dir_.empty()) {
    // Older attempts' records are history now.
    std::error_code ec;
    for (int a = 1; a < start_.attempt - 1; ++a) fs::remove(interruption_path(dir_, a), ec);
    write_state();
  }
}

ElasticRun::~ElasticRun() {
  // Unwinding for an error: the worker's handler notes the interruption after this object is gone
  // (train_gpt's catch), so the record keeps pointing at --save/elastic.
  if (std::uncaught_exceptions() > 0) return;
  std::lock_guard lock(exit_record().mu);
  exit_record().dir.clear();
}

void ElasticRun::write_state() {
  if (dir_.empty()) return;
  try {
    io::AtomicFile f((fs::path(dir_) / "state.json").string(), io::unique_tmp_suffix());
    const std::string text = elastic_state_json(state_);
    f.write(std::as_bytes(std::span(text)));
    f.commit();
  } catch (const std::exception& e) {
    log::warn("elastic: the progress record was not written: {}", e.what());
  }
}

std::string ElasticRun::iteration_done(int64_t iteration) {
  if (!root_) return {};
  const double now = unix_now_s();
  ++iterations_;
  state_.iteration = iteration;
  state_.iteration_unix_s = now;
  state_.mean_iteration_s = (now - first_iteration_start_unix_s_) / static_cast<double>(iterations_);
  last_iteration_unix_s_ = now;
  write_state();
  if (iterations_ != 1 || !prev_ || prev_->run_id != launch_.run_id) return {};
  // The previous attempt ended when its first rank said so; without a record (every rank of it
  // died at once), at its last iteration at the latest.
  const double from = why_ ? why_->unix_s : prev_->iteration_unix_s;
  recovery_s_ = std::max(0.0, now - from);
  const double agent_s = std::max(0.0, process_start_unix_s_ - from);
  const double startup_s = std::max(0.0, first_iteration_start_unix_s_ - process_start_unix_s_);
  return fmt::format("elastic: training resumed {:.1f} s after {}: {:.1f} s until this attempt's workers started "
                     "(the agents noticing, stopping the old workers, the rendezvous), {:.1f} s start-up and resume, "
                     "{:.1f} s for iteration {} at world {}",
                     recovery_s_, why_ ? fmt::format("attempt {} ended", prev_->attempt)
                                       : fmt::format("attempt {}'s last iteration", prev_->attempt),
                     agent_s, startup_s, std::max(0.0, now - first_iteration_start_unix_s_), iteration, state_.world);
}

void ElasticRun::save_started(int64_t iteration) {
  if (!root_) return;
  state_.saves.emplace_back(iteration, unix_now_s());
  if (state_.saves.size() > 16) state_.saves.erase(state_.saves.begin());
}

void elastic_note_interruption(std::string_view what) noexcept {
  try {
    ExitRecord& r = exit_record();
    std::lock_guard lock(r.mu);
    if (r.written) return;
    r.written = true;
    const double now = unix_now_s();
    if (!r.dir.empty())
      write_first(interruption_path(r.dir, r.attempt),
                  nlohmann::json{{"attempt", r.attempt}, {"rank", r.rank}, {"unix_s", now}, {"what", what}}.dump() + "\n");
    if (!r.error_file.empty()) {
      // torch.distributed.elastic's own format: {"message": ..., "timestamp": ...}.
      const std::string text =
          nlohmann::json{{"message", fmt::format("triax rank {}: {}", r.rank, what)},
                         {"timestamp", static_cast<int64_t>(now)}}.dump();
      const std::string tmp = r.error_file + ".tmp";
      if (std::FILE* f = std::fopen(tmp.c_str(), "w")) {
        const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
        if (std::fclose(f) == 0 && ok) std::rename(tmp.c_str(), r.error_file.c_str());
      }
    }
  } catch (...) {
    // on the way out: nothing more to do
  }
}

}  // namespace triax
