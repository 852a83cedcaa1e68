// train_gpt: 3D-parallel GPT training on the CPU path, launched by mpirun.
//   mpirun -np 8 train_gpt --tp 2 --pp 2 --dp 2
// With no flags it trains the tiny model on a built-in generated language. Flags may also come
// from a TOML file (--config FILE; keys are the flag names in sections, e.g. [training]
// micro-batch-size = 4; docs/TRAINING.md); flags
// given on the command line win. Rank 0 prints the resolved configuration (itself a --config
// file of this run), then one line per iteration (Megatron's field names) and, with
// --metrics-jsonl, one JSON object per iteration. Exit codes: docs/ERRORS.md.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <csignal>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include <triax/core/log.h>
#include <triax/core/log_json.h>
#include <triax/distributed/bootstrap/bootstrap.h>
#include <triax/distributed/failure/flight_recorder.h>
#include <triax/distributed/failure/job_failure.h>
#include <triax/faults/watchdog.h>
#include <triax/model/hf_dir.h>
#include <triax/model/weight_file.h>
#include <triax/checkpoint/checkpoint.h>
#include <triax/checkpoint/manifest.h>
#include <triax/config/train_config.h>
#include <triax/train/metrics_exporter.h>
#include <triax/train/elastic.h>
#include <triax/train/run_summary.h>
#include <triax/train/trainer.h>

#if defined(TRIAX_HAVE_MPI)
#include <mpi.h>
#endif

namespace {

constexpr const char* kProgram = "train_gpt";
// Set once this rank reports a failure or a stall: a peer death noticed afterwards (rank 0
// ending the job after printing the verdict) is the job ending, not news worth a message.
std::atomic<bool> g_ending{false};

[[noreturn]] void end_job(const triax::JobFailure& f, std::unique_ptr<triax::Bootstrap>& boot) {
  if (!f.message.empty()) triax::log::emit(stderr, triax::log::Level::error, f.message);  // JSON under TRIAX_LOG_FORMAT=json
  std::fflush(stderr);
#if defined(TRIAX_HAVE_MPI)
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  // Another rank may be blocked in a collective waiting for this one: end the whole job now. Leaving
  // without MPI_Finalize makes every launcher (mpirun, srun) stop the other ranks and return this
  // code; MPI_Abort would do the same but Open MPI 4.1 sometimes adds ORTE_ERROR_LOG noise to it.
  if (f.abort_job && inited && !finalized) std::_Exit(f.exit_code);
#endif
  // Without mpirun (the TCP rendezvous) a rank that leaves without a goodbye is how the others
  // learn that the job ends (their peer watch ends them quietly once they report themselves).
  if (f.abort_job) std::_Exit(f.exit_code);
  boot.reset();  // every rank failed alike: finalize cleanly, no abort banner
  std::exit(f.exit_code);
}

// Writes all of `text` to `f`; IoError naming the file when the write or flush fails.
void write_all(std::FILE* f, std::string_view text, const std::string& name) {
  if (std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fflush(f) != 0)
    throw triax::IoError(fmt::format("{}: write failed: {}", name, std::strerror(errno)));
}

// One line of the job's standard output: as it is, or (TRIAX_LOG_FORMAT=json) one JSON record with
// `fields_json` attached. IoError when the write fails.
void print_line(std::string_view text, std::string_view fields_json = {}) {
  if (triax::log::format() == triax::log::Format::json) {
    triax::log::emit(stdout, triax::log::Level::info, text, fields_json);
    if (std::ferror(stdout)) throw triax::IoError(fmt::format("standard output: write failed: {}", std::strerror(errno)));
  } else {
    write_all(stdout, std::string(text) + "\n", "standard output");
  }
}

// The end-of-run summary on rank 0's standard output (one JSON record under TRIAX_LOG_FORMAT=json).
void print_summary(const triax::RunSummary& s, std::chrono::steady_clock::time_point wall0) {
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  std::string text = s.text(wall);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  print_line(text, s.json(wall));
}

// --export-hf: the whole model gathered to world rank 0, which writes it (collective over the
// world). Under ZeRO-1/2 with a compute copy the step gathers only the copy, so the masters are
// gathered first (a DP collective; nothing to do otherwise). Under ZeRO-3 no rank holds a whole
// master: each is assembled from the shard group by full_master(i), a collective every rank of
// the group calls in the same order (gather_full_tensors asks for parameters 0, 1, ... on every
// rank, and the ranks of a shard group hold the same parameters).
void export_hf(triax::Trainer& trainer, const std::string& path) {
  triax::Optimizer& opt = trainer.optimizer();
  triax::ParamStore& store = trainer.store();
  const triax::GptConfig& m = trainer.model_config();
  if (!m.is_gpt2()) triax::check_hf_llama(m);  // every rank, before the collectives
  opt.gather_master_weights();
  const bool sharded_params = opt.zero_level() == 3;
  const triax::FullWeights w = triax::gather_full_tensors(
      store, trainer.grid().tp(), trainer.grid().world(),
      [&](size_t i) { return sharded_params ? opt.sharding().full_master(i) : store.param_to_host(i); });
  triax::write_on_rank0(trainer.grid().world(), [&] {
    if (m.is_gpt2()) triax::write_hf_safetensors(path, m, w);
    else triax::write_hf_dir(path, m, w);
  });
  if (trainer.grid().world().rank() == 0)
    triax::log::info("exported the model to {} ({})", path,
                     m.is_gpt2() ? "HF GPT2LMHeadModel safetensors" : "HF LlamaForCausalLM directory");
}

}  // namespace

