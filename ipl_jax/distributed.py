"""Multi-process (multi-host) runs: starting ``jax.distributed``, which process does what, and moving arrays
between one host's numpy and the global ``jax.Array``. Only ``is_main()`` writes files; each process builds
only the batch rows its devices hold.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding

from ipl_jax.model.sharding import batch_spec

FLAGS = ("--coordinator", "--num-processes", "--process-id")
_state = {"started": False}


class DistributedError(ValueError):
    """A bad multi-process setting (the CLI reports it as a usage error)."""


def add_flags(parser) -> None:
    """The three flags of an explicit multi-process launch (all or none)."""
    g = parser.add_argument_group("multi-process (one process per host; omit on TPU pods and SLURM)")
    g.add_argument("--coordinator", default=None, metavar="HOST:PORT", help="address of process 0's coordinator")
    g.add_argument("--num-processes", type=int, default=None, metavar="N", help="how many processes take part")
    g.add_argument("--process-id", type=int, default=None, metavar="I", help="this process's index, 0..N-1")


def _int_env(name: str, env=None) -> int:
    try:
        return int((os.environ if env is None else env).get(name, "0") or 0)
    except ValueError:
        return 0


def cluster_detected(env=None) -> bool:
    """True when the environment is a multi-process launch that ``jax.distributed.initialize()`` reads by itself."""
    env = os.environ if env is None else env
    if env.get("IPL_JAX_DISTRIBUTED", "") not in ("", "0"):
        return True
    if env.get("SLURM_JOB_ID") and max(_int_env("SLURM_NTASKS", env), _int_env("SLURM_NPROCS", env)) > 1:
        return True
    if _int_env("OMPI_COMM_WORLD_SIZE", env) > 1:
        return True
    hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
    return len([h for h in hosts.split(",") if h.strip()]) > 1 or bool(env.get("MEGASCALE_COORDINATOR_ADDRESS"))


def settings(coordinator=None, num_processes=None, process_id=None, env=None) -> dict | None:
    """The keyword arguments of ``jax.distributed.initialize`` for this launch ({} = JAX auto-detects), or None
    for a single process. Raises ``DistributedError`` on an incomplete or inconsistent set of values."""
    env = os.environ if env is None else env
    given = [coordinator, num_processes, process_id]
    if all(v is None for v in given) and env.get("JAX_COORDINATOR_ADDRESS"):
        coordinator = env["JAX_COORDINATOR_ADDRESS"]
        num_processes = _int_env("JAX_NUM_PROCESSES", env) or None
        process_id = int(env["JAX_PROCESS_ID"]) if env.get("JAX_PROCESS_ID", "").isdigit() else None
        given = [coordinator, num_processes, process_id]
    if all(v is None for v in given):
        return {} if cluster_detected(env) else None
    if any(v is None for v in given):
        missing = [f for f, v in zip(FLAGS, given) if v is None]
        raise DistributedError(f"{', '.join(missing)}: missing; a multi-process launch needs all of {', '.join(FLAGS)}")
    if ":" not in str(coordinator):
        raise DistributedError(f"--coordinator={coordinator!r}: expected HOST:PORT (process 0's address)")
    if num_processes < 1:
        raise DistributedError(f"--num-processes={num_processes}: must be >= 1")
    if not 0 <= process_id < num_processes:
        raise DistributedError(f"--process-id={process_id}: must be in 0..{num_processes - 1} (--num-processes)")
    return {"coordinator_address": str(coordinator), "num_processes": num_processes, "process_id": process_id}


def initialize(coordinator=None, num_processes=None, process_id=None, timeout: int | None = None) -> bool:
    """Start ``jax.distributed`` for a multi-process launch (explicit arguments, JAX's environment variables, or an
    auto-detected cluster); call it before any other JAX call. Idempotent; returns whether it started.
    ``IPL_JAX_INIT_TIMEOUT`` and ``IPL_JAX_HEARTBEAT_TIMEOUT`` (seconds) bound waiting for peers."""
    if _state["started"] or jax.distributed.is_initialized():
        return True
    kwargs = settings(coordinator, num_processes, process_id)
    if kwargs is None or kwargs.get("num_processes") == 1:
        return False
    timeout = timeout or _int_env("IPL_JAX_INIT_TIMEOUT")
    if timeout:
        kwargs["initialization_timeout"] = timeout
    heartbeat = _int_env("IPL_JAX_HEARTBEAT_TIMEOUT")
    if heartbeat:
        kwargs["heartbeat_timeout_seconds"] = heartbeat
    jax.distributed.initialize(**kwargs)
    _state["started"] = True
    return True


def initialize_from_args(args) -> bool:
    """``initialize`` from a command's parsed ``--coordinator`` / ``--num-processes`` / ``--process-id``."""
    return initialize(
        getattr(args, "coordinator", None), getattr(args, "num_processes", None), getattr(args, "process_id", None)
    )


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def is_main() -> bool:
    """True in the process that writes the job's files (process 0; the only one in a single-process run)."""
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Every process waits here until all have arrived (a no-op in one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def main_writes(name: str, fn: Callable[[], object]):
    """Run ``fn`` in the main process only, then wait for every process; ``fn``'s value in the main one, else None."""
    out = fn() if is_main() else None
    barrier(name)
    return out


def to_host(tree):
    """A pytree as numpy on this host; arrays spanning other processes' devices are all-gathered (a collective)."""

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree.map(one, tree)


def put(tree, shardings):
    """Arrays placed as global arrays with ``shardings`` (one for every leaf or a pytree): host values and local
    arrays copied slice by slice into this process's devices, global arrays resharded."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def one(x, s):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.device_put(x, s)
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, s, lambda idx: x[idx])

    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda x: one(x, shardings), tree)
    return jax.tree.map(one, tree, shardings)


def on_first_device(tree):
    """``tree`` committed to this process's first device (where an unmeshed jitted step leaves its outputs), so
    the second step does not compile again."""
    return jax.device_put(tree, jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))


def allgather_ints(values) -> np.ndarray:
    """int64[process_count, n]: every process's ``values`` in process order. A collective (main thread, all
    processes at the same point)."""
    mine = np.asarray(values, np.int64).reshape(1, -1)
    if jax.process_count() == 1:
        return mine

    every = multihost_utils.process_allgather(mine.astype(np.int32))
    return np.asarray(every, np.int64).reshape(jax.process_count(), -1)


def _row_entries(index, shape, axis: int) -> np.ndarray:
    """The global entries along ``axis`` that one device's ``index`` (a tuple of slices) covers."""
    return np.arange(shape[axis])[index[axis]]


