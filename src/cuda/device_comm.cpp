// The device communicator (cuda/device_comm.h): routes each call by where its buffers live: host
// spans to the wrapped host communicator, device spans to NCCL (ordered on the compute stream by
// events) or, without NCCL, through pinned host staging buffers to the host communicator.
#include "triax/cuda/device_comm.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <mutex>
#include <vector>

#include "triax/core/cuda_check.h"
#include "triax/core/env.h"
#include "triax/core/error.h"
#include "triax/core/gpu_count.h"
#include "triax/cuda/cuda_backend.h"
#include "triax/distributed/comm/nccl_comm.h"

namespace triax::cuda {

MemoryPlace memory_place(const void* p) noexcept {
  // No usable GPU: nothing can be device memory (and the CUDA runtime is not asked per call).
  static const bool gpu = cuda_device_count() > 0;
  if (!gpu || p == nullptr) return MemoryPlace::host;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // leave no error behind for the next CUDA call
    return MemoryPlace::host;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? MemoryPlace::device : MemoryPlace::host;
}

DevicePath device_path_from_env() {
  return env_choice("TRIAX_DEVICE_COMM", {"nccl", "staged"}, "nccl") == "staged" ? DevicePath::staged
                                                                               : DevicePath::nccl;
}

namespace {

using Clock = std::chrono::steady_clock;

// Pinned host blocks for the staged path, kept for reuse (size classes of powers of two).
class PinnedPool : public std::enable_shared_from_this<PinnedPool> {
 public:
  ~PinnedPool() {
    for (auto& [bytes, p] : free_) (void)cudaFreeHost(p);
  }
  std::shared_ptr<void> get(size_t bytes) {
    size_t cls = 4096;
    while (cls < bytes) cls *= 2;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = free_.find(cls); it != free_.end()) {
        p = it->second;
        free_.erase(it);
      }
    }
    if (!p) TRIAX_CHECK_CUDA(cudaMallocHost(&p, cls));
    return std::shared_ptr<void>(p, [self = shared_from_this(), cls](void* q) {
      std::lock_guard<std::mutex> lock(self->mu_);
      self->free_.emplace(cls, q);
    });
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
};

// A device call on NCCL that the caller has waited for on the device (the compute stream waits for
// it): tested by every later call of the family until NCCL says it is done.
struct Outstanding {
  Work work;
  const void* owner;  // the DeviceComm that issued it (its entries go when it is destroyed)
  Clock::time_point issued;
  std::chrono::milliseconds timeout;
};

// What a communicator and everything split from it share.
struct Family {
  int device = 0;
  cudaStream_t stream = nullptr;
  std::shared_ptr<PinnedPool> pool = std::make_shared<PinnedPool>();
  std::mutex mu;
  std::vector<Outstanding> outstanding;

  void defer(Work w, const void* owner, std::chrono::milliseconds timeout) {
    std::lock_guard<std::mutex> lock(mu);
    outstanding.push_back({std::move(w), owner, Clock::now(), timeout});
  }
  // Drops what completed; throws an NCCL error, or the timeout of a call overdue (which aborts
  // its NCCL communicator, so the compute stream waiting for it moves on).
  void poll() {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < outstanding.size();) {
      Outstanding& o = outstanding[i];
      if (o.work.test()) {
        outstanding.erase(outstanding.begin() + static_cast<std::ptrdiff_t>(i));
        continue;
      }
      if (Clock::now() - o.issued > o.timeout) {
        Work w = std::move(o.work);
        outstanding.erase(outstanding.begin() + static_cast<std::ptrdiff_t>(i));
        w.wait(std::chrono::milliseconds(0));  // raises the call's TimeoutError (unless it just completed)
        continue;
      }
      ++i;
    }
  }
  // Waits on the host for every outstanding call, each until its own deadline (past it, the
  // call's TimeoutError, which aborts its NCCL communicator).
  void drain() {
    std::lock_guard<std::mutex> lock(mu);
    while (!outstanding.empty()) {
      Outstanding o = std::move(outstanding.front());
      outstanding.erase(outstanding.begin());
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(o.timeout - (Clock::now() - o.issued));
      o.work.wait(std::max(left, std::chrono::milliseconds(0)));
    }
  }
  void forget(const void* owner) {
    std::lock_guard<std::mutex> lock(mu);
    std::erase_if(outstanding, [owner](const Outstanding& o) { return o.owner == owner; });
  }
};

