// The host-only half of cuda/cudnn_attention.h, on the CPU (built with or without CUDA): the
// strided (B, NH, T, HS) views cuDNN is given of qkv, out and lse, checked element by element
// against the layout ops/attention.h documents and shown to tile each buffer exactly once (odd
// sizes); the graph-cache key; TRIAX_ATTENTION's parsing and the decision it drives.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "triax/core/error.h"
#include "triax/cuda/cudnn_attention.h"
#include "support/scoped_env.h"

using namespace triax;
using namespace triax::cuda;
using Catch::Matchers::Contains;

namespace {

int64_t element(const AttentionView& v, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  return v.offset + i0 * v.stride[0] + i1 * v.stride[1] + i2 * v.stride[2] + i3 * v.stride[3];
}

struct Shape {
  int B, T, NH, HS;
};

using triax::testing::ScopedEnv;

}  // namespace

TEST_CASE("cudnn attention views address qkv, out and lse as ops::attention lays them out", "[cudnn][layout]") {
  for (const Shape sh : {Shape{2, 7, 3, 8}, Shape{1, 1, 1, 64}, Shape{3, 13, 5, 16}, Shape{2, 200, 12, 64}}) {
    const auto [B, T, NH, HS] = sh;
    INFO("B=" << B << " T=" << T << " NH=" << NH << " HS=" << HS);
    const int64_t C = int64_t{NH} * HS;
    const AttentionTensor parts[3] = {AttentionTensor::q, AttentionTensor::k, AttentionTensor::v};
    std::vector<int> qkv_hits(static_cast<size_t>(B) * T * 3 * C, 0), out_hits(static_cast<size_t>(B) * T * C, 0);
    std::vector<int> lse_hits(static_cast<size_t>(B) * NH * T, 0);
    const AttentionView out = cudnn_attention_view(AttentionTensor::out, B, T, NH, HS);
    const AttentionView lse = cudnn_attention_view(AttentionTensor::lse, B, T, NH, HS);
    CHECK(lse.dim[3] == 1);
    for (int p = 0; p < 3; ++p) {
      const AttentionView v = cudnn_attention_view(parts[p], B, T, NH, HS);
      REQUIRE(v.dim[0] == B);
      REQUIRE(v.dim[1] == NH);
      REQUIRE(v.dim[2] == T);
      REQUIRE(v.dim[3] == HS);
      for (int b = 0; b < B; ++b)
        for (int h = 0; h < NH; ++h)
          for (int t = 0; t < T; ++t)
            for (int d = 0; d < HS; ++d) {
              // ops/attention.h: token (b, t) holds [q | k | v], head h in [h*HS, (h+1)*HS) of each part.
              const int64_t want = (int64_t{b} * T + t) * 3 * C + p * C + int64_t{h} * HS + d;
              REQUIRE(element(v, b, h, t, d) == want);
              ++qkv_hits[static_cast<size_t>(want)];
              if (p == 0) {
                const int64_t o = (int64_t{b} * T + t) * C + int64_t{h} * HS + d;
                REQUIRE(element(out, b, h, t, d) == o);
                ++out_hits[static_cast<size_t>(o)];
              }
            }
    }
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < NH; ++h)
        for (int t = 0; t < T; ++t) {
          const int64_t want = (int64_t{b} * NH + h) * T + t;  // lse (B, NH, T)
          REQUIRE(element(lse, b, h, t, 0) == want);
          ++lse_hits[static_cast<size_t>(want)];
        }
    // Every element of each buffer is seen exactly once: dQ, dK and dV together write all of dqkv.
    for (const auto* hits : {&qkv_hits, &out_hits, &lse_hits})
      for (int n : *hits) REQUIRE(n == 1);
  }
}

