// Checked size arithmetic: products and sums at and just past the limits of int and int64, and
// the message that names the factors and the exact value instead of a wrapped one.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>

#include "triax/core/checked_math.h"
#include "unit/io_test_util.h"

using namespace triax;
using Catch::Matchers::Contains;

using test::config_error_of;

TEST_CASE("mul_checked and add_checked detect overflow at the type's edge", "[core]") {
  constexpr int kMax = std::numeric_limits<int>::max();
  CHECK(mul_checked<int>(46340, 46340) == 2147395600);  // the largest square under 2^31
  CHECK_FALSE(mul_checked<int>(46341, 46341));
  CHECK(mul_checked<int>(-65536, 32768) == std::numeric_limits<int>::min());
  CHECK_FALSE(mul_checked<int>(65536, 32768));
  CHECK(add_checked<int>(kMax - 5, 5) == kMax);
  CHECK_FALSE(add_checked<int>(kMax - 5, 6));
  CHECK(mul_checked<int64_t>(3037000499LL, 3037000499LL) == 9223372030926249001LL);
  CHECK_FALSE(mul_checked<int64_t>(3037000500LL, 3037000500LL));
}

TEST_CASE("checked_product returns the product or names every factor and the exact value", "[core]") {
  CHECK(checked_product<int>("tp x pp", {32768, 65535}) == 2147450880);
  CHECK(checked_product("a x b x c", {1 << 20, 1 << 20, 1 << 22}) == (int64_t{1} << 62));
  // 65536 x 65536 = 2^32 wraps to 0 in an int: the SIGFPE of issue 24 (W % (tp * pp)).
  CHECK_THAT(config_error_of([] { checked_product<int>("tp x pp", {65536, 65536}); }),
             Contains("tp x pp = 65536 x 65536 = 4294967296 is too large: at most 2147483647"));
  // 4 x 1073741824 = 2^32: the --vpp SIGFPE.
  CHECK_THAT(config_error_of([] { checked_product<int>("pp x vpp", {4, 1073741824}); }),
             Contains("pp x vpp = 4 x 1073741824 = 4294967296"));
  // 2 x 2^30 = 2^31: "-2147483648 virtual stages" before.
  CHECK_THAT(config_error_of([] { checked_product<int>("pp x vpp", {2, 1 << 30}); }), Contains("= 2147483648 is too"));
  // int64: micro-batch 2^62 x dp 2 x 2 micro-batches (a negative global batch before).
  CHECK_THAT(config_error_of([] { checked_product("micro-batch x dp x micro-batches", {int64_t{1} << 62, 2, 2}); }),
             Contains("= 18446744073709551616 is too large: at most 9223372036854775807"));
  // Past 2^127 the text still says so rather than a wrapped number.
  CHECK_THAT(config_error_of([] {
               constexpr int64_t m = std::numeric_limits<int64_t>::max();
               checked_product("huge", {m, m, m});
             }),
             Contains("more than 2^127"));
  // A factor that does not even fit the result type (an int64 given for an int product).
  CHECK_THAT(config_error_of([] { checked_product<int>("micro-batch x seq", {int64_t{1} << 40, 1}); }),
             Contains("1099511627776 x 1 = 1099511627776 is too large: at most 2147483647"));
  CHECK(checked_sum<int>("s", 2147483640, 7) == 2147483647);
  CHECK_THAT(config_error_of([] { checked_sum<int>("layers", 2147483640, 8); }),
             Contains("layers = 2147483640 + 8 is too large"));
}
