// The CUDA backend's host-checkable parts, in every build (no GPU needed): the index arithmetic of
// kernels/backend_ops.cu (cuda/backend_ops.h, namespace rowmap) run as a host emulation of each
// kernel's loops on odd sizes and compared bit for bit with the CPU backend's op; fill_bits
// against the CPU's own conversions; and, in CUDA builds, make_cuda_backend's errors without a
// usable device (DeviceError naming CUDA, the ordinal and the device count; float16 is accepted)
// and for a compute type the kernels lack.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "triax/backend/backend.h"
#include "triax/core/gpu_count.h"
#include "triax/cuda/backend_ops.h"
#if defined(TRIAX_HAVE_CUDA)
#include "triax/cuda/cuda_backend.h"
#endif

using namespace triax;
using namespace triax::cuda;
using Catch::Matchers::Contains;

namespace {

std::vector<float> rnd(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

Tensor up(Backend& be, const std::vector<float>& v) {
  Tensor t = be.empty(Shape{static_cast<int64_t>(v.size())}, DType::f32);
  from_host_f32(be, t, v);
  return t;
}

// The threads of a grid-stride kernel, emulated: thread tid of `stride` visits idx = tid,
// tid + stride, ... (each element exactly once whatever the order of the threads).
template <class F>
void grid_stride(int64_t n, int64_t stride, F&& body) {
  for (int64_t tid = stride - 1; tid >= 0; --tid)  // reverse thread order: the result must not care
    for (int64_t idx = tid; idx < n; idx += stride) body(idx);
}

}  // namespace

TEST_CASE("rowmap: periodic rows as the kernels walk them equal the CPU ops bit for bit", "[cuda][rowmap]") {
  auto cpu = make_cpu_backend();
  for (int rows : {1, 7, 37, 130})
    for (int period : {1, 5, 37, 64})
      for (int row0 : {0, 3, 41}) {
        const int C = 3;
        const auto dx = rnd(static_cast<size_t>(rows) * C, 7u + rows);
        const auto src0 = rnd(static_cast<size_t>(period) * C, 11u + period);
        // add_rows_periodic: one element per thread index.
        std::vector<float> x = dx;
        grid_stride(int64_t{rows} * C, 19, [&](int64_t idx) {
          const int i = static_cast<int>(idx / C), c = static_cast<int>(idx % C);
          x[idx] += src0[static_cast<size_t>(rowmap::periodic_src_row(i, row0, period)) * C + c];
        });
        Tensor tx = up(*cpu, dx), ts = up(*cpu, src0);
        cpu->add_rows_periodic(tx, ts, rows, C, row0, period);
        CHECK(to_host_f32(*cpu, tx) == x);
        // sum_rows_periodic: one thread per dsrc element walks its rows from periodic_first_row.
        std::vector<float> ds = src0;
        grid_stride(int64_t{period} * C, 23, [&](int64_t idx) {
          const int p = static_cast<int>(idx / C), c = static_cast<int>(idx % C);
          float acc = ds[idx];
          for (int i = rowmap::periodic_first_row(p, row0, period); i < rows; i += period) {
            REQUIRE(rowmap::periodic_src_row(i, row0, period) == p);
            acc += dx[static_cast<size_t>(i) * C + c];
          }
          ds[idx] = acc;
        });
        Tensor td = up(*cpu, src0), tdx = up(*cpu, dx);
        cpu->sum_rows_periodic(td, tdx, rows, C, row0, period);
        INFO("rows " << rows << " period " << period << " row0 " << row0);
        CHECK(to_host_f32(*cpu, td) == ds);
      }
}

TEST_CASE("rowmap: reduction blocks cover [0, n) once, in order, for odd sizes", "[cuda][rowmap]") {
  for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{1000003},
                    (int64_t{1} << 28) + 5}) {
    const int nb = rowmap::reduce_blocks(n);
    REQUIRE(nb >= 1);
    REQUIRE(nb <= rowmap::kReduceMaxBlocks);
    int64_t next = 0;
    for (int b = 0; b < nb; ++b) {
      const auto r = rowmap::block_range(n, nb, b);
      REQUIRE(r.begin == std::min(next, n));
      REQUIRE(r.end >= r.begin);
      next = r.end;
    }
    CHECK(next == n);
  }
  // Threads of a block: element begin + t + k*threads, each once.
  const int64_t n = 100003;
  const int nb = rowmap::reduce_blocks(n);
  std::vector<int> seen(n, 0);
  for (int b = 0; b < nb; ++b) {
    const auto r = rowmap::block_range(n, nb, b);
    for (int t = 0; t < rowmap::kReduceThreads; ++t)
      for (int64_t i = r.begin + t; i < r.end; i += rowmap::kReduceThreads) ++seen[i];
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
}

