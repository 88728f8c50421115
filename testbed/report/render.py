"""Report rendering: Markdown and self-contained HTML (figures embedded as data URIs) from the analysed tables."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


def md_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "_(none)_\n"
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(_cell(v) for v in r) + " |")
    return "\n".join(lines) + "\n"


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v).replace("|", "/")


def html_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "<p><em>(none)</em></p>"
    return df.to_html(index=False, border=0, float_format=lambda x: f"{x:.3g}", na_rep="-")


CSS = """body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}h1{font-size:1.5em}
.headline{font-size:1.2em;font-weight:bold;background:#eef;padding:.5em}img{max-width:100%}"""


@dataclass(frozen=True)
class Summary:
    """What summary.md and report.html show, the same in both."""

    headline: str
    baseline: str
    status_line: str
    settings: str
    notes: Sequence[str]
    matrix: pd.DataFrame
    crossovers: pd.DataFrame
    error_summary: pd.DataFrame  # per compressor (summary.md)
    errors: pd.DataFrame  # per trial (report.html)
    figures: Sequence[tuple[str, Path]]
    # what the results add beyond throughput (time to accuracy, stragglers, racks, cross traffic): Markdown, each
    # starting with its "## " heading; summary.md appends them as they are, report.html renders them
    sections: Sequence[str] = ()


def write_markdown(path: Path, s: Summary) -> Path:
    """summary.md: headline, notes, the speedup matrix, crossovers, prediction errors and links to the figures."""
    md = [
        f"# Gradient compression report\n\n**{s.headline}**\n",
        f"Baseline: {s.baseline}. Speedup = baseline iteration time / "
        f"compressor iteration time at the same model, batch, workers and bandwidth; ~ marks a tie (the repeated "
        f"trials do not tell the two apart there).\n",
        f"{s.status_line}.\n",
        f"{s.settings}.\n",
    ]
    if s.notes:
        md.append("## Notes\n\n" + "".join(f"- {n}\n" for n in s.notes))
    md += [
        "## Speedup matrix\n",
        md_table(s.matrix),
        "## Crossover bandwidth (measured vs predicted)\n",
        md_table(s.crossovers),
        "## Prediction error (median |predicted - measured| / measured per compressor)\n",
        md_table(s.error_summary),
        "Per configuration (repeated trials pooled by their median): `prediction_error.csv`.\n",
        "## Figures\n",
    ]
    md += [f"- {title}: ![{title}]({p.name})\n" for title, p in s.figures]
    md += list(s.sections)
    path.write_text("\n".join(md))
    return path


def section_html(markdown: str) -> str:
    """One of the report's Markdown sections as HTML: its tables as tables. Raw HTML in it (a model or compressor
    name from the results) is escaped, never passed through."""
    from markdown_it import MarkdownIt

    return MarkdownIt("default").render(markdown)  # the "default" preset: tables on, raw HTML off


def write_html(path: Path, s: Summary) -> Path:
    """report.html: the same content with the figures embedded as data URIs (opens without network)."""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Gradient compression report</title>"
        f"<style>{CSS}</style></head><body><h1>Gradient compression report</h1>",
        f"<p class='headline'>{html.escape(s.headline)}</p><p>Baseline: {html.escape(s.baseline)}. "
        f"{html.escape(s.status_line)}. {html.escape(s.settings)}.</p>",
    ]
    if s.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in s.notes) + "</ul>")
    parts += [
        "<h2>Speedup matrix</h2>",
        html_table(s.matrix),
        "<h2>Crossover bandwidth</h2>",
        html_table(s.crossovers),
        "<h2>Figures</h2>",
    ]
    for title, p in s.figures:
        data = base64.b64encode(p.read_bytes()).decode("ascii")
        parts.append(
            f"<h3>{html.escape(title)}</h3><img alt='{html.escape(title)}' src='data:image/png;base64,{data}'>"
        )
    parts += [section_html(text) for text in s.sections]
    parts += ["<h2>Prediction error per trial</h2>", html_table(s.errors), "</body></html>"]
    path.write_text("\n".join(parts))
    return path
