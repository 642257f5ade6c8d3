"""The extender's settings: one typed object, read from flags and ``TF_EXTENDER_*`` environment variables.

It exists so that every knob an operator may turn (policy, hand-off timeouts, where the API server
is, where the verbs and the read-only routes listen) is named, typed, defaulted and documented in
one place, and so that tests build an app from an explicit ``Settings(...)`` instead of a module global.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from scheduler_extender.deadline import max_gate_wait
from tf_shell.access import TTL_S
from tf_shell.logfmt import LogFormat, LogLevel
from vgpu.names import (
    DEFAULT_POOL,
    DEVICE_PLUGIN_METRICS_PORT_NAME,
    EXTENDER_LEASE_NAME,
    EXTENDER_PUBLIC_PORT,
    EXTENDER_VERBS_PORT,
    PlacementPolicy,
)


class Settings(BaseSettings):
    """Extender configuration. Every field can be set as ``TF_EXTENDER_<FIELD>`` or a ``--<field>`` flag."""

    model_config = SettingsConfigDict(env_prefix="TF_EXTENDER_", env_ignore_empty=True, extra="ignore", frozen=True)
    REMOVED: ClassVar[dict[str, str]] = {
        "keep_top_nodes": "removed: filter passes only the best nodes by default (--decide-in-filter); unset it",
    }

    policy: PlacementPolicy = Field(
        PlacementPolicy.FRAGMENTATION,
        description="Default placement policy: fragmentation (the default) minimises the GPU capacity stranded "
        "for the pod mix it learns online, binpack fills busy GPUs first, spread prefers empty ones. "
        "A pod may override it with the placement-policy annotation.",
    )
    decide_in_filter: bool = Field(
        True,
        description="filter passes only the fitting nodes with the best score (ties kept), so kube-scheduler "
        "binds a lone one without its scoring and the prioritize call; a pod with soft preferences kube-scheduler "
        "scores (preferred node or pod affinity, ScheduleAnyway spread) or nodes with PreferNoSchedule taints "
        "it does not tolerate get every fitting node, as with --no-decide-in-filter.",
    )
    handoff_wait: float = Field(
        4.0,
        gt=0,
        description="Seconds a bind waits for another pod's hand-off on the same node before it fails "
        "(the scheduler then retries with backoff). See scheduler_extender/HANDOFF.md. At most 2/3 of "
        "bind-timeout, so the API calls after the wait still fit in the bind's deadline.",
    )
    bind_timeout: float = Field(
        6.0,
        gt=0,
        description="Seconds within which bind answers, whatever the API server does: every API call of a "
        "bind gets a timeout cut from this deadline, and the hand-off wait is capped by it. Keep it below "
        "kube-scheduler's extender httpTimeout (10s as shipped), or the scheduler stops listening to binds "
        "that still run, reports them failed and schedules their pods again.",
    )
    access_review_ttl: float = Field(
        TTL_S,
        gt=0,
        description="Seconds a caller's token and its right to read explain (get or create pods in that "
        "namespace, asked of the API server for callers off loopback) are believed before they are asked "
        "again (a refusal: 30 s at most).",
    )
    handoff_ttl: float = Field(
        60.0,
        gt=0,
        description="Last-resort seconds after bound_at after which a pod without a hand-off receipt "
        "no longer holds its node's gate.",
    )
    handoff_deletion_grace: float = Field(
        2.0,
        ge=0,
        description="Seconds a pod deleted before its hand-off receipt still holds its node's gate: the "
        "kubelet may be admitting it, and its Allocate must not meet a successor (the device plugin's "
        "lookup wait is 2 s). 0 releases at once.",
    )
    reservation_ttl: float = Field(
        30.0,
        gt=0,
        description="Seconds a tentative reservation made at filter/prioritize time (for the node the pod "
        "is expected to be bound to) lives without a bind.",
    )
    preemption_hold: float = Field(
        60.0,
        ge=0,
        description="Seconds the extender's own preemption (a pod that fits a node's GPU totals but no "
        "single GPU there, above the lowest QoS) holds the GPUs it freed for the pod once its victims are "
        "gone; the pod is not preempted for again meanwhile. 0 turns that preemption off (kube-scheduler's "
        "own, for nodes whose totals are short, stays).",
    )
    event_interval: float = Field(
        60.0,
        ge=0,
        description="At most one FailedGpuScheduling event per pod and message within this many seconds.",
    )
    workload_status_interval: float = Field(
        5.0,
        gt=0,
        description="Seconds between passes that write the status of each TensorFusionWorkload (its pods "
        "holding GPUs, their TFLOPS/VRAM, Ready) and GPUPool (nodes, GPUs, capacity, allocation, Ready); "
        "only objects whose status changed are patched.",
    )
    autoscaler_interval: float = Field(
        5.0,
        ge=0,
        description="Seconds between autoscaler passes (docs/autoscaling.md): read the device plugins' usage, "
        "evaluate the layers that are due (each at its own evaluationPeriod) and apply them. At most the "
        "shortest evaluationPeriod in use. 0 turns the autoscaler off: the workloads whose pods enable a layer "
        "then say so in a False AutoscalerRunning condition.",
    )
    autoscaler_max_replicas: int = Field(
        10,
        ge=1,
        le=1_000_000,
        description="maxReplicas of the HorizontalPodAutoscalers the autoscaler owns (autoSetReplicas has no "
        "maximum of its own); a workload's replicas (the minimum) raises it for that workload.",
    )
    autoscaler_checkpoint_interval: float = Field(
        60.0,
        gt=0,
        description="Seconds between saves of each autoscaled workload's usage histograms to a ConfigMap in "
        "the extender's namespace, read back by the next leader.",
    )
    plugin_service: str = Field(
        "tensor-fusion-device-plugin-metrics",
        description="The device plugins' metrics Service, whose EndpointSlices list every plugin's /usage "
        "(the chart's <release>-device-plugin-metrics); in the Lease's namespace.",
    )
    plugin_port_name: str = Field(
        DEVICE_PLUGIN_METRICS_PORT_NAME, description="Name of that Service's port serving GET /usage."
    )
    lease_name: str = Field(
        EXTENDER_LEASE_NAME,
        description="Name of the coordination.k8s.io Lease the extender replicas elect a leader with; only "
        "the leader writes TensorFusionWorkload and GPUPool status.",
    )
    lease_namespace: str | None = Field(
        None,
        description="Namespace of that Lease; unset: the pod's own namespace (from its service account), "
        "else 'default'.",
    )
    identity: str | None = Field(
        None,
        description="This replica's name in the Lease (the chart sets the pod name); unset: the hostname "
        "and a random suffix.",
    )
    gpu_catalog: str | None = Field(
        None,
        description="YAML/JSON file of GPU models to add to or override in the built-in catalog (the same "
        "file the device plugins get), so gpu-model values can name the models it adds.",
    )
    kubeconfig: str | None = Field(
        None, description="Path to a kubeconfig; unset means in-cluster config, then ~/.kube/config."
    )
    verbs_address: str = Field(
        "127.0.0.1",
        description="Address the scheduling verbs (filter, prioritize, bind, preempt) listen on, with every "
        "other route. Loopback: only the kube-scheduler beside the extender in its pod can call them; whoever "
        "can reach bind can pin any unbound pod to any node, so widen it only behind something that "
        "authenticates the caller.",
    )
    verbs_port: int = Field(
        EXTENDER_VERBS_PORT,
        ge=0,
        le=65535,
        description="Port of the verbs (the KubeSchedulerConfiguration urlPrefix's).",
    )
    public_address: str = Field(
        "0.0.0.0",
        description="Address of the read-only listener: explain, healthz, readyz and metrics, for probes, "
        "Prometheus and tfctl explain. It serves no verb.",
    )
    public_port: int = Field(EXTENDER_PUBLIC_PORT, ge=0, le=65535, description="Port of the read-only listener.")
    url_prefix: str = Field(
        "",
        description="Extra path prefix the verbs are served under as well as '/', matching the "
        "KubeSchedulerConfiguration urlPrefix (for example '/extender').",
    )
    default_pool: str = Field(DEFAULT_POOL, description="Pool of nodes whose inventory names none.")
    watch_timeout: int = Field(
        300, gt=0, description="Server-side timeout of one watch request in seconds; the watch then resumes."
    )
    backoff_max: float = Field(30.0, gt=0, description="Longest pause between retries after a list/watch error.")
    log_level: LogLevel = Field("info", description="Log level of the extender's own logs.")
    log_format: LogFormat = Field(
        LogFormat.TEXT, description="text, or json: one object per line with pod, node and gpus as keys."
    )

    @model_validator(mode="after")
    def _gate_wait_fits_the_bind(self) -> Settings:
        most = max_gate_wait(self.bind_timeout)
        if self.handoff_wait > most:
            raise ValueError(
                f"handoff_wait {self.handoff_wait:g}s does not fit in bind_timeout {self.bind_timeout:g}s: "
                f"it may be at most {most:g}s (2/3 of it; the rest is for the bind's API calls)"
            )
        return self

    @model_validator(mode="after")
    def _verbs_apart(self) -> Settings:
        if self.verbs_port and self.verbs_port == self.public_port:
            raise ValueError(
                f"verbs_port and public_port are both {self.verbs_port}: the verbs must not be served on the "
                "read-only listener's port"
            )
        return self

    @field_validator("url_prefix")
    @classmethod
    def _normalise_prefix(cls, value: str) -> str:
        value = value.strip().rstrip("/")
        if value and not value.startswith("/"):
            value = "/" + value
        return value
