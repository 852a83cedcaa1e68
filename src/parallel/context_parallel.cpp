// Ring and all-gather attention over the context-parallel group (parallel/context_parallel.h).
// Rows of this rank: [0, Tc) are chunk r, [Tc, 2 Tc) are chunk 2 cp - 1 - r. A K/V buffer holds
// the same two chunks of its owner, packed (B, T, 2 NKV HD): K heads, then V heads.
#include "triax/parallel/context_parallel.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "triax/backend/comm_ops.h"
#include "triax/core/clock.h"
#include "triax/core/trace.h"

namespace triax {

std::string_view cp_comm_type_name(CpCommType t) { return t == CpCommType::p2p ? "p2p" : "allgather"; }

int64_t CpZigzag::position(int t) const {
  const int c = chunk();
  return t < c ? int64_t{rank} * c + t : int64_t{2 * cp - 1 - rank} * c + (t - c);
}

std::vector<int64_t> CpZigzag::positions() const {
  std::vector<int64_t> out(static_cast<size_t>(local()));
  for (int t = 0; t < local(); ++t) out[static_cast<size_t>(t)] = position(t);
  return out;
}

void cp_slice_rows(const CpZigzag& z, int B, std::vector<int32_t>& v) {
  if (z.cp == 1) return;
  if (v.size() != static_cast<size_t>(B) * static_cast<size_t>(z.seq))
    TRIAX_THROW(ConfigError, "context parallelism: {} tokens are not {} sequences of {}", v.size(), B, z.seq);
  const size_t c = static_cast<size_t>(z.chunk()), L = static_cast<size_t>(z.local()), S = static_cast<size_t>(z.seq);
  std::vector<int32_t> out(static_cast<size_t>(B) * L);
  for (size_t b = 0; b < static_cast<size_t>(B); ++b)
    for (int h = 0; h < 2; ++h) {
      const size_t from = b * S + static_cast<size_t>(z.chunk_of(z.rank, h)) * c;
      std::copy(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(from + c),
                out.begin() + static_cast<std::ptrdiff_t>(b * L + static_cast<size_t>(h) * c));
    }
  v.swap(out);
}

namespace {
using Clock = std::chrono::steady_clock;
double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }
}  // namespace

struct ContextParallel::Dims {
  int B, T, C, NH, kv, hs, qw, kvw;
  int64_t rows() const { return int64_t{B} * T; }
  size_t kv_numel() const { return static_cast<size_t>(rows()) * static_cast<size_t>(kvw); }
};

ContextParallel::ContextParallel(Communicator& cp, Backend& be, CpCommType type) : cp_(cp), be_(be), type_(type) {}

Tensor& ContextParallel::buffer(int i, size_t n) {
  if (bufs_.size() <= static_cast<size_t>(i)) bufs_.resize(static_cast<size_t>(i) + 1);
  Tensor& t = bufs_[static_cast<size_t>(i)];
  if (!t.defined() || static_cast<size_t>(t.numel()) < n || t.dtype() != be_.compute_dtype())
    t = be_.empty(Shape{static_cast<int64_t>(n)}, be_.compute_dtype());
  return t;
}

// Polls the exchanges in flight (MPI progresses only inside its calls) and notes when each
// completes: the issue -> completion time is then measured, not assumed.
void ContextParallel::poll() {
  for (Pending* p : {&pending_[0], &pending_[1]})
    if (p->w.valid() && p->done < 0 && p->w.test()) p->done = now_s();
}

Work& ContextParallel::start(int slot) {
  Pending& p = pending_[slot];
  p.issued = now_s();
  p.done = -1;
  ++stats_.exchanges;
  return p.w;
}

