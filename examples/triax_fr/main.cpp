// triax-fr: the verdict over a job's flight-recorder dumps (triax_fr_rank<R>.json, docs/FAULTS.md):
// which rank did not reach which sequence number of which group, which ranks left no dump, and
// which ranks called different operations or sizes at the same number.
//   triax-fr DUMP... | triax-fr DIR
// Exit status: 0 nothing wrong found, 1 findings printed or a failure the dumps report but do not
// explain, 3 a dump cannot be read, 2 usage.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <triax/core/error.h>
#include <triax/distributed/failure/flight_recorder.h>
#include <triax/distributed/failure/job_failure.h>

int main(int argc, char** argv) {
  CLI::App app{"triax-fr: reads the flight-recorder dumps of all ranks and prints the verdict"};
  std::vector<std::string> inputs;
  app.add_option("dumps", inputs, "dump files, or a directory holding triax_fr_rank*.json")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : triax::kExitUsage;
  }
  try {
    std::vector<std::string> files;
    for (const auto& in : inputs) {
      if (std::filesystem::is_directory(in)) {
        for (const auto& e : std::filesystem::directory_iterator(in)) {
          const std::string n = e.path().filename().string();
          if (n.rfind("triax_fr_rank", 0) == 0 && n.size() > 5 && n.substr(n.size() - 5) == ".json")
            files.push_back(e.path().string());
        }
      } else {
        files.push_back(in);
      }
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) throw triax::IoError("no triax_fr_rank*.json dump in " + fmt::format("{}", fmt::join(inputs, " ")));
    const triax::FrVerdict v = triax::analyze_flight_records(files);
    for (const auto& n : v.notes) std::printf("%s\n", n.c_str());
    if (v.findings.empty() && !v.failed_ranks.empty()) {
      // Something went wrong but these dumps do not show what: not a clean bill of health.
      std::printf("verdict: none found: ranks [%s] report a failure, but no rank is behind and no call mismatched in "
                  "these %zu dumps (the rank at fault may have left no dump, or stopped before any call these rings "
                  "hold)\n",
                  fmt::format("{}", fmt::join(v.failed_ranks, ",")).c_str(), files.size());
      return 1;
    }
    if (v.findings.empty()) {
      std::printf("verdict: no rank behind and no mismatched call in %zu dumps\n", files.size());
      return 0;
    }
    for (const auto& f : v.findings) std::printf("verdict: %s\n", f.c_str());
    return 1;
  } catch (const std::exception& e) {
    const int code = triax::exit_code_for(e);
    std::fprintf(stderr, "triax-fr: %s: %s\n", std::string(triax::exit_code_name(code)).c_str(), e.what());
    return code;
  }
}
