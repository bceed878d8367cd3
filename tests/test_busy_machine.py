"""The OpenMP wait policy chosen at import: threads that sleep between parallel steps only
where the machine is already busy (pagedchat/__init__.py)."""

from __future__ import annotations

import os

import pytest

import pagedchat


@pytest.mark.parametrize(("load", "busy"), [(0.4, False), (1.99, False), (2.0, True),
                                            (9.5, True)])
def test_busy_means_a_load_average_of_at_least_the_cores(monkeypatch, load, busy):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert pagedchat._machine_is_busy() is busy
