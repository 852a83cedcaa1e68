// The checker rejects broken schedules, naming the stage, the instruction and what was expected:
// a missing receive, orders that deadlock (under every model, or only when sends rendezvous),
// a forward without backward, activations over the bound, and every structural mistake.
#include <catch2/catch.hpp>

#include <algorithm>

#include "triax/core/error.h"
#include "triax/pipeline/schedule.h"
#include "triax/pipeline/schedule_check.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {
PipeInstr F(int mb, int c = 0) { return {PipeOp::forward, mb, c, -1}; }
PipeInstr BW(int mb, int c = 0) { return {PipeOp::backward, mb, c, -1}; }
PipeInstr B(int mb, int c = 0) { return {PipeOp::backward_input, mb, c, -1}; }
PipeInstr W(int mb, int c = 0) { return {PipeOp::backward_weight, mb, c, -1}; }
PipeInstr SA(int mb, int peer, int c = 0) { return {PipeOp::send_activation, mb, c, peer}; }
PipeInstr RA(int mb, int peer, int c = 0) { return {PipeOp::recv_activation, mb, c, peer}; }
PipeInstr SG(int mb, int peer, int c = 0) { return {PipeOp::send_grad, mb, c, peer}; }
PipeInstr RG(int mb, int peer, int c = 0) { return {PipeOp::recv_grad, mb, c, peer}; }

// A two-stage, two-micro-batch schedule written by hand (bounds: GPipe's, so only order matters).
Schedule two_stages(std::vector<PipeInstr> s0, std::vector<PipeInstr> s1) {
  Schedule s;
  s.kind = ScheduleKind::gpipe;
  s.stages = 2;
  s.micro_batches = 2;
  s.lists = {std::move(s0), std::move(s1)};
  s.activation_bound = {2, 2};
  s.stash_bound = {2, 2};
  return s;
}

void erase(std::vector<PipeInstr>& l, const PipeInstr& in) {
  auto it = std::find(l.begin(), l.end(), in);
  REQUIRE(it != l.end());
  l.erase(it);
}

size_t index_of(const std::vector<PipeInstr>& l, const PipeInstr& in) {
  return static_cast<size_t>(std::find(l.begin(), l.end(), in) - l.begin());
}
}  // namespace

TEST_CASE("a hand-written valid schedule passes and its report adds up", "[schedule][check]") {
  const auto s = two_stages({F(0), SA(0, 1), F(1), SA(1, 1), RG(0, 1), BW(0), RG(1, 1), BW(1)},
                            {RA(0, 0), F(0), RA(1, 0), F(1), BW(0), SG(0, 0), BW(1), SG(1, 0)});
  const auto rep = check_schedule(s);
  CHECK(rep.messages == 4);
  CHECK(rep.stages[0].instructions == 8);
  CHECK(rep.stages[0].computes == 4);
  CHECK(rep.stages[0].sends == 2);
  CHECK(rep.stages[0].recvs == 2);
  CHECK(rep.stages[1].peak_activations == 2);
  CHECK(rep.summary(s) ==
        "gpipe p=2 v=1 m=2: ok; 4 messages matched; deadlock-free under eager, rendezvous, blocking; peak "
        "activations/bound per stage: 2/2 2/2; peak awaiting W/bound: 2/2 2/2");
}

TEST_CASE("a missing receive is named by stage and instruction", "[schedule][check]") {
  Schedule s = make_1f1b(4, 8);
  erase(s.lists[1], RG(2, 2));
  const size_t at = index_of(s.lists[1], BW(2));
  CHECK_THROWS_WITH(check_schedule(s),
                    Contains(fmt::format("1f1b p=4 v=1 m=8: stage 1, instruction {} backward(mb=2, chunk=0): its "
                                         "output gradient was never received: expected recv_grad(mb=2, chunk=0, from "
                                         "stage 2) earlier in the list", at)));
  Schedule t = make_1f1b(4, 8);
  erase(t.lists[3], RA(5, 2));
  CHECK_THROWS_WITH(check_schedule(t), Contains("stage 3, instruction") &&
                                           Contains("forward(mb=5, chunk=0): its input was never received"));
}

