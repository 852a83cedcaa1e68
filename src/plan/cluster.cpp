// Cluster presets, validation and the TOML cluster file reader.
#include "triax/plan/cluster.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "triax/core/error.h"

#ifdef TRIAX_HAVE_TOML
#include "cluster_toml.h"
#endif

namespace triax::plan {

void validate(const Cluster& c) {
  auto positive = [&](const char* field, double v) {
    if (!(v > 0)) TRIAX_THROW(ConfigError, "cluster '{}': {} must be positive, got {}", c.name, field, v);
  };
  auto non_negative = [&](const char* field, double v) {
    if (!(v >= 0)) TRIAX_THROW(ConfigError, "cluster '{}': {} must be >= 0, got {}", c.name, field, v);
  };
  auto fraction = [&](const char* field, double v) {
    if (!(v > 0 && v <= 1))
      TRIAX_THROW(ConfigError, "cluster '{}': {} must be in (0, 1], got {}", c.name, field, v);
  };
  auto ratio = [&](const char* field, double v) {
    if (!(v >= 1)) TRIAX_THROW(ConfigError, "cluster '{}': oversubscription {} must be >= 1, got {}", c.name, field, v);
  };
  if (c.name.empty()) TRIAX_THROW(ConfigError, "cluster: name must not be empty");
  positive("gpus_per_node", c.gpus_per_node);
  positive("nodes", c.nodes);
  non_negative("cores_per_node", c.cores_per_node);
  positive("peak_tflops_bf16", c.peak_tflops_bf16);
  positive("peak_tflops_fp32", c.peak_tflops_fp32);
  fraction("gemm_efficiency", c.gemm_efficiency);
  non_negative("kernel_overhead_us", c.kernel_overhead_us);
  non_negative("sm_count", c.sm_count);
  if (c.sm_count > 0) {
    positive("gemm_tile_m", c.gemm_tile_m);
    positive("gemm_tile_n", c.gemm_tile_n);
  }
  non_negative("gemm_k_overhead", c.gemm_k_overhead);
  if (c.attention_efficiency != 0) fraction("attention_efficiency", c.attention_efficiency);
  positive("memory_gib", c.memory_gib);
  positive("memory_gbps", c.memory_gbps);
  fraction("memory_efficiency", c.memory_efficiency);
  non_negative("reserved_gib", c.reserved_gib);
  non_negative("copy_gbps", c.copy_gbps);
  if (!(c.comm_sm_fraction >= 0 && c.comm_sm_fraction < 1))
    TRIAX_THROW(ConfigError, "cluster '{}': comm_sm_fraction must be in [0, 1), got {}", c.name, c.comm_sm_fraction);
  if (c.reserved_gib >= c.memory_gib)
    TRIAX_THROW(ConfigError, "cluster '{}': reserved_gib {} leaves nothing of memory_gib {}", c.name,
                c.reserved_gib, c.memory_gib);
  positive("intra_gbps", c.intra_gbps);
  fraction("intra_efficiency", c.intra_efficiency);
  non_negative("intra_latency_us", c.intra_latency_us);
  non_negative("collective_launch_us", c.collective_launch_us);
  non_negative("collective_buffer_mib", c.collective_buffer_mib);
  if (c.nodes > 1) {
    positive("nics_per_node", c.nics_per_node);
    positive("nic_gbps", c.nic_gbps);
    fraction("nic_efficiency", c.nic_efficiency);
  }
  non_negative("inter_latency_us", c.inter_latency_us);
  positive("nodes_per_access", c.nodes_per_access);
  positive("access_per_aggregation", c.access_per_aggregation);
  ratio("access", c.oversub_access);
  ratio("aggregation", c.oversub_aggregation);
  ratio("core", c.oversub_core);
}

namespace {

// The two constants fitted to published runs (docs/PLANNER.md "Validation"): the sustained fraction
// of peak that full waves of large tiles reach, and the per-tile K overhead.
constexpr double kSeleneGemmEfficiency = 0.81;
constexpr double kSeleneGemmKOverhead = 291;

Cluster selene_a100() {
  Cluster c;
  c.name = "selene-a100";
  c.description =
      "NVIDIA Selene (DGX SuperPOD): DGX A100 80GB nodes, NVLink3/NVSwitch, 8x HDR InfiniBand per "
      "node, non-blocking three-level fat tree";
  // Narayanan et al. SC21 §5: "Selene ... DGX A100 ... 8 NVIDIA 80-GB A100 GPUs connected by
  // NVLink and NVSwitch ... 8 NVIDIA Mellanox 200Gbps HDR Infiniband HCAs ... three-level
  // (leaf, spine, super-spine) fat-tree". 560 DGX A100 = 4480 GPUs (TOP500 Nov 2020 entry).
  c.gpus_per_node = 8;
  c.nodes = 560;
  // NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOP/s bf16/fp16 dense tensor, 19.5 TFLOP/s fp32,
  // 80 GB HBM2e at 2039 GB/s.
  c.peak_tflops_bf16 = 312;
  c.peak_tflops_fp32 = 19.5;
  // Achieved fractions, set once for the cluster, never per row (docs/PLANNER.md "Validation").
  // gemm_efficiency (sustained rate of full waves of large tiles) and gemm_k_overhead are the two
  // constants fitted to the 18 published runs of data/validation/published_runs.csv (least squares
  // in log time; leave-one-out 1.7% mean / 3.8% worst). PyTorch's fused softmax / LayerNorm /
  // dropout kernels stream at ~80% of HBM bandwidth (BabelStream-style copies reach ~88%).
  c.gemm_efficiency = kSeleneGemmEfficiency;
  c.kernel_overhead_us = 2;
  // A100 SXM4: 108 SMs (A100 datasheet / GA100 whitepaper). cuBLAS runs Megatron's fp16 GEMMs with
  // 256x128 output tiles (kernel names ampere_fp16_s16816gemm_fp16_256x128_* in Nsight profiles).
  // The per-tile prologue/epilogue in K elements is the second fitted constant.
  c.sm_count = 108;
  c.gemm_tile_m = 256;
  c.gemm_tile_n = 128;
  c.gemm_k_overhead = kSeleneGemmKOverhead;
  c.memory_gib = 80;
  c.memory_gbps = 2039;
  c.memory_efficiency = 0.80;
  c.reserved_gib = 3;  // CUDA context, cuBLAS workspace, NCCL, caching-allocator fragmentation
  // NVLink3: 12 links x 25 GB/s per direction = 300 GB/s per GPU per direction (A100 datasheet:
  // 600 GB/s total). nccl-tests all_reduce busbw on one DGX A100 is ~230 GB/s -> 0.77.
  c.intra_gbps = 300;
  c.intra_efficiency = 0.77;
  c.intra_latency_us = 1;
  // 8 ConnectX-6 HDR HCAs at 200 Gb/s = 25 GB/s each, one per GPU (DGX A100 architecture
  // whitepaper); InfiniBand HDR delivers ~90% of line rate to NCCL.
  c.nics_per_node = 8;
  c.nic_gbps = 25;
  c.nic_efficiency = 0.9;
  c.inter_latency_us = 4;
  c.collective_launch_us = 8;
  c.collective_buffer_mib = 64;  // NCCL: 4 MiB buffers x 2 directions x 8 channels
  // NCCL on a DGX A100 (8 NICs, ~190 GB/s) runs its collectives on 16 SMs it does not share with
  // compute kernels (S. Jeaugey, github.com/NVIDIA/nccl/issues/689): 16 of 108.
  c.comm_sm_fraction = 16.0 / 108;
  // DGX SuperPOD reference architecture: scalable units of 20 nodes under rail-optimised leaf
  // switches, 7 units per spine block, super-spine (core) above; full fat tree (1:1).
  c.nodes_per_access = 20;
  c.access_per_aggregation = 7;
  c.oversub_access = 1;
  c.oversub_aggregation = 1;
  c.oversub_core = 1;
  return c;
}

Cluster dgx_h100() {
  Cluster c;
  c.name = "dgx-h100";
  c.description =
      "DGX H100 nodes, NVLink4/NVSwitch, 8x NDR 400 Gb/s per node, non-blocking fat tree "
      "(datasheet numbers; fused attention at cuDNN's and memory-bound kernels at PyTorch's published rates; GEMM "
      "constants fitted to 27 published H100 bf16 runs, 4 sources)";
  c.gpus_per_node = 8;
  c.nodes = 768;  // enough for the largest Megatron-LM README run (6144 GPUs)
  c.peak_tflops_bf16 = 989;  // H100 SXM datasheet, dense
  c.peak_tflops_fp32 = 67;
  // Fitted to the 27 H100 rows of data/validation/published_runs.csv (Megatron-LM README 2024-07;
  // NVIDIA DGX Cloud Benchmarking GPT-3 175B, Nemotron-4 15B and 340B), the same two constants as
  // selene-a100's; leave-one-out 3.38% mean / 11.1% worst, held out by source 3.41% / 10.7%
  // (docs/PLANNER.md). They price only the linear GEMMs: fused attention has its own rate. The
  // rows hardly determine the K overhead (the fits of the variants tried landed between 0 and 230).
  c.gemm_efficiency = 0.611;
  c.kernel_overhead_us = 2;
  // Fused attention at cuDNN's measured H100 SXM5 rate, bf16, head dim 128 (Shah et al. 2024,
  // FlashAttention-3, arXiv 2407.08608, Figs. 5-6, the cuDNN bars): causal forward 518 TFLOP/s
  // at sequence 4k (484 at 2k), backward 499 (465 at 2k); FLOPs counted as here (causal: the
  // visited half). Transformer Engine picks cuDNN's fused attention on sm90 (its backend
  // selection, TE 1.6 and later). Forward + 2.5x backward: 3.5 / (1/0.524 + 2.5/0.505) = 0.51.
  c.attention_efficiency = 0.51;
  c.sm_count = 132;  // H100 SXM5 datasheet
  c.gemm_tile_m = 256;
  c.gemm_tile_n = 128;
  c.gemm_k_overhead = 12;
  c.memory_gib = 80;
  c.memory_gbps = 3350;  // HBM3
  // PyTorch-generated memory-bound kernels on H100 SXM reach about 2.0 TB/s of model bytes (Guo,
  // Zadouri, Dao 2025, "Getting Memory-bound Kernels to Speed-of-Light", Dao-AILab/quack
  // media/2025-07-10-membound-sol.md: torch.compile softmax at 16k x 131k ~2.0 TB/s, 1.89 TB/s at
  // 262k; Liger ~2.0 TB/s past 32k; hand-tuned CuTe kernels 3.0 TB/s): 2.0 / 3.35 = 0.60.
  c.memory_efficiency = 0.60;
  c.reserved_gib = 3;
  c.intra_gbps = 450;  // NVLink4: 18 links x 25 GB/s per direction
  c.intra_efficiency = 0.77;
  c.intra_latency_us = 1;
  c.nics_per_node = 8;
  c.nic_gbps = 50;  // ConnectX-7 NDR 400 Gb/s
  c.nic_efficiency = 0.9;
  c.inter_latency_us = 4;
  c.collective_launch_us = 8;
  c.collective_buffer_mib = 64;
  // NCCL on a DGX with 8 NICs runs its collectives on 16 SMs, which it does not share with compute
  // kernels (S. Jeaugey, NCCL maintainer, github.com/NVIDIA/nccl/issues/689, 2023): 16 of 132.
  c.comm_sm_fraction = 16.0 / 132;
  c.nodes_per_access = 32;
  c.access_per_aggregation = 4;
  return c;
}

Cluster cpu_local() {
  Cluster c;
  c.name = "cpu-local";
  c.description =
      "This 2-core development machine: one MPI rank per core (fp32, OpenBLAS single-threaded), "
      "shared-memory MPI (vader); measured numbers in docs/PLANNER.md";
  c.gpus_per_node = 2;
  c.nodes = 1;
  c.cores_per_node = 2;  // a caller placing more ranks on the node (train_bench) time-slices them
  // Measured single-thread OpenBLAS sgemm: 97 GFLOP/s at its best (DESIGN.md), 85-97 on GPT-2
  // shapes (1024 x {768,2304,3072} x {768,3072}), so the peak is the best measured rate and the
  // efficiency the shape average, 0.9. No bf16 units: the same rate.
  c.peak_tflops_bf16 = 0.097;
  c.peak_tflops_fp32 = 0.097;
  c.gemm_efficiency = 0.9;
  c.kernel_overhead_us = 0;
  // 23 GiB RAM shared by two ranks; stream triad with both ranks running: ~10.5 GB/s each.
  c.memory_gib = 11;
  c.memory_gbps = 10.5;
  c.memory_efficiency = 1;
  c.reserved_gib = 0.25;  // MPI, process and allocator overhead
  // MPI_Allreduce over vader (no single-copy), 2 ranks, 64 KiB-1 MiB: busbw ~6 GB/s, ~2 us per
  // step; large messages are slower and noisy on a loaded machine.
  c.intra_gbps = 6;
  c.intra_efficiency = 1;
  c.intra_latency_us = 2;
  c.nics_per_node = 0;
  c.nic_gbps = 0;
  c.nic_efficiency = 1;
  c.inter_latency_us = 0;
  c.collective_launch_us = 1;
  c.collective_buffer_mib = 0;
  return c;
}

}  // namespace

const std::vector<Cluster>& cluster_presets() {
  static const std::vector<Cluster> presets = {selene_a100(), dgx_h100(), cpu_local()};
  return presets;
}

Cluster cluster_preset(std::string_view name) {
  std::string names;
  for (const auto& c : cluster_presets()) {
    if (c.name == name) return c;
    names += names.empty() ? c.name : ", " + c.name;
  }
  TRIAX_THROW(ConfigError, "unknown cluster preset '{}'; known presets: {} (or a path to a .toml file)",
              name, names);
}

bool toml_supported() {
#ifdef TRIAX_HAVE_TOML
  return true;
#else
  return false;
#endif
}

#ifdef TRIAX_HAVE_TOML
namespace {

// Strict reading: every key must be known, every required key present, with the right type.
class TomlReader {
 public:
  TomlReader(const toml::table& root, std::string file) : root_(root), file_(std::move(file)) {}

