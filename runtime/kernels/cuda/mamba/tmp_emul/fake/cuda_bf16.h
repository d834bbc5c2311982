#pragma once
#include <cstdint>
#include <cstring>
struct __nv_bfloat16 { unsigned short x; };
inline float __bfloat162float(__nv_bfloat16 h) {
  uint32_t bits = uint32_t(h.x) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffff) > 0x7f800000)
    return {0x7fc0};
  bits += 0x7fff + ((bits >> 16) & 1);
  return {static_cast<unsigned short>(bits >> 16)};
}
