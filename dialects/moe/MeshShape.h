//===- MeshShape.h - the device mesh: dp x tp x pp x ep ranks ----*- C++ -*-===//
//
// `--mesh dp=2,ep=2` on moec and the sharding pass; the model carries it as
// the `moe.mesh` attribute once the sharding pass ran. Rank r's coordinates
// run tp fastest, then ep, dp, pp by default: tp's collectives run in every
// layer and block it, so its ranks share a node (NVLink) first, then an
// expert group's; `--rank-order ep,dp` numbers ep first instead.
//
//===----------------------------------------------------------------------===//

#ifndef DIALECTS_MOE_MESHSHAPE_H_
#define DIALECTS_MOE_MESHSHAPE_H_

#include <cstdint>
#include <string>

namespace moec::moe {

struct MeshShape {
  int64_t dp = 1, tp = 1, pp = 1, ep = 1;
  /// How ranks are numbered: the four axes, the fastest-varying first.
  std::string order = kDefaultOrder;
  static constexpr const char *kDefaultOrder = "tp,ep,dp,pp";

  int64_t size() const { return dp * tp * pp * ep; }
  bool single() const { return size() == 1; }
  /// "dp=2,ep=2" (axes of size 1 left out; "dp=1" for a single rank), as --mesh takes it.
  std::string str() const;
  /// str(), then ";order=tp,ep,dp,pp" unless the order is the default: the form the model's
  /// `mesh` attribute and the sharding pass's option hold.
  std::string spec() const;
  /// Parses "dp=2,tp=1,ep=4" (any order, each axis at most once, sizes >= 1; empty = one
  /// rank), optionally followed by ";order=AXES" (parseOrder). On failure returns false and
  /// says why in `error`.
  static bool parse(const std::string &text, MeshShape &out, std::string &error);
  /// Parses a rank order, "tp,ep": distinct axes, the fastest first; the axes left out follow
  /// in their default order (tp, ep, dp, pp). `out` gets all four ("ep,dp,tp,pp" for "ep,dp").
  static bool parseOrder(const std::string &text, std::string &out, std::string &error);

  /// Rank r's coordinate along `axis` ("dp", "tp", "pp", "ep"), the size of that axis, and
  /// the distance between ranks one apart on it.
  int64_t coordinate(int64_t rank, const std::string &axis) const;
  int64_t axisSize(const std::string &axis) const;
  int64_t stride(const std::string &axis) const;
};

} // namespace moec::moe

#endif // DIALECTS_MOE_MESHSHAPE_H_
