// Context-parallel attention blocks (ops/attention.h AttentionBlock) through the Backend seam: the
// zigzag decomposition of a sequence over cp = 1, 2, 4 ranks (CpZigzag), every causal pair of
// (query chunk, key chunk) run as one attention_block_forward from lse = -inf and one
// attention_block_backward from the final out/lse, equals the whole-sequence ops::attention_forward
// / attention_backward (fp64 1e-12, fp32 1e-5; the emulated bf16 backend against fp64 at 3e-2),
// multi-head and grouped-query, with K/V packed by copy_columns or read in place from qkv. Rows
// that see no key of a block keep their bits; bad AttentionBlock fields are ConfigErrors naming
// the field; copy_columns packs and unpacks.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "triax/backend/backend.h"
#include "triax/backend/emulated_backend.h"
#include "triax/core/error.h"
#include "triax/ops/attention.h"
#include "unit/ops/attention_block_testing.h"
#include "unit/ops_testing.h"

using namespace triax;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

using namespace triax::test::cpblock;

const Case kCases[] = {{1, 2, 64, 4, 0, 8}, {2, 2, 64, 4, 0, 8}, {4, 2, 64, 4, 2, 8},
                       {2, 2, 96, 4, 1, 16}, {4, 2, 96, 8, 0, 4}, {2, 2, 80, 6, 2, 8}};

}  // namespace

TEST_CASE("attention blocks over the zigzag chunks equal whole-sequence attention (fp64, fp32)") {
  for (const Case& c : kCases)
    for (bool packed : {true, false}) {
      INFO(name(c, packed));
      const auto qkv = random_vec(size_t(c.B) * c.T * c.W(), -2.0, 2.0), dout = random_vec(size_t(c.B) * c.T * c.C());
      const Whole want = whole(c, qkv, dout);
      auto be64 = make_cpu_backend(DType::f64);
      compare(blocks<double, double>(*be64, c, packed, qkv, dout), want, 1e-12, "fp64");
      // fp32: against the fp32 whole-sequence op on the same fp32 inputs.
      const auto q32 = rounded<float>(qkv), d32 = rounded<float>(dout);
      std::vector<float> qf(q32.begin(), q32.end()), df(d32.begin(), d32.end());
      std::vector<float> of(size_t(c.B) * c.T * c.C()), lf(size_t(c.B) * c.NH * c.T), gf(qf.size());
      ops::attention_forward<float>(of.data(), lf.data(), qf.data(), c.B, c.T, c.C(), c.NH, c.NKV);
      ops::attention_backward<float>(gf.data(), df.data(), qf.data(), lf.data(), c.B, c.T, c.C(), c.NH, c.NKV);
      const Whole want32{cast<double>(of), cast<double>(lf), cast<double>(gf)};
      auto be32 = make_cpu_backend(DType::f32);
      compare(blocks<float, float>(*be32, c, packed, q32, d32), want32, 1e-5, "fp32");
    }
}

TEST_CASE("attention blocks on the emulated bf16 backend follow the fp64 whole-sequence op") {
  for (const Case& c : {kCases[1], kCases[2]}) {
    INFO(name(c, true));
    const auto qkv = rounded<bf16>(random_vec(size_t(c.B) * c.T * c.W(), -2.0, 2.0));
    const auto dout = rounded<bf16>(random_vec(size_t(c.B) * c.T * c.C()));
    auto be = make_emulated_backend(DType::bf16);
    compare(blocks<bf16, float>(*be, c, true, qkv, dout), whole(c, qkv, dout), 3e-2, "emulated bf16");
  }
}

TEST_CASE("attention blocks leave rows that see no key of the block untouched") {
  // 8 queries at positions 10..17 against 8 keys at 13..20: queries 10..12 see none; query i sees
  // keys up to its own position. A second block whose keys all lie after every query changes nothing.
  const int B = 2, NH = 2, NKV = 1, hs = 4, C = NH * hs, W = C + 2 * NKV * hs, n = 8;
  auto be = make_cpu_backend(DType::f64);
  const auto qv = random_vec(size_t(B) * n * W), ov = random_vec(size_t(B) * n * C), lv = random_vec(size_t(B) * NH * n);
  const auto dv = random_vec(size_t(B) * n * W), gv = random_vec(size_t(B) * n * C), kgv = random_vec(size_t(B) * n * W);
  Tensor q = up<double>(*be, qv), out = up<double>(*be, ov), lse = up<double>(*be, lv), dq = up<double>(*be, dv);
  Tensor dout = up<double>(*be, gv), dkv = up<double>(*be, kgv);
  const ops::AttentionBlock a{B, C, NH, NKV, n, 0, n, n, 0, n, W, C, 10, 13};
  be->attention_block_forward(out, lse, q, q, a);
  be->attention_block_backward(dq, dkv, dout, q, q, out, lse, a);
  const auto o2 = down<double>(*be, out), l2 = down<double>(*be, lse), d2 = down<double>(*be, dq);
  const auto k2 = down<double>(*be, dkv);
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < n; ++i) {
      const bool sees = i >= 3;
      for (int h = 0; h < NH; ++h) CHECK((l2[(size_t(b) * NH + h) * n + i] == lv[(size_t(b) * NH + h) * n + i]) != sees);
      for (int k = 0; k < C; ++k) {
        CHECK((o2[(size_t(b) * n + i) * C + k] == ov[(size_t(b) * n + i) * C + k]) != sees);
        CHECK((d2[(size_t(b) * n + i) * W + k] == dv[(size_t(b) * n + i) * W + k]) != sees);
      }
      // Key j (position 13 + j) is seen by queries at positions >= 13 + j, i.e. j <= 4.
      for (int k = C; k < W; ++k) CHECK((k2[(size_t(b) * n + i) * W + k] == kgv[(size_t(b) * n + i) * W + k]) != (i <= 4));
    }
  ops::AttentionBlock later = a;
  later.k_pos0 = 18;  // every key after every query
  be->attention_block_forward(out, lse, q, q, later);
  be->attention_block_backward(dq, dkv, dout, q, q, out, lse, later);
  CHECK(down<double>(*be, out) == o2);
  CHECK(down<double>(*be, lse) == l2);
  CHECK(down<double>(*be, dq) == d2);
  CHECK(down<double>(*be, dkv) == k2);
}

