"""The project model: which training script each launch script starts, and with how many
processes. Built from the per-file launch facts after every file was linted.

This is the first slice of the project model (the config-rules work links accelerate,
DeepSpeed and training configs the same way); CFX105 reads it through
`condition_holds("multi-process-launch", script)`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cfgfix.core import Related, Span


@dataclass(frozen=True)
class LaunchFacts:
    """A launch as plain data, so it can be cached with its launch script's result."""

    launcher: str
    script: str | None
    world_size: int | None
    accelerate_config: str | None
    span: Span

    @classmethod
    def from_launch(cls, launch) -> "LaunchFacts":
        config = launch.config_files.get("accelerate")
        return cls(
            launcher=launch.launcher,
            script=launch.script.text if launch.script is not None else None,
            world_size=launch.world_size,
            accelerate_config=config.text if config is not None else None,
            span=launch.command.span,
        )

    def to_dict(self) -> dict:
        return {
            "launcher": self.launcher,
            "script": self.script,
            "world_size": self.world_size,
            "accelerate_config": self.accelerate_config,
            "span": self.span.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "LaunchFacts":
        return cls(
            data["launcher"], data["script"], data["world_size"], data["accelerate_config"],
            Span.from_dict(data["span"]),
        )


def _resolve(written: str, launch_file: Path, root: Path) -> Path | None:
    """A path as a launch script wrote it: relative to the script's folder, the project
    root, or the current folder (launch scripts are run from any of these)."""
    if "$" in written:
        return None
    candidate = Path(written)
    bases = [Path()] if candidate.is_absolute() else [launch_file.parent, root, Path.cwd()]
    for base in bases:
        path = (base / candidate) if not candidate.is_absolute() else candidate
        if path.is_file():
            return Path(os.path.realpath(path))
    return None


class ProjectModel:
    def __init__(self) -> None:
        # training script (real path) -> launches with more than one process
        self.multi_process: dict[Path, list[tuple[LaunchFacts, int]]] = {}

    @classmethod
    def build(cls, files, results, root: Path) -> "ProjectModel":
        model = cls()
        for sf in files:
            result = results.get(sf.display)
            if result is None:
                continue
            for data in result.launches:
                launch = LaunchFacts.from_dict(data)
                if launch.script is None:
                    continue
                script = _resolve(launch.script, sf.path, root)
                world = launch.world_size
                if world is None and launch.accelerate_config:
                    world = _accelerate_world_size(launch.accelerate_config, sf.path, root)
                if script is not None and world is not None and world > 1:
                    model.multi_process.setdefault(script, []).append((launch, world))
        return model

    def condition_holds(self, condition: str, sf) -> list[Related] | None:
        """None when the condition does not hold for this file; else the spans that show it."""
        if condition != "multi-process-launch":
            return None
        launches = self.multi_process.get(Path(os.path.realpath(sf.path)))
        if not launches:
            return None
        return [Related(launch.span, f"launched here with {world} processes") for launch, world in launches]


def _accelerate_world_size(written: str, launch_file: Path, root: Path) -> int | None:
    from cfgfix.documents.shell import accelerate_config_world_size

    path = _resolve(written, launch_file, root)
    if path is None:
        return None
    try:
        return accelerate_config_world_size(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None
