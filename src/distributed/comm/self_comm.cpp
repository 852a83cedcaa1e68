// Single-rank communicator on host memory: collectives are copies, and a send to oneself is
// queued until the matching receive (same tag) takes it.
#include "triax/distributed/comm/self_comm.h"

#include <cstring>
#include <deque>

namespace triax {
namespace {

struct DoneWork final : WorkImpl {
  bool test() override { return true; }
};

void copy(Buffer dst, Buffer src) {
  if (src.data != dst.data && src.bytes() > 0) std::memmove(dst.data, src.data, src.bytes());
}

struct Message {
  int tag;
  std::vector<std::byte> bytes;
};

class SelfCommunicator final : public Communicator {
 public:
  SelfCommunicator(std::string name, int world_rank) : Communicator(0, 1, std::move(name), {world_rank}) {}
  CommBackend backend() const override { return CommBackend::self; }

  std::unique_ptr<Communicator> split(int color, int, std::string name) override {
    if (color < 0) return nullptr;
    return std::make_unique<SelfCommunicator>(std::move(name), world_rank());
  }

 protected:
  Work all_reduce_impl(Buffer, ReduceOp, CallInfo info) override { return done(std::move(info)); }
  Work reduce_scatter_impl(Buffer in, Buffer out, ReduceOp, CallInfo info) override {
    copy(out, in);
    return done(std::move(info));
  }
  Work all_gather_impl(Buffer in, Buffer out, CallInfo info) override {
    copy(out, in);
    return done(std::move(info));
  }
  Work all_to_all_impl(Buffer in, Buffer out, CallInfo info) override {
    copy(out, in);
    return done(std::move(info));
  }
  Work all_to_all_v_impl(Buffer in, std::span<const int64_t> sc, Buffer out, std::span<const int64_t> rc,
                         CallInfo info) override {
    // What this rank sends to itself is what it receives from itself; a mismatch would copy past
    // the end of out (or leave part of it stale).
    if (sc[0] != rc[0])
      fail(info, fmt::format("sends {} elements to itself but expects to receive {}", sc[0], rc[0]));
    copy(out, in);
    return done(std::move(info));
  }
  Work broadcast_impl(Buffer, int, CallInfo info) override { return done(std::move(info)); }
  Work send_impl(Buffer data, int, int tag, CallInfo info) override {
    post(data, tag);
    return done(std::move(info));
  }
  Work recv_impl(Buffer data, int, int tag, CallInfo info) override {
    return make_work(std::make_shared<RecvWork>(this, data, tag, info), info);
  }
  Work batch_impl(std::span<const P2POp> ops, CallInfo info) override {
    for (const auto& o : ops)
      if (o.kind == P2POp::Kind::send) post(o.buf, o.tag);
    for (const auto& o : ops)
      if (o.kind == P2POp::Kind::recv && !take(o.buf, o.tag, info))
        fail(info, fmt::format("receive with tag {} from self has no matching send in the batch or earlier", o.tag));
    return done(std::move(info));
  }
  Work barrier_impl(CallInfo info) override { return done(std::move(info)); }

 private:
  struct RecvWork final : WorkImpl {
    RecvWork(SelfCommunicator* c, Buffer b, int t, CallInfo i) : comm(c), buf(b), tag(t), info(std::move(i)) {}
    bool test() override { return comm->take(buf, tag, info); }
    SelfCommunicator* comm;
    Buffer buf;
    int tag;
    CallInfo info;
  };

  Work done(CallInfo info) { return make_work(std::make_shared<DoneWork>(), std::move(info)); }

  void post(Buffer data, int tag) {
    Message m{tag, std::vector<std::byte>(data.bytes())};
    if (data.bytes()) std::memcpy(m.bytes.data(), data.data, data.bytes());
    mailbox_.push_back(std::move(m));
  }
  bool take(Buffer buf, int tag, const CallInfo& info) {
    for (auto it = mailbox_.begin(); it != mailbox_.end(); ++it) {
      if (it->tag != tag) continue;
      if (it->bytes.size() != buf.bytes())
        fail(info, fmt::format("message from self has {} bytes, receive buffer {}", it->bytes.size(), buf.bytes()));
      if (buf.bytes()) std::memcpy(buf.data, it->bytes.data(), buf.bytes());
      mailbox_.erase(it);
      return true;
    }
    return false;
  }

  std::deque<Message> mailbox_;
};

}  // namespace

std::unique_ptr<Communicator> make_self_communicator(std::string name, int world_rank) {
  return std::make_unique<SelfCommunicator>(std::move(name), world_rank);
}

}  // namespace triax
