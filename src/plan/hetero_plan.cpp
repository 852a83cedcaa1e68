// Heterogeneous plans: their cost from the homogeneous model's stage pieces (stage_costs,
// sync_seconds) on each class, and the search over layouts, placements, layer splits and shares.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include "triax/core/error.h"
#include "triax/plan/hetero.h"

namespace triax::plan {

long HeteroPlan::microbatches() const {
  return std::accumulate(replica_microbatches.begin(), replica_microbatches.end(), 0L);
}

std::vector<int> HeteroPlan::ranks_per_class(size_t classes) const {
  std::vector<int> n(classes, 0);
  for (int d = 0; d < layout.dp; ++d)
    for (int s = 0; s < layout.pp; ++s) n[size_t(class_of(d, s))] += layout.tp;
  return n;
}

namespace {

#define TRIAX_REQUIRE(ok, ...) \
  if (!(ok)) TRIAX_THROW(ConfigError, __VA_ARGS__)

void check_plan(const ModelShape& m, const HeteroCluster& hc, const HeteroPlan& p) {
  const Layout& l = p.layout;
  TRIAX_REQUIRE(l.vpp == 1 && l.schedule == Schedule::one_f_one_b && l.cp == 1,
                "heterogeneous plans run 1F1B with vpp 1 and cp 1 (got {})", describe(l));
  TRIAX_REQUIRE(p.stage_layers.size() == size_t(l.pp), "{} layer counts for pp {}", p.stage_layers.size(), l.pp);
  const int layers = std::accumulate(p.stage_layers.begin(), p.stage_layers.end(), 0);
  TRIAX_REQUIRE(layers == m.layers, "pipeline layers {} sum to {}, the model has {}", fmt::join(p.stage_layers, ","),
                layers, m.layers);
  TRIAX_REQUIRE(p.stage_classes.empty() || p.stage_classes.size() == size_t(l.pp), "{} stage classes for pp {}",
                p.stage_classes.size(), l.pp);
  TRIAX_REQUIRE(!p.stage_classes.empty() || p.replica_classes.size() == size_t(l.dp), "{} replica classes for dp {}",
                p.replica_classes.size(), l.dp);
  TRIAX_REQUIRE(p.replica_microbatches.size() == size_t(l.dp), "{} micro-batch shares for dp {}",
                p.replica_microbatches.size(), l.dp);
  for (long n : p.replica_microbatches) TRIAX_REQUIRE(n >= 1, "every replica needs >= 1 micro-batch, got {}", n);
  for (const auto* v : {&p.stage_classes, &p.replica_classes})
    for (int c : *v) TRIAX_REQUIRE(c >= 0 && size_t(c) < hc.classes.size(), "class index {} out of range", c);
  const std::vector<int> used = p.ranks_per_class(hc.classes.size());
  for (size_t c = 0; c < used.size(); ++c)
    TRIAX_REQUIRE(used[c] <= hc.classes[c].devices(), "the plan puts {} ranks on class '{}', which has {} devices",
                  used[c], hc.classes[c].name, hc.classes[c].devices());
}

#undef TRIAX_REQUIRE

}  // namespace

Cluster pricing_cluster(const HeteroCluster& hc, int cls) {
  Cluster c = hc.classes[size_t(cls)].device;
  if (c.nics_per_node == 0 && hc.classes.size() > 1) {
    c.gpus_per_node = hc.total_devices();
    c.nodes = 1;
  }
  return c;
}

namespace {

// Stage costs of the plan's layout on one class, per micro-batch count (memory depends on it).
class StageCostCache {
 public:
  StageCostCache(const ModelShape& m, const HeteroCluster& hc, const HeteroPlan& p) : m_(m), hc_(hc), p_(p) {
    for (size_t c = 0; c < hc.classes.size(); ++c) nets_.emplace_back(pricing_cluster(hc, int(c)));
  }
  const StageCost& at(int cls, long mb, int stage) {
    auto key = std::make_pair(cls, std::min<long>(mb, p_.layout.pp));  // min(m, pp - s) in flight
    auto it = cache_.find(key);
    if (it == cache_.end())
      it = cache_.emplace(key, stage_costs(m_, nets_[size_t(cls)], p_.layout, p_.stage_layers, key.second)).first;
    return it->second[size_t(stage)];
  }

