"""Process-wide graceful shutdown: SIGTERM/SIGINT stop new pages, in-flight work drains; and the thread pool whose
calls never keep a stopping process alive."""

from __future__ import annotations

import logging
import signal
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

STOP = threading.Event()
"""Set when the process was asked to stop; engines stop taking new work."""

_log = logging.getLogger("batch_assets.shutdown")


def _handle(signum: int, _frame: FrameType | None) -> None:
    if STOP.is_set() and signum == signal.SIGINT:
        raise KeyboardInterrupt  # a second Ctrl-C forces the way out
    _log.warning("received %s: stopping new work, draining in-flight pages", signal.Signals(signum).name)
    STOP.set()


def install_signal_handlers() -> None:
    """Route SIGTERM and SIGINT to `STOP` (main thread only), starting from a clear `STOP`."""
    if threading.current_thread() is threading.main_thread():
        STOP.clear()
        signal.signal(signal.SIGTERM, _handle)
        signal.signal(signal.SIGINT, _handle)


class DaemonThreadPool(Executor):
    """Up to `workers` daemon threads running the calls submitted to it, in order: a `ThreadPoolExecutor` whose threads
    never hold the process at its exit, for calls into code that may never return (a team's compute or handler).

    ThreadPoolExecutor joins its threads when the interpreter exits, so one call that never returns keeps a stopped
    process alive for as long as the call lasts. A Python thread cannot be killed: a caller that gives up on a call
    (`abandon`) leaves its thread to finish on its own, and that thread no longer counts among the `workers`, so the
    calls queued behind it get a new thread instead of waiting for it."""

    def __init__(self, workers: int, name: str) -> None:
        self._workers = max(1, workers)
        self._name = name
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._queue: deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = deque()
        self._threads: set[threading.Thread] = set()
        self._idle = 0
        self._running: dict[Future[Any], threading.Thread] = {}
        self._lost: set[threading.Thread] = set()
        self._shutdown = False
        self._started = 0

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self._name}: cannot take a call after shutdown")
            self._queue.append((future, fn, args, kwargs))
            self._wake()
        return future

    def abandon(self, future: Future[Any]) -> None:
        """The caller gave up on `future`'s call: its thread, if it is still inside the call, leaves the pool's count
        (and the pool) when the call ends; its result is set on `future` and read by no one."""
        with self._lock:
            thread = self._running.get(future)
            if thread is not None:
                self._lost.add(thread)
                if self._queue:
                    self._wake()
            elif not future.done():
                future.cancel()

    def _wake(self) -> None:
        """A queued call gets an idle thread, else a new one while fewer than `workers` count (lock held)."""
        if self._idle:
            self._idle -= 1  # counted here, not by the thread that wakes: two calls in a row wake two threads
            self._ready.notify()
        elif len(self._threads) - len(self._lost) < self._workers:
            self._started += 1
            thread = threading.Thread(target=self._work, name=f"{self._name}_{self._started}", daemon=True)
            self._threads.add(thread)
            thread.start()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft()[0].cancel()
            self._ready.notify_all()
            threads = [t for t in self._threads if t not in self._lost]
        if wait:
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                while not self._queue and not self._shutdown:
                    self._idle += 1
                    self._ready.wait()
                if not self._queue or me in self._lost:
                    self._threads.discard(me)
                    self._lost.discard(me)
                    return
                future, fn, args, kwargs = self._queue.popleft()
                self._running[future] = me
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # the caller's to judge, as ThreadPoolExecutor hands it over
                    future.set_exception(exc)
                    del exc
                else:
                    future.set_result(result)
                    del result
            with self._lock:
                self._running.pop(future, None)
                if me in self._lost:  # given up on: a thread of its own replaced it
                    self._threads.discard(me)
                    self._lost.discard(me)
                    return
            del future, fn, args, kwargs
