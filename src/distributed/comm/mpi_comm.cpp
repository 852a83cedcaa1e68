// MPI backend: each call starts a nonblocking MPI operation and returns a Work that polls it.
// bf16/fp16 reductions use user-defined MPI ops that accumulate in float; avg is a sum divided
// on completion. All counts are checked against MPI's int limit before a call starts.
// Large all-reduces and reduce-scatters run triax's own ring on point-to-point messages (see
// RingWork) because Open MPI's nonblocking versions are several times slower there.
#include "triax/distributed/comm/mpi_comm.h"

#include "host_reduce.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cstdlib>
#include <exception>
#include <numeric>

#include "triax/core/env.h"

namespace triax {
namespace {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, static_cast<size_t>(len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::bf16: case DType::f16: return MPI_UINT16_T;  // moved as raw 16-bit words
    case DType::u8: return MPI_BYTE;
  }
  return MPI_DATATYPE_NULL;
}

// User-defined reductions for the 16-bit float storage types: widen to float, combine, round.
template <class T, ReduceOp Op>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    float r;
    if constexpr (Op == ReduceOp::max) r = x > y ? x : y;
    else if constexpr (Op == ReduceOp::min) r = x < y ? x : y;
    else r = x + y;
    b[i] = T(r);
  }
}

struct HalfOps {
  MPI_Op ops[2][3];  // [bf16, f16][sum, max, min]
  HalfOps() {
    MPI_Op_create(&half_reduce<bf16, ReduceOp::sum>, 1, &ops[0][0]);
    MPI_Op_create(&half_reduce<bf16, ReduceOp::max>, 1, &ops[0][1]);
    MPI_Op_create(&half_reduce<bf16, ReduceOp::min>, 1, &ops[0][2]);
    MPI_Op_create(&half_reduce<f16, ReduceOp::sum>, 1, &ops[1][0]);
    MPI_Op_create(&half_reduce<f16, ReduceOp::max>, 1, &ops[1][1]);
    MPI_Op_create(&half_reduce<f16, ReduceOp::min>, 1, &ops[1][2]);
  }
};

MPI_Op mpi_op(DType t, ReduceOp op, const CallInfo& info) {
  const int k = op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0;
  if (t == DType::bf16 || t == DType::f16) {
    static HalfOps half;  // created after MPI_Init, on first use; freed by MPI_Finalize
    return half.ops[t == DType::bf16 ? 0 : 1][k];
  }
  if (t == DType::u8) TRIAX_THROW(CommError, "{} #{}: uint8 buffers move but cannot be reduced", info.op, info.seq);
  return k == 1 ? MPI_MAX : k == 2 ? MPI_MIN : MPI_SUM;
}

using detail::divide_buffer;

int checked_int(size_t n, const CallInfo& info) {
  if (n > static_cast<size_t>(INT_MAX))
    TRIAX_THROW(CommError, "{} #{} ({}): {} elements exceed MPI's int count limit; split the buffer", info.op,
                info.seq, info.detail, n);
  return static_cast<int>(n);
}

class MpiCommunicator;

// One or more requests; completes when all have. Holds whatever must live until completion.
class MpiWork final : public WorkImpl {
 public:
  MpiWork(MpiCommunicator* comm, CallInfo info) : comm_(comm), info_(std::move(info)) {}
  ~MpiWork() override;
  bool test() override;
  void finish() override {
    if (avg_.data) divide_buffer(avg_, avg_by_);
  }

  std::vector<MPI_Request> reqs;
  std::vector<int> counts, displs, rcounts, rdispls;
  // Receives whose arrived size must be checked: (index into reqs, expected count).
  struct RecvCheck {
    size_t index;
    int expected;
    MPI_Datatype type;
  };
  std::vector<RecvCheck> recv_checks;
  Buffer avg_{};
  int avg_by_ = 1;

 private:
  MpiCommunicator* comm_;
  CallInfo info_;
  bool collective_ = true;
  std::vector<MPI_Status> statuses_;  // reused by every poll: test() runs in a tight loop
  friend class MpiCommunicator;
};