// Every live family, for settle_device_waits (which knows only a stream).
struct Registry {
  std::mutex mu;
  std::vector<std::weak_ptr<Family>> families;
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: families may outlive static destruction
  return *r;
}
void enroll(const std::shared_ptr<Family>& f) {
  std::lock_guard<std::mutex> lock(registry().mu);
  std::erase_if(registry().families, [](const std::weak_ptr<Family>& w) { return w.expired(); });
  registry().families.push_back(f);
}

template <class T>
std::span<const T> const_span(const Buffer& b) {
  return std::span<const T>(static_cast<const T*>(b.data), b.count);
}

// One buffer of a call and whether the call reads it (in) and/or writes it (out).
struct Arg {
  Buffer buf;
  bool in = false, out = false;
};
Arg in(Buffer b) { return {b, true, false}; }
Arg out(Buffer b) { return {b, false, true}; }
Arg inout(Buffer b) { return {b, true, true}; }

bool empty(const Buffer& b) { return b.count == 0 || b.data == nullptr; }

// A host call: its Work, passed through.
struct Forward final : WorkImpl {
  explicit Forward(Work w) : inner(std::move(w)) {}
  bool test() override { return inner.test(); }
  Work inner;
};

// An NCCL call. test() is the plain question (has NCCL finished it? then the compute stream is
// ordered after it, at no cost), so polling for progress (DP buckets during backward, pipeline
// sends) never makes the compute stream wait early. wait() is a device-side dependency: the
// compute stream waits for the call's completion event, the host goes on, and the NCCL Work joins
// the family's outstanding list, where later calls test it for errors and timeouts.
struct DeviceWork final : WorkImpl {
  DeviceWork(Work w, std::shared_ptr<Family> f, const void* o, std::chrono::milliseconds t)
      : inner(std::move(w)), family(std::move(f)), owner(o), timeout(t) {}
  bool test() override {
    if (deferred) return true;
    if (!inner.test()) return false;
    wait_on_stream(inner, family->stream);  // complete already: keeps the order explicit
    return true;
  }
  bool wait_on_device() override {
    if (!deferred) {
      wait_on_stream(inner, family->stream);
      deferred = true;
      family->defer(std::move(inner), owner, timeout);
    }
    return true;
  }
  Work inner;
  std::shared_ptr<Family> family;
  const void* owner;
  std::chrono::milliseconds timeout;
  bool deferred = false;
};

// A staged call: complete once the host call is and the outputs are back on the device.
struct StagedWork final : WorkImpl {
  bool test() override {
    if (!inner.test()) return false;
    if (!blocks.empty()) {
      for (size_t i = 0; i < args.size(); ++i)
        if (args[i].out && !empty(args[i].buf))
          TRIAX_CHECK_CUDA(cudaMemcpyAsync(args[i].buf.data, host[i].data, args[i].buf.bytes(),
                                           cudaMemcpyHostToDevice, stream));
      TRIAX_CHECK_CUDA(cudaStreamSynchronize(stream));  // the pinned blocks go back to the pool
      blocks.clear();
    }
    return true;
  }
  Work inner;
  std::vector<Arg> args;
  std::vector<Buffer> host;
  std::vector<std::shared_ptr<void>> blocks;
  cudaStream_t stream = nullptr;
};

class DeviceComm final : public Communicator {
 public:
  DeviceComm(std::shared_ptr<Communicator> host, std::unique_ptr<Communicator> nccl, std::shared_ptr<Family> family)
      : Communicator(host->rank(), host->size(), host->name(), host->world_ranks(),
                     CommOptions{host->timeout(), std::nullopt}),
        host_(std::move(host)), nccl_(std::move(nccl)), family_(std::move(family)) {
    set_wait_policy(host_->wait_policy());
  }
  ~DeviceComm() override { family_->forget(this); }

