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

std::vector<int64_t> balancedPlacement(const std::vector<int64_t> &load, int64_t ranks, int64_t perRank) {
  int64_t experts = static_cast<int64_t>(load.size());
  if (perRank * ranks < experts)
    return {};
  // Copies per expert: one each, then each spare slot to the expert with the most tokens per
  // copy (at most one copy per rank).
  std::vector<int64_t> copies(load.size(), 1);
  for (int64_t spare = perRank * ranks - experts; spare > 0; --spare) {
    int64_t best = -1;
    for (int64_t e = 0; e < experts; ++e)
      if (copies[e] < ranks &&
          (best < 0 || static_cast<double>(load[e]) / copies[e] > static_cast<double>(load[best]) / copies[best]))
        best = e;
    if (best < 0)
      return {};
    ++copies[best];
  }
  // Every copy with its share of the expert's tokens, busiest first (ties: expert order).
  std::vector<std::pair<double, int64_t>> items;
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t c = 0; c < copies[e]; ++c)
      items.push_back({static_cast<double>(load[e]) / copies[e], e});
  std::stable_sort(items.begin(), items.end(), [](const auto &a, const auto &b) { return a.first > b.first; });
  std::vector<std::vector<int64_t>> held(static_cast<size_t>(ranks));
  std::vector<double> tokens(static_cast<size_t>(ranks), 0);
  for (const auto &[share, e] : items) {
    int64_t best = -1;
    for (int64_t r = 0; r < ranks; ++r)
      if (static_cast<int64_t>(held[r].size()) < perRank &&
          std::find(held[r].begin(), held[r].end(), e) == held[r].end() && (best < 0 || tokens[r] < tokens[best]))
        best = r;
    if (best < 0)
      return {};
    held[best].push_back(e);
    tokens[best] += share;
  }
  std::vector<int64_t> placement;
  for (std::vector<int64_t> &experts : held) {
    std::sort(experts.begin(), experts.end());
    placement.insert(placement.end(), experts.begin(), experts.end());
  }
  return placement;
}

double rankImbalance(const std::vector<int64_t> &load, const std::vector<int64_t> &placement, int64_t ranks) {
  std::vector<int64_t> positions = placement;
  if (positions.empty()) { // consecutive ranges
    positions.resize(load.size());
    std::iota(positions.begin(), positions.end(), 0);
  }
  std::vector<int64_t> copies(load.size(), 0);
  for (int64_t e : positions)
    ++copies[static_cast<size_t>(e)];
  size_t perRank = positions.size() / static_cast<size_t>(ranks);
  std::vector<double> tokens(static_cast<size_t>(ranks), 0);
  double total = 0, busiest = 0;
  for (size_t at = 0; at < positions.size(); ++at) {
    size_t e = static_cast<size_t>(positions[at]);
    tokens[at / perRank] += static_cast<double>(load[e]) / copies[e];
  }
  for (double t : tokens) {
    total += t;
    busiest = std::max(busiest, t);
  }
  return total > 0 ? busiest * ranks / total : 1.0;
}

double otherRanksPerToken(int64_t experts, int64_t topK, int64_t ranks, const std::vector<int64_t> &placement) {
  if (ranks <= 1 || experts <= 0)
    return 0.0;
  std::vector<int64_t> consecutive;
  if (placement.empty()) {
    for (int64_t e = 0; e < experts / ranks * ranks; ++e)
      consecutive.push_back(e);
  }
  const std::vector<int64_t> &placed = placement.empty() ? consecutive : placement;
  int64_t perRank = static_cast<int64_t>(placed.size()) / ranks;
  // Each expert's ranks in placement order, as the route lists its replicas.
  std::vector<std::vector<int64_t>> replicas(static_cast<size_t>(experts));
  for (int64_t at = 0; at < perRank * ranks; ++at)
    if (placed[at] >= 0 && placed[at] < experts)
      replicas[placed[at]].push_back(at / perRank);
  // Token t's copies go to replica t mod (its expert's count): the pattern repeats every
  // `period` tokens (the least common multiple of the counts; at most 256 of them averaged).
  int64_t period = 1;
  for (const std::vector<int64_t> &on : replicas)
    if (!on.empty())
      period = std::min<int64_t>(256, std::lcm(period, static_cast<int64_t>(on.size())));
  // P(a token goes to a rank m of whose experts send there) = 1 - C(E - m, k) / C(E, k).
  auto reaches = [&](int64_t m) {
    double none = 1.0;
    for (int64_t i = 0; i < topK && i < experts; ++i)
      none *= std::max<double>(0.0, double(experts - m - i) / double(experts - i));
    return 1.0 - none;
  };
  double sum = 0.0;
  std::vector<int64_t> sendsTo(static_cast<size_t>(ranks));
  for (int64_t me = 0; me < ranks; ++me)
    for (int64_t t = 0; t < period; ++t) {
      std::fill(sendsTo.begin(), sendsTo.end(), 0);
      for (const std::vector<int64_t> &on : replicas) {
        if (on.empty() || std::find(on.begin(), on.end(), me) != on.end())
          continue; // stays on this rank (or no rank holds it)
        ++sendsTo[static_cast<size_t>(on[static_cast<size_t>(t % static_cast<int64_t>(on.size()))])];
      }
      for (int64_t r = 0; r < ranks; ++r)
        if (r != me)
          sum += reaches(sendsTo[static_cast<size_t>(r)]);
    }
  return sum / double(ranks * period);
}

} // namespace moec::analysis
