// The whole public API of libmesh in one include, for programs that prefer
// it to naming each header. Each header documents its own contract.
//
// Backends that are optional in a build (NCCL: mesh/process_group_nccl.h)
// are not included here; include them by name.
#pragma once

#include "mesh/build_info.h"          // IWYU pragma: export
#include "mesh/coordinator_store.h"   // IWYU pragma: export
#include "mesh/device.h"              // IWYU pragma: export
#include "mesh/device_mesh.h"         // IWYU pragma: export
#include "mesh/dlpack.h"              // IWYU pragma: export
#include "mesh/dtensor.h"             // IWYU pragma: export
#include "mesh/dtype.h"               // IWYU pragma: export
#include "mesh/elastic_mesh.h"        // IWYU pragma: export
#include "mesh/float16.h"             // IWYU pragma: export
#include "mesh/in_memory_store.h"     // IWYU pragma: export
#include "mesh/mesh_layout.h"         // IWYU pragma: export
#include "mesh/placement.h"           // IWYU pragma: export
#include "mesh/prefix_store.h"        // IWYU pragma: export
#include "mesh/process_group.h"       // IWYU pragma: export
#include "mesh/process_group_gloo.h"  // IWYU pragma: export
#include "mesh/progress.h"            // IWYU pragma: export
#include "mesh/redistribute_plan.h"   // IWYU pragma: export
#include "mesh/runtime.h"             // IWYU pragma: export
#include "mesh/store.h"               // IWYU pragma: export
#include "mesh/tensor.h"              // IWYU pragma: export
#include "mesh/work.h"                // IWYU pragma: export