TEST_CASE("cudnn attention views address grouped-query qkv: K/V with NKV heads inside the packed row",
          "[cudnn][layout]") {
  struct Gqa {
    int B, T, NH, NKV, HS;
  };
  for (const Gqa g : {Gqa{2, 7, 4, 2, 8}, Gqa{1, 5, 6, 1, 16}, Gqa{3, 13, 8, 4, 8}, Gqa{2, 3, 3, 3, 8}}) {
    INFO("B=" << g.B << " T=" << g.T << " NH=" << g.NH << " NKV=" << g.NKV << " HS=" << g.HS);
    const int64_t C = int64_t{g.NH} * g.HS, W = C + 2 * int64_t{g.NKV} * g.HS;
    std::vector<int> hits(static_cast<size_t>(g.B) * g.T * W, 0);
    const AttentionTensor parts[3] = {AttentionTensor::q, AttentionTensor::k, AttentionTensor::v};
    for (int p = 0; p < 3; ++p) {
      const AttentionView v = cudnn_attention_view(parts[p], g.B, g.T, g.NH, g.HS, g.NKV);
      const int heads = p == 0 ? g.NH : g.NKV;
      REQUIRE(v.dim[1] == heads);
      for (int b = 0; b < g.B; ++b)
        for (int h = 0; h < heads; ++h)
          for (int t = 0; t < g.T; ++t)
            for (int d = 0; d < g.HS; ++d) {
              // backend.h: token (b, t) holds [NH q heads | NKV k heads | NKV v heads] of HS each.
              const int64_t head0 = p == 0 ? 0 : (p == 1 ? g.NH : g.NH + g.NKV);
              const int64_t want = (int64_t{b} * g.T + t) * W + (head0 + h) * g.HS + d;
              REQUIRE(element(v, b, h, t, d) == want);
              ++hits[static_cast<size_t>(want)];
            }
    }
    for (int n : hits) REQUIRE(n == 1);
    // NKV = NH is the multi-head view, NKV = 0 too.
    for (const AttentionTensor t : parts) {
      const AttentionView a = cudnn_attention_view(t, g.B, g.T, g.NH, g.HS, g.NH);
      const AttentionView b = cudnn_attention_view(t, g.B, g.T, g.NH, g.HS);
      CHECK(a.offset == b.offset);
      for (int k = 0; k < 4; ++k) CHECK((a.dim[k] == b.dim[k] && a.stride[k] == b.stride[k]));
    }
  }
  CHECK(cudnn_attention_key_kv(8, 8) == 0);
  CHECK(cudnn_attention_key_kv(8, 0) == 0);
  CHECK(cudnn_attention_key_kv(8, 2) == 2);
}

TEST_CASE("cudnn attention lse view is cuDNN's packed (B, NH, T, 1) stats layout", "[cudnn][layout]") {
  const AttentionView v = cudnn_attention_view(AttentionTensor::lse, 3, 11, 5, 64);
  // Packed BHSD with D = 1: stride[3] = 1, stride[2] = D, stride[1] = T*D, stride[0] = NH*T*D.
  CHECK(v.stride[3] == 1);
  CHECK(v.stride[2] == v.dim[3]);
  CHECK(v.stride[1] == v.dim[2] * v.dim[3]);
  CHECK(v.stride[0] == v.dim[1] * v.dim[2] * v.dim[3]);
  CHECK(v.offset == 0);
}

TEST_CASE("cudnn attention graph keys tell every field apart", "[cudnn][key]") {
  const CudnnAttentionKey base{DType::bf16, 4, 1024, 12, 64, false};
  std::vector<CudnnAttentionKey> keys{base};
  auto vary = [&](auto f) {
    CudnnAttentionKey k = base;
    f(k);
    keys.push_back(k);
  };
  vary([](CudnnAttentionKey& k) { k.dtype = DType::f16; });
  vary([](CudnnAttentionKey& k) { k.B = 5; });
  vary([](CudnnAttentionKey& k) { k.T = 1023; });
  vary([](CudnnAttentionKey& k) { k.NH = 6; });
  vary([](CudnnAttentionKey& k) { k.HS = 128; });
  vary([](CudnnAttentionKey& k) { k.NKV = 3; });
  vary([](CudnnAttentionKey& k) { k.backward = true; });
  std::map<CudnnAttentionKey, int> m;
  for (size_t i = 0; i < keys.size(); ++i) m[keys[i]] = static_cast<int>(i);
  CHECK(m.size() == keys.size());
  for (size_t i = 0; i < keys.size(); ++i) CHECK(m.at(keys[i]) == static_cast<int>(i));
  CHECK(CudnnAttentionKey(base) == base);
  CHECK(to_string(base) == "forward bfloat16 B=4 T=1024 NH=12 HS=64");
  CHECK(to_string(keys[keys.size() - 2]) == "forward bfloat16 B=4 T=1024 NH=12 HS=64 NKV=3");
  CHECK_THAT(to_string(keys.back()), Contains("backward"));
}

