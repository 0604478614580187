"""monarch-launch: the standalone launcher that runs Monarch meshes on the hosts of a hostfile.

Kept import-light on purpose: the ssh preflight checks every worker host with
``find_spec("monarch_operator.launcher.workload")``, which imports this package. Monarch and torch
are imported only by ``runner`` (lazily) and ``workload``. Nothing here imports the operator's
controller, kopf or a Kubernetes client.
"""
