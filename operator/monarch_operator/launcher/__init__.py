"""monarch-launch: the standalone launcher that runs Monarch meshes on the hosts of a hostfile.

Kept import-light on purpose: the pre-flight checks every worker host with
``find_spec("monarch_operator.launcher.programs.workload")`` (or ``.spmd_actor``), which imports
this package. Monarch is imported only once the pre-flight has passed; torch only on the ranks
(``workload`` imports it inside the actors' methods, never in the launcher's process).
Nothing here imports the operator's controller, kopf or a Kubernetes client.
"""

from typing import Any

__all__ = ["SpmdLauncher", "SpmdRunError", "spmd_launcher"]


def __getattr__(name: str) -> Any:
    # The in-code SPMD API, imported on first use so that the package itself stays light.
    if name in __all__:
        from monarch_operator.launcher.programs import spmd

        return getattr(spmd, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
