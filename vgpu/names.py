"""Every string that more than one component reads: label and annotation keys, resource and env names.

Defined once here so the extender, the device plugin, the webhook, the deploy manifests' tests and
the CLI can never drift apart (gpushare's extender and device plugin each had their own copy).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final

DOMAIN: Final = "tensor-fusion.ai"
PREFIX: Final = f"{DOMAIN}/"

# --- the label that opts a pod in ---------------------------------------------------------------
LABEL_ENABLED: Final = f"{DOMAIN}/enabled"

# --- the namespace label that opts its NVIDIA GPU pods in (tf_webhook/migration.py)
# Its value says what an ``nvidia.com/gpu`` meant in that namespace; any other value translates nothing.
LABEL_MIGRATE_NVIDIA: Final = f"{DOMAIN}/migrate-nvidia-gpu"


class MigrationMode(StrEnum):
    """The values of LABEL_MIGRATE_NVIDIA that translate (the chart gives each a webhook entry of its own)."""

    WHOLE = "true"  # an nvidia.com/gpu is a whole GPU (NVIDIA's device plugin without sharing)
    TIME_SLICED = "time-sliced"  # an nvidia.com/gpu is a time-sliced replica (sharing.timeSlicing)


# --- the resources of NVIDIA's device plugin that a migrated pod's containers may ask for ----------
NVIDIA_GPU: Final = "nvidia.com/gpu"
# A time-sliced replica under the plugin's ``renameByDefault: true``.
NVIDIA_GPU_SHARED: Final = "nvidia.com/gpu.shared"
# + a MIG profile (``nvidia.com/mig-1g.5gb``), under the plugin's ``mig.strategy: mixed``.
NVIDIA_MIG_PREFIX: Final = "nvidia.com/mig-"


class Annotation(StrEnum):
    """User-facing pod annotations (TensorFusion v1 interface)."""

    GPUPOOL = f"{DOMAIN}/gpupool"
    INJECT_CONTAINER = f"{DOMAIN}/inject-container"
    REPLICAS = f"{DOMAIN}/replicas"
    TFLOPS_REQUEST = f"{DOMAIN}/tflops-request"
    TFLOPS_LIMIT = f"{DOMAIN}/tflops-limit"
    VRAM_REQUEST = f"{DOMAIN}/vram-request"
    VRAM_LIMIT = f"{DOMAIN}/vram-limit"
    QOS = f"{DOMAIN}/qos"
    WORKLOAD = f"{DOMAIN}/workload"
    GENERATE_WORKLOAD = f"{DOMAIN}/generate-workload"
    WORKLOAD_PROFILE = f"{DOMAIN}/workload-profile"
    IS_LOCAL_GPU = f"{DOMAIN}/is-local-gpu"
    GPU_COUNT = f"{DOMAIN}/gpu-count"
    GPU_MODEL = f"{DOMAIN}/gpu-model"
    # Whole GPUs, held by this pod alone: no TFLOPS/VRAM share (the grant is the GPU's capacity).
    DEDICATED_GPU = f"{DOMAIN}/dedicated-gpu"
    AUTO_REQUESTS = f"{DOMAIN}/auto-requests"
    AUTO_LIMITS = f"{DOMAIN}/auto-limits"
    AUTO_REPLICAS = f"{DOMAIN}/auto-replicas"
    # TensorFusion v2's short form of vertical autoscaling: the requests and limits layers together, on
    # AUTOSCALE_TARGET's resources (compute, vram, all).
    AUTOSCALE = f"{DOMAIN}/autoscale"
    AUTOSCALE_TARGET = f"{DOMAIN}/autoscale-target"
    NO_STANDALONE_WORKER_MODE = f"{DOMAIN}/no-standalone-worker-mode"
    # Not in TF v1; ours: per-pod override of the scheduler's placement policy.
    PLACEMENT_POLICY = f"{DOMAIN}/placement-policy"
    # TensorFusion v2: how the pod's share is enforced on the GPU (IsolationMode; docs/isolation.md).
    ISOLATION = f"{DOMAIN}/isolation"
    # TensorFusion v2: the GPU vendor; this project serves NVIDIA GPUs only (VENDOR_NVIDIA).
    VENDOR = f"{DOMAIN}/vendor"
    # TensorFusion v2: pin the pod to these GPU indices of its node (0,2), as the node's inventory numbers them.
    GPU_INDICES = f"{DOMAIN}/gpu-indices"
    # TensorFusion v2: a duration (30m) from the pod's grant during which no preemption takes it.
    EVICTION_PROTECTION = f"{DOMAIN}/eviction-protection"
    # TensorFusion v2: GPUs per inject container, a JSON object ({"pre-process": 1, "inference": 1}); the pod's
    # count is their sum, and each container gets GPUs of its own (vgpu/container_gpus.py).
    CONTAINER_GPU_COUNT = f"{DOMAIN}/container-gpu-count"
    # TensorFusion v2: compute as a percentage of one GPU (50: half of whichever GPU the pod is granted),
    # instead of TFLOPS; converted on each GPU at placement (vgpu/compute_percent.py).
    COMPUTE_PERCENT_REQUEST = f"{DOMAIN}/compute-percent-request"
    COMPUTE_PERCENT_LIMIT = f"{DOMAIN}/compute-percent-limit"


class SystemAnnotation(StrEnum):
    """Annotations only our components write; tenants may not set them (admission policy + webhook)."""

    # Written by the webhook: the normalised request every downstream component reads.
    RESOLVED_REQUEST = f"{DOMAIN}/resolved-request"
    # Written by the extender at bind: the pod allocation contract.
    ALLOCATION = f"{DOMAIN}/allocation"
    # Written by the device plugin on the pod after Allocate: the hand-off receipt (device IDs).
    HANDOFF = f"{DOMAIN}/handoff"
    # Written by the device plugin on its Node: the node inventory contract.
    NODE_INVENTORY = f"{DOMAIN}/gpu-inventory"


# --- TensorFusion v2 pod annotations this project does not act on (docs/tensorfusion-keys.md) -----------
# Its remote-worker architecture and its own components' bookkeeping: meaningless here, so a pod carrying
# one is admitted with a warning naming the key and why (never silence, never a refusal for a copied manifest).
TF_UNSERVED_KEYS: Final[Mapping[str, str]] = MappingProxyType(
    {
        f"{DOMAIN}/{key}": why
        for keys, why in (
            (
                ("sidecar-worker", "embedded-worker", "dedicated-worker", "workload-mode", "port-number"),
                "TensorFusion's remote-GPU workers; here every pod uses its granted GPUs from its own containers, "
                "and no worker is run",
            ),
            (
                ("gpu-ids", "index", "container-gpus", "gpu-released", "tf-pod-count", "pod-counter-key"),
                "written by TensorFusion's own components; here the grant is tensor-fusion.ai/allocation, "
                "written by the scheduler extender",
            ),
            (("hourly-pricing",), "TensorFusion's billing; this project prices nothing"),
            (("enabled-replicas",), "TensorFusion v1's canary of an owner's first pods; every labelled pod is served"),
        )
        for key in keys
    }
)
# TensorFusion v2 keys that would change what a pod is granted, not implemented yet: refused, with the reason
# and what to write instead (admitting the pod without them would grant something else than asked).
TF_UNSUPPORTED_KEYS: Final[Mapping[str, str]] = MappingProxyType(
    {
        f"{DOMAIN}/partition-template-id": "not supported: a MIG unit is asked for by its profile in "
        "tensor-fusion.ai/gpu-model, e.g. 1g.10gb (docs/isolation.md)",
    }
)

# --- the pod label the extender's Binding writes with an allocation: which node it is for (value: objects.py's
# allocated_node_label), so that a user can select every pod granted GPUs on a node (from Kubernetes 1.35).
LABEL_ALLOCATED_NODE: Final = f"{DOMAIN}/allocated-node"

# --- node labels the device plugin publishes so users can use plain nodeAffinity ----------------
LABEL_NODE_POOL: Final = f"{DOMAIN}/gpupool"
LABEL_NODE_GPU_MODEL: Final = f"{DOMAIN}/gpu-model"
LABEL_NODE_GPU_COUNT: Final = f"{DOMAIN}/gpu-count"
# Published by the device plugin from its NVIDIA toolkit check (EnvvarGuard, DeviceDelivery values): what
# `tfctl nodes` shows, and what a nodeAffinity can require (envvar-guard In (on)).
LABEL_NODE_ENVVAR_GUARD: Final = f"{DOMAIN}/envvar-guard"
LABEL_NODE_DEVICE_DELIVERY: Final = f"{DOMAIN}/device-delivery"
LABEL_HOSTNAME: Final = "kubernetes.io/hostname"  # the kubelet's label naming its node: one value per node

# --- the extended resource the webhook injects and the device plugin advertises -----------------
RESOURCE_VGPU: Final = f"{DOMAIN}/vgpu"
# The pod's GPU shares as node-level extended resources (vgpu/node_resources.py): kube-scheduler's
# NodeResourcesFit, its preemption dry run, ResourceQuota and `kubectl describe node` count them.
# Whole numbers only: TFLOPS in thousandths (the request model's own unit, exact), VRAM in bytes.
RESOURCE_MILLI_TFLOPS: Final = f"{DOMAIN}/milli-tflops"
RESOURCE_VRAM: Final = f"{DOMAIN}/vram"
NODE_RESOURCES: Final = (RESOURCE_MILLI_TFLOPS, RESOURCE_VRAM)
# Device IDs of RESOURCE_VGPU per healthy GPU (the plugin's --slices-per-gpu default): how many
# containers may share one GPU, and, summed over a node's healthy GPUs, what the kubelet admits.
DEFAULT_SLICES_PER_GPU: Final = 16

# --- scheduling ---------------------------------------------------------------------------------
SCHEDULER_NAME: Final = "tensor-fusion-scheduler"
# The extender's two listeners (its defaults; tfctl explain's default URL; the chart's values):
EXTENDER_VERBS_PORT: Final = 8080  # filter/prioritize/bind/preempt, on loopback for kube-scheduler in the same pod
EXTENDER_PUBLIC_PORT: Final = 8081  # read-only: explain, healthz, readyz, metrics
DEFAULT_POOL: Final = "default-pool"
# The coordination.k8s.io Lease whose holder, among the extender replicas, writes workload status.
EXTENDER_LEASE_NAME: Final = "tensor-fusion-extender"
# Each GPU node's claims Lease, in the same namespace: the prefix of its name (scheduler_extender/claim_board.py).
CLAIMS_LEASE_PREFIX: Final = "tf-gpu-claims."
# Its annotation, written by the extender only: the binds and resizes in flight on the node (contract/claims.py).
CLAIMS_ANNOTATION: Final = f"{DOMAIN}/gpu-claims"

# --- the custom metrics API tf-metrics serves through the API server's aggregation layer -----------
# (tf_metrics/; the chart's APIServices; tfctl top). v1beta2 is preferred, v1beta1
# is what HPA's older clients and most guides query.
CUSTOM_METRICS_GROUP: Final = "custom.metrics.k8s.io"
CUSTOM_METRICS_VERSIONS: Final = ("v1beta2", "v1beta1")
METRICS_API_PORT: Final = 6443  # tf-metrics' HTTPS port (its default; the chart's value)
# The device plugin's metrics port, by the name its Service gives it: tf-metrics finds every plugin's
# GET /usage (vgpu/contract/usage.py) through that Service's EndpointSlices.
DEVICE_PLUGIN_METRICS_PORT_NAME: Final = "metrics"


class GpuMetric(StrEnum):
    """The metrics tf-metrics serves for pods (all three) and nodes (the two figures of use)."""

    # Percent of the pod's TFLOPS limit in use now: the HPA target (100 = the pod uses all it may).
    UTILIZATION = "gpu_utilization"
    TFLOPS = "gpu_tflops"  # TFLOPS in use now
    VRAM_BYTES = "gpu_vram_bytes"  # GPU memory held now, bytes


class Qos(StrEnum):
    """Quality of service; the order of the members is the preemption order (low goes first)."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return list(Qos).index(self)

    @property
    def priority_class(self) -> str:
        return f"tensor-fusion-{self.value}"