TEST_CASE("an order that deadlocks with any P2P model is rejected", "[schedule][check]") {
  // Stage 1 insists on forwarding micro-batch 1 first, but stage 0 sends it only after backward 0,
  // which needs stage 1's gradient of micro-batch 0.
  const auto s = two_stages({F(0), SA(0, 1), RG(0, 1), BW(0), F(1), SA(1, 1), RG(1, 1), BW(1)},
                            {RA(0, 0), RA(1, 0), F(1), F(0), BW(0), SG(0, 0), BW(1), SG(1, 0)});
  CHECK_THROWS_WITH(check_schedule(s),
                    Contains("deadlock under the eager P2P model: stage 0, instruction 3 backward(mb=0, chunk=0) "
                             "waits for stage 1 to issue its instruction 5 send_grad(mb=0, chunk=0, to stage 0) "
                             "(stage 1 is stuck at its instruction 2 forward(mb=1, chunk=0)); stage 1, instruction 2 "
                             "forward(mb=1, chunk=0) waits for stage 0 to issue its instruction 5"));
}

TEST_CASE("send-before-receive on both sides deadlocks only when sends rendezvous", "[schedule][check]") {
  // Stage 0 sends activation 1 before posting gradient 0's receive; stage 1 sends gradient 0
  // before posting activation 1's receive. Buffered sends get through, rendezvous sends do not.
  const auto s = two_stages({F(0), SA(0, 1), F(1), SA(1, 1), RG(0, 1), BW(0), RG(1, 1), BW(1)},
                            {RA(0, 0), F(0), BW(0), SG(0, 0), RA(1, 0), F(1), BW(1), SG(1, 0)});
  CheckOptions eager;
  eager.models = {P2pModel::eager};
  CHECK(check_schedule(s, eager).models == std::vector<P2pModel>{P2pModel::eager});
  CHECK_THROWS_WITH(check_schedule(s), Contains("deadlock under the rendezvous P2P model: stage 0, instruction 3 "
                                                "send_activation(mb=1, chunk=0, to stage 1) waits for stage 1 to post "
                                                "its instruction 4 recv_activation(mb=1, chunk=0, from stage 0)"));
  CheckOptions blocking;
  blocking.models = {P2pModel::blocking};
  CHECK_THROWS_WITH(check_schedule(s, blocking), Contains("deadlock under the blocking P2P model") &&
                                                     Contains("waits for stage 1 to reach its instruction 4"));
}

TEST_CASE("a receive posted late deadlocks only the fully blocking model", "[schedule][check]") {
  // Stage 1 posts (and, if blocking, waits in) the receive of activation 1 before sending gradient
  // 0, which stage 0 needs before it sends activation 1. Posted receives do not block, so eager and
  // rendezvous complete; a blocking receive does not.
  const auto s = two_stages({F(0), SA(0, 1), RG(0, 1), BW(0), F(1), SA(1, 1), RG(1, 1), BW(1)},
                            {RA(0, 0), F(0), BW(0), RA(1, 0), SG(0, 0), F(1), BW(1), SG(1, 0)});
  CheckOptions posted;
  posted.models = {P2pModel::eager, P2pModel::rendezvous};
  CHECK(check_schedule(s, posted).models.size() == 2);
  CHECK_THROWS_WITH(check_schedule(s), Contains("deadlock under the blocking P2P model: stage 0, instruction 2 "
                                                "recv_grad(mb=0, chunk=0, from stage 1) waits for stage 1 to reach its "
                                                "instruction 4 send_grad(mb=0, chunk=0, to stage 0) (stage 1 is stuck "
                                                "at its instruction 3 recv_activation(mb=1, chunk=0, from stage 0))"));
}

TEST_CASE("a forward without backward, and B without W, are rejected", "[schedule][check]") {
  Schedule s = make_1f1b(4, 8);
  erase(s.lists[2], BW(3));
  erase(s.lists[2], SG(3, 1));
  CHECK_THROWS_WITH(check_schedule(s), Contains(fmt::format("stage 2, instruction {} forward(mb=3, chunk=0) has no "
                                                            "backward", index_of(s.lists[2], F(3)))));
  Schedule z = make_zb_h1(4, 8);
  erase(z.lists[1], W(6));
  CHECK_THROWS_WITH(check_schedule(z), Contains(fmt::format("stage 1, instruction {} backward_input(mb=6, chunk=0) has "
                                                            "no backward_weight", index_of(z.lists[1], B(6)))));
  Schedule g = make_gpipe(3, 2);
  erase(g.lists[1], F(1));
  erase(g.lists[1], SA(1, 2));
  CHECK_THROWS_WITH(check_schedule(g), Contains("backward(mb=1, chunk=0): comes before the forward(mb=1, chunk=0)"));
  Schedule h = make_gpipe(3, 2);
  erase(h.lists[1], F(1));
  erase(h.lists[1], SA(1, 2));
  erase(h.lists[1], BW(1));
  erase(h.lists[1], SG(1, 0));
  CHECK_THROWS_WITH(check_schedule(h), Contains("stage 1 never runs forward(mb=1, chunk=0)"));
}