int main(int argc, char** argv) {
  triax::CommandLine cl;
  try {
    cl = triax::parse_train_command_line(argc, argv, kProgram,
                                         "triax train_gpt: tensor x pipeline x data parallel GPT training (CPU path)");
  } catch (const std::exception& e) {
    // Every rank parses the same flags: only the launcher's rank 0 says what is wrong.
    const int code = triax::exit_code_for(e);
    if (triax::launcher_rank() == 0)
      std::fprintf(stderr, "%s: %s: %s\n", kProgram, std::string(triax::exit_code_name(code)).c_str(), e.what());
    std::fflush(stderr);
    return triax::exit_before_mpi(code);
  }
  if (cl.help) {
    if (triax::launcher_rank() == 0) std::fputs(cl.help_text.c_str(), stdout);
    return 0;
  }
  const triax::TrainConfig& c = cl.cfg;

  // The bootstrap outlives the try: an error on one rank must reach end_job (MPI_Abort) while
  // MPI is still up, not wait in MPI_Finalize for ranks blocked in a collective.
  std::unique_ptr<triax::Bootstrap> boot;
  // Rank 0's end-of-run summary, from the first iteration on; printed on every exit that prints.
  std::optional<triax::RunSummary> summary;
  const auto wall0 = std::chrono::steady_clock::now();
  const auto started = std::chrono::system_clock::now();  // dumps older than this are another job's
  try {
    boot = triax::Bootstrap::create();
    // Without mpirun (TCP rendezvous) a dead rank is named by the peer watch (docs/FAULTS.md).
    boot->watch_peers([](const std::string& msg) {
      // First wins: a rank whose own call already failed may exit here before its main thread
      // reaches the handler that would note it, and the next attempt's line would lack the cause.
      triax::elastic_note_interruption("peer failure: " + msg);
      // A rank whose own call already failed or timed out is reporting that (its main thread may
      // still be unwinding through the communicators' destructors).
      if (!g_ending.exchange(true) && !triax::flight_recorder_saw_failure()) {
        triax::dump_flight_recorder("peer failure: " + msg);  // every rank dumps, not only the failing one
        std::fprintf(stderr, "%s: communication error: %s\n", kProgram, msg.c_str());
        std::fflush(stderr);
      }
      std::_Exit(triax::kExitComm);
    });
    auto world = boot->world();
    const int rank = world->rank();
    triax::log::set_rank(world->size() > 1 ? rank : -1);
    // Before the trainer exists: a signal during start-up must not kill the job either.
    if (!c.save.empty()) triax::install_stop_signal_handlers();
    // Under torchrun's elastic agent (docs/FAULTS.md): its facts, and this worker ends with it.
    const std::optional<triax::ElasticLaunch> elastic = triax::elastic_launch_from_env(rank, world->size());
    if (elastic) triax::end_with_agent();
    // An unusable --save or --load ends the job now, not at the first save; a resume keeps the
    // checkpoint's batch settings unless the flags give others.
    triax::check_checkpoint_paths(c, *world);
    triax::Trainer trainer(world, triax::with_checkpoint_batch(c, rank == 0));
    // A stall (--stall-timeout): every rank's watchdog has dumped its flight recorder; rank 0
    // waits for the others' dumps and prints triax-fr's verdict, then the job ends (exit 4).
    trainer.set_stall_handler([rank, size = world->size(), started](const std::string& msg) {
      g_ending = true;
      triax::elastic_note_interruption(msg);
      std::fprintf(stderr, "%s: %s\n", kProgram, msg.c_str());
      std::fflush(stderr);
      if (rank == 0) {
        for (const auto& line : triax::stall_verdict(size, started, std::chrono::seconds(3)))
          std::fprintf(stderr, "%s: triax-fr: %s\n", kProgram, line.c_str());
        std::fflush(stderr);
      } else {
        // Rank 0 reads this rank's dump meanwhile and ends the job; it may first spend settle_failure's
        // 5 s when its own collective timed out rather than stalled (docs/FAULTS.md).
        std::this_thread::sleep_for(std::chrono::seconds(15));
      }
      std::_Exit(triax::kExitComm);
    });
    // Declared before the checkpointer: a save still writing when an error unwinds calls into it.
    std::unique_ptr<triax::MetricsExporter> exporter;
    triax::Checkpointer checkpoints(trainer);
    const int64_t resumed = checkpoints.resume();
    summary.emplace(trainer);
    // Elastic: the line that says which attempt this is, the layout before and now, and the work
    // lost; the progress record under --save (collective: the attempt number is agreed).
    std::optional<triax::ElasticRun> elastic_run;
    const triax::TrainConfig& rc = trainer.config();
    if (elastic) {
      elastic_run.emplace(*elastic, c.save, *world,
                          triax::describe_layout(rc.tp, rc.pp, trainer.grid().layout().shape().dp, rc.cp), resumed,
                          std::chrono::duration<double>(started.time_since_epoch()).count());
      if (rank == 0) print_line(elastic_run->start().line);
      checkpoints.on_save_start([&elastic_run](int64_t it) { elastic_run->save_started(it); });
    }
    std::FILE* jsonl = nullptr;
    struct Closer {
      std::FILE*& f;
      ~Closer() {
        if (f) std::fclose(f);
      }
    } closer{jsonl};
    if (rank == 0) {
      const std::string run = triax::describe_run(trainer);
      if (triax::log::format() == triax::log::Format::json) {
        print_line("run", nlohmann::json{{"run", run}}.dump());
        print_line("resolved configuration", nlohmann::json{{"config", trainer.resolved_config()}}.dump());
      } else {
        write_all(stdout, run + trainer.resolved_config(), "standard output");
      }
      if (!c.metrics_jsonl.empty()) {
        jsonl = std::fopen(c.metrics_jsonl.c_str(), "w");
        if (!jsonl)
          throw triax::IoError(fmt::format("--metrics-jsonl {}: cannot open for writing: {}", c.metrics_jsonl,
                                           std::strerror(errno)));
      }
    }
    if (c.metrics_port || !c.metrics_textfile.empty()) {
      triax::MetricsExporterConfig prom;
      prom.port = c.metrics_port.value_or(-1);
      prom.bind = c.metrics_bind;
      prom.textfile = c.metrics_textfile;
      prom.local_world_size = elastic ? elastic->local_world_size : 1;
      prom.world_size_max = elastic ? elastic->max_world_size
                                    : triax::max_world_size_from_env(world->size(), prom.local_world_size);
      prom.attempt = elastic_run ? elastic_run->start().attempt : 0;
      exporter = std::make_unique<triax::MetricsExporter>(world, prom, rc.tp, rc.pp, trainer.grid().layout().shape().dp);
      // Checkpoint age for the TrainingCheckpointTooOld alert: rank 0's commit times, and the
      // expected interval from --save-interval and the iterations' mean time.
      if (!c.save.empty() || !c.load.empty()) checkpoints.on_commit([e = exporter.get()](double t) { e->checkpoint_saved(t); });
    }
    double step_s_sum = 0;
    int64_t steps = 0;
    bool stopped = false;
    trainer.train([&](const triax::IterationMetrics& m) {
      if (exporter) {
        step_s_sum += m.elapsed_ms / 1e3;
        ++steps;
        if (!c.save.empty() && c.save_interval > 0)
          exporter->set_checkpoint_interval(static_cast<double>(c.save_interval) * step_s_sum / static_cast<double>(steps));
        exporter->observe(m, {trainer.last_step().compute_s, trainer.last_step().p2p_wait_s,
                              trainer.last_report().sync.exposed_s + trainer.last_report().gather_s});
      }
      summary->add(m);
      if (rank != 0) return;
      print_line(m.log_line(), m.json());
      if (jsonl) write_all(jsonl, m.json() + "\n", "--metrics-jsonl " + c.metrics_jsonl);
      if (elastic_run)
        if (const std::string line = elastic_run->iteration_done(m.iteration); !line.empty()) print_line(line);
    }, [&](const triax::EvalMetrics& e) {
      if (exporter) exporter->observe_eval(e);
      summary->add(e);
      if (rank != 0) return;
      print_line(e.log_line(), e.json());
      if (jsonl) write_all(jsonl, e.json() + "\n", "--metrics-jsonl " + c.metrics_jsonl);
    }, [&] {
      const bool stop = checkpoints.after_iteration();
      if (const int64_t it = checkpoints.last_save().iteration; it > 0)
        summary->set_checkpoint((std::filesystem::path(c.save) / triax::checkpoint_dir_name(it)).string());
      if (stop) {
        stopped = true;
        // The signal any rank received (the all-reduced one), and whether this rank got it itself.
        const int sig = checkpoints.stop_signal();
        const std::string why = fmt::format("{}{}: the state of iteration {} was saved, the run stopped early",
                                            sig == SIGUSR1 ? "SIGUSR1" : "SIGTERM",
                                            triax::stop_signal_received() ? "" : " (received by another rank)",
                                            trainer.iteration());
        summary->set_exit_reason(why);
        if (elastic) triax::elastic_note_interruption(why);
      }
      return stop;
    });
    checkpoints.finish();
    if (const int64_t it = checkpoints.last_save().iteration; it > 0)  // the last save is committed now
      summary->set_checkpoint((std::filesystem::path(c.save) / triax::checkpoint_dir_name(it)).string());
    if (!c.export_hf.empty()) export_hf(trainer, c.export_hf);
    if (jsonl && std::fclose(jsonl) != 0) {
      jsonl = nullptr;
      throw triax::IoError(fmt::format("--metrics-jsonl {}: closing failed: {}", c.metrics_jsonl, std::strerror(errno)));
    }
    jsonl = nullptr;
    if (rank == 0) print_summary(*summary, wall0);
    if (exporter && exporter->port() >= 0 && c.metrics_linger > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(c.metrics_linger));
    if (elastic && stopped) {
      // Not 0, which would tell the agent the job is done: it restarts the group and the next
      // attempt resumes from this save. A rank stopped for another's signal first waits (bounded)
      // for its own agent's: when the agent restarts for a node that joined, that is no failure.
      const auto t0 = std::chrono::steady_clock::now();
      while (triax::stop_signal_received() == 0 &&
             std::chrono::steady_clock::now() - t0 < std::chrono::duration<double>(triax::agent_signal_grace_s()))
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return triax::kExitStopped;
    }
  } catch (const std::exception& e) {
    g_ending = true;
    triax::dump_flight_recorder(std::string("error: ") + e.what());
    triax::elastic_note_interruption(fmt::format("{}: {}", triax::exit_code_name(triax::exit_code_for(e)), e.what()));
    triax::post_failure_notice(e.what());  // the ranks waiting for this one dump too
    triax::JobFailure f = triax::settle_failure(kProgram, e);
    // settle_failure agrees through MPI only. Without mpirun a collective timeout is taken for
    // what it nearly always is, a failure of one rank that the others wait for: the one message
    // comes from rank 0 (explain_failure), and nobody says goodbye (end_job).
    if (boot && boot->kind() != triax::LaunchKind::mpi && boot->world_size() > 1 &&
        dynamic_cast<const triax::TimeoutError*>(&e))
      f.abort_job = true;
    if (boot) triax::explain_failure(kProgram, f, e, boot->rank(), boot->world_size(), started);
    if (summary && boot && boot->rank() == 0) {
      // What the run did before the error (the message above says what went wrong).
      const bool skips = std::string_view(e.what()).find("--max-skipped-iterations") != std::string_view::npos;
      summary->set_exit_reason(fmt::format("{} (exit {}, {})", skips ? "max skipped iterations reached" : "error",
                                           f.exit_code, triax::exit_code_name(f.exit_code)));
      try {
        print_summary(*summary, wall0);
      } catch (const std::exception&) {
        // standard output is gone: the error above is the report
      }
    }
    end_job(f, boot);
  }
  return 0;
}