// Ring reduce-scatter, and ring all-reduce (reduce-scatter then all-gather), on point-to-point
// messages of the communicator's private ring duplicate. Why not MPI_Iallreduce: Open MPI's
// libnbc runs every in-place all-reduce, and every reduce-scatter, as a binomial tree of
// full-size buffers (log2(n) serial hops up, then down), much slower than the ring the blocking
// MPI_Allreduce uses (benchmarks/results/comm_bench_cpu.md). Here each rank sends and receives (n-1)/n of the buffer per phase, in
// n-1 steps; a step is a send to the right neighbour and a receive from the left one, then a
// local MPI_Reduce_local. Steps advance whenever any MPI-backend call of this process is
// polled (see progress_rings), as MPI's progress engine advances every nonblocking collective,
// so ranks may wait on several in-flight rings in different orders.
// On a power-of-two group the all-reduce uses recursive halving, then doubling, instead of the
// ring: the same bytes per rank in 2 log2(n) steps instead of 2(n-1), which matters when every
// step waits for a descheduled neighbour (np 8 on 2 cores: 1 MiB went from 0.85 to ~1 of
// MPI_Allreduce).
class RingWork final : public WorkImpl {
 public:
  enum class Kind { all_reduce, reduce_scatter };
  RingWork(MpiCommunicator* comm, CallInfo info, Kind kind, Buffer in, Buffer out, MPI_Op op);
  ~RingWork() override;
  bool test() override;
  void finish() override;
  // Advances as far as the messages allow; never throws (a failure is kept for test()).
  bool advance() noexcept;

  Buffer avg_{};
  int avg_by_ = 1;

 private:
  void post_step();
  void complete_step();
  // Element range of chunk c (all-reduce: n balanced chunks of the buffer).
  size_t chunk_off(int c) const { return static_cast<size_t>(c) * count_ / static_cast<size_t>(n_); }
  size_t chunk_len(int c) const { return chunk_off(c + 1) - chunk_off(c); }
  // Elements of chunks [c, c + k).
  size_t chunks_len(int c, int k) const { return chunk_off(c + k) - chunk_off(c); }
  // Halving-doubling: chunk range kept (first) and sent (second) at reduce-scatter step k.
  std::pair<int, int> halving(int k) const {
    const int d = n_ >> (k + 1), lo = r_ / (2 * d) * (2 * d);
    return (r_ & d) ? std::pair{lo + d, lo} : std::pair{lo, lo + d};
  }
  std::byte* at(Buffer b, size_t elem) const { return static_cast<std::byte*>(b.data) + elem * es_; }

  MpiCommunicator* comm_;
  CallInfo info_;
  Kind kind_;
  Buffer in_, out_;  // all_reduce: both the data (in place)
  MPI_Op op_;
  MPI_Datatype type_;
  MPI_Comm ring_;
  int tag_, r_, n_;
  size_t es_, count_;  // element size; all_reduce: elements; reduce_scatter: block size
  int step_ = 0, steps_ = 0;
  int log2n_ = 0;  // > 0: halving-doubling all-reduce (n a power of two)
  std::vector<std::byte> scratch_;
  MPI_Request reqs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  std::exception_ptr error_;
  bool registered_ = false;
};

// Every ring in flight in this process (MPI is used from one thread: MPI_THREAD_FUNNELED).
std::vector<RingWork*>& active_rings() {
  static std::vector<RingWork*> rings;
  return rings;
}

void progress_rings(const RingWork* except) {
  auto& rings = active_rings();
  // advance() may finish a ring but never unregisters it here, so iterating by index is safe.
  for (size_t i = 0; i < rings.size(); ++i)
    if (rings[i] != except) rings[i]->advance();
}

