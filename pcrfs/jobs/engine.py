"""Where the offline tools' tasks run (build's records, materialize's packs, push's
uploads): `--engine local` (this process: a shared pool of `workers` threads, a few tasks
in flight, so one is written while the next is prepared) or `--engine dask[=ADDRESS]`
(Dask distributed: an embedded LocalCluster of `workers` processes, or a running
scheduler).  Both run the same task function on the same tasks and report each result to
on_done, in whatever order they finish.  A task function is module-level (Dask pickles it
by name) and takes (task, pool): the shared pool locally, None on a Dask worker."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from pcrfs.errors import PcrfsError

CONNECT_TIMEOUT = "10s"   # an unreachable scheduler fails the build within this
TASK_RETRIES = 2          # a task that raised (a store's error) runs again up to this often


def parse_engine(spec: str) -> tuple[str, str | None]:
    """'local' -> ('local', None); 'dask' -> ('dask', None); 'dask=tcp://h:8786' ->
    ('dask', 'tcp://h:8786')."""
    name, _, address = spec.partition("=")
    if name not in ("local", "dask") or (name == "local" and address):
        raise PcrfsError(f"--engine {spec}: expected local, dask or dask=ADDRESS")
    if name == "dask" and _ and not address:
        raise PcrfsError("--engine dask=: no scheduler address")
    return name, address or None


def check_engine(spec: str) -> None:
    """Refuse a bad --engine before the build writes anything."""
    name, address = parse_engine(spec)
    if address:
        _reachable(address)


def run_tasks(fn: Callable, tasks: Sequence, engine: str, workers: int,
              on_done: Callable, name: str = "pcrfs", in_flight: int = 2) -> None:
    """fn(task, pool) for every task; name prefixes the Dask task keys (unique per run)."""
    kind, address = parse_engine(engine)
    if not tasks:
        return
    if kind == "local":
        _run_local(fn, tasks, workers, on_done, in_flight)
    else:
        _run_dask(fn, tasks, address, workers, on_done, name)


def _run_local(fn, tasks, workers, on_done, in_flight) -> None:
    # Threads, not processes: the C transcoder and Pillow's codecs release the GIL.
    with ThreadPoolExecutor(workers, thread_name_prefix="pcrfs-work") as pool, \
            ThreadPoolExecutor(in_flight, thread_name_prefix="pcrfs-task") as outer:
        queue = iter(tasks)
        running = set()
        try:
            while True:
                while len(running) < in_flight:
                    t = next(queue, None)
                    if t is None:
                        break
                    running.add(outer.submit(fn, t, pool))
                if not running:
                    return
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    on_done(f.result())
        except BaseException:
            for f in running:
                f.cancel()
            raise


def _run_dask(fn, tasks, address, workers, on_done, name) -> None:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError:
        raise PcrfsError("--engine dask needs Dask distributed: pip install 'pcrfs[dask]'") from None
    cluster = None
    try:
        if address:
            try:
                client = Client(address, timeout=CONNECT_TIMEOUT)
            except (OSError, TimeoutError) as e:
                raise PcrfsError(f"--engine dask: cannot reach the Dask scheduler at {address} "
                                 f"({type(e).__name__}: {e})") from None
        else:
            # worker processes of one thread each: a task runs in series on its worker
            cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=logging.ERROR)
            client = Client(cluster)
        with client:
            futures = client.map(fn, tasks, [None] * len(tasks), pure=False,
                                 retries=TASK_RETRIES,
                                 key=[f"{name}-{i:08d}" for i in range(len(tasks))])
            try:
                for fut in as_completed(futures):
                    on_done(fut.result())
            except BaseException:
                client.cancel(futures)
                raise
    finally:
        if cluster is not None:
            cluster.close()


def _reachable(address: str) -> None:
    """Fail at once on a refused or unresolvable tcp:// address (Dask's own connect
    retries until its time-out, CONNECT_TIMEOUT)."""
    import socket
    from urllib.parse import urlsplit
    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    if parts.scheme != "tcp" or not parts.hostname:
        return      # tls://, inproc:// and others: Dask's connect decides
    try:
        socket.create_connection((parts.hostname, parts.port or 8786), timeout=5).close()
    except OSError as e:
        raise PcrfsError(f"--engine dask: cannot reach the Dask scheduler at {address} "
                         f"({e.strerror or type(e).__name__})") from None


def default_workers() -> int:
    return os.cpu_count() or 1