TEST_CASE("rowmap: grid-stride counts add up to n (the tail included)", "[cuda][rowmap]") {
  for (int64_t n : {0, 1, 31, 256, 257, 4097, 100003})
    for (int64_t stride : {1, 32, 256, 33 * 256}) {
      int64_t total = 0;
      for (int64_t t = 0; t < stride; ++t) total += rowmap::grid_stride_count(n, t, stride);
      CHECK(total == n);
    }
}

TEST_CASE("rowmap: vector packs and their tail visit every element once", "[cuda][rowmap]") {
  for (int64_t n : {0, 1, 3, 7, 8, 9, 2479, 100003})
    for (int W : {2, 4, 8})
      for (int64_t stride : {1, 32, 257}) {
        std::vector<int> seen(static_cast<size_t>(n), 0);
        for (int64_t t = 0; t < stride; ++t) {
          for (int64_t i = t; i < rowmap::vec_count(n, W); i += stride)
            for (int k = 0; k < W; ++k) ++seen[static_cast<size_t>(i * W + k)];
          for (int64_t i = rowmap::vec_tail_begin(n, W) + t; i < n; i += stride) ++seen[static_cast<size_t>(i)];
        }
        INFO("n " << n << " W " << W << " stride " << stride);
        CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
        CHECK(n - rowmap::vec_tail_begin(n, W) < W);
      }
}

TEST_CASE("rowmap: the sorted scatter equals the CPU scatter_add_rows bit for bit", "[cuda][rowmap]") {
  auto cpu = make_cpu_backend();
  const int rows = 53, C = 5, out_rows = 7;  // many duplicates
  std::mt19937 g(5);
  std::vector<int32_t> index(rows);
  for (auto& i : index) i = static_cast<int32_t>(g() % out_rows);
  const auto in = rnd(static_cast<size_t>(rows) * C, 1), scale = rnd(rows, 2), out0 = rnd(out_rows * C, 3);
  // Emulation: stable sort of the row numbers by destination, run heads add their rows in order.
  std::vector<int32_t> r(rows);
  std::iota(r.begin(), r.end(), 0);
  std::stable_sort(r.begin(), r.end(), [&](int a, int b) { return index[a] < index[b]; });
  std::vector<int32_t> keys(rows);
  for (int i = 0; i < rows; ++i) keys[i] = index[r[i]];
  std::vector<float> out = out0;
  for (int i = rows - 1; i >= 0; --i) {  // blocks in any order
    if (!rowmap::run_head(keys.data(), i)) continue;
    int end = i + 1;
    while (end < rows && keys[end] == keys[i]) ++end;
    for (int c = 0; c < C; ++c) {
      float acc = out[static_cast<size_t>(keys[i]) * C + c];
      for (int k = i; k < end; ++k) acc += scale[r[k]] * in[static_cast<size_t>(r[k]) * C + c];
      out[static_cast<size_t>(keys[i]) * C + c] = acc;
    }
  }
  Tensor to = up(*cpu, out0), ti = up(*cpu, in), ts = up(*cpu, scale);
  Tensor tix = cpu->empty(Shape{rows}, DType::i32);
  cpu->copy_from_host(tix, index.data(), sizeof(int32_t) * rows);
  cpu->scatter_add_rows(to, ti, tix, ts, rows, C);
  CHECK(to_host_f32(*cpu, to) == out);
}

