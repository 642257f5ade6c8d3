"""The isolation benchmark's report: ``isolation.json`` (every figure as measured) and ``isolation.md``, one
table per mode headed by the GPU, driver and CUDA versions, in the shape docs take. Rendered from the JSON
alone, so that a stored result renders again the same (the tests render a canned one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.isolation.figures import LIVE_SETTLE_S
from benchmarks.isolation.tenants import BACKENDS
from vgpu.names import Env, IsolationMode

TABLE_HEAD = ("| scenario | limit | measured | against the limit |", "|---|---|---|---|")


def num(value: float | None, digits: int = 1, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def single_row(s: dict[str, Any]) -> str:
    head = f"| {s['kernel']}{charging(s.get('graph_charging'))}, one tenant | {s['target']} % |"
    if s.get("error"):
        return f"{head} failed: {s['error']} | n/a |"
    measured = f"{num(s['share'])} % of uncapped ({num(s['rate'])} {s.get('unit') or ''})"
    return f"{head} {measured}{driver_sm(s.get('driver'))} | {num(diff(s['share'], s['target']), signed=True)} points |"


def driver_sm(d: dict[str, Any] | None) -> str:
    """The driver's SM share of the tenant, as the device plugin's compute report reads it, where it was asked."""
    if d is None:
        return ""
    if d["driver_sm"] is None:
        return f"; the driver's SM share not read: {d['matched']}"
    return f"; the driver counts {d['driver_sm']} % of the SMs over {d['seconds']:g} s"


def charging(said: dict[str, int] | None) -> str:
    """What HAMi-core's graph-launch change said of the run (graph_edits.graph_charging), where it said anything."""
    if not said:
        return ""
    uncharged = ", some launches NOT charged" if said["uncharged_warnings"] else ""
    return f" (graph launches charged: {said['charged_graphs']} graph(s){uncharged})"


def diff(value: float | None, target: float) -> float | None:
    return None if value is None else value - target


def pair_row(p: dict[str, Any]) -> str:
    targets = " / ".join(f"{t}" for t in p["targets"])
    if p["shares"] is None:
        return f"| two saturating tenants, compute | {targets} % | n/a (no common second) | n/a |"
    shares = " / ".join(num(s) for s in p["shares"])
    points = " / ".join(num(x, signed=True) for x in p["points"])
    return (
        f"| two saturating tenants, compute | {targets} % | {shares} % over {p['seconds_together']} s together | "
        f"{points} points; together {num(p['total'], 0)} % of one uncapped tenant |"
    )


def latency_row(lat: dict[str, Any]) -> str:
    alone, beside = lat.get("alone", {}), lat.get("beside", {})
    a99, b99 = alone.get("p99_us"), beside.get("p99_us")
    ratio = f"×{b99 / a99:.1f}" if a99 and b99 else "n/a"
    return (
        f"| latency stream, p99 | {beside.get('target', alone.get('target'))} % beside a "
        f"{beside.get('neighbour')} % neighbour | {num(b99, 0)} µs (p50 {num(beside.get('p50_us'), 0)}); "
        f"alone {num(a99, 0)} µs (p50 {num(alone.get('p50_us'), 0)}) | {ratio} |"
    )


def allocation(m: dict[str, Any]) -> str:
    over = "granted" if m["over_ok"] else f"refused ({m['over_error']})" if m["over_ok"] is False else "n/a"
    within = "granted" if m["within_ok"] else "refused" if m["within_ok"] is False else "n/a"
    return f"{m['over_mib']} MiB {over}, {m['within_mib']} MiB {within}"


def at_limit(a: dict[str, Any] | None) -> str:
    """A tenant held at its limit, and the driver's count of it (the device plugin's VRAM guard's view)."""
    if not a:
        return ""
    if a["driver_mib"] is None:
        return f"; filled {num(a['filled_mib'], 0)} MiB, the driver's count not read ({a['matched']})"
    return (
        f"; filled {a['filled_mib']} MiB ({a['stopped']}), the driver counts {a['driver_mib']} MiB: "
        f"{a['past_limit_mib']:+d} MiB past the limit"
    )


