//===- MeshShape.cpp - the device mesh: dp x tp x pp x ep ranks ----------===//

#include "dialects/moe/MeshShape.h"

#include <cstdlib>
#include <sstream>

namespace moec::moe {

std::string MeshShape::str() const {
  std::ostringstream os;
  const char *sep = "";
  for (const char *axis : {"dp", "tp", "pp", "ep"})
    if (axisSize(axis) > 1) {
      os << sep << axis << "=" << axisSize(axis);
      sep = ",";
    }
  return single() ? "dp=1" : os.str();
}

bool MeshShape::parse(const std::string &text, MeshShape &out, std::string &error) {
  MeshShape mesh;
  bool seen[4] = {false, false, false, false};
  std::stringstream items(text);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty())
      continue;
    size_t eq = item.find('=');
    std::string axis = item.substr(0, eq);
    int index = axis == "dp" ? 0 : axis == "tp" ? 1 : axis == "pp" ? 2 : axis == "ep" ? 3 : -1;
    if (eq == std::string::npos || index < 0) {
      error = "'" + item + "' is not AXIS=SIZE with AXIS one of dp, tp, pp, ep";
      return false;
    }
    if (seen[index]) {
      error = "axis " + axis + " is given twice";
      return false;
    }
    seen[index] = true;
    std::string value = item.substr(eq + 1);
    char *end = nullptr;
    long long size = std::strtoll(value.c_str(), &end, 10);
    if (value.empty() || *end != '\0' || size < 1 || size > (1 << 20)) {
      error = "size of " + axis + " must be a whole number >= 1, not '" + value + "'";
      return false;
    }
    int64_t *slot[] = {&mesh.dp, &mesh.tp, &mesh.pp, &mesh.ep};
    *slot[index] = size;
  }
  out = mesh;
  return true;
}

int64_t MeshShape::axisSize(const std::string &axis) const {
  return axis == "dp" ? dp : axis == "tp" ? tp : axis == "pp" ? pp : axis == "ep" ? ep : 1;
}

int64_t MeshShape::coordinate(int64_t rank, const std::string &axis) const {
  // ep fastest, then dp, tp, pp.
  int64_t stride = 1;
  for (const char *a : {"ep", "dp", "tp", "pp"}) {
    if (axis == a)
      return (rank / stride) % axisSize(a);
    stride *= axisSize(a);
  }
  return 0;
}

} // namespace moec::moe
