// HF model directories of the Llama family (LlamaForCausalLM): config.json plus model.safetensors
// or a sharded model.safetensors.index.json. Reading gives the GptConfig and fills a ParamStore's
// TP shard tensor by tensor (the store's names are the HF names for every model whose is_gpt2()
// is false: docs/LLAMA.md); writing gathers the model over the layout and one rank writes a
// directory HF's from_pretrained loads, renamed into place only when complete.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "triax/distributed/comm/comm.h"
#include "triax/io/tensor_file.h"
#include "triax/model/config.h"
#include "triax/model/weight_file.h"
#include "triax/params/param_store.h"

namespace triax {

class ProcessGrid;

// Whether `path` is a directory holding a config.json (an HF model directory; anything else given
// to --init-from / --weights is a weight file).
bool is_hf_dir(const std::string& path);

// The model of DIR/config.json (model_type "llama"): hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, vocab_size, max_position_embeddings, rms_norm_eps
// (required); num_key_value_heads (default: the heads), rope_theta (10000), rope_scaling (null or
// rope_type "llama3" with factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings), tie_word_embeddings (false), attention_bias and mlp_bias
// (false; they must agree), hidden_act ("silu", the only one), head_dim (hidden / heads, the only
// one). RMSNorm, SwiGLU, RoPE; vocab_pad_to 128. ConfigError naming the file and the key for a
// missing, ill-typed or unsupported value; IoError if the file cannot be read or parsed.
GptConfig read_hf_config(const std::string& dir);
// The same from config.json's text; `where` names the file in messages.
GptConfig parse_hf_config(const std::string& json_text, const std::string& where);

// ConfigError naming the field unless HF LlamaForCausalLM can express cfg: RMSNorm, SwiGLU and
// RoPE (GPT-2's LayerNorm, GELU and learned positions cannot be written as a Llama model).
void check_hf_llama(const GptConfig& cfg);
// config.json's text for cfg (every key read_hf_config reads, plus architectures, model_type,
// hidden_act, torch_dtype from `stored` and head_dim). check_hf_llama first.
std::string hf_config_json(const GptConfig& cfg, io::FileDType stored);

// Every tensor of the whole model by HF name, in registration order, with its shape in the file:
// the embedding and an untied lm_head have the real vocabulary's rows (the store pads them).
std::vector<std::pair<std::string, std::vector<int64_t>>> hf_param_shapes(const GptConfig& cfg);

// Fills every parameter registered in store (one pipeline stage's) with this TP rank's shard,
// reading only that block of each tensor; bf16, f16, f32 (and f64) files. cfg is the model the
// store was built for: IoError naming DIR when config.json describes another one (layers, heads,
// kv heads, hidden, ffn, vocab, block). Per tensor: IoError naming the file, the tensor and the
// expected and found shapes, or a missing tensor; a tensor the model has no place for (another
// model's; rotary_emb.inv_freq buffers and a tied model's lm_head.weight are ignored) too.
void load_hf_dir(const std::string& dir, ParamStore& store, const GptConfig& cfg, int tp_rank, int tp_size);

// Writes w (full tensors by store name, as gather_full_weights returns them; the embedding and
// lm_head with any padded row count >= vocab) as DIR/config.json + DIR/model.safetensors (vocab
// rows cut to the real vocabulary, metadata format=pt), built in a temporary sibling directory
// renamed into place: DIR never holds a half-written model. An existing DIR is replaced only when
// it holds nothing but those two files (IoError naming any other). ConfigError from
// check_hf_llama, for a missing parameter or one HF Llama has no place for (named).
void write_hf_dir(const std::string& dir, const GptConfig& cfg, const FullWeights& w,
                  io::FileDType stored = io::FileDType::f32);

// Collective over world (as save_weights): gathers the model, world rank 0 writes DIR, and every
// rank returns normally or throws the same IoError / ConfigError.
void save_hf_dir(const std::string& dir, const GptConfig& cfg, const ParamStore& store, Communicator& tp,
                 Communicator& world, io::FileDType stored = io::FileDType::f32);
void save_hf_dir(const std::string& dir, const GptConfig& cfg, const ParamStore& store, ProcessGrid& grid,
                 io::FileDType stored = io::FileDType::f32);

}  // namespace triax
