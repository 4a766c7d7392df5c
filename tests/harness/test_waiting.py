"""A process-directed signal runs Python's C handler in whichever thread the kernel picks; its Python handler runs
only in the main thread, and only once that thread executes bytecode again. A main thread blocked in a plain
``Event.wait()`` or ``Thread.join()`` never does: the SIGTERM that landed in another thread is not handled until
the wait ends (the CI failure of stop 33: a ``core-jobs worker`` that never stopped). harness.waiting's waits wake
in slices in the main thread, so a signal is handled within one slice whichever thread caught it."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from harness import waiting

pytestmark = pytest.mark.pure


@contextmanager
def sigterm_sets(event: threading.Event) -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, lambda _signum, _frame: event.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def sigterm_to_another_thread(after_s: float = 0.2) -> threading.Thread:
    """A thread that, after ``after_s``, sends SIGTERM to itself: the C handler runs there, not in the main thread."""

    def deliver() -> None:
        time.sleep(after_s)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    thread = threading.Thread(target=deliver, name="caught-elsewhere")
    thread.start()
    return thread


def test_a_sigterm_caught_by_another_thread_ends_a_wait_of_the_main_thread_within_a_slice():
    """The handler sets the event the main thread waits on; the wait returns True well before its 10 s timeout."""
    stop = threading.Event()
    with sigterm_sets(stop):
        deliverer = sigterm_to_another_thread()
        started = time.monotonic()
        assert waiting.wait(stop, 10) is True
        elapsed = time.monotonic() - started
    deliverer.join()
    assert elapsed < 0.2 + 5 * waiting.SLICE_S, elapsed


def test_a_sigterm_caught_by_another_thread_ends_a_join_of_the_main_thread_within_a_slice():
    """The threads joined run until the handler's event is set: the join ends soon after the signal."""
    stop = threading.Event()
    workers = [threading.Thread(target=stop.wait, args=(10,)) for _ in range(2)]
    with sigterm_sets(stop):
        for worker in workers:
            worker.start()
        deliverer = sigterm_to_another_thread()
        started = time.monotonic()
        waiting.join(workers)
        elapsed = time.monotonic() - started
    deliverer.join()
    assert not any(w.is_alive() for w in workers)
    assert elapsed < 0.2 + 5 * waiting.SLICE_S, elapsed


def test_a_wait_still_times_out_and_says_so():
    """Unset, ``wait`` returns False after about its timeout, as Event.wait does."""
    started = time.monotonic()
    assert waiting.wait(threading.Event(), 0.25) is False
    assert 0.25 <= time.monotonic() - started < 0.25 + 5 * waiting.SLICE_S


def test_outside_the_main_thread_a_wait_is_the_plain_one():
    """Another thread cannot run a handler anyway: it waits in one piece, and returns as soon as the event is set."""
    stop, answers = threading.Event(), []
    waiter = threading.Thread(target=lambda: answers.append(waiting.wait(stop, 10)))
    waiter.start()
    stop.set()
    waiter.join(5)
    assert answers == [True]


class LockedEvent(threading.Event):
    """An event whose waiting (which takes its lock) is refused in the main thread."""

    def wait(self, timeout: float | None = None) -> bool:
        assert threading.current_thread() is not threading.main_thread(), "the main thread took the event's lock"
        return super().wait(timeout)


def test_the_main_thread_never_takes_the_events_lock_so_a_handlers_set_cannot_wait_for_it():
    """A handler's ``set()`` runs in the main thread and takes the event's lock: had the main thread been inside
    ``Event.wait`` holding it, the handler would wait for itself. In the main thread the wait only reads ``is_set``."""
    stop = LockedEvent()
    with sigterm_sets(stop):
        deliverer = sigterm_to_another_thread()
        assert waiting.wait(stop, 10) is True
    deliverer.join()
    assert waiting.wait(LockedEvent(), 0.15) is False