TEST_CASE("attention block fields out of range are ConfigErrors naming the field") {
  const int B = 1, NH = 4, hs = 4, C = NH * hs, T = 8;
  auto be = make_cpu_backend(DType::f32);
  const ops::AttentionBlock ok{B, C, NH, 2, T, 0, T, T, 0, T, C + 4 * hs, C, 0, 0};
  Tensor q = be->zeros(Shape{int64_t{B} * T * (C + 4 * hs)}, DType::f32), out = be->zeros(Shape{B * T * C}, DType::f32);
  Tensor lse = be->zeros(Shape{B * NH * T}, DType::f32);
  struct Bad {
    ops::AttentionBlock a;
    const char* says;
  };
  auto with = [&](auto edit) {
    ops::AttentionBlock a = ok;
    edit(a);
    return a;
  };
  const Bad bad[] = {
      {with([](auto& a) { a.B = 0; }), "B must be positive"},
      {with([](auto& a) { a.C = -4; }), "C must be positive"},
      {with([](auto& a) { a.NH = 0; }), "NH must be positive"},
      {with([](auto& a) { a.NH = 3; }), "3 heads do not divide C=16"},
      {with([](auto& a) { a.NKV = 3; }), "NKV=3"},
      {with([](auto& a) { a.nq = T + 1; }), "query rows [0, 9)"},
      {with([](auto& a) { a.q_row0 = -1; }), "query rows [-1,"},
      {with([](auto& a) { a.kv_row0 = 2; }), "key rows [2, 10)"},
      {with([](auto& a) { a.nk = -1; }), "key rows"},
      {with([](auto& a) { a.kv_col0 = 17; }), "K/V columns [17, 33) outside the key row width 32"},
      {with([](auto& a) { a.kv_width = C; }), "key row width 16"},
  };
  be->attention_block_forward(out, lse, q, q, ok);  // the good block runs
  for (const Bad& b : bad) {
    INFO(b.says);
    CHECK_THROWS_WITH(ops::check_attention_block("op", b.a), Contains(b.says));
    CHECK_THROWS_AS(be->attention_block_forward(out, lse, q, q, b.a), ConfigError);
    CHECK_THROWS_WITH(be->attention_block_backward(q, q, out, q, q, out, lse, b.a),
                      Contains("attention_block_backward") && Contains(b.says));
  }
  // A buffer too small for the block's rows is refused naming it.
  Tensor small = be->zeros(Shape{B * NH * T - 1}, DType::f32);
  CHECK_THROWS_WITH(be->attention_block_forward(out, small, q, q, ok), Contains("lse"));
}

TEST_CASE("copy_columns packs K/V columns out of qkv rows and back") {
  const int rows = 5, W = 12, C = 4, kvw = 8;
  const auto v = random_vec(size_t(rows) * W);
  std::vector<double> packed(size_t(rows) * kvw, 0.0), back(v.size(), 0.0);
  ops::copy_columns(packed.data(), v.data(), sizeof(double), rows, kvw, 0, W, C, kvw);
  ops::copy_columns(back.data(), packed.data(), sizeof(double), rows, W, C, kvw, 0, kvw);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < W; ++k) {
      CHECK(back[size_t(r) * W + k] == (k < C ? 0.0 : v[size_t(r) * W + k]));
      if (k >= C) CHECK(packed[size_t(r) * kvw + k - C] == v[size_t(r) * W + k]);
    }
  CHECK_THROWS_WITH(ops::copy_columns(packed.data(), v.data(), 8, rows, kvw, 1, W, C, kvw), Contains("copy_columns"));
  CHECK_THROWS_WITH(ops::copy_columns(packed.data(), v.data(), 0, rows, kvw, 0, W, C, kvw), Contains("elem_bytes"));
  auto be = make_cpu_backend(DType::f32);
  Tensor src = up<float>(*be, v), dst = be->zeros(Shape{rows * kvw}, DType::f32);
  be->copy_columns(dst, src, rows, kvw, 0, W, C, kvw);
  require_close(down<float>(*be, dst), rounded<float>(packed), 0, 0, "backend copy_columns");
  CHECK_THROWS_WITH(be->copy_columns(be->zeros(Shape{rows * kvw}, DType::f64), src, rows, kvw, 0, W, C, kvw),
                    Contains("differ in type"));
  CHECK_THROWS_WITH(be->copy_columns(dst, src, rows, kvw, 0, W, C + 1, kvw), Contains("copy_columns"));
}
