// The checking CPU backend: every buffer is its own mapping of whole pages, PROT_NONE while no
// call of the backend (or of a communicator on its memory) uses it. A read or write of buffer
// memory from code outside the backend faults at once; the SIGSEGV handler names the address and
// the buffer before the process dies. Pages carry reference counts, so overlapping opens (an op
// while a DP bucket's all-reduce is in flight on the same flat gradient buffer) nest correctly.
// A communicator call's Work that is destroyed (or overwritten) before wait() or test() saw it
// complete is a missing wait: it is named on stderr at once, and the next communicator call on
// this backend's memory throws CommError naming it. Open MPI completes small sends eagerly over
// shared memory, so without this check a missing wait on a pipeline send passes every MPI run.
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "triax/backend/cpu_backend.h"
#include "triax/core/error.h"

namespace triax {

namespace {

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// Regions of every live checked backend, for the fault handler (read without the lock: a
// best-effort diagnosis in a dying process).
struct Registry {
  std::mutex mu;
  std::map<uintptr_t, size_t> regions;  // start -> bytes
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: the handler may run at exit
  return *r;
}

struct sigaction g_previous {};

void on_segv(int sig, siginfo_t* info, void* ctx) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  char msg[256];
  int n = 0;
  for (const auto& [start, bytes] : registry().regions)
    if (addr >= start && addr < start + bytes) {
      n = std::snprintf(msg, sizeof msg,
                        "triax checked backend: access to buffer memory at %p (a %zu-byte buffer at %p) outside the "
                        "backend's own calls\n",
                        info->si_addr, bytes, reinterpret_cast<void*>(start));
      break;
    }
  if (n > 0) (void)!write(2, msg, static_cast<size_t>(n));
  // Hand over to whatever handled SIGSEGV before (the default: die with the signal).
  sigaction(sig, &g_previous, nullptr);
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) g_previous.sa_sigaction(sig, info, ctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler) {
    g_previous.sa_handler(sig);
  }
}

// Installed by every checking backend that is made, so it comes first even when a test framework
// has put its own handler in since (it is called after the message).
void install_handler() {
  struct sigaction cur {};
  sigaction(SIGSEGV, nullptr, &cur);
  if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_segv) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &g_previous);
}

}  // namespace

class CheckedCpuBackend;

// Page reference counts shared by the backend's ops and the communicator wrapper.
class PageGuard {
 public:
  void open(const void* p, size_t nbytes, std::vector<std::pair<uintptr_t, size_t>>* log) {
    if (!nbytes) return;
    std::lock_guard<std::mutex> lk(mu_);
    const size_t ps = page_size();
    const uintptr_t a = reinterpret_cast<uintptr_t>(p) / ps * ps;
    const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + nbytes + ps - 1) / ps * ps;
    if (!owns(a)) return;  // host memory of the caller's (tokens on the host, metrics): not ours
    for (uintptr_t q = a; q < e; q += ps)
      if (count_[q]++ == 0) protect(q, ps, PROT_READ | PROT_WRITE);
    if (log) log->emplace_back(a, e - a);
  }
  void close(uintptr_t a, size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    const size_t ps = page_size();
    for (uintptr_t q = a; q < a + bytes; q += ps) {
      auto it = count_.find(q);
      if (it == count_.end()) continue;
      if (--it->second == 0) {
        protect(q, ps, PROT_NONE);
        count_.erase(it);
      }
    }
  }
  void add_region(uintptr_t a, size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    regions_[a] = bytes;
    std::lock_guard<std::mutex> lr(registry().mu);
    registry().regions[a] = bytes;
  }
  // A Work destroyed before it was seen complete (a missing wait): said on stderr now, thrown by
  // the next communicator call (throw_if_dropped).
  void dropped(const std::string& call) {
    fmt::print(stderr, "triax checked backend: {} was destroyed before wait() or test() saw it complete\n", call);
    std::lock_guard<std::mutex> lk(mu_);
    if (dropped_.empty()) dropped_ = call;
  }
  void throw_if_dropped(const char* op) {
    std::string call;
    {
      std::lock_guard<std::mutex> lk(mu_);
      call.swap(dropped_);
    }
    if (!call.empty())
      TRIAX_THROW(CommError,
                  "checked backend: before {}: {} was destroyed before wait() or test() saw it complete: a missing "
                  "wait (the transport may still read or write its buffer)",
                  op, call);
  }
  void remove_region(uintptr_t a, size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    regions_.erase(a);
    for (uintptr_t q = a; q < a + bytes; q += page_size()) count_.erase(q);
    std::lock_guard<std::mutex> lr(registry().mu);
    registry().regions.erase(a);
  }

 private:
  bool owns(uintptr_t a) const {
    auto it = regions_.upper_bound(a);
    if (it == regions_.begin()) return false;
    --it;
    return a >= it->first && a < it->first + it->second;
  }
  static void protect(uintptr_t q, size_t bytes, int prot) {
    if (mprotect(reinterpret_cast<void*>(q), bytes, prot) != 0)
      TRIAX_THROW(DeviceError, "checked backend: mprotect failed: {}", std::strerror(errno));
  }
  std::mutex mu_;
  std::map<uintptr_t, size_t> regions_;
  std::unordered_map<uintptr_t, int> count_;
  std::string dropped_;  // the first dropped call not yet thrown
};

