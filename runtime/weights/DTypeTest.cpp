//===- DTypeTest.cpp - dtype table and F32/BF16/F16 conversions ----------===//

#include "runtime/weights/DType.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace moec::runtime::weights {
namespace {

float floatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

uint32_t bitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

TEST(DTypeTest, NamesAndSizes) {
  EXPECT_EQ(parseDType("F32"), DType::F32);
  EXPECT_EQ(parseDType("BF16"), DType::BF16);
  EXPECT_EQ(parseDType("F8_E4M3"), DType::F8E4M3);
  EXPECT_EQ(parseDType("I64"), DType::I64);
  EXPECT_FALSE(parseDType("f32").has_value());
  EXPECT_FALSE(parseDType("F4").has_value());
  EXPECT_EQ(dtypeName(DType::BF16), "BF16");
  EXPECT_EQ(dtypeSize(DType::BF16), 2u);
  EXPECT_EQ(dtypeSize(DType::F64), 8u);
  EXPECT_EQ(dtypeSize(DType::Bool), 1u);
  for (const char *name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16",
                           "BF16", "I32", "U32", "F32", "I64", "U64", "F64"})
    EXPECT_EQ(dtypeName(*parseDType(name)), name);
}

TEST(DTypeTest, Bf16Exact) {
  EXPECT_EQ(f32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(f32ToBf16(-2.0f), 0xc000);
  EXPECT_EQ(f32ToBf16(0.0f), 0x0000);
  EXPECT_EQ(f32ToBf16(-0.0f), 0x8000);
  EXPECT_EQ(bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(bf16ToF32(0xc000), -2.0f);
  // Every bf16 survives F32 and back.
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    float value = bf16ToF32(uint16_t(bits));
    if (std::isnan(value))
      EXPECT_TRUE(std::isnan(bf16ToF32(f32ToBf16(value))));
    else
      EXPECT_EQ(f32ToBf16(value), bits);
  }
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32ToBf16(floatOf(0x3f808000)), 0x3f80); // tie, even stays
  EXPECT_EQ(f32ToBf16(floatOf(0x3f818000)), 0x3f82); // tie, odd rounds up
  EXPECT_EQ(f32ToBf16(floatOf(0x3f808001)), 0x3f81); // above the tie
  EXPECT_EQ(f32ToBf16(floatOf(0x3f807fff)), 0x3f80); // below the tie
  EXPECT_EQ(f32ToBf16(floatOf(0xbf818000)), 0xbf82); // sign does not matter
  EXPECT_EQ(f32ToBf16(floatOf(0x7f7fffff)), 0x7f80); // max float rounds to inf
  EXPECT_EQ(f32ToBf16(floatOf(0x00000001)), 0x0000); // tiny subnormal to zero
  EXPECT_EQ(f32ToBf16(floatOf(0x00018000)), 0x0002); // subnormal tie, odd up
}

