"""Several proxy processes on one port: ``sqldp proxy --workers N``.

One proxy process holds Python's GIL while it analyses statements, adds noise and speaks the protocol, so on
its own it uses about one core whatever the number of clients. Here a parent process does the one-time
set-up (the analyst role, the ledger's tables and limits, the shadow database: :func:`sqldp.proxy.build`),
then starts ``N`` worker processes that each build their own server (session, prepared-statement cache,
upstream and ledger pools) and listen on the same address with ``SO_REUSEPORT``.

Why ``SO_REUSEPORT`` rather than a parent that accepts and hands each socket to a worker: the kernel spreads
the connections over the listening sockets (by a hash of the addresses and ports, Linux ≥ 3.9, socket(7)),
the accept path stays in each worker's event loop as with one process, and the parent does no per-connection
work, so it cannot become a bottleneck nor a single point that loses connections while a worker restarts.
Only sockets of the same user may join the group. Linux is required: other systems either lack the option or
give every connection to one socket (macOS, OpenBSD), which would defeat the purpose.

Each worker owns its connections: the process id in a connection's BackendKeyData is ≡ the worker's index
modulo ``N`` (:meth:`ProxyServer.as_worker`), and a CancelRequest — which arrives on a new connection that
may land on any worker — is forwarded to the owner over a Unix socket in a directory only the proxy's user
may enter.

The budget needs nothing more: the ledger is in PostgreSQL and every charge is one conditional ``UPDATE``
committed before the answer is released (:mod:`sqldp.proxy.ledger`), which PostgreSQL serialises per analyst
row whatever process sends it.

The parent stops the workers on SIGTERM or SIGINT (SIGTERM to each, SIGKILL after ``STOP_TIMEOUT``), then
drops the shadow database. A worker that dies is started again; more than ``RESTARTS`` deaths within
``RESTART_WINDOW`` seconds (a worker that cannot start, a crash loop) stop the proxy with an error. A worker
dies with its parent (Linux's ``PR_SET_PDEATHSIG``): a proxy killed with SIGKILL leaves no worker serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from sqldp.errors import DatabaseError, InputError, SqldpError
from sqldp.proxy import Shared, build

log = logging.getLogger("sqldp.proxy")

MAX_WORKERS = 256
START_TIMEOUT = 120.0  # seconds a worker may take to build its server and listen
STOP_TIMEOUT = 10.0  # seconds a worker has to finish after SIGTERM
RESTARTS, RESTART_WINDOW = 5, 60.0


def supported() -> bool:
    """Whether this system spreads connections over ``SO_REUSEPORT`` sockets (see the module's text)."""
    return sys.platform.startswith("linux")


def default_workers() -> int:
    """The number of CPUs this process may run on (1 where several workers are not supported)."""
    if not supported():
        return 1
    try:
        return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        return max(1, min(MAX_WORKERS, os.cpu_count() or 1))


@dataclass(frozen=True)
class Spec:
    """What a worker process needs to build its server (picklable: it crosses to a spawned process)."""

    dsn: str
    policy: str
    schema: str | None
    ledger_dsn: str | None
    host: str
    port: int
    shared: Shared
    peers: tuple[str, ...]  # each worker's socket for forwarded cancel requests
    log_level: int


def _event(**entry: Any) -> None:
    log.warning(json.dumps(entry))


def _die_with_parent(parent: int) -> None:
    """Have the kernel kill this process when its parent dies (prctl(2) PR_SET_PDEATHSIG), even by SIGKILL:
    an orphaned worker would go on answering and charging with no parent to stop it."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _worker(index: int, spec: Spec, parent: int, report: Connection) -> None:
    """A worker process: build a server (its own session, cache and pools) and serve until SIGTERM/SIGINT."""
    _die_with_parent(parent)
    logging.basicConfig(stream=sys.stderr, level=spec.log_level, format="%(message)s")
    try:
        built = build(spec.dsn, spec.policy, schema=spec.schema, ledger_dsn=spec.ledger_dsn, shared=spec.shared)
    except Exception as exc:
        _report_failure(report, exc)
        sys.exit(1)
    try:
        built.server.as_worker(index, spec.peers)
        asyncio.run(_serve(built.server, spec, index, report))
    finally:
        built.close()


def _report_failure(report: Connection, exc: BaseException) -> None:
    err = exc if isinstance(exc, SqldpError) else DatabaseError(f"{exc.__class__.__name__}: {exc}")
    with contextlib.suppress(Exception):
        report.send(("failed", err))


async def _serve(server: Any, spec: Spec, index: int, report: Connection) -> None:
    try:
        listening = await server.serve(spec.host, spec.port, reuse_port=True)
    except OSError as exc:
        where = f"{spec.host}:{spec.port}"
        _report_failure(report, InputError(f"cannot listen on {where}: {exc.strerror}", where="--listen"))
        raise SystemExit(1) from None
    path = spec.peers[index]
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # left by this worker's predecessor, if it died
    peer = await server.serve_peers(path)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    report.send(("ready", listening.sockets[0].getsockname()[1]))
    async with listening, peer:
        await stop.wait()
        await server.shutdown()


class Supervisor:
    """The parent: starts the workers, restarts one that dies, stops them all on a signal."""

    def __init__(self, spec: Spec, count: int) -> None:
        self.spec = spec
        self.count = count
        self.context = multiprocessing.get_context("spawn")  # not fork: the parent has run threads (its pools)
        self.procs: list[Any] = [None] * count
        self.deaths: list[float] = []
        self._wake_r, self._wake_w = os.pipe()
        self.stopping = False

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def start(self, index: int) -> int:
        """Start worker ``index`` and wait until it listens; its port."""
        mine, theirs = self.context.Pipe(duplex=False)
        proc = self.context.Process(
            target=_worker, args=(index, self.spec, os.getpid(), theirs), name=f"sqldp-proxy-{index}", daemon=True
        )
        proc.start()
        theirs.close()
        self.procs[index] = proc
        deadline = time.monotonic() + START_TIMEOUT
        while not self.stopping:
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                raise DatabaseError(f"proxy worker {index} did not start within {START_TIMEOUT:g} s")
            ready = wait([mine, proc.sentinel, self._wake_r], timeout=left)
            if mine in ready:
                try:
                    kind, value = mine.recv()
                except EOFError:
                    kind, value = "failed", None
                if kind == "ready":
                    return int(value)
                proc.join(timeout=STOP_TIMEOUT)
                if isinstance(value, SqldpError):
                    raise value
                raise DatabaseError(f"proxy worker {index} failed to start (exit code {proc.exitcode})")
            if proc.sentinel in ready:
                raise DatabaseError(f"proxy worker {index} exited while starting (exit code {proc.exitcode})")
        return 0

    def run(self, announce: Callable[[str, int], None]) -> int:
        """Serve until a signal (0) or until workers die too often (1)."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            port = self.start(0)
            self.spec = _with_port(self.spec, port)  # the port worker 0 bound (the one asked, or a free one)
            for i in range(1, self.count):
                self.start(i)
            if not self.stopping:
                announce(self.spec.host, port)
            return self._watch()
        finally:
            self.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _watch(self) -> int:
        while not self.stopping:
            sentinels = {p.sentinel: i for i, p in enumerate(self.procs)}
            ready = wait([*sentinels, self._wake_r])
            for fd in ready:
                if fd == self._wake_r or self.stopping:
                    continue
                index = sentinels[fd]
                proc = self.procs[index]
                proc.join()
                if self._too_many_deaths(index, proc.exitcode, f"with exit code {proc.exitcode}"):
                    return 1
                # A worker killed while it starts is one more death, not a reason to give up at once: only
                # the count in the window decides, whether the workers die serving or starting.
                while not self.stopping:
                    try:
                        self.start(index)
                        break
                    except SqldpError as exc:
                        if self._too_many_deaths(index, self.procs[index].exitcode, f"while starting: {exc}"):
                            return 1
        return 0

    def _too_many_deaths(self, index: int, exitcode: int | None, how: str) -> bool:
        """Record that worker ``index`` died; whether that makes more than ``RESTARTS`` in the window (then
        say so: the proxy stops)."""
        now = time.monotonic()
        self.deaths = [t for t in self.deaths if now - t < RESTART_WINDOW] + [now]
        if len(self.deaths) <= RESTARTS:
            _event(event="worker_exit", worker=index, exitcode=exitcode, detail=how, restarted=True)
            return False
        _event(event="worker_exit", worker=index, exitcode=exitcode, detail=how, restarted=False)
        print(
            f"sqldp proxy: {len(self.deaths)} worker processes died within {RESTART_WINDOW:g} s "
            f"(the last, worker {index}, {how}); stopping",
            file=sys.stderr,
            flush=True,
        )
        return True

    def stop(self) -> None:
        live = [p for p in self.procs if p is not None and p.is_alive()]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for p in live:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(timeout=STOP_TIMEOUT)


def _with_port(spec: Spec, port: int) -> Spec:
    from dataclasses import replace

    return replace(spec, port=port)


def serve(
    dsn: str,
    policy: str,
    *,
    schema: str | None,
    ledger_dsn: str | None,
    listen: tuple[str, int] | None,
    workers: int,
    log_level: int,
    announce: Callable[[str, int], None],
) -> int:
    """Run the proxy as ``workers`` processes until SIGTERM/SIGINT; the exit status (0, or 1 when workers kept
    dying). ``announce(host, port)`` is called once every worker listens."""
    if not supported():
        raise InputError(
            f"several worker processes need Linux's SO_REUSEPORT (this is {sys.platform}); use --workers 1",
            where="--workers",
        )
    built = build(dsn, policy, schema=schema, ledger_dsn=ledger_dsn)  # the one-time set-up, and every check
    session, shadow = built.server.session, built.server.shadow
    assert session.analyst_dsn is not None
    shared = Shared(session.analyst_dsn, shadow.name if shadow is not None else None)
    built.server.shadow = None  # kept until the workers stop (close() would drop it now)
    host, port = listen or built.config.listen
    built.close()
    sockets = Path(tempfile.mkdtemp(prefix="sqldp-proxy-"))  # mode 0700: only the proxy's user may connect
    try:
        peers = tuple(str(sockets / f"worker-{i}.sock") for i in range(workers))
        spec = Spec(dsn, policy, schema, ledger_dsn, host, port, shared, peers, log_level)
        return Supervisor(spec, workers).run(announce)
    finally:
        if shadow is not None:
            shadow.close()
        shutil.rmtree(sockets, ignore_errors=True)
