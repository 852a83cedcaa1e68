// Gloo backend. Gloo's collectives block their calling thread, so each communicator runs its
// collectives in issue order on a worker thread of its own (every member issues the same
// collectives in the same order, as Gloo requires) and Work polls a completion. Point-to-point
// calls post Gloo unbound-buffer sends and receives at once, in the caller's thread, and a pooled
// waiter thread per pending call waits for them (Gloo has no non-blocking test, and a timed-out
// Gloo wait closes every pair of its context). Each message is an 8-byte element count followed
// by the data, on slots numbered per (peer, tag), so a receive of the wrong size is a CommError
// instead of Gloo's out-of-bounds check failing on its event-loop thread.
// Composed here: reduce_scatter (Gloo's all_to_all, then a local reduction in rank order), avg
// (sum, divided on completion), bf16/fp16 reductions (in float), calls to oneself (a mailbox).
#include "triax/distributed/comm/gloo_comm.h"

#include "triax/distributed/bootstrap/bootstrap.h"

#if defined(TRIAX_HAVE_GLOO)
#include "gloo_threads.h"
#include "host_reduce.h"
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/address.h>
#include <gloo/transport/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "triax/core/env.h"
#include "triax/core/log.h"
#endif

namespace triax {

#if !defined(TRIAX_HAVE_GLOO)

bool gloo_available() { return false; }

std::unique_ptr<Communicator> make_gloo_communicator(Bootstrap& boot, std::string name, CommOptions) {
  TRIAX_THROW(ConfigError,
              "rank {}: the Gloo communicator '{}' was asked for, but this triax was built without Gloo "
              "(install libgloo-dev and reconfigure); without mpirun the CPU path has no other host communicator",
              boot.rank(), name);
}

#else

bool gloo_available() { return true; }

namespace {

using namespace std::chrono_literals;
using detail::Completion;
using detail::divide_buffer;
using detail::reduce_fn;
using detail::ReduceFn;
using detail::SerialWorker;
using detail::WaiterPool;
using gloo::transport::UnboundBuffer;

// Gloo's own waits for point-to-point messages: effectively unbounded, because triax's
// Work::wait owns the deadline and aborts the Gloo wait when it passes.
constexpr auto kP2PGlooWait = std::chrono::milliseconds(24LL * 3600 * 1000);
// How long Work::test() sleeps on a completion before answering "not yet": short enough to
// poll, long enough that a waiting rank gives its core to the threads that move the data.
constexpr auto kPollSleep = 100us;
// All-reduces below this size use Gloo's bcube algorithm on power-of-two groups.
constexpr size_t kBcubeMaxBytes = size_t{256} << 10;

// Slots of the point-to-point messages: an 8-bit prefix above Gloo's collective slots' tag
// bits, the user's tag, and a 24-bit message number per (peer, tag).
constexpr uint64_t kHeaderPrefix = 0xF1, kDataPrefix = 0xF2;
uint64_t p2p_slot(uint64_t prefix, int tag, uint32_t n) {
  return (prefix << 56) | (uint64_t{static_cast<uint32_t>(tag)} << 24) | (n & 0xFFFFFFu);
}

// Gloo's option templates only need the element size: every dtype travels as the unsigned
// integer of its width (the reductions above interpret it).
template <class F>
void with_storage(DType t, F&& f) {
  switch (dtype_size(t)) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    default: f(uint64_t{}); break;
  }
}

// A pointer Gloo may wrap in a buffer even for an empty span.
void* nonnull(void* p) {
  static std::byte dummy[8];
  return p ? p : dummy;
}

// ---- point-to-point state ----

// One send or receive: the header (element count) and the data, each an unbound buffer.
struct P2P {
  bool is_send = true;
  int peer = 0;
  Buffer buf{};
  uint64_t data_slot = 0;
  int64_t header = 0;  // send: the count sent; recv: the count announced by the peer
  std::unique_ptr<UnboundBuffer> hdr, data;
  std::vector<std::byte> drain;  // a receive of the wrong size takes the message here
  Completion done;
  std::mutex m;  // guards aborted and the creation of data
  bool aborted = false;

