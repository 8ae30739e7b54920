// Hooks through which libmesh's internals record worker metrics
// (docs/metrics.md, "Worker") without knowing whether metrics are on.
//
// Each hook is a no-op (one relaxed atomic load) unless a Runtime of this
// process serves metrics (MESH_METRICS_PORT, see worker_metrics.h); then it
// records into that Runtime's registry.
//
// Thread safety: thread-safe.
#pragma once

#include "mesh/redistribute_plan.h"

namespace mesh::internal {

// One executed step of a redistribute plan: increments
// mesh_redistribute_steps_total{op=RedistributeOpName(op)}. The DTensor
// executor calls it once per step it runs (local steps included).
void RecordRedistributeStep(RedistributeOp op);

}  // namespace mesh::internal
