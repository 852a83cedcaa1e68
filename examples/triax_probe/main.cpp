// triax-probe: run one rank per node under mpirun or srun; every rank measures its node (GEMM,
// STREAM triad, latency with its peers, random 4 KiB read IOPS on --io-dir), rank 0 computes
// the resource score (0.4 compute + 0.3 memory + 0.2 latency + 0.1 IOPS, each against the
// cluster median) and writes a table, --json, --prometheus and an ordered --hostfile.
//   mpirun -np 16 --map-by ppr:1:node triax-probe --io-dir /checkpoints --hostfile hosts.txt
// --score-from FILE re-scores the nodes of an earlier --json file (other weights, threshold);
// --forecast FILE (triax-forecast predict --json) orders the hostfile by score x (1 - predicted);
// --rdma prints the HCAs, ports, GIDs and the NCCL_IB_HCA / NCCL_IB_GID_INDEX / NCCL_SOCKET_IFNAME to use.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include <triax/core/error.h>
#include <triax/core/log.h>
#include <triax/distributed/bootstrap/bootstrap.h>
#include <triax/probe/measure.h>
#include <triax/distributed/comm/rdma.h>
#include <triax/probe/score.h>

namespace {

void write_file(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  if (path == "-") {
    std::fputs(text.c_str(), stdout);
    return;
  }
  std::ofstream f(path, std::ios::trunc);
  f << text;
  if (!f) throw triax::IoError(fmt::format("{}: cannot write", path));
}

std::vector<triax::probe::NodeMeasure> read_measurements(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw triax::IoError(fmt::format("{}: cannot open", path));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw triax::ConfigError(fmt::format("{}: not JSON: {}", path, e.what()));
  }
  if (!j.contains("nodes") || !j["nodes"].is_array())
    throw triax::ConfigError(fmt::format("{}: no \"nodes\" array (write one with triax-probe --json)", path));
  std::vector<triax::probe::NodeMeasure> out;
  for (size_t i = 0; i < j["nodes"].size(); ++i) {
    const auto& n = j["nodes"][i];
    try {
      out.push_back({n.at("host").get<std::string>(), n.value("rank", static_cast<int>(i)), n.at("gemm_flops").get<double>(),
                     n.at("triad_bytes_per_second").get<double>(), n.at("latency_seconds").get<double>(),
                     n.at("read_iops").get<double>(), n.value("slots", 1)});
    } catch (const nlohmann::json::exception& e) {
      throw triax::ConfigError(fmt::format("{}: nodes[{}]: {}", path, i, e.what()));
    }
  }
  return out;
}