// The ring's steps are latency-bound on small buffers, where libnbc's tree wins: the ring
// starts at this many bytes per step of a phase, e.g. (n-1) x 64 KiB for a reduce-scatter ring,
// log2(n) x 64 KiB for a halving-doubling all-reduce (the crossover against libnbc measured on
// 2 cores is in benchmarks/results/comm_bench_cpu.md).
// TRIAX_MPI_RING_MIN_BYTES overrides the 64 KiB (the tests set 0 to run the ring on every size);
// it must be the same on every rank.
size_t ring_min_bytes() {
  static const size_t v = env_bytes("TRIAX_MPI_RING_MIN_BYTES", 0, uint64_t{1} << 40, uint64_t{64} << 10);
  return v;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, std::string name, std::vector<int> world_ranks, CommOptions opts)
      : Communicator(rank, size, std::move(name), std::move(world_ranks), opts), comm_(comm), opts_(opts) {
    // The rings' messages travel on their own duplicate, apart from the user's sends and
    // receives (any tag) and from libnbc's traffic.
    if (int code = MPI_Comm_dup(comm_, &ring_); code != MPI_SUCCESS)
      TRIAX_THROW(CommError, "MPI_Comm_dup (ring) for {} failed: {}", describe(), mpi_error_string(code));
    MPI_Comm_set_errhandler(ring_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (ring_ != MPI_COMM_NULL) MPI_Comm_free(&ring_);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  CommBackend backend() const override { return CommBackend::mpi; }
  MPI_Comm handle() const { return comm_; }
  MPI_Comm ring_handle() const { return ring_; }
  // Tag of the next ring collective. Every member starts the same rings in the same order (as
  // MPI requires of collectives), so the counters agree; distinct tags keep two rings in flight
  // apart.
  int next_ring_tag() { return static_cast<int>(ring_calls_++ % 32768); }
  // Scratch buffers kept between rings, so a large all-reduce does not fault in fresh pages.
  std::vector<std::byte> take_scratch(size_t bytes) {
    std::vector<std::byte> b;
    if (!scratch_.empty()) {
      b = std::move(scratch_.back());
      scratch_.pop_back();
    }
    if (b.size() < bytes) b.resize(bytes);
    return b;
  }
  void give_scratch(std::vector<std::byte> b) {
    if (scratch_.size() < 4) scratch_.push_back(std::move(b));
  }

  std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split", name);
    if (sub == MPI_COMM_NULL) return nullptr;
    auto c = adopt(sub, std::move(name), opts_);
    c->set_timeout(timeout());
    return c;
  }

  // Takes ownership of comm (already private to triax).
  static std::unique_ptr<MpiCommunicator> adopt(MPI_Comm comm, std::string name, CommOptions opts) {
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    int rank = 0, size = 0;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    MPI_Group g, wg;
    MPI_Comm_group(comm, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    std::vector<int> local(static_cast<size_t>(size)), world(static_cast<size_t>(size));
    std::iota(local.begin(), local.end(), 0);
    MPI_Group_translate_ranks(g, size, local.data(), wg, world.data());
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
    MPI_Comm_set_name(comm, name.c_str());
    return std::make_unique<MpiCommunicator>(comm, rank, size, std::move(name), std::move(world), opts);
  }

  void raise(const CallInfo& info, int code, const char* what) { fail(info, fmt::format("{}: {}", what, mpi_error_string(code))); }
  void raise_mismatch(const CallInfo& info, const std::string& why) { fail(info, why); }

 protected:
  Work all_reduce_impl(Buffer d, ReduceOp op, CallInfo info) override {
    if (use_ring(d.count >= static_cast<size_t>(size()), d.bytes(), true)) {
      auto w = std::make_shared<RingWork>(this, info, RingWork::Kind::all_reduce, d, d, mpi_op(d.dtype, op, info));
      if (op == ReduceOp::avg) {
        w->avg_ = d;
        w->avg_by_ = size();
      }
      return make_work(std::move(w), std::move(info));
    }
    auto w = start(info);
    const int n = checked_int(d.count, info);
    w->reqs.emplace_back();
    call(MPI_Iallreduce(MPI_IN_PLACE, d.data, n, mpi_type(d.dtype), mpi_op(d.dtype, op, info), comm_, &w->reqs.back()),
         info, "MPI_Iallreduce");
    if (op == ReduceOp::avg) {
      w->avg_ = d;
      w->avg_by_ = size();
    }
    return make_work(std::move(w), std::move(info));
  }
  Work reduce_scatter_impl(Buffer in, Buffer out, ReduceOp op, CallInfo info) override {
    if (use_ring(out.count > 0, in.bytes(), false)) {
      checked_int(in.count, info);
      auto w = std::make_shared<RingWork>(this, info, RingWork::Kind::reduce_scatter, in, out,
                                          mpi_op(in.dtype, op, info));
      if (op == ReduceOp::avg) {
        w->avg_ = out;
        w->avg_by_ = size();
      }
      return make_work(std::move(w), std::move(info));
    }
    auto w = start(info);
    const int n = checked_int(out.count, info);
    w->reqs.emplace_back();
    call(MPI_Ireduce_scatter_block(in.data, out.data, n, mpi_type(in.dtype), mpi_op(in.dtype, op, info), comm_,
                                   &w->reqs.back()),
         info, "MPI_Ireduce_scatter_block");
    if (op == ReduceOp::avg) {
      w->avg_ = out;
      w->avg_by_ = size();
    }
    return make_work(std::move(w), std::move(info));
  }
  Work all_gather_impl(Buffer in, Buffer out, CallInfo info) override {
    auto w = start(info);
    const int n = checked_int(in.count, info);
    checked_int(out.count, info);
    w->reqs.emplace_back();
    call(MPI_Iallgather(in.data, n, mpi_type(in.dtype), out.data, n, mpi_type(out.dtype), comm_, &w->reqs.back()),
         info, "MPI_Iallgather");
    return make_work(std::move(w), std::move(info));
  }
  Work all_to_all_impl(Buffer in, Buffer out, CallInfo info) override {
    auto w = start(info);
    const int n = checked_int(in.count / static_cast<size_t>(size()), info);
    checked_int(in.count, info);
    w->reqs.emplace_back();
    call(MPI_Ialltoall(in.data, n, mpi_type(in.dtype), out.data, n, mpi_type(out.dtype), comm_, &w->reqs.back()), info,
         "MPI_Ialltoall");
    return make_work(std::move(w), std::move(info));
  }
  Work all_to_all_v_impl(Buffer in, std::span<const int64_t> sc, Buffer out, std::span<const int64_t> rc,
                         CallInfo info) override {
    auto w = start(info);
    const size_t n = static_cast<size_t>(size());
    w->counts.resize(n);
    w->displs.resize(n);
    w->rcounts.resize(n);
    w->rdispls.resize(n);
    size_t so = 0, ro = 0;
    for (size_t r = 0; r < n; ++r) {
      w->counts[r] = checked_int(static_cast<size_t>(sc[r]), info);
      w->rcounts[r] = checked_int(static_cast<size_t>(rc[r]), info);
      w->displs[r] = checked_int(so, info);
      w->rdispls[r] = checked_int(ro, info);
      so += static_cast<size_t>(sc[r]);
      ro += static_cast<size_t>(rc[r]);
    }
    w->reqs.emplace_back();
    call(MPI_Ialltoallv(in.data, w->counts.data(), w->displs.data(), mpi_type(in.dtype), out.data, w->rcounts.data(),
                        w->rdispls.data(), mpi_type(out.dtype), comm_, &w->reqs.back()),
         info, "MPI_Ialltoallv");
    return make_work(std::move(w), std::move(info));
  }
  Work broadcast_impl(Buffer d, int root, CallInfo info) override {
    auto w = start(info);
    w->reqs.emplace_back();
    call(MPI_Ibcast(d.data, checked_int(d.count, info), mpi_type(d.dtype), root, comm_, &w->reqs.back()), info,
         "MPI_Ibcast");
    return make_work(std::move(w), std::move(info));
  }
  Work send_impl(Buffer d, int peer, int tag, CallInfo info) override {
    auto w = start(info, false);
    post_send(*w, d, peer, tag, info);
    return make_work(std::move(w), std::move(info));
  }
  Work recv_impl(Buffer d, int peer, int tag, CallInfo info) override {
    auto w = start(info, false);
    post_recv(*w, d, peer, tag, info);
    return make_work(std::move(w), std::move(info));
  }
  Work batch_impl(std::span<const P2POp> ops, CallInfo info) override {
    auto w = start(info, false);
    // Receives first, so eager sends from peers land in posted buffers.
    for (const auto& o : ops)
      if (o.kind == P2POp::Kind::recv) post_recv(*w, o.buf, o.peer, o.tag, info);
    for (const auto& o : ops)
      if (o.kind == P2POp::Kind::send) post_send(*w, o.buf, o.peer, o.tag, info);
    return make_work(std::move(w), std::move(info));
  }
  Work barrier_impl(CallInfo info) override {
    auto w = start(info);
    w->reqs.emplace_back();
    call(MPI_Ibarrier(comm_, &w->reqs.back()), info, "MPI_Ibarrier");
    return make_work(std::move(w), std::move(info));
  }

 private:
  // The ring needs something to cut (an all-reduce at least one element per rank) and enough
  // bytes to pay for its steps: ring_min_bytes() per step of one phase (n-1 on a ring, log2(n)
  // halving). Every member decides alike, from the same counts.
  bool use_ring(bool enough_elements, size_t bytes, bool halving) const {
    const int n = size();
    const int steps = halving && std::has_single_bit(static_cast<unsigned>(n))
                          ? std::countr_zero(static_cast<unsigned>(n))  // log2(n)
                          : n - 1;
    return n > 1 && enough_elements && bytes >= ring_min_bytes() * static_cast<size_t>(steps);
  }
  std::shared_ptr<MpiWork> start(const CallInfo& info, bool collective = true) {
    auto w = std::make_shared<MpiWork>(this, info);
    w->collective_ = collective;
    return w;
  }
  void call(int code, const CallInfo& info, const char* what) {
    if (code != MPI_SUCCESS) raise(info, code, what);
  }
  void check(int code, const char* what, const std::string& name) {
    if (code != MPI_SUCCESS)
      TRIAX_THROW(CommError, "{} for group '{}' on {} failed: {}", what, name, describe(), mpi_error_string(code));
  }
  void post_send(MpiWork& w, Buffer d, int peer, int tag, const CallInfo& info) {
    w.reqs.emplace_back();
    call(MPI_Isend(d.data, checked_int(d.count, info), mpi_type(d.dtype), peer, tag, comm_, &w.reqs.back()), info,
         "MPI_Isend");
  }
  void post_recv(MpiWork& w, Buffer d, int peer, int tag, const CallInfo& info) {
    w.reqs.emplace_back();
    const int n = checked_int(d.count, info);
    call(MPI_Irecv(d.data, n, mpi_type(d.dtype), peer, tag, comm_, &w.reqs.back()), info, "MPI_Irecv");
    w.recv_checks.push_back({w.reqs.size() - 1, n, mpi_type(d.dtype)});
  }

  MPI_Comm comm_;
  MPI_Comm ring_ = MPI_COMM_NULL;
  CommOptions opts_;
  uint64_t ring_calls_ = 0;
  std::vector<std::vector<std::byte>> scratch_;
};

bool MpiWork::test() {
  progress_rings(nullptr);
  int done = 0;
  statuses_.resize(reqs.size());
  auto& st = statuses_;
  const int code = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, st.data());
  if (code == MPI_ERR_IN_STATUS) {
    for (const auto& s : st)
      if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING)
        comm_->raise(info_, s.MPI_ERROR, s.MPI_ERROR == MPI_ERR_TRUNCATE
                                             ? "a peer sent more than the receive buffer holds"
                                             : "MPI_Testall");
  }
  if (code != MPI_SUCCESS) comm_->raise(info_, code, "MPI_Testall");
  if (!done) return false;
  for (const auto& c : recv_checks) {
    int got = 0;
    MPI_Get_count(&st[c.index], c.type, &got);
    if (got != c.expected)
      comm_->raise_mismatch(info_, fmt::format("received {} elements from the peer, expected {}", got, c.expected));
  }
  return true;
}

