// Schedule generators: every valid (kind, p, v, m) up to p=8, v=4, m=16 passes the checker under
// every P2P model with its memory bound reached exactly; small schedules equal hand-derived lists;
// every bad configuration is refused with the numbers.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <tuple>
#include <string>
#include <vector>

#include "triax/core/error.h"
#include "triax/pipeline/schedule.h"
#include "triax/pipeline/schedule_check.h"

using namespace triax;

namespace {
const std::vector<ScheduleKind> kKinds = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved,
                                          ScheduleKind::zb_h1};

bool valid(ScheduleKind k, int p, int v, int m) {
  switch (k) {
    case ScheduleKind::gpipe: return v == 1 || p >= 2;
    case ScheduleKind::one_f_one_b:
    case ScheduleKind::zb_h1: return v == 1;
    case ScheduleKind::interleaved: return v >= 2 && p >= 2 && m % p == 0;
  }
  return false;
}

// Compute instructions only, as tokens: the shape of a schedule without its messages.
std::string compute_order(const Schedule& s, int stage) {
  std::string out;
  for (const auto& in : s.lists[stage])
    if (is_compute(in.op)) out += (out.empty() ? "" : " ") + short_name(in, s.chunks);
  return out;
}
}  // namespace

TEST_CASE("every valid (kind, p, v, m) up to 8 x 4 x 16 checks, with its bound reached exactly", "[schedule]") {
  int made = 0, refused = 0;
  for (auto kind : kKinds) {
    for (int p = 1; p <= 8; ++p) {
      for (int v = 1; v <= 4; ++v) {
        for (int m = 1; m <= 16; ++m) {
          INFO(schedule_kind_name(kind) << " p=" << p << " v=" << v << " m=" << m);
          if (!valid(kind, p, v, m)) {
            REQUIRE_THROWS_AS(make_schedule(kind, p, v, m), ConfigError);
            ++refused;
            continue;
          }
          const Schedule s = make_schedule(kind, p, v, m);
          REQUIRE(s.kind == kind);
          REQUIRE(s.stages == p);
          REQUIRE(s.chunks == v);
          REQUIRE(s.micro_batches == m);
          const CheckReport rep = check_schedule(s);  // all three P2P models, channel order, bounds
          REQUIRE(rep.models.size() == 3);
          // Each virtual-stage boundary carries m activations forward and m gradients back.
          REQUIRE(rep.messages == 2 * m * (p * v - 1));
          const int passes = kind == ScheduleKind::zb_h1 ? 3 : 2;
          for (int st = 0; st < p; ++st) {
            const auto& r = rep.stages[st];
            REQUIRE(r.computes == passes * m * v);
            REQUIRE(r.peak_activations == activation_bound(kind, p, v, m, st));
            REQUIRE(r.peak_stash == stash_bound(kind, p, v, m, st));
            REQUIRE(s.activation_bound[st] == activation_bound(kind, p, v, m, st));
          }
          ++made;
        }
      }
    }
  }
  // 1f1b, zb-h1: 8*16 each; gpipe: 8*16 + 7*3*16; interleaved: sum over p>=2 of 3 * floor(16/p).
  int interleaved = 0;
  for (int p = 2; p <= 8; ++p) interleaved += 3 * (16 / p);
  REQUIRE(made == 3 * 128 + 7 * 3 * 16 + interleaved);
  REQUIRE(made + refused == 4 * 8 * 4 * 16);
}

TEST_CASE("the bounds have their closed forms", "[schedule]") {
  // GPipe keeps everything; 1F1B p - s; interleaved Megatron's warm-up + 1; ZB-H1 stash p.
  CHECK(activation_bound(ScheduleKind::gpipe, 4, 2, 8, 3) == 16);
  CHECK(activation_bound(ScheduleKind::one_f_one_b, 4, 1, 8, 0) == 4);
  CHECK(activation_bound(ScheduleKind::one_f_one_b, 4, 1, 8, 3) == 1);
  CHECK(activation_bound(ScheduleKind::one_f_one_b, 4, 1, 2, 0) == 2);
  CHECK(activation_bound(ScheduleKind::interleaved, 4, 2, 8, 0) == 2 * 3 + 4 + 1);
  CHECK(activation_bound(ScheduleKind::interleaved, 4, 2, 8, 3) == 0 + 4 + 1);
  CHECK(activation_bound(ScheduleKind::interleaved, 2, 4, 2, 0) == 8);  // capped at m * v
  CHECK(activation_bound(ScheduleKind::zb_h1, 4, 1, 8, 2) == 2);
  CHECK(stash_bound(ScheduleKind::zb_h1, 4, 1, 8, 2) == 4);
  CHECK(stash_bound(ScheduleKind::zb_h1, 4, 1, 3, 2) == 3);
  CHECK(stash_bound(ScheduleKind::one_f_one_b, 4, 1, 8, 2) == 2);
}

