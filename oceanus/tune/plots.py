"""Inline SVG charts for the tune report: no plotting library, no external assets."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from oceanus.tune.measure import Measurement

PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
WIDTH, HEIGHT = 760, 420
LEFT, RIGHT, TOP, BOTTOM = 72, 18, 16, 52


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


@dataclass(frozen=True)
class Series:
    label: str
    color: str
    points: Sequence[Measurement]
    emphasis: bool = False  # drawn bold (the shipped and the chosen configuration)
    tag: str = ""  # the short name written beside its line ("#9")

    @property
    def stroke(self) -> str:
        return 'stroke-width="2.5"' if self.emphasis else 'stroke-width="1.2" opacity="0.55"'


def nice_step(span: float, ticks: int = 5) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving about `ticks` ticks over `span`."""
    raw = span / max(ticks, 1)
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return factor * power
    return 10 * power


def log_ticks(low: float, high: float) -> list[float]:
    """1-2-5 ticks between low and high."""
    ticks = []
    for exponent in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        for factor in (1, 2, 5):
            value = factor * 10.0**exponent
            if low <= value <= high:
                ticks.append(value)
    return ticks


def _number(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:g}"
    return f"{value:.3g}"


class Axes:
    """A plotting area with a linear y axis and a linear or logarithmic x axis."""

    def __init__(self, x_range: tuple[float, float], y_max: float, log_x: bool) -> None:
        self.log_x = log_x
        low, high = x_range
        if log_x:
            self.x0, self.x1 = math.log10(low), math.log10(high)
        else:
            self.x0, self.x1 = low, high
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1
        self.y_step = nice_step(y_max or 1.0)
        self.y_max = self.y_step * math.ceil((y_max or 1.0) / self.y_step)

    def x(self, value: float) -> float:
        v = math.log10(value) if self.log_x else value
        return LEFT + (v - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        return TOP + (1 - value / self.y_max) * (HEIGHT - TOP - BOTTOM)

    def frame(self, x_ticks: Sequence[float], x_title: str, y_title: str) -> list[str]:
        bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
        out = [
            f'<rect x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}" '
            'fill="none" stroke="#ccc"/>'
        ]
        value = 0.0
        while value <= self.y_max + 1e-9:
            y = self.y(value)
            out.append(f'<line x1="{LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
            out.append(
                f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_number(value)}</text>'
            )
            value += self.y_step
        for tick in x_ticks:
            x = self.x(tick)
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{bottom}" stroke="#eee"/>')
            out.append(
                f'<text x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{_number(tick)}</text>'
            )
        out.append(
            f'<text x="{(LEFT + right) / 2:.0f}" y="{HEIGHT - 10}" text-anchor="middle">'
            f"{escape(x_title)}</text>"
        )
        out.append(
            f'<text transform="translate(16 {(TOP + bottom) / 2:.0f}) rotate(-90)" '
            f'text-anchor="middle">{escape(y_title)}</text>'
        )
        return out


def _svg(body: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" font-family="sans-serif" font-size="12">'
        f"<title>{escape(title)}</title>" + "".join(body) + "</svg>"
    )


def _tooltip(label: str, point: Measurement) -> str:
    return escape(
        f"{label}\nconcurrency {point.concurrency}: {point.throughput:,.0f} infer/s, "
        f"p50 {point.p50_ms:.2f} ms, p99 {point.p99_ms:.2f} ms"
    )


def throughput_vs_p99(
    series: Sequence[Series],
    others: Sequence[Measurement],
    chosen: Measurement | None,
    budget_ms: float,
) -> str:
    """The top configurations' concurrency ladders as labelled lines of throughput over p99
    (log scale), every other measurement as a faint point, the latency budget (the region
    past it shaded) and the chosen point ringed."""
    points = [p for s in series for p in s.points] + list(others)
    if not points:
        return _svg([], "no measurements")
    lows = [p.p99_ms for p in points] + [budget_ms]
    low, high = min(lows) / 1.3, max(lows) * 1.3
    axes = Axes((low, high), max(p.throughput for p in points) * 1.08, log_x=True)
    out = axes.frame(log_ticks(low, high), "p99 latency (ms, log scale)", "throughput (infer/s)")
    bx = axes.x(budget_ms)
    right, bottom = WIDTH - RIGHT, HEIGHT - BOTTOM
    if bx < right:
        out.append(
            f'<rect x="{bx:.1f}" y="{TOP}" width="{right - bx:.1f}" height="{bottom - TOP}" '
            'fill="#d62728" opacity="0.07"><title>over the latency budget</title></rect>'
        )
    out.append(
        f'<line x1="{bx:.1f}" x2="{bx:.1f}" y1="{TOP}" y2="{bottom}" '
        'stroke="#d62728" stroke-width="2" stroke-dasharray="6 4"/>'
    )
    out.append(
        f'<text x="{bx - 5:.1f}" y="{TOP + 14}" text-anchor="end" fill="#b01f20" '
        f'font-weight="bold">p99 budget {budget_ms:g} ms</text>'
    )
    for p in others:
        out.append(
            f'<circle cx="{axes.x(p.p99_ms):.1f}" cy="{axes.y(p.throughput):.1f}" r="2.5" '
            f'fill="#8a94a3" opacity="0.45"><title>{_tooltip(f"#{p.config_id}", p)}</title>'
            "</circle>"
        )
    for item in series:
        ladder = sorted(item.points, key=lambda p: p.concurrency)
        if len(ladder) > 1:
            path = " ".join(f"{axes.x(p.p99_ms):.1f},{axes.y(p.throughput):.1f}" for p in ladder)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{item.color}" {item.stroke}/>'
            )
        for p in ladder:
            out.append(
                f'<circle cx="{axes.x(p.p99_ms):.1f}" cy="{axes.y(p.throughput):.1f}" '
                f'r="3.5" fill="{item.color}"><title>{_tooltip(item.label, p)}</title>'
                "</circle>"
            )
        top = max(ladder, key=lambda p: p.throughput)  # the line's name at its highest point
        out.append(
            f'<text x="{axes.x(top.p99_ms) + 6:.1f}" y="{axes.y(top.throughput) - 6:.1f}" '
            f'fill="{item.color}" font-weight="bold" stroke="#fff" stroke-width="3" '
            f'paint-order="stroke">{escape(item.tag)}</text>'
        )
    if chosen is not None:
        cx, cy = axes.x(chosen.p99_ms), axes.y(chosen.throughput)
        out.append(
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="9" fill="none" stroke="#111" '
            'stroke-width="2.5"><title>the recommended point</title></circle>'
        )
    return _svg(out, "throughput against p99 latency")