 private:
  const ModelShape& m_;
  const HeteroCluster& hc_;
  const HeteroPlan& p_;
  std::vector<CollectiveModel> nets_;
  std::map<std::pair<int, long>, std::vector<StageCost>> cache_;
};

// The ranks of one class time-slicing its nodes' cores (Cluster::cores_per_node): what the class's
// busy time per node over its cores exceeds `dependency_bound` by.
double class_core_sharing(const Cluster& c, int ranks, double busy_all_ranks, double dependency_bound) {
  const int on_node = std::min(ranks, c.gpus_per_node);
  if (c.cores_per_node <= 0 || on_node <= c.cores_per_node || ranks == 0) return 0;
  return std::max(0.0, busy_all_ranks * on_node / ranks / c.cores_per_node - dependency_bound);
}

}  // namespace

HeteroEstimate estimate_hetero(const ModelShape& m, const HeteroCluster& hc, const HeteroPlan& plan) {
  check_plan(m, hc, plan);
  const Layout& l = plan.layout;
  const int P = l.pp, D = l.dp, K = int(hc.classes.size());
  StageCostCache costs(m, hc, plan);
  HeteroEstimate est;
  est.plan = plan;
  est.classes.resize(size_t(K));
  std::vector<double> busy(size_t(K), 0);
  double pipeline = 0;
  for (int d = 0; d < D; ++d) {
    const long mb = plan.replica_microbatches[size_t(d)];
    std::vector<double> st(static_cast<size_t>(P));
    for (int s = 0; s < P; ++s) {
      const int c = plan.class_of(d, s);
      const StageCost& sc = costs.at(c, mb, s);
      st[size_t(s)] = sc.seconds;
      est.optimizer = std::max(est.optimizer, sc.optimizer);
      busy[size_t(c)] += l.tp * (double(mb) * sc.seconds + sc.optimizer);
      ClassUse& u = est.classes[size_t(c)];
      u.ranks += l.tp;
      if (sc.memory.total() > u.memory.total()) u.memory = sc.memory;
    }
    // 1F1B: a pass through every stage plus (m - 1) steps of the slowest (cost_model.cpp).
    const double sum = std::accumulate(st.begin(), st.end(), 0.0);
    est.replica_seconds.push_back(sum + double(mb - 1) * *std::max_element(st.begin(), st.end()));
    pipeline = std::max(pipeline, est.replica_seconds.back());
    est.stage_seconds.push_back(std::move(st));
  }
  // The step's synchronisation on the link of the groups: one class's own, or between classes.
  const std::vector<int> used = plan.ranks_per_class(size_t(K));
  const int classes_used = int(std::count_if(used.begin(), used.end(), [](int n) { return n > 0; }));
  const Cluster link =
      classes_used == 1
          ? pricing_cluster(hc, int(std::find_if(used.begin(), used.end(), [](int n) { return n > 0; }) - used.begin()))
          : hc.between;
  const long most = *std::max_element(plan.replica_microbatches.begin(), plan.replica_microbatches.end());
  est.sync = sync_seconds(m, CollectiveModel(link), l, plan.stage_layers, most);
  const double bound = pipeline + est.sync + est.optimizer;
  for (int c = 0; c < K; ++c)
    est.core_sharing = std::max(est.core_sharing, class_core_sharing(hc.classes[size_t(c)].device, used[size_t(c)],
                                                                     busy[size_t(c)], bound));
  est.seconds = bound + est.core_sharing;
  for (int c = 0; c < K; ++c) {
    ClassUse& u = est.classes[size_t(c)];
    u.name = hc.classes[size_t(c)].name;
    u.memory.capacity = hc.classes[size_t(c)].device.memory_gib * 1024.0 * 1024.0 * 1024.0;
    if (u.ranks > 0) u.busy = busy[size_t(c)] / u.ranks;
    u.utilisation = u.busy / est.seconds;
    if (u.ranks > 0 && !u.memory.fits()) est.fits = false;
  }
  est.tokens_per_second = double(plan.microbatches()) * l.micro_batch * m.seq / est.seconds;
  return est;
}

std::vector<int> balance_layers(int layers, const std::vector<double>& a, const std::vector<double>& b,
                                const std::vector<int>& cap) {
  const size_t P = a.size();
  if (layers < int(P)) return {};
  std::vector<int> n(P, 1);
  for (size_t s = 0; s < P; ++s)
    if (cap[s] < 1) return {};
  // Each next layer to the stage that stays fastest with it: optimal for times linear in the layers.
  for (int left = layers - int(P); left > 0; --left) {
    size_t pick = P;
    for (size_t s = 0; s < P; ++s) {
      if (n[s] >= cap[s]) continue;
      if (pick == P || a[s] + b[s] * (n[s] + 1) < a[pick] + b[pick] * (n[pick] + 1)) pick = s;
    }
    if (pick == P) return {};
    ++n[pick];
  }
  return n;
}

std::vector<long> balance_microbatches(long total, const std::vector<double>& sum, const std::vector<double>& max) {
  const size_t D = sum.size();
  if (total < long(D)) return {};
  std::vector<long> n(D, 1);
  auto time = [&](size_t d, long k) { return sum[d] + double(k - 1) * max[d]; };
  for (long left = total - long(D); left > 0; --left) {
    size_t pick = 0;
    for (size_t d = 1; d < D; ++d)
      if (time(d, n[d] + 1) < time(pick, n[pick] + 1)) pick = d;
    ++n[pick];
  }
  return n;
}

namespace {

// The even split: layers / pp on each stage (the remainder one more on the first stages), the
// micro-batches / dp on each replica (likewise).
template <class T>
std::vector<T> even_split(T total, int parts) {
  std::vector<T> v(size_t(parts), total / parts);
  for (T r = 0; r < total % parts; ++r) ++v[size_t(r)];
  return v;
}

// Per-stage time and memory, linear in the stage's layers, of stage s on class c: fitted from
// every stage at 1 and at 2 layers.
struct StageLine {
  double a = 0, b = 0;          // seconds = a + b n
  double mem0 = 0, mem1 = 0;    // bytes = mem0 + mem1 n
  double capacity = 0;
  int cap() const {
    if (mem1 <= 0) return mem0 <= capacity ? 1 << 20 : 0;
    return int(std::floor((capacity - mem0) / mem1));
  }
};

StageLine stage_line(const ModelShape& m, const HeteroCluster& hc, const Layout& l, int cls, int s, long mb) {
  const CollectiveModel net(pricing_cluster(hc, cls));
  const StageCost one = stage_costs(m, net, l, std::vector<int>(size_t(l.pp), 1), mb)[size_t(s)];
  const StageCost two = stage_costs(m, net, l, std::vector<int>(size_t(l.pp), 2), mb)[size_t(s)];
  StageLine line;
  line.b = two.seconds - one.seconds;
  line.a = one.seconds - line.b;
  line.mem1 = two.memory.total() - one.memory.total();
  line.mem0 = one.memory.total() - line.mem1;
  line.capacity = one.memory.capacity;
  return line;
}

// The balanced layers of a placement: each stage priced on its class (by replica: the slowest class
// of the stage's ranks, memory capped by the leanest).
std::vector<int> planned_layers(const ModelShape& m, const HeteroCluster& hc, const HeteroPlan& p, long mb) {
  const int P = p.layout.pp;
  std::vector<double> a(size_t(P), 0), b(size_t(P), 0);
  std::vector<int> cap(size_t(P), 1 << 20);
  for (int s = 0; s < P; ++s) {
    std::set<int> classes;
    for (int d = 0; d < p.layout.dp; ++d) classes.insert(p.class_of(d, s));
    for (int c : classes) {
      const StageLine line = stage_line(m, hc, p.layout, c, s, mb);
      if (line.a + line.b * 4 > a[size_t(s)] + b[size_t(s)] * 4) a[size_t(s)] = line.a, b[size_t(s)] = line.b;
      cap[size_t(s)] = std::min(cap[size_t(s)], line.cap());
    }
  }
  return balance_layers(m.layers, a, b, cap);
}

// The balanced shares: each replica's pass and slowest stage at its layers.
std::vector<long> planned_shares(const ModelShape& m, const HeteroCluster& hc, const HeteroPlan& p, long total) {
  HeteroPlan probe = p;
  probe.replica_microbatches.assign(size_t(p.layout.dp), 1);
  const HeteroEstimate e = estimate_hetero(m, hc, probe);
  std::vector<double> sum, max;
  for (const auto& st : e.stage_seconds) {
    sum.push_back(std::accumulate(st.begin(), st.end(), 0.0));
    max.push_back(*std::max_element(st.begin(), st.end()));
  }
  return balance_microbatches(total, sum, max);
}

// Placements of a layout: stages in contiguous blocks of one class each (every order of the
// classes), or whole replicas on classes (counts per class); only those within each class's devices.
std::vector<HeteroPlan> placements(const HeteroCluster& hc, const Layout& l, const HeteroSearchSpace& space,
                                   long& over_capacity) {
  const int K = int(hc.classes.size());
  std::vector<HeteroPlan> out;
  std::set<std::vector<int>> seen;
  auto add = [&](std::vector<int> stages, std::vector<int> replicas) {
    HeteroPlan p;
    p.layout = l;
    p.stage_classes = std::move(stages);
    p.replica_classes = std::move(replicas);
    const std::vector<int> used = p.ranks_per_class(size_t(K));
    for (int c = 0; c < K; ++c)
      if (used[size_t(c)] > hc.classes[size_t(c)].devices()) {
        ++over_capacity;
        return;
      }
    std::vector<int> key = p.stage_classes;
    key.push_back(-1);
    key.insert(key.end(), p.replica_classes.begin(), p.replica_classes.end());
    if (seen.insert(key).second) out.push_back(std::move(p));
  };
  if (!space.stage_classes.empty()) {
    add(space.stage_classes, {});
    return out;
  }
  // Whole replicas per class: dp split into K counts.
  std::vector<int> counts(size_t(K), 0);
  auto replicas = [&](auto& self, int c, int left) -> void {
    if (c == K - 1) {
      counts[size_t(c)] = left;
      std::vector<int> r;
      for (int k = 0; k < K; ++k) r.insert(r.end(), size_t(counts[size_t(k)]), k);
      add({}, r);
      return;
    }
    for (int n = 0; n <= left; ++n) {
      counts[size_t(c)] = n;
      self(self, c + 1, left - n);
    }
  };
  replicas(replicas, 0, l.dp);
  if (l.pp < 2) return out;
  // Contiguous blocks of stages per class, in every order of the classes.
  std::vector<int> order(static_cast<size_t>(K));
  std::iota(order.begin(), order.end(), 0);
  do {
    auto blocks = [&](auto& self, int k, int left, std::vector<int> stages) -> void {
      if (k == K - 1) {
        stages.insert(stages.end(), size_t(left), order[size_t(k)]);
        if (std::set<int>(stages.begin(), stages.end()).size() > 1) add(stages, {});  // one class: by replica
        return;
      }
      for (int n = 0; n <= left; ++n) {
        std::vector<int> more = stages;
        more.insert(more.end(), size_t(n), order[size_t(k)]);
        self(self, k + 1, left - n, more);
      }
    };
    blocks(blocks, 0, l.pp, {});
  } while (std::next_permutation(order.begin(), order.end()));
  return out;
}

// The placement's planned and even plans; nullopt-like empty layers when no split exists.
bool price_placement(const ModelShape& m, const HeteroCluster& hc, HeteroPlan p, long total,
                     const HeteroSearchSpace& space, HeteroChoice& out) {
  const int P = p.layout.pp, D = p.layout.dp;
  HeteroPlan even = p;
  even.stage_layers = space.pipeline_layers.empty() ? even_split(m.layers, P) : space.pipeline_layers;
  even.replica_microbatches = space.dp_microbatches.empty() ? even_split(total, D) : space.dp_microbatches;
  if (space.even) {
    p = even;
  } else {
    p.stage_layers = space.pipeline_layers.empty() ? planned_layers(m, hc, p, (total + D - 1) / D) : space.pipeline_layers;
    if (p.stage_layers.empty()) return false;
    p.replica_microbatches = space.dp_microbatches.empty() ? planned_shares(m, hc, p, total) : space.dp_microbatches;
    if (p.replica_microbatches.empty()) return false;
  }
  // ZeRO 2/3 reduce (and gather) every micro-batch's units over all replicas at once, so the runtime
  // takes only equal shares there (docs/HETEROGENEOUS.md): uneven work then goes into the stages.
  const auto equal = [](const std::vector<long>& v) { return std::adjacent_find(v.begin(), v.end(), std::not_equal_to<>()) == v.end(); };
  if (p.layout.zero >= 2 && !equal(p.replica_microbatches)) {
    if (!space.dp_microbatches.empty() || !equal(even.replica_microbatches)) return false;
    p.replica_microbatches = even.replica_microbatches;
  }
  if (even.layout.zero >= 2 && !equal(even.replica_microbatches)) return false;
  out.plan = estimate_hetero(m, hc, p);
  out.even = estimate_hetero(m, hc, even);
  return true;
}

template <class T>
std::vector<T> or_all(const std::vector<T>& given, std::vector<T> all) {
  return given.empty() ? all : given;
}

std::vector<int> upto(int n) {
  std::vector<int> v;
  for (int i = 1; i <= n; ++i) v.push_back(i);
  return v;
}

// Layouts of the search: tp dividing the heads within the smallest node, pp up to the layers (1, 2,
// 4, ... unless pinned), dp up to the devices, micro-batch sizes dividing the global batch.
std::vector<Layout> layouts(const ModelShape& m, const HeteroCluster& hc, const HeteroSearchSpace& space) {
  int node = 1 << 30;
  for (const auto& k : hc.classes) node = std::min(node, k.device.gpus_per_node);
  std::vector<int> tps, pps, mbss;
  for (int t : or_all(space.tp, upto(node)))
    if (m.heads % t == 0 && m.kv_head_count() % t == 0 && node % t == 0) tps.push_back(t);
  for (int p = 1; p <= m.layers; p *= 2) pps.push_back(p);
  for (int b = 1; b <= m.global_batch; b *= 2)
    if (m.global_batch % b == 0) mbss.push_back(b);
  std::vector<Layout> out;
  for (int t : tps)
    for (int p : or_all(space.pp, pps))
      for (int d : or_all(space.dp, upto(hc.total_devices() / (t * p))))
        for (int b : or_all(space.micro_batch, mbss))
          for (Recompute r : or_all(space.recompute, {Recompute::none, Recompute::full}))
            for (int z : or_all(space.zero, d > 1 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0})) {
              Layout l = space.base;
              l.tp = t, l.pp = p, l.dp = d, l.micro_batch = b, l.recompute = r, l.zero = z;
              l.vpp = 1, l.cp = 1, l.schedule = Schedule::one_f_one_b;
              out.push_back(l);
            }
  return out;
}

}  // namespace

