//===- ExpertPlacement.cpp - which experts live on which ep rank ----------===//

#include "compiler/analysis/ExpertPlacement.h"

#include <algorithm>
#include <numeric>

#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

namespace moec::analysis {

namespace {

bool readFile(const std::string &path, std::string &text, std::string &error) {
  auto buffer = llvm::MemoryBuffer::getFile(path);
  if (!buffer) {
    error = path + ": cannot read: " + buffer.getError().message();
    return false;
  }
  text = (*buffer)->getBuffer().str();
  return true;
}

bool layerIndex(const std::string &key, int64_t &index) {
  if (key.empty() || !std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return false;
  index = std::stoll(key);
  return true;
}

} // namespace

bool readExpertPlacement(const std::string &path, int64_t ranks, ExpertPlacement &out, std::string &error) {
  std::string text;
  if (!readFile(path, text, error))
    return false;
  llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(text);
  if (!parsed) {
    error = path + ": not JSON: " + llvm::toString(parsed.takeError());
    return false;
  }
  const llvm::json::Object *layers = parsed->getAsObject() ? parsed->getAsObject()->getObject("layers") : nullptr;
  if (!layers) {
    error = path + ": expected {\"layers\": {\"<layer index>\": [[experts of ep rank 0], ...]}}";
    return false;
  }
  for (const auto &[key, value] : *layers) {
    std::string field = "layers." + key.str();
    int64_t index;
    if (!layerIndex(key.str(), index)) {
      error = path + ": field '" + field + "': expected a layer index as the key";
      return false;
    }
    const llvm::json::Array *perRank = value.getAsArray();
    if (!perRank || static_cast<int64_t>(perRank->size()) != ranks) {
      error = path + ": field '" + field + "': expected " + std::to_string(ranks) +
              " lists of experts (one per ep rank)";
      return false;
    }
    std::vector<int64_t> &table = out[index];
    size_t width = 0;
    for (const llvm::json::Value &rank : *perRank) {
      const llvm::json::Array *experts = rank.getAsArray();
      if (!experts || (width && experts->size() != width) || experts->empty()) {
        error = path + ": field '" + field + "': every ep rank must list the same number of experts";
        return false;
      }
      width = experts->size();
      for (const llvm::json::Value &e : *experts) {
        std::optional<int64_t> expert = e.getAsInteger();
        if (!expert) {
          error = path + ": field '" + field + "': expected expert numbers";
          return false;
        }
        table.push_back(*expert);
      }
    }
  }
  return true;
}

bool readExpertLoad(const std::string &path, std::map<int64_t, std::vector<int64_t>> &out, std::string &error) {
  std::string text;
  if (!readFile(path, text, error))
    return false;
  int line = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    std::string row = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? text.size() : end + 1;
    ++line;
    if (row.find_first_not_of(" \t\r") == std::string::npos)
      continue;
    std::string where = path + ":" + std::to_string(line);
    llvm::Expected<llvm::json::Value> parsed = llvm::json::parse(row);
    if (!parsed) {
      error = where + ": not JSON: " + llvm::toString(parsed.takeError());
      return false;
    }
    const llvm::json::Object *load = parsed->getAsObject() ? parsed->getAsObject()->getObject("expert_load") : nullptr;
    if (!load) {
      error = where + ": no 'expert_load' (expected moe-run's metrics.jsonl)";
      return false;
    }
    for (const auto &[key, value] : *load) {
      int64_t index;
      const llvm::json::Object *layer = value.getAsObject();
      const llvm::json::Array *tokens = layer ? layer->getArray("tokens") : nullptr;
      if (!layerIndex(key.str(), index) || !tokens) {
        error = where + ": field 'expert_load." + key.str() + "': expected {\"tokens\": [...]} under a layer index";
        return false;
      }
      std::vector<int64_t> &sum = out[index];
      if (!sum.empty() && sum.size() != tokens->size()) {
        error = where + ": field 'expert_load." + key.str() + ".tokens': " + std::to_string(tokens->size()) +
                " experts, earlier lines had " + std::to_string(sum.size());
        return false;
      }
      sum.resize(tokens->size(), 0);
      for (size_t e = 0; e < tokens->size(); ++e)
        sum[e] += (*tokens)[e].getAsInteger().value_or(0);
    }
  }
  if (out.empty()) {
    error = path + ": no expert load in any line";
    return false;
  }
  return true;
}

std::vector<int64_t> balancedPlacement(const std::vector<int64_t> &load, int64_t ranks) {
  int64_t experts = static_cast<int64_t>(load.size()), room = experts / ranks;
  std::vector<int64_t> order(load.size());
  std::iota(order.begin(), order.end(), 0);
  // Busiest first; equal loads keep expert order, so the result is deterministic.
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return load[a] > load[b]; });
  std::vector<std::vector<int64_t>> held(static_cast<size_t>(ranks));
  std::vector<int64_t> tokens(static_cast<size_t>(ranks), 0);
  for (int64_t e : order) {
    int64_t best = -1;
    for (int64_t r = 0; r < ranks; ++r)
      if (static_cast<int64_t>(held[r].size()) < room && (best < 0 || tokens[r] < tokens[best]))
        best = r;
    held[best].push_back(e);
    tokens[best] += load[e];
  }
  std::vector<int64_t> placement;
  for (std::vector<int64_t> &experts : held) {
    std::sort(experts.begin(), experts.end());
    placement.insert(placement.end(), experts.begin(), experts.end());
  }
  return placement;
}

double rankImbalance(const std::vector<int64_t> &load, const std::vector<int64_t> &placement, int64_t ranks) {
  int64_t room = static_cast<int64_t>(load.size()) / ranks, total = 0, busiest = 0;
  std::vector<int64_t> tokens(static_cast<size_t>(ranks), 0);
  for (size_t at = 0; at < load.size(); ++at)
    tokens[at / room] += load[placement.empty() ? at : placement[at]];
  for (int64_t t : tokens) {
    total += t;
    busiest = std::max(busiest, t);
  }
  return total ? static_cast<double>(busiest) * ranks / total : 1.0;
}

} // namespace moec::analysis
