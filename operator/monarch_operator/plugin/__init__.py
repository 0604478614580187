"""``kubectl monarch``: a kubectl plugin for MonarchJobs (``kubectl-monarch`` on PATH, the name
kubectl discovers plugins by): status, logs, hosts, exec and describe of one job."""
