"""What this process may use of the machine."""

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def memory_bytes() -> float:
    """The machine's physical memory (inf where the system does not say)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(
        os, "sysconf") else float("inf")
