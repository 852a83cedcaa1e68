// Pipeline schedules as data: one instruction list per pipeline stage (forward, full or split
// backward, and the point-to-point sends/receives between neighbour stages) for GPipe, 1F1B,
// interleaved 1F1B and ZB-H1. No model, no MPI: lists are printed, checked, simulated, then walked.
// The exact semantics an executor must honour are in docs/SCHEDULES.md.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "triax/core/enum_names.h"

namespace triax {

// What one instruction does. mb is the micro-batch, chunk the model chunk *of the stage that runs
// the instruction* (0..v-1; chunk c on stage s is virtual stage c*p + s).
enum class PipeOp : std::uint8_t {
  forward,          // F(mb, chunk): run the chunk's forward; the last virtual stage also computes the loss
  backward,         // full backward of (mb, chunk): input gradient and weight gradient together
  backward_input,   // B (zero-bubble split): the input gradient only; keeps what W needs
  backward_weight,  // W (zero-bubble split): the weight gradient, after B of the same (mb, chunk)
  send_activation,  // post an async send of F(mb, chunk)'s output to the next virtual stage
  recv_activation,  // post a receive of (mb, chunk)'s input from the previous virtual stage
  send_grad,        // post an async send of (mb, chunk)'s input gradient to the previous virtual stage
  recv_grad,        // post a receive of (mb, chunk)'s output gradient from the next virtual stage
};

std::string_view pipe_op_name(PipeOp op);  // "forward", "send_activation", ...
bool is_compute(PipeOp op);                // forward, backward, backward_input, backward_weight
bool is_send(PipeOp op);
bool is_recv(PipeOp op);

struct PipeInstr {
  PipeOp op = PipeOp::forward;
  int mb = 0;
  int chunk = 0;
  int peer = -1;  // send/recv: the pipeline rank (stage) on the other side; -1 for compute
  bool operator==(const PipeInstr&) const = default;
};

// Compact token used in listings: F3, BW3 (full backward), B3, W3, SA3>1, RA3<0, SG3>0, RG3<2;
// with chunks > 1 the chunk follows a dot: F3.1, SA3.1>2.
std::string short_name(const PipeInstr& in, int chunks);
// Long form for messages: "send_activation(mb=3, chunk=1, to stage 2)".
std::string describe(const PipeInstr& in);

// ScheduleKind and its names ("gpipe", "1f1b", "interleaved", "zb-h1") are in core/enum_names.h.
inline std::string_view schedule_kind_name(ScheduleKind k) { return enum_name(k); }
// Parses the names above (the --schedule flag); ConfigError listing them otherwise.
inline ScheduleKind parse_schedule_kind(std::string_view name) { return parse_enum<ScheduleKind>(name); }

struct Schedule {
  ScheduleKind kind = ScheduleKind::gpipe;
  int stages = 1;         // p: pipeline ranks
  int chunks = 1;         // v: model chunks per stage (virtual pipeline size)
  int micro_batches = 1;  // m
  // Forward passes only (evaluation): no backward instructions, and the executor runs each
  // forward without keeping activations or computing gradients (make_forward_only).
  bool forward_only = false;
  // lists[s]: what pipeline rank s executes, in order.
  std::vector<std::vector<PipeInstr>> lists;
  // Documented memory bounds per stage, in units of one (mb, chunk)'s stored activations:
  // activation_bound[s] >= #(mb, chunk) with F done and B/backward not yet done;
  // stash_bound[s] >= #(mb, chunk) with F done and W/backward not yet done (what W still needs).
  std::vector<int> activation_bound;
  std::vector<int> stash_bound;

  int virtual_stages() const { return stages * chunks; }
  int virtual_stage(int stage, int chunk) const { return chunk * stages + stage; }
  bool is_first_virtual(int stage, int chunk) const { return stage == 0 && chunk == 0; }
  bool is_last_virtual(int stage, int chunk) const { return stage == stages - 1 && chunk == chunks - 1; }
  // "1f1b p=4 v=1 m=8"
  std::string label() const;
};

// Where the neighbours of (stage, chunk) live in the virtual pipeline (wrapping from the last
// stage to the first between chunks). Only valid when the neighbour exists.
struct StageChunk {
  int stage;
  int chunk;
  bool operator==(const StageChunk&) const = default;
};
StageChunk next_virtual(const Schedule& s, int stage, int chunk);
StageChunk prev_virtual(const Schedule& s, int stage, int chunk);

// An MPI-style tag for a send or receive instruction of `stage`: both ends of a message get the
// same tag, and no two messages between the same two stages share one, so an executor may match
// by tag instead of relying on channel order. (mb * v + sender's chunk) * 2 + (1 for gradients),
// below 2 * m * v; -1 for compute instructions.
int message_tag(const Schedule& s, int stage, const PipeInstr& in);

// Throws ConfigError with the numbers when (kind, p, v, m) is not a schedule this library makes:
// p, v, m < 1; 1f1b / zb-h1 with v != 1; interleaved with v < 2, p < 2 or m % p != 0;
// gpipe with v > 1 and p < 2 (chunks would hand off on one rank); p*v*m over 2^24.
void validate_schedule_config(ScheduleKind kind, int p, int v, int m);

// The documented bounds (see Schedule): GPipe m*v; 1F1B min(p-s, m); interleaved
// min(2(p-s-1) + (v-1)p + 1, m*v) (Megatron's warm-up + 1); ZB-H1 activations min(p-s, m) and
// stash min(p, m) (W is deferred, but never past 1F1B's peak, which is stage 0's p).
int activation_bound(ScheduleKind kind, int p, int v, int m, int stage);
int stash_bound(ScheduleKind kind, int p, int v, int m, int stage);

// Generates, inserts the P2P instructions, then runs check_schedule on the result (it throws
// if a generator were wrong). Bad (kind, p, v, m) throw ConfigError.
Schedule make_schedule(ScheduleKind kind, int p, int v, int m);
Schedule make_gpipe(int p, int m, int v = 1);
Schedule make_1f1b(int p, int m);
Schedule make_interleaved_1f1b(int p, int v, int m);
Schedule make_zb_h1(int p, int m);
// Evaluation: every stage runs F(mb, c) for each chunk c in order, all m micro-batches of it
// (GPipe's forward half), with the activation sends and receives; forward_only is set.
Schedule make_forward_only(int p, int v, int m);

// Adds the send/receive instructions to lists that hold compute instructions only, in an order
// that is deadlock-free even for a fully blocking executor: both ends of every message are
// placed at the same point of one global order (the producer's end time in a unit-cost
// simulation, ties broken identically on both sides). Throws ConfigError if the compute orders
// themselves cannot complete (a cycle across stages) or a list already holds P2P instructions.
void insert_p2p(Schedule& s);

// Per-stage listing, one line per stage: "stage 0: F0 SA0>1 F1 SA1>1 RG0<1 BW0 ..."
std::string format_lists(const Schedule& s);

}  // namespace triax