void ContextParallel::finish(int slot) {
  Pending& p = pending_[slot];
  if (!p.w.valid()) return;
  if (p.done < 0) {
    const auto t0 = Clock::now();
    {
      trace::Span span(trace::Lane::p2p, "cp K/V exchange wait");
      p.w.wait();
    }
    stats_.exposed_s += since(t0);
    p.done = now_s();
  } else {
    p.w.wait();  // complete: releases it
  }
  stats_.total_s += p.done - p.issued;
  if (trace::on()) {  // issue -> observed completion, beside the exposed wait (docs/OBSERVE.md)
    const double end_us = trace::now_us() - (now_s() - p.done) * 1e6;
    trace::record(trace::Lane::p2p, slot == 0 ? "cp exchange" : "cp dK/dV exchange",
                  end_us - (p.done - p.issued) * 1e6, end_us);
  }
  p.w = Work();
}

void ContextParallel::pack_kv(const Tensor& kv, const Tensor& qkv, const Dims& d) {
  be_.copy_columns(kv, qkv, d.rows(), d.kvw, 0, d.qw, d.C, d.kvw);
}

// Calls f(block) for the (up to four) chunk pairs of this rank's queries and src's keys that
// causality keeps, polling the exchanges in flight after each; the time counts as compute.
template <class F>
void ContextParallel::for_each_block(int src, const Dims& d, F&& f) {
  const CpZigzag z = zigzag(d.T * size());
  const int tc = z.chunk();
  const auto t0 = Clock::now();
  for (int qh = 0; qh < 2; ++qh)
    for (int kh = 0; kh < 2; ++kh) {
      const int qc = z.chunk_of(rank(), qh), kc = z.chunk_of(src, kh);
      if (kc > qc) continue;
      f(ops::AttentionBlock{d.B, d.C, d.NH, d.kv, d.T, qh * tc, tc, d.T, kh * tc, tc, d.kvw, 0, int64_t{qc} * tc,
                            int64_t{kc} * tc});
      poll();
    }
  stats_.compute_s += since(t0);
}

void ContextParallel::blocks_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Tensor& kv, int src,
                                     const Dims& d) {
  for_each_block(src, d, [&](const ops::AttentionBlock& b) { be_.attention_block_forward(out, lse, qkv, kv, b); });
}

void ContextParallel::blocks_backward(const Tensor& dqkv, const Tensor& dkv, const Tensor& dout, const Tensor& qkv,
                                      const Tensor& kv, const Tensor& out, const Tensor& lse, int src, const Dims& d) {
  for_each_block(src, d, [&](const ops::AttentionBlock& b) {
    be_.attention_block_backward(dqkv, dkv, dout, qkv, kv, out, lse, b);
  });
}

void ContextParallel::forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, int B, int T, int C, int NH,
                              int NKV) {
  const int kv = NKV > 0 ? NKV : NH, hs = C / NH;
  if (T % 2 != 0)
    TRIAX_THROW(ConfigError, "context parallelism: {} local tokens do not split into the two zigzag chunks", T);
  const Dims d{B, T, C, NH, kv, hs, C + 2 * kv * hs, 2 * kv * hs};
  be_.fill(lse.slice(0, int64_t{B} * NH * T), -std::numeric_limits<double>::infinity());
  if (type_ == CpCommType::p2p)
    ring_forward(out, lse, qkv, d);
  else
    gather_forward(out, lse, qkv, d);
}

void ContextParallel::backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                               const Tensor& lse, int B, int T, int C, int NH, int NKV) {
  const int kv = NKV > 0 ? NKV : NH, hs = C / NH;
  const Dims d{B, T, C, NH, kv, hs, C + 2 * kv * hs, 2 * kv * hs};
  be_.fill(dqkv.slice(0, d.rows() * d.qw), 0.0);
  if (type_ == CpCommType::p2p)
    ring_backward(dqkv, dout, qkv, out, lse, d);
  else
    gather_backward(dqkv, dout, qkv, out, lse, d);
}

