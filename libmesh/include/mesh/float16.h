// 16-bit floating-point storage types: IEEE 754 binary16 ("half") and
// bfloat16, with conversions to and from float.
//
// Neither type does arithmetic. Reductions (e.g. the Gloo backend's sum over
// f16/bf16 buffers) widen to float, operate, and narrow back, which is also
// what PyTorch's CPU kernels do.
//
// Conversion contract (both types):
//   * to float is exact, for every one of the 65536 bit patterns;
//   * from float rounds to nearest, ties to even, independent of the FPU's
//     rounding mode (pure integer code), overflowing to +-infinity;
//   * NaN stays NaN with its sign; the payload's high bits are kept, so
//     X -> float -> X reproduces every bit pattern exactly, NaNs included;
//     a float NaN whose kept payload would be all zeros becomes a quiet NaN
//     (never an infinity);
//   * half subnormals are produced and read correctly; bfloat16 has float's
//     exponent range, so float subnormals map to bfloat16 subnormals.
//
// Thread safety: plain values and pure functions.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

namespace mesh {

// ---- Bit-level conversions. ------------------------------------------------

constexpr float Float16BitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {  // Inf or NaN: widen the payload.
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {  // Normal: rebias 15 -> 127.
    return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
  // Zero or subnormal, mantissa * 2^-24: exact in float, because a 10-bit
  // integer times a power of two is a normal float.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign != 0 ? -magnitude : magnitude;
}

constexpr uint16_t FloatToFloat16Bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN.
    if (abs == 0x7f800000u) return sign | 0x7c00u;
    const uint16_t payload = static_cast<uint16_t>((abs >> 13) & 0x3ffu);
    return sign | 0x7c00u | (payload != 0 ? payload : 0x200u);
  }
  // 65520 is the midpoint between 65504 (max half, odd mantissa) and 2^16;
  // the tie goes to the even side, which is infinity.
  if (abs >= 0x477ff000u) return sign | 0x7c00u;
  if (abs >= 0x38800000u) {  // Normal half range, [2^-14, 65520).
    const uint32_t rebiased = abs - (112u << 23);
    const uint32_t odd = (rebiased >> 13) & 1u;
    // Adding 0xfff + odd rounds to nearest even; a carry out of the
    // mantissa correctly bumps the exponent.
    return sign | static_cast<uint16_t>((rebiased + 0xfffu + odd) >> 13);
  }
  // Subnormal half (or zero): result = round(|f| / 2^-24).
  const uint32_t exponent = abs >> 23;
  if (exponent < 102) return sign;                             // |f| < 2^-25 rounds to zero.
  const uint32_t significand = (abs & 0x7fffffu) | 0x800000u;  // |f| = sig * 2^(e-150)
  const uint32_t shift = 126u - exponent;                      // 14..24
  uint32_t result = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (remainder > halfway || (remainder == halfway && (result & 1u) != 0)) ++result;
  return sign | static_cast<uint16_t>(result);  // 0x400 (min normal) on carry.
}

constexpr float BFloat16BitsToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

constexpr uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: truncate, but never to infinity.
    const uint16_t high = static_cast<uint16_t>(x >> 16);
    return (high & 0x7fu) != 0 ? high : static_cast<uint16_t>(high | 0x40u);
  }
  // Round to nearest even on the low 16 bits; overflow carries into
  // infinity, which is the correctly rounded result.
  const uint32_t odd = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7fffu + odd) >> 16);
}

// ---- Storage types. --------------------------------------------------------
//
// Two bytes, trivially copyable, no padding: a buffer of DType::kFloat16
// elements may be accessed as Float16[] (and likewise bfloat16).

struct Float16 {
  uint16_t bits = 0;

  constexpr Float16() = default;
  constexpr explicit Float16(float f) : bits(FloatToFloat16Bits(f)) {}
  static constexpr Float16 FromBits(uint16_t b) {
    Float16 h;
    h.bits = b;
    return h;
  }
  constexpr explicit operator float() const { return Float16BitsToFloat(bits); }

  // Bitwise equality (NaN == NaN when the bits match; +0 != -0).
  friend constexpr bool operator==(Float16 a, Float16 b) { return a.bits == b.bits; }
};

struct BFloat16 {
  uint16_t bits = 0;

  constexpr BFloat16() = default;
  constexpr explicit BFloat16(float f) : bits(FloatToBFloat16Bits(f)) {}
  static constexpr BFloat16 FromBits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
  constexpr explicit operator float() const { return BFloat16BitsToFloat(bits); }

  // Bitwise equality (NaN == NaN when the bits match; +0 != -0).
  friend constexpr bool operator==(BFloat16 a, BFloat16 b) { return a.bits == b.bits; }
};

static_assert(sizeof(Float16) == 2 && std::is_trivially_copyable_v<Float16>);
static_assert(sizeof(BFloat16) == 2 && std::is_trivially_copyable_v<BFloat16>);

}  // namespace mesh
