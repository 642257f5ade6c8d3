"""The Prometheus metrics' names: one prefix for every binary, and the device plugin's series (and the extender's
newer ones), spelled once.

Dashboards and alerts are written against these names, so each is spelled here only and the table in
``docs/metrics.md`` lists them (a test holds the two together). The scheme: every binary's metrics start
with :data:`PREFIX` (TensorFusion's own ``tf_``); then comes the component for a binary's own workings
(:data:`EXTENDER`, :data:`WEBHOOK`, :data:`DEVICE_PLUGIN`), or the thing measured for what a device plugin
sees on its node (``tf_gpu_…`` per GPU, ``tf_container_…`` per container and GPU); the unit ends the name
(``_bytes``, ``_seconds``, ``_total``, ``_ratio`` for a 0–1 fraction; TFLOPS are plain TFLOPS). Every GPU
and container series carries ``node``, so one query spans the cluster, and a GPU's capacity, allocation
and use are metrics of their own (the extender's node and pool totals, older, keep a ``kind`` label).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

PREFIX: Final = "tf"
EXTENDER: Final = f"{PREFIX}_extender"  # scheduler_extender/metrics.py prefixes its names with it
WEBHOOK: Final = f"{PREFIX}_webhook"
DEVICE_PLUGIN: Final = f"{PREFIX}_device_plugin"
METRICS_API: Final = f"{PREFIX}_metrics"  # tf-metrics, the custom metrics API (tf_metrics/)
AUTOSCALER: Final = f"{PREFIX}_autoscaler"  # the autoscaler in the extender (scheduler_extender/autoscaler/)

GPU_LABELS: Final = ("node", "gpu", "index", "model")
NODE_GPU: Final = ("node", "gpu")
CONTAINER_LABELS: Final = ("node", "namespace", "pod", "container", "gpu")


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric: its full name, what it means (Prometheus's HELP text) and its labels."""

    name: str
    help: str
    labels: tuple[str, ...] = ()


BUILD_INFO: Final = Metric(f"{PREFIX}_build_info", "Always 1; which binary at which version.", ("component", "version"))

# --- the extender's (scheduler_extender/metrics.py spells its older names itself) ----------------------
EXTENDER_PENDING_PODS: Final = Metric(
    f"{EXTENDER}_pending_pods",
    "GPU pods waiting for a node (resolved by the webhook, unbound, unallocated, alive), per pool of their "
    "request (empty: unreadable); every pool with nodes is shown, at 0 when none waits.",
    ("pool",),
)

