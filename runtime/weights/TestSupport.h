//===- TestSupport.h - files for the weights tests -------------*- C++ -*-===//

#ifndef RUNTIME_WEIGHTS_TESTSUPPORT_H_
#define RUNTIME_WEIGHTS_TESTSUPPORT_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace moec::runtime::weights::testing {

/// The golden references (@golden//:files) in the test's runfiles; fails the
/// calling test (and returns "") when they are not there.
std::string goldenDir();

/// A fresh, empty directory under TEST_TMPDIR named after the running test.
std::string freshTempDir();

std::string readFileBytes(const std::string &path);
void writeFileBytes(const std::string &path, std::string_view bytes);

/// A safetensors image: the 8-byte little-endian length of `header`, `header`, `data`.
std::string safetensorsBytes(std::string_view header, std::string_view data);
/// As safetensorsBytes, but the length field says `declaredLength`.
std::string safetensorsBytes(uint64_t declaredLength, std::string_view header,
                             std::string_view data);

} // namespace moec::runtime::weights::testing

#endif // RUNTIME_WEIGHTS_TESTSUPPORT_H_
