"""Stage 1, hosts and placement: where the hosts come from (hostfile, --hosts, Slurm) and
which role runs on which host and GPUs. Pure: no ssh, no Monarch."""
