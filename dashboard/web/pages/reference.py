"""The alert reference that every remedy points at (`docs/alerts.md#kind`), served by the dashboard
itself: docs/alerts.md rendered to HTML (markdown-it-py), whose table gives each kind its anchor
(`<a id="kind">`), so the "what to do" pointer of every incident lands on its kind's row. The
document is the project's own (in the tree, and in the wheel as `dashboard/docs/alerts.md`); it
holds no user data. Where it cannot be found, the page is built from the code instead: each
registered kind with what its rule looks for (the rule module's own docstring) and what to do first
(`remedies.INCIDENT_REMEDIES`), so the link works in every install."""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from markdown_it import MarkdownIt

import dashboard
from dashboard.detection.remedies import INCIDENT_REMEDIES
from dashboard.detection.rules import REGISTRY

DOC_NAME = "alerts.md"
_OTHER_DOC = re.compile(r"^(?!\w+:|/|#)[\w./-]*\.md(?:#.*)?$")  # cost.md, pages.md#run-verdict


def doc_path() -> Path | None:
    """docs/alerts.md: next to the `dashboard` package in the wheel, at the top of the tree otherwise."""
    for folder in (Path(dashboard.__file__).resolve().parent / "docs", Path(settings.BASE_DIR) / "docs"):
        if (folder / DOC_NAME).is_file():
            return folder / DOC_NAME
    return None


def doc_html() -> str:
    """docs/alerts.md as HTML ("" where it is not there), rendered again only when the file changes."""
    path = doc_path()
    if path is None:
        return ""
    return _render(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _render(path: str, mtime_ns: int) -> str:
    md = MarkdownIt("commonmark", {"html": True}).enable("table")  # the doc's own anchors are raw HTML
    tokens = md.parse(Path(path).read_text(encoding="utf-8"))
    for token in tokens:
        for child in token.children or ():
            if child.type == "link_open":
                _local(child)
    return str(md.renderer.render(tokens, md.options, {}))


def _local(link: Any) -> None:
    """A link to this document's own section stays on this page (`#kind`); one to another document of
    docs/ (served nowhere) becomes plain text that names it, never a broken link."""
    href = str(link.attrGet("href") or "")
    if not _OTHER_DOC.match(href):
        return
    name, _, anchor = href.partition("#")
    if name.rsplit("/", 1)[-1] == DOC_NAME:
        link.attrSet("href", f"#{anchor}")
        return
    link.tag, link.attrs = "span", {"class": "doc-ref", "title": f"docs/{name}{'#' + anchor if anchor else ''}"}


def entries() -> list[dict[str, str]]:
    """One entry per alert kind, in name order: its anchor, what it means, what to do."""
    about: dict[str, str] = {}
    for rule in REGISTRY:
        doc = sys.modules[rule.check.__module__].__doc__ or ""
        about.setdefault(rule.kind, doc.strip())
    return [{"kind": kind, "about": about[kind], "remedy": INCIDENT_REMEDIES.get(kind, "")} for kind in sorted(about)]


def kind_url(kind: str) -> str:
    """The path of `kind`'s section of the reference ("/alerts/reference/#grad_divergence")."""
    return f"{reverse('alert-reference')}#{kind}"


@login_required
def alert_reference(request: HttpRequest) -> HttpResponse:
    html = doc_html()
    return render(request, "dashboard/alert_reference.html", {"doc": html, "entries": [] if html else entries()})