# --- the device plugin's own workings ------------------------------------------------------------
ALLOCATE_SECONDS: Final = Metric(f"{DEVICE_PLUGIN}_allocate_seconds", "Allocate RPC latency by outcome.", ("outcome",))
ALLOCATE_LOOKUP_WAIT_SECONDS: Final = Metric(
    f"{DEVICE_PLUGIN}_allocate_lookup_wait_seconds",
    "How long Allocate waited for the pod's allocation to reach the pod cache.",
)
ERRORS: Final = Metric(f"{DEVICE_PLUGIN}_errors_total", "Errors by where they happened.", ("where",))
# ERRORS' ``where`` of a container's live limits found tampered with (an alert fires on its first increase).
WHERE_TAMPER: Final = "live_limits_tamper"
ENVVAR_GUARD: Final = Metric(
    f"{DEVICE_PLUGIN}_envvar_guard",
    "1 for the state of the node's NVIDIA container toolkit guard: on (GPUs named in NVIDIA_VISIBLE_DEVICES by an "
    "unprivileged container are refused), off (any pod can take GPUs so), unknown (no readable configuration).",
    ("state",),
)
DEVICE_DELIVERY: Final = Metric(
    f"{DEVICE_PLUGIN}_device_delivery",
    "1 for how containers are given their GPUs: envvar, volume-mounts or cdi.",
    ("delivery",),
)
REGISTRATIONS: Final = Metric(f"{DEVICE_PLUGIN}_registrations_total", "Successful registrations with the kubelet.")
VRAM_OVERUSE: Final = Metric(
    f"{DEVICE_PLUGIN}_vram_overuse_total",
    "Pods found past their VRAM limit on a GPU by the driver's count (two samples in a row, beyond the tolerance), "
    "by outcome: killed (its largest process on the GPU), gone (that process had exited), kill_failed, reported.",
    ("outcome",),
)
COMPUTE_OVERUSE: Final = Metric(
    f"{DEVICE_PLUGIN}_compute_overuse_total",
    "Pods found using more of a GPU than their TFLOPS limit lets HAMi-core give them, by the driver's count, on "
    "average over the window and beyond the margin (reported once until they fall back).",
    (),
)
USAGE_SAMPLE_SECONDS: Final = Metric(
    f"{DEVICE_PLUGIN}_usage_sample_seconds", "Time one usage sampling pass over every GPU took."
)
USAGE_SAMPLED_AT: Final = Metric(
    f"{DEVICE_PLUGIN}_usage_sampled_timestamp_seconds",
    "When the per-container usage was last sampled (Unix time): stale past two --usage-interval.",
)
USAGE_SKIPS: Final = Metric(
    f"{DEVICE_PLUGIN}_usage_skips_total",
    "GPUs and processes a usage pass could not attribute, by reason: gpu_error (the GPU's NVML calls failed), "
    "no_pod (the process exited or is in no pod's cgroup), pod_unknown (no such pod on the node: deleted "
    "mid-sample), container_unknown (no container of the pod has that ID), no_grant (the container holds no "
    "grant of that GPU).",
    ("reason",),
)
LIVE_LIMIT_WRITES: Final = Metric(
    f"{DEVICE_PLUGIN}_live_limit_writes_total",
    "Live limits rewritten in place after a pod's allocation changed, by target: file (a container's "
    "limits.json) or hami_region (a value in HAMi-core's shared region).",
    ("target",),
)

# --- per GPU (a MIG instance is a GPU of its own) ---------------------------------------------------
GPU_HEALTHY: Final = Metric(f"{PREFIX}_gpu_healthy", "1 when the GPU is advertised healthy.", GPU_LABELS)
GPU_UTILIZATION: Final = Metric(
    f"{PREFIX}_gpu_utilization_ratio", "Fraction of time a kernel ran on the GPU (0-1).", GPU_LABELS
)
GPU_TFLOPS_CAPACITY: Final = Metric(f"{PREFIX}_gpu_tflops_capacity", "The GPU's TFLOPS (GPU catalog).", GPU_LABELS)
GPU_TFLOPS_ALLOCATED: Final = Metric(
    f"{PREFIX}_gpu_tflops_allocated", "TFLOPS requested by the grants of the node's active pods.", GPU_LABELS
)
GPU_VRAM_CAPACITY: Final = Metric(f"{PREFIX}_gpu_vram_capacity_bytes", "The GPU's memory.", GPU_LABELS)
GPU_VRAM_ALLOCATED: Final = Metric(
    f"{PREFIX}_gpu_vram_allocated_bytes", "VRAM requested by the grants of the node's active pods.", GPU_LABELS
)
GPU_VRAM_USED: Final = Metric(f"{PREFIX}_gpu_vram_used_bytes", "GPU memory in use (the driver's figure).", GPU_LABELS)
GPU_TEMPERATURE: Final = Metric(f"{PREFIX}_gpu_temperature_celsius", "GPU temperature.", GPU_LABELS)
GPU_POWER: Final = Metric(f"{PREFIX}_gpu_power_watts", "GPU power draw.", GPU_LABELS)
GPU_PROCESS_UTILIZATION_SUPPORTED: Final = Metric(
    f"{PREFIX}_gpu_process_utilization_supported",
    "1 when the driver reports per-process SM use for the GPU; 0: memory only, containers' TFLOPS read 0.",
    NODE_GPU,
)
GPU_UNATTRIBUTED_PROCESSES: Final = Metric(
    f"{PREFIX}_gpu_unattributed_processes", "Processes on the GPU that no granted container was found for.", NODE_GPU
)
GPU_UNATTRIBUTED_TFLOPS_USED: Final = Metric(
    f"{PREFIX}_gpu_unattributed_tflops_used", "TFLOPS used by the GPU's unattributed processes.", NODE_GPU
)
GPU_UNATTRIBUTED_VRAM_USED: Final = Metric(
    f"{PREFIX}_gpu_unattributed_vram_used_bytes", "VRAM held by the GPU's unattributed processes.", NODE_GPU
)

