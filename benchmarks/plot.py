"""A log-log line chart as SVG, written by hand: the benchmark needs no plotting library.

:func:`loglog_svg` draws one polyline per series over the same x values (catalogue
sizes), both axes logarithmic with a gridline per power of ten, and a legend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

__all__ = ["loglog_svg"]

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
_W, _H = 720, 440
_LEFT, _RIGHT, _TOP, _BOTTOM = 80, 220, 40, 60


def _decades(low: float, high: float) -> list[int]:
    return list(range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1))


def _label(exponent: int, unit: str) -> str:
    value = 10.0**exponent
    if unit == "ms" and exponent < 0:
        return f"{value * 1000:g} µs"
    return f"{value:,g} {unit}".strip()


def loglog_svg(
    title: str,
    xs: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    *,
    x_label: str,
    y_unit: str,
) -> str:
    """The SVG text of a log-log chart of ``series`` (name -> y per x; None skips a point)."""
    ys = [y for values in series.values() for y in values if y is not None and y > 0]
    x_decades = _decades(min(xs), max(xs))
    y_decades = _decades(min(ys), max(ys))
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def px(x: float) -> float:
        span = x_decades[-1] - x_decades[0] or 1
        return _LEFT + (math.log10(x) - x_decades[0]) / span * plot_w

    def py(y: float) -> float:
        span = y_decades[-1] - y_decades[0] or 1
        return _TOP + plot_h - (math.log10(y) - y_decades[0]) / span * plot_h

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" font-family="sans-serif" font-size="12">',
        f'<rect width="{_W}" height="{_H}" fill="white"/>',
        f'<text x="{_LEFT}" y="22" font-size="15" font-weight="bold">{escape(title)}</text>',
    ]
    for e in x_decades:
        x = px(10.0**e)
        out.append(
            f'<line x1="{x:.1f}" y1="{_TOP}" x2="{x:.1f}" y2="{_TOP + plot_h}" stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{x:.1f}" y="{_TOP + plot_h + 18}" text-anchor="middle">'
            f"{_label(e, '')}</text>"
        )
    for e in y_decades:
        y = py(10.0**e)
        out.append(
            f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_LEFT + plot_w}" y2="{y:.1f}" stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{_LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{_label(e, y_unit)}</text>'
        )
    out.append(
        f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}" '
        'fill="none" stroke="#333"/>'
    )
    out.append(
        f'<text x="{_LEFT + plot_w / 2:.1f}" y="{_H - 18}" text-anchor="middle">'
        f"{escape(x_label)}</text>"
    )
    for i, (name, values) in enumerate(series.items()):
        colour = _COLOURS[i % len(_COLOURS)]
        points = [
            (px(x), py(y)) for x, y in zip(xs, values, strict=True) if y is not None and y > 0
        ]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in points]
        ly = _TOP + 10 + i * 20
        lx = _LEFT + plot_w + 14
        out.append(
            f'<line x1="{lx}" y1="{ly}" x2="{lx + 20}" y2="{ly}" '
            f'stroke="{colour}" stroke-width="2"/>'
        )
        out.append(f'<text x="{lx + 26}" y="{ly + 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
