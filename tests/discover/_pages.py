"""Helpers shared by the processing-module tests: the fixture pages and a one-call HTML parse."""

from __future__ import annotations

from pathlib import Path

from refresher.discover._parse import Document, Extracted, HtmlLinks

DATA = Path(__file__).parents[1] / "data" / "html"
STORY = "https://www.example.org/news/2024/story.html"


def fixture(name: str) -> bytes:
    return (DATA / name).read_bytes()


def html(
    body: bytes | str,
    *,
    url: str = "http://example.com/dir/page.html",
    content_type: str | None = "text/html",
    robots_tag: str | None = None,
    processor: HtmlLinks | None = None,
) -> Extracted:
    data = body.encode() if isinstance(body, str) else body
    doc = Document(url=url, content_type=content_type, body=data, robots_tag=robots_tag)
    return (processor or HtmlLinks()).process(doc)


def triples(result: Extracted) -> list[tuple[str, str, bool]]:
    return [(link.url, link.kind, link.nofollow) for link in result.links]


def urls(result: Extracted) -> list[str]:
    return [link.url for link in result.links]
