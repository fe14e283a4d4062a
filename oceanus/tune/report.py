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
.versus th { background: #f6f7f9; }
.versus td, .versus th { text-align: left; }
.versus td:first-child { color: #5f6b7a; width: 34%; }
.versus .better { color: #1a7f37; font-weight: 600; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px;
  border-radius: 2px; }
"""

TOP = 5  # configurations drawn as lines and listed first


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


def _sweep_best(trial: Trial, budget_ms: float) -> Measurement | None:
    return frontier.best_within(trial.points, budget_ms)


def ranked(outcome: Outcome, budget_ms: float) -> list[Trial]:
    """Configurations best first, on the footing they all share: the sweep's best throughput
    with p99 within the budget; those with none last, in the order tried."""
    best = {t.id: _sweep_best(t, budget_ms) for t in outcome.trials}
    scored = [t for t in outcome.trials if best[t.id] is not None]
    scored.sort(key=lambda t: -best[t.id].throughput)  # type: ignore[union-attr]
    return scored + [t for t in outcome.trials if t not in scored]


def top_trials(outcome: Outcome, budget_ms: float) -> list[Trial]:
    """The TOP best, plus the recommended and the shipped configuration when not among them."""
    order = ranked(outcome, budget_ms)
    chosen = order[:TOP]
    for must in (outcome.recommended, outcome.shipped):
        if must is not None and must not in chosen:
            chosen.append(must)
    return [t for t in order if t in chosen]


def _role(outcome: Outcome, trial: Trial) -> str:
    roles = []
    if trial is outcome.recommended:
        roles.append("recommended")
    if trial is outcome.shipped:
        roles.append("shipped")
    return ", ".join(roles)


def _series(outcome: Outcome, top: Sequence[Trial]) -> list[plots.Series]:
    return [
        plots.Series(
            f"#{t.id} {t.candidate.label()}",
            plots.color(i),
            frontier.usable(t.points),
            emphasis=t is outcome.shipped or t is outcome.recommended,
            tag=f"#{t.id}" + (f" {_role(outcome, t)}" if _role(outcome, t) else ""),
        )
        for i, t in enumerate(top)
        if frontier.usable(t.points)
    ]


def _best(trial: Trial, budget_ms: float) -> Measurement | None:
    """The measurement a score stands for: the best within the budget, side by side first."""
    return frontier.best_within(trial.side_points, budget_ms) or frontier.best_within(
        trial.points, budget_ms
    )


def _versus(outcome: Outcome, budget_ms: float) -> str:
    """The recommendation and the shipped configuration side by side (when the shipped one
    stays: against the best other configuration)."""
    left = outcome.recommended
    right: Trial | None = outcome.shipped
    titles = ("Recommended", "Shipped")
    if left is None or left is outcome.shipped:
        others = [t for t in ranked(outcome, budget_ms) if t is not outcome.shipped]
        left, right = outcome.shipped, (others[0] if others else None)
        titles = ("Shipped (kept)", "Best other configuration")
    pair = [t for t in (left, right) if t is not None]
    best = [_best(t, budget_ms) for t in pair]
    scores = [outcome.scores.get(t.id) for t in pair]
    sweep = [_sweep_best(t, budget_ms) for t in pair]

    def row(name: str, cells: Sequence[str], better: int | None = None) -> str:
        tds = "".join(
            f"<td{' class=better' if i == better else ''}>{c}</td>" for i, c in enumerate(cells)
        )
        return f"<tr><td>{name}</td>{tds}</tr>"

    def higher(values: Sequence[float | None], more_is_better: bool = True) -> int | None:
        if len(values) < 2 or any(v is None for v in values) or values[0] == values[1]:
            return None
        first, second = values[0] or 0.0, values[1] or 0.0
        return 0 if (first > second) == more_is_better else 1

    colours = {t.id: plots.color(i) for i, t in enumerate(top_trials(outcome, budget_ms))}
    head = "".join(
        f'<th><span class="swatch" style="background:{colours.get(t.id, "#8a94a3")}"></span>'
        f"{title}: #{t.id}</th>"
        for title, t in zip(titles, pair, strict=False)
    )
    measured = [
        f"side by side, {outcome.rounds} round(s)" if t in outcome.finalists else "sweep"
        for t in pair
    ]
    c = [t.candidate for t in pair]
    rows = [
        row("configuration", [escape(x.label()) for x in c]),
        row(
            f"throughput at p99 ≤ {budget_ms:g} ms (what was compared)",
            [f"{_fmt(v)} infer/s" for v in scores],
            higher(scores),
        ),
        row("measured in", measured),
        row(
            "sweep: best at p99 within the budget",
            [f"{_fmt(b.throughput)} infer/s" if b else NONE for b in sweep],
        ),
        row("best point: concurrency", [str(b.concurrency) if b else NONE for b in best]),
        row(
            "p50 / p99 latency",
            [f"{_fmt(b.p50_ms, 2)} / {_fmt(b.p99_ms, 2)} ms" if b else NONE for b in best],
            higher([b.p99_ms if b else None for b in best], more_is_better=False),
        ),
        row("average batch (server)", [_fmt(b.avg_batch if b else None, 2) for b in best]),
        row(
            "max batch size / preferred",
            [f"{x.max_batch_size} / {list(x.preferred) if x.preferred else 'default'}" for x in c],
        ),
        row(
            "dynamic batching, max queue delay",
            [f"{'on' if x.dynamic_batching else 'off'}, {x.delay_us} µs" for x in c],
        ),
        row("model instances", [str(x.instances) for x in c]),
        row(
            "compute / queue per request (server)",
            [
                f"{_fmt(b.compute_us if b else None)} / {_fmt(b.queue_us if b else None)} µs"
                for b in best
            ],
        ),
    ]
    return (
        f'<div class="scroll"><table class="versus"><tr><th></th>{head}</tr>'
        + "".join(rows)
        + "</table></div>"
    )


def _top_table(outcome: Outcome, budget_ms: float) -> str:
    rows = []
    for index, trial in enumerate(top_trials(outcome, budget_ms)):
        best = _sweep_best(trial, budget_ms)
        role = _role(outcome, trial)
        chosen = " class=chosen" if trial is outcome.recommended else ""
        side = _fmt(outcome.scores.get(trial.id)) if trial in outcome.finalists else ""
        rows.append(
            f'<tr{chosen}><td><span class="swatch" style="background:{plots.color(index)}">'
            f"</span>#{trial.id}</td><td class=text>{escape(trial.candidate.label())}"
            f"{f' <span class=muted>({role})</span>' if role else ''}</td>"
            f"<td>{_fmt(best.throughput if best else None)}</td>"
            f"<td>{best.concurrency if best else NONE}</td>"
            f"<td>{_fmt(best.p50_ms if best else None, 2)}</td>"
            f"<td>{_fmt(best.p99_ms if best else None, 2)}</td>"
            f"<td>{_fmt(best.avg_batch if best else None, 2)}</td><td>{side}</td></tr>"
        )
    return (
        '<div class="scroll"><table><tr><th>#</th><th class=text>configuration</th>'
        f"<th>sweep: best infer/s at p99 ≤ {budget_ms:g} ms</th><th>at concurrency</th>"
        "<th>p50 ms</th><th>p99 ms</th><th>avg batch</th><th>side by side: median infer/s</th>"
        "</tr>" + "".join(rows) + "</table></div>"
    )


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


def _side_by_side(outcome: Outcome, budget_ms: float) -> str:
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
        top = top_trials(outcome, budget_ms)
        fill = plots.color(top.index(trial)) if trial in top else "#8a94a3"  # as in the charts
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
    """The report, for a reader: the answer and the shipped configuration side by side, the
    top configurations, one chart of them against the budget; then every detail. The
    `shipped_canonical` config is the shipped one printed the way the recommended one is, so
    that their diff shows only what changed."""
    sweep_points = [p for t in outcome.trials for p in t.points]
    top = top_trials(outcome, info.budget_ms)
    series = _series(outcome, top)
    drawn = {t.id for t in top}
    others = [p for t in outcome.trials if t.id not in drawn for p in frontier.usable(t.points)]
    recommended = outcome.recommended  # its ring on the chart: the sweep point drawn there
    chosen = frontier.best_within(recommended.points, info.budget_ms) if recommended else None
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
<h2 id="versus">The recommendation and the shipped configuration</h2>
{_versus(outcome, info.budget_ms)}
<h2 id="top">Top configurations</h2>
<p class="muted">Best first by the sweep's best throughput with p99 within the budget (one
measurement per point, so noisy on a busy machine); the finalists' side-by-side medians, measured
in rounds on the same server, are what the recommendation rests on. {len(outcome.trials)}
configurations were tried: all are in the details below.</p>
{_top_table(outcome, info.budget_ms)}
<h2 id="chart">Throughput against p99 latency</h2>
<p class="muted">Each line is one of the top configurations under rising concurrency (1, 2, 4,
...); grey points are the other configurations' measurements. Right of the red line p99 is over
the budget; the ring marks the recommended point.</p>
{plots.throughput_vs_p99(series, others, chosen, info.budget_ms)}
<h2 id="details">Details</h2>
<h3>Every configuration</h3>
{_trials_table(outcome, info.budget_ms)}
<h3>Throughput against concurrency (the top configurations)</h3>
{plots.throughput_vs_concurrency(series)}
<h3>Side by side</h3>
<p class="muted">The shipped configuration and the best of the sweep, measured in rounds
(their order rotating) on the same server, so that all see the same machine: per configuration
the best median throughput over the rounds whose median p99 is within the budget.</p>
{_side_by_side(outcome, info.budget_ms)}
<h3>Recommended config.pbtxt</h3>
<pre>{escape(recommended_text) if recommended_text else "(none)"}</pre>
<h3>Change from the shipped config</h3>
<pre>{escape(diff) if diff else "(no change)"}</pre>
<h3>Every measurement</h3>
<details><summary>{len(sweep_points)} sweep measurements</summary>
{_points_table(sweep_points)}</details>
</body></html>
"""