def throughput_vs_concurrency(series: Sequence[Series]) -> str:
    points = [p for s in series for p in s.points]
    if not points:
        return _svg([], "no measurements")
    high = max(p.concurrency for p in points)
    axes = Axes((0.8, high * 1.25), max(p.throughput for p in points) * 1.05, log_x=True)
    ticks = [float(1 << i) for i in range(16) if (1 << i) <= high]
    out = axes.frame(ticks, "concurrency (requests in flight, log scale)", "throughput (infer/s)")
    for item in series:
        ladder = sorted(item.points, key=lambda p: p.concurrency)
        path = " ".join(f"{axes.x(p.concurrency):.1f},{axes.y(p.throughput):.1f}" for p in ladder)
        if len(ladder) > 1:
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{item.color}" {item.stroke}/>'
            )
        for p in ladder:
            out.append(
                f'<circle cx="{axes.x(p.concurrency):.1f}" cy="{axes.y(p.throughput):.1f}"'
                f' r="3" fill="{item.color}"><title>{_tooltip(item.label, p)}</title>'
                "</circle>"
            )
    return _svg(out, "throughput against concurrency")


def bars(rows: Sequence[tuple[str, float | None, str]], unit: str) -> str:
    """Horizontal bars (label, value, colour), for the side-by-side comparison."""
    height = 30 * len(rows) + 20
    top = max((v for _, v, _ in rows if v is not None), default=1.0) or 1.0
    width, left = WIDTH, 230
    out = []
    for index, (label, value, fill) in enumerate(rows):
        y = 10 + 30 * index
        out.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{escape(label)}</text>')
        if value is None:
            out.append(f'<text x="{left}" y="{y + 15}">not within the budget</text>')
            continue
        length = (width - left - 120) * value / top
        out.append(f'<rect x="{left}" y="{y}" width="{length:.1f}" height="20" fill="{fill}"/>')
        out.append(f'<text x="{left + length + 6:.1f}" y="{y + 15}">{value:,.0f} {unit}</text>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="side by side" font-family="sans-serif" font-size="12">'
        + "".join(out)
        + "</svg>"
    )