  const toml::table& section(const std::string& name) {
    const toml::node* n = root_.get(name);
    if (!n) TRIAX_THROW(IoError, "{}: missing section [{}]", file_, name);
    const toml::table* t = n->as_table();
    if (!t) TRIAX_THROW(IoError, "{}: '{}' must be a table [{}]", file_, name, name);
    sections_.insert(name);
    return *t;
  }
  double number(const toml::table& t, const std::string& sec, const std::string& key) {
    used_[sec].insert(key);
    const toml::node* n = t.get(key);
    if (!n) TRIAX_THROW(IoError, "{}: missing key {}.{}", file_, sec, key);
    if (auto v = n->value_exact<double>()) return *v;
    if (auto v = n->value_exact<int64_t>()) return double(*v);
    TRIAX_THROW(IoError, "{}: {}.{} must be a number", file_, sec, key);
  }
  int integer(const toml::table& t, const std::string& sec, const std::string& key) {
    used_[sec].insert(key);
    const toml::node* n = t.get(key);
    if (!n) TRIAX_THROW(IoError, "{}: missing key {}.{}", file_, sec, key);
    auto v = n->value_exact<int64_t>();
    if (!v) TRIAX_THROW(IoError, "{}: {}.{} must be an integer", file_, sec, key);
    return int(*v);
  }
  // Keys added after the first file format: absent means the default.
  double optional_number(const toml::table& t, const std::string& sec, const std::string& key, double dflt) {
    if (!t.get(key)) {
      used_[sec].insert(key);
      return dflt;
    }
    return number(t, sec, key);
  }
  int optional_integer(const toml::table& t, const std::string& sec, const std::string& key, int dflt) {
    if (!t.get(key)) {
      used_[sec].insert(key);
      return dflt;
    }
    return integer(t, sec, key);
  }
  std::string string(const toml::table& t, const std::string& sec, const std::string& key, bool required) {
    used_[sec].insert(key);
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) TRIAX_THROW(IoError, "{}: missing key {}", file_, key);
      return {};
    }
    auto v = n->value_exact<std::string>();
    if (!v) TRIAX_THROW(IoError, "{}: {} must be a string", file_, key);
    return *v;
  }
  void mark_used(const std::string& sec, const std::string& key) { used_[sec].insert(key); }
  // Unknown keys are typos: reject them, naming the key.
  void check_unknown(const toml::table& t, const std::string& sec) {
    for (const auto& [k, v] : t) {
      const std::string key(k.str());
      if (sec.empty() && sections_.count(key)) continue;
      if (!used_[sec].count(key))
        TRIAX_THROW(IoError, "{}: unknown key '{}{}'", file_, sec.empty() ? "" : sec + ".", key);
    }
  }
  const std::string& file() const { return file_; }

