"""torch.distributed on the Mesh coordinator's store (docs/python.md).

Three pieces, all pure Python over ``meshrt``:

``Store``
    A ``torch.distributed.Store`` backed by the job's coordinator key-value
    store (``meshrt.Runtime.store``), usable wherever torch takes a store
    (``init_process_group(store=...)``, ``PrefixStore``, Gloo's rendezvous).
    Keys are ``str`` (``bytes`` are decoded as UTF-8, as torch's own stores
    do); values are ``bytes`` or ``str`` (UTF-8), and ``get`` returns
    ``bytes``. Blocking calls (``get``, ``wait``) wait at most the store's
    timeout (``timeout``/``set_timeout``, which torch sets from
    ``init_process_group(timeout=...)``), or the ``wait`` call's own.

    Errors: a blocking call that times out raises ``StoreTimeoutError``, a
    ``RuntimeError`` (what torch 1.13's stores raise and its callers expect)
    that is also a ``meshrt.TimeoutError`` (hence a builtin ``TimeoutError``).
    A key or value of the wrong type raises ``TypeError`` before anything is
    sent. Every other failure is the ``meshrt.Error`` the coordinator store
    gives: ``meshrt.JobFailedError`` (code ABORTED) once the job's generation
    has failed or this process was fenced off, ``meshrt.UnavailableError``
    when the coordinator cannot be reached, ``meshrt.InvalidArgumentError``
    for an ``add`` on a non-integer value or an empty key. Nothing is retried.

    Thread safety: every method may be called from any thread, concurrently
    (the underlying store is thread-safe and releases the GIL while it
    blocks); torch's C++ code (Gloo's rendezvous, ``PrefixStore``) calls it
    from its own threads.

``mesh://`` rendezvous
    Registered with ``torch.distributed.register_rendezvous_handler`` when
    this module is imported, so that inside a Mesh job
    ``dist.init_process_group("gloo", init_method="mesh://")`` needs no
    ``MASTER_ADDR``/``MASTER_PORT`` and starts no ``TCPStore``: rank and world
    size come from the job (``meshrt.init()``, or the Runtime given to
    ``use_runtime``/``init_process_group(runtime=...)``), and the store is a
    ``Store`` over the coordinator's. Query parameters: ``progress=0|1``
    (default 1: install the progress hook). ``rank=``/``world_size=`` (torch
    adds them when ``init_process_group`` is given them) must agree with the
    job's, else ``ValueError``. Anything else is a ``ValueError``.

Progress hook
    ``install_progress_hook(rt)`` wraps the collectives of
    ``torch.distributed`` (``all_reduce``, ``broadcast``, ``barrier``,
    ``all_gather_object``, ... and ``_broadcast_coalesced``, DDP's
    parameter broadcast) so that each call on a group is numbered and
    reported through ``rt.track_group(name, members)``: ``enter(kind)``
    before the call, ``complete(seq)`` once the op is over (on return for a
    synchronous call; when the returned Work's future completes, or on
    ``wait()`` where the Work has none, for ``async_op=True``). Groups are
    named ``"torch/world"`` and ``"torch/pg<N>"`` (``GROUP_PREFIX``), apart
    from the Runtime's own groups in the same heartbeats. The
    coordinator uses these numbers to name the rank a hung collective waits
    for. Only calls that go through these Python functions are seen: DDP's
    gradient all-reduces run in the C++ reducer and are not. Nested calls
    (``all_gather_object`` calls ``all_gather``) count once, as the outer
    call. A call that raises counts as completed. Bookkeeping never fails a
    collective: if the Runtime refuses (``track_group`` raises
    FAILED_PRECONDITION once it was shut down), the hook turns itself off
    for the process with a warning and the call runs untracked. Thread
    safety: the hook may be used from several threads; torch requires that
    every member issues a group's collectives in the same order, and the
    numbering relies on that too.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import sys
import threading
import urllib.parse
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

import meshrt as _meshrt

__all__ = [
    "Store",
    "StoreTimeoutError",
    "runtime",
    "use_runtime",
    "init_process_group",
    "install_progress_hook",
    "uninstall_progress_hook",
    "progress_hook_installed",
    "tracked_groups",
    "group_name_and_members",
    "COLLECTIVE_KINDS",
    "GROUP_PREFIX",
]


# --------------------------------------------------------------------------
# Store


class StoreTimeoutError(RuntimeError, _meshrt.TimeoutError):
    """A blocking store call ran past its timeout.

    A ``RuntimeError`` like the timeouts of torch 1.13's own stores ("Wait
    timeout", "Socket Timeout"), and a ``meshrt.TimeoutError``. The message
    names the keys and carries the coordinator's text.
    """

    def __init__(self, message: str, code: str = "DEADLINE_EXCEEDED"):
        RuntimeError.__init__(self, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, (bytes, bytearray)):
        try:
            return bytes(key).decode("utf-8")
        except UnicodeDecodeError:
            raise TypeError("meshrt.torch.Store: a bytes key must be UTF-8 (keys are str)") from None
    raise TypeError(
        f"meshrt.torch.Store: a key must be str, not {type(key).__name__} ({key!r})")


def _value(value: Any, what: str = "value") -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list) and all(isinstance(b, int) for b in value):
        # torch's C++ trampoline hands std::vector<uint8_t> over as a list.
        return bytes(value)
    raise TypeError(
        f"meshrt.torch.Store: a {what} must be bytes or str, not {type(value).__name__}")


def _seconds(timeout: Any) -> Optional[float]:
    """A timeout as seconds; None for none or zero (c10d's kNoTimeout)."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(
            f"meshrt.torch.Store: a timeout must be a datetime.timedelta, not {type(timeout).__name__}")
    return seconds if seconds > 0 else None


