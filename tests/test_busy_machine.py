"""The OpenMP wait policy chosen at import: threads that sleep between parallel steps only
where the machine is already busy (pagedchat/__init__.py)."""

from __future__ import annotations

import os

import pytest

import pagedchat


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)


@pytest.mark.parametrize(("runnable", "busy"), [(1, False), (2, False), (3, True), (9, True)])
def test_busy_means_other_threads_runnable_on_every_core(tmp_path, monkeypatch, two_cores,
                                                         runnable, busy):
    """Counted now, this thread aside: a load average of 9 left by a run that has just ended
    (a benchmark's last round) is no reason to sleep."""
    queue = tmp_path / "loadavg"
    queue.write_text(f"9.00 4.00 2.00 {runnable}/345 6789\n")
    monkeypatch.setattr(pagedchat, "RUN_QUEUE", str(queue))
    monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 4.0, 2.0))
    assert pagedchat._machine_is_busy() is busy


@pytest.mark.parametrize(("load", "busy"), [(0.4, False), (1.99, False), (2.0, True),
                                            (9.5, True)])
def test_without_a_run_queue_busy_means_a_load_average_of_at_least_the_cores(
        tmp_path, monkeypatch, two_cores, load, busy):
    monkeypatch.setattr(pagedchat, "RUN_QUEUE", str(tmp_path / "missing"))
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    assert pagedchat._machine_is_busy() is busy