def memory_row(m: dict[str, Any]) -> str:
    held = "held" if m["over_ok"] is False and m["within_ok"] else "NOT held" if m["over_ok"] else "n/a"
    seen = f"device seen {m['device_mib_seen']} MiB{at_limit(m.get('at_limit'))}"
    return f"| memory | {m['limit_mib']} MiB | {allocation(m)}; {seen} | {held} |"


def tampering_row(t: dict[str, Any]) -> str:
    if not t["changed"]:
        return f"| tampering | {t['target']} % | no limit in the environment to raise | nothing gained |"
    raised = ", ".join(f"{k}={v}" for k, v in sorted(t["changed"].items()))
    memory = "more memory" if t["memory"]["over_ok"] else "no memory"
    under = " (under the plugin's MPS ceiling)" if t.get("ceiling") else ""
    seen = f"{num(t['tampered_share'])} % of uncapped"
    if guard := t.get("guard"):
        under = f" (beside the plugin's guard: region {guard['state']}, put back after {guard['after_s']:g} s)"
        seen = (
            f"{num(t['tampered_share'])} % of uncapped until the guard, {num(t['guarded_share'])} % from "
            f"{LIVE_SETTLE_S:g} s after it"
        )
    kept = " kept (past its limit)" if guard else ""
    return (
        f"| tampering: {raised}{under} | {t['target']} % | {seen} (honest {num(t['honest_share'])} %); "
        f"{allocation(t['memory'])} | {num(t['gain_points'], signed=True)} points{kept}, {memory} |"
    )


def own_region_row(target: int, own: dict[str, Any]) -> str:
    memory = "more memory" if own["memory"]["over_ok"] else "no memory"
    where = (
        "as its container: the plugin's live-limits directory mounted"
        if own.get("mount_namespace")
        else "NOT as its container: no mount namespace here"
    )
    return (
        "| tampering: the same, with HAMi-core's switch off (`GPU_CORE_UTILIZATION_POLICY=disable`) and a region "
        f"of its own (`CUDA_DEVICE_MEMORY_SHARED_CACHE`; {where}) | "
        f"{target} % | {num(own['share'])} % of uncapped; {allocation(own['memory'])} | "
        f"{num(own['gain_points'], signed=True)} points past its limit, {memory} |"
    )


def burst_row(b: dict[str, Any]) -> str:
    head = f"| after {b['idle_s']:g} s idle, one tenant, compute | {b['target']} % |"
    if b.get("error"):
        return f"{head} failed: {b['error']} | n/a |"
    first = " / ".join(num(s) for s in b["after_shares"][:4])
    return (
        f"{head} {num(b['before_share'])} % before the pause; {first} % in the first seconds after it | "
        f"{num(b['worst_points'], signed=True)} points at most |"
    )


def live_row(lv: dict[str, Any]) -> str:
    first, second = lv["targets"]
    head = f"| limit lowered while running (region rewritten), compute | {first} → {second} % |"
    if lv.get("error"):
        return f"{head} failed: {lv['error']} | n/a |"
    region = lv["region"]
    return (
        f"{head} {num(lv['before_share'])} % before; {num(lv['after_share'])} % from {LIVE_SETTLE_S:g} s after (region "
        f"{region['state']}, {len(region.get('writes', []))} write(s)) | "
        f"{num(diff(lv['after_share'], second), signed=True)} points after |"
    )


def pod_row(p: dict[str, Any]) -> str:
    head = f"| one pod, {p['processes']} busy compute processes | {p['target']} % |"
    if p["total"] is None:
        return f"{head} n/a (no common second) | n/a |"
    each = " + ".join(num(s) for s in p["shares"])
    return (
        f"{head} {each} = {num(p['total'])} % over {p['seconds_together']} s together | "
        f"{num(p['points'], signed=True)} points |"
    )


def switch_row(sw: dict[str, Any]) -> str:
    head = f"| a 0 written into its region's limiter switch while it runs, compute | {sw['target']} % |"
    if sw.get("error"):
        return f"{head} failed: {sw['error']} | n/a |"
    policy = f"{Env.HAMI_UTILIZATION_POLICY}={sw['policy']}" if sw.get("policy") else "no policy variable"
    return (
        f"{head} {num(sw['before_share'])} % before; {num(sw['after_share'])} % from {LIVE_SETTLE_S:g} s after "
        f"({policy}) | {num(diff(sw['after_share'], sw['target']), signed=True)} points after |"
    )


