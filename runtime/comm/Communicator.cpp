//===- Communicator.cpp - shared helpers of the communicators ------------===//

#include "runtime/comm/Communicator.h"

#include "absl/strings/str_cat.h"

namespace moec::runtime::comm {

size_t elementBytes(plan::DType dtype) {
  switch (dtype) {
  case plan::F32:
  case plan::I32:
    return 4;
  case plan::BF16:
  case plan::F16:
    return 2;
  case plan::I64:
    return 8;
  default:
    return 0;
  }
}

absl::Status Communicator::allToAll(const void *in, const std::vector<size_t> &sendCounts, void *out,
                                    const std::vector<size_t> &recvCounts, plan::DType dtype) {
  if (sendCounts.size() != static_cast<size_t>(size()) || recvCounts.size() != static_cast<size_t>(size()))
    return absl::InvalidArgumentError(absl::StrCat("allToAll: ", sendCounts.size(), " send and ",
                                                   recvCounts.size(), " receive counts for ", size(), " ranks"));
  std::vector<Segment> sends, recvs;
  size_t sent = 0, received = 0;
  for (int r = 0; r < size(); ++r) {
    sends.push_back({r, sent, sendCounts[r]});
    recvs.push_back({r, received, recvCounts[r]});
    sent += sendCounts[r];
    received += recvCounts[r];
  }
  return exchange(in, sends, out, recvs, dtype);
}

} // namespace moec::runtime::comm