  // Wakes a waiter blocked in Gloo (its next wait returns false at once).
  void abort() {
    std::lock_guard<std::mutex> l(m);
    aborted = true;
    for (auto* b : {hdr.get(), data.get()}) {
      if (!b) continue;
      if (is_send) b->abortWaitSend();
      else b->abortWaitRecv();
    }
  }
};

// Per-rank Gloo context: gloo::Context with its transport context set here, because the
// rendezvous goes through triax's exchange instead of a Gloo store.
class MeshContext final : public gloo::Context {
 public:
  MeshContext(int rank, int size) : gloo::Context(rank, size) {}
  // exchange(mine) returns every member's bytes in group-rank order.
  void connect(const std::shared_ptr<gloo::transport::Device>& dev,
               const std::function<std::vector<std::string>(const std::string&)>& exchange,
               std::chrono::milliseconds timeout) {
    auto tctx = dev->createContext(rank, size);
    tctx->setTimeout(timeout);
    std::string mine;
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      const auto bytes = tctx->createPair(i)->address().bytes();
      mine.append(bytes.data(), bytes.size());
    }
    const auto all = exchange(mine);
    for (int i = 0; i < size; ++i) {
      if (i == rank) continue;
      const std::string& blob = all.at(static_cast<size_t>(i));
      const size_t per = blob.size() / static_cast<size_t>(size - 1);
      const size_t at = static_cast<size_t>(rank < i ? rank : rank - 1) * per;
      tctx->getPair(i)->connect(std::vector<char>(blob.begin() + static_cast<ptrdiff_t>(at),
                                                  blob.begin() + static_cast<ptrdiff_t>(at + per)));
    }
    device_ = dev;
    transportContext_ = std::move(tctx);
    setTimeout(timeout);
  }
};

class GlooCommunicator;

class CollectiveWork final : public WorkImpl {
 public:
  CollectiveWork(GlooCommunicator* comm, CallInfo info, std::shared_ptr<Completion> c, std::chrono::milliseconds t)
      : comm_(comm), info_(std::move(info)), c_(std::move(c)), timeout_(t) {}
  bool test() override;
  void finish() override {
    if (avg_.data) divide_buffer(avg_, avg_by_);
  }
  Buffer avg_{};
  int avg_by_ = 1;

 private:
  GlooCommunicator* comm_;
  CallInfo info_;
  std::shared_ptr<Completion> c_;
  std::chrono::milliseconds timeout_;
};

class P2PWork final : public WorkImpl {
 public:
  P2PWork(GlooCommunicator* comm, CallInfo info) : comm_(comm), info_(std::move(info)) {}
  ~P2PWork() override;
  bool test() override;
  std::vector<std::shared_ptr<P2P>> ops;