class Store(dist.Store):
    """``torch.distributed.Store`` over a ``meshrt.Store`` (the job's store).

    ``Store(base, prefix="", timeout=None)``: ``base`` is a ``meshrt.Store``
    (``rt.store``); every key is stored as ``prefix + key``; ``timeout``
    (``timedelta`` or seconds) is the default of blocking calls, else the
    base's. ``num_keys`` counts all keys of the base, as ``PrefixStore``.
    See the module docstring for types, errors and thread safety.
    """

    def __init__(self, base: Any, prefix: str = "", timeout: Any = None):
        super().__init__()
        if not isinstance(prefix, str):
            raise TypeError("meshrt.torch.Store: prefix must be str")
        self._base = base
        self._prefix = prefix
        seconds = _seconds(timeout)
        if seconds is None:
            seconds = float(base.timeout)
        self.set_timeout(datetime.timedelta(seconds=seconds))

    # The C++ base class keeps the timeout (``timeout``/``set_timeout``;
    # PrefixStore.set_timeout reaches it too), so it is read at every call.
    def _timeout_seconds(self, timeout: Any = None) -> float:
        seconds = _seconds(timeout)
        if seconds is None:
            seconds = _seconds(self.timeout)
        return seconds if seconds is not None else float(self._base.timeout)

    @property
    def base(self) -> Any:
        """The ``meshrt.Store`` under this one."""
        return self._base

    @property
    def prefix(self) -> str:
        return self._prefix

    def _full(self, key: Any) -> str:
        return self._prefix + _key(key)

    def _timed_out(self, error: BaseException, keys: Sequence[str], seconds: float) -> StoreTimeoutError:
        names = ", ".join(repr(k) for k in keys)
        detail = getattr(error, "message", None) or str(error)
        return StoreTimeoutError(
            f"Wait timeout: key(s) {names} not set after {seconds:g}s: {detail}")

    def set(self, key: Any, value: Any) -> None:
        self._base.set(self._full(key), _value(value))

    def get(self, key: Any) -> bytes:
        full = self._full(key)
        seconds = self._timeout_seconds()
        try:
            return bytes(self._base.get(full, timeout=seconds))
        except _meshrt.TimeoutError as e:
            raise self._timed_out(e, [full], seconds) from e

    def add(self, key: Any, value: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(
                f"meshrt.torch.Store: add takes an int, not {type(value).__name__}")
        return int(self._base.add(self._full(key), value))

    def compare_set(self, key: Any, expected_value: Any, desired_value: Any) -> bytes:
        """c10d's compare-and-swap: sets ``desired`` when the key holds
        ``expected`` (an empty ``expected`` also matches an absent key).
        Returns ``desired`` when swapped, else the current value, else
        (absent key, non-empty ``expected``) ``expected``."""
        full = self._full(key)
        expected = _value(expected_value, "expected value")
        desired = _value(desired_value, "desired value")
        # meshrt.Store.compare_set follows c10d, return value included.
        return bytes(self._base.compare_set(full, expected, desired))

    # torch's C++ trampoline calls the camelCase names.
    def compareSet(self, key: Any, expected_value: Any, desired_value: Any) -> bytes:  # noqa: N802
        return self.compare_set(key, expected_value, desired_value)

    def wait(self, keys: Iterable[Any], timeout: Any = None) -> None:
        if isinstance(keys, (str, bytes)):
            raise TypeError("meshrt.torch.Store: wait takes a list of keys, not one key")
        full = [self._full(k) for k in keys]
        seconds = self._timeout_seconds(timeout)
        try:
            self._base.wait(full, timeout=seconds)
        except _meshrt.TimeoutError as e:
            raise self._timed_out(e, full, seconds) from e

    def check(self, keys: Iterable[Any]) -> bool:
        """Whether every key is set, without blocking."""
        return all(self._base.try_get(self._full(k)) is not None for k in keys)

    def delete_key(self, key: Any) -> bool:
        return bool(self._base.delete_key(self._full(key)))

    def deleteKey(self, key: Any) -> bool:  # noqa: N802
        return self.delete_key(key)

    def num_keys(self) -> int:
        return int(self._base.num_keys())

    def getNumKeys(self) -> int:  # noqa: N802
        return self.num_keys()

    # Not in torch 1.13's Store; newer torch has them with these signatures.
    def multi_get(self, keys: List[Any]) -> List[bytes]:
        full = [self._full(k) for k in keys]
        seconds = self._timeout_seconds()
        try:
            return [bytes(v) for v in self._base.multi_get(full, timeout=seconds)]
        except _meshrt.TimeoutError as e:
            raise self._timed_out(e, full, seconds) from e

    def multi_set(self, keys: List[Any], values: List[Any]) -> None:
        if len(keys) != len(values):
            raise ValueError("meshrt.torch.Store: multi_set takes as many values as keys")
        self._base.multi_set([self._full(k) for k in keys], [_value(v) for v in values])

    def __repr__(self) -> str:
        return f"meshrt.torch.Store(prefix={self._prefix!r}, timeout={self.timeout})"


def find_store(store: Any) -> Optional[Store]:
    """The ``meshrt.torch.Store`` under ``store`` (through PrefixStores), or
    None: ``find_store(dist.distributed_c10d._get_default_store())``."""
    seen = 0
    while store is not None and seen < 64:
        if isinstance(store, Store):
            return store
        store = getattr(store, "underlying_store", None)
        seen += 1
    return None


__all__.append("find_store")


# --------------------------------------------------------------------------
# The process's Runtime

_runtime_lock = threading.RLock()
_runtime: Any = None
_owns_runtime = False
_exit_error: Optional[str] = None
_rendezvous_count = 0
# Stores handed to torch: torch's C++ side holds them by pointer only, so
# the Python objects are kept alive here for the life of the process.
_live_stores: List[Store] = []


def use_runtime(rt: Any) -> None:
    """Makes ``rt`` the Runtime that ``mesh://`` and ``runtime()`` use, for
    a process that called ``meshrt.init`` itself. The caller keeps owning
    it (shuts it down)."""
    global _runtime, _owns_runtime
    with _runtime_lock:
        if _runtime is not None and _runtime is not rt and _owns_runtime:
            raise RuntimeError("meshrt.torch: this process already joined the job through mesh://")
        _runtime = rt
        _owns_runtime = False


def runtime(**options: Any) -> Any:
    """The process's ``meshrt.Runtime``: the one given to ``use_runtime``,
    or the one made by an earlier call, or ``meshrt.init(**options)``. A
    Runtime made here is finished at interpreter exit (``rt.finish()``, or
    ``rt.finish(error)`` naming the uncaught exception)."""
    global _runtime, _owns_runtime
    with _runtime_lock:
        if _runtime is None:
            _runtime = _meshrt.init(**options)
            _owns_runtime = True
            _install_exit_hooks()
        return _runtime


_exit_hooks_installed = False


def _install_exit_hooks() -> None:
    global _exit_hooks_installed
    if _exit_hooks_installed:
        return
    _exit_hooks_installed = True
    previous = sys.excepthook

    def excepthook(kind, value, tb):
        global _exit_error
        _exit_error = f"uncaught {kind.__name__}: {value}"
        previous(kind, value, tb)

    sys.excepthook = excepthook
    atexit.register(_finish_at_exit)


def _finish_at_exit() -> None:
    with _runtime_lock:
        rt, owned = _runtime, _owns_runtime
    if rt is None or not owned:
        return
    try:
        rt.finish(_exit_error)
    except Exception as e:  # the job already failed, or the coordinator is gone
        print(f"meshrt.torch: at exit: {e}", file=sys.stderr)


# --------------------------------------------------------------------------
# mesh:// rendezvous

_QUERY_KEYS = ("progress", "rank", "world_size")


def _parse_query(url: str) -> Dict[str, str]:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme != "mesh":
        raise ValueError(f"meshrt.torch: not a mesh:// URL: {url!r}")
    if parsed.netloc or parsed.path not in ("", "/"):
        raise ValueError(
            f"meshrt.torch: {url!r}: mesh:// takes no host or path (the job says where the "
            "coordinator is); write mesh:// or mesh://?progress=0")
    query: Dict[str, str] = {}
    for name, value in urllib.parse.parse_qsl(parsed.query, keep_blank_values=True, strict_parsing=False):
        if name not in _QUERY_KEYS:
            raise ValueError(
                f"meshrt.torch: {url!r}: unknown parameter {name!r}; mesh:// takes "
                + ", ".join(_QUERY_KEYS))
        query[name] = value
    return query


def _flag(url: str, name: str, value: str) -> bool:
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"meshrt.torch: {url!r}: {name} must be 0 or 1, got {value!r}")


