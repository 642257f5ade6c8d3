"""A small Dockerfile linter for our two images (no Docker engine or hadolint here), covering the
hadolint rules we rely on: pinned bases, no :latest, COPY not ADD, exec-form CMD, apt hygiene,
pip without cache, a USER in the final stage (non-root for the scheduler image), absolute WORKDIR."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = ("Dockerfile.scheduler", "Dockerfile.plugin")


@dataclass(frozen=True)
class Instruction:
    line: int
    op: str
    args: str


def parse(text: str) -> list[Instruction]:
    out: list[Instruction] = []
    buffer, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buffer and (not line or line.startswith("#")):
            continue
        if buffer and line.startswith("#"):
            continue
        start = start or number
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        op, _, args = (buffer + line).partition(" ")
        out.append(Instruction(start, op.upper(), args.strip()))
        buffer, start = "", 0
    return out


def problems(text: str) -> list[str]:
    found: list[str] = []
    instructions = parse(text)
    args = {m[0]: m[1] for i in instructions if i.op == "ARG" for m in [i.args.split("=", 1)] if len(m) == 2}
    stages: list[tuple[str, list[Instruction]]] = []
    for ins in instructions:
        if ins.op == "FROM":
            words = ins.args.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), words[0])
            if image not in {n for n, _ in stages}:  # a base image, not an earlier stage
                if image != "scratch" and ":" not in image.split("/")[-1] and "@sha256:" not in image:
                    found.append(f"{ins.line}: FROM {image} has no tag or digest (DL3006)")
                if image.endswith(":latest"):
                    found.append(f"{ins.line}: FROM {image} uses latest (DL3007)")
            stages.append((words[2] if len(words) > 2 and words[1].upper() == "AS" else "", []))
        elif stages:
            stages[-1][1].append(ins)
        if ins.op == "ADD":
            found.append(f"{ins.line}: use COPY, not ADD (DL3020)")
        if ins.op in ("CMD", "ENTRYPOINT") and not ins.args.startswith("["):
            found.append(f"{ins.line}: {ins.op} must use the exec (JSON) form (DL3025)")
        if ins.op == "WORKDIR" and not ins.args.startswith("/"):
            found.append(f"{ins.line}: WORKDIR must be absolute (DL3000)")
        if ins.op == "RUN":
            for command in re.split(r"&&|;|\|\|", ins.args):
                words = shlex.split(command.replace("$", "")) if command.strip() else []
                if words[:1] == ["cd"]:
                    found.append(f"{ins.line}: use WORKDIR instead of cd (DL3003)")
                if words[:2] == ["apt-get", "install"]:
                    if "--no-install-recommends" not in words:
                        found.append(f"{ins.line}: apt-get install without --no-install-recommends (DL3015)")
                    if "-y" not in words:
                        found.append(f"{ins.line}: apt-get install without -y (DL3014)")
                if "pip" in command and " install" in command and "--no-cache-dir" not in command:
                    found.append(f"{ins.line}: pip install without --no-cache-dir (DL3042)")
            if "apt-get install" in ins.args and "rm -rf /var/lib/apt/lists" not in ins.args:
                found.append(f"{ins.line}: apt lists not removed in the same RUN (DL3009)")
    if not stages:
        return [*found, "no FROM"]
    final = stages[-1][1]
    if not any(i.op == "USER" for i in final):
        found.append("final stage sets no USER (DL3002)")
    if not any(i.op == "CMD" or i.op == "ENTRYPOINT" for i in final):
        found.append("final stage has no CMD/ENTRYPOINT")
    return found


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_is_clean(name: str) -> None:
    assert problems((REPO / name).read_text(encoding="utf-8")) == []


def test_scheduler_image_runs_as_non_root() -> None:
    users = [i.args for i in parse((REPO / "Dockerfile.scheduler").read_text(encoding="utf-8")) if i.op == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root")


def test_both_images_install_the_project_the_same_way() -> None:
    def build_stage(name: str) -> list[Instruction]:
        instructions = parse((REPO / name).read_text(encoding="utf-8"))
        start = next(i for i, ins in enumerate(instructions) if ins.op == "FROM" and ins.args.endswith("AS build"))
        end = next(i for i in range(start + 1, len(instructions)) if instructions[i].op == "FROM")
        return [Instruction(0, ins.op, ins.args) for ins in instructions[start:end]]

    stage = build_stage("Dockerfile.scheduler")
    assert stage == build_stage("Dockerfile.plugin")
    assert any(i.op == "RUN" and "pip install --no-cache-dir /src" in i.args for i in stage)


@pytest.mark.parametrize(
    ("snippet", "rule"),
    [
        ('FROM python\nUSER 1\nCMD ["x"]', "DL3006"),
        ('FROM python:latest\nUSER 1\nCMD ["x"]', "DL3007"),
        ('FROM python:3.11\nADD . /src\nUSER 1\nCMD ["x"]', "DL3020"),
        ("FROM python:3.11\nCMD x\nUSER 1", "DL3025"),
        (
            'FROM python:3.11\nRUN apt-get update && apt-get install -y git && rm -rf /var/lib/apt/lists/*\nUSER 1\nCMD ["x"]',
            "DL3015",
        ),
        ('FROM python:3.11\nRUN apt-get install --no-install-recommends -y git\nUSER 1\nCMD ["x"]', "DL3009"),
        ('FROM python:3.11\nRUN pip install \\\n  x\nUSER 1\nCMD ["x"]', "DL3042"),
        ('FROM python:3.11\nRUN cd /x && make\nUSER 1\nCMD ["x"]', "DL3003"),
        ('FROM python:3.11\nCMD ["x"]', "DL3002"),
    ],
)
def test_the_linter_catches_each_rule(snippet: str, rule: str) -> None:
    assert any(rule in p for p in problems(snippet)), problems(snippet)
