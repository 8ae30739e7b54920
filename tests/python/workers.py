"""Worker programs of the meshrt tests (tests/python/test_workers.py).

Run as `python3 workers.py <scenario>` with the MESH_* variables set; each
scenario checks its results against torch's own and prints "OK <scenario>"
at the end. Any failed check raises, so the process exits non-zero with a
traceback naming the check.
"""

import os
import sys
import threading
import time

import numpy as np
import torch

import meshrt

HOST = "127.0.0.1"


def expect_raises(exc_type, fn, *args, contains=None, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc_type as e:
        if contains is not None and contains not in str(e):
            raise AssertionError(f"{exc_type.__name__} without {contains!r}: {e}") from e
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} did not raise {exc_type.__name__}")


def seeded(rank, *shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(*shape, generator=g).to(dtype)


# ---- core: 4 ranks, job mesh (2, 2) named dp, tp ---------------------------

def check_runtime(rt):
    r = int(os.environ["MESH_RANK"])
    assert rt.rank == r and rt.world_size == 4, (rt.rank, rt.world_size)
    assert rt.job_id == os.environ["MESH_JOB_ID"]
    assert rt.generation == 0
    assert rt.mesh_shape == (2, 2) and rt.mesh_dim_names == ("dp", "tp"), rt.mesh_shape
    assert rt.num_nodes == 1 and rt.node_rank == 0
    assert rt.local_world_size == 4 and 0 <= rt.local_rank < 4
    assert rt.backend == "gloo"
    rt.health()  # Raises on failure.


def check_store(rt):
    r, n = rt.rank, rt.world_size
    s = rt.store
    assert s is rt.store
    assert s.timeout == 300.0, s.timeout
    s.set(f"k{r}", f"v{r}")
    keys = [f"k{i}" for i in range(n)]
    s.wait(keys, timeout=20)
    assert s.multi_get(keys, timeout=20) == [f"v{i}".encode() for i in range(n)]
    assert s.get(f"k{(r + 1) % n}") == f"v{(r + 1) % n}".encode()
    assert s.try_get("missing-key") is None
    assert s.try_get(f"k{r}") == f"v{r}".encode()
    # UTF-8 for str values; bytes (NUL included) as they are.
    s.set(f"u{r}", "é")
    assert s.get(f"u{r}") == "é".encode("utf-8")
    s.multi_set([f"m{r}a", f"m{r}b"], [b"\x00\x01", "two"])
    assert s.multi_get([f"m{r}a", f"m{r}b"]) == [b"\x00\x01", b"two"]
    # Counter barrier through add.
    assert isinstance(s.add("count", 1), int)
    s.add("count", 0)
    deadline = time.monotonic() + 20
    while int(s.get("count")) < n:
        assert time.monotonic() < deadline, "add-based barrier timed out"
        time.sleep(0.01)
    # compare_set, c10d's return values.
    if r == 0:
        assert s.compare_set("cas", None, "a") == b"a"          # absent -> created
        assert s.compare_set("cas", "zzz", "b") == b"a"         # mismatch -> current value
        assert s.compare_set("cas", b"a", b"b") == b"b"         # swapped -> desired
        assert s.compare_set("cas-absent", "x", "y") == b"x"    # absent, expected -> expected
        assert s.try_get("cas-absent") is None
        s.set("tmp", "1")
        assert s.delete_key("tmp") is True
        assert s.delete_key("tmp") is False
    assert s.num_keys() >= n
    # Timeouts: meshrt.TimeoutError is also the builtin TimeoutError.
    start = time.monotonic()
    e = expect_raises(meshrt.TimeoutError, s.get, "never-set", timeout=0.2)
    assert isinstance(e, TimeoutError) and isinstance(e, meshrt.Error)
    assert e.code == "DEADLINE_EXCEEDED" and "never-set" in e.message, (e.code, e.message)
    assert time.monotonic() - start < 5
    expect_raises(meshrt.TimeoutError, s.wait, ["never-set"], timeout=0.2)
    expect_raises(meshrt.TimeoutError, s.multi_get, ["never-set"], timeout=0.2)
    expect_raises(meshrt.InvalidArgumentError, s.get, "k0", timeout=-1)
    # A blocking get in another thread releases the GIL: this thread runs
    # Python meanwhile and sets the key it waits for.
    got = []
    t = threading.Thread(target=lambda: got.append(s.get(f"late{r}", timeout=20)))
    t.start()
    time.sleep(0.1)
    s.set(f"late{r}", b"here")
    t.join(timeout=20)
    assert got == [b"here"], got
    # Wrong types say so.
    expect_raises(TypeError, s.set, b"bytes-key", b"v", contains="key must be str")
    expect_raises(TypeError, s.get, 7, contains="key must be str")
    expect_raises(TypeError, s.set, "k", 3.5, contains="bytes or str")
    expect_raises(TypeError, s.wait, "not-a-list", contains="list of str")
    expect_raises(TypeError, s.multi_get, [1, 2], contains="key must be str")


def check_collectives(rt):
    r, n = rt.rank, rt.world_size
    w = rt.world()
    assert (w.rank, w.size, w.backend) == (r, n, "gloo"), w
    assert w.ranks == list(range(n))

    t = torch.full((5,), float(r + 1))
    assert w.all_reduce(t) is None
    assert torch.equal(t, torch.full((5,), float(sum(range(1, n + 1))))), t
    t = torch.tensor([r, -r], dtype=torch.float64)
    w.all_reduce(t, op="max")
    assert t.tolist() == [n - 1, 0], t
    t = torch.tensor([float(r)])
    w.all_reduce(t, op=meshrt.ReduceOp.MIN)
    assert t.item() == 0
    t = torch.tensor([float(r + 1)] * 3)
    w.all_reduce(t, op="avg")
    assert torch.allclose(t, torch.full((3,), (n + 1) / 2)), t
    t = torch.arange(4, dtype=torch.int64) * (r + 1)
    w.all_reduce(t, op="sum")
    assert torch.equal(t, torch.arange(4) * sum(range(1, n + 1)))
    # Random data against torch's own sum.
    t = seeded(r, 33)
    w.all_reduce(t)
    assert torch.allclose(t, sum(seeded(i, 33) for i in range(n)), atol=1e-5)
    # Non-contiguous views (staged) and numpy arrays, zero-copy both.
    base = torch.ones(4, 4)
    col = base[:, 1]
    w.all_reduce(col)
    assert torch.equal(base[:, 1], torch.full((4,), float(n))) and base[0, 0] == 1
    a = np.arange(4, dtype=np.float32) + r
    w.all_reduce(a)
    assert np.array_equal(a, np.arange(4, dtype=np.float32) * n + sum(range(n))), a

    t = torch.arange(6, dtype=torch.float32) * (r + 1)
    w.broadcast(t, src=2)
    assert torch.equal(t, torch.arange(6, dtype=torch.float32) * 3)

    t = torch.full((3,), float(r))
    w.reduce(t, dst=1)
    if r == 1:
        assert torch.equal(t, torch.full((3,), float(sum(range(n)))))

    out = torch.full((n * 3,), float("nan"))
    w.all_gather(out, seeded(r, 3))
    assert torch.equal(out, torch.cat([seeded(i, 3) for i in range(n)]))

    out = torch.full((2,), float("nan"))
    w.reduce_scatter(out, seeded(r, n * 2))
    expected = sum(seeded(i, n * 2) for i in range(n))[2 * r:2 * r + 2]
    assert torch.allclose(out, expected, atol=1e-5), (out, expected)

    inp = torch.arange(n * 2, dtype=torch.int32) + 100 * r
    out = torch.full((n * 2,), -1, dtype=torch.int32)
    w.all_to_all_single(out, inp)
    expected = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.int32) + 100 * j
                          for j in range(n)])
    assert torch.equal(out, expected), (out, expected)
    # Uneven splits: every rank sends j + 1 rows to rank j.
    in_splits = [j + 1 for j in range(n)]
    out_splits = [r + 1] * n
    inp = torch.full((sum(in_splits), 2), float(r))
    out = torch.full((sum(out_splits), 2), -1.0)
    w.all_to_all_single(out, inp, out_splits, in_splits)
    expected = torch.cat([torch.full((r + 1, 2), float(j)) for j in range(n)])
    assert torch.equal(out, expected), out

    # Point to point around a ring.
    send = torch.full((4,), float(r))
    recv = torch.empty(4)
    if r % 2 == 0:
        w.send(send, dst=(r + 1) % n)
        w.recv(recv, src=(r - 1) % n)
    else:
        w.recv(recv, src=(r - 1) % n)
        w.send(send, dst=(r + 1) % n)
    assert torch.equal(recv, torch.full((4,), float((r - 1) % n)))

    w.barrier()
    work = w.barrier(async_op=True)
    assert work.wait(timeout=20) is True

    # Async: the Work keeps the tensor alive even when Python drops it.
    t = torch.full((1000,), 1.0)
    work = w.all_reduce(t, async_op=True)
    assert isinstance(work, meshrt.Work)
    del t
    assert work.wait(timeout=20) is True and work.is_completed()
    assert work.exception() is None
    works = [w.all_reduce(torch.full((8,), float(i)), async_op=True) for i in range(4)]
    for work in works:
        work.wait()

    # Bad input: clear errors, nothing issued.
    expect_raises(ValueError, w.all_reduce, torch.empty(3, device="meta"), contains="DLPack")
    expect_raises(TypeError, w.all_reduce, [1.0, 2.0], contains="__dlpack__")
    expect_raises(meshrt.InvalidArgumentError, w.all_reduce, torch.ones(2), op="bogus")
    expect_raises(meshrt.InvalidArgumentError, w.broadcast, torch.ones(2), src=n)
    w.barrier()  # Everyone still in step after the refused ops.