def _int_param(url: str, query: Dict[str, str], name: str) -> Optional[int]:
    """The integer parameter ``name``, or None when absent, empty or -1
    (torch's "not given")."""
    value = query.get(name, "")
    if value in ("", "-1"):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"meshrt.torch: {url!r}: {name} is not an integer") from None


def _mesh_rendezvous_handler(url: str, timeout: Any = None, **kwargs: Any):
    # Every parameter is checked before the process joins the job.
    query = _parse_query(url)
    progress = _flag(url, "progress", query.get("progress", "1"))
    given = {name: _int_param(url, query, name) for name in ("rank", "world_size")}
    rt = runtime()
    for name, actual in (("rank", rt.rank), ("world_size", rt.world_size)):
        if given[name] is not None and given[name] != actual:
            raise ValueError(
                f"meshrt.torch: init_process_group was given {name}={given[name]}, but this "
                f"process is {name} {actual} of job {rt.job_id}; leave it out with mesh://")
    global _rendezvous_count
    with _runtime_lock:
        _rendezvous_count += 1
        # The coordinator's store is per generation already; a process that
        # initializes torch.distributed again gets fresh keys.
        store = Store(rt.store, prefix=f"torch/{_rendezvous_count}/", timeout=timeout)
        _live_stores.append(store)
    if progress:
        install_progress_hook(rt)
    yield (store, rt.rank, rt.world_size)
    raise RuntimeError("meshrt.torch: mesh:// cannot rendezvous again in one process; "
                       "a Mesh job restarts all its ranks instead")


