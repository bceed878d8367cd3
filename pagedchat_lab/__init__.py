"""The paper's evaluation: workloads (ShareGPT), peers, measurements and reports."""
