"""One call run beside the caller's own work, on a daemon thread: a release's deposit while the next round
collects, a teacher's seed while its share goes to the student.

A daemon thread, because such a call may be waiting out a fault (with backoff) when its party stops for
another reason; a party that exits must not wait for it. What the call raises is kept and raised again in
the caller's thread by :meth:`Background.result`, so no failure passes unseen.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Background"]
T = TypeVar("T")


class Background(Generic[T]):
    """``call()`` started on a daemon thread now.

    Args:
        call: the work.
        name: the thread's name (for logs and stack dumps).
    """

    def __init__(self, call: Callable[[], T], *, name: str) -> None:
        self._call = call
        self._value: list[T] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value.append(self._call())
        except BaseException as exc:  # handed to result(), in the caller's thread
            self._error = exc

    def result(self) -> T:
        """The call's result, once it is done.

        Raises:
            BaseException: what the call raised.
        """
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value[0]
