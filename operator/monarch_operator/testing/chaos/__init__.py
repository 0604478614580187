"""The chaos soak (issue 20 item 7): MonarchJobs on the local cluster while faults are injected,
with every invariant checked after every step. ``plan`` (pure) says what each job runs and what
its attempts must end as, ``checks`` (pure) judges what was observed, ``procs`` reads the host's
processes, ``faults`` injects, ``soak`` runs the loop and prints the table.

Used by ``bench/chaos.py`` (30 minutes by default) and ``tests/cluster/test_chaos_short.py``.
"""