def check_device_mesh(rt):
    r = rt.rank
    mesh = rt.init_device_mesh()  # The job's own (2, 2) mesh.
    assert mesh.shape == (2, 2) and mesh.dim_names == ("dp", "tp"), mesh
    assert mesh.size() == 4 and mesh.size("tp") == 2 and mesh.size(0) == 2
    assert mesh.get_coordinate() == (r // 2, r % 2)
    assert mesh.get_local_rank("tp") == r % 2 and mesh.get_local_rank("dp") == r // 2
    tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
    assert tp.ranks == [2 * (r // 2), 2 * (r // 2) + 1], tp.ranks
    assert dp.ranks == [r % 2, r % 2 + 2], dp.ranks
    sub = mesh["tp"]
    assert sub.shape == (2,) and sub.dim_names == ("tp",)
    assert sub.get_group().ranks == tp.ranks and sub.get_local_rank() == r % 2
    both = mesh[("dp", "tp")]
    assert both.shape == (2, 2)
    expect_raises(meshrt.InvalidArgumentError, mesh.__getitem__, "nope")
    expect_raises(meshrt.InvalidArgumentError, mesh.__getitem__, ("tp", "dp"))
    t = torch.tensor([float(r)])
    tp.all_reduce(t)
    assert t.item() == sum(tp.ranks)
    t = torch.tensor([float(r)])
    dp.all_reduce(t)
    assert t.item() == sum(dp.ranks)
    flat = mesh.flatten()
    assert flat.shape == (4,) and flat.dim_names == ("dp_tp",)
    # A second, explicit mesh gets its own groups.
    mesh2 = rt.init_device_mesh((4,), ("all",))
    assert mesh2.get_group().size == 4
    return mesh


def check_dtensor(rt, mesh):
    r = rt.rank
    S, R, P = meshrt.Shard, meshrt.Replicate, meshrt.Partial
    glob = torch.arange(7 * 4, dtype=torch.float32).reshape(7, 4)
    placements = [S(0), R()]
    shape, offset = meshrt.compute_local_shape_and_offset((7, 4), mesh, placements)
    dp = r // 2
    assert shape == ((4, 4) if dp == 0 else (3, 4)) and offset == ((0, 0) if dp == 0 else (4, 0))
    local = glob[offset[0]:offset[0] + shape[0]].clone()
    dt = meshrt.DTensor.from_local(local, mesh, placements, global_shape=(7, 4))
    assert dt.shape == (7, 4) and dt.placements == (S(0), R()) and dt.dtype == "float32"
    assert dt.to_local() is local
    full = dt.full_tensor()
    assert isinstance(full, torch.Tensor) and torch.equal(full, glob), full
    rep = dt.redistribute([R(), R()])
    assert torch.equal(rep.to_local(), glob)
    # Shard -> a different sharding, checked against torch's own slicing.
    out = dt.redistribute([S(1), S(0)])
    shape, offset = meshrt.compute_local_shape_and_offset((7, 4), mesh, [S(1), S(0)])
    expected = glob[offset[0]:offset[0] + shape[0], offset[1]:offset[1] + shape[1]]
    assert torch.equal(out.to_local(), expected), (out.to_local(), expected)
    assert out.local_shape == shape and out.local_offset == offset
    # Partial -> Replicate / Shard: torch's sum over ranks.
    part = meshrt.DTensor.from_local(torch.full((2, 3), float(r)), mesh, [P(), P("sum")])
    assert torch.equal(part.full_tensor(), torch.full((2, 3), 6.0))
    sharded = part.redistribute([S(0), R()])
    assert torch.equal(sharded.to_local(), torch.full((1, 3), 6.0))
    # distribute_tensor from every rank's copy; numpy in, numpy out.
    d = meshrt.distribute_tensor(glob, mesh, [R(), S(1)])
    assert torch.equal(d.to_local(), glob[:, 2 * (r % 2):2 * (r % 2) + 2])
    arr = np.full((2, 2), float(r), dtype=np.float64)
    nd = meshrt.DTensor.from_local(arr, mesh, [S(0), S(1)])
    assert nd.shape == (4, 4) and nd.to_local() is arr
    nfull = nd.full_tensor()
    assert isinstance(nfull, np.ndarray) and nfull[3, 3] == 3.0 and nfull[0, 2] == 1.0, nfull
    expect_raises(meshrt.InvalidArgumentError, meshrt.DTensor.from_local, local, mesh, [S(0)])


def check_progress(rt):
    g = rt.track_group("py/test", [0, 1, 2, 3])
    assert g.name == "py/test" and g.members == [0, 1, 2, 3]
    seq = g.enter("all_reduce")
    assert seq == 1
    snap = g.snapshot()
    assert snap["entered"] == 1 and snap["completed"] == 0 and snap["pending_kind"] == "all_reduce"
    g.complete(seq)
    assert g.enter("no_such_kind") == 2
    g.complete(2)
    snap = g.snapshot()
    assert snap["completed"] == 2 and snap["completed_kind"] == "other", snap
    assert set(snap) == {"entered", "completed", "pending_kind", "completed_kind", "waiting",
                         "since_completed"}, snap
    assert isinstance(snap["since_completed"], float) and 0 <= snap["since_completed"] < 60, snap


def core():
    rt = meshrt.init(hostname=HOST, timeout=30)
    check_runtime(rt)
    check_store(rt)
    check_collectives(rt)
    mesh = check_device_mesh(rt)
    check_dtensor(rt, mesh)
    check_progress(rt)
    rt.world().barrier()
    rt.finish()
    e = expect_raises(meshrt.Error, rt.health)
    assert e.code == "FAILED_PRECONDITION", e.code
    e = expect_raises(meshrt.Error, rt.store.get, "k0", contains="closed")
    # A shut-down Runtime reports no groups any more, and says so.
    e = expect_raises(meshrt.Error, rt.track_group, "late", [0], contains="shut down")
    assert e.code == "FAILED_PRECONDITION", e.code
    print("OK core", flush=True)


# ---- op_timeout: 2 ranks; rank 1 never joins rank 0's all_reduce ------------

def op_timeout():
    # The group's op timeout, not the job's failure: Gloo aborts the group
    # itself with DEADLINE_EXCEEDED, a meshrt.TimeoutError (not a
    # JobFailedError), and the job goes on.
    rt = meshrt.init(hostname=HOST, timeout=2.0)
    w = rt.world()
    w.barrier()
    if rt.rank == 0:
        try:
            start = time.monotonic()
            # The wait (the group's timeout too) or the op itself times out
            # first: DEADLINE_EXCEEDED either way.
            e = expect_raises(meshrt.TimeoutError, w.all_reduce, torch.ones(2))
            assert not isinstance(e, meshrt.JobFailedError), type(e)
            assert e.code == "DEADLINE_EXCEEDED", (e.code, e.message)
            assert 1.5 < time.monotonic() - start < 30, time.monotonic() - start
            # Gloo's op timeout aborts the group with DEADLINE_EXCEEDED; from
            # then on health() and every op raise that, by code.
            deadline = time.monotonic() + 20
            while True:
                try:
                    w.health()
                except meshrt.Error as error:
                    e = error
                    break
                assert time.monotonic() < deadline, "the group never aborted itself"
                time.sleep(0.05)
            assert isinstance(e, meshrt.TimeoutError), (type(e), e)
            assert not isinstance(e, meshrt.JobFailedError), type(e)
            assert e.code == "DEADLINE_EXCEEDED", e.code
            e = expect_raises(meshrt.TimeoutError, w.barrier)
            assert not isinstance(e, meshrt.JobFailedError), type(e)
            rt.health()  # The job itself is fine.
        finally:
            rt.store.set("timed-out", "1")
    else:
        rt.store.wait(["timed-out"], timeout=60)
    rt.finish()
    print("OK op_timeout", flush=True)


# ---- failure: 3 ranks; rank 1 reports an error ------------------------------

def failure():
    events = []
    rt = meshrt.init(hostname=HOST, timeout=60, on_failure=events.append)
    r = rt.rank
    w = rt.world()
    w.barrier()
    # Rank 1 fails only once every rank is past the barrier (finishing a
    # barrier does not mean the others have seen it finish too).
    rt.store.set(f"ready{r}", "1")
    start = time.monotonic()
    if r == 1:
        rt.store.wait([f"ready{i}" for i in range(rt.world_size)], timeout=20)
        rt.report_error("boom from rank 1")
    else:
        # Rank 1 never joins: the runtime aborts this op when the job fails,
        # long before the group's 60 s timeout.
        e = expect_raises(meshrt.JobFailedError, w.all_reduce, torch.ones(3), contains="boom")
        assert e.code == "ABORTED" and "rank 1" in e.message, (e.code, e.message)
        assert time.monotonic() - start < 20, time.monotonic() - start
    deadline = time.monotonic() + 20
    while not events:
        assert time.monotonic() < deadline, "on_failure was not called"
        time.sleep(0.01)
    assert isinstance(events[0], meshrt.JobFailedError) and "boom" in str(events[0]), events
    expect_raises(meshrt.JobFailedError, rt.health, contains="boom")
    expect_raises(meshrt.JobFailedError, rt.store.set, "x", "y", contains="store is gone")
    expect_raises(meshrt.JobFailedError, w.all_reduce, torch.ones(1), contains="boom")
    work_error = None
    try:
        w.barrier(async_op=True).wait(timeout=5)
    except meshrt.JobFailedError as e:
        work_error = e
    assert work_error is not None
    if r == 0:
        rt.finish("a consequence of rank 1's failure")  # Not reported again; no raise.
    # Other ranks exit with the Runtime (and its callback) alive: the atexit
    # hook shuts it down without deadlocking on the GIL.
    print("OK failure", flush=True)


# ---- in_place: a job created with in_place=True (docs/elastic.md) ----------

def in_place():
    rt = meshrt.init(hostname=HOST, timeout=60)
    r, last = rt.rank, rt.world_size - 1
    assert rt.membership_epoch == 0, rt.membership_epoch
    rt.store.set(f"ready{r}", "1")
    if r == last:
        # The last rank fails; with in-place recovery it alone is lost.
        rt.store.wait([f"ready{i}" for i in range(rt.world_size)], timeout=20)
        rt.report_error("boom from the last rank")
        expect_raises(meshrt.JobFailedError, rt.alive_ranks, 5, contains="boom")
        print("OK in_place", flush=True)
        return
    round_, epoch, ranks = rt.alive_ranks(timeout=30)
    assert [rank for rank, _ in ranks] == list(range(last)), ranks
    assert (round_, epoch) == (1, 1), (round_, epoch)
    rt.health()  # The survivors' job goes on.
    rt.store.set(f"agreed{r}", repr(ranks))
    rt.store.wait([f"agreed{i}" for i in range(last)], timeout=20)
    for i in range(last):
        assert rt.store.get(f"agreed{i}") == repr(ranks).encode(), "every survivor got the same set"
    deadline = time.monotonic() + 20
    while rt.membership_epoch != 1:
        assert time.monotonic() < deadline, rt.membership_epoch
        time.sleep(0.05)
    rt.shutdown()
    print("OK in_place", flush=True)


# ---- elastic_mesh: meshrt.ElasticMesh over a (4, 1) dp x tp job -------------

ELASTIC_FINAL_STEP = 40


def elastic_mesh():
    """Rank 2 fails after 3 steps; the others carry on as 3 replicas; a new
    process for rank 2 takes the state from a peer and the mesh is 4 again.
    Every committed step's sum of ones over dp is the replica count."""
    replacement = os.environ.get("MESH_TEST_REPLACEMENT") == "1"
    rt = meshrt.init(hostname=HOST, timeout=60)
    r = rt.rank
    marks = f"/tmp/meshrt-elastic-{rt.job_id}"
    os.makedirs(marks, exist_ok=True)
    weights = torch.zeros(4)
    step = torch.zeros(1, dtype=torch.int64)
    # A parameter (requires grad): the state takes it detached.
    param = torch.nn.Parameter(torch.zeros(2))
    em = meshrt.ElasticMesh(rt, state=lambda: [weights, step, param], timeout=30)
    assert em.dim == "dp", em.dim
    first_step = int(step.item())
    if replacement:
        assert em.has_state and em.last_donor is not None, repr(em)
        assert not em.membership_derived, "a new process means a new membership"
        assert first_step > 3, f"the replacement started at step {first_step}, not a peer's"
        assert torch.equal(weights, torch.full((4,), float(weights[0]))), weights
    log = []
    deadline = time.monotonic() + 90
    while True:
        assert time.monotonic() < deadline, f"rank {r} at step {int(step.item())}: {repr(em)}"
        em.sync()
        if not em.is_member:
            continue
        ones = torch.ones(4)
        try:
            em.mesh.get_group("dp").all_reduce(ones)
        except meshrt.Error:
            continue  # Not committed: the next sync() rebuilds without the lost rank.
        weights += ones
        step += 1
        with torch.no_grad():
            param += 1
        log.append((int(step.item()), em.replicas, float(ones[0])))
        # Every member stops at the same commit: past the final step, in the
        # mesh rebuilt for the replacement (AliveRanks round 3: the start,
        # the loss, the return).
        if int(step.item()) >= ELASTIC_FINAL_STEP and em.round >= 3:
            break
        if em.replicas == 3:
            assert em.membership_derived, "the survivors' membership derives from the four's"
            open(os.path.join(marks, f"three-{r}"), "w").close()
        if r == 2 and not replacement and len(log) == 3:
            rt.report_error("rank 2 crashed on purpose")
            break
        time.sleep(0.01)
    if r == 2 and not replacement:
        # A new process takes the rank once the others run as three replicas.
        while not any(name.startswith("three-") for name in os.listdir(marks)):
            assert time.monotonic() < deadline, "the survivors never ran as three replicas"
            time.sleep(0.02)
        del em
        env = dict(os.environ, MESH_TEST_REPLACEMENT="1")
        import subprocess
        rc = subprocess.run([sys.executable, os.path.abspath(__file__), "elastic_mesh"],
                            env=env, timeout=120).returncode
        assert rc == 0, f"the replacement exited with {rc}"
        print("OK elastic_mesh", flush=True)
        return
    for s, replicas, total in log:
        assert total == replicas, f"rank {r} step {s}: sum {total} with {replicas} replicas"
    replicas_seen = [replicas for _, replicas, _ in log]
    if replacement:
        assert set(replicas_seen) == {4}, replicas_seen
    else:
        assert 3 in replicas_seen, replicas_seen
        assert replicas_seen[-1] == 4, (repr(em), replicas_seen)
    assert int(step.item()) >= ELASTIC_FINAL_STEP
    assert float(param[0]) == float(step.item()), (param, step)
    assert torch.equal(weights, torch.full((4,), float(weights[0]))), weights
    rt.shutdown()
    print("OK elastic_mesh", flush=True)


def elastic_errors():
    """meshrt.ElasticMesh's errors, each raised before any collective."""
    with meshrt.init(hostname=HOST, timeout=60) as rt:
        e = expect_raises(meshrt.Error, meshrt.ElasticMesh, rt, contains="in-place recovery")
        assert e.code == "FAILED_PRECONDITION", e.code
        expect_raises(TypeError, meshrt.ElasticMesh, rt, state=5, contains="callable")
        expect_raises(meshrt.InvalidArgumentError, meshrt.ElasticMesh, rt, shape=[2],
                      contains="dim_names")
        expect_raises(meshrt.InvalidArgumentError, meshrt.ElasticMesh, rt, device="gpu:0")
        expect_raises(meshrt.InvalidArgumentError, meshrt.ElasticMesh, rt, timeout=-1)
        expect_raises(TypeError, meshrt.ElasticMesh, rt, "dp")  # keywords only
    print("OK elastic_errors", flush=True)


# ---- agent: launched by a mesh-agent (test_job_client.py) ------------------

def agent():
    with meshrt.init(hostname=HOST) as rt:
        t = torch.tensor([float(rt.rank)])
        rt.world().all_reduce(t)
        assert t.item() == sum(range(rt.world_size)), t
        print(f"OK agent rank {rt.rank} of {rt.world_size} sum {int(t.item())}", flush=True)


# ---- GPU: 1 rank on CUDA device 0 (tests/python/test_nccl_gpu.py) ----------

def nccl_cuda():
    """meshrt's own NCCL group on torch CUDA tensors, through DLPack."""
    dev = torch.device("cuda", 0)
    with meshrt.init(hostname=HOST, backend="nccl", device_index=0, timeout=60) as rt:
        w = rt.world()
        assert rt.backend == "nccl" and w.backend == "nccl" and w.size == 1, (rt.backend, w.size)
        # Every dtype the bindings take, sync and async; a world of one sums to itself.
        for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
                      torch.uint8, torch.int32, torch.int64):
            t = torch.arange(1000, device=dev).to(dtype)
            expected = t.clone()
            w.all_reduce(t)
            assert torch.equal(t, expected), (dtype, t)
            work = w.all_reduce(t, op="max", async_op=True)
            assert work.wait(timeout=30) and work.is_completed() and work.exception() is None
            assert torch.equal(t, expected), (dtype, t)

        # Stream order, both ways. The producer's kernels run on torch's
        # current (legacy default) stream behind a ~50 ms spin; the op must
        # start after them, and after Work.wait() torch's stream must see its
        # result. A missing wait on either side shows as zeros in `out`.
        n = 1 << 24
        for async_op in (False, True):
            x = torch.zeros(n, device=dev)
            out = torch.zeros(n, device=dev)
            torch.cuda._sleep(100_000_000)
            x.fill_(7.0)
            work = w.all_gather(out, x, async_op=async_op)
            if work is not None:
                assert work.wait(timeout=30)
            host = out.cpu()  # On torch's stream, right after the op.
            assert bool((host == 7.0).all()), (async_op, host[:4], (host != 7.0).sum().item())
            torch.cuda.synchronize()

        b = torch.full((64,), 3.0, device=dev)
        w.broadcast(b, src=0)
        assert bool((b == 3.0).all())
        rs_out = torch.zeros(16, device=dev)
        w.reduce_scatter(rs_out, torch.arange(16.0, device=dev))
        assert torch.equal(rs_out, torch.arange(16.0, device=dev)), rs_out
        a2a = torch.zeros(8, device=dev)
        w.all_to_all_single(a2a, torch.arange(8.0, device=dev))
        assert torch.equal(a2a, torch.arange(8.0, device=dev)), a2a

        # Non-contiguous CUDA tensors are refused by NCCL, clearly.
        expect_raises(meshrt.InvalidArgumentError, w.all_reduce,
                      torch.zeros(8, 8, device=dev).t(), contains="contiguous")
        # A CPU tensor on an NCCL group names the device.
        expect_raises(meshrt.InvalidArgumentError, w.all_reduce, torch.zeros(4), contains="CUDA")

        # DTensor on CUDA: libmesh allocates on the device and hands the
        # result back to torch through DLPack, as a CUDA tensor.
        mesh = rt.init_device_mesh((1,), ("dp",))
        S, R, P = meshrt.Shard, meshrt.Replicate, meshrt.Partial
        glob = torch.arange(6 * 4, dtype=torch.float32, device=dev).reshape(6, 4)
        dt = meshrt.DTensor.from_local(glob, mesh, [S(1)])
        full = dt.full_tensor()
        assert isinstance(full, torch.Tensor) and full.device == dev, (type(full), full.device)
        assert torch.equal(full, glob), full
        rep = dt.redistribute([R()])
        assert rep.to_local().device == dev and torch.equal(rep.to_local(), glob)
        part = meshrt.DTensor.from_local(torch.full((2, 3), 5.0, device=dev), mesh, [P()])
        assert torch.equal(part.full_tensor(), torch.full((2, 3), 5.0, device=dev))
        d = meshrt.distribute_tensor(glob, mesh, [S(0)])
        assert d.to_local().device == dev and torch.equal(d.to_local(), glob)
        rt.world().barrier()
    print("OK nccl_cuda", flush=True)


def torch_nccl():
    """torch.distributed's own NCCL backend, rendezvous through mesh://."""
    import torch.distributed as dist

    import meshrt.torch  # noqa: F401  (registers mesh://)

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    # The Runtime behind mesh:// (its own groups on Gloo, over loopback).
    meshrt.torch.runtime(hostname=HOST)
    dist.init_process_group("nccl", init_method="mesh://", device_id=dev)
    assert dist.get_rank() == 0 and dist.get_world_size() == 1
    assert "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ
    t = torch.arange(1 << 16, dtype=torch.float32, device=dev)
    dist.all_reduce(t)
    assert torch.equal(t, torch.arange(1 << 16, dtype=torch.float32, device=dev))
    out = [torch.zeros(4, device=dev)]
    dist.all_gather(out, torch.ones(4, device=dev))
    assert torch.equal(out[0], torch.ones(4, device=dev))
    dist.barrier()
    dist.destroy_process_group()
    print("OK torch_nccl", flush=True)


if __name__ == "__main__":
    {"core": core, "failure": failure, "op_timeout": op_timeout, "agent": agent,
     "in_place": in_place, "elastic_mesh": elastic_mesh, "elastic_errors": elastic_errors,
     "nccl_cuda": nccl_cuda, "torch_nccl": torch_nccl}[sys.argv[1]]()