MpiWork::~MpiWork() {
  // A point-to-point request left behind by a timeout is cancelled so a late message cannot land
  // in freed memory. Nonblocking collectives cannot be cancelled (MPI-3); the communicator is
  // poisoned instead and the job should stop.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || collective_) return;
  for (auto& r : reqs) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
}

RingWork::RingWork(MpiCommunicator* comm, CallInfo info, Kind kind, Buffer in, Buffer out, MPI_Op op)
    : comm_(comm), info_(std::move(info)), kind_(kind), in_(in), out_(out), op_(op), type_(mpi_type(in.dtype)),
      ring_(comm->ring_handle()), tag_(comm->next_ring_tag()), r_(comm->rank()), n_(comm->size()),
      es_(dtype_size(in.dtype)) {
  if (kind_ == Kind::all_reduce) {
    count_ = in_.count;
    if (std::has_single_bit(static_cast<unsigned>(n_))) {
      log2n_ = std::countr_zero(static_cast<unsigned>(n_));
      steps_ = 2 * log2n_;
      // The largest range received: half the chunks, each at most the last (largest) one.
      scratch_ = comm_->take_scratch(static_cast<size_t>(n_ / 2) * chunk_len(n_ - 1) * es_);
    } else {
      steps_ = 2 * (n_ - 1);
      scratch_ = comm_->take_scratch(chunk_len(n_ - 1) * es_);  // the last chunk is the largest
    }
  } else {
    count_ = out_.count;
    steps_ = n_ - 1;
    // Two partial blocks: one travels right while the next arrives from the left.
    scratch_ = comm_->take_scratch(n_ > 2 ? 2 * count_ * es_ : 0);
  }
  post_step();
  active_rings().push_back(this);
  registered_ = true;
}

