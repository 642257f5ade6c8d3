"""Placement policies: how fitting nodes are ranked and which GPUs inside the chosen node a pod gets.

One small protocol that the extender, the trace replay and the fragmentation-aware policy all plug
into. A policy sees only nodes that passed the filter, narrowed to the pod's eligible GPUs
(:func:`vgpu.scheduling.fit.eligible_node`), and returns a raw float, mapped to kube-scheduler's 0–10
only at the end (:mod:`vgpu.scheduling.scoring`). ``binpack`` fills the fullest node and GPU first;
``spread`` is its mirror image; the extender's default is ``fragmentation``
(:mod:`vgpu.scheduling.fragmentation`, registered when imported). Policies are created by name from a
:class:`PolicyRegistry`; :class:`Policies` keeps one live instance per name (a learning policy's
``observe`` state lives there) and honours the per-pod override.
See vgpu/scheduling/README.md, section "Policies".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol, runtime_checkable

from vgpu.names import PlacementPolicy
from vgpu.scheduling.fit import fitting_gpus
from vgpu.scheduling.model import Demand, GpuState, NodeState

# Weights of VRAM and compute in utilisation (TensorFusion's GPUFitConfig defaults): VRAM is the
# resource that cannot be oversubscribed, so it dominates.
VRAM_WEIGHT: Final = 0.7
TFLOPS_WEIGHT: Final = 0.3


class Policy(Protocol):
    """A placement policy. ``node`` is always an eligible view that passed the filter."""

    @property
    def name(self) -> str:
        """The registry name."""
        ...

    def score(self, demand: Demand, node: NodeState) -> float:
        """Raw score, higher is better; keep the base in [0, 1] so additive terms weigh alike."""
        ...

    def choose_gpus(self, demand: Demand, node: NodeState) -> tuple[GpuState, ...]:
        """Exactly ``demand.gpu_count`` GPUs of the node for this pod, or () when it does not fit."""
        ...

    def observe(self, demand: Demand, node: NodeState, gpus: tuple[GpuState, ...]) -> None:
        """Learn from a committed placement (a no-op for stateless policies)."""
        ...


PolicyFactory = Callable[[], Policy]


def scores_by_state(policy: Policy) -> bool:
    """Whether the policy's score depends on nothing but the node's state
    (:meth:`~vgpu.scheduling.model.NodeState.state`: not its name, labels or GPU UUIDs), so one
    score serves every node in a state. A policy says so with a true ``scores_by_state`` attribute;
    one that reads a node's labels or remembers nodes by name (fragmentation) does not."""
    return getattr(policy, "scores_by_state", False) is True


@runtime_checkable
class ScoresMany(Protocol):
    """A policy that scores many nodes at once for less than node by node, with the same scores
    (:meth:`~vgpu.scheduling.fragmentation.FragmentationPolicy.score_many`)."""

    def score_many(self, demand: Demand, nodes: Sequence[NodeState]) -> list[float]: ...


@runtime_checkable
class ClusterAware(Protocol):
    """A policy that weighs the whole cluster (GPUs per node kind), not only the nodes it scores.

    It is shown every node, as the extender knows them from its cache: the replay scores one node per
    class of identical nodes and shows it the inventory once when it starts (commits reach it through
    ``observe``); the extender, whose pods also leave, shows it every node periodically
    (:mod:`scheduler_extender.refresh`).
    """

    def see_cluster(self, nodes: Iterable[NodeState]) -> None: ...


def utilisation_after(demand: Demand, node: NodeState) -> float:
    """The node's reserved fraction (0.7·VRAM + 0.3·TFLOPS) once the pod is added, clamped to [0, 1]."""
    totals = node.totals()
    cap_t, cap_v, used_t, used_v = totals.tflops, totals.vram, totals.tflops_used, totals.vram_used
    if demand.whole_gpu:
        share = demand.gpu_count / len(node.gpus) if node.gpus else 0.0
        add_t, add_v = cap_t * share, cap_v * share
    else:
        add_t, add_v = demand.tflops * demand.gpu_count, demand.vram_held * demand.gpu_count
    vram = (used_v + add_v) / cap_v if cap_v else 1.0
    tflops = (used_t + add_t) / cap_t if cap_t else 1.0
    return min(1.0, max(0.0, VRAM_WEIGHT * vram + TFLOPS_WEIGHT * tflops))


