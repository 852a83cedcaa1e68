// GPT-2 weights to and from files: HuggingFace safetensors (Conv1D (in, out) matrices, real
// vocabulary, optional "transformer." prefix) and llm.c checkpoints (stacked (L, out, in), padded
// vocabulary). Loading fills a ParamStore's TP shard by reading only that shard from the file;
// saving gathers the shards over TP and pipeline stages and one rank writes the file atomically.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "triax/distributed/comm/comm.h"
#include "triax/io/tensor_file.h"
#include "triax/model/config.h"
#include "triax/params/param_store.h"

namespace triax {

class ProcessGrid;

enum class WeightFormat { safetensors, llmc };
std::string_view weight_format_name(WeightFormat f);

// GPT-2's head counts by hidden size (HF files do not store n_head): 768 -> 12, 1024 -> 16,
// 1280 -> 20, 1600 -> 25; nullopt otherwise.
std::optional<int> default_gpt2_heads(int n_embd);

// An opened weight file: its format (sniffed from the first bytes, not the extension), the model
// shape it holds, and the loader. Both formats are memory-mapped; nothing is read until load().
class WeightFile {
 public:
  // heads: 0 = from the safetensors metadata "n_head" (triax writes it), else the GPT-2 default
  // for the hidden size, else ConfigError asking for it. A non-zero value overrides the default
  // but must agree with the metadata (ConfigError otherwise). llm.c files store their heads and
  // must agree with a non-zero value too. IoError naming the file and the problem for a file that
  // is neither format, a token shard, no wte, layers that are not numbered 0..L-1, and shapes
  // that disagree between tensors.
  explicit WeightFile(const std::string& path, int heads = 0);
  ~WeightFile();
  WeightFile(WeightFile&&) noexcept;
  WeightFile& operator=(WeightFile&&) noexcept;

  const std::string& path() const;
  WeightFormat format() const { return format_; }
  // n_layer, n_head, n_embd, ffn, vocab (real), max_seq from the file; vocab_pad_to 128 unless
  // the metadata says otherwise (padding never changes the math).
  const GptConfig& config() const { return config_; }
  // The file's tensors (for listings and tests).
  const io::TensorFile& file() const { return *file_; }

  // Fills every parameter registered in store with this TP rank's shard of it, reading only that
  // shard from the file (Conv1D matrices are transposed on the way in; the vocabulary rows past
  // the file's real vocabulary are zero). cfg is the model the store was built for: IoError
  // naming the file when its shape (layers, hidden, ffn, vocab, positions, heads where the file
  // knows them) differs. Per tensor: IoError naming the file, the tensor and the expected and
  // found shapes, or the missing tensor (with and without the "transformer." prefix).
  void load(ParamStore& store, const GptConfig& cfg, int tp_rank, int tp_size) const;
  void load(ParamStore& store, const GptConfig& cfg, const Communicator& tp) const {
    load(store, cfg, tp.rank(), tp.size());
  }

 private:
  std::unique_ptr<io::TensorFile> file_;
  WeightFormat format_;
  GptConfig config_;
  std::string prefix_;  // "transformer." or "" (safetensors)
  bool has_lm_head_ = false;
};

// Full-shape parameters by name, in triax's layout ((out, in) matrices, wte (padded V, C)).
using FullWeights = std::map<std::string, std::vector<float>>;

// The parameter names and full shapes of a whole model (wte with the vocab padded for tp=1).
std::vector<std::pair<std::string, std::vector<int64_t>>> gpt_param_shapes(const GptConfig& cfg);

// Writes a whole model as HF GPT2LMHeadModel safetensors: "transformer."-prefixed names, Conv1D
// (in, out) matrices, wte cut to the real vocabulary, no lm_head.weight (tied), metadata
// format=pt and the shape (n_layer, n_head, n_embd, n_inner, vocab_size, n_positions). w must hold
// every parameter of cfg (ConfigError naming the first missing one); wte may have any padded row
// count >= vocab. stored: f32, bf16, f16. Atomic.
void write_hf_safetensors(const std::string& path, const GptConfig& cfg, const FullWeights& w,
                          io::FileDType stored = io::FileDType::f32);
// Same model as an llm.c checkpoint (version 3 for f32, 5 for bf16), vocab padded to a multiple
// of 128 as llm.c does (rows past the real vocabulary written as zeros). Atomic.
void write_llmc_checkpoint(const std::string& path, const GptConfig& cfg, const FullWeights& w,
                           io::FileDType stored = io::FileDType::f32);

// Collective over world (every rank of the job; tp is this rank's TP group inside it): gathers
// every parameter of every store to full shape and hands the whole model to world rank 0, taking
// each name from the lowest world rank that holds it (DP replicas and the last stage's tied
// embedding copy are not sent). Returns the model on world rank 0, an empty map elsewhere.
FullWeights gather_full_weights(const ParamStore& store, Communicator& tp, Communicator& world);
// The same for any per-parameter tensor of the store's local shapes: local(i) gives this rank's
// shard of parameter i (gather_full_weights passes the masters; gpt_eval --grads-out the gradients).
FullWeights gather_full_tensors(const ParamStore& store, Communicator& tp, Communicator& world,
                                const std::function<std::vector<float>(size_t)>& local);

// World rank 0 runs write(); then every rank returns normally or throws what it threw (IoError,
// ConfigError, else Error, with rank 0's message), so a job never half-fails on a write.
void write_on_rank0(Communicator& world, const std::function<void()>& write);

// gather_full_weights, then world rank 0 writes `path` in `format` and tells every rank how it
// went: every rank returns normally or throws the same IoError / ConfigError.
void save_weights(const std::string& path, WeightFormat format, const GptConfig& cfg, const ParamStore& store,
                  Communicator& tp, Communicator& world, io::FileDType stored = io::FileDType::f32);
void save_weights(const std::string& path, WeightFormat format, const GptConfig& cfg, const ParamStore& store,
                  ProcessGrid& grid, io::FileDType stored = io::FileDType::f32);

// The format a path asks for when writing: ".bin" -> llm.c, anything else -> safetensors.
WeightFormat weight_format_for_path(const std::string& path);

}  // namespace triax