TEST_CASE("stored activations over the documented bound are rejected", "[schedule][check]") {
  // GPipe's lists declared as 1F1B: stage 0's fifth forward holds 5 > p - 0 = 4 micro-batches.
  Schedule s = make_gpipe(4, 8);
  for (int st = 0; st < 4; ++st) {
    s.activation_bound[st] = activation_bound(ScheduleKind::one_f_one_b, 4, 1, 8, st);
    s.stash_bound[st] = stash_bound(ScheduleKind::one_f_one_b, 4, 1, 8, st);
  }
  CHECK_THROWS_WITH(check_schedule(s), Contains("stage 0, instruction 8 forward(mb=4, chunk=0): 5 micro-batch "
                                                "activations stored (forward done, backward not yet) exceed the "
                                                "schedule's bound 4 for stage 0"));
  CheckOptions no_bounds;
  no_bounds.check_bounds = false;
  CHECK(check_schedule(s, no_bounds).stages[0].peak_activations == 8);
  // ZB-H1 with W held back one step longer than the stash bound allows on stage 3.
  Schedule z = make_zb_h1(4, 8);
  z.stash_bound[3] = 3;
  CHECK_THROWS_WITH(check_schedule(z), Contains("micro-batches awaiting their weight gradient (forward done, W not "
                                                "yet) exceed the schedule's stash bound 3 for stage 3"));
  z.stash_bound.pop_back();
  CHECK_THROWS_WITH(check_schedule(z), Contains("4 activation bounds and 3 stash bounds for 4 stages"));
}

TEST_CASE("structural mistakes are named", "[schedule][check]") {
  const auto good = [] {
    return two_stages({F(0), SA(0, 1), F(1), SA(1, 1), RG(0, 1), BW(0), RG(1, 1), BW(1)},
                      {RA(0, 0), F(0), RA(1, 0), F(1), BW(0), SG(0, 0), BW(1), SG(1, 0)});
  };
  {
    auto s = good();
    s.lists[0][2] = F(2);
    CHECK_THROWS_WITH(check_schedule(s), Contains("stage 0, instruction 2 forward(mb=2, chunk=0) is out of range: "
                                                  "expected 0 <= mb < 2 and 0 <= chunk < 1"));
  }
  {
    auto s = good();
    s.lists[0][2] = F(1, 1);
    CHECK_THROWS_WITH(check_schedule(s), Contains("out of range"));
  }
  {
    auto s = good();
    s.lists.pop_back();
    CHECK_THROWS_WITH(check_schedule(s), Contains("1 instruction lists for 2 stages"));
  }
  {
    auto s = good();
    s.micro_batches = 0;
    CHECK_THROWS_WITH(check_schedule(s), Contains("must all be >= 1"));
  }
  {
    auto s = good();
    s.lists[1][1].peer = 0;
    CHECK_THROWS_WITH(check_schedule(s), Contains("stage 1, instruction 1 forward(mb=0, chunk=0) is a compute "
                                                  "instruction but names peer 0"));
  }
  {
    auto s = good();
    s.lists[0][1].peer = 0;
    CHECK_THROWS_WITH(check_schedule(s), Contains("stage 0, instruction 1 send_activation(mb=0, chunk=0, to stage 0) "
                                                  "names peer 0, expected stage 1 (the next virtual stage, chunk 0 "
                                                  "there)"));
  }
  {
    auto s = good();
    s.lists[1].push_back(SA(1, 0));
    CHECK_THROWS_WITH(check_schedule(s), Contains("stage 1 chunk 0 is the last virtual stage: there is no next"));
  }
  {
    auto s = good();
    s.lists[0].insert(s.lists[0].begin(), RA(0, 1));
    CHECK_THROWS_WITH(check_schedule(s), Contains("is the first virtual stage: there is no previous stage"));
  }
  {
    auto s = good();
    s.lists[0].insert(s.lists[0].begin() + 2, F(0));
    CHECK_THROWS_WITH(check_schedule(s), Contains("stage 0, instruction 2 forward(mb=0, chunk=0) appears a second "
                                                  "time (first at instruction 0)"));
  }
  {
    auto s = good();
    std::swap(s.lists[0][0], s.lists[0][1]);
    CHECK_THROWS_WITH(check_schedule(s), Contains("stage 0, instruction 0 send_activation(mb=0, chunk=0, to stage 1): "
                                                  "comes before forward(mb=0, chunk=0), which produces what it sends"));
  }
  {
    auto s = good();
    std::swap(s.lists[1][4], s.lists[1][5]);
    CHECK_THROWS_WITH(check_schedule(s), Contains("stage 1, instruction 4 send_grad(mb=0, chunk=0, to stage 0): comes "
                                                  "before the backward of (mb=0, chunk=0)"));
  }
  {
    auto s = good();
    erase(s.lists[0], SA(1, 1));
    CHECK_THROWS_WITH(check_schedule(s), Contains("forward(mb=1, chunk=0) never sends its output: expected "
                                                  "send_activation(mb=1, chunk=0, to stage 1) after it"));
  }
  {
    auto s = good();
    erase(s.lists[1], SG(1, 0));
    CHECK_THROWS_WITH(check_schedule(s), Contains("stage 1, instruction 6 backward(mb=1, chunk=0) never sends its "
                                                  "input gradient: expected send_grad(mb=1, chunk=0, to stage 0)"));
  }
  {
    auto s = good();
    s.lists[1][4] = B(0);
    s.lists[1].insert(s.lists[1].begin() + 5, BW(0));
    CHECK_THROWS_WITH(check_schedule(s), Contains("(mb=0, chunk=0) already has a backward_input at instruction 4: "
                                                  "use either one full backward or B then W"));
  }
  {
    auto s = good();
    s.lists[1][4] = W(0);
    CHECK_THROWS_WITH(check_schedule(s), Contains("stage 1, instruction 4 backward_weight(mb=0, chunk=0): comes before "
                                                  "backward_input(mb=0, chunk=0)"));
  }
  {
    auto s = good();
    s.lists[1].push_back(W(1));
    CHECK_THROWS_WITH(check_schedule(s), Contains("(mb=1, chunk=0) already had a full backward at instruction 6"));
  }
  {
    auto s = good();
    s.lists[0][0].op = static_cast<PipeOp>(42);
    CHECK_THROWS_WITH(check_schedule(s), Contains("stage 0, instruction 0 has an unknown op 42"));
  }
}