 private:
  GlooCommunicator* comm_;
  CallInfo info_;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<MeshContext> ctx, std::shared_ptr<gloo::transport::Device> dev, std::string name,
                   std::vector<int> world_ranks, CommOptions opts)
      : Communicator(ctx->rank, ctx->size, std::move(name), std::move(world_ranks), opts), ctx_(std::move(ctx)),
        dev_(std::move(dev)), opts_(opts) {}
  ~GlooCommunicator() override {
    // Waiters blocked on messages that will never come end now; the worker finishes what it
    // holds (a collective stuck on a dead peer ends at its Gloo timeout, the communicator's).
    broken_ = true;
    std::vector<std::shared_ptr<P2P>> pending;
    {
      std::lock_guard<std::mutex> l(pending_m_);
      for (auto& w : pending_)
        if (auto p = w.lock()) pending.push_back(std::move(p));
    }
    for (auto& p : pending) p->abort();
    worker_.reset();
  }
  CommBackend backend() const override { return CommBackend::gloo; }

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;

  [[noreturn]] void raise(const CallInfo& info, const std::string& why) { fail(info, why); }
  [[noreturn]] void raise_timeout_after(const CallInfo& info, std::chrono::milliseconds t) { raise_timeout(info, t); }
  void forget(const P2P* p) {
    std::lock_guard<std::mutex> l(pending_m_);
    std::erase_if(pending_, [&](const std::weak_ptr<P2P>& w) {
      auto s = w.lock();
      return !s || s.get() == p;
    });
  }

  // Every member's bytes over this communicator (collective; blocking): lengths, then the
  // bytes padded to the longest.
  std::vector<std::string> all_gather_bytes(const std::string& mine) {
    const size_t n = static_cast<size_t>(size());
    std::vector<int64_t> lens(n);
    const int64_t my_len = static_cast<int64_t>(mine.size());
    all_gather(std::span<const int64_t>(&my_len, 1), std::span<int64_t>(lens)).wait();
    const size_t longest = static_cast<size_t>(*std::max_element(lens.begin(), lens.end()));
    std::vector<uint8_t> padded(longest, 0), all(longest * n);
    std::memcpy(padded.data(), mine.data(), mine.size());
    all_gather(std::span<const uint8_t>(padded), std::span<uint8_t>(all)).wait();
    std::vector<std::string> out(n);
    for (size_t r = 0; r < n; ++r)
      out[r].assign(reinterpret_cast<const char*>(all.data() + r * longest), static_cast<size_t>(lens[r]));
    return out;
  }

 protected:
  Work all_reduce_impl(Buffer d, ReduceOp op, CallInfo info) override {
    const ReduceFn fn = reduce_fn(d.dtype, op);
    auto w = collective(info, size() > 1 && d.count > 0, [this, d, fn](std::chrono::milliseconds t, uint32_t tag) {
      with_storage(d.dtype, [&](auto s) {
        using S = decltype(s);
        gloo::AllreduceOptions o(ctx_);
        o.setOutput(static_cast<S*>(d.data), d.count);
        o.setReduceFunction(fn);
        // Small buffers on a power-of-two group: bcube's log2(n) exchanges instead of the ring's
        // 2(n-1) steps (each a notification round trip on Gloo's TCP pairs). comm_bench at np 4
        // (TRIAX_COMM=gloo under mpirun): 8 B to 32 KiB took about half the ring's time.
        if (d.bytes() < kBcubeMaxBytes && std::has_single_bit(static_cast<unsigned>(size())))
          o.setAlgorithm(gloo::AllreduceOptions::Algorithm::BCUBE);
        o.setTag(tag);
        o.setTimeout(t);
        gloo::allreduce(o);
      });
    });
    if (op == ReduceOp::avg) set_avg(w, d);
    return w;
  }
  // Gloo 2022 has no options-style reduce-scatter: an all-to-all brings every member's copy of
  // this rank's block here (the ring's (n-1)/n of the buffer per rank), then they are reduced
  // in rank order, so every run sums alike.
  Work reduce_scatter_impl(Buffer in, Buffer out, ReduceOp op, CallInfo info) override {
    const ReduceFn fn = reduce_fn(in.dtype, op);
    const int n = size();
    if (n == 1) {
      Work w = local(info, [in, out] { copy(out, in); });
      return w;  // avg over one rank divides by one
    }
    auto w = collective(info, out.count > 0, [this, in, out, fn, n](std::chrono::milliseconds t, uint32_t tag) {
      const size_t block = out.bytes();
      std::vector<std::byte> blocks(block * static_cast<size_t>(n));
      with_storage(in.dtype, [&](auto s) {
        using S = decltype(s);
        gloo::AlltoallOptions o(ctx_);
        o.setInput(static_cast<S*>(in.data), in.count);
        o.setOutput(reinterpret_cast<S*>(blocks.data()), in.count);
        o.setTag(tag);
        o.setTimeout(t);
        gloo::alltoall(o);
      });
      std::memcpy(out.data, blocks.data(), block);
      for (int r = 1; r < n; ++r) fn(out.data, out.data, blocks.data() + static_cast<size_t>(r) * block, out.count);
    });
    if (op == ReduceOp::avg) set_avg(w, out);
    return w;
  }
  Work all_gather_impl(Buffer in, Buffer out, CallInfo info) override {
    return block_exchange<gloo::AllgatherOptions>(std::move(info), in, out, &gloo::allgather);
  }
  Work all_to_all_impl(Buffer in, Buffer out, CallInfo info) override {
    return block_exchange<gloo::AlltoallOptions>(std::move(info), in, out, &gloo::alltoall);
  }
  Work all_to_all_v_impl(Buffer in, std::span<const int64_t> sc, Buffer out, std::span<const int64_t> rc,
                         CallInfo info) override {
    const size_t me = static_cast<size_t>(rank());
    // What this rank sends itself is what it receives from itself; Gloo copies it unchecked.
    if (sc[me] != rc[me]) fail(info, fmt::format("sends {} elements to itself but expects to receive {}", sc[me], rc[me]));
    if (size() == 1) return local(info, [in, out] { copy(out, in); });
    std::vector<int64_t> s(sc.begin(), sc.end()), r(rc.begin(), rc.end());
    return collective(info, true, [this, in, out, s, r](std::chrono::milliseconds t, uint32_t tag) {
      with_storage(in.dtype, [&](auto st) {
        using S = decltype(st);
        gloo::AlltoallvOptions o(ctx_);
        o.setInput(static_cast<S*>(nonnull(in.data)), s);
        o.setOutput(static_cast<S*>(nonnull(out.data)), r);
        o.setTag(tag);
        o.setTimeout(t);
        gloo::alltoallv(o);
      });
    });
  }
  Work broadcast_impl(Buffer d, int root, CallInfo info) override {
    return collective(info, size() > 1 && d.count > 0, [this, d, root](std::chrono::milliseconds t, uint32_t tag) {
      with_storage(d.dtype, [&](auto s) {
        using S = decltype(s);
        gloo::BroadcastOptions o(ctx_);
        if (rank() == root) o.setInput(static_cast<S*>(d.data), d.count);
        o.setOutput(static_cast<S*>(d.data), d.count);
        o.setRoot(root);
        o.setTag(tag);
        o.setTimeout(t);
        gloo::broadcast(o);
      });
    });
  }
  Work barrier_impl(CallInfo info) override {
    return collective(info, size() > 1, [this](std::chrono::milliseconds t, uint32_t tag) {
      gloo::BarrierOptions o(ctx_);
      o.setTag(tag);
      o.setTimeout(t);
      gloo::barrier(o);
    });
  }
  Work send_impl(Buffer d, int peer, int tag, CallInfo info) override {
    auto w = std::make_shared<P2PWork>(this, info);
    w->ops.push_back(post_send(d, peer, tag, info));
    return make_work(std::move(w), std::move(info));
  }
  Work recv_impl(Buffer d, int peer, int tag, CallInfo info) override {
    auto w = std::make_shared<P2PWork>(this, info);
    w->ops.push_back(post_recv(d, peer, tag, info));
    return make_work(std::move(w), std::move(info));
  }
  Work batch_impl(std::span<const P2POp> ops, CallInfo info) override {
    auto w = std::make_shared<P2PWork>(this, info);
    for (const auto& o : ops)
      w->ops.push_back(o.kind == P2POp::Kind::send ? post_send(o.buf, o.peer, o.tag, info)
                                                   : post_recv(o.buf, o.peer, o.tag, info));
    return make_work(std::move(w), std::move(info));
  }
  void on_timeout(const CallInfo&) override {
    // The communicator is poisoned: end the waits still blocked in Gloo.
    broken_ = true;
    std::lock_guard<std::mutex> l(pending_m_);
    for (auto& w : pending_)
      if (auto p = w.lock()) p->abort();
  }

 private:
  static void copy(Buffer dst, Buffer src) {
    if (src.data != dst.data && src.bytes() > 0) std::memmove(dst.data, src.data, src.bytes());
  }
  static void set_avg(Work& w, Buffer b) {
    static_cast<CollectiveWork*>(w.impl())->avg_ = b;  // avg_by_ is the group size (collective())
  }

  // all_gather and all_to_all: Gloo options of the same shape (an input and an output buffer).
  template <class Options>
  Work block_exchange(CallInfo info, Buffer in, Buffer out, void (*run)(Options&)) {
    if (size() == 1) return local(info, [in, out] { copy(out, in); });
    return collective(info, in.count > 0, [this, in, out, run](std::chrono::milliseconds t, uint32_t tag) {
      with_storage(in.dtype, [&](auto s) {
        using S = decltype(s);
        Options o(ctx_);
        o.setInput(static_cast<S*>(in.data), in.count);
        o.setOutput(static_cast<S*>(out.data), out.count);
        o.setTag(tag);
        o.setTimeout(t);
        run(o);
      });
    });
  }

  // A collective that needs no peer (one rank, or nothing to move) runs here and now.
  Work local(CallInfo info, const std::function<void()>& f) {
    f();
    auto c = std::make_shared<Completion>();
    c->complete();
    auto impl = std::make_shared<CollectiveWork>(this, info, std::move(c), timeout());
    return make_work(std::move(impl), std::move(info));
  }

  // Queues f(timeout, tag) on the worker. !remote: nothing to move (one rank, or no elements);
  // the call completes at once without f.
  Work collective(CallInfo info, bool remote, std::function<void(std::chrono::milliseconds, uint32_t)> f) {
    const auto t = timeout();
    Work w;
    if (!remote) {
      w = local(info, [] {});
    } else {
      auto c = std::make_shared<Completion>();
      const uint32_t tag = static_cast<uint32_t>(collectives_++ & 0xFFFFFF);
      if (!worker_) worker_ = std::make_unique<SerialWorker>();
      worker_->submit([this, c, f = std::move(f), t, tag] {
        if (broken_) {
          c->complete("an earlier call on this communicator failed or timed out");
          return;
        }
        try {
          f(t, tag);
          c->complete();
        } catch (const std::exception& e) {
          broken_ = true;
          const std::string what = e.what();
          c->complete(what, what.find("Timed out") != std::string::npos);
        }
      });
      auto impl = std::make_shared<CollectiveWork>(this, info, std::move(c), t);  // before info moves
      w = make_work(std::move(impl), std::move(info));
    }
    if (auto* cw = static_cast<CollectiveWork*>(w.impl())) cw->avg_by_ = size();
    return w;
  }

  void track(const std::shared_ptr<P2P>& p) {
    std::lock_guard<std::mutex> l(pending_m_);
    pending_.push_back(p);
  }

  std::shared_ptr<P2P> post_send(Buffer d, int peer, int tag, const CallInfo& info) {
    auto p = std::make_shared<P2P>();
    p->is_send = true;
    p->peer = peer;
    p->buf = d;
    p->header = static_cast<int64_t>(d.count);
    if (peer == rank()) {
      // To oneself: the message waits in the mailbox for its receive.
      self_send(d, tag);
      p->done.complete();
      return p;
    }
    const uint32_t n = send_counts_[{peer, tag}]++;
    try {
      p->hdr = ctx_->createUnboundBuffer(&p->header, sizeof(p->header));
      p->hdr->send(peer, p2p_slot(kHeaderPrefix, tag, n));
      if (d.count > 0) {
        p->data = ctx_->createUnboundBuffer(d.data, d.bytes());
        p->data->send(peer, p2p_slot(kDataPrefix, tag, n));
      }
    } catch (const std::exception& e) {
      fail(info, fmt::format("posting the send to group rank {}: {}", peer, e.what()));
    }
    track(p);
    WaiterPool::get().submit([p] {
      std::string err;
      try {
        bool ok = p->hdr->waitSend(kP2PGlooWait);
        if (ok && p->data) ok = p->data->waitSend(kP2PGlooWait);
        if (!ok) err = "aborted";
      } catch (const std::exception& e) {
        err = e.what();
      }
      p->done.complete(err);
    });
    return p;
  }

  std::shared_ptr<P2P> post_recv(Buffer d, int peer, int tag, const CallInfo& info) {
    auto p = std::make_shared<P2P>();
    p->is_send = false;
    p->peer = peer;
    p->buf = d;
    if (peer == rank()) {
      self_recv(p, tag);
      return p;
    }
    const uint32_t n = recv_counts_[{peer, tag}]++;
    p->data_slot = p2p_slot(kDataPrefix, tag, n);
    try {
      p->hdr = ctx_->createUnboundBuffer(&p->header, sizeof(p->header));
      p->hdr->recv(peer, p2p_slot(kHeaderPrefix, tag, n));
    } catch (const std::exception& e) {
      fail(info, fmt::format("posting the receive from group rank {}: {}", peer, e.what()));
    }
    track(p);
    const size_t es = dtype_size(d.dtype);
    WaiterPool::get().submit([p, es, ctx = ctx_] {
      std::string err;
      try {
        bool ok = p->hdr->waitRecv(kP2PGlooWait);
        const int64_t got = p->header;
        const auto want = static_cast<int64_t>(p->buf.count);
        if (ok && got > 0) {
          std::lock_guard<std::mutex> l(p->m);
          if (p->aborted) {
            ok = false;
          } else if (got == want) {
            p->data = ctx->createUnboundBuffer(p->buf.data, p->buf.bytes());
          } else {
            // Take the message anyway so the sender completes, then report the mismatch.
            p->drain.resize(static_cast<size_t>(got) * es);
            p->data = ctx->createUnboundBuffer(p->drain.data(), p->drain.size());
          }
          if (ok) p->data->recv(p->peer, p->data_slot);
        }
        if (ok && p->data) ok = p->data->waitRecv(kP2PGlooWait);
        if (!ok) err = "aborted";
        else if (got > want) err = fmt::format("a peer sent more than the receive buffer holds ({} elements for {})", got, want);
        else if (got != want) err = fmt::format("received {} elements from the peer, expected {}", got, want);
      } catch (const std::exception& e) {
        err = e.what();
      }
      p->done.complete(err);
    });
    return p;
  }

  // ---- messages to oneself ----
  struct Message {
    int tag;
    std::vector<std::byte> bytes;
    size_t count;
  };
  void deliver(P2P& r, const Message& m) {
    if (m.count == r.buf.count) {
      if (!m.bytes.empty()) std::memcpy(r.buf.data, m.bytes.data(), m.bytes.size());
      r.done.complete();
    } else if (m.count > r.buf.count) {
      r.done.complete(fmt::format("a peer sent more than the receive buffer holds ({} elements for {})", m.count, r.buf.count));
    } else {
      r.done.complete(fmt::format("received {} elements from the peer, expected {}", m.count, r.buf.count));
    }
  }
  void self_send(Buffer d, int tag) {
    Message m{tag, std::vector<std::byte>(d.bytes()), d.count};
    if (d.bytes()) std::memcpy(m.bytes.data(), d.data, d.bytes());
    for (auto it = self_recvs_.begin(); it != self_recvs_.end(); ++it) {
      if (it->first != tag) continue;
      auto r = it->second;
      self_recvs_.erase(it);
      deliver(*r, m);
      return;
    }
    mailbox_.push_back(std::move(m));
  }
  void self_recv(const std::shared_ptr<P2P>& p, int tag) {
    for (auto it = mailbox_.begin(); it != mailbox_.end(); ++it) {
      if (it->tag != tag) continue;
      Message m = std::move(*it);
      mailbox_.erase(it);
      deliver(*p, m);
      return;
    }
    self_recvs_.emplace_back(tag, p);
  }

  std::shared_ptr<MeshContext> ctx_;
  std::shared_ptr<gloo::transport::Device> dev_;
  CommOptions opts_;
  std::unique_ptr<SerialWorker> worker_;  // started by the first collective that needs a peer
  std::atomic<bool> broken_{false};
  uint64_t collectives_ = 0;
  std::map<std::pair<int, int>, uint32_t> send_counts_, recv_counts_;  // (peer, tag) -> messages
  std::mutex pending_m_;
  std::vector<std::weak_ptr<P2P>> pending_;
  std::deque<Message> mailbox_;
  std::deque<std::pair<int, std::shared_ptr<P2P>>> self_recvs_;
  friend class P2PWork;
};