TEST_CASE("1F1B p=4 m=8: warm-up p-s-1 forwards, one forward one backward, cool-down", "[schedule]") {
  const Schedule s = make_1f1b(4, 8);
  CHECK(compute_order(s, 0) == "F0 F1 F2 F3 BW0 F4 BW1 F5 BW2 F6 BW3 F7 BW4 BW5 BW6 BW7");
  CHECK(compute_order(s, 1) == "F0 F1 F2 BW0 F3 BW1 F4 BW2 F5 BW3 F6 BW4 F7 BW5 BW6 BW7");
  CHECK(compute_order(s, 2) == "F0 F1 BW0 F2 BW1 F3 BW2 F4 BW3 F5 BW4 F6 BW5 F7 BW6 BW7");
  CHECK(compute_order(s, 3) == "F0 BW0 F1 BW1 F2 BW2 F3 BW3 F4 BW4 F5 BW5 F6 BW6 F7 BW7");
  // Stage 0 with its messages: each forward's output is sent at once; in the steady state the
  // gradient receive comes between the send and the backward (Megatron's send_forward_recv_backward).
  std::string stage0;
  for (const auto& in : s.lists[0]) stage0 += (stage0.empty() ? "" : " ") + short_name(in, 1);
  CHECK(stage0 ==
        "F0 SA0>1 F1 SA1>1 F2 SA2>1 F3 SA3>1 RG0<1 BW0 F4 SA4>1 RG1<1 BW1 F5 SA5>1 RG2<1 BW2 F6 SA6>1 RG3<1 BW3 F7 "
        "SA7>1 RG4<1 BW4 RG5<1 BW5 RG6<1 BW6 RG7<1 BW7");
}

TEST_CASE("1F1B p=2 m=3 and GPipe p=2 m=2 with messages, as derived by hand", "[schedule]") {
  // Unit-cost times (F=1, BW=2): both ends of a message sit at the producer's end time.
  CHECK(format_lists(make_1f1b(2, 3)) ==
        "stage 0: F0 SA0>1 F1 SA1>1 RG0<1 BW0 F2 SA2>1 RG1<1 BW1 RG2<1 BW2\n"
        "stage 1: RA0<0 F0 RA1<0 BW0 SG0>0 F1 BW1 RA2<0 SG1>0 F2 BW2 SG2>0\n");
  CHECK(format_lists(make_gpipe(2, 2)) ==
        "stage 0: F0 SA0>1 F1 SA1>1 RG0<1 BW0 RG1<1 BW1\n"
        "stage 1: RA0<0 F0 RA1<0 F1 BW0 SG0>0 BW1 SG1>0\n");
}

TEST_CASE("GPipe with chunks runs chunk by chunk forward and in reverse chunk order backward", "[schedule]") {
  const Schedule s = make_gpipe(2, 2, 2);
  CHECK(compute_order(s, 0) == "F0.0 F1.0 F0.1 F1.1 BW0.1 BW1.1 BW0.0 BW1.0");
  CHECK(compute_order(s, 1) == compute_order(s, 0));
  // Chunk 0 of stage 1 hands over to chunk 1 of stage 0 (wrap-around), and its gradient comes back.
  bool wrap_send = false, wrap_recv = false;
  for (const auto& in : s.lists[1]) wrap_send |= in.op == PipeOp::send_activation && in.chunk == 0 && in.peer == 0;
  for (const auto& in : s.lists[1]) wrap_recv |= in.op == PipeOp::recv_grad && in.chunk == 0 && in.peer == 0;
  CHECK(wrap_send);
  CHECK(wrap_recv);
}

