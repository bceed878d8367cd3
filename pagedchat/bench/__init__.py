"""Workloads (ShareGPT), peers, measurements and reports: `pagedchat bench`, `batch`, `inspect`."""