bool CollectiveWork::test() {
  if (!c_->wait_for(kPollSleep)) return false;
  if (c_->timed_out) comm_->raise_timeout_after(info_, timeout_);
  if (!c_->error.empty()) comm_->raise(info_, c_->error);
  return true;
}

bool P2PWork::test() {
  for (auto& p : ops)
    if (!p->done.wait_for(kPollSleep)) return false;
  for (auto& p : ops) {
    if (p->done.error.empty()) continue;
    comm_->raise(info_, fmt::format("{} group rank {}: {}", p->is_send ? "send to" : "receive from", p->peer,
                                    p->done.error));
  }
  return true;
}

P2PWork::~P2PWork() {
  // A call left behind (a timeout, an exception): its waiter must not keep the user's buffer
  // in Gloo's hands longer than needed.
  for (auto& p : ops) {
    if (!p->done.wait_for(std::chrono::microseconds(0))) p->abort();
    comm_->forget(p.get());
  }
}

// The interface Gloo's TCP pairs listen on. All ranks on one host (the common test and
// single-node case): loopback. Otherwise TRIAX_GLOO_IFNAME / GLOO_SOCKET_IFNAME (an
// interface), TRIAX_GLOO_HOSTNAME (a name or address), else this host's name as the resolver
// knows it (what Gloo and PyTorch do).
gloo::transport::tcp::attr device_attr(const std::vector<std::string>& hosts) {
  gloo::transport::tcp::attr a;
  for (const char* v : {"TRIAX_GLOO_IFNAME", "GLOO_SOCKET_IFNAME"})
    if (auto e = env_string_opt(v, "a network interface name")) {
      a.iface = *e;
      return a;
    }
  if (auto e = env_string_opt("TRIAX_GLOO_HOSTNAME", "a host name or address")) {
    a.hostname = *e;
    return a;
  }
  if (std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h == hosts.front(); })) {
    a.hostname = "127.0.0.1";
    return a;
  }
  char buf[HOST_NAME_MAX + 1] = {};
  gethostname(buf, sizeof(buf) - 1);
  a.hostname = buf;
  return a;
}

