"""Small SVG charts for benchmark figures: no plotting library to install, a file any browser opens.

``grouped_bars`` draws, for each group (a scenario), one bar per series (a scheduler), on a
linear or logarithmic axis, with an optional marker per group (a lower bound).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")


def grouped_bars(
    title: str,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    y_label: str,
    log: bool = False,
    markers: Sequence[float | None] | None = None,
    marker_label: str = "",
    width: int = 900,
    height: int = 420,
) -> str:
    """An SVG document: ``series[name][g]`` is the bar of series ``name`` in group ``g`` (None: no bar)."""
    left, right, top, bottom = 70, 180, 40, 60
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for vs in series.values() for v in vs if v is not None and v > 0]
    values += [m for m in (markers or []) if m is not None and m > 0]
    if not values:
        values = [1.0]
    hi = max(values)
    lo = min(values)
    if log:
        lo_e, hi_e = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        hi_e = max(hi_e, lo_e + 1)

        def y(v: float) -> float:
            return top + plot_h * (1 - (math.log10(max(v, 10.0**lo_e)) - lo_e) / (hi_e - lo_e))

        ticks = [10.0**e for e in range(lo_e, hi_e + 1)]
    else:
        hi_e = 0
        step = _nice_step(hi / 5)

        def y(v: float) -> float:
            return top + plot_h * (1 - v / (step * math.ceil(hi / step)))

        ticks = [step * k for k in range(int(math.ceil(hi / step)) + 1)]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>',
        f'<text transform="translate(16,{top + plot_h / 2}) rotate(-90)" text-anchor="middle">{escape(y_label)}</text>',
    ]
    for t in ticks:
        ty = y(t) if (not log or t > 0) else top + plot_h
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{ty + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    n_series = max(1, len(series))
    group_w = plot_w / max(1, len(groups))
    bar_w = group_w * 0.8 / n_series
    base = top + plot_h
    for g, name in enumerate(groups):
        x0 = left + g * group_w + group_w * 0.1
        for k, (label, vs) in enumerate(series.items()):
            v = vs[g]
            if v is None or v <= 0:
                continue
            by = y(v)
            out.append(
                f'<rect x="{x0 + k * bar_w:.1f}" y="{by:.1f}" width="{bar_w * 0.92:.1f}" height="{base - by:.1f}" '
                f'fill="{PALETTE[k % len(PALETTE)]}"><title>{escape(label)}: {_fmt(v)}</title></rect>'
            )
        if markers is not None and markers[g] is not None and markers[g] > 0:  # type: ignore[operator]
            my = y(float(markers[g]))  # type: ignore[arg-type]
            out.append(
                f'<line x1="{x0:.1f}" x2="{x0 + group_w * 0.8:.1f}" y1="{my:.1f}" y2="{my:.1f}" stroke="black" '
                'stroke-dasharray="5,3" stroke-width="1.5"/>'
            )
        out.append(f'<text x="{x0 + group_w * 0.4:.1f}" y="{base + 18}" text-anchor="middle">{escape(name)}</text>')
    out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{base}" y2="{base}" stroke="black"/>')
    legend_x = left + plot_w + 16
    for k, label in enumerate(series):
        ly = top + 10 + k * 18
        out.append(f'<rect x="{legend_x}" y="{ly - 9}" width="12" height="12" fill="{PALETTE[k % len(PALETTE)]}"/>')
        out.append(f'<text x="{legend_x + 18}" y="{ly + 1}">{escape(label)}</text>')
    if markers is not None and marker_label:
        ly = top + 10 + len(series) * 18
        out.append(
            f'<line x1="{legend_x}" x2="{legend_x + 12}" y1="{ly - 3}" y2="{ly - 3}" stroke="black" '
            'stroke-dasharray="5,3"/>'
        )
        out.append(f'<text x="{legend_x + 18}" y="{ly + 1}">{escape(marker_label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * exp:
            return m * exp
    return 10 * exp


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.0e}"
    return f"{v:g}"