def init_process_group(backend: str = "gloo", *, runtime: Any = None, progress: bool = True,
                       **kwargs: Any) -> Any:
    """``torch.distributed.init_process_group(backend, init_method="mesh://")``
    inside a Mesh job; returns the ``meshrt.Runtime``. ``runtime``: use this
    Runtime instead of the process's own (see ``use_runtime``).
    ``progress``: install the progress hook. Other keywords go to torch
    (``timeout``, ``group_name``, ``pg_options``); ``init_method`` and
    ``store`` may not be given."""
    for name in ("init_method", "store"):
        if name in kwargs:
            raise TypeError(f"meshrt.torch.init_process_group: {name} is mesh://'s to set")
    if runtime is not None:
        use_runtime(runtime)
    url = "mesh://" if progress else "mesh://?progress=0"
    dist.init_process_group(backend, init_method=url, **kwargs)
    return globals()["runtime"]()


def _register() -> None:
    from torch.distributed import rendezvous as _rdzv
    if "mesh" not in getattr(_rdzv, "_rendezvous_handlers", {}):
        dist.register_rendezvous_handler("mesh", _mesh_rendezvous_handler)


_register()


# --------------------------------------------------------------------------
# Progress hook

COLLECTIVE_KINDS: Dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_reduce_multigpu": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "broadcast": "broadcast",
    "broadcast_multigpu": "broadcast",
    "broadcast_object_list": "broadcast",
    "_broadcast_coalesced": "broadcast",
    "reduce": "reduce",
    "reduce_multigpu": "reduce",
    "all_gather": "all_gather",
    "all_gather_multigpu": "all_gather",
    "all_gather_coalesced": "all_gather",
    "all_gather_object": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "_all_gather_base": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_multigpu": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "barrier": "barrier",
    "monitored_barrier": "barrier",
    "gather": "other",
    "gather_object": "other",
    "scatter": "other",
    "scatter_object_list": "other",
}
"""The functions the hook wraps (those this torch has) and their kinds."""