# PriorityClass values per QoS (TensorFusion's values; low sits below the cluster default of 0).
QOS_PRIORITY_VALUE: Final[dict[Qos, int]] = {
    Qos.LOW: -100,
    Qos.MEDIUM: 0,
    Qos.HIGH: 10000,
    Qos.CRITICAL: 100000,
}


def qos_of_priority(priority: int) -> Qos:
    """The QoS a pod's Kubernetes priority stands for: the highest whose PriorityClass value it reaches (below
    low's: low). Preemption ranks pods by this, never by the annotation they wrote (docs/security.md, "QoS")."""
    return max(
        (q for q, value in QOS_PRIORITY_VALUE.items() if value <= priority), key=lambda q: q.rank, default=Qos.LOW
    )


# A namespace label only cluster operators can set: the highest QoS its pods may ask for (high or critical);
# without it, medium. The shipped admission policy refuses a pod of class tensor-fusion-high/-critical elsewhere.
LABEL_NAMESPACE_MAX_QOS: Final = f"{DOMAIN}/max-qos"

# --- CRDs ----------------------------------------------------------------------------------------
CRD_GROUP: Final = DOMAIN
CRD_VERSION: Final = "v1"
KIND_WORKLOAD_PROFILE: Final = "WorkloadProfile"
PLURAL_WORKLOAD_PROFILE: Final = "workloadprofiles"
KIND_WORKLOAD: Final = "TensorFusionWorkload"
PLURAL_WORKLOAD: Final = "tensorfusionworkloads"
KIND_GPU_POOL: Final = "GPUPool"
PLURAL_GPU_POOL: Final = "gpupools"


