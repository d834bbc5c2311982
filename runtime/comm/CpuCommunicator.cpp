//===- CpuCommunicator.cpp - ranks as threads of one process -------------===//

#include "runtime/comm/CpuCommunicator.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/weights/DType.h"

namespace moec::runtime::comm {

/// One rendezvous per group: a generation-counting barrier plus each rank's
/// published buffers for the collective in progress.
class CpuGroup {
public:
  CpuGroup(int size, double timeoutSeconds)
      : size(size), timeout(timeoutSeconds), published(size) {}

  struct Published {
    const void *in = nullptr;
    const std::vector<Communicator::Segment> *sends = nullptr; // exchange only
  };

  /// Waits for all ranks; fails every waiter after the timeout, and every later
  /// collective too (a group that lost a rank cannot resynchronise). A barrier that
  /// completed succeeds even when the group broke right after. `evenIfBroken`: the second
  /// barrier of a collective, which every rank reaches once all passed the first (they only
  /// copy in between): it must hold each rank until the others stopped reading its buffers,
  /// broken group or not.
  absl::Status arrive(const char *what, bool evenIfBroken = false) {
    std::unique_lock<std::mutex> lock(mutex);
    if (!broken.empty() && !evenIfBroken)
      return absl::DeadlineExceededError(broken);
    uint64_t generation = this->generation;
    if (++arrived == size) {
      arrived = 0;
      ++this->generation;
      changed.notify_all();
      return absl::OkStatus();
    }
    bool done = changed.wait_for(lock, std::chrono::duration<double>(timeout), [&] {
      return this->generation != generation || (!evenIfBroken && !broken.empty());
    });
    if (this->generation != generation)
      return absl::OkStatus();
    if (!broken.empty())
      return absl::DeadlineExceededError(broken);
    if (!done) {
      broken = absl::StrCat("cpu communicator: ", what, " timed out after ", timeout, " s: ",
                            size - arrived, " of ", size, " ranks never arrived");
      changed.notify_all();
      return absl::DeadlineExceededError(broken);
    }
    return absl::OkStatus();
  }

  void abort(const std::string &why) {
    std::lock_guard<std::mutex> lock(mutex);
    if (broken.empty())
      broken = why;
    changed.notify_all();
  }

  const int size;
  const double timeout;
  std::vector<Published> published;

private:
  std::mutex mutex;
  std::condition_variable changed;
  int arrived = 0;
  uint64_t generation = 0;
  std::string broken;
};

namespace {

/// Adds `count` elements of `src` into the f64 accumulator (sums in rank order).
absl::Status accumulate(std::vector<double> &sum, const void *src, size_t count, plan::DType dtype) {
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
    case plan::F32: sum[i] += static_cast<const float *>(src)[i]; break;
    case plan::BF16: sum[i] += weights::bf16ToF32(static_cast<const uint16_t *>(src)[i]); break;
    case plan::F16: sum[i] += weights::f16ToF32(static_cast<const uint16_t *>(src)[i]); break;
    case plan::I32: sum[i] += static_cast<const int32_t *>(src)[i]; break;
    case plan::I64: sum[i] += static_cast<const int64_t *>(src)[i]; break;
    default: return absl::InvalidArgumentError("cpu communicator: unsupported dtype");
    }
  }
  return absl::OkStatus();
}

void store(const std::vector<double> &sum, void *dst, plan::DType dtype) {
  for (size_t i = 0; i < sum.size(); ++i) {
    switch (dtype) {
    case plan::F32: static_cast<float *>(dst)[i] = static_cast<float>(sum[i]); break;
    case plan::BF16: static_cast<uint16_t *>(dst)[i] = weights::f32ToBf16(static_cast<float>(sum[i])); break;
    case plan::F16: static_cast<uint16_t *>(dst)[i] = weights::f32ToF16(static_cast<float>(sum[i])); break;
    case plan::I32: static_cast<int32_t *>(dst)[i] = static_cast<int32_t>(sum[i]); break;
    case plan::I64: static_cast<int64_t *>(dst)[i] = static_cast<int64_t>(sum[i]); break;
    default: break;
    }
  }
}

class CpuCommunicator final : public Communicator {
public:
  CpuCommunicator(std::shared_ptr<CpuGroup> group, int rank) : group(std::move(group)), me(rank) {}

  int rank() const override { return me; }
  int size() const override { return group->size; }
  std::string name() const override { return "cpu threads"; }

  absl::Status allReduce(const void *in, void *out, size_t count, plan::DType dtype) override {
    return reduce("allReduce", in, out, count, dtype, /*offset=*/0);
  }
  absl::Status reduceScatter(const void *in, void *out, size_t count, plan::DType dtype) override {
    return reduce("reduceScatter", in, out, count, dtype, count * me);
  }

