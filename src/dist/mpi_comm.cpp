// MPI backend: each call starts a nonblocking MPI operation and returns a Work that polls it.
// bf16/fp16 reductions use user-defined MPI ops that accumulate in float; avg is a sum divided
// on completion. All counts are checked against MPI's int limit before a call starts.
#include "triax/dist/mpi_comm.h"

#include <climits>
#include <numeric>

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

template <class T>
void divide(void* p, size_t n, int by) {
  auto* x = static_cast<T*>(p);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
      x[i] = T(static_cast<float>(x[i]) / static_cast<float>(by));
    else
      x[i] = static_cast<T>(x[i] / static_cast<T>(by));
  }
}

void divide_buffer(Buffer b, int by) {
  switch (b.dtype) {
    case DType::f32: divide<float>(b.data, b.count, by); break;
    case DType::f64: divide<double>(b.data, b.count, by); break;
    case DType::i32: divide<int32_t>(b.data, b.count, by); break;
    case DType::i64: divide<int64_t>(b.data, b.count, by); break;
    case DType::bf16: divide<bf16>(b.data, b.count, by); break;
    case DType::f16: divide<f16>(b.data, b.count, by); break;
    case DType::u8: break;
  }
}

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
  friend class MpiCommunicator;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, std::string name, std::vector<int> world_ranks, CommOptions opts)
      : Communicator(rank, size, std::move(name), std::move(world_ranks), opts), comm_(comm), opts_(opts) {}
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  Backend backend() const override { return Backend::mpi; }
  MPI_Comm handle() const { return comm_; }

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
  CommOptions opts_;
};

bool MpiWork::test() {
  int done = 0;
  std::vector<MPI_Status> st(reqs.size());
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
