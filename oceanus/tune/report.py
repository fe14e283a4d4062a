"""The tune report: one self-contained HTML file (inline CSS and SVG, nothing fetched)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from oceanus.tune import frontier, plots
from oceanus.tune.measure import Measurement
from oceanus.tune.sweep import Outcome, Trial

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: #1c2330; max-width: 980px; margin: 0 auto; padding: 12px 16px 40px; }
h1 { font-size: 1.5rem; margin: 8px 0; }
h2 { font-size: 1.15rem; margin-top: 28px; }
.muted { color: #5f6b7a; }
.box { border: 1px solid #dde2e8; border-radius: 8px; padding: 10px 14px; }
.win { background: #eef8f0; border-color: #9fd5ab; }
.keep { background: #f6f7f9; }
table { border-collapse: collapse; width: 100%; font-size: 0.88rem; }
th, td { border-bottom: 1px solid #e6e9ee; padding: 4px 6px; text-align: right;
  vertical-align: top; }
th:first-child, td:first-child, td.text, th.text { text-align: left; }
.scroll { overflow-x: auto; }
pre { background: #f6f7f9; padding: 10px; overflow-x: auto; font-size: 0.82rem; }
svg { width: 100%; height: auto; }
.legend { list-style: none; padding: 0; columns: 2 18rem; font-size: 0.85rem; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 6px;
  border-radius: 2px; }
.chosen td { font-weight: 600; }
"""


@dataclass(frozen=True)
class RunInfo:
    model: str
    budget_ms: float
    max_minutes: float
    elapsed_s: float
    cpus: int
    generator: str
    started: str  # ISO time
    server: str  # "started by oceanus tune" or the --url
    window_s: float
    # the machine's 1-minute load average at the start and at the end (None: unknown)
    load: tuple[float, float] | None = None

    def busy(self) -> bool:
        """Whether other work competed for the CPUs (a load average above the CPU count)."""
        return self.load is not None and max(self.load) > self.cpus


NONE = "\N{EN DASH}"  # no value


def _load(info: RunInfo) -> str:
    if info.load is None:
        return ""
    return f" (load average {info.load[0]:.1f} at the start, {info.load[1]:.1f} at the end)"


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return NONE
    return f"{value:,.{digits}f}"


def _series(outcome: Outcome) -> list[plots.Series]:
    return [
        plots.Series(
            f"#{t.id} {t.candidate.label()}",
            plots.color(i),
            frontier.usable(t.points),
            emphasis=t is outcome.shipped or t is outcome.recommended,
        )
        for i, t in enumerate(outcome.trials)
        if frontier.usable(t.points)
    ]


def _legend(trials: Sequence[Trial]) -> str:
    items = [
        f'<li><i style="background:{plots.color(i)}"></i>#{t.id} {escape(t.candidate.label())}'
        f"{' (shipped)' if t.candidate.shipped else ''}</li>"
        for i, t in enumerate(trials)
        if frontier.usable(t.points)
    ]
    return f'<ul class="legend">{"".join(items)}</ul>'


def _summary(outcome: Outcome, info: RunInfo) -> str:
    recommended = outcome.recommended
    if recommended is None:
        notes = " ".join(escape(n) for n in outcome.notes)
        return f'<div class="box keep"><b>No recommendation.</b> {notes}</div>'
    shipped, chosen = outcome.shipped_score, outcome.recommended_score
    if recommended is outcome.shipped:
        head, css = "Keep the shipped configuration.", "keep"
    else:
        gain = f" ({chosen / shipped - 1:+.0%})" if chosen and shipped else ""
        head = f"Recommended: #{recommended.id} {escape(recommended.candidate.label())}{gain}."
        css = "win"
    how = (
        f"measured side by side in {outcome.rounds} round(s)"
        if outcome.rounds
        else "as measured in the sweep"
    )
    lines = [
        f"<b>{head}</b>",
        f"At p99 ≤ {info.budget_ms:g} ms: #{recommended.id} {_fmt(chosen)} infer/s, the shipped "
        f"configuration {_fmt(shipped)} infer/s, {how}.",
        *(escape(note) for note in outcome.notes),
    ]
    if info.busy():
        lines.append(
            "Other work competed for the CPUs during this run (load average above the CPU "
            "count): single measurements are noisy; the side-by-side medians are the ones to read."
        )
    return f'<div class="box {css}">' + "<br>".join(lines) + "</div>"


