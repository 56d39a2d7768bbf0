"""HTML pieces for the run report: tables, inline SVG charts, embedded thumbnails.

Everything is inline (CSS, SVG, images as data: URLs) so that a report opens
anywhere, offline, as a single file.
"""

import base64
import html
from typing import Dict, Iterable, List, Optional, Sequence

from images import image_check
from images.bounds import MAX_PIXELS

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2433;background:#f6f7f9}
header{background:#1d2433;color:#fff;padding:18px 28px}header h1{margin:0 0 4px;font-size:20px}
header .meta{opacity:.8;font-size:12px}main{padding:8px 28px 40px;max-width:1200px}
section{background:#fff;border:1px solid #e2e5ea;border-radius:8px;padding:14px 20px;margin:16px 0}
h2{font-size:17px;margin:4px 0 10px}h3{font-size:14px;margin:14px 0 6px;color:#3b4456}
table{border-collapse:collapse;margin:6px 0;font-size:13px}td,th{border:1px solid #e2e5ea;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f2f5}td.n{text-align:right;font-variant-numeric:tabular-nums}
.verdict{display:flex;gap:12px;flex-wrap:wrap}.card{flex:1;min-width:240px;border-radius:8px;padding:10px 14px;border:1px solid}
.ok{background:#eefaf1;border-color:#9fd8ad}.bad{background:#fdf0ef;border-color:#eba9a3}.warn{background:#fff8e6;border-color:#ecd08a}
.card b{font-size:15px}.grid{display:flex;flex-wrap:wrap;gap:8px}.tile{width:96px;font-size:11px;text-align:center}
.tile img{width:80px;height:80px;object-fit:contain;background:#eee;border:1px solid #ddd;image-rendering:pixelated}
.muted{color:#6b7385}code{background:#f0f2f5;padding:1px 4px;border-radius:3px}
.err{white-space:pre-wrap;background:#fdf0ef;border:1px solid #eba9a3;padding:8px;border-radius:6px;font-family:monospace;font-size:12px}
svg text{font:11px system-ui,sans-serif;fill:#3b4456}
"""

PALETTE = ("#2f6fdf", "#e0752d", "#2e9e5b", "#b0399a", "#7a6a2e", "#d4413f", "#1aa3a3", "#8c8c8c", "#6b4fbb", "#c2a000")


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def table(
    headers: Sequence[str], rows: Iterable[Sequence], numeric: Sequence[int] = (), raw: Sequence[int] = ()
) -> str:
    """An HTML table; cells are escaped unless their column is in `raw` (already HTML)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            text = cell if i in raw else esc(_fmt(cell))
            cells.append(f'<td class="n">{text}</td>' if i in numeric else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _fmt(value) -> str:
    if isinstance(value, float):
        if value == 0 or 0.001 <= abs(value) < 100:
            return f"{value:.4f}"
        return f"{value:.3g}" if abs(value) < 0.001 else f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "" if value is None else str(value)


def thumbnail(data: bytes, size: int = 80, max_pixels: int = MAX_PIXELS) -> Optional[str]:
    """A data: URL of a small PNG of the image, or None when it does not decode or is over the pixel bound that
    ingestion applies (image_check.thumbnail)."""
    return png_url(image_check.thumbnail(data, size, max_pixels))


def png_url(png: Optional[bytes]) -> Optional[str]:
    """A data: URL of PNG bytes (None: None)."""
    return png and "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def tiles(items: Iterable[Dict[str, str]]) -> str:
    """A grid of thumbnails with captions: items have 'src' (data URL or None) and 'caption'."""
    parts = []
    for item in items:
        image = (
            f'<img src="{item["src"]}" alt="{esc(item["caption"])}">'
            if item.get("src")
            else '<div class="muted" style="height:80px">no preview</div>'
        )
        parts.append(f'<div class="tile">{image}<div>{esc(item["caption"])}</div></div>')
    return f'<div class="grid">{"".join(parts)}</div>'


def line_chart(series: Dict[str, List[float]], title: str, width: int = 420, height: int = 220) -> str:
    """Per-epoch curves (x = epoch 1..n) as inline SVG."""
    values = [v for points in series.values() for v in points if v is not None]
    if not values:
        return ""
    left, right, top, bottom = 44, 110, 22, 28
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        lo, hi = lo - 0.5, hi + 0.5
    n = max(len(points) for points in series.values())
    x = lambda i: left + (width - left - right) * (i / max(1, n - 1))  # noqa: E731
    y = lambda v: top + (height - top - bottom) * (1 - (v - lo) / (hi - lo))  # noqa: E731
    parts = [
        f'<text x="{left}" y="14">{esc(title)}</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#999"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#999"/>',
    ]
    for value in (lo, (lo + hi) / 2, hi):
        parts.append(f'<text x="4" y="{y(value) + 4:.1f}">{value:.3g}</text>')
    for i in range(n):
        if n <= 15 or i % max(1, n // 10) == 0:
            parts.append(f'<text x="{x(i) - 3:.1f}" y="{height - 10}">{i + 1}</text>')
    for k, (name, points) in enumerate(series.items()):
        color = PALETTE[k % len(PALETTE)]
        coords = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(points) if v is not None)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        parts.append(f'<rect x="{width - right + 10}" y="{top + 16 * k}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{width - right + 24}" y="{top + 9 + 16 * k}">{esc(name)}</text>')
    return f'<svg role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}">{"".join(parts)}</svg>'


def xy_chart(
    series: Dict[str, List[tuple]],
    title: str,
    x_label: str,
    y_label: str,
    marker_x: float = None,
    width: int = 420,
    height: int = 240,
    dots: Dict[str, tuple] = None,
) -> str:
    """Curves of (x, y) points in the unit square (precision against recall, rates against a threshold) as
    inline SVG; a vertical dashed line at marker_x (the chosen threshold); `dots`: named single points (a chosen
    operating point), drawn as circles after the curves' colours."""
    if not any(series.values()):
        return ""
    left, right, top, bottom = 44, 130, 38, 34  # the title on the first line, the y label under it
    x = lambda v: left + (width - left - right) * v  # noqa: E731
    y = lambda v: top + (height - top - bottom) * (1 - v)  # noqa: E731
    parts = [
        f'<text x="{left}" y="14">{esc(title)}</text>',
        f'<line x1="{left}" y1="{y(0)}" x2="{x(1)}" y2="{y(0)}" stroke="#999"/>',
        f'<line x1="{left}" y1="{y(1)}" x2="{left}" y2="{y(0)}" stroke="#999"/>',
        f'<text x="{x(0.5) - 20:.1f}" y="{height - 4}">{esc(x_label)}</text>',
        f'<text x="4" y="{top - 6}">{esc(y_label)}</text>',
    ]
    for v in (0.0, 0.5, 1.0):
        parts.append(f'<text x="18" y="{y(v) + 4:.1f}">{v:g}</text>')
        parts.append(f'<text x="{x(v) - 6:.1f}" y="{height - 18}">{v:g}</text>')
    if marker_x is not None:
        parts.append(
            f'<line x1="{x(marker_x):.1f}" y1="{y(1)}" x2="{x(marker_x):.1f}" y2="{y(0)}" '
            'stroke="#d33" stroke-dasharray="4 3"/>'
        )
    for k, (name, points) in enumerate(series.items()):
        color = PALETTE[k % len(PALETTE)]
        coords = " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in points if px is not None and py is not None)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        parts.append(f'<rect x="{width - right + 10}" y="{top + 15 * k}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{width - right + 24}" y="{top + 9 + 15 * k}">{esc(name[:18])}</text>')
    for k, (name, (px, py)) in enumerate((dots or {}).items(), start=len(series)):
        color = PALETTE[k % len(PALETTE)]
        parts.append(f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="5" fill="{color}"/>')
        parts.append(f'<circle cx="{width - right + 15}" cy="{top + 5 + 15 * k}" r="5" fill="{color}"/>')
        parts.append(f'<text x="{width - right + 24}" y="{top + 9 + 15 * k}">{esc(name[:18])}</text>')
    return f'<svg role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}">{"".join(parts)}</svg>'


def confusion_svg(
    matrix: List[List[int]], names: List[str], cell: int = 28, shares: bool = False, row_totals: List[int] = None
) -> str:
    """A heatmap of [actual][predicted] counts, rows normalised for the colour; with `shares`, each cell shows
    its share of the row (the diagonal is each class's recall) and the count is in its tooltip. `row_totals`: each
    row's images when the matrix shows some of the classes only (default: the row's sum)."""
    k = len(names)
    left, top = 90, 80
    size_w, size_h = left + cell * k + 10, top + cell * k + 10
    parts = [f'<text x="{left}" y="14">predicted →</text>', f'<text x="4" y="{top - 8}">actual ↓</text>']
    for j, name in enumerate(names):
        parts.append(
            f'<text transform="translate({left + cell * j + cell / 2 + 4},{top - 6}) rotate(-60)">'
            f"{esc(name[:12])}</text>"
        )
    for i, name in enumerate(names):
        parts.append(f'<text x="4" y="{top + cell * i + cell / 2 + 4}">{esc(name[:12])}</text>')
        images = row_totals[i] if row_totals else sum(matrix[i])
        row_total = max(1, images)
        for j in range(k):
            count = matrix[i][j]
            share = count / row_total
            color = (
                f"rgb({int(255 - 210 * share)},{int(255 - 150 * share)},{255})"
                if i == j
                else f"rgb(255,{int(255 - 170 * share)},{int(255 - 170 * share)})"
            )
            parts.append(
                f'<rect x="{left + cell * j}" y="{top + cell * i}" width="{cell - 1}" '
                f'height="{cell - 1}" fill="{color}"><title>actual {esc(name)}, predicted '
                f"{esc(names[j])}: {count}</title></rect>"
            )
            if count or (shares and i == j and images):
                ink = ' style="fill:#fff"' if i == j and share > 0.5 else ""  # readable on dark cells
                shown = f"{share:.2f}".lstrip("0") if shares and share < 1 else "1" if shares else f"{count}"
                parts.append(f'<text x="{left + cell * j + 4}" y="{top + cell * i + cell / 2 + 4}"{ink}>{shown}</text>')
    return f'<svg role="img" width="{size_w}" height="{size_h}" viewBox="0 0 {size_w} {size_h}">{"".join(parts)}</svg>'


def histogram_svg(buckets: List[tuple], width: int = 160, height: int = 36) -> str:
    """A small bar chart of (low, high, count) buckets."""
    if not buckets:
        return ""
    top = max(count for _, _, count in buckets) or 1
    bar = width / len(buckets)
    rects = "".join(
        f'<rect x="{i * bar:.1f}" y="{height - height * c / top:.1f}" width="{max(1, bar - 1):.1f}" '
        f'height="{height * c / top:.1f}" fill="#2f6fdf"><title>{lo:.4g}-{hi:.4g}: {c:,.0f}</title></rect>'
        for i, (lo, hi, c) in enumerate(buckets)
    )
    return f'<svg role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}">{rects}</svg>'


def share_bar(fraction: float, width: int = 120, height: int = 12, color: str = "#2f6fdf") -> str:
    """A horizontal bar for a share from 0 to 1, with the percentage beside it."""
    filled = max(0.0, min(1.0, fraction)) * width
    return (
        f'<svg role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<rect width="{width}" height="{height}" fill="#eee"/><rect width="{filled:.1f}" '
        f'height="{height}" fill="{color}"/></svg> {fraction:.1%}'
    )


GENERATOR = '<meta name="generator" content="imagepipe report">'  # how `report --out` knows a report it wrote


def document(title: str, header: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8">{GENERATOR}'
        f'<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>"
        f"<body><header>{header}</header><main>{body}</main></body></html>"
    )


# --- the report's sections ---------------------------------------------------------------------


def section(key: str, title: str, body: str) -> str:
    return f'<section id="{key}"><h2>{esc(title)}</h2>{body}</section>'


def not_reached(name: str) -> str:
    return f'<p class="muted">{esc(name)} did not run in this run.</p>'


def unfinished(components: Dict[str, Dict], name: str, key: str, title: str, what: str) -> Optional[str]:
    """The section for a component that did not run or did not finish; None when it has details."""
    c = components.get(name)
    if c and c["details"]:
        return None
    if c and c.get("missing"):
        return section(
            key,
            title,
            f"<p>{esc(what)} ran, but its outputs are no longer on disk: <code>{esc(c['missing'][0])}</code>.</p>",
        )
    return section(key, title, not_reached(name) if not c else f"<p>{what} did not complete (see Summary).</p>")