_hook_lock = threading.RLock()
_hook_rt: Any = None
_hook_disabled = False
_originals: Dict[Tuple[Any, str], Callable] = {}
_groups: Dict[Tuple[str, Tuple[int, ...]], Any] = {}
_local = threading.local()


GROUP_PREFIX = "torch/"
"""Prefix of the names of torch's groups, apart from the Runtime's own
groups (its ``"world"``, device-mesh groups) in the same heartbeats."""


def group_name_and_members(group: Any = None) -> Tuple[str, List[int]]:
    """The name every member uses for ``group`` and its global ranks:
    ``("torch/world", [0..n-1])`` for the default group; otherwise
    ``"torch/pg<N>"`` with N torch's own name for the group (``new_group``
    numbers groups in creation order on every rank), or
    ``"torch/ranks<r0>-<r1>-..."`` for a group torch has no name for."""
    default = _c10d._get_default_group()
    if group is None or group is _c10d.GroupMember.WORLD or group is default:
        return GROUP_PREFIX + "world", list(range(dist.get_world_size()))
    if hasattr(dist, "get_process_group_ranks"):
        members = sorted(dist.get_process_group_ranks(group))
    else:  # older torch
        members = sorted(_c10d._pg_group_ranks[group].keys())
    name = getattr(_c10d, "_pg_names", {}).get(group)
    if name:
        return f"{GROUP_PREFIX}pg{name}", members
    return GROUP_PREFIX + "ranks" + "-".join(str(r) for r in members), members


def _progress_for(group: Any) -> Any:
    name, members = group_name_and_members(group)
    key = (name, tuple(members))
    progress = _groups.get(key)
    if progress is None:
        with _hook_lock:
            progress = _groups.get(key)
            if progress is None:
                progress = _hook_rt.track_group(name, members)
                _groups[key] = progress
    return progress