 private:
  const toml::table& root_;
  std::string file_;
  std::set<std::string> sections_;
  std::map<std::string, std::set<std::string>> used_;
};

}  // namespace

toml::table parse_cluster_file(const std::filesystem::path& path) {
  const std::string file = path.string();
  if (!std::filesystem::exists(path)) TRIAX_THROW(IoError, "{}: cluster file does not exist", file);
  try {
    return toml::parse_file(file);
  } catch (const toml::parse_error& e) {
    TRIAX_THROW(IoError, "{}:{}:{}: {}", file, e.source().begin.line, e.source().begin.column,
                e.description());
  }
}

Cluster read_cluster_table(const toml::table& root, const std::string& file) {
  TomlReader r(root, file);
  Cluster c;
  c.name = r.string(root, "", "name", true);
  c.description = r.string(root, "", "description", false);

  const auto& node = r.section("node");
  c.gpus_per_node = r.integer(node, "node", "devices");
  c.nodes = r.integer(node, "node", "count");
  c.cores_per_node = r.optional_integer(node, "node", "cores", 0);
  r.check_unknown(node, "node");

  const auto& comp = r.section("compute");
  c.peak_tflops_bf16 = r.number(comp, "compute", "peak_tflops_bf16");
  c.peak_tflops_fp32 = r.number(comp, "compute", "peak_tflops_fp32");
  c.gemm_efficiency = r.number(comp, "compute", "gemm_efficiency");
  c.kernel_overhead_us = r.number(comp, "compute", "kernel_overhead_us");
  c.sm_count = r.optional_integer(comp, "compute", "sm_count", 0);
  c.gemm_tile_m = r.optional_integer(comp, "compute", "gemm_tile_m", 0);
  c.gemm_tile_n = r.optional_integer(comp, "compute", "gemm_tile_n", 0);
  c.gemm_k_overhead = r.optional_number(comp, "compute", "gemm_k_overhead", 0);
  c.attention_efficiency = r.optional_number(comp, "compute", "attention_efficiency", 0);
  r.check_unknown(comp, "compute");

  const auto& mem = r.section("memory");
  c.memory_gib = r.number(mem, "memory", "capacity_gib");
  c.memory_gbps = r.number(mem, "memory", "bandwidth_gbps");
  c.memory_efficiency = r.number(mem, "memory", "efficiency");
  c.reserved_gib = r.number(mem, "memory", "reserved_gib");
  c.copy_gbps = r.optional_number(mem, "memory", "copy_gbps", 0);
  r.check_unknown(mem, "memory");

  const auto& intra = r.section("intra_node");
  c.intra_gbps = r.number(intra, "intra_node", "bandwidth_gbps");
  c.intra_efficiency = r.number(intra, "intra_node", "efficiency");
  c.intra_latency_us = r.number(intra, "intra_node", "latency_us");
  r.check_unknown(intra, "intra_node");

  const auto& net = r.section("network");
  c.nics_per_node = r.integer(net, "network", "nics_per_node");
  c.nic_gbps = r.number(net, "network", "nic_gbps");
  c.nic_efficiency = r.number(net, "network", "efficiency");
  c.inter_latency_us = r.number(net, "network", "latency_us");
  r.check_unknown(net, "network");

  const auto& coll = r.section("collectives");
  c.collective_launch_us = r.number(coll, "collectives", "launch_us");
  c.collective_buffer_mib = r.number(coll, "collectives", "buffer_mib");
  c.comm_sm_fraction = r.optional_number(coll, "collectives", "comm_sm_fraction", 0);
  r.check_unknown(coll, "collectives");

  const auto& tree = r.section("fat_tree");
  c.nodes_per_access = r.integer(tree, "fat_tree", "nodes_per_access");
  c.access_per_aggregation = r.integer(tree, "fat_tree", "access_per_aggregation");
  {
    const toml::node* n = tree.get("oversubscription");
    const toml::array* a = n ? n->as_array() : nullptr;
    if (!a || a->size() != 3)
      TRIAX_THROW(IoError, "{}: fat_tree.oversubscription must be an array of 3 numbers "
                           "[access, aggregation, core]", file);
    double v[3];
    for (size_t i = 0; i < 3; ++i) {
      const toml::node& e = *a->get(i);
      if (auto d = e.value_exact<double>()) v[i] = *d;
      else if (auto k = e.value_exact<int64_t>()) v[i] = double(*k);
      else TRIAX_THROW(IoError, "{}: fat_tree.oversubscription[{}] must be a number", file, i);
    }
    c.oversub_access = v[0];
    c.oversub_aggregation = v[1];
    c.oversub_core = v[2];
  }
  r.mark_used("fat_tree", "oversubscription");
  r.check_unknown(tree, "fat_tree");
  r.check_unknown(root, "");
  try {
    validate(c);
  } catch (const ConfigError& e) {
    TRIAX_THROW(ConfigError, "{}: {}", file, e.what());
  }
  return c;
}
#endif