class Env(StrEnum):
    """Environment variables the device plugin hands to containers at Allocate."""

    NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
    # TensorFusion-style per-UUID JSON maps, readable by any limiter.
    TF_MEM_LIMIT = "TENSOR_FUSION_CUDA_MEM_LIMIT"
    TF_UP_LIMIT = "TENSOR_FUSION_CUDA_UP_LIMIT"
    TF_UP_LIMIT_TFLOPS = "TENSOR_FUSION_CUDA_UP_LIMIT_TFLOPS"
    TF_POD_NAME = "TENSOR_FUSION_POD_NAME"
    TF_POD_NAMESPACE = "TENSOR_FUSION_POD_NAMESPACE"
    TF_CONTAINER_NAME = "TENSOR_FUSION_CONTAINER_NAME"
    TF_POOL_NAME = "TENSOR_FUSION_POOL_NAME"
    # HAMi-core.
    HAMI_MEMORY_LIMIT_PREFIX = "CUDA_DEVICE_MEMORY_LIMIT_"
    HAMI_SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"
    # HAMi-core's switch of its compute limiter: "disable" turns it off whatever the limits say, so the plugin
    # sets HAMI_POLICY_FORCE (on, whatever the region's own switch says), and a spec copy is removed.
    HAMI_UTILIZATION_POLICY = "GPU_CORE_UTILIZATION_POLICY"
    # NVIDIA MPS.
    MPS_PINNED_MEM_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
    MPS_ACTIVE_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
    MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
    # The container's live limits file (LIVE_LIMITS_DIR/LIVE_LIMITS_FILE), rewritten in place on a limit change.
    TF_LIVE_LIMITS = "TENSOR_FUSION_LIVE_LIMITS"
    # HAMi-core's shared-region file; pointed into LIVE_LIMITS_DIR so the device plugin can reach it.
    HAMI_SHARED_REGION = "CUDA_DEVICE_MEMORY_SHARED_CACHE"