def _trials_table(outcome: Outcome, budget_ms: float) -> str:
    rows = []
    finalists = {t.id for t in outcome.finalists}
    for trial in outcome.trials:
        best = frontier.best_within(trial.points, budget_ms)
        chosen = " class=chosen" if trial is outcome.recommended else ""
        note = escape(trial.load_error) if trial.load_error else ""
        side = _fmt(outcome.scores.get(trial.id)) if trial.id in finalists else ""
        rows.append(
            f"<tr{chosen}><td>#{trial.id}</td><td class=text>{escape(trial.candidate.label())}"
            f"{' <span class=muted>(shipped)</span>' if trial.candidate.shipped else ''}"
            f"{'<br><span class=muted>' + note + '</span>' if note else ''}</td>"
            f"<td class=text>{escape(trial.stage)}</td>"
            f"<td>{_fmt(best.throughput if best else None)}</td>"
            f"<td>{best.concurrency if best else NONE}</td>"
            f"<td>{_fmt(best.p99_ms if best else None, 2)}</td>"
            f"<td>{_fmt(best.avg_batch if best else None, 2)}</td><td>{side}</td></tr>"
        )
    return (
        '<div class="scroll"><table><tr><th>#</th><th class=text>configuration</th>'
        "<th class=text>stage</th><th>best infer/s within budget</th><th>at concurrency</th>"
        "<th>p99 ms</th><th>avg batch</th><th>side by side infer/s</th></tr>"
        + "".join(rows)
        + "</table></div>"
    )


def _side_by_side(outcome: Outcome) -> str:
    if not outcome.rounds:
        return "<p class=muted>No side-by-side run: " + (
            "the shipped configuration was the best measured.</p>"
            if outcome.recommended is outcome.shipped
            else "no configuration met the budget.</p>"
        )
    rows = []
    for trial in outcome.finalists:
        role = "shipped" if trial is outcome.shipped else "finalist"
        if trial is outcome.recommended:
            role += ", recommended"
        fill = plots.color(outcome.trials.index(trial))  # as in the charts
        rows.append((f"#{trial.id} ({role})", outcome.scores.get(trial.id), fill))
    points = [p for t in outcome.finalists for p in t.side_points]
    return plots.bars(rows, "infer/s") + _points_table(points)


def _points_table(points: Sequence[Measurement]) -> str:
    rows = [
        f"<tr><td>#{p.config_id}</td><td class=text>{escape(p.phase)}</td><td>{p.concurrency}</td>"
        f"<td>{_fmt(p.throughput)}</td><td>{_fmt(p.p50_ms, 2)}</td><td>{_fmt(p.p90_ms, 2)}</td>"
        f"<td>{_fmt(p.p99_ms, 2)}</td><td>{_fmt(p.avg_batch, 2)}</td>"
        f"<td>{_fmt(p.queue_us)}</td><td>{_fmt(p.compute_us)}</td>"
        f"<td class=text>{escape(p.error or (str(p.errors) + ' errors' if p.errors else ''))}"
        "</td></tr>"
        for p in points
    ]
    return (
        '<div class="scroll"><table><tr><th>#</th><th class=text>phase</th><th>concurrency</th>'
        "<th>infer/s</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>avg batch</th>"
        "<th>queue µs</th><th>compute µs</th><th class=text>errors</th></tr>"
        + "".join(rows)
        + "</table></div>"
    )


def render(outcome: Outcome, info: RunInfo, recommended_text: str, shipped_canonical: str) -> str:
    """The report; `shipped_canonical` is the shipped config printed the way the recommended
    one is, so that their diff shows only what changed."""
    sweep_points = [p for t in outcome.trials for p in t.points]
    front = frontier.frontier(sweep_points)
    chosen = (
        frontier.best_within(outcome.recommended.points, info.budget_ms)
        if outcome.recommended is not None
        else None
    )
    series = _series(outcome)
    diff = "".join(
        difflib.unified_diff(
            shipped_canonical.splitlines(keepends=True),
            recommended_text.splitlines(keepends=True),
            "shipped config.pbtxt",
            "recommended config.pbtxt",
        )
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>oceanus tune: {escape(info.model)}</title><style>{STYLE}</style></head>
<body>
<h1>oceanus tune: {escape(info.model)}</h1>
<p class="muted">{escape(info.started)} · {info.cpus} CPUs{_load(info)}
· latency budget p99 ≤ {info.budget_ms:g} ms · {info.elapsed_s:.0f} s of {info.max_minutes:g} min
· load from {escape(info.generator)} ({info.window_s:g} s per measurement)
· server {escape(info.server)}</p>
{_summary(outcome, info)}
<h2>Throughput against p99 latency</h2>
<p class="muted">Each line is one configuration under rising concurrency (1, 2, 4, ...). The dotted
black line is the frontier (no measurement beats a point on it in both throughput and latency);
the red line is the budget; the ring marks the chosen point.</p>
{plots.throughput_vs_p99(series, front, chosen, info.budget_ms)}
{_legend(outcome.trials)}
<h2>Throughput against concurrency</h2>
{plots.throughput_vs_concurrency(series)}
<h2>Configurations</h2>
{_trials_table(outcome, info.budget_ms)}
<h2>Side by side</h2>
<p class="muted">The shipped configuration and the best of the sweep, measured in rounds
(their order rotating) on the same server, so that all see the same machine: per configuration
the best median throughput over the rounds whose median p99 is within the budget.</p>
{_side_by_side(outcome)}
<h2>Recommended config.pbtxt</h2>
<pre>{escape(recommended_text) if recommended_text else "(none)"}</pre>
<h2>Change from the shipped config</h2>
<pre>{escape(diff) if diff else "(no change)"}</pre>
<h2>Every measurement</h2>
<details><summary>{len(sweep_points)} sweep measurements</summary>
{_points_table(sweep_points)}</details>
</body></html>
"""
