// triax-fr's analysis: joins the flight-recorder dumps of all ranks by group (name and world
// ranks) and sequence number, and says which rank never reached a collective the others wait in,
// which ranks left no dump, and which ranks called different operations at the same number.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "triax/core/error.h"
#include "triax/distributed/failure/flight_recorder.h"

namespace triax {
namespace {

struct Call {
  uint64_t seq = 0;
  std::string op, detail, state;
  int peer = -1;
};

struct Member {
  int world_rank = 0;
  std::vector<Call> calls;  // ascending seq
};

struct Dump {
  int rank = 0;
  std::string host, phase;
  std::vector<std::string> reasons;
};

bool p2p(const std::string& op) { return op == "send" || op == "recv" || op == "batch_send_recv"; }
bool done(const Call& c) { return c.state == "completed"; }

std::string describe(const Call& c) { return fmt::format("{} #{} ({})", c.op, c.seq, c.detail); }

using Groups = std::map<std::string, std::pair<std::vector<int>, std::map<int, Member>>>;

// Which dumps report a failure, and which rank failed by itself: an error that reached the
// program ("error: ..." as train_gpt's main writes it) on a rank none of whose calls failed or
// timed out. That error is the cause; the others' timeouts and failed calls are its symptoms.
void own_failures(const std::map<int, Dump>& dumps, const Groups& groups, FrVerdict& v) {
  for (const auto& [r, d] : dumps) {
    bool comm_failed = false;
    for (const auto& [key, gm] : groups)
      if (auto it = gm.second.find(r); it != gm.second.end())
        for (const Call& c : it->second.calls) comm_failed |= c.state == "failed" || c.state == "timed_out";
    const bool failed = comm_failed || std::any_of(d.reasons.begin(), d.reasons.end(), [](const std::string& s) {
                          return s != "SIGUSR2" && s != "exit";
                        });
    if (failed) v.failed_ranks.push_back(r);
    if (comm_failed) continue;
    for (const auto& reason : d.reasons)
      if (reason.rfind("error: ", 0) == 0) {
        v.findings.push_back(fmt::format("rank {} (host {}) failed outside the communicators, while in {}: {}", r,
                                         d.host, d.phase.empty() ? "an unknown phase" : d.phase, reason.substr(7)));
        break;
      }
  }
}

}  // namespace

namespace {

// Reads every dump: one Dump per rank and, per group, each member's calls in number order.
void read_dumps(const std::vector<std::string>& paths, std::map<int, Dump>& dumps, Groups& groups) {
  for (const auto& path : paths) {
    std::ifstream in(path);
    if (!in) TRIAX_THROW(IoError, "{}: cannot open the flight-recorder dump", path);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
      Dump d;
      d.rank = j.at("rank").get<int>();
      d.host = j.value("host", "");
      d.phase = j.value("phase", "");
      d.reasons = j.value("reasons", std::vector<std::string>{});
      if (dumps.count(d.rank)) TRIAX_THROW(IoError, "{}: a second dump of rank {}", path, d.rank);
      for (const auto& g : j.at("groups")) {
        const auto ranks = g.at("world_ranks").get<std::vector<int>>();
        const std::string key = fmt::format("'{}' (world ranks [{}])", g.at("name").get<std::string>(),
                                            fmt::join(ranks, ","));
        auto& [members_ranks, members] = groups[key];
        members_ranks = ranks;
        Member m;
        m.world_rank = d.rank;
        for (const auto& c : g.at("calls"))
          m.calls.push_back(Call{c.at("seq").get<uint64_t>(), c.at("op").get<std::string>(),
                                 c.at("detail").get<std::string>(), c.at("state").get<std::string>(),
                                 c.value("peer", -1)});
        std::sort(m.calls.begin(), m.calls.end(), [](const Call& a, const Call& b) { return a.seq < b.seq; });
        members[d.rank] = std::move(m);
      }
      dumps[d.rank] = std::move(d);
    } catch (const nlohmann::json::exception& e) {
      TRIAX_THROW(IoError, "{}: not a triax flight-recorder dump: {}", path, e.what());
    }
  }
}

// The members of a group that are behind the lowest call some member waits in: never reached it,
// issued it but never waited, or left no dump.
void find_laggards(const std::string& key, const Groups::mapped_type& gm, const std::map<int, Dump>& dumps,
                   FrVerdict& v) {
  const auto& [ranks, members] = gm;
  // The lowest collective each rank has issued but not completed.
  std::map<int, const Call*> pending;
  for (const auto& [r, m] : members)
    for (const auto& c : m.calls)
      if (!done(c) && !p2p(c.op)) {
        pending[r] = &c;
        break;
      }
  if (!pending.empty()) {
    // The lowest number some rank waits in; the members that are not waiting there are behind.
    const Call* first = nullptr;
    for (const auto& [r, c] : pending)
      if (c->state != "enqueued" && (!first || c->seq < first->seq)) first = c;
    std::vector<int> waiting;
    if (first)
      for (const auto& [r, c] : pending)
        if (c->seq == first->seq && c->state != "enqueued") waiting.push_back(r);
    for (int r : first ? ranks : std::vector<int>{}) {
      if (std::find(waiting.begin(), waiting.end(), r) != waiting.end()) continue;
      auto it = members.find(r);
      if (it == members.end()) {
        v.findings.push_back(fmt::format("rank {} left no dump: it died or was killed before {} of group {}, "
                                         "in which ranks [{}] wait",
                                         r, describe(*first), key, fmt::join(waiting, ",")));
        continue;
      }
      const auto& calls = it->second.calls;
      const auto at = std::find_if(calls.begin(), calls.end(), [&](const Call& c) { return c.seq == first->seq; });
      const bool beyond = std::any_of(calls.begin(), calls.end(), [&](const Call& c) { return c.seq > first->seq; });
      const auto d = dumps.find(r);
      const std::string phase =
          d != dumps.end() && !d->second.phase.empty() ? fmt::format(". Rank {} was in: {}", r, d->second.phase) : "";
      if (at != calls.end() && at->state == "enqueued" && !beyond) {
        v.findings.push_back(fmt::format("rank {} issued {} of group {} but never waited for it (it stopped making "
                                         "progress elsewhere); ranks [{}] wait in it{}",
                                         r, describe(*first), key, fmt::join(waiting, ","), phase));
        continue;
      }
      if (at != calls.end() || beyond) continue;
      const std::string last = calls.empty() ? std::string("it issued no call on this group")
                                             : fmt::format("its last call there was {} ({})", describe(calls.back()),
                                                           calls.back().state);
      v.findings.push_back(fmt::format("rank {} never reached {} of group {}: {}; ranks [{}] wait in it{}", r,
                                       describe(*first), key, last, fmt::join(waiting, ","), phase));
    }
  }
}

// Different operations or sizes at the same number of one group.
void find_mismatches(const std::string& key, const Groups::mapped_type& gm, FrVerdict& v) {
  const auto& members = gm.second;
  // Different operations or sizes at the same number.
  std::map<uint64_t, std::vector<std::pair<int, const Call*>>> by_seq;
  for (const auto& [r, m] : members)
    for (const auto& c : m.calls)
      if (!p2p(c.op)) by_seq[c.seq].push_back({r, &c});
  for (const auto& [seq, calls] : by_seq) {
    for (size_t i = 1; i < calls.size(); ++i) {
      const Call& a = *calls[0].second;
      const Call& b = *calls[i].second;
      if (a.op != b.op || a.detail != b.detail) {
        v.findings.push_back(fmt::format("group {} #{}: rank {} called {} ({}) but rank {} called {} ({})", key, seq,
                                         calls[0].first, a.op, a.detail, calls[i].first, b.op, b.detail));
        break;
      }
    }
  }
}

}  // namespace

FrVerdict analyze_flight_records(const std::vector<std::string>& paths) {
  FrVerdict v;
  std::map<int, Dump> dumps;
  // group key "name [world ranks]" -> members that recorded it
  Groups groups;
  read_dumps(paths, dumps, groups);
  for (const auto& [r, d] : dumps)
    v.notes.push_back(fmt::format("rank {} (host {}): dumped on {}; phase: {}", r, d.host, fmt::join(d.reasons, ", "),
                                  d.phase.empty() ? "unknown" : d.phase));
  own_failures(dumps, groups, v);
  for (const auto& [key, gm] : groups) {
    find_laggards(key, gm, dumps, v);
    find_mismatches(key, gm, v);
  }
  return v;
}

}  // namespace triax