// Step i computes with the K/V of rank (r - i) mod cp while the next block travels.
void ContextParallel::ring_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Dims& d) {
  const int n = size(), r = rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t kn = d.kv_numel();
  Tensor cur = buffer(0, kn).slice(0, static_cast<int64_t>(kn)), nxt = buffer(1, kn).slice(0, static_cast<int64_t>(kn));
  pack_kv(cur, qkv, d);
  for (int i = 0; i < n; ++i) {
    if (i + 1 < n) {
      const Tensor s[] = {cur}, v[] = {nxt};
      start(0) = send_recv(cp_, be_, s, next, v, prev, 100);
      stats_.bytes += cur.nbytes();
    }
    blocks_forward(out, lse, qkv, cur, (r - i + n) % n, d);
    finish(0);
    std::swap(cur, nxt);
  }
}

// Step i: the K/V of owner (r - i) mod cp and its dK/dV so far (from prev); this rank's share is
// added and the sum travels on to next, so after cp steps each owner holds its complete dK/dV.
void ContextParallel::ring_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                    const Tensor& lse, const Dims& d) {
  const int n = size(), r = rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
  const auto kn = static_cast<int64_t>(d.kv_numel());
  Tensor cur = buffer(0, kn).slice(0, kn), nxt = buffer(1, kn).slice(0, kn);
  Tensor part[2] = {buffer(2, kn).slice(0, kn), buffer(3, kn).slice(0, kn)};
  Tensor incoming = buffer(4, kn).slice(0, kn);
  pack_kv(cur, qkv, d);
  for (int i = 0; i < n; ++i) {
    if (i + 1 < n) {
      const Tensor s[] = {cur}, v[] = {nxt};
      start(0) = send_recv(cp_, be_, s, next, v, prev, 200);
      stats_.bytes += cur.nbytes();
    }
    const Tensor& acc = part[i % 2];
    be_.fill(acc, 0.0);
    blocks_backward(dqkv, acc, dout, qkv, cur, out, lse, (r - i + n) % n, d);
    if (i > 0) {
      finish(1);
      be_.axpy(acc, 1.0, incoming);
    }
    finish(0);
    std::swap(cur, nxt);
    const Tensor s[] = {acc}, v[] = {incoming};
    start(1) = send_recv(cp_, be_, s, next, v, prev, 300);
    stats_.bytes += acc.nbytes();
  }
  finish(1);
  be_.copy_columns(dqkv, incoming, d.rows(), d.qw, d.C, d.kvw, 0, d.kvw);
}

void ContextParallel::gather_forward(const Tensor& out, const Tensor& lse, const Tensor& qkv, const Dims& d) {
  const auto kn = static_cast<int64_t>(d.kv_numel());
  const Tensor mine = buffer(0, static_cast<size_t>(kn)).slice(0, kn);
  const Tensor all = buffer(1, static_cast<size_t>(kn) * size()).slice(0, kn * size());
  pack_kv(mine, qkv, d);
  start(0) = all_gather(cp_, be_, mine, all);
  stats_.bytes += mine.nbytes();
  finish(0);
  for (int s = 0; s < size(); ++s) blocks_forward(out, lse, qkv, all.slice(s * kn, (s + 1) * kn), s, d);
}

void ContextParallel::gather_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                      const Tensor& lse, const Dims& d) {
  const auto kn = static_cast<int64_t>(d.kv_numel());
  const Tensor mine = buffer(0, static_cast<size_t>(kn)).slice(0, kn);
  const Tensor all = buffer(1, static_cast<size_t>(kn) * size()).slice(0, kn * size());
  const Tensor dall = buffer(2, static_cast<size_t>(kn) * size()).slice(0, kn * size());
  pack_kv(mine, qkv, d);
  start(0) = all_gather(cp_, be_, mine, all);
  stats_.bytes += mine.nbytes();
  finish(0);
  be_.fill(dall, 0.0);
  for (int s = 0; s < size(); ++s)
    blocks_backward(dqkv, dall.slice(s * kn, (s + 1) * kn), dout, qkv, all.slice(s * kn, (s + 1) * kn), out, lse, s,
                    d);
  start(0) = reduce_scatter(cp_, be_, dall, mine, ReduceOp::sum);
  stats_.bytes += dall.nbytes();
  finish(0);
  be_.copy_columns(dqkv, mine, d.rows(), d.qw, d.C, d.kvw, 0, d.kvw);
}

}  // namespace triax
