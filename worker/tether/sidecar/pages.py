"""The small HTML pages that answer a click on an approval link."""

from __future__ import annotations

from html import escape

from starlette.responses import HTMLResponse

#: A link carries its signature in the URL: keep it out of caches and Referer headers.
LINK_HEADERS = {"cache-control": "no-store", "referrer-policy": "no-referrer"}


def link_page(status: int, title: str, message: str) -> HTMLResponse:
    body = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title></head>"
        f"<body><h1>{escape(title)}</h1><p>{escape(message)}</p></body></html>"
    )
    return HTMLResponse(body, status_code=status, headers=LINK_HEADERS)