  absl::Status allGather(const void *in, void *out, size_t count, plan::DType dtype) override {
    size_t bytes = count * elementBytes(dtype);
    std::vector<char> result(bytes * size());
    return rendezvous("allGather", in, out, result, [&] {
      for (int r = 0; r < size(); ++r)
        std::memcpy(result.data() + r * bytes, group->published[r].in, bytes);
      return absl::OkStatus();
    });
  }

  absl::Status broadcast(void *data, size_t count, plan::DType dtype, int root) override {
    if (root < 0 || root >= size())
      return absl::InvalidArgumentError(absl::StrCat("broadcast: root ", root, " of ", size(), " ranks"));
    size_t bytes = count * elementBytes(dtype);
    std::vector<char> result(bytes);
    return rendezvous("broadcast", data, data, result, [&] {
      std::memcpy(result.data(), group->published[root].in, bytes);
      return absl::OkStatus();
    });
  }

  absl::Status exchange(const void *in, const std::vector<Segment> &sends, void *out,
                        const std::vector<Segment> &recvs, plan::DType dtype) override {
    size_t element = elementBytes(dtype);
    for (const std::vector<Segment> *list : {&sends, &recvs})
      for (const Segment &s : *list)
        if (s.peer < 0 || s.peer >= size())
          return absl::InvalidArgumentError(absl::StrCat("exchange: peer ", s.peer, " of ", size(), " ranks"));
    group->published[me] = {in, &sends};
    if (absl::Status s = group->arrive("exchange"); !s.ok())
      return s;
    // Each receive from p takes p's next send to this rank; `out` is ours alone, and no
    // rank writes any `in`, so the copies go straight in.
    absl::Status matched = absl::OkStatus();
    std::vector<size_t> next(size(), 0);
    for (const Segment &r : recvs) {
      const std::vector<Segment> &theirs = *group->published[r.peer].sends;
      size_t &k = next[r.peer];
      while (k < theirs.size() && theirs[k].peer != me)
        ++k;
      if (k == theirs.size() || theirs[k].count != r.count) {
        matched = absl::InvalidArgumentError(absl::StrCat(
            "exchange: rank ", me, " receives ", r.count, " elements from rank ", r.peer, ", which ",
            k == theirs.size() ? std::string("sends it nothing more") : absl::StrCat("sends ", theirs[k].count)));
        break;
      }
      std::memcpy(static_cast<char *>(out) + r.offset * element,
                  static_cast<const char *>(group->published[r.peer].in) + theirs[k].offset * element,
                  r.count * element);
      ++k;
    }
    if (absl::Status s = group->arrive("exchange", /*evenIfBroken=*/true); !s.ok())
      return s;
    return matched;
  }

  absl::Status barrier() override { return group->arrive("barrier"); }

private:
  absl::Status reduce(const char *what, const void *in, void *out, size_t count, plan::DType dtype,
                      size_t offset) {
    if (elementBytes(dtype) == 0)
      return absl::InvalidArgumentError(absl::StrCat(what, ": unsupported dtype ", plan::DType_Name(dtype)));
    std::vector<char> result(count * elementBytes(dtype));
    return rendezvous(what, in, out, result, [&]() -> absl::Status {
      std::vector<double> sum(count, 0.0);
      size_t skip = offset * elementBytes(dtype);
      for (int r = 0; r < size(); ++r)
        if (absl::Status s = accumulate(sum, static_cast<const char *>(group->published[r].in) + skip, count,
                                        dtype);
            !s.ok())
          return s;
      store(sum, result.data(), dtype);
      return absl::OkStatus();
    });
  }

  /// Publish `in`, wait for all, compute this rank's `result` from everyone's
  /// published buffers, wait again (so no rank overwrites an input another still
  /// reads, in-place collectives included), then write `out`.
  template <typename Compute>
  absl::Status rendezvous(const char *what, const void *in, void *out, std::vector<char> &result,
                          Compute compute) {
    group->published[me] = {in, nullptr};
    if (absl::Status s = group->arrive(what); !s.ok())
      return s;
    absl::Status computed = compute();
    if (absl::Status s = group->arrive(what, /*evenIfBroken=*/true); !s.ok())
      return s;
    if (!computed.ok())
      return computed;
    if (!result.empty())
      std::memcpy(out, result.data(), result.size());
    return absl::OkStatus();
  }

  std::shared_ptr<CpuGroup> group;
  int me;
};

} // namespace

std::shared_ptr<CpuGroup> makeCpuGroup(int size, double timeoutSeconds) {
  return std::make_shared<CpuGroup>(size, timeoutSeconds);
}

void abortCpuGroup(CpuGroup &group, const std::string &why) { group.abort(why); }

std::unique_ptr<Communicator> makeCpuCommunicator(std::shared_ptr<CpuGroup> group, int rank) {
  return std::make_unique<CpuCommunicator>(std::move(group), rank);
}

} // namespace moec::runtime::comm
