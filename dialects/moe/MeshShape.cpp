//===- MeshShape.cpp - the device mesh: dp x tp x pp x ep ranks ----------===//

#include "dialects/moe/MeshShape.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <vector>

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

namespace {

std::vector<std::string> split(const std::string &text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ','))
    items.push_back(item);
  return items;
}

} // namespace

std::string MeshShape::spec() const {
  return order == kDefaultOrder ? str() : str() + ";order=" + order;
}

bool MeshShape::parseOrder(const std::string &text, std::string &out, std::string &error) {
  std::vector<std::string> axes;
  if (text.empty()) {
    error = "no axes; a rank order lists axes, the fastest first";
    return false;
  }
  std::vector<std::string> items = split(text);
  if (text.back() == ',')
    items.push_back(""); // getline drops a trailing empty item
  for (const std::string &axis : items) {
    if (axis != "dp" && axis != "tp" && axis != "pp" && axis != "ep") {
      error = "'" + axis + "' is not an axis (dp, tp, pp, ep); a rank order lists axes, the fastest first";
      return false;
    }
    if (std::find(axes.begin(), axes.end(), axis) != axes.end()) {
      error = "axis " + axis + " is listed twice";
      return false;
    }
    axes.push_back(axis);
  }
  for (const std::string &axis : split(kDefaultOrder))
    if (std::find(axes.begin(), axes.end(), axis) == axes.end())
      axes.push_back(axis);
  out.clear();
  for (const std::string &axis : axes)
    out += (out.empty() ? "" : ",") + axis;
  return true;
}

bool MeshShape::parse(const std::string &whole, MeshShape &out, std::string &error) {
  MeshShape mesh;
  std::string text = whole;
  if (size_t semi = whole.find(';'); semi != std::string::npos) {
    text = whole.substr(0, semi);
    std::string rest = whole.substr(semi + 1);
    if (rest.rfind("order=", 0) != 0) {
      error = "'" + rest + "' after ';' is not order=AXES";
      return false;
    }
    if (!parseOrder(rest.substr(6), mesh.order, error))
      return false;
  }
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

int64_t MeshShape::stride(const std::string &axis) const {
  int64_t stride = 1;
  for (const std::string &a : split(order)) {
    if (axis == a)
      return stride;
    stride *= axisSize(a);
  }
  return stride;
}

int64_t MeshShape::coordinate(int64_t rank, const std::string &axis) const {
  return (rank / stride(axis)) % axisSize(axis);
}

} // namespace moec::moe