HeteroSearchResult search_hetero(const ModelShape& m, const HeteroCluster& hc, const HeteroSearchSpace& space) {
  validate(m);
  HeteroSearchResult r;
  std::vector<HeteroChoice> fitting;
  for (const Layout& l : layouts(m, hc, space)) {
    const long total = space.dp_microbatches.empty()
                           ? (m.global_batch % l.micro_batch == 0 ? m.global_batch / l.micro_batch : 0)
                           : std::accumulate(space.dp_microbatches.begin(), space.dp_microbatches.end(), 0L);
    if (total < l.dp || m.layers < l.pp) {
      ++r.invalid;
      continue;
    }
    for (HeteroPlan& p : placements(hc, l, space, r.over_capacity)) {
      HeteroChoice c;
      try {
        if (!price_placement(m, hc, std::move(p), total, space, c)) {
          ++r.no_fit;
          continue;
        }
      } catch (const ConfigError&) {
        ++r.invalid;
        continue;
      }
      if (!std::isfinite(c.plan.seconds) || !std::isfinite(c.even.seconds)) {
        ++r.invalid;  // a link of no bandwidth between the ranks
        continue;
      }
      ++r.priced;
      if (!c.plan.fits) {
        ++r.no_fit;
        continue;
      }
      fitting.push_back(std::move(c));
    }
  }
  std::sort(fitting.begin(), fitting.end(),
            [](const HeteroChoice& a, const HeteroChoice& b) { return a.plan.seconds < b.plan.seconds; });
  if (fitting.size() > size_t(space.top_k)) fitting.resize(size_t(space.top_k));
  r.best = std::move(fitting);
  return r;
}

}  // namespace triax::plan