namespace {

// A Communicator that forwards every call to the wrapped one, with the pages of its buffers open
// until the call's Work completes.
class CheckedComm final : public Communicator {
 public:
  CheckedComm(std::shared_ptr<Communicator> inner, std::shared_ptr<PageGuard> guard)
      : Communicator(inner->rank(), inner->size(), inner->name(), inner->world_ranks()),
        inner_(std::move(inner)), guard_(std::move(guard)) {
    set_timeout(inner_->timeout());
  }
  CommBackend backend() const override { return inner_->backend(); }
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
    auto sub = inner_->split(color, key, std::move(name));
    if (!sub) return nullptr;
    return std::make_unique<CheckedComm>(std::shared_ptr<Communicator>(std::move(sub)), guard_);
  }

 protected:
  struct Opened : WorkImpl {
    Work inner;
    std::shared_ptr<PageGuard> guard;
    std::vector<std::pair<uintptr_t, size_t>> ranges;
    std::string call;  // "send #3 (float32 x 64, peer 1 (world rank 1)) on group 'pp' ..."
    bool closed = false;
    bool test() override {
      if (!inner.test()) return false;
      close();
      return true;
    }
    void close() {
      if (closed) return;
      closed = true;
      for (auto [a, n] : ranges) guard->close(a, n);
    }
    // Not complete and no exception on its way (unwinding drops Works legitimately): a missing wait.
    ~Opened() override {
      if (!closed && std::uncaught_exceptions() == 0) guard->dropped(call);
      close();
    }
  };
  std::shared_ptr<Opened> opened(const CallInfo& info) {
    guard_->throw_if_dropped(info.op.c_str());
    auto w = std::make_shared<Opened>();
    w->guard = guard_;
    w->call = fmt::format("{} #{} ({}) on {}", info.op, info.seq, info.detail, describe());
    return w;
  }
  template <class Start>
  Work run(std::initializer_list<Buffer> bufs, CallInfo info, Start&& start) {
    auto w = opened(info);
    for (const auto& b : bufs) guard_->open(b.data, b.bytes(), &w->ranges);
    w->inner = start();
    return make_work(std::move(w), std::move(info));
  }
  Work all_reduce_impl(Buffer d, ReduceOp op, CallInfo info) override {
    return run({d}, std::move(info), [&] {
      return with_span(d, "checked communicator", [&](auto s) { return inner_->all_reduce(s, op); });
    });
  }
  Work reduce_scatter_impl(Buffer in, Buffer out, ReduceOp op, CallInfo info) override {
    return run({in, out}, std::move(info), [&] {
      return with_span(out, "checked communicator", [&](auto so) {
        using T = typename decltype(so)::element_type;
        return inner_->reduce_scatter(std::span<const T>(static_cast<const T*>(in.data), in.count), so, op);
      });
    });
  }
  Work all_gather_impl(Buffer in, Buffer out, CallInfo info) override {
    return run({in, out}, std::move(info), [&] {
      return with_span(out, "checked communicator", [&](auto so) {
        using T = typename decltype(so)::element_type;
        return inner_->all_gather(std::span<const T>(static_cast<const T*>(in.data), in.count), so);
      });
    });
  }
  Work all_to_all_impl(Buffer in, Buffer out, CallInfo info) override {
    return run({in, out}, std::move(info), [&] {
      return with_span(out, "checked communicator", [&](auto so) {
        using T = typename decltype(so)::element_type;
        return inner_->all_to_all(std::span<const T>(static_cast<const T*>(in.data), in.count), so);
      });
    });
  }
  Work all_to_all_v_impl(Buffer in, std::span<const int64_t> sc, Buffer out, std::span<const int64_t> rc,
                         CallInfo info) override {
    return run({in, out}, std::move(info), [&] {
      return with_span(out, "checked communicator", [&](auto so) {
        using T = typename decltype(so)::element_type;
        return inner_->all_to_all_v(std::span<const T>(static_cast<const T*>(in.data), in.count), sc, so, rc);
      });
    });
  }
  Work broadcast_impl(Buffer d, int root, CallInfo info) override {
    return run({d}, std::move(info), [&] { return with_span(d, "checked communicator", [&](auto s) { return inner_->broadcast(s, root); }); });
  }
  Work send_impl(Buffer d, int peer, int tag, CallInfo info) override {
    return run({d}, std::move(info), [&] {
      return with_span(d, "checked communicator", [&](auto s) {
        using T = typename decltype(s)::element_type;
        return inner_->send(std::span<const T>(s.data(), s.size()), peer, tag);
      });
    });
  }
  Work recv_impl(Buffer d, int peer, int tag, CallInfo info) override {
    return run({d}, std::move(info), [&] { return with_span(d, "checked communicator", [&](auto s) { return inner_->recv(s, peer, tag); }); });
  }
  Work batch_impl(std::span<const P2POp> ops, CallInfo info) override {
    auto w = opened(info);
    for (const auto& o : ops) guard_->open(o.buf.data, o.buf.bytes(), &w->ranges);
    w->inner = inner_->batch_send_recv(ops);
    return make_work(std::move(w), std::move(info));
  }
  Work barrier_impl(CallInfo info) override { return run({}, std::move(info), [&] { return inner_->barrier(); }); }

