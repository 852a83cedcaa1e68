// llm.c's GPT-2 checkpoint (gpt2_124M.bin etc.): 256 int32 header (magic 20240326, version 3 =
// fp32 or 5 = bf16 parameters, maxT, V, L, NH, C, Vp), then 16 stacked parameter tensors in a
// fixed order. A validating mmap reader and an atomic writer. Token shards: token_shard.h.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "triax/io/tensor_file.h"
#include "triax/io/token_shard.h"

namespace triax::io {

inline constexpr int32_t kLlmcModelMagic = 20240326;
inline constexpr int kLlmcHeaderInts = 256;  // 1024 bytes

struct LlmcGpt2Config {
  int max_seq_len = 0;        // maxT: rows of wpe
  int vocab_size = 0;         // V: real tokens
  int padded_vocab_size = 0;  // Vp >= V: rows of wte; rows [V, Vp) are padding
  int num_layers = 0;         // L
  int num_heads = 0;          // NH
  int channels = 0;           // C
  friend bool operator==(const LlmcGpt2Config&, const LlmcGpt2Config&) = default;
};

struct NamedShape {
  std::string name;
  Shape shape;
};

// The 16 tensors in file order. Matrices are nn.Linear-style (out, in), unlike HF's Conv1D
// (in, out); per-layer tensors are stacked along a leading L dimension:
//   wte (Vp, C)  wpe (maxT, C)  ln1w ln1b (L, C)  qkvw (L, 3C, C)  qkvb (L, 3C)
//   attprojw (L, C, C)  attprojb ln2w ln2b (L, C)  fcw (L, 4C, C)  fcb (L, 4C)
//   fcprojw (L, C, 4C)  fcprojb (L, C)  lnfw lnfb (C)
std::vector<NamedShape> llmc_gpt2_layout(const LlmcGpt2Config& c);

// Reads a checkpoint through TensorFile (read, read_rows for one layer, read_slice for a TP
// shard of one layer, ...). IoError naming the file and the problem for: a file shorter than the
// header, a wrong magic (with a hint when it is a token shard), a version other than 3 or 5,
// non-positive or inconsistent sizes (C % NH, Vp < V), sizes whose byte count overflows, and a
// file size that differs from header + parameters.
class LlmcGpt2Reader : public TensorFile {
 public:
  explicit LlmcGpt2Reader(std::string path);
  const LlmcGpt2Config& config() const { return config_; }
  int version() const { return version_; }
  FileDType dtype() const { return version_ == 5 ? FileDType::bf16 : FileDType::f32; }

 private:
  LlmcGpt2Config config_;
  int version_ = 0;
};

class LlmcGpt2Writer {
 public:
  // stored: f32 (version 3) or bf16 (version 5). ConfigError for an invalid config.
  explicit LlmcGpt2Writer(LlmcGpt2Config config, FileDType stored = FileDType::f32);
  // ConfigError for a name not in llmc_gpt2_layout or a size that does not match its shape.
  void set(const std::string& name, std::vector<float> data);
  void set(const std::string& name, std::span<const float> data);
  // ConfigError naming the missing tensors unless all 16 were set; then an atomic write.
  void write(const std::string& path) const;
  const std::vector<NamedShape>& layout() const { return layout_; }

 private:
  LlmcGpt2Config config_;
  FileDType stored_;
  std::vector<NamedShape> layout_;
  std::vector<std::vector<float>> data_;  // per layout_ entry; empty = not set
  std::vector<bool> set_;
};

}  // namespace triax::io
