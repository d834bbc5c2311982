//===- HostStagedCommunicator.cpp - host collectives on device buffers ---===//

#include "runtime/comm/HostStagedCommunicator.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace moec::runtime::comm {
namespace {

class HostStagedCommunicator : public Communicator {
public:
  HostStagedCommunicator(std::unique_ptr<Communicator> host, HostTransfers transfers)
      : host(std::move(host)), transfers(std::move(transfers)) {}

  int rank() const override { return host->rank(); }
  int size() const override { return host->size(); }
  std::string name() const override { return host->name() + ", staged through host memory"; }

  absl::Status allReduce(const void *in, void *out, size_t count, plan::DType dtype) override {
    size_t bytes = count * elementBytes(dtype);
    if (absl::Status s = stageIn(in, bytes); !s.ok())
      return s;
    if (absl::Status s = host->allReduce(input.data(), input.data(), count, dtype); !s.ok())
      return s;
    return transfers.toDevice(out, input.data(), bytes);
  }

  absl::Status allGather(const void *in, void *out, size_t count, plan::DType dtype) override {
    size_t bytes = count * elementBytes(dtype);
    if (absl::Status s = stageIn(in, bytes); !s.ok())
      return s;
    output.resize(bytes * static_cast<size_t>(size()));
    if (absl::Status s = host->allGather(input.data(), output.data(), count, dtype); !s.ok())
      return s;
    return transfers.toDevice(out, output.data(), output.size());
  }

  absl::Status reduceScatter(const void *in, void *out, size_t count, plan::DType dtype) override {
    size_t bytes = count * elementBytes(dtype);
    if (absl::Status s = stageIn(in, bytes * static_cast<size_t>(size())); !s.ok())
      return s;
    output.resize(bytes);
    if (absl::Status s = host->reduceScatter(input.data(), output.data(), count, dtype); !s.ok())
      return s;
    return transfers.toDevice(out, output.data(), bytes);
  }

  absl::Status exchange(const void *in, const std::vector<Segment> &sends, void *out,
                        const std::vector<Segment> &recvs, plan::DType dtype) override {
    size_t element = elementBytes(dtype), inEnd = 0, outEnd = 0;
    for (const Segment &s : sends)
      inEnd = std::max(inEnd, s.offset + s.count);
    for (const Segment &s : recvs)
      outEnd = std::max(outEnd, s.offset + s.count);
    if (absl::Status s = stageIn(in, inEnd * element); !s.ok())
      return s;
    output.assign(outEnd * element, 0);
    if (absl::Status s = host->exchange(input.data(), sends, output.data(), recvs, dtype); !s.ok())
      return s;
    // Only the received segments: the rest of `out` is not the exchange's to write.
    for (const Segment &s : recvs)
      if (s.count > 0)
        if (absl::Status copied = transfers.toDevice(static_cast<char *>(out) + s.offset * element,
                                                     output.data() + s.offset * element, s.count * element);
            !copied.ok())
          return copied;
    return absl::OkStatus();
  }

  absl::Status broadcast(void *data, size_t count, plan::DType dtype, int root) override {
    size_t bytes = count * elementBytes(dtype);
    if (absl::Status s = stageIn(data, bytes); !s.ok())
      return s;
    if (absl::Status s = host->broadcast(input.data(), count, dtype, root); !s.ok())
      return s;
    return transfers.toDevice(data, input.data(), bytes);
  }

  absl::Status barrier() override { return host->barrier(); }

private:
  absl::Status stageIn(const void *device, size_t bytes) {
    input.resize(bytes);
    if (bytes == 0)
      return absl::OkStatus();
    return transfers.toHost(input.data(), device, bytes);
  }

  std::unique_ptr<Communicator> host;
  HostTransfers transfers;
  std::vector<char> input, output; // reused: a rank issues one collective at a time
};

} // namespace

std::unique_ptr<Communicator> makeHostStagedCommunicator(std::unique_ptr<Communicator> host,
                                                         HostTransfers transfers) {
  return std::make_unique<HostStagedCommunicator>(std::move(host), std::move(transfers));
}

} // namespace moec::runtime::comm
