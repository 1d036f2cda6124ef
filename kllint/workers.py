"""Worker processes that analyse one file at a time, each within a budget.

LibCST's parser is native code: a pathological file (thousands of nested
brackets) can overflow its stack and kill the process. The analysis can take
exponential time or all the memory on a file nobody wrote by hand. So files
are analysed in child processes that the parent watches: a worker that dies,
runs past the time budget or exceeds its memory cap is replaced, and only its
file is reported; every other file is still linted.

Workers die with the parent (``PR_SET_PDEATHSIG`` on Linux, and a thread
that watches ``os.getppid()`` elsewhere), so a killed run, a CI timeout or a
closed terminal never leaves them behind. They ignore SIGINT: Ctrl-C reaches
the whole process group, and the parent decides what to do with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

# Per file: CPU seconds (where the OS tells them; wall-clock elsewhere), and
# address space a worker may add to what it had when it started (RLIMIT_AS).
# Generous for real code: the slowest file of trl, verl and OpenRLHF takes
# a few seconds and a few hundred MB. CPU time, not wall-clock, so that a
# busy machine does not turn slow files into timeouts; a worker that waits
# without computing for as long as the budget is stopped too.
FILE_TIMEOUT_S = 30.0
MEMORY_BUDGET_BYTES = 3 << 30
OUT_OF_MEMORY = 70  # a worker's exit status after a MemoryError


@dataclass
class Task:
    index: int  # the caller's key for this file
    payload: Any  # what ``analyse`` receives


@dataclass
class Failure:
    """A file whose worker died, timed out or ran out of memory."""

    index: int
    reason: str


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2
    CPU quota (containers and CI runners often have fewer than os.cpu_count())."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def run(
    tasks: Sequence[Task],
    workers: int,
    start: Callable[[], Callable[[Any], Any]],
    on_result: Callable[[int, Any], None],
    on_failure: Callable[[Failure], None],
    timeout_s: float | None = None,
) -> None:
    """Run ``analyse(task.payload)`` for every task in ``workers`` child
    processes, where ``analyse = start()`` is built once per worker (its
    project index). Results and failures are passed back as they come.

    Tasks are handed out in the order given, each to the next worker free:
    given the largest files first, the workers finish together."""
    timeout_s = FILE_TIMEOUT_S if timeout_s is None else timeout_s
    context = multiprocessing.get_context("fork" if sys.platform != "win32" else "spawn")
    queue = deque(tasks)
    queues = [queue] * max(1, min(workers, len(tasks)))  # one queue, shared
    pool = [_Worker(context, start, timeout_s) for _ in queues]
    try:
        _drive(pool, queues, start, context, on_result, on_failure, timeout_s)
    finally:
        for worker in pool:
            worker.stop()


def _drive(
    pool: list[_Worker],
    queues: list[deque[Task]],
    start: Callable[[], Callable[[Any], Any]],
    context: Any,
    on_result: Callable[[int, Any], None],
    on_failure: Callable[[Failure], None],
    timeout_s: float,
) -> None:
    def next_task(slot: int) -> Task | None:
        return queues[slot].popleft() if queues[slot] else None

    for slot, worker in enumerate(pool):
        task = next_task(slot)
        if task is not None:
            worker.give(task)
    retried: set[int] = set()
    while any(w.task is not None for w in pool):
        busy = [w for w in pool if w.task is not None]
        deadline = min(w.deadline for w in busy)
        handles: list[Any] = [w.connection for w in busy] + [w.process.sentinel for w in busy]
        ready = set(wait(handles, timeout=max(0.0, deadline - time.monotonic())))
        for slot, worker in enumerate(pool):
            task = worker.task
            if task is None:
                continue
            failure = None
            retry = False
            if worker.connection in ready or worker.process.sentinel in ready:
                try:
                    on_result(task.index, worker.connection.recv())
                except (EOFError, OSError):
                    worker.process.join(1)
                    failure = _death(worker.process.exitcode)
                    # What a worker holds from earlier files (parsed helpers)
                    # may be why it died: a fresh one tries the file once more.
                    retry = task.index not in retried
                    retried.add(task.index)
            elif time.monotonic() >= worker.deadline:
                if not worker.out_of_time():
                    continue
                failure = f"analysis took longer than {timeout_s:g} s"
            else:
                continue
            worker.task = None
            if failure is not None or not worker.process.is_alive():
                if failure is not None and not retry:
                    on_failure(Failure(task.index, failure))
                worker.stop()
                pool[slot] = worker = _Worker(context, start, timeout_s)
            following = task if retry else next_task(slot)
            if following is not None:
                worker.give(following)


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process, from /proc (Linux only)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _death(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (memory budget exceeded?)" if name in ("SIGABRT", "SIGKILL") else ""
        if name == "SIGSEGV":
            hint = " (the parser's stack overflowed? deeply nested code)"
        return f"the analysis crashed with {name}{hint}"
    if exitcode == OUT_OF_MEMORY:
        return f"analysis needed more than {MEMORY_BUDGET_BYTES >> 30} GiB of memory"
    return f"the analysis process exited unexpectedly (status {exitcode})"


class _Worker:
    def __init__(
        self, context: Any, start: Callable[[], Callable[[Any], Any]], timeout_s: float
    ) -> None:
        self.timeout_s = timeout_s
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, start, os.getpid()), daemon=True)
        self.process.start()
        child.close()
        self.task: Task | None = None
        self.progressed = self.deadline = self.cpu_seen = 0.0
        self.cpu_at_start: float | None = None

    def give(self, task: Task) -> None:
        self.task = task
        self.progressed = time.monotonic()
        self.cpu_at_start = _cpu_seconds(self.process.pid)
        self.cpu_seen = self.cpu_at_start or 0.0
        self.deadline = self.progressed + self.timeout_s
        with contextlib.suppress(OSError):  # the worker is gone; its sentinel reports it
            self.connection.send(task.payload)

    def out_of_time(self) -> bool:
        """Past the budget in CPU time, or stalled (no CPU time used) for as
        long; else the deadline moves to the next time to look."""
        now = time.monotonic()
        cpu = _cpu_seconds(self.process.pid)
        if cpu is None or self.cpu_at_start is None:
            return True  # no CPU accounting here: the budget is wall-clock
        if cpu >= self.cpu_seen + 0.05:  # more than the parent-watch thread's ticks
            self.cpu_seen, self.progressed = cpu, now
        used = cpu - self.cpu_at_start
        if used >= self.timeout_s or now - self.progressed >= self.timeout_s:
            return True
        self.deadline = now + min(max(0.2, self.timeout_s - used), self.timeout_s / 4)
        return False

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.connection.close()


def _serve(connection: Connection, start: Callable[[], Callable[[Any], Any]], parent: int) -> None:
    faulthandler.disable()  # a crash is reported by the parent, not dumped by each worker
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent)
    limit_memory(MEMORY_BUDGET_BYTES)
    analyse = start()
    while True:
        try:
            payload = connection.recv()
        except (EOFError, OSError):
            return
        try:
            result = analyse(payload)
        except MemoryError:
            os._exit(OUT_OF_MEMORY)  # the parent reports the file; nothing left to trust here
        connection.send(result)


def die_with_parent(parent: int) -> None:
    """Exit when ``parent`` does, however it ends (SIGKILL included)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before the prctl took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="kllint-parent-watch").start()


def limit_memory(budget: int) -> None:
    """Cap the address space at what the process maps now plus ``budget``:
    a file that needs more raises MemoryError (or kills the worker) instead
    of swapping the machine."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on POSIX
        return
    mapped = _mapped_bytes()
    if mapped is None:
        return
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = mapped + budget
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        if soft == resource.RLIM_INFINITY or limit < soft:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _mapped_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")