  CommBackend backend() const override { return host_->backend(); }
  bool has_nccl() const { return nccl_ != nullptr; }
  Family& family() { return *family_; }

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
    family_->poll();
    auto h = host_->split(color, key, name);
    std::unique_ptr<Communicator> n = nccl_ ? nccl_->split(color, key, name) : nullptr;
    if (!h) return nullptr;
    if (nccl_ && !n)
      TRIAX_THROW(CommError, "split '{}' of {}: the host communicator placed this rank in a group, NCCL in none",
                  name, describe());
    if (n && (n->rank() != h->rank() || n->size() != h->size() || n->world_ranks() != h->world_ranks()))
      TRIAX_THROW(CommError, "split '{}' of {}: the host communicator made this rank {} of {}, NCCL {} of {}", name,
                  describe(), h->rank(), h->size(), n->rank(), n->size());
    return std::make_unique<DeviceComm>(std::shared_ptr<Communicator>(std::move(h)), std::move(n), family_);
  }

 protected:
  Work all_reduce_impl(Buffer d, ReduceOp op, CallInfo info) override {
    return route(std::move(info), {inout(d)}, [&](Communicator& c, const std::vector<Buffer>& b) {
      return with_span(b[0], "device communicator", [&](auto s) { return c.all_reduce(s, op); });
    });
  }
  Work reduce_scatter_impl(Buffer i, Buffer o, ReduceOp op, CallInfo info) override {
    return route(std::move(info), {in(i), out(o)}, [&](Communicator& c, const std::vector<Buffer>& b) {
      return with_span(b[1], "device communicator", [&](auto so) {
        using T = typename decltype(so)::element_type;
        return c.reduce_scatter(const_span<T>(b[0]), so, op);
      });
    });
  }
  Work all_gather_impl(Buffer i, Buffer o, CallInfo info) override {
    return route(std::move(info), {in(i), out(o)}, [&](Communicator& c, const std::vector<Buffer>& b) {
      return with_span(b[1], "device communicator", [&](auto so) {
        using T = typename decltype(so)::element_type;
        return c.all_gather(const_span<T>(b[0]), so);
      });
    });
  }
  Work all_to_all_impl(Buffer i, Buffer o, CallInfo info) override {
    return route(std::move(info), {in(i), out(o)}, [&](Communicator& c, const std::vector<Buffer>& b) {
      return with_span(b[1], "device communicator", [&](auto so) {
        using T = typename decltype(so)::element_type;
        return c.all_to_all(const_span<T>(b[0]), so);
      });
    });
  }
  Work all_to_all_v_impl(Buffer i, std::span<const int64_t> sc, Buffer o, std::span<const int64_t> rc,
                         CallInfo info) override {
    return route(std::move(info), {in(i), out(o)}, [&](Communicator& c, const std::vector<Buffer>& b) {
      return with_span(b[1], "device communicator", [&](auto so) {
        using T = typename decltype(so)::element_type;
        return c.all_to_all_v(const_span<T>(b[0]), sc, so, rc);
      });
    });
  }
  Work broadcast_impl(Buffer d, int root, CallInfo info) override {
    return route(std::move(info), {inout(d)}, [&](Communicator& c, const std::vector<Buffer>& b) {
      return with_span(b[0], "device communicator", [&](auto s) { return c.broadcast(s, root); });
    });
  }
  Work send_impl(Buffer d, int peer, int tag, CallInfo info) override {
    return route(std::move(info), {in(d)}, [&](Communicator& c, const std::vector<Buffer>& b) {
      return with_span(b[0], "device communicator", [&](auto s) {
        using T = typename decltype(s)::element_type;
        return c.send(const_span<T>(b[0]), peer, tag);
      });
    });
  }
  Work recv_impl(Buffer d, int peer, int tag, CallInfo info) override {
    return route(std::move(info), {out(d)}, [&](Communicator& c, const std::vector<Buffer>& b) {
      return with_span(b[0], "device communicator", [&](auto s) { return c.recv(s, peer, tag); });
    });
  }
  Work batch_impl(std::span<const P2POp> ops, CallInfo info) override {
    std::vector<Arg> args;
    for (const auto& o : ops) args.push_back(o.kind == P2POp::Kind::send ? in(o.buf) : out(o.buf));
    return route(std::move(info), std::move(args), [&](Communicator& c, const std::vector<Buffer>& b) {
      std::vector<P2POp> mapped(ops.begin(), ops.end());
      for (size_t k = 0; k < mapped.size(); ++k) mapped[k].buf = b[k];
      return c.batch_send_recv(std::span<const P2POp>(mapped));
    });
  }
  // A barrier synchronises hosts: always the host communicator.
  Work barrier_impl(CallInfo info) override {
    family_->poll();
    return make_work(std::make_shared<Forward>(host_->barrier()), std::move(info));
  }

 private:
  // Where the call's non-empty buffers live; a call with none follows NCCL when there is one (so
  // that a rank whose part of an all_to_all_v is empty takes the same path as its peers).
  MemoryPlace place_of(const std::vector<Arg>& args, const CallInfo& info) const {
    std::optional<MemoryPlace> place;
    size_t first = 0;
    for (size_t k = 0; k < args.size(); ++k) {
      if (empty(args[k].buf)) continue;
      const MemoryPlace p = memory_place(args[k].buf.data);
      if (!place) {
        place = p;
        first = k;
      } else if (*place != p) {
        auto where = [](MemoryPlace m) { return m == MemoryPlace::host ? "host" : "device"; };
        TRIAX_THROW(ConfigError,
                    "{} #{} ({}) on {}: buffer {} is in {} memory but buffer {} in {} memory; one call moves host "
                    "buffers or device buffers, not both",
                    info.op, info.seq, info.detail, describe(), first, where(*place), k, where(p));
      }
    }
    if (!place) return nccl_ ? MemoryPlace::device : MemoryPlace::host;
    return *place;
  }

  template <class Call>
  Work route(CallInfo info, std::vector<Arg> args, Call&& call) {
    family_->poll();
    std::vector<Buffer> bufs;
    for (const auto& a : args) bufs.push_back(a.buf);
    if (place_of(args, info) == MemoryPlace::host)
      return make_work(std::make_shared<Forward>(call(*host_, bufs)), std::move(info));
    if (nccl_)
      return make_work(std::make_shared<DeviceWork>(call(*nccl_, bufs), family_, this, timeout()), std::move(info));
    return staged(std::move(info), std::move(args), std::forward<Call>(call));
  }

  // Inputs to pinned host blocks (one synchronisation of the compute stream), the call on the
  // host communicator; StagedWork copies the outputs back when it completes.
  template <class Call>
  Work staged(CallInfo info, std::vector<Arg> args, Call&& call) {
    auto w = std::make_shared<StagedWork>();
    w->stream = family_->stream;
    for (const auto& a : args) {
      if (empty(a.buf)) {
        w->host.push_back(Buffer{nullptr, 0, a.buf.dtype});
        continue;
      }
      w->blocks.push_back(family_->pool->get(a.buf.bytes()));
      w->host.push_back(Buffer{w->blocks.back().get(), a.buf.count, a.buf.dtype});
      if (a.in)
        TRIAX_CHECK_CUDA(cudaMemcpyAsync(w->host.back().data, a.buf.data, a.buf.bytes(), cudaMemcpyDeviceToHost,
                                         w->stream));
    }
    TRIAX_CHECK_CUDA(cudaStreamSynchronize(w->stream));
    w->args = std::move(args);
    w->inner = call(*host_, w->host);
    return make_work(std::move(w), std::move(info));
  }

  std::shared_ptr<Communicator> host_;
  std::unique_ptr<Communicator> nccl_;
  std::shared_ptr<Family> family_;
};

}  // namespace

