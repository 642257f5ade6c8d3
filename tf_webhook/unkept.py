"""Admission warnings for values we accept and store but do not act on yet: never silence.

The request model parses every TensorFusion field strictly, and the generated TensorFusionWorkload
keeps them, so a user who turns autoscaling on, asks for replicas or a standalone worker, or
configures prediction gets no error — and, until a controller implements them, no effect. Each such
value is named in a warning the API server hands back to ``kubectl``, saying what does not happen,
so that silence is never mistaken for a promise. The three autoscaling layers are acted on by the
autoscaler in the extender (docs/autoscaling.md), so they warn no more; their prediction blocks still
do. Pure: a resolved request in, warning texts out.
"""

from __future__ import annotations

from typing import Final

from vgpu.names import Annotation
from vgpu.request import GpuRequest

_PREDICTING: Final = ("autoSetLimits", "autoSetRequests")


def _enabled(block: object) -> bool:
    return isinstance(block, dict) and block.get("enable") is True


def unkept(req: GpuRequest) -> tuple[str, ...]:
    """One warning per accepted value nothing acts on, naming the field and what does not happen."""
    out = []
    for block in _PREDICTING:
        config = dict(req.auto_scaling.get(block) or {})
        if _enabled(config.get("prediction")):
            out.append(
                f"autoScalingConfig.{block}.prediction.enable: accepted but not implemented: "
                "no usage prediction is made (decisions use measured usage only)"
            )
    if req.replicas is not None and not _enabled(req.auto_scaling.get("autoSetReplicas")):
        out.append(
            f"{Annotation.REPLICAS} / replicas '{req.replicas}': recorded on the TensorFusionWorkload only; it "
            "creates and scales no pods (the owning Deployment or StatefulSet's replicas decide). With "
            f"{Annotation.AUTO_REPLICAS} it is the fewest replicas the autoscaler keeps"
        )
    if req.no_standalone_worker_mode:
        out.append(
            f"{Annotation.NO_STANDALONE_WORKER_MODE} / standaloneWorkerMode: recorded only; every pod uses its "
            "granted GPU from its own containers (there is no separate worker to run or skip)"
        )
    return tuple(out)