RingWork::~RingWork() {
  if (registered_) {
    auto& rings = active_rings();
    rings.erase(std::remove(rings.begin(), rings.end(), this), rings.end());
  }
  // Left behind by a timeout or a failure: cancel what is still posted (as MpiWork does), so a
  // late message cannot land in freed memory.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (auto& r : reqs_) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
}

// Step k of an all-reduce: k < n-1 reduce-scatter (send chunk r-k, receive chunk r-k-1 into
// scratch, reduce it into the data); then all-gather (send chunk r+1-s, receive chunk r-s in
// place). After the reduce-scatter rank r holds the full reduction of chunk r+1.
// Step s of a reduce-scatter: send the partial block r-s-1 (at s = 0 straight from the input),
// receive the partial block r-s-2 and reduce the input's block into it; the last step receives
// block r into the output.
void RingWork::post_step() {
  const int right = (r_ + 1) % n_, left = (r_ + n_ - 1) % n_;
  auto mod = [&](int c) { return ((c % n_) + n_) % n_; };
  const std::byte* send_buf;
  std::byte* recv_buf;
  size_t send_n, recv_n;
  int to = right, from = left;
  if (log2n_ > 0) {
    // Reduce-scatter step k: exchange halves of the current range with partner r ^ (n >> k+1).
    // All-gather step j: exchange the ranges of 2^j chunks with partner r ^ 2^j.
    if (step_ < log2n_) {
      const int d = n_ >> (step_ + 1);
      const auto [keep, give] = halving(step_);
      to = from = r_ ^ d;
      send_buf = at(out_, chunk_off(give));
      send_n = chunks_len(give, d);
      recv_buf = scratch_.data();
      recv_n = chunks_len(keep, d);
    } else {
      const int d = 1 << (step_ - log2n_);
      const int mine = r_ / d * d, theirs = (r_ ^ d) / d * d;
      to = from = r_ ^ d;
      send_buf = at(out_, chunk_off(mine));
      send_n = chunks_len(mine, d);
      recv_buf = at(out_, chunk_off(theirs));
      recv_n = chunks_len(theirs, d);
    }
  } else if (kind_ == Kind::all_reduce) {
    int sc, rc;
    if (step_ < n_ - 1) {
      sc = mod(r_ - step_);
      rc = mod(r_ - step_ - 1);
      recv_buf = scratch_.data();
    } else {
      const int s = step_ - (n_ - 1);
      sc = mod(r_ + 1 - s);
      rc = mod(r_ - s);
      recv_buf = at(out_, chunk_off(rc));
    }
    send_buf = at(out_, chunk_off(sc));
    send_n = chunk_len(sc);
    recv_n = chunk_len(rc);
  } else {
    send_buf = step_ == 0 ? at(in_, static_cast<size_t>(mod(r_ - 1)) * count_)
                          : scratch_.data() + static_cast<size_t>((step_ - 1) % 2) * count_ * es_;
    recv_buf = step_ == n_ - 2 ? at(out_, 0) : scratch_.data() + static_cast<size_t>(step_ % 2) * count_ * es_;
    send_n = recv_n = count_;
  }
  int code = MPI_Irecv(recv_buf, static_cast<int>(recv_n), type_, from, tag_, ring_, &reqs_[0]);
  if (code == MPI_SUCCESS)
    code = MPI_Isend(send_buf, static_cast<int>(send_n), type_, to, tag_, ring_, &reqs_[1]);
  if (code != MPI_SUCCESS) comm_->raise(info_, code, "ring step MPI_Irecv/MPI_Isend");
}