TEST_CASE("TRIAX_ATTENTION parses auto, cudnn and kernel, and nothing else", "[cudnn][env]") {
  CHECK(parse_attention_impl("TRIAX_ATTENTION", "auto") == AttentionImpl::automatic);
  CHECK(parse_attention_impl("TRIAX_ATTENTION", "cudnn") == AttentionImpl::cudnn);
  CHECK(parse_attention_impl("TRIAX_ATTENTION", "kernel") == AttentionImpl::kernel);
  CHECK_THROWS_WITH(parse_attention_impl("TRIAX_ATTENTION", "cuDNN"), Contains("TRIAX_ATTENTION") && Contains("kernel"));
  CHECK_THROWS_AS(parse_attention_impl("TRIAX_ATTENTION", ""), ConfigError);
  {
    ScopedEnv e("TRIAX_ATTENTION", std::nullopt);
    CHECK(attention_impl_from_env() == AttentionImpl::automatic);
  }
  {
    ScopedEnv e("TRIAX_ATTENTION", "kernel");
    CHECK(attention_impl_from_env() == AttentionImpl::kernel);
  }
  {
    ScopedEnv e("TRIAX_ATTENTION", "flash");
    CHECK_THROWS_AS(attention_impl_from_env(), ConfigError);
  }
}

TEST_CASE("the attention choice: kernels for fp32 and under kernel, cuDNN where it can, errors only when forced",
          "[cudnn][env]") {
  const CudnnAttentionKey shape{DType::bf16, 2, 100, 4, 64, false};
  int probes = 0;
  auto yes = [&]() -> std::optional<std::string> {
    ++probes;
    return std::nullopt;
  };
  auto no = [&]() -> std::optional<std::string> {
    ++probes;
    return std::string("GRAPH_NOT_SUPPORTED: head size");
  };
  // kernel, and fp32 under any choice: the kernels, without asking cuDNN.
  CHECK_FALSE(choose_cudnn_attention(AttentionImpl::kernel, DType::bf16, shape, yes));
  CHECK_FALSE(choose_cudnn_attention(AttentionImpl::automatic, DType::f32, shape, yes));
  CHECK_FALSE(choose_cudnn_attention(AttentionImpl::cudnn, DType::f32, shape, yes));
  CHECK(probes == 0);
  // auto: cuDNN when it can, the kernels when it cannot.
  CHECK(choose_cudnn_attention(AttentionImpl::automatic, DType::bf16, shape, yes));
  CHECK(choose_cudnn_attention(AttentionImpl::automatic, DType::f16, shape, yes));
  CHECK_FALSE(choose_cudnn_attention(AttentionImpl::automatic, DType::bf16, shape, no));
  // cudnn: cuDNN, or a ConfigError that names the shape and cuDNN's reason.
  CHECK(choose_cudnn_attention(AttentionImpl::cudnn, DType::f16, shape, yes));
  CHECK_THROWS_WITH(choose_cudnn_attention(AttentionImpl::cudnn, DType::bf16, shape, no),
                    Contains("TRIAX_ATTENTION=cudnn") && Contains("B=2 T=100 NH=4 HS=64") && Contains("head size"));
  CHECK(probes == 5);
}
