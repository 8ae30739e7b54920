#include "mesh/float16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

namespace mesh {
namespace float16_test {

constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// The value of a binary16 pattern, computed from its fields by a different
// route (ldexp in double) than the code under test.
double HalfReference(uint16_t h) {
  const int sign = (h & 0x8000) ? -1 : 1;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// ---- binary16. ------------------------------------------------------------------

TEST(Float16, EveryPatternSurvivesARoundTripThroughFloat) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = Float16BitsToFloat(h);
    ASSERT_EQ(FloatToFloat16Bits(f), h) << std::hex << i;
  }
}

TEST(Float16, EveryPatternConvertsToItsExactValue) {
  int nans = 0, infs = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = Float16BitsToFloat(h);
    const bool all_ones = ((h >> 10) & 0x1f) == 0x1f;
    if (all_ones && (h & 0x3ff) != 0) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0);
      ++nans;
    } else if (all_ones) {
      ASSERT_EQ(f, (h & 0x8000) ? -kInf : kInf);
      ++infs;
    } else {
      ASSERT_EQ(static_cast<double>(f), HalfReference(h)) << std::hex << i;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << i;
    }
  }
  EXPECT_EQ(nans, 2 * 1023);
  EXPECT_EQ(infs, 2);
}

// For every pair of neighbouring finite halves, the float midpoint and its
// float neighbours round the right way: this covers every rounding boundary,
// normal and subnormal, for both signs.
TEST(Float16, RoundsToNearestEvenAtEveryBoundary) {
  for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
    for (uint16_t h = 0; h < 0x7bff; ++h) {
      const float a = Float16BitsToFloat(sign | h);
      const float b = Float16BitsToFloat(sign | (h + 1));
      const float mid = (a + b) / 2;  // Exact: at most 12 significant bits.
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(a) + static_cast<double>(b)) / 2);
      const uint16_t even = (h & 1) == 0 ? h : h + 1;
      ASSERT_EQ(FloatToFloat16Bits(mid), sign | even) << std::hex << h;
      ASSERT_EQ(FloatToFloat16Bits(std::nextafter(mid, a)), sign | h) << std::hex << h;
      ASSERT_EQ(FloatToFloat16Bits(std::nextafter(mid, b)), sign | (h + 1)) << std::hex << h;
      ASSERT_EQ(FloatToFloat16Bits(std::nextafter(a, b)), sign | h) << std::hex << h;
    }
  }
}