void RingWork::complete_step() {
  auto mod = [&](int c) { return ((c % n_) + n_) % n_; };
  int code = MPI_SUCCESS;
  if (log2n_ > 0) {
    if (step_ >= log2n_) return;  // all-gather: the data arrived in place
    const int keep = halving(step_).first, d = n_ >> (step_ + 1);
    code = MPI_Reduce_local(scratch_.data(), at(out_, chunk_off(keep)), static_cast<int>(chunks_len(keep, d)), type_,
                            op_);
  } else if (kind_ == Kind::all_reduce) {
    if (step_ >= n_ - 1) return;  // all-gather: the data arrived in place
    const int rc = mod(r_ - step_ - 1);
    code = MPI_Reduce_local(scratch_.data(), at(out_, chunk_off(rc)), static_cast<int>(chunk_len(rc)), type_, op_);
  } else {
    void* acc = step_ == n_ - 2 ? at(out_, 0) : scratch_.data() + static_cast<size_t>(step_ % 2) * count_ * es_;
    const size_t block = static_cast<size_t>(mod(r_ - step_ - 2));
    code = MPI_Reduce_local(at(in_, block * count_), acc, static_cast<int>(count_), type_, op_);
  }
  if (code != MPI_SUCCESS) comm_->raise(info_, code, "MPI_Reduce_local");
}