// Reads the forecast and applies it; its errors name the file.
void apply_forecast_file(std::vector<triax::probe::NodeScore>& scores, const std::string& path) {
  if (path.empty()) return;
  const auto forecast = triax::probe::read_forecast(path);
  try {
    triax::probe::apply_forecast(scores, forecast);
  } catch (const triax::ConfigError& e) {
    throw triax::ConfigError(fmt::format("{}: {}", path, e.what()));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"triax-probe: per-node GEMM, memory bandwidth, latency and IOPS, and the resource score"};
  int gemm_n = 1024, reps = 3, latency_iters = 200, slots = 1;
  double triad_mib = 256, io_mib = 64, io_seconds = 1.0, threshold = 0.8;
  std::string io_dir = ".", json_path, prom_path, hostfile, score_from, forecast_path;
  std::vector<double> weights{0.4, 0.3, 0.2, 0.1};
  bool exclude = false, rdma = false;
  std::string sysfs_root;
  app.add_option("--gemm-n", gemm_n, "square GEMM size")->capture_default_str();
  app.add_option("--reps", reps, "repetitions (best is kept)")->capture_default_str();
  app.add_option("--triad-mib", triad_mib, "STREAM triad array size (MiB per array)")->capture_default_str();
  app.add_option("--latency-iters", latency_iters, "exchanges per peer offset")->capture_default_str();
  app.add_option("--io-dir", io_dir, "directory to measure (the checkpoint directory)")->capture_default_str();
  app.add_option("--io-mib", io_mib, "size of the file read at random")->capture_default_str();
  app.add_option("--io-seconds", io_seconds, "seconds of random reads")->capture_default_str();
  app.add_option("--weights", weights, "compute,memory,latency,iops weights")->delimiter(',')->expected(4)->capture_default_str();
  app.add_option("--straggler-threshold", threshold, "nodes scoring below this are stragglers")->capture_default_str();
  app.add_option("--slots", slots, "slots per host in the hostfile")->capture_default_str();
  app.add_option("--json", json_path, "write the measurements and scores as JSON ('-': stdout)");
  app.add_option("--prometheus", prom_path, "write Prometheus text (a node-exporter textfile)");
  app.add_option("--hostfile", hostfile, "write an mpirun hostfile, best node first");
  app.add_flag("--exclude-stragglers", exclude, "comment stragglers out of the hostfile");
  app.add_option("--score-from", score_from, "re-score an earlier --json file instead of measuring");
  app.add_option("--forecast", forecast_path,
                 "triax-forecast predict --json output: order by score x (1 - predicted utilisation)");
  app.add_flag("--rdma", rdma, "only discover RDMA devices and print the NCCL settings to use");
  app.add_option("--sysfs-root", sysfs_root, "with --rdma: read this tree instead of /sys (a fixture)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::unique_ptr<triax::Bootstrap> boot;
  try {
    if (rdma) {
      const auto info = sysfs_root.empty() ? triax::probe::discover_rdma() : triax::probe::read_rdma_sysfs(sysfs_root);
      std::fputs(triax::probe::describe(info, triax::probe::suggest_nccl(info)).c_str(), stdout);
      return 0;
    }
    const triax::probe::ScoreWeights w{weights[0], weights[1], weights[2], weights[3]};
    w.validate();
    std::vector<triax::probe::NodeMeasure> nodes;
    bool root = true;
    if (!score_from.empty()) {
      nodes = read_measurements(score_from);
    } else {
      boot = triax::Bootstrap::create();
      auto world = boot->world();
      root = world->rank() == 0;
      triax::log::set_rank(world->size() > 1 ? world->rank() : -1);
      triax::probe::NodeMeasure m;
      m.host = triax::host_name();
      m.rank = world->rank();
      m.slots = slots;
      m.gemm_flops = triax::probe::measure_gemm_flops(gemm_n, reps);
      m.triad_bytes_s = triax::probe::measure_triad_bytes_s(static_cast<size_t>(triad_mib * (1 << 20) / 8), reps);
      const auto lat = triax::probe::measure_latency(*world, latency_iters);
      // One rank alone has no peers: its latency term is then the floor of 1 ns (neutral).
      m.latency_s = std::max(1e-9, 0.5 * (lat.p2p_s + lat.allreduce_s));
      const auto io = triax::probe::measure_read_iops(io_dir, static_cast<size_t>(io_mib * (1 << 20)), io_seconds,
                                                      static_cast<uint64_t>(world->rank()) + 1);
      m.read_iops = io.iops;
      if (!io.direct) triax::log::warn("{}: O_DIRECT not supported; IOPS measured after dropping the file's cached pages", io_dir);
      nlohmann::json mine{{"host", m.host},      {"rank", m.rank},
                          {"slots", m.slots},    {"gemm_flops", m.gemm_flops},
                          {"triad_bytes_per_second", m.triad_bytes_s}, {"latency_seconds", m.latency_s},
                          {"read_iops", m.read_iops}};
      const auto all = boot->all_gather(mine.dump());
      for (const auto& s : all) {
        const auto j = nlohmann::json::parse(s);
        nodes.push_back({j["host"], j["rank"], j["gemm_flops"], j["triad_bytes_per_second"], j["latency_seconds"],
                         j["read_iops"], j["slots"]});
      }
    }
    if (root) {
      auto scores = triax::probe::score_nodes(nodes, w, threshold);
      apply_forecast_file(scores, forecast_path);
      std::fputs(triax::probe::render_table(scores).c_str(), stdout);
      write_file(json_path, triax::probe::render_json(scores, w, threshold));
      write_file(prom_path, triax::probe::render_prometheus(scores));
      write_file(hostfile, triax::probe::render_hostfile(scores, exclude));
      size_t stragglers = 0;
      for (const auto& s : scores) stragglers += s.straggler;
      std::printf("%zu node(s), %zu straggler(s) below %.2f\n", scores.size(), stragglers, threshold);
    }
  } catch (const triax::ConfigError& e) {
    std::fprintf(stderr, "triax-probe: configuration error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "triax-probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
