"""``tfctl explain``: ask a running extender why a pod is pending, or what a spec would get.

The extender already computes the answer with the same core calls its filter makes
(``GET /explain/{ns}/{name}``, ``POST /explain``); this module only fetches it over HTTP and prints
it for people: the one-line summary first, then one line per node.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from vgpu.names import EXTENDER_PUBLIC_PORT

# The extender's read-only listener, e.g. through `kubectl port-forward svc/<release>-extender 8081`.
DEFAULT_EXTENDER = f"http://127.0.0.1:{EXTENDER_PUBLIC_PORT}"


def add_subcommand(subparsers: Any) -> None:
    """Register ``explain`` on tfctl's sub-parsers."""
    p = subparsers.add_parser(
        "explain", help="why is this pod pending / what would this pod spec get (asks the extender)"
    )
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("pod", nargs="?", metavar="NAMESPACE/NAME", help="an existing pod")
    target.add_argument("-f", "--file", type=Path, help="a Pod YAML to try without submitting it")
    p.add_argument("--extender", default=DEFAULT_EXTENDER, help=f"extender base URL (default {DEFAULT_EXTENDER})")
    p.add_argument(
        "--token",
        help="a bearer token to show the extender (e.g. $(kubectl create token NAME)): off loopback it explains only "
        "a pod the token's user may get, and a spec in a namespace where it may create pods; a port-forward is on "
        "loopback and needs none",
    )
    p.add_argument("--json", action="store_true", help="print the extender's JSON answer as is")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    base = args.extender.rstrip("/")
    token = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    if args.file is not None:
        body = json.dumps(yaml.safe_load(args.file.read_text(encoding="utf-8"))).encode()
        headers = {"Content-Type": "application/json", **token}
        request = urllib.request.Request(f"{base}/explain", data=body, headers=headers)
    else:
        namespace, _, name = str(args.pod).rpartition("/")
        request = urllib.request.Request(f"{base}/explain/{namespace or 'default'}/{name}", headers=token)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as exc:
        print(f"tfctl: the extender answered {exc.code}: {exc.read().decode(errors='replace')[:300]}", file=sys.stderr)
        return 2
    except (urllib.error.URLError, TimeoutError) as exc:
        print(
            f"tfctl: cannot reach the extender at {base}: {exc}\n"
            "  tfctl explain asks the extender's read-only port; from outside the cluster forward it first:\n"
            f"    kubectl -n tensor-fusion-system port-forward svc/tensor-fusion-extender {EXTENDER_PUBLIC_PORT}\n"
            "  or give its URL with --extender",
            file=sys.stderr,
        )
        return 2
    if args.json:
        print(json.dumps(answer, indent=2, sort_keys=True))
    else:
        print(render(answer))
    return 0 if answer.get("admitted", True) else 1


def render(answer: dict[str, Any]) -> str:
    """The explain answer as lines for a terminal."""
    lines = [f"pod {answer.get('pod', '?')}"]
    for key, label in (
        ("request", "request"),
        ("boundTo", "bound to"),
        ("handoff", "hand-off"),
        ("summary", "summary"),
    ):
        if answer.get(key):
            lines.append(f"  {label:<9} {answer[key]}")
    split = (answer.get("allocation") or {}).get("containerGpus") or []
    lines += [f"  gpus of   {s.get('container')}: {', '.join(s.get('uuids') or [])}" for s in split]
    lines += [f"  error     {e}" for e in answer.get("errors", [])]
    lines += [f"  note      {n}" for n in answer.get("notes", [])]
    for node, verdict in (answer.get("nodes") or {}).items():
        detail = verdict.get("reason") or f"score {verdict.get('score', 0)}"
        lines.append(f"  {node:<24} {verdict.get('verdict', '?'):<13} {detail}")
    return "\n".join(lines)