def held_rows(shardings, batch, axes, num_rows: int, devices=None) -> np.ndarray:
    """Sorted global rows (of ``num_rows``) that ``devices`` hold; ``shardings`` / ``batch`` / ``axes`` are pytrees
    of one structure, ``num_rows * k`` entries along each row axis."""
    devices = None if devices is None else set(devices)
    rows: set[int] = set()
    for s, leaf, axis in zip(*(jax.tree.leaves(t) for t in (shardings, batch, axes))):
        shape = tuple(leaf.shape)
        k = shape[axis] // num_rows
        for d, index in s.devices_indices_map(shape).items():
            if (d in devices) if devices is not None else (d.process_index == jax.process_index()):
                rows.update(int(g) // k for g in _row_entries(index, shape, axis))
    return np.asarray(sorted(rows), np.int64)


def batch_rows(rows: int, mesh, devices=None) -> np.ndarray | None:
    """Sorted rows of a ``rows``-row batch that ``devices`` hold under ``batch_spec`` on ``mesh``, or None when
    they hold every row (no mesh, one process, or rows that do not divide)."""
    if mesh is None:
        return None

    sharding = NamedSharding(mesh, batch_spec(mesh, (rows,), 0))
    held = held_rows(sharding, jax.ShapeDtypeStruct((rows,), np.float32), 0, rows, devices=devices)
    return None if len(held) == rows else held


def local_pieces(x: np.ndarray, sharding, axis: int, rows: np.ndarray, num_rows: int, devices=None) -> dict:
    """{device: numpy piece} of a leaf from process-local rows ``rows`` (k entries each along ``axis``); ValueError
    when a device needs a row ``x`` lacks."""
    x = np.asarray(x)
    k = x.shape[axis] // max(1, len(rows))
    shape = x.shape[:axis] + (num_rows * k,) + x.shape[axis + 1 :]
    where = np.full(num_rows, -1, np.int64)
    where[rows] = np.arange(len(rows))
    devices = sharding.addressable_devices if devices is None else devices
    index_map = sharding.devices_indices_map(shape)
    out = {}
    for d in devices:
        g = _row_entries(index_map[d], shape, axis)
        local_row = where[g // k]
        if (local_row < 0).any():
            raise ValueError(f"device {d} holds rows {sorted(set((g // k).tolist()))}, not all among {rows.tolist()}")
        sel = list(index_map[d])
        sel[axis] = local_row * k + g % k
        out[d] = x[tuple(sel)]
    return out


def from_local_rows(tree, shardings, axes, rows: np.ndarray, num_rows: int):
    """Global arrays with ``shardings`` from process-local rows ``rows`` of ``num_rows`` (along ``axes``), each
    process handing over its own devices' pieces."""
    if jax.process_count() == 1 and len(rows) == num_rows:
        return jax.device_put(tree, shardings)

    def one(x, s, axis):
        x = np.asarray(x)
        pieces = local_pieces(x, s, axis, rows, num_rows)
        shape = x.shape[:axis] + (x.shape[axis] // len(rows) * num_rows,) + x.shape[axis + 1 :]
        return jax.make_array_from_single_device_arrays(shape, s, [jax.device_put(p, d) for d, p in pieces.items()])

    return jax.tree.map(one, tree, shardings, axes)