Cluster load_cluster_toml(const std::filesystem::path& path) {
#ifdef TRIAX_HAVE_TOML
  return read_cluster_table(parse_cluster_file(path), path.string());
#else
  TRIAX_THROW(IoError, "{}: this triax was built without toml++; use a built-in cluster preset",
              path.string());
#endif
}

std::string cluster_toml(const Cluster& c) {
  std::string s = fmt::format("name = \"{}\"\ndescription = \"{}\"\n", c.name, c.description);
  s += fmt::format("[node]\ndevices = {}\ncount = {}\ncores = {}\n", c.gpus_per_node, c.nodes, c.cores_per_node);
  s += fmt::format("[compute]\npeak_tflops_bf16 = {}\npeak_tflops_fp32 = {}\ngemm_efficiency = {}\n"
                   "kernel_overhead_us = {}\nsm_count = {}\ngemm_tile_m = {}\ngemm_tile_n = {}\n"
                   "gemm_k_overhead = {}\nattention_efficiency = {}\n",
                   c.peak_tflops_bf16, c.peak_tflops_fp32, c.gemm_efficiency, c.kernel_overhead_us, c.sm_count,
                   c.gemm_tile_m, c.gemm_tile_n, c.gemm_k_overhead, c.attention_efficiency);
  s += fmt::format("[memory]\ncapacity_gib = {}\nbandwidth_gbps = {}\nefficiency = {}\nreserved_gib = {}\n"
                   "copy_gbps = {}\n", c.memory_gib, c.memory_gbps, c.memory_efficiency, c.reserved_gib, c.copy_gbps);
  s += fmt::format("[intra_node]\nbandwidth_gbps = {}\nefficiency = {}\nlatency_us = {}\n", c.intra_gbps,
                   c.intra_efficiency, c.intra_latency_us);
  s += fmt::format("[network]\nnics_per_node = {}\nnic_gbps = {}\nefficiency = {}\nlatency_us = {}\n",
                   c.nics_per_node, c.nic_gbps, c.nic_efficiency, c.inter_latency_us);
  s += fmt::format("[collectives]\nlaunch_us = {}\nbuffer_mib = {}\ncomm_sm_fraction = {}\n",
                   c.collective_launch_us, c.collective_buffer_mib, c.comm_sm_fraction);
  s += fmt::format("[fat_tree]\nnodes_per_access = {}\naccess_per_aggregation = {}\n"
                   "oversubscription = [{}, {}, {}]\n", c.nodes_per_access, c.access_per_aggregation,
                   c.oversub_access, c.oversub_aggregation, c.oversub_core);
  return s;
}

Cluster resolve_cluster(std::string_view name_or_path) {
  const std::string s(name_or_path);
  if (s.size() > 5 && s.substr(s.size() - 5) == ".toml") return load_cluster_toml(s);
  if (s.find('/') != std::string::npos) return load_cluster_toml(s);
  return cluster_preset(s);
}

}  // namespace triax::plan
