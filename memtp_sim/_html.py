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

    Source:
        Plain text is escaped with the standard library's :func:`html.escape` (quotes included);
        figures are embedded with Plotly's ``Figure.to_html(full_html=False, include_plotlyjs=...)``
        (Plotly documentation, "Interactive HTML Export").
    """

    def __init__(self, title: str) -> None:
        self.title = title
        self._parts: list[str] = [f"<h1>{escape(title)}</h1>"]
        self._plotly_included = False
        self._num_figures = 0

    def add_heading(self, text: str, level: int = 2) -> None:
        """Append a heading.

        Args:
            text: plain text (escaped here).
            level: HTML heading level, 1..6 (``<h{level}>``); not checked.
        """
        self._parts.append(f"<h{level}>{escape(text)}</h{level}>")

    def add_paragraph(self, text: str, *, css_class: str | None = None) -> None:
        """Append a paragraph.

        Args:
            text: plain text (escaped here).
            css_class: optional CSS class of the ``<p>`` (``"note"`` or ``"warn"`` are styled).
        """
        cls = f" class='{css_class}'" if css_class else ""
        self._parts.append(f"<p{cls}>{escape(text)}</p>")

    def add_html(self, fragment: str) -> None:
        """Append raw HTML as is.

        Args:
            fragment: HTML the caller has already escaped (nothing is escaped here).
        """
        self._parts.append(fragment)

    def add_list(self, items: list[str]) -> None:
        """Append a bulleted list.

        Args:
            items: one plain-text string per bullet (each escaped here).
        """
        self._parts.append("<ul>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>")

    def add_figure(self, fig: Any) -> None:
        """Append a Plotly figure; plotly.js is inlined with the first figure only.

        Args:
            fig: a ``plotly.graph_objects.Figure`` (anything with Plotly's ``to_html``).

        Source:
            Plotly ``Figure.to_html`` (``include_plotlyjs=True`` inlines the library once, so the
            page opens offline).
        """
        # numbered divs, not Plotly's random ids: the same results give the same page
        self._num_figures += 1
        self._parts.append(fig.to_html(full_html=False, include_plotlyjs=not self._plotly_included,
                                       config={"displaylogo": False}, div_id=f"figure-{self._num_figures}"))
        self._plotly_included = True

    def add_table(self, df: Any, *, float_format: str = "{:,.2f}") -> None:
        """Append a pandas DataFrame as a table (index dropped, NaN and pandas' NA shown as ``-``).

        Args:
            df: a ``pandas.DataFrame``; its column names become the header.
            float_format: :meth:`str.format` pattern for float cells (default: thousands
                separator, two decimals).

        Source:
            ``pandas.DataFrame.to_html`` (pandas documentation).
        """
        nullable = [c for c in df.columns if str(df[c].dtype) == "Int64"]  # to_html prints <NA> there
        if nullable:
            df = df.assign(**{c: df[c].astype(object).where(df[c].notna(), "-") for c in nullable})
        self._parts.append(df.to_html(index=False, float_format=lambda v: float_format.format(v), border=0,
                                      classes="tbl", na_rep="-"))

    def render(self) -> str:
        """Render the page.

        Returns:
            The whole HTML5 document (``<!DOCTYPE html>``, UTF-8, inline CSS) as one string.
        """
        return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(self.title)}</title>"
                f"<style>{_STYLE}</style></head><body>{''.join(self._parts)}</body></html>")