TEST_CASE("receives posted in a different order than the channel's sends are flagged", "[schedule][check]") {
  // Deadlock-free (stage 1 posts both receives before either forward) but the channel 0 -> 1
  // delivers mb 0 then mb 1 while stage 1 posted mb 1 first.
  const auto s = two_stages({F(0), SA(0, 1), F(1), SA(1, 1), RG(0, 1), BW(0), RG(1, 1), BW(1)},
                            {RA(1, 0), RA(0, 0), F(0), F(1), BW(0), SG(0, 0), BW(1), SG(1, 0)});
  CHECK_THROWS_WITH(check_schedule(s), Contains("channel stage 0 -> stage 1 (activations) is out of order: send #0 is "
                                                "stage 0, instruction 1 send_activation(mb=0, chunk=0, to stage 1) but "
                                                "receive #0 posted is stage 1, instruction 0 recv_activation(mb=1"));
  // Matched by (mb, chunk) tags instead, it completes with posted receives; a blocking receive of
  // mb 1 first would wait for ever.
  CheckOptions by_tag;
  by_tag.fifo_channels = false;
  by_tag.models = {P2pModel::eager, P2pModel::rendezvous};
  CHECK(check_schedule(s, by_tag).messages == 4);
}

TEST_CASE("interleaved wrap-around messages are checked like any other", "[schedule][check]") {
  // Stage 0's chunk 1 receives from stage 1's chunk 0; removing that receive must be caught.
  Schedule s = make_interleaved_1f1b(2, 2, 2);
  erase(s.lists[0], RA(1, 1, 1));
  CHECK_THROWS_WITH(check_schedule(s), Contains("forward(mb=1, chunk=1): its input was never received: expected "
                                                "recv_activation(mb=1, chunk=1, from stage 1)"));
  Schedule t = make_interleaved_1f1b(2, 2, 2);
  for (auto& in : t.lists[1])
    if (in.op == PipeOp::recv_grad && in.chunk == 0) in.peer = 1;
  CHECK_THROWS_WITH(check_schedule(t), Contains("names peer 1, expected stage 0 (the next virtual stage, chunk 1 there)"));
}