# --- per container and GPU, at the last usage sample ---------------------------------------------------
CONTAINER_TFLOPS_USED: Final = Metric(
    f"{PREFIX}_container_tflops_used", "TFLOPS the container used (its SM share x the GPU's TFLOPS).", CONTAINER_LABELS
)
CONTAINER_TFLOPS_REQUEST: Final = Metric(
    f"{PREFIX}_container_tflops_request", "TFLOPS reserved for the container's pod on the GPU.", CONTAINER_LABELS
)
CONTAINER_TFLOPS_LIMIT: Final = Metric(
    f"{PREFIX}_container_tflops_limit", "TFLOPS the container's pod may use on the GPU.", CONTAINER_LABELS
)
CONTAINER_TFLOPS_USED_RATIO: Final = Metric(
    f"{PREFIX}_container_tflops_used_ratio", "TFLOPS used over the limit (0-1).", CONTAINER_LABELS
)
CONTAINER_TFLOPS_USED_REQUEST_RATIO: Final = Metric(
    f"{PREFIX}_container_tflops_used_request_ratio",
    "TFLOPS used over the request (above 1: bursting past the reservation).",
    CONTAINER_LABELS,
)
CONTAINER_VRAM_USED: Final = Metric(
    f"{PREFIX}_container_vram_used_bytes", "GPU memory the container's processes hold.", CONTAINER_LABELS
)
CONTAINER_VRAM_REQUEST: Final = Metric(
    f"{PREFIX}_container_vram_request_bytes", "VRAM reserved for the container's pod on the GPU.", CONTAINER_LABELS
)
CONTAINER_VRAM_LIMIT: Final = Metric(
    f"{PREFIX}_container_vram_limit_bytes", "VRAM the container's pod may use on the GPU.", CONTAINER_LABELS
)
CONTAINER_VRAM_USED_RATIO: Final = Metric(
    f"{PREFIX}_container_vram_used_ratio", "VRAM used over the limit (0-1).", CONTAINER_LABELS
)
CONTAINER_VRAM_USED_REQUEST_RATIO: Final = Metric(
    f"{PREFIX}_container_vram_used_request_ratio",
    "VRAM used over the request (above 1: past the reservation).",
    CONTAINER_LABELS,
)

DEVICE_PLUGIN_METRICS: Final = (
    BUILD_INFO,
    ALLOCATE_SECONDS,
    ALLOCATE_LOOKUP_WAIT_SECONDS,
    ERRORS,
    ENVVAR_GUARD,
    DEVICE_DELIVERY,
    REGISTRATIONS,
    VRAM_OVERUSE,
    COMPUTE_OVERUSE,
    USAGE_SAMPLE_SECONDS,
    USAGE_SAMPLED_AT,
    USAGE_SKIPS,
    LIVE_LIMIT_WRITES,
    GPU_HEALTHY,
    GPU_UTILIZATION,
    GPU_TFLOPS_CAPACITY,
    GPU_TFLOPS_ALLOCATED,
    GPU_VRAM_CAPACITY,
    GPU_VRAM_ALLOCATED,
    GPU_VRAM_USED,
    GPU_TEMPERATURE,
    GPU_POWER,
    GPU_PROCESS_UTILIZATION_SUPPORTED,
    GPU_UNATTRIBUTED_PROCESSES,
    GPU_UNATTRIBUTED_TFLOPS_USED,
    GPU_UNATTRIBUTED_VRAM_USED,
    CONTAINER_TFLOPS_USED,
    CONTAINER_TFLOPS_REQUEST,
    CONTAINER_TFLOPS_LIMIT,
    CONTAINER_TFLOPS_USED_RATIO,
    CONTAINER_TFLOPS_USED_REQUEST_RATIO,
    CONTAINER_VRAM_USED,
    CONTAINER_VRAM_REQUEST,
    CONTAINER_VRAM_LIMIT,
    CONTAINER_VRAM_USED_RATIO,
    CONTAINER_VRAM_USED_REQUEST_RATIO,
)
