//===- ExpertPlacement.h - which experts live on which ep rank -*- C++ -*-===//
//
// moec --expert-placement FILE gives each MoE layer's experts per ep rank;
// moec --expert-load METRICS.jsonl computes one from the tokens per expert
// that moe-run measured (its metrics.jsonl): the busiest experts first, each
// to the rank with the fewest tokens so far that has room (every rank holds
// E / ep experts, or more with --replicate-experts: copies of the busiest). The placement becomes the model's `expert_placement`
// attribute, which --moe-propagate-sharding checks and plan emission turns
// into each route's table and each rank's expert weights.
//
//===----------------------------------------------------------------------===//

#ifndef COMPILER_ANALYSIS_EXPERTPLACEMENT_H_
#define COMPILER_ANALYSIS_EXPERTPLACEMENT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace moec::analysis {

/// Per layer index: the experts of ep rank 0, then rank 1's, ... (E entries).
using ExpertPlacement = std::map<int64_t, std::vector<int64_t>>;

/// Reads `{"layers": {"3": [[experts of rank 0], [rank 1], ...], ...}}`. Fails with a message
/// naming the file and the field unless every layer lists `ranks` lists of equal length.
bool readExpertPlacement(const std::string &path, int64_t ranks, ExpertPlacement &out, std::string &error);

/// Tokens per expert per layer, summed over every line of moe-run's metrics.jsonl
/// (`"expert_load": {"3": {"tokens": [...]}}`).
bool readExpertLoad(const std::string &path, std::map<int64_t, std::vector<int64_t>> &out, std::string &error);

/// The placement of `load.size()` experts over `ranks` ranks that balances their tokens, with
/// `perRank` experts on each (E / ranks, or more: the spare slots replicate the experts with
/// the most tokens per copy, one more copy at a time, and a replicated expert's tokens split
/// evenly over its copies). The busiest copy first, each to the least loaded rank with room
/// that does not hold its expert yet. Empty if the copies cannot be spread that way.
std::vector<int64_t> balancedPlacement(const std::vector<int64_t> &load, int64_t ranks, int64_t perRank);

/// Tokens of the busiest rank over the mean (1 = balanced) for `placement` (empty:
/// consecutive ranges; a replicated expert's tokens split evenly over its copies).
double rankImbalance(const std::vector<int64_t> &load, const std::vector<int64_t> &placement, int64_t ranks);

/// The expected number of other ranks one token is sent to, averaged over the `ranks` senders,
/// with uniform top-`topK` routing over `experts` experts placed by `placement` (empty:
/// consecutive ranges). A copy whose expert is on the sending rank stays there; another goes to
/// one of its expert's replicas, token t's to replica t mod their count, as the runtime's route
/// picks (runtime/exec/ExpertExchange.cpp). For one such t, rank r gets the token unless none of
/// its k distinct experts sends it there: 1 - C(E - m, k) / C(E, k), m the experts that do;
/// averaged over t (exact when the tokens are a multiple of the replica counts' least common
/// multiple, up to 256).
double otherRanksPerToken(int64_t experts, int64_t topK, int64_t ranks, const std::vector<int64_t> &placement);

} // namespace moec::analysis

#endif // COMPILER_ANALYSIS_EXPERTPLACEMENT_H_
