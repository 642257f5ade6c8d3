"""NodeMemo: what it returns is always what recomputing would give, and it recomputes only changed nodes.

The memo is the extender's warm path (filter and prioritize at 5,000 nodes), so it must never serve a
verdict for a node state other than the one in the request's snapshot, whatever the order of names,
the node replacements in between, unknown names or the LRU over request keys.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_extender.memo import NodeMemo
from vgpu.scheduling.model import NodeState

NAMES = [f"n{i}" for i in range(8)]

# One step: ("change", node index) replaces that node's object (same or new value), ("drop", i) removes
# it, ("ask", key, names) asks the memo.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("change"), st.integers(0, 7), st.booleans()),
        st.tuples(st.just("drop"), st.integers(0, 7)),
        st.tuples(
            st.just("ask"),
            st.sampled_from(["a", "b", "c"]),
            st.lists(st.sampled_from([*NAMES, "ghost"]), unique=True),
        ),
    ),
    max_size=40,
)


def truth(key: str, node: NodeState | None) -> str:
    """What the core would say: a pure function of the request and the node's value."""
    return f"{key}:{'unknown' if node is None else node.pool}"


@given(steps, st.integers(1, 4))
@settings(max_examples=300)
def test_values_equal_recomputation_and_only_changed_nodes_are_recomputed(
    ops: list[tuple[object, ...]], max_keys: int
) -> None:
    memo: NodeMemo[str] = NodeMemo(max_keys=max_keys)
    nodes = {n: NodeState(name=n, pool="p0") for n in NAMES}
    version = 0
    computed_against: dict[str, dict[str, NodeState]] = {}  # key -> node objects the memo computed for
    recent: list[str] = []  # request keys, most recent last (the memo's LRU)
    for op in ops:
        if op[0] == "change":
            _, i, new_value = op
            name = NAMES[int(str(i))]
            version += 1
            old = nodes.get(name) or NodeState(name=name, pool="p0")
            nodes[name] = replace(old, pool=f"p{version}") if new_value else replace(old)
        elif op[0] == "drop":
            nodes.pop(NAMES[int(str(op[1]))], None)
        else:
            _, key, asked = op
            key, names = str(key), list(asked)  # type: ignore[call-overload]
            calls: list[list[str]] = []

            def compute(misses: list[str], key: str = key, calls: list[list[str]] = calls) -> list[str]:
                calls.append(misses)
                return [truth(key, nodes.get(n)) for n in misses]

            got = memo.values(key, names, nodes, compute)
            assert got == [truth(key, nodes.get(n)) for n in names]
            remembered = computed_against.get(key, {}) if key in recent else {}
            expected_misses = [n for n in names if n not in nodes or remembered.get(n) is not nodes[n]]
            assert calls == ([expected_misses] if expected_misses else [])
            computed_against[key] = {**remembered, **{n: nodes[n] for n in expected_misses if n in nodes}}
            recent = [k for k in recent if k != key] + [key]
            recent = recent[-max_keys:]


def test_clear_forgets_everything() -> None:
    memo: NodeMemo[int] = NodeMemo()
    nodes = {"a": NodeState(name="a", pool="p")}
    calls: list[list[str]] = []

    def compute(misses: list[str]) -> list[int]:
        calls.append(misses)
        return [1] * len(misses)

    assert memo.values("k", ["a"], nodes, compute) == [1]
    assert memo.values("k", ["a"], nodes, compute) == [1]
    memo.clear()
    assert memo.values("k", ["a"], nodes, compute) == [1]
    assert calls == [["a"], ["a"]]
