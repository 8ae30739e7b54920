"""meshrt: Python bindings of libmesh, the Mesh worker library.

A worker started by a Mesh agent (or with the MESH_* variables set by hand)
joins its job with :func:`init` and gets the coordinator's key-value store,
process groups with collectives on any DLPack tensor (torch, numpy), device
meshes and sharded tensors. :class:`JobClient` drives jobs the way meshctl
does. docs/python.md has the whole story.

    import meshrt, torch
    rt = meshrt.init(hostname="127.0.0.1")
    mesh = rt.init_device_mesh((2, 2), ("dp", "tp"))
    t = torch.ones(4)
    mesh.get_group("tp").all_reduce(t)          # in place, zero-copy
    rt.finish()

Every error is a :class:`Error` carrying ``.code`` (the status code name,
e.g. ``"ABORTED"``) and ``.message``.
"""

from meshrt._meshrt import (
    DeviceMesh,
    DLPackTensor,
    DTensor,
    ElasticMesh,
    Error,
    GroupProgress,
    InvalidArgumentError,
    Job,
    JobClient,
    JobFailedError,
    NotFoundError,
    Partial,
    Placement,
    ProcessGroup,
    ReduceOp,
    Replicate,
    Runtime,
    Shard,
    Store,
    TimeoutError,
    UnavailableError,
    Work,
    compute_local_shape_and_offset,
    distribute_tensor,
    init,
)

__all__ = [
    "DeviceMesh",
    "DLPackTensor",
    "DTensor",
    "ElasticMesh",
    "Error",
    "GroupProgress",
    "InvalidArgumentError",
    "Job",
    "JobClient",
    "JobFailedError",
    "NotFoundError",
    "Partial",
    "Placement",
    "ProcessGroup",
    "ReduceOp",
    "Replicate",
    "Runtime",
    "Shard",
    "Store",
    "TimeoutError",
    "UnavailableError",
    "Work",
    "compute_local_shape_and_offset",
    "distribute_tensor",
    "init",
]