HAMI_POLICY_FORCE: Final = "FORCE"  # Env.HAMI_UTILIZATION_POLICY's value: the limiter always on

# --- the per-container live-limits directory the device plugin mounts at Allocate (docs/live-limits.md)
LIVE_LIMITS_DIR: Final = "/run/tensor-fusion/limits"  # where containers see it
LIVE_LIMITS_FILE: Final = "limits.json"  # the plugin's own document of the container's current limits
HAMI_REGION_FILE: Final = "hami.cache"  # HAMi-core's shared region, created by the workload's first CUDA call


class EnforcementBackend(StrEnum):
    """How a node enforces per-container CUDA limits (a device-plugin flag)."""

    HAMI_CORE = "hami-core"
    MPS = "mps"
    NONE = "none"


VENDOR_NVIDIA: Final = "nvidia"
# TensorFusion v2's label, on a pod (protected like eviction-protection at its longest) or a node (set by an
# operator: no pod there is preempted). Both preemption paths honour it (docs/security.md, "QoS is a privilege").
LABEL_DO_NOT_DISRUPT: Final = f"{DOMAIN}/do-not-disrupt"
# The longest protection a pod may ask for: a tenant's protection delays a higher QoS by at most this long.
MAX_EVICTION_PROTECTION_S: Final = 3600


