// The schedule checker: proves, without running a model, that a Schedule's instruction lists
// are executable: every send has its receive, compute happens in a legal order, no deadlock
// under the P2P models an executor may use, and stored activations stay within the bounds.
#pragma once
#include <string>
#include <vector>

#include "triax/pipeline/schedule.h"

namespace triax {

// How an executor may treat P2P instructions; the checker simulates each one that is enabled.
// In all models compute runs in list order and a compute that consumes a received tensor waits
// until that message has arrived (i.e. its send has been issued and matched).
enum class P2pModel {
  // Sends are buffered: they never block. Receives are non-blocking posts.
  eager,
  // A send blocks the walk until the peer has posted the matching receive (MPI_Ssend, or an
  // Isend waited on at once). Receives are non-blocking posts.
  rendezvous,
  // Fully blocking, one thread: a send blocks until the peer reaches the matching receive and a
  // receive blocks until the peer reaches the matching send (MPI_Ssend + MPI_Recv in list order;
  // also what one in-order NCCL stream per rank requires).
  blocking,
};
std::string_view p2p_model_name(P2pModel m);

struct CheckOptions {
  std::vector<P2pModel> models{P2pModel::eager, P2pModel::rendezvous, P2pModel::blocking};
  // The k-th send on each channel (src stage, dst stage, activation|grad) matches the k-th
  // receive posted on it, so an executor may match messages by channel order (one MPI tag or one
  // NCCL stream per channel).
  bool fifo_channels = true;
  bool check_bounds = true;  // against Schedule::activation_bound / stash_bound
};

struct StageCheck {
  int instructions = 0;
  int computes = 0;
  int sends = 0;
  int recvs = 0;
  int peak_activations = 0;  // max #(mb, chunk) with F done and B/backward not done
  int peak_stash = 0;        // max #(mb, chunk) with F done and W/backward not done
};

struct CheckReport {
  std::vector<StageCheck> stages;
  std::vector<P2pModel> models;  // the models proven deadlock-free
  int messages = 0;              // matched send/receive pairs
  // "1f1b p=4 v=1 m=8: ok; 24 messages; deadlock-free (eager, rendezvous, blocking); peak activations 4 3 2 1 ..."
  std::string summary(const Schedule& s) const;
};

// Checks s and returns the report, or throws ConfigError naming the first violation: the stage,
// the instruction index and the instruction, and what was expected. Checks, in this order:
// shape (p lists, mb/chunk in range, peers right), each (mb, chunk) forwarded once and backed
// once (full backward, or B then W) on every stage, F before B before W, each send after its
// producer and each receive before its consumer, one receive on the neighbour for every send
// (wrapping between last and first stage for chunks), channel order, no deadlock under each
// model, and the memory bounds.
CheckReport check_schedule(const Schedule& s, const CheckOptions& opts = {});

}  // namespace triax
