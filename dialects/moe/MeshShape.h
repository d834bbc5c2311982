//===- MeshShape.h - the device mesh: dp x tp x pp x ep ranks ----*- C++ -*-===//
//
// `--mesh dp=2,ep=2` on moec and the sharding pass; the model carries it as
// the `moe.mesh` attribute once the sharding pass ran. Rank r's coordinates
// run ep fastest, then dp, tp, pp (experts of one group sit on neighbouring
// GPUs, where the all-to-all is cheapest).
//
//===----------------------------------------------------------------------===//

#ifndef DIALECTS_MOE_MESHSHAPE_H_
#define DIALECTS_MOE_MESHSHAPE_H_

#include <cstdint>
#include <string>

namespace moec::moe {

struct MeshShape {
  int64_t dp = 1, tp = 1, pp = 1, ep = 1;

  int64_t size() const { return dp * tp * pp * ep; }
  bool single() const { return size() == 1; }
  /// "dp=2,ep=2" (axes of size 1 left out; "dp=1" for a single rank).
  std::string str() const;
  /// Parses "dp=2,tp=1,ep=4" (any order, each axis at most once, sizes >= 1; empty = one
  /// rank). On failure returns false and says why in `error`.
  static bool parse(const std::string &text, MeshShape &out, std::string &error);

  /// Rank r's coordinate along `axis` ("dp", "tp", "pp", "ep"), and the size of that axis.
  int64_t coordinate(int64_t rank, const std::string &axis) const;
  int64_t axisSize(const std::string &axis) const;
};

} // namespace moec::moe

#endif // DIALECTS_MOE_MESHSHAPE_H_