class _TrackedWork:
    """A Work without a future: completes the op on wait() or once
    is_completed() says so. Everything else is the Work's."""

    def __init__(self, work: Any, done: Callable[[], None]):
        self._work = work
        self._done = done

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._done()

    def is_completed(self) -> bool:
        completed = self._work.is_completed()
        if completed:
            self._done()
        return completed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _disable(reason: BaseException) -> None:
    global _hook_disabled
    if not _hook_disabled:
        _hook_disabled = True
        warnings.warn(f"meshrt.torch: progress hook off for this process: {reason}", RuntimeWarning)


def _group_arg(name: str, fn: Callable) -> Callable[[tuple, dict], Any]:
    """How to find the group argument of ``fn`` in a call."""
    if name == "_broadcast_coalesced":  # (process_group, tensors, bucket_size, src)
        return lambda args, kwargs: args[0] if args else kwargs.get("process_group")
    import inspect
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return lambda args, kwargs: kwargs.get("group")
    index = params.index("group") if "group" in params else -1

    def find(args: tuple, kwargs: dict) -> Any:
        if "group" in kwargs:
            return kwargs["group"]
        if 0 <= index < len(args):
            return args[index]
        return None

    return find


def _wrap(name: str, kind: str, fn: Callable) -> Callable:
    find_group = _group_arg(name, fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "depth", 0) > 0 or _hook_rt is None or _hook_disabled:
            return fn(*args, **kwargs)
        try:
            group = find_group(args, kwargs)
            if not dist.is_initialized() or _c10d._rank_not_in_group(group):
                return fn(*args, **kwargs)
            progress = _progress_for(group)
            seq = progress.enter(kind)
        except _meshrt.Error as e:
            _disable(e)
            return fn(*args, **kwargs)

        completed = [False]
        lock = threading.Lock()

        def complete(*_: Any) -> None:
            with lock:
                if completed[0]:
                    return
                completed[0] = True
            try:
                progress.complete(seq)
            except _meshrt.Error as e:
                _disable(e)

        _local.depth = getattr(_local, "depth", 0) + 1
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            complete()
            raise
        finally:
            _local.depth -= 1
        if isinstance(result, dist.Work):
            try:
                future = result.get_future()
            except Exception:  # backends without futures (MPI, some Works)
                return _TrackedWork(result, complete)
            future.add_done_callback(complete)
            return result
        complete()
        return result

    wrapper.__meshrt_original__ = fn  # type: ignore[attr-defined]
    return wrapper


def install_progress_hook(rt: Any) -> None:
    """Reports the collectives of ``torch.distributed`` to ``rt`` (see the
    module docstring). Idempotent; a second Runtime replaces the first.
    Wraps the functions in ``torch.distributed`` and in
    ``torch.distributed.distributed_c10d`` (so torch's own helpers that
    call them are seen, counted once). Code that bound a function before
    the hook was installed (``from torch.distributed import all_reduce``)
    calls the original."""
    global _hook_rt, _hook_disabled
    with _hook_lock:
        if _hook_rt is not rt:
            _groups.clear()
        _hook_rt = rt
        _hook_disabled = False
        for module in (dist, _c10d):
            for name, kind in COLLECTIVE_KINDS.items():
                fn = getattr(module, name, None)
                if fn is None or (module, name) in _originals:
                    continue
                original = getattr(fn, "__meshrt_original__", fn)
                _originals[(module, name)] = fn
                setattr(module, name, _wrap(name, kind, original))


def uninstall_progress_hook() -> None:
    """Puts torch's functions back; the Runtime's groups stay tracked."""
    global _hook_rt
    with _hook_lock:
        for (module, name), fn in _originals.items():
            setattr(module, name, fn)
        _originals.clear()
        _groups.clear()
        _hook_rt = None


def progress_hook_installed() -> bool:
    """Whether the hook is installed and reporting."""
    return _hook_rt is not None and not _hook_disabled


def tracked_groups() -> Dict[str, Any]:
    """The ``GroupProgress`` of each group the hook has reported on, by
    name (``"torch/world"``, ``"torch/pg1"``, ...)."""
    with _hook_lock:
        return {name: progress for (name, _), progress in _groups.items()}
