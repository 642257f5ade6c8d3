"""The change graph-launch's edits: CUDA Graph launches charged to HAMi-core's compute limiter (``graph_launch.c``
appended to ``src/cuda/graph.c`` in place of its pass-throughs, and handed out by ``cuGetProcAddress``), and what
the changed library says of a run in its log."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from device_plugin.hami_build.edit import Edit

GRAPH: Final = Path("src/cuda/graph.c")
HOOK: Final = Path("src/cuda/hook.c")
VERSIONED: Final = Path("src/include/multi_func_hook.h")
ENTRIES: Final = Path("src/include/libcuda_hook.h")
DLSYM: Final = Path("src/libvgpu.c")
GRAPH_CHARGE: Final = Path(__file__).resolve().parent / "graph_launch.c"
CHARGED: Final = ("cuGraphInstantiate", "cuGraphInstantiateWithFlags", "cuGraphLaunch", "cuGraphExecDestroy")
ADDED: Final = "cuGraphInstantiateWithParams"  # not hooked by HAMi-core: an entry in each of its three lists
HANDED_OUT: Final = (*CHARGED[1:], ADDED)  # by cuGetProcAddress: the hooks whose signature never changed


def _definition(name: str) -> re.Pattern[str]:
    """A function's whole definition in HAMi-core's style: its signature at a line's start, its closing brace
    alone at another's."""
    return re.compile(rf"^CUresult {name}\(.*?^\}}\n", re.S | re.M)


_GRAPH_SKIP = 'if (strncmp(symbol, "cuGraph", 7) == 0) {'
_FIND = "void *find_symbols_in_table(const char *symbol) {"
# The last entry of g_func_map, HAMi-core's table of names whose signature changed with a CUDA version.
_LAST_VERSIONED = '{"cuGraphKernelNodeSetParams", 12000, 99999, "cuGraphKernelNodeSetParams_v2"}'
# cuGetProcAddress("cuGraphInstantiate") answers by the version asked: the five-argument form before CUDA 12, the
# three-argument cuGraphInstantiateWithFlags from it on (cudaTypedefs.h: PFN_cuGraphInstantiate).
_INSTANTIATE_VERSIONS = (
    ',\n    {"cuGraphInstantiate", 10000, 11999, "cuGraphInstantiate"},\n'
    '    {"cuGraphInstantiate", 12000, 99999, "cuGraphInstantiateWithFlags"}'
)
_HANDED_OUT = "\n".join(
    [
        "/* The graph hooks that charge launches to the compute limiter (the change graph-launch). */",
        "static int tf_graph_charged(const char *symbol) {",
        *[f'    if (strcmp(symbol, "{name}") == 0) return 1;' for name in HANDED_OUT],
        "    return 0;",
        "}",
        "",
        _FIND,
    ]
)


def _listed(path: Path, line: str) -> Edit:
    """cuGraphInstantiateWithParams listed right after cuGraphInstantiateWithFlags in one of HAMi-core's three lists
    of hooks (``line`` with ``{name}`` where each name goes)."""
    anchor = line.format(name=CHARGED[1])
    return Edit(path, repr(anchor), re.compile(re.escape(anchor)), f"{anchor}\n{line.format(name=ADDED)}")


def graph_edits() -> tuple[Edit, ...]:
    removed = tuple(
        Edit(GRAPH, f"the pass-through {name}()", _definition(name), "") for name in CHARGED
    )  # before the append below: its own definitions would match too
    appended = Edit(GRAPH, "the file's end", re.compile(r"\Z"), "\n" + GRAPH_CHARGE.read_text())
    skip = Edit(
        HOOK,
        "find_symbols_in_table()'s skip of every cuGraph* symbol",
        re.compile(re.escape(_GRAPH_SKIP)),
        'if (strncmp(symbol, "cuGraph", 7) == 0 && !tf_graph_charged(symbol)) {',
    )
    helper = Edit(HOOK, "find_symbols_in_table()'s definition", re.compile(f"^{re.escape(_FIND)}", re.M), _HANDED_OUT)
    versioned = Edit(
        VERSIONED,
        "g_func_map's last entry (cuGraphKernelNodeSetParams from 12000)",
        re.compile(re.escape(_LAST_VERSIONED)),
        _LAST_VERSIONED + _INSTANTIATE_VERSIONS,
    )
    listed = (
        _listed(ENTRIES, "    CUDA_OVERRIDE_ENUM({name}),"),  # the entry's index ...
        _listed(HOOK, '    {{.name = "{name}"}},'),  # ... and its name, at the same place in the table
        _listed(DLSYM, "    DLSYM_HOOK_FUNC({name});"),  # what dlsym finds
    )
    return (*removed, appended, skip, helper, versioned, *listed)


# What graph_launch.c logs (HAMi-core's info and warning lines, on the tenant's stderr).
CHARGED_LINE: Final = "each launch charged"
UNCHARGED_LINE: Final = "was not instantiated through HAMi-core"


def graph_charging(stderr: str) -> dict[str, int] | None:
    """What ``graph-launch`` said in a tenant's log: graphs whose launches it charges, and launches it could not
    (a graph instantiated some other way); None where it said nothing (a build without the change)."""
    charged, uncharged = stderr.count(CHARGED_LINE), stderr.count(UNCHARGED_LINE)
    return {"charged_graphs": charged, "uncharged_warnings": uncharged} if charged or uncharged else None