class IsolationMode(StrEnum):
    """How a pod's share is held on the GPU (TensorFusion v2's ``tensor-fusion.ai/isolation`` values)."""

    SHARED = "shared"  # time-sliced by CUDA, VRAM limited, no compute limit
    SOFT = "soft"  # a limiter inside the pod's processes (HAMi-core); TensorFusion's default
    HARD = "hard"  # NVIDIA MPS: the control daemon caps each client's threads and pinned memory
    PARTITIONED = "partitioned"  # a hardware partition (MIG)


class DeviceDelivery(StrEnum):
    """How a container is given its GPUs (``--device-delivery``; docs/security.md, "Pods that are not ours")."""

    ENVVAR = "envvar"  # NVIDIA_VISIBLE_DEVICES=<UUIDs>: read by the NVIDIA runtime hook
    VOLUME_MOUNTS = "volume-mounts"  # /dev/null mounted at NVIDIA_DEVICE_MOUNT_ROOT/<UUID>
    CDI = "cdi"  # NVIDIA's CDI devices, NVIDIA_CDI_KIND=<UUID> (nvidia-ctk cdi generate --device-name-strategy=uuid)


class EnvvarGuard(StrEnum):
    """Whether the node's NVIDIA container toolkit ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers."""

    ON = "on"  # accept-nvidia-visible-devices-envvar-when-unprivileged = false
    OFF = "off"  # the toolkit's default: any pod naming GPUs in its environment gets them
    UNKNOWN = "unknown"  # no readable toolkit configuration


# NVIDIA's container toolkit: its configuration keys, the mount root it reads device requests from, its CDI kind.
NVIDIA_TOOLKIT_CONFIG: Final = "/etc/nvidia-container-runtime/config.toml"
TOOLKIT_ACCEPT_ENVVAR: Final = "accept-nvidia-visible-devices-envvar-when-unprivileged"
TOOLKIT_ACCEPT_MOUNTS: Final = "accept-nvidia-visible-devices-as-volume-mounts"
NVIDIA_DEVICE_MOUNT_ROOT: Final = "/var/run/nvidia-container-devices"
NVIDIA_CDI_KIND: Final = "nvidia.com/gpu"


class PlacementPolicy(StrEnum):
    """How the extender ranks nodes and GPUs."""

    BINPACK = "binpack"
    SPREAD = "spread"
    # FGD-style: place where the expected stranded GPU capacity, against the pod mix learned online,
    # grows least (vgpu/scheduling/fragmentation.py; benchmarks/placement/README.md).
    FRAGMENTATION = "fragmentation"


# The installed distribution whose version every binary reports (--version).
DISTRIBUTION: Final = "tensor-fusion-k8s"

# --- the conditions the autoscaler writes on a TensorFusionWorkload (what `tfctl autoscale` shows) ----------
CONDITION_LIMITS: Final = "LimitsAutoSet"
CONDITION_REQUESTS: Final = "RequestsAutoSet"
CONDITION_REPLICAS: Final = "ReplicasAutoSet"
CONDITION_PREDICTION: Final = "Prediction"
AUTOSCALING_CONDITIONS: Final = (CONDITION_LIMITS, CONDITION_REQUESTS, CONDITION_REPLICAS, CONDITION_PREDICTION)

# --- the environment the device plugin sets, as one list: Env's names, and HAMi-core's per-device families
# (<prefix><i> for a container's i-th GPU). A GPU pod's containers may not set any of them: the webhook
# removes a copy in the pod spec (tf_webhook/plugin_env.py), and the plugin's CDI device replaces one that
# arrives some other way, envFrom included (device_plugin/enforcement/cdi.py; docs/security.md).
PLUGIN_ENV_NAMES: Final = frozenset(e.value for e in Env if e is not Env.HAMI_MEMORY_LIMIT_PREFIX)
PLUGIN_ENV_PREFIXES: Final = (Env.HAMI_MEMORY_LIMIT_PREFIX.value, f"{Env.HAMI_SM_LIMIT.value}_")

# --- the Container Device Interface: the kind of the CDI devices the plugin names in its Allocate answers
# (vendor/class; a device is vendor/class=name), and the host directory of their spec files, one of those
# containerd and CRI-O read by default (docs/security.md, "Environment overrides").
CDI_KIND: Final = f"{DOMAIN}/vgpu"
CDI_SPEC_DIR: Final = "/var/run/cdi"
