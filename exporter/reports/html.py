"""One self-contained HTML document per report: inline CSS, plotly.js inlined once, no network.

`page(title, sections)` wraps already-rendered sections (from `plot`, `table`, `section`, or raw
HTML) into a whole document. `plot(fig)` renders a plotly figure as a div that carries a marker;
`page` inlines plotly.js exactly once when any such div is present, so a report opened offline
draws every plot. Plotly is imported lazily: without the `[report]` extra only `plot` (and
building figures) fails, with one line naming the extra.
"""
from __future__ import annotations

import html as _html
import re
from typing import Any, Iterable, Sequence

from exporter import __version__
from exporter.errors import InputError

EXTRA_HINT = "pip install 'vllm-drift[report]'"
_PLOT_MARKER = "data-vllm-drift-plot"

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;
color:#1d2330;padding:0 1rem;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #dde;
padding-bottom:.2rem}.subtitle{color:#5a6275;margin-top:0}
table{border-collapse:collapse;margin:.6rem 0;font-size:.9rem}
th,td{border:1px solid #dde;padding:.25rem .6rem;text-align:left;vertical-align:top}
th{background:#f3f5f9}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.mark td{background:#eaf6ea;font-weight:600}
.note{color:#5a6275;font-size:.9rem}footer{margin-top:3rem;color:#8a90a0;font-size:.8rem}
"""


# plotly.js carries inert link strings (its logo link, map-tile attributions) such as
# href="https://plotly.com/". Nothing fetches them (the logo is turned off, no map traces), but a
# static scan of the page cannot tell; writing the slashes as the JS escape "\/" keeps every
# string's value and leaves no `src=`/`href=` with a network URL in the file.
_URL_ATTR = re.compile(r"""((?:src|href)\s*=\s*\\?["'](?:https?:)?)//""", re.I)


def inline_js(js: str) -> str:
    """Script text safe to inline: no `</script>` and no src/href URL literal (see _URL_ATTR)."""
    return _URL_ATTR.sub(lambda m: m.group(1) + "\\/\\/", js).replace("</script", "<\\/script")


class ReportDependencyError(InputError):
    """The optional plotting dependency is missing."""


def require_plotly() -> Any:
    """Import plotly (the `[report]` extra) or raise one line naming the extra."""
    try:
        import plotly  # noqa: F401
        import plotly.graph_objects as go
        import plotly.offline  # noqa: F401
    except ImportError:
        raise ReportDependencyError(f"HTML reports need plotly: {EXTRA_HINT}") from None
    return go


def esc(value: Any) -> str:
    return _html.escape("" if value is None else str(value), quote=True)


def plot(fig: Any) -> str:
    """A plotly figure as a <div> (no script tag for plotly.js itself: `page` inlines it once)."""
    require_plotly()
    body = fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True})
    return f'<div class="plot" {_PLOT_MARKER}="1">{body}</div>'


def _cell(c: Any) -> str:
    if isinstance(c, bool) or c is None:
        return f"<td>{'—' if c is None else ('yes' if c else 'no')}</td>"
    if isinstance(c, (int, float)):
        return f'<td class="num">{c:,}</td>' if isinstance(c, int) else f'<td class="num">{c:,.4g}</td>'
    return f"<td>{esc(c)}</td>"


def table(headers: Sequence[Any] | None, rows: Iterable[Sequence[Any]], *,
          mark: Sequence[bool] | None = None) -> str:
    """An HTML table (numbers right-aligned, None as "—"); `mark[i]` true highlights row i (e.g.
    the recommended setting). `headers` None: a key/value table without a header row."""
    head = "" if headers is None else "<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr></thead>"
    body = []
    for i, row in enumerate(rows):
        cls = ' class="mark"' if mark is not None and i < len(mark) and mark[i] else ""
        body.append(f"<tr{cls}>" + "".join(_cell(c) for c in row) + "</tr>")
    return f"<table>{head}<tbody>{''.join(body)}</tbody></table>"


def section(heading: str, *parts: str, note: str = "") -> str:
    """A titled section holding already-rendered parts (tables, plots, raw HTML)."""
    extra = f'<p class="note">{esc(note)}</p>' if note else ""
    return f"<section><h2>{esc(heading)}</h2>{extra}{''.join(parts)}</section>"


def page(title: str, sections: list[str], *, subtitle: str = "") -> str:
    """A whole self-contained HTML document (no external script, stylesheet, font or image)."""
    body = "\n".join(sections)
    script = ""
    if _PLOT_MARKER in body:
        require_plotly()
        import plotly.offline

        script = f'<script type="text/javascript">{inline_js(plotly.offline.get_plotlyjs())}</script>'
    sub = f'<p class="subtitle">{esc(subtitle)}</p>' if subtitle else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><title>{esc(title)}</title>"
        f"<style>{_CSS}</style>{script}</head><body><h1>{esc(title)}</h1>{sub}\n{body}\n"
        f"<footer>vllm-drift {esc(__version__)} — self-contained report, no network needed to view it.</footer>"
        "</body></html>\n"
    )
