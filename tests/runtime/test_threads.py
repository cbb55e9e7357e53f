"""runtime/threads.py: in_background's calls on a pool."""
import threading
import time

import pytest
from meganeura.runtime.threads import in_background


def test_once_a_call_fails_the_calls_not_started_are_skipped():
    """Skipped at once on the pool's threads, not only when the caller gets to finish (a
    load's caller is busy meanwhile); finish raises the first failed call's error, in order."""
    ran, lock = [], threading.Lock()

    def call(i):
        with lock:
            ran.append(i)
        if i == 1:
            raise ValueError("call 1 failed")
        time.sleep(0.02)
        return i
    finish = in_background({i: (call, i) for i in range(40)}, 2)
    time.sleep(0.5)  # (the caller busy elsewhere: 40 calls of 20 ms on 2 threads would all have run)
    with pytest.raises(ValueError, match="call 1 failed"):
        finish()
    assert 2 <= len(ran) <= 3 < 40, ran  # calls 0 and 1, and one more if it had started
    assert in_background({i: (lambda i: i * i, i) for i in range(20)}, 3)() == {i: i * i for i in range(20)}
