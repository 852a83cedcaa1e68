// Context parallelism (ring attention): every sequence of a micro-batch is cut into 2 cp chunks of
// T / (2 cp) tokens and CP rank r holds chunks r and 2 cp - 1 - r (the zigzag that gives every rank
// the same share of causal attention). Everything but attention is token-local; attention keeps
// each rank's queries and moves the keys and values:
//   p2p:       K/V blocks travel around the CP ring, each block's attention merged into the running
//              result by online softmax while the next block is in flight; backward sends the K/V
//              and their gradients dK/dV around the ring (the gradient ends at its owner).
//   allgather: K/V gathered once per layer (torchtitan's choice), dK/dV reduce-scattered back.
// Grouped-query attention sends only the key/value heads. docs/CONTEXT_PARALLEL.md.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "triax/backend/backend.h"
#include "triax/distributed/comm/comm.h"

namespace triax {

enum class CpCommType { p2p, allgather };
std::string_view cp_comm_type_name(CpCommType t);

// The zigzag cut of a sequence of seq tokens over cp ranks (pure arithmetic).
struct CpZigzag {
  int cp = 1, rank = 0, seq = 0;
  int chunk() const { return seq / (2 * cp); }   // tokens per chunk
  int local() const { return seq / cp; }         // tokens of a sequence on one rank
  int chunk_of(int r, int half) const { return half == 0 ? r : 2 * cp - 1 - r; }
  // Global position of this rank's local row t (0 <= t < local()).
  int64_t position(int t) const;
  // Positions of every local row, in order.
  std::vector<int64_t> positions() const;
};

// Keeps this rank's zigzag rows of B sequences of z.seq tokens each (v: B x seq, row-major, as a
// data loader hands them) in place: v becomes B x z.local().
void cp_slice_rows(const CpZigzag& z, int B, std::vector<int32_t>& v);

// Exchange timings of one rank, summed since the last reset (the iteration line's "cp" field).
struct CpStats {
  double exposed_s = 0;  // time compute waited for a K/V (or dK/dV) exchange to complete
  double total_s = 0;    // sum over exchanges of issue -> observed completion
  double compute_s = 0;  // time in the block attention ops
  size_t exchanges = 0;
  size_t bytes = 0;      // sent by this rank
};

class ContextParallel {
 public:
  // cp: the context-parallel group (the backend-adapted communicator); seq: the full sequence length.
  ContextParallel(Communicator& cp, Backend& be, CpCommType type);

  int size() const { return cp_.size(); }
  int rank() const { return cp_.rank(); }
  CpCommType comm_type() const { return type_; }
  CpZigzag zigzag(int seq) const { return CpZigzag{size(), rank(), seq}; }

  // Causal attention of this rank's rows (the Backend::attention_forward contract on the local
  // T = seq / cp rows: qkv (B, T, C + 2 NKV HD), out (B, T, C), lse (B, NH, T)), over the whole
  // sequence of the CP group.
  void forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int B, int T, int C, int NH, int NKV);
  // dqkv written in full, from the forward's out and lse.
  void backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse, int B,
                int T, int C, int NH, int NKV);

  const CpStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CpStats{}; }

 private:
  struct Dims;
  void pack_kv(const Tensor& kv, const Tensor& qkv, const Dims& d);
  template <class F>
  void for_each_block(int src, const Dims& d, F&& f);
  void blocks_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& kv, int src,
                      const Dims& d);
  void blocks_backward(const Tensor& dqkv, const Tensor& dkv, const Tensor& dout, const Tensor& qkv, const Tensor& kv,
                       const Tensor& out, const Tensor& lse, int src, const Dims& d);
  void ring_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Dims& d);
  void ring_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                     const Dims& d);
  void gather_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Dims& d);
  void gather_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                       const Dims& d);
  // Exchange slots: 0 the K/V (or gather), 1 the travelling dK/dV. start() notes the issue time
  // and returns the slot's Work to assign; poll() notes completions between blocks; finish()
  // waits (the wait counted as exposed) and adds issue -> completion to total.
  struct Pending {
    Work w;
    double issued = 0, done = -1;
  };
  Work& start(int slot);
  void poll();
  void finish(int slot);
  Tensor& buffer(int i, size_t n);

  Communicator& cp_;
  Backend& be_;
  CpCommType type_;
  CpStats stats_;
  Pending pending_[2];
  std::vector<Tensor> bufs_;  // K/V and dK/dV buffers, reused across layers
};

}  // namespace triax
