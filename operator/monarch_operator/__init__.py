"""monarch-operator: run PyTorch Monarch jobs on Kubernetes and on plain SSH clusters.

Subpackages:
- ``controller``: the kopf operator for the ``MonarchJob`` custom resource (never imports Monarch).
- ``launcher``: ``monarch-launch``, which builds a Monarch ``SSHJob`` over a hostfile (never
  imports the operator).
- ``localcluster``: a real local control plane on 127.0.0.1 for the demo and the tests.

The two sides share only :mod:`monarch_operator.hostfile` and :mod:`monarch_operator.constants`.
"""

__version__ = "0.1.0"
