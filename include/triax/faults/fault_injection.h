// Fault injection for testing failure handling, off unless TRIAX_FAULT is set:
// TRIAX_FAULT=RANK:ITERATION:KIND[:ARG][,...] with KIND kill | exit | throw | hang | slow:MS | nan
// (docs/FAULTS.md). The trainer calls the hooks; a fault fires on world rank RANK at 1-based
// iteration ITERATION (slow: from then on). kill and exit end the process on purpose.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace triax {

enum class FaultKind { kill, exit, throw_error, hang, slow, nan };
std::string_view fault_kind_name(FaultKind k);

struct Fault {
  int rank = 0;
  int64_t iteration = 1;
  FaultKind kind = FaultKind::kill;
  int64_t ms = 0;  // slow: milliseconds per iteration
};

// Parses a TRIAX_FAULT value; ConfigError naming the entry and what was expected.
std::vector<Fault> parse_faults(std::string_view spec);

class FaultInjector {
 public:
  FaultInjector() = default;
  FaultInjector(std::vector<Fault> faults, int world_rank);
  // From TRIAX_FAULT (none when unset or empty).
  static FaultInjector from_env(int world_rank);
  bool any() const { return !faults_.empty(); }

  // At the start of iteration `it`, inside the step: kill (SIGKILL itself), exit (status 1
  // without finalising) and throw (triax::Error) fire here; slow sleeps its milliseconds.
  // Each prints one line naming the rank and iteration on stderr first.
  void at_step_start(int64_t it) const;
  // hang: called inside a collective-bearing phase; never returns when the fault is due.
  void maybe_hang(int64_t it) const;
  // nan: true when this rank poisons one gradient element at iteration it.
  bool nan_due(int64_t it) const;

 private:
  std::vector<Fault> faults_;  // this rank's only
  int rank_ = 0;
};

}  // namespace triax