def mode_section(mode: str, figures: dict[str, Any], gpu: dict[str, Any]) -> list[str]:
    backend = BACKENDS[IsolationMode(mode)]
    title = f"## {mode} (enforcement backend {backend})"
    if figures.get("status") != "measured":
        return [f"{title}: not measured", "", *[f"- {r}" for r in figures.get("reasons") or ["(no reason given)"]]]
    lines = [
        f"{title} — {gpu.get('name', '?')}, driver {gpu.get('driver', '?')}, CUDA {gpu.get('cuda', '?')}",
        "",
        *TABLE_HEAD,
    ]
    lines += [single_row(s) for s in figures.get("single", [])]
    lines += [pair_row(p) for p in figures.get("pairs", [])]
    if figures.get("latency"):
        lines.append(latency_row(figures["latency"]))
    if figures.get("memory"):
        lines.append(memory_row(figures["memory"]))
    if figures.get("tampering"):
        lines.append(tampering_row(figures["tampering"]))
        if own := figures["tampering"].get("own_region"):
            lines.append(own_region_row(figures["tampering"]["target"], own))
    if figures.get("burst"):
        lines.append(burst_row(figures["burst"]))
    if figures.get("live"):
        lines.append(live_row(figures["live"]))
    if figures.get("pod"):
        lines.append(pod_row(figures["pod"]))
    if figures.get("switch"):
        lines.append(switch_row(figures["switch"]))
    for label, error in (figures.get("errors") or {}).items():
        lines.append(f"\nFAILED: {label}: {error}")
    if figures.get("out_of_budget"):
        lines.append(f"\nNot run, out of budget: {'; '.join(figures['out_of_budget'])}")
    return lines


def baseline_lines(baseline: dict[str, Any]) -> list[str]:
    rows = baseline.get("single", [])
    if not rows:
        return []
    lines = ["## uncapped, alone (what every share is of)", "", "| load | rate |", "|---|---|"]
    return lines + [f"| {s['kernel']} | {num(s['rate'])} {s.get('unit') or ''} |" for s in rows]


def render_markdown(result: dict[str, Any]) -> str:
    gpu = result.get("gpu", {})
    lines = [
        "# Isolation benchmark",
        "",
        f"GPU: {gpu.get('name', 'not reached')} ({gpu.get('memory_mib', '?')} MiB, MIG {gpu.get('mig', '?')}), "
        f"driver {gpu.get('driver', '?')}, CUDA {gpu.get('cuda', '?')}; catalog TFLOPS "
        f"{gpu.get('tflops', 0) / 1000:g}{'' if gpu.get('in_catalog', True) else ' (not in the catalog: nominal)'}.",
        f"Budget {result.get('budget_s')} s, ran {result.get('wall_s', '?')} s; two-tenant splits "
        f"{num(result.get('pair_s'), 0)} s each.",
        "Shares are of the same load's uncapped rate alone; points are share minus limit.",
        *(
            [f"soft's HAMi-core: {build}."]
            if (build := result.get("hami_build")) and IsolationMode.SOFT in result.get("modes", {})
            else []
        ),
        *[f"- note: {n}" for n in result.get("notes", [])],
        "",
        "Prerequisites:",
        *[f"- {p}" for p in result.get("prerequisites", [])],
        "",
    ]
    lines += baseline_lines(result.get("baseline", {}))
    for mode, figures in result.get("modes", {}).items():
        lines += ["", *mode_section(mode, figures, gpu)]
    if result.get("error"):
        lines += ["", "FAILED:", "```", result["error"].strip(), "```"]
    return "\n".join(lines) + "\n"


def write_report(out: Path, result: dict[str, Any]) -> str:
    """``isolation.json`` and ``isolation.md`` under ``out``; the Markdown returned to be printed."""
    markdown = render_markdown(result)
    (out / "isolation.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "isolation.md").write_text(markdown)
    return markdown
