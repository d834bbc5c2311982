//===- ScheduleOverlap.td - communication on its own stream -*- tablegen -*-===//

#ifndef PASSES_SCHEDULE_OVERLAP_SCHEDULEOVERLAP_TD_
#define PASSES_SCHEDULE_OVERLAP_SCHEDULEOVERLAP_TD_

include "mlir/Pass/PassBase.td"

def ScheduleOverlapPass : Pass<"moe-schedule-overlap", "::moec::moe::ModelOp"> {
  let summary = "Puts the collectives that can overlap compute on a communication stream.";
  let description = [{
    Runs last before `--moe-plan-memory`, on a model placed on a mesh. The
    expert exchange (`moe.ep_route`, `moe.ep_send`, `moe.ep_return`) and the
    per-layer gradient sums (`moe.all_reduce_grads`) get `stream = 1`: the
    plan issues them on a second stream, the compute stays on stream 0, and
    the model gets `streams = 2`. The ops keep their order, which is the
    order the host issues them in: with `token-blocks = 2`
    (`--moe-propagate-sharding`) block 1's route and sends come after block
    0's experts and before block 0's return, so they run while block 0's
    experts compute, and block 0's return while block 1's do (the backward,
    built in reverse, likewise); a layer's gradient sum runs while the
    layers before it are differentiated.

    Plan building turns the streams into events: a step that reads or
    writes what a step on the other stream wrote or read waits for an event
    recorded right after that step (never for more work on that stream than
    it needs), and a buffer's memory is reused only once every stream has
    waited for its last use. The tensor-parallel all-reduces and the
    pipeline exchanges (whose results the next op needs at once) stay on
    stream 0.

    A model without those collectives (one rank, or only tp/pp) is left as
    it is, with a warning.
  }];
  let dependentDialects = ["::moec::moe::MoeDialect"];
}

#endif // PASSES_SCHEDULE_OVERLAP_SCHEDULEOVERLAP_TD_
