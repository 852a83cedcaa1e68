// Tensor, Shape, Storage and the allocator registry: views share memory and index the right
// elements; every misuse throws ConfigError naming the problem.
#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>

#include "triax/tensor/tensor.h"

using triax::ConfigError;
using triax::Device;
using triax::DType;
using triax::Shape;
using triax::Tensor;
using Catch::Matchers::Contains;

namespace {

// A (2, 3, 4) float tensor holding 0, 1, ..., 23: element (i, j, k) = 12 i + 4 j + k.
Tensor iota234() {
  Tensor t = Tensor::empty({2, 3, 4});
  float* p = t.data<float>();
  std::iota(p, p + 24, 0.0f);
  return t;
}

}  // namespace

TEST_CASE("shape basics and limits") {
  Shape s{2, 3, 4};
  CHECK(s.ndim() == 3);
  CHECK(s.numel() == 24);
  CHECK(s.str() == "(2, 3, 4)");
  CHECK(s.contiguous_strides()[0] == 12);
  CHECK(s.contiguous_strides()[1] == 4);
  CHECK(s.contiguous_strides()[2] == 1);
  CHECK(Shape{}.numel() == 1);
  CHECK(Shape{}.str() == "()");
  CHECK(Shape{1, 2, 3, 4, 5}.numel() == 120);
  CHECK_THROWS_WITH(Shape({1, 2, 3, 4, 5, 6}), Contains("6 dimensions") && Contains("at most 5"));
  CHECK_THROWS_WITH(Shape({2, -1}), Contains("-1") && Contains("negative"));
  CHECK_THROWS_AS(s.at(3), ConfigError);
  CHECK_THROWS_AS(s.at(-1), ConfigError);
  CHECK(s.with(1, 7) == Shape{2, 7, 4});
}

TEST_CASE("cpu storage is 64-byte aligned and tensors own it") {
  for (int64_t n : {1, 3, 17, 1000}) {
    Tensor t = Tensor::empty({n}, DType::f32);
    CHECK(reinterpret_cast<uintptr_t>(t.data<float>()) % 64 == 0);
    CHECK(t.nbytes() == static_cast<size_t>(n) * 4);
    CHECK(t.storage()->owned());
    CHECK(t.device() == Device::cpu());
  }
  Tensor z = Tensor::zeros({5, 7}, DType::f64);
  for (int i = 0; i < 35; ++i) CHECK(z.data<double>()[i] == 0.0);
  Tensor e = Tensor::empty({0, 4});
  CHECK(e.numel() == 0);
  CHECK(e.nbytes() == 0);
}

TEST_CASE("typed access checks the dtype") {
  Tensor t = Tensor::empty({4}, DType::i32);
  CHECK_NOTHROW(t.data<int32_t>());
  CHECK_THROWS_WITH(t.data<float>(), Contains("data<float32>()") && Contains("int32") && Contains("mismatch"));
  CHECK_THROWS_AS(t.data<double>(), ConfigError);
  Tensor undefined;
  CHECK_FALSE(undefined.defined());
  CHECK_THROWS_WITH(undefined.data<float>(), Contains("undefined"));
}

TEST_CASE("slice along dim 0 shares storage and stays contiguous") {
  Tensor t = iota234();
  Tensor s = t.slice(1, 2);
  CHECK(s.shape() == Shape{1, 3, 4});
  CHECK(s.is_contiguous());
  CHECK(s.storage() == t.storage());
  CHECK(s.data<float>()[0] == 12.0f);
  s.data<float>()[5] = -1.0f;  // (1, 1, 1) of t
  CHECK(t.data<float>()[12 + 4 + 1] == -1.0f);
  CHECK_THROWS_WITH(t.slice(1, 3), Contains("[1, 3)") && Contains("[0, 2)"));
  CHECK_THROWS_AS(t.slice(1, 1), ConfigError);
  CHECK_THROWS_AS(t.slice(-1, 1), ConfigError);
}