TEST_CASE("fill_bits: the bit pattern of a value in every dtype", "[cuda][fill]") {
  CHECK(fill_bits(DType::f32, 3.0) == std::bit_cast<uint32_t>(3.0f));
  CHECK(fill_bits(DType::f32, -1.25) == std::bit_cast<uint32_t>(-1.25f));
  CHECK(fill_bits(DType::f64, 0.1) == std::bit_cast<uint64_t>(0.1));
  CHECK(fill_bits(DType::bf16, -1.5) == bf16(-1.5f).bits);
  CHECK(fill_bits(DType::bf16, 0.1) == bf16(0.1f).bits);
  f16 h(0.1f);
  uint16_t hb = 0;
  std::memcpy(&hb, &h, 2);
  CHECK(fill_bits(DType::f16, 0.1) == hb);
  CHECK(fill_bits(DType::i32, -7.9) == static_cast<uint32_t>(-7));
  CHECK(fill_bits(DType::i64, -3.0) == static_cast<uint64_t>(int64_t{-3}));
  CHECK(fill_bits(DType::u8, 255.0) == 255u);
  const uint32_t nan_bits = static_cast<uint32_t>(fill_bits(DType::f32, std::nan("")));
  CHECK((nan_bits & 0x7f800000u) == 0x7f800000u);
  CHECK((nan_bits & 0x007fffffu) != 0u);
  CHECK(fill_bits(DType::f32, 0.0) == 0u);
}

#if defined(TRIAX_HAVE_CUDA)
TEST_CASE("make_cuda_backend names CUDA, the ordinal and the device count when it cannot use a device",
          "[cuda][nogpu]") {
  std::string why;
  const int n = cuda_device_count(&why);
  CudaBackendOptions o;
  o.device = n + 3;  // past the last device on any machine
  try {
    (void)make_cuda_backend(o);
    FAIL("make_cuda_backend on a missing device did not throw");
  } catch (const DeviceError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Contains("CUDA"));
    CHECK_THAT(msg, Contains("cuda:" + std::to_string(n + 3)));
    CHECK_THAT(msg, Contains(std::to_string(n) + " CUDA device(s) visible"));
  }
  if (n == 0) {
    // The default device 0 on a machine without a GPU: the reason is named too.
    try {
      (void)make_cuda_backend();
      FAIL("make_cuda_backend without a GPU did not throw");
    } catch (const DeviceError& e) {
      CHECK_THAT(std::string(e.what()), Contains("0 CUDA device(s) visible"));
      CHECK_THAT(std::string(e.what()), Contains(why));
    }
  }
  // float16 is a compute type like bfloat16: what stops it is only the missing device.
  o.compute = DType::f16;
  CHECK_THROWS_AS(make_cuda_backend(o), DeviceError);
  o.device = 0;
  if (n == 0) {
    CHECK_THROWS_AS(make_cuda_backend(o), DeviceError);
  } else {
    CHECK(make_cuda_backend(o) != nullptr);
  }
  // A type the kernels do not compute in is a ConfigError naming the ones they do.
  o.compute = DType::i32;
  CHECK_THROWS_AS(make_cuda_backend(o), ConfigError);
  CHECK_THROWS_WITH(make_cuda_backend(o), Contains("float16") && Contains("bfloat16"));
  // compute_stream of a non-CUDA backend is null.
  auto cpu = make_cpu_backend();
  CHECK(compute_stream(*cpu) == nullptr);
  CHECK(pool_used_high(*cpu) == 0);
}
#endif