bool RingWork::advance() noexcept {
  if (error_) return false;
  try {
    while (step_ < steps_) {
      int done = 0;
      const int code = MPI_Testall(2, reqs_, &done, MPI_STATUSES_IGNORE);
      if (code != MPI_SUCCESS) comm_->raise(info_, code, "MPI_Testall (ring step)");
      if (!done) return false;
      complete_step();
      if (++step_ < steps_) post_step();
    }
    return true;
  } catch (...) {
    error_ = std::current_exception();
    return false;
  }
}

bool RingWork::test() {
  progress_rings(this);
  const bool done = advance();
  if (error_) std::rethrow_exception(error_);
  return done;
}

void RingWork::finish() {
  if (avg_.data) divide_buffer(avg_, avg_by_);
  comm_->give_scratch(std::move(scratch_));
  auto& rings = active_rings();
  rings.erase(std::remove(rings.begin(), rings.end(), this), rings.end());
  registered_ = false;
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name, CommOptions opts) {
  MPI_Comm dup = MPI_COMM_NULL;
  if (int code = MPI_Comm_dup(comm, &dup); code != MPI_SUCCESS)
    TRIAX_THROW(CommError, "MPI_Comm_dup for '{}' failed: {}", name, mpi_error_string(code));
  return MpiCommunicator::adopt(dup, std::move(name), opts);
}

MPI_Comm mpi_handle(const Communicator& c) {
  auto* m = dynamic_cast<const MpiCommunicator*>(&c);
  if (!m) TRIAX_THROW(CommError, "{} uses the {} backend, not MPI", c.describe(), backend_name(c.backend()));
  return m->handle();
}

}  // namespace triax