std::unique_ptr<Communicator> GlooCommunicator::split(int color, int key, std::string name) {
  const int n = size();
  std::vector<int64_t> mine = {color, key}, all(2 * static_cast<size_t>(n));
  all_gather(std::span<const int64_t>(mine), std::span<int64_t>(all)).wait();
  std::vector<int> members;  // parent ranks of this rank's group, ordered by (key, parent rank)
  if (color >= 0) {
    for (int r = 0; r < n; ++r)
      if (all[2 * static_cast<size_t>(r)] == color) members.push_back(r);
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return all[2 * static_cast<size_t>(a) + 1] < all[2 * static_cast<size_t>(b) + 1]; });
  }
  const int sub_size = static_cast<int>(members.size());
  const int sub_rank =
      color >= 0 ? static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin()) : 0;
  std::shared_ptr<MeshContext> ctx;
  std::string blob;
  // Every parent rank takes part in the exchange; ranks outside the group contribute nothing.
  auto exchange = [&](const std::string& b) {
    auto every = all_gather_bytes(b);
    std::vector<std::string> out;
    for (int m : members) out.push_back(std::move(every[static_cast<size_t>(m)]));
    return out;
  };
  try {
    if (color >= 0) {
      ctx = std::make_shared<MeshContext>(sub_rank, sub_size);
      ctx->connect(dev_, exchange, timeout());
    } else {
      exchange(std::string());
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    TRIAX_THROW(CommError, "split '{}' of {}: connecting the Gloo pairs failed: {}", name, describe(), e.what());
  }
  if (color < 0) return nullptr;
  std::vector<int> world;
  for (int m : members) world.push_back(world_ranks().at(static_cast<size_t>(m)));
  auto c = std::make_unique<GlooCommunicator>(std::move(ctx), dev_, std::move(name), std::move(world), opts_);
  c->set_timeout(timeout());
  return c;
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(Bootstrap& boot, std::string name, CommOptions opts) {
  // Gloo's TCP pairs write with plain writev: a write to a peer that died raises SIGPIPE, which
  // by default kills this rank silently (exit by signal 13, no message, no dump) before the error
  // could name the dead peer. Ignored, the write fails with EPIPE and Gloo reports it. Only the
  // default disposition is changed: a handler the program installed is left alone.
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, nullptr);
  }
  const auto hosts = boot.all_gather(host_name());
  const auto attr = device_attr(hosts);
  const auto connect_timeout = opts.timeout.count() > 0 ? opts.timeout : default_comm_timeout();
  std::shared_ptr<gloo::transport::Device> dev;
  try {
    dev = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    TRIAX_THROW(CommError, "rank {}: Gloo cannot open a TCP device on {}{}: {} (set TRIAX_GLOO_IFNAME to an interface or "
                "TRIAX_GLOO_HOSTNAME to this host's address)",
                boot.rank(), attr.iface.empty() ? "host " : "interface ", attr.iface.empty() ? attr.hostname : attr.iface,
                e.what());
  }
  auto ctx = std::make_shared<MeshContext>(boot.rank(), boot.world_size());
  try {
    ctx->connect(dev, [&](const std::string& b) { return boot.all_gather(b); }, connect_timeout);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    TRIAX_THROW(CommError, "rank {}: connecting Gloo's TCP pairs ({}) failed: {}", boot.rank(), dev->str(), e.what());
  }
  std::vector<int> world(static_cast<size_t>(boot.world_size()));
  std::iota(world.begin(), world.end(), 0);
  return std::make_unique<GlooCommunicator>(std::move(ctx), std::move(dev), std::move(name), std::move(world), opts);
}

#endif

}  // namespace triax
