"""One page shell for every HTML report the package writes (study report, tuning report).

:class:`HtmlPage` collects sections, tables and Plotly figures and renders one self-contained
page: plotly.js is inlined once (with the first figure), so the file opens offline.
"""

from __future__ import annotations

import html
from typing import Any

__all__ = ["HtmlPage", "escape"]

escape = html.escape

_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1400px;margin:1em auto;padding:0 1em;color:#222}"
    ".tbl{border-collapse:collapse;font-size:13px}.tbl td,.tbl th{padding:2px 8px;border-bottom:1px solid #ddd;"
    "text-align:right}code{background:#f4f4f4;padding:0 3px}.note{color:#666;font-size:90%}"
    ".warn{background:#fff4e5;border-left:4px solid #f0a020;padding:4px 8px}"
)


class HtmlPage:
    """A report page: ``add_*`` appends in order, :meth:`render` returns the HTML document.

    Args:
        title: the ``<title>`` and the ``<h1>`` heading (plain text; escaped here).
    """

    def __init__(self, title: str) -> None:
        self.title = title
        self._parts: list[str] = [f"<h1>{escape(title)}</h1>"]
        self._plotly_included = False

    def add_heading(self, text: str, level: int = 2) -> None:
        """A heading (plain text)."""
        self._parts.append(f"<h{level}>{escape(text)}</h{level}>")

    def add_paragraph(self, text: str, *, css_class: str | None = None) -> None:
        """A paragraph of plain text (escaped)."""
        cls = f" class='{css_class}'" if css_class else ""
        self._parts.append(f"<p{cls}>{escape(text)}</p>")

    def add_html(self, fragment: str) -> None:
        """Raw HTML the caller has already escaped."""
        self._parts.append(fragment)

    def add_list(self, items: list[str]) -> None:
        """A bulleted list of plain-text items (escaped)."""
        self._parts.append("<ul>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>")

    def add_figure(self, fig: Any) -> None:
        """A Plotly figure; plotly.js is inlined with the first one only."""
        self._parts.append(fig.to_html(full_html=False, include_plotlyjs=not self._plotly_included,
                                       config={"displaylogo": False}))
        self._plotly_included = True

    def add_table(self, df: Any, *, float_format: str = "{:,.2f}") -> None:
        """A pandas DataFrame as a table (index dropped, NaN shown as '-')."""
        self._parts.append(df.to_html(index=False, float_format=lambda v: float_format.format(v), border=0,
                                      classes="tbl", na_rep="-"))

    def render(self) -> str:
        """The whole document."""
        return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(self.title)}</title>"
                f"<style>{_STYLE}</style></head><body>{''.join(self._parts)}</body></html>")
