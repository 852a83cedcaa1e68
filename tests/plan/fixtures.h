// Round-number clusters and models for the planner tests, so expected times can be written out
// by hand, plus a scratch directory for the file-format tests.
#pragma once
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "triax/plan/cluster.h"
#include "triax/plan/model_shape.h"

namespace triax::plan::test {

// 4 nodes x 8 devices; 100 TFLOP/s at efficiency 1; 1000 GB/s memory; 100 GB/s intra links;
// 8 NICs of 10 GB/s; 1 us per step everywhere; 10 us launch; 2 nodes per access switch.
inline Cluster round_cluster() {
  Cluster c;
  c.name = "round";
  c.gpus_per_node = 8;
  c.nodes = 4;
  c.peak_tflops_bf16 = 100;
  c.peak_tflops_fp32 = 10;
  c.gemm_efficiency = 1;
  c.kernel_overhead_us = 0;
  c.memory_gib = 64;
  c.memory_gbps = 1000;
  c.memory_efficiency = 1;
  c.reserved_gib = 1;
  c.intra_gbps = 100;
  c.intra_efficiency = 1;
  c.intra_latency_us = 1;
  c.nics_per_node = 8;
  c.nic_gbps = 10;
  c.nic_efficiency = 1;
  c.inter_latency_us = 1;
  c.collective_launch_us = 10;
  c.collective_buffer_mib = 0;
  c.nodes_per_access = 2;
  c.access_per_aggregation = 1;
  c.oversub_access = 2;
  c.oversub_aggregation = 3;
  c.oversub_core = 1;
  return c;
}

inline ModelShape small_model() {
  ModelShape m;
  m.name = "small";
  m.layers = 8;
  m.hidden = 512;
  m.heads = 8;
  m.vocab = 1024;
  m.seq = 256;
  m.global_batch = 64;
  return m;
}

// A fresh directory under the system temp dir, removed when the object goes away.
class ScratchDir {
 public:
  ScratchDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() / ("triax_plan_test_" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    const auto p = path_ / name;
    std::ofstream(p) << text;
    return p;
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace triax::plan::test