TEST_CASE("narrow along an inner dim is a strided view; copy makes a dense shard") {
  Tensor t = iota234();
  Tensor n = t.narrow(2, 1, 2);  // columns 1..2 of the last dim
  CHECK(n.shape() == Shape{2, 3, 2});
  CHECK_FALSE(n.is_contiguous());
  CHECK(n.stride(0) == 12);
  CHECK(n.stride(2) == 1);
  CHECK_THROWS_WITH(n.data<float>(), Contains("strided") && Contains("contiguous()"));
  CHECK_THROWS_WITH(n.reshape({12}), Contains("strided"));
  Tensor d = n.contiguous();
  REQUIRE(d.is_contiguous());
  CHECK(d.storage() != t.storage());
  const float* p = d.data<float>();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) CHECK(p[(i * 3 + j) * 2 + k] == static_cast<float>(12 * i + 4 * j + k + 1));
  // A middle-dim narrow with a single column (inner stride of the last dim is still 1).
  Tensor m = t.narrow(1, 2, 1).contiguous();
  CHECK(m.shape() == Shape{2, 1, 4});
  CHECK(m.data<float>()[4] == 12.0f + 8.0f);
  // Narrow of the leading dimension is contiguous.
  CHECK(t.narrow(0, 1, 1).is_contiguous());
  CHECK_THROWS_WITH(t.narrow(3, 0, 1), Contains("dimension 3"));
  CHECK_THROWS_WITH(t.narrow(2, 3, 2), Contains("[3, 5)"));
  CHECK_THROWS_AS(t.narrow(2, 0, 0), ConfigError);
}

TEST_CASE("copy_from writes a shard back into a strided view") {
  Tensor t = iota234();
  Tensor shard = Tensor::empty({2, 3, 2});
  float* s = shard.data<float>();
  for (int i = 0; i < 12; ++i) s[i] = 100.0f + i;
  Tensor view = t.narrow(2, 2, 2);
  view.copy_from(shard);
  const float* p = t.data<float>();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) {
        const float want = k < 2 ? static_cast<float>(12 * i + 4 * j + k) : 100.0f + (i * 3 + j) * 2 + (k - 2);
        CHECK(p[12 * i + 4 * j + k] == want);
      }
  CHECK_THROWS_WITH(view.copy_from(Tensor::empty({2, 3, 3})), Contains("(2, 3, 3)") && Contains("must match"));
  CHECK_THROWS_WITH(view.copy_from(Tensor::empty({2, 3, 2}, DType::f64)), Contains("float64"));
}

TEST_CASE("reshape of contiguous views") {
  Tensor t = iota234();
  Tensor r = t.reshape({6, 4});
  CHECK(r.storage() == t.storage());
  CHECK(r.data<float>()[4 * 5 + 3] == 23.0f);
  Tensor row = t.slice(1, 2).reshape({3, 4});
  CHECK(row.data<float>()[0] == 12.0f);
  CHECK_THROWS_WITH(t.reshape({5, 5}), Contains("24 elements") && Contains("25 elements"));
  // A flat parameter buffer carved into weight views, as the grad buffer will be.
  Tensor flat = Tensor::zeros({20});
  Tensor w = flat.slice(4, 16).reshape({3, 4});
  w.data<float>()[11] = 7.0f;
  CHECK(flat.data<float>()[15] == 7.0f);
}

TEST_CASE("from_blob borrows memory") {
  double buf[6] = {1, 2, 3, 4, 5, 6};
  {
    Tensor t = Tensor::from_blob(buf, {2, 3}, DType::f64);
    CHECK_FALSE(t.storage()->owned());
    CHECK(t.data<double>() == buf);
    t.data<double>()[4] = -5;
  }
  CHECK(buf[4] == -5);  // still valid: not freed by the tensor
  CHECK_THROWS_AS(Tensor::from_blob(nullptr, {2}, DType::f32), ConfigError);
}