std::shared_ptr<Communicator> make_device_communicator(std::shared_ptr<Communicator> host,
                                                       const DeviceCommOptions& opts) {
  if (!host) TRIAX_THROW(ConfigError, "make_device_communicator: no host communicator");
  if (dynamic_cast<DeviceComm*>(host.get()))
    TRIAX_THROW(ConfigError, "make_device_communicator: {} is a device communicator already", host->describe());
  auto family = std::make_shared<Family>();
  family->device = opts.device;
  family->stream = opts.stream;
  std::unique_ptr<Communicator> nccl;
  if (opts.path == DevicePath::nccl) {
    nccl = make_nccl_communicator(*host, opts.device, host->name());
    static_cast<NcclCommunicator&>(*nccl).set_input_stream(opts.stream);
  }
  enroll(family);
  return std::make_shared<DeviceComm>(std::move(host), std::move(nccl), std::move(family));
}

std::shared_ptr<Communicator> make_device_communicator(std::shared_ptr<Communicator> host, const Backend& be,
                                                       DevicePath path) {
  if (!be.device().is_cuda())
    TRIAX_THROW(ConfigError, "make_device_communicator: backend '{}' on {} is not a CUDA backend", be.name(),
                be.device().str());
  return make_device_communicator(std::move(host), DeviceCommOptions{be.device().index, compute_stream(be), path});
}

void settle_device_waits(cudaStream_t stream) {
  std::vector<std::shared_ptr<Family>> mine;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    for (const auto& w : registry().families)
      if (auto f = w.lock(); f && f->stream == stream) mine.push_back(std::move(f));
  }
  for (auto& f : mine) f->drain();
}

bool has_nccl(const Communicator& c) {
  const auto* d = dynamic_cast<const DeviceComm*>(&c);
  return d && d->has_nccl();
}

void poll(Communicator& c) {
  if (auto* d = dynamic_cast<DeviceComm*>(&c)) d->family().poll();
}

}  // namespace triax::cuda
