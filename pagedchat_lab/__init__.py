"""pagedchat's lab: the paper's evaluation (ShareGPT workloads, peers, measurements and
reports) and the scripts only developers run, in a package of its own beside pagedchat.
``pagedchat bench`` loads it when a bench runs; it imports pagedchat, never the reverse."""
