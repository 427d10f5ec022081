"""report.html: report.md as one self-contained page, the plots inlined."""

from __future__ import annotations

import base64
import re
from pathlib import Path


def render_html(markdown: str, title: str, folder: Path) -> str:
    """The markdown as one HTML file with every plot inlined, so it can be mailed or attached as is."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown)

    def inline(match: re.Match) -> str:
        data = base64.b64encode((folder / match.group(1)).read_bytes()).decode()
        return f'src="data:image/png;base64,{data}"'

    body = re.sub(r'src="(plots/[\w-]+\.png)"', inline, body)
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;line-height:1.4}"
        "table{border-collapse:collapse;font-size:0.85em;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px}"
        "th{background:#f3f3f3}img{max-width:100%}blockquote{border-left:4px solid #c00;margin:0;padding:0 "
        "1em;color:#900}"
        "code{background:#f5f5f5;padding:0 3px}"
    )
    head = f"<meta charset='utf-8'><title>{title}</title><style>{style}</style>"
    return f"<!doctype html>\n<html><head>{head}</head>\n<body>\n{body}</body></html>\n"