TEST(Float16, KnownValues) {
  EXPECT_EQ(FloatToFloat16Bits(0.0f), 0x0000);
  EXPECT_EQ(FloatToFloat16Bits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToFloat16Bits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFloat16Bits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToFloat16Bits(0.5f), 0x3800);
  EXPECT_EQ(FloatToFloat16Bits(0.1f), 0x2e66);
  EXPECT_EQ(FloatToFloat16Bits(1.0f / 3), 0x3555);
  EXPECT_EQ(FloatToFloat16Bits(3.14159265f), 0x4248);
  EXPECT_EQ(FloatToFloat16Bits(65504.0f), 0x7bff);    // Largest finite.
  EXPECT_EQ(FloatToFloat16Bits(0x1p-14f), 0x0400);    // Smallest normal.
  EXPECT_EQ(FloatToFloat16Bits(0x1p-24f), 0x0001);    // Smallest subnormal.
  EXPECT_EQ(FloatToFloat16Bits(0x3ffp-24f), 0x03ff);  // Largest subnormal.
  EXPECT_EQ(Float16BitsToFloat(0x3c01), 1.0f + 0x1p-10f);
  EXPECT_EQ(Float16BitsToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(Float16BitsToFloat(0xfbff), -65504.0f);
}

TEST(Float16, OverflowAndUnderflow) {
  EXPECT_EQ(FloatToFloat16Bits(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(FloatToFloat16Bits(65520.0f), 0x7c00);  // Tie to even is infinity.
  EXPECT_EQ(FloatToFloat16Bits(-65520.0f), 0xfc00);
  EXPECT_EQ(FloatToFloat16Bits(1e10f), 0x7c00);
  EXPECT_EQ(FloatToFloat16Bits(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(FloatToFloat16Bits(kInf), 0x7c00);
  EXPECT_EQ(FloatToFloat16Bits(-kInf), 0xfc00);
  EXPECT_EQ(FloatToFloat16Bits(0x1p-25f), 0x0000);  // Tie to even is zero.
  EXPECT_EQ(FloatToFloat16Bits(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(FloatToFloat16Bits(0x1.8p-25f * 2), 0x0002);  // 1.5 * 2^-24: tie, up to even.
  EXPECT_EQ(FloatToFloat16Bits(1e-30f), 0x0000);
  EXPECT_EQ(FloatToFloat16Bits(-1e-45f), 0x8000);  // Float subnormal keeps its sign.
  EXPECT_EQ(FloatToFloat16Bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  // Just below the smallest normal rounds up into it.
  EXPECT_EQ(FloatToFloat16Bits(std::nextafter(0x1p-14f, 0.0f)), 0x0400);
}

TEST(Float16, NaNStaysNaN) {
  const uint16_t quiet = FloatToFloat16Bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(quiet & 0x7c00, 0x7c00);
  EXPECT_NE(quiet & 0x3ff, 0);
  // Payload only in the low bits that do not fit: still NaN, not infinity.
  EXPECT_EQ(FloatToFloat16Bits(FromBits(0x7f800001u)), 0x7e00);
  EXPECT_EQ(FloatToFloat16Bits(FromBits(0xff800001u)), 0xfe00);
  // The payload's high bits are kept.
  EXPECT_EQ(FloatToFloat16Bits(FromBits(0x7fa00000u)), 0x7d00);
}

TEST(Float16, RandomFloatsAgreeWithARoundedDoubleReference) {
  // Reference: pick the nearer of the two neighbouring halves by comparing
  // exact double distances; ties to even.
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    // Cover the half range densely: exponents around [-26, 16].
    const float f = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng),
                               static_cast<int>(rng() % 44) - 26);
    const uint16_t got = FloatToFloat16Bits(f);
    const double x = std::fabs(static_cast<double>(f));
    const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    uint16_t lo = 0;  // Largest half magnitude <= x (binary search over ordered patterns).
    uint16_t hi = 0x7c00;
    while (hi - lo > 1) {
      const uint16_t m = static_cast<uint16_t>((lo + hi) / 2);
      (HalfReference(m) <= x ? lo : hi) = m;
    }
    uint16_t want;
    if (HalfReference(lo) == x) {
      want = lo;
    } else {
      const double up = lo == 0x7bff ? 65536.0 : HalfReference(lo + 1);
      const double dl = x - HalfReference(lo), du = up - x;
      want = dl < du ? lo : du < dl ? static_cast<uint16_t>(lo + 1) : (lo & 1 ? lo + 1 : lo);
    }
    ASSERT_EQ(got, sign | want) << f;
  }
}

TEST(Float16, StorageType) {
  static_assert(FloatToFloat16Bits(1.0f) == 0x3c00);
  static_assert(Float16BitsToFloat(0xc000) == -2.0f);
  constexpr Float16 one(1.0f);
  static_assert(one.bits == 0x3c00);
  EXPECT_EQ(static_cast<float>(Float16::FromBits(0x3800)), 0.5f);
  EXPECT_EQ(Float16(2.0f), Float16::FromBits(0x4000));
  EXPECT_FALSE(Float16(0.0f) == Float16(-0.0f));
  // Buffers of Float16 are plain uint16 arrays.
  const uint16_t raw[2] = {0x3c00, 0x4000};
  Float16 as_half[2];
  std::memcpy(as_half, raw, sizeof(raw));
  EXPECT_EQ(static_cast<float>(as_half[0]) + static_cast<float>(as_half[1]), 3.0f);
}

// ---- bfloat16. ------------------------------------------------------------------

TEST(BFloat16, EveryPatternSurvivesARoundTripThroughFloat) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto b = static_cast<uint16_t>(i);
    const float f = BFloat16BitsToFloat(b);
    ASSERT_EQ(Bits(f), i << 16);
    ASSERT_EQ(FloatToBFloat16Bits(f), b) << std::hex << i;
  }
}

TEST(BFloat16, RoundsToNearestEvenAtEveryBoundary) {
  for (uint16_t sign : {uint16_t{0}, uint16_t{0x8000}}) {
    for (uint16_t b = 0; b < 0x7f7f; ++b) {
      const float lo = BFloat16BitsToFloat(sign | b);
      const float hi = BFloat16BitsToFloat(sign | (b + 1));
      // The midpoint's bits: the lower pattern plus half an ulp (exact).
      const float mid = FromBits((static_cast<uint32_t>(sign | b) << 16) | 0x8000u);
      const uint16_t even = (b & 1) == 0 ? b : b + 1;
      ASSERT_EQ(FloatToBFloat16Bits(mid), sign | even) << std::hex << b;
      ASSERT_EQ(FloatToBFloat16Bits(std::nextafter(mid, lo)), sign | b) << std::hex << b;
      ASSERT_EQ(FloatToBFloat16Bits(std::nextafter(mid, hi)), sign | (b + 1)) << std::hex << b;
    }
  }
}

TEST(BFloat16, KnownValuesOverflowAndNaN) {
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16Bits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBFloat16Bits(3.14159265f), 0x4049);
  EXPECT_EQ(FloatToBFloat16Bits(0.1f), 0x3dcd);
  EXPECT_EQ(FloatToBFloat16Bits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x7f7f7fffu)), 0x7f7f);  // Below the last midpoint.
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x7f7f8000u)), 0x7f80);  // Tie to even: infinity.
  EXPECT_EQ(FloatToBFloat16Bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16Bits(-kInf), 0xff80);
  EXPECT_EQ(FloatToBFloat16Bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x00018000u)), 0x0002);  // Subnormal tie, up to even.
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x7f800001u)), 0x7fc0);  // NaN, never infinity.
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0xff800001u)), 0xffc0);
  EXPECT_EQ(FloatToBFloat16Bits(FromBits(0x7fc00000u)), 0x7fc0);
  EXPECT_TRUE(std::isnan(BFloat16BitsToFloat(0x7fc1)));
}

TEST(BFloat16, StorageType) {
  static_assert(FloatToBFloat16Bits(1.0f) == 0x3f80);
  static_assert(BFloat16(1.0f).bits == 0x3f80);
  EXPECT_EQ(static_cast<float>(BFloat16::FromBits(0x4049)), 3.140625f);
  EXPECT_EQ(BFloat16(2.0f), BFloat16::FromBits(0x4000));
}

}  // namespace float16_test
}  // namespace mesh