TEST_CASE("interleaved p=2 v=2 m=4 follows Megatron's order", "[schedule]") {
  // Forward k: mb (k/(p v))*p + k%p of chunk (k/p)%v; backward k: same mb of chunk v-1-(k/p)%v.
  // Warm-up: stage 0 2(p-1) + (v-1)p = 4, stage 1 2.
  const Schedule s = make_interleaved_1f1b(2, 2, 4);
  CHECK(compute_order(s, 0) ==
        "F0.0 F1.0 F0.1 F1.1 F2.0 BW0.1 F3.0 BW1.1 F2.1 BW0.0 F3.1 BW1.0 BW2.1 BW3.1 BW2.0 BW3.0");
  CHECK(compute_order(s, 1) ==
        "F0.0 F1.0 F0.1 BW0.1 F1.1 BW1.1 F2.0 BW0.0 F3.0 BW1.0 F2.1 BW2.1 F3.1 BW3.1 BW2.0 BW3.0");
  // The last stage's chunk 0 sends to stage 0's chunk 1; stage 0's chunk 1 sends its gradient back.
  const auto& l1 = s.lists[1];
  CHECK(std::find(l1.begin(), l1.end(), PipeInstr{PipeOp::send_activation, 2, 0, 0}) != l1.end());
  const auto& l0 = s.lists[0];
  CHECK(std::find(l0.begin(), l0.end(), PipeInstr{PipeOp::recv_activation, 2, 1, 1}) != l0.end());
  CHECK(std::find(l0.begin(), l0.end(), PipeInstr{PipeOp::send_grad, 2, 1, 1}) != l0.end());
}

TEST_CASE("ZB-H1 p=3 m=4: stage s keeps s weight passes pending", "[schedule]") {
  const Schedule s = make_zb_h1(3, 4);
  CHECK(compute_order(s, 0) == "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3");
  CHECK(compute_order(s, 1) == "F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3");
  CHECK(compute_order(s, 2) == "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3");
}

TEST_CASE("one stage needs no messages", "[schedule]") {
  for (auto kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::zb_h1}) {
    const Schedule s = make_schedule(kind, 1, 1, 3);
    for (const auto& in : s.lists[0]) CHECK(is_compute(in.op));
  }
  CHECK(compute_order(make_1f1b(1, 3), 0) == "F0 BW0 F1 BW1 F2 BW2");
  CHECK(compute_order(make_zb_h1(1, 2), 0) == "F0 B0 W0 F1 B1 W1");
}

TEST_CASE("bad configurations are refused with the numbers", "[schedule]") {
  using Catch::Matchers::Contains;
  using Catch::Matchers::EndsWith;
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::one_f_one_b, 0, 1, 4), Contains("pp must be >= 1, got 0"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::gpipe, 2, 0, 4), Contains("vpp must be >= 1, got 0"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::zb_h1, 2, 1, 0), Contains("micro-batches must be >= 1, got 0"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::one_f_one_b, 4, 2, 8), Contains("vpp=1), got vpp=2"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::zb_h1, 4, 3, 8), Contains("got vpp=3"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::interleaved, 4, 1, 8), Contains("needs vpp >= 2"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::interleaved, 1, 2, 8), Contains("needs pp >= 2 stages, got pp=1"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::interleaved, 4, 2, 6),
                    Contains("m=6 pp=4 (m % pp = 2); use m=4 or m=8"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::interleaved, 4, 2, 3), EndsWith("m=3 pp=4 (m % pp = 3); use m=4"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::gpipe, 1, 2, 4), Contains("vpp=2 model chunks needs pp >= 2"));
  CHECK_THROWS_WITH(make_schedule(ScheduleKind::gpipe, 4096, 64, 4096), Contains("over 2^24"));
  CHECK_THROWS_AS(make_schedule(ScheduleKind::gpipe, -3, 1, 1), ConfigError);
  CHECK_THROWS_WITH(parse_schedule_kind("pipedream"), Contains("unknown pipeline schedule 'pipedream'"));
  CHECK(parse_schedule_kind("zb-h1") == ScheduleKind::zb_h1);
  CHECK(parse_schedule_kind("1f1b") == ScheduleKind::one_f_one_b);
  CHECK(parse_schedule_kind("interleaved") == ScheduleKind::interleaved);
  CHECK(parse_schedule_kind("gpipe") == ScheduleKind::gpipe);
}

