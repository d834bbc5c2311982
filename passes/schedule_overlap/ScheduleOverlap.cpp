//===- ScheduleOverlap.cpp - communication on its own stream --------------===//

#include "passes/schedule_overlap/ScheduleOverlap.h"

#include "mlir/IR/Builders.h"

namespace moec::passes {

#define GEN_PASS_DEF_SCHEDULEOVERLAPPASS
#include "passes/schedule_overlap/ScheduleOverlap.h.inc"

namespace {

using namespace mlir;

class ScheduleOverlapPass : public impl::ScheduleOverlapPassBase<ScheduleOverlapPass> {
public:
  using ScheduleOverlapPassBase::ScheduleOverlapPassBase;

  void runOnOperation() override {
    moe::ModelOp model = getOperation();
    if (model->hasAttr(moe::kStreamsAttr)) {
      model.emitError("--moe-schedule-overlap: the model is scheduled already (streams = ")
          << model->getAttr(moe::kStreamsAttr) << ")";
      return signalPassFailure();
    }
    Builder b(model.getContext());
    int64_t moved = 0;
    // Templates and step functions alike: the plan instantiates a template once per layer.
    model.walk([&](Operation *op) {
      if (!isa<moe::EpRouteOp, moe::EpSendOp, moe::EpReturnOp, moe::AllReduceGradsOp>(op))
        return;
      op->setAttr(moe::kStreamAttr, b.getI64IntegerAttr(kCommunicationStream));
      ++moved;
    });
    if (moved == 0) {
      model.emitWarning("--moe-schedule-overlap: nothing to overlap (no expert exchange or gradient sums: "
                        "one rank, or a mesh of tp/pp only); the plan keeps one stream");
      return;
    }
    model->setAttr(moe::kStreamsAttr, b.getI64IntegerAttr(kCommunicationStream + 1));
  }

private:
  static constexpr int64_t kCommunicationStream = 1;
};

} // namespace
} // namespace moec::passes
