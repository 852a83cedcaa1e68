// train_gpt: 3D-parallel GPT training on the CPU path, launched by mpirun.
//   mpirun -np 8 train_gpt --tp 2 --pp 2 --dp 2
// With no flags it trains the tiny model on a built-in generated language. Flags may also come
// from a TOML file (--config FILE; keys are the flag names, e.g. micro-batch-size = 4); flags
// given on the command line win. Rank 0 prints the resolved configuration (itself a --config
// file of this run), then one line per iteration (Megatron's field names) and, with
// --metrics-jsonl, one JSON object per iteration. Exit codes: docs/ERRORS.md.
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <triax/core/log.h>
#include <triax/dist/bootstrap.h>
#include <triax/dist/job_failure.h>
#include <triax/model/checkpoint_io.h>
#include <triax/train/checkpoint.h>
#include <triax/train/config.h>
#include <triax/train/trainer.h>

#if defined(TRIAX_HAVE_MPI)
#include <mpi.h>
#endif

namespace {

constexpr const char* kProgram = "train_gpt";

[[noreturn]] void end_job(const triax::JobFailure& f, std::unique_ptr<triax::Bootstrap>& boot) {
  if (!f.message.empty()) std::fprintf(stderr, "%s\n", f.message.c_str());
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
  boot.reset();  // every rank failed alike: finalize cleanly, no abort banner
  std::exit(f.exit_code);
}

// Writes all of `text` to `f`; IoError naming the file when the write or flush fails.
void write_all(std::FILE* f, std::string_view text, const std::string& name) {
  if (std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fflush(f) != 0)
    throw triax::IoError(fmt::format("{}: write failed: {}", name, std::strerror(errno)));
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
    return code;
  }
  if (cl.help) {
    if (triax::launcher_rank() == 0) std::fputs(cl.help_text.c_str(), stdout);
    return 0;
  }
  const triax::TrainConfig& c = cl.cfg;

  // The bootstrap outlives the try: an error on one rank must reach end_job (MPI_Abort) while
  // MPI is still up, not wait in MPI_Finalize for ranks blocked in a collective.
  std::unique_ptr<triax::Bootstrap> boot;
  try {
    boot = triax::Bootstrap::create();
    auto world = boot->world();
    const int rank = world->rank();
    triax::log::set_rank(world->size() > 1 ? rank : -1);
    // Before the trainer exists: a signal during start-up must not kill the job either.
    if (!c.save.empty()) triax::install_stop_signal_handlers();
    triax::Trainer trainer(world, c);
    triax::Checkpointer checkpoints(trainer);
    checkpoints.resume();
    std::FILE* jsonl = nullptr;
    struct Closer {
      std::FILE*& f;
      ~Closer() {
        if (f) std::fclose(f);
      }
    } closer{jsonl};
    if (rank == 0) {
      write_all(stdout, trainer.resolved_config(), "standard output");
      if (!c.metrics_jsonl.empty()) {
        jsonl = std::fopen(c.metrics_jsonl.c_str(), "w");
        if (!jsonl)
          throw triax::IoError(fmt::format("--metrics-jsonl {}: cannot open for writing: {}", c.metrics_jsonl,
                                           std::strerror(errno)));
      }
    }
    trainer.train([&](const triax::IterationMetrics& m) {
      if (rank != 0) return;
      write_all(stdout, m.log_line() + "\n", "standard output");
      if (jsonl) write_all(jsonl, m.json() + "\n", "--metrics-jsonl " + c.metrics_jsonl);
    }, [&](const triax::EvalMetrics& e) {
      if (rank != 0) return;
      write_all(stdout, e.log_line() + "\n", "standard output");
      if (jsonl) write_all(jsonl, e.json() + "\n", "--metrics-jsonl " + c.metrics_jsonl);
    }, [&] { return checkpoints.after_iteration(); });
    checkpoints.finish();
    if (!c.export_hf.empty()) {
      triax::save_weights(c.export_hf, triax::WeightFormat::safetensors, trainer.model_config(), trainer.store(),
                          trainer.grid());
      if (rank == 0) triax::log::info("exported the model to {} (HF GPT2LMHeadModel safetensors)", c.export_hf);
    }
    if (jsonl && std::fclose(jsonl) != 0) {
      jsonl = nullptr;
      throw triax::IoError(fmt::format("--metrics-jsonl {}: closing failed: {}", c.metrics_jsonl, std::strerror(errno)));
    }
    jsonl = nullptr;
  } catch (const std::exception& e) {
    end_job(triax::settle_failure(kProgram, e), boot);
  }
  return 0;
}