TEST_CASE("misuse of undefined tensors, scalars and allocators throws") {
  Tensor u;
  CHECK_THROWS_WITH(u.raw_data(), Contains("undefined"));
  CHECK_THROWS_WITH(u.narrow(0, 0, 1), Contains("undefined"));
  CHECK_THROWS_WITH(u.reshape({1}), Contains("undefined"));
  CHECK_THROWS_WITH(u.clone(), Contains("undefined"));
  CHECK_THROWS_WITH(Tensor::empty({2}).copy_from(u), Contains("undefined"));
  CHECK(u.str() == "Tensor(undefined)");
  Tensor scalar = Tensor::empty({});
  CHECK(scalar.numel() == 1);
  scalar.data<float>()[0] = 2.5f;
  CHECK(scalar.clone().data<float>()[0] == 2.5f);  // 0-d copy
  CHECK_THROWS_WITH(scalar.slice(0, 1), Contains("0-d"));
  CHECK_THROWS_WITH(Shape({2, 3}).with(1, -4), Contains("-4"));
  CHECK_THROWS_WITH(triax::cpu_allocator().allocate(8, 1), Contains("ordinal 1"));
  CHECK_THROWS_WITH(triax::cpu_allocator().allocate(SIZE_MAX, 0), Contains("not a size that can be allocated"));
#if !defined(__SANITIZE_ADDRESS__)  // ASan aborts on absurd requests instead of returning null
  CHECK_THROWS_AS(triax::cpu_allocator().allocate(size_t{1} << 62, 0), triax::DeviceError);  // out of memory
#endif
  CHECK_THROWS_WITH(Tensor::empty({1}, DType::f32, Device::cuda(-1)), Contains("negative device ordinal -1"));
}

TEST_CASE("devices and the allocator hook") {
  CHECK(Device::cuda(1).str() == "cuda:1");
  CHECK(Device::cpu().str() == "cpu");
  // No CUDA allocator is installed in a CPU test process.
  CHECK_THROWS_WITH(Tensor::empty({4}, DType::f32, Device::cuda(0)), Contains("no allocator") && Contains("cuda"));
  CHECK_THROWS_WITH(Tensor::empty({4}, DType::f32, Device{triax::DeviceKind::cpu, 1}), Contains("cpu:0"));

  // A fake "cuda" allocator (host memory, counting calls) shows the hook: storage asks the
  // installed allocator with the ordinal and gives the block back to it.
  struct Counting : triax::Allocator {
    int allocs = 0, frees = 0, last_ordinal = -1;
    void* allocate(size_t n, int ordinal) override {
      ++allocs;
      last_ordinal = ordinal;
      return triax::cpu_allocator().allocate(n, 0);
    }
    void deallocate(void* p, size_t n, int) noexcept override {
      ++frees;
      triax::cpu_allocator().deallocate(p, n, 0);
    }
    std::string_view name() const override { return "counting"; }
  } counting;
  triax::set_allocator(triax::DeviceKind::cuda, &counting);
  {
    Tensor g = Tensor::empty({8}, DType::bf16, Device::cuda(3));
    CHECK(g.device() == Device::cuda(3));
    CHECK(counting.allocs == 1);
    CHECK(counting.last_ordinal == 3);
    CHECK(g.nbytes() == 16);
    CHECK(g.str() == "Tensor(bfloat16, (8), cuda:3)");
    CHECK_THROWS_WITH(Tensor::zeros({2}, DType::f32, Device::cuda(0)), Contains("cuda:0"));
    CHECK_THROWS_WITH(g.clone(), Contains("cuda:3"));
  }
  CHECK(counting.frees == 1);
  triax::set_allocator(triax::DeviceKind::cuda, nullptr);
  CHECK_THROWS_AS(triax::allocator_for(triax::DeviceKind::cuda), ConfigError);
  triax::set_allocator(triax::DeviceKind::cpu, nullptr);  // restores the built-in one
  CHECK(&triax::allocator_for(triax::DeviceKind::cpu) == &triax::cpu_allocator());
}