TEST_CASE("insert_p2p refuses lists that cannot complete or already hold messages", "[schedule]") {
  using Catch::Matchers::Contains;
  Schedule s;
  s.kind = ScheduleKind::one_f_one_b;
  s.stages = 2;
  s.micro_batches = 1;
  // Stage 0 runs the backward before its forward ever happens: the compute orders cycle.
  s.lists = {{{PipeOp::backward, 0, 0, -1}, {PipeOp::forward, 0, 0, -1}},
             {{PipeOp::forward, 0, 0, -1}, {PipeOp::backward, 0, 0, -1}}};
  CHECK_THROWS_WITH(insert_p2p(s), Contains("stage 0 never gets past instruction 0 backward(mb=0, chunk=0)"));
  s.lists = {{{PipeOp::forward, 0, 0, -1}, {PipeOp::send_activation, 0, 0, 1}}, {{PipeOp::forward, 0, 0, -1}}};
  CHECK_THROWS_WITH(insert_p2p(s), Contains("compute instructions only, stage 0 instruction 1 is send_activation"));
  s.lists = {{{PipeOp::forward, 2, 0, -1}}, {}};
  CHECK_THROWS_WITH(insert_p2p(s), Contains("out of range (mb < 1, chunk < 1)"));
  s.lists = {{}};
  CHECK_THROWS_WITH(insert_p2p(s), Contains("got 1 lists for 2 stages"));
}

TEST_CASE("message tags agree on both ends and are unique per stage pair", "[schedule]") {
  for (const auto& s : {make_interleaved_1f1b(2, 3, 4), make_interleaved_1f1b(4, 2, 8), make_1f1b(3, 5),
                        make_zb_h1(2, 3), make_gpipe(3, 4, 2)}) {
    INFO(s.label());
    std::map<std::tuple<int, int, int>, int> send_tag;  // (src, dst, tag) -> count
    std::map<std::tuple<int, int, int>, int> recv_tag;
    for (int st = 0; st < s.stages; ++st) {
      for (const auto& in : s.lists[st]) {
        const int tag = message_tag(s, st, in);
        if (is_compute(in.op)) {
          REQUIRE(tag == -1);
          continue;
        }
        REQUIRE(tag >= 0);
        REQUIRE(tag < 2 * s.micro_batches * s.chunks);
        if (is_send(in.op)) ++send_tag[{st, in.peer, tag}];
        else ++recv_tag[{in.peer, st, tag}];
      }
    }
    REQUIRE(send_tag == recv_tag);  // every send's (src, dst, tag) is posted as a receive, once
    for (const auto& [key, n] : send_tag) REQUIRE(n == 1);
  }
}

TEST_CASE("names and descriptions", "[schedule]") {
  CHECK(short_name({PipeOp::forward, 3, 1, -1}, 2) == "F3.1");
  CHECK(short_name({PipeOp::backward, 3, 0, -1}, 1) == "BW3");
  CHECK(short_name({PipeOp::backward_input, 3, 0, -1}, 1) == "B3");
  CHECK(short_name({PipeOp::backward_weight, 3, 0, -1}, 1) == "W3");
  CHECK(short_name({PipeOp::send_activation, 3, 1, 2}, 2) == "SA3.1>2");
  CHECK(short_name({PipeOp::recv_activation, 3, 0, 0}, 1) == "RA3<0");
  CHECK(short_name({PipeOp::send_grad, 3, 0, 0}, 1) == "SG3>0");
  CHECK(short_name({PipeOp::recv_grad, 3, 0, 2}, 1) == "RG3<2");
  CHECK(describe({PipeOp::send_activation, 3, 1, 2}) == "send_activation(mb=3, chunk=1, to stage 2)");
  CHECK(describe({PipeOp::recv_grad, 3, 1, 2}) == "recv_grad(mb=3, chunk=1, from stage 2)");
  CHECK(describe({PipeOp::backward_weight, 0, 0, -1}) == "backward_weight(mb=0, chunk=0)");
  CHECK(make_1f1b(4, 8).label() == "1f1b p=4 v=1 m=8");
}