 private:
  std::shared_ptr<Communicator> inner_;
  std::shared_ptr<PageGuard> guard_;
};

class CheckedCpuBackendImpl final : public CpuBackend {
 public:
  explicit CheckedCpuBackendImpl(DType compute) : CpuBackend(compute), guard_(std::make_shared<PageGuard>()) {
    install_handler();
  }
  std::string_view name() const override { return "cpu-checked"; }
  bool host_accessible() const override { return false; }
  std::shared_ptr<Communicator> adapt(std::shared_ptr<Communicator> world) override {
    return std::make_shared<CheckedComm>(std::move(world), guard_);
  }

 protected:
  bool checking() const override { return true; }
  void open_range(const void* p, size_t n) override { guard_->open(p, n, &opened_); }
  void close_all() override {
    auto ranges = std::move(opened_);
    opened_.clear();
    for (auto [a, n] : ranges) guard_->close(a, n);
  }
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t ps = page_size();
    const size_t len = (nbytes + ps - 1) / ps * ps;
    void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      TRIAX_THROW(OutOfMemoryError, "checked backend: mmap of {} bytes failed: {}", len, std::strerror(errno));
    guard_->add_region(reinterpret_cast<uintptr_t>(p), len);
    return p;
  }
  void deallocate(void* p, size_t nbytes) noexcept override {
    if (!p) return;
    const size_t ps = page_size();
    const size_t len = (nbytes + ps - 1) / ps * ps;
    guard_->remove_region(reinterpret_cast<uintptr_t>(p), len);
    munmap(p, len);
  }

 private:
  std::shared_ptr<PageGuard> guard_;
  std::vector<std::pair<uintptr_t, size_t>> opened_;
};

}  // namespace

std::unique_ptr<Backend> make_checked_cpu_backend(DType compute) {
  return std::make_unique<CheckedCpuBackendImpl>(compute);
}

}  // namespace triax