def free_fraction(gpu: GpuState) -> float:
    """How much of one GPU is still free (0.7·VRAM + 0.3·TFLOPS), for ordering GPUs inside a node."""
    vram = gpu.vram_free / gpu.vram if gpu.vram else 0.0
    tflops = gpu.tflops_free / gpu.tflops if gpu.tflops else 0.0
    return VRAM_WEIGHT * vram + TFLOPS_WEIGHT * tflops


class Binpack:
    """Fullest node first; inside it, the fitting GPUs with the least free room (best fit)."""

    __slots__ = ()
    scores_by_state: Final = True  # utilisation only: see scores_by_state()

    @property
    def name(self) -> str:
        return PlacementPolicy.BINPACK.value

    def score(self, demand: Demand, node: NodeState) -> float:
        return utilisation_after(demand, node)

    def choose_gpus(self, demand: Demand, node: NodeState) -> tuple[GpuState, ...]:
        gpus = sorted(fitting_gpus(demand, node), key=lambda g: (free_fraction(g), g.index))
        return tuple(gpus[: demand.gpu_count]) if len(gpus) >= demand.gpu_count else ()

    def observe(self, demand: Demand, node: NodeState, gpus: tuple[GpuState, ...]) -> None:
        """Stateless."""


class Spread:
    """Emptiest node first; inside it, the fitting GPUs with the most free room."""

    __slots__ = ()
    scores_by_state: Final = True

    @property
    def name(self) -> str:
        return PlacementPolicy.SPREAD.value

    def score(self, demand: Demand, node: NodeState) -> float:
        return 1.0 - utilisation_after(demand, node)

    def choose_gpus(self, demand: Demand, node: NodeState) -> tuple[GpuState, ...]:
        gpus = sorted(fitting_gpus(demand, node), key=lambda g: (-free_fraction(g), g.index))
        return tuple(gpus[: demand.gpu_count]) if len(gpus) >= demand.gpu_count else ()

    def observe(self, demand: Demand, node: NodeState, gpus: tuple[GpuState, ...]) -> None:
        """Stateless."""


class PolicyRegistry:
    """Policy name → factory. Modules that define a policy register it here at import."""

    __slots__ = ("_factories",)

    def __init__(self) -> None:
        self._factories: dict[str, PolicyFactory] = {}

    def register(self, name: str, factory: PolicyFactory) -> None:
        """Add a policy; registering the same factory twice is harmless, a different one is an error."""
        existing = self._factories.get(name)
        if existing is not None and existing is not factory:
            raise ValueError(f"placement policy {name!r} is already registered")
        self._factories[name] = factory

    def create(self, name: str) -> Policy:
        factory = self._factories.get(name)
        if factory is None:
            raise KeyError(f"unknown placement policy {name!r}; known: {', '.join(self.names())}")
        return factory()

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._factories))


REGISTRY: Final = PolicyRegistry()
REGISTRY.register(PlacementPolicy.BINPACK.value, Binpack)
REGISTRY.register(PlacementPolicy.SPREAD.value, Spread)


class Policies:
    """One live instance per policy name, the configured default, and the per-pod override.

    ``on_create`` sees every instance as it is made, before any use (the extender hands learning
    policies to its background refresher there).
    """

    __slots__ = ("_instances", "_on_create", "_registry", "default")

    def __init__(
        self,
        default: str,
        registry: PolicyRegistry = REGISTRY,
        on_create: Callable[[Policy], None] | None = None,
    ) -> None:
        self._registry = registry
        self._on_create = on_create
        self._instances: dict[str, Policy] = {}
        self.default = self.get(default)  # fails fast on a misconfigured name

    def get(self, name: str) -> Policy:
        policy = self._instances.get(name)
        if policy is None:
            policy = self._registry.create(name)
            if self._on_create is not None:
                self._on_create(policy)
            policy = self._instances.setdefault(name, policy)
        return policy

    def for_demand(self, demand: Demand) -> Policy:
        """The pod's own policy (``placement-policy`` annotation) if it set one, else the default."""
        return self.default if demand.policy is None else self.get(demand.policy.value)
