"""The crossover searches kept beside the results (`<results>/searches/*.json`, written by `testbed crossover`):
read for the report, which marks their rates and brackets on the time-vs-bandwidth curves and lists their verdicts.
Pure reading: a file that cannot be read is skipped with a note."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SEARCHES_DIR = "searches"  # the same name as testbed.crossover_run.SEARCHES_DIR


def load_searches(results_dir: str | Path | None) -> tuple[list[dict[str, Any]], list[str]]:
    """(every search of the results directory, notes on the files skipped)."""
    if results_dir is None:
        return [], []
    docs, notes = [], []
    for p in sorted((Path(results_dir) / SEARCHES_DIR).glob("*.json")):
        try:
            doc = json.loads(p.read_text())
            if not isinstance(doc, dict) or "variant" not in doc:
                raise ValueError("not a search")
        except (OSError, ValueError) as e:
            notes.append(f"skipped unreadable crossover search {p} ({type(e).__name__})")
            continue
        docs.append(doc)
    return docs, notes


def report_variant(doc: dict[str, Any]) -> str:
    """The report's label of the search's compressor (analysis' `powersgd[rank=4]`), to find its curve."""
    from testbed.report.analysis import _variant

    return _variant(doc.get("compressor", ""), doc.get("options") or {})


def searches_of(docs: list[dict[str, Any]], model: str, batch_size: int, world_size: int) -> list[dict[str, Any]]:
    return [d for d in docs if (d.get("model"), d.get("batch_size"), d.get("world_size")) == (model, int(batch_size),
                                                                                             int(world_size))]  # fmt: skip


def search_notes(docs: list[dict[str, Any]]) -> list[str]:
    """One line per search: its verdict and the model's ratio, or how far an unfinished one got."""
    out = []
    for d in docs:
        where = f"{d.get('model')} bs{d.get('batch_size')}, {d.get('world_size')} ranks"
        if d.get("done"):
            ratio = f"; model / measured {d['ratio']:.2f}" if d.get("ratio") else ""
            out.append(f"crossover search ({where}): {d.get('verdict')}{ratio}")
        else:
            out.append(f"crossover search ({where}): {d.get('variant')} unfinished after {d.get('trials')} trials "
                       "(run `testbed crossover` again to resume)")  # fmt: skip
    return out