TEST(DTypeTest, Bf16InfAndNan) {
  EXPECT_EQ(f32ToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32ToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(f32ToBf16(std::numeric_limits<float>::quiet_NaN()), 0x7fc0);
  // A NaN whose payload lives only in the dropped bits must not become inf.
  uint16_t signalling = f32ToBf16(floatOf(0x7f800001));
  EXPECT_TRUE(std::isnan(bf16ToF32(signalling))) << std::hex << signalling;
  EXPECT_TRUE(std::isnan(bf16ToF32(f32ToBf16(floatOf(0xffffffff)))));
  EXPECT_TRUE(std::isinf(bf16ToF32(0x7f80)));
}

TEST(DTypeTest, F16ToF32IsExact) {
  EXPECT_EQ(f16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(f16ToF32(0xc000), -2.0f);
  EXPECT_EQ(f16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(f16ToF32(0x0400), 0x1p-14f);        // smallest normal
  EXPECT_EQ(f16ToF32(0x0001), 0x1p-24f);        // smallest subnormal
  EXPECT_EQ(f16ToF32(0x03ff), 1023 * 0x1p-24f); // largest subnormal
  EXPECT_EQ(bitsOf(f16ToF32(0x8000)), 0x80000000u);
  EXPECT_EQ(f16ToF32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16ToF32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(f16ToF32(0x7e00)));
  EXPECT_TRUE(std::isnan(f16ToF32(0x7c01)));
}

TEST(DTypeTest, F16RoundTripsEveryValue) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    float value = f16ToF32(uint16_t(bits));
    if (std::isnan(value))
      EXPECT_TRUE(std::isnan(f16ToF32(f32ToF16(value))));
    else
      EXPECT_EQ(f32ToF16(value), bits) << std::hex << bits;
  }
}

TEST(DTypeTest, F16RoundsToNearestEven) {
  EXPECT_EQ(f32ToF16(1.0f + 0x1p-11f), 0x3c00);     // tie, even stays
  EXPECT_EQ(f32ToF16(1.0f + 3 * 0x1p-11f), 0x3c02); // tie, odd rounds up
  EXPECT_EQ(f32ToF16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
  EXPECT_EQ(f32ToF16(65519.0f), 0x7bff); // below the tie to inf
  EXPECT_EQ(f32ToF16(65520.0f), 0x7c00); // the tie goes to inf (even)
  EXPECT_EQ(f32ToF16(1e10f), 0x7c00);
  EXPECT_EQ(f32ToF16(-1e10f), 0xfc00);
  EXPECT_EQ(f32ToF16(2047.0f * 0x1p-11f * 0x1p-14f), 0x0400); // rounds up into the normals
}

TEST(DTypeTest, F16Subnormals) {
  EXPECT_EQ(f32ToF16(0x1p-24f), 0x0001);
  EXPECT_EQ(f32ToF16(0x1p-25f), 0x0000);        // tie between 0 and the smallest: even
  EXPECT_EQ(f32ToF16(1.5f * 0x1p-25f), 0x0001); // above the tie
  EXPECT_EQ(f32ToF16(3 * 0x1p-25f), 0x0002);    // 1.5 ulp: tie, odd rounds up
  EXPECT_EQ(f32ToF16(5 * 0x1p-25f), 0x0002);    // 2.5 ulp: tie, even stays
  EXPECT_EQ(f32ToF16(1023 * 0x1p-24f), 0x03ff);
  EXPECT_EQ(f32ToF16(-0x1p-24f), 0x8001);
  EXPECT_EQ(f32ToF16(0x1p-30f), 0x0000);
  EXPECT_EQ(f32ToF16(floatOf(0x00000001)), 0x0000); // F32 subnormal
  EXPECT_EQ(f32ToF16(-0.0f), 0x8000);
}

TEST(DTypeTest, F16InfAndNan) {
  EXPECT_EQ(f32ToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32ToF16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(f32ToF16(std::numeric_limits<float>::quiet_NaN()), 0x7e00);
  EXPECT_TRUE(std::isnan(f16ToF32(f32ToF16(floatOf(0x7f800001)))));
  EXPECT_EQ(f32ToF16(floatOf(0xffc00000)) & 0x8000, 0x8000); // NaN keeps its sign
}

TEST(DTypeTest, ConvertElements) {
  std::vector<float> values = {1.0f, -2.5f, 0.1f, 65504.0f};
  std::vector<uint16_t> halves(values.size()), bf16s(values.size());
  ASSERT_TRUE(convertElements(values.data(), DType::F32, halves.data(), DType::F16, 4).ok());
  ASSERT_TRUE(convertElements(values.data(), DType::F32, bf16s.data(), DType::BF16, 4).ok());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(halves[i], f32ToF16(values[i]));
    EXPECT_EQ(bf16s[i], f32ToBf16(values[i]));
  }
  // BF16 -> F16 goes through F32 exactly, so it rounds once.
  std::vector<uint16_t> viaBf16(values.size());
  ASSERT_TRUE(convertElements(bf16s.data(), DType::BF16, viaBf16.data(), DType::F16, 4).ok());
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(viaBf16[i], f32ToF16(bf16ToF32(bf16s[i])));
  // Unaligned source bytes are fine.
  std::vector<uint8_t> unaligned(1 + 4 * sizeof(float));
  std::memcpy(unaligned.data() + 1, values.data(), 4 * sizeof(float));
  std::vector<float> back(4);
  ASSERT_TRUE(convertElements(unaligned.data() + 1, DType::F32, back.data(), DType::F32, 4).ok());
  EXPECT_EQ(back, values);

  int64_t ints[2] = {1, 2};
  absl::Status status = convertElements(ints, DType::I64, back.data(), DType::F32, 2);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(std::string(status.message()).find("cannot convert I64 to F32"), std::string::npos)
      << status;
  EXPECT_TRUE(canConvert(DType::I64, DType::I64));
  EXPECT_FALSE(canConvert(DType::F64, DType::F32));
}

} // namespace
} // namespace moec::runtime::weights
