"""The web-platform-tests URL cases (tests/data/urltestdata.json) against ada-url.

refresher parses URLs with ada-url, so ada-url must follow the WHATWG URL Standard case by
case: each expected component, each expected failure. Cases it gets wrong would be listed in
KNOWN_FAILURES with the reason and marked strict xfail, so a fixed parser shows up too; with
ada-url 4.0.0 every case passes and the list is empty.

The same inputs then go through canonicalize(), which must answer each with a canonical URL
or InvalidURL (never another exception) and give canonical forms that are fixed points.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ada_url
import pytest

from refresher._errors import InvalidURL
from refresher.discover._url import canonicalize

DATA = Path(__file__).parents[1] / "data" / "urltestdata.json"
COMPONENTS = (
    "href",
    "origin",
    "protocol",
    "username",
    "password",
    "host",
    "hostname",
    "port",
    "pathname",
    "search",
    "hash",
)

# (input, base) -> why ada-url disagrees with the standard. Empty for ada-url 4.0.0.
KNOWN_FAILURES: dict[tuple[str, str | None], str] = {}


def load_cases() -> list[dict[str, Any]]:
    cases = json.loads(DATA.read_text(encoding="utf-8"))
    return [case for case in cases if isinstance(case, dict)]


CASES = load_cases()


def case_id(index: int, case: dict[str, Any]) -> str:
    return f"{index}:{case['input'][:40]!r}"


def params(cases: list[dict[str, Any]]) -> list[Any]:
    out = []
    for index, case in enumerate(cases):
        why = KNOWN_FAILURES.get((case["input"], case["base"]))
        marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
        out.append(pytest.param(case, id=case_id(index, case), marks=marks))
    return out


def parse(case: dict[str, Any]) -> ada_url.URL:
    return ada_url.URL(case["input"], case["base"])


def test_the_vendored_file_holds_the_whole_suite() -> None:
    assert len(CASES) > 800
    assert sum(1 for case in CASES if case.get("failure")) > 200
    assert not set(KNOWN_FAILURES) - {(case["input"], case["base"]) for case in CASES}


@pytest.mark.parametrize("case", params([c for c in CASES if not c.get("failure")]))
def test_a_valid_input_parses_to_the_expected_components(case: dict[str, Any]) -> None:
    url = parse(case)
    got = {name: getattr(url, name) for name in COMPONENTS if name in case}
    assert got == {name: case[name] for name in COMPONENTS if name in case}


@pytest.mark.parametrize("case", params([c for c in CASES if c.get("failure")]))
def test_an_invalid_input_is_refused(case: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        parse(case)
    if case["base"] is None:
        # wpt's failure.html: what fails to parse alone cannot serve as a base either.
        with pytest.raises(ValueError):
            ada_url.URL("about:blank", case["input"])


def test_canonicalize_answers_every_input_with_a_url_or_a_reason() -> None:
    accepted = 0
    for case in CASES:
        try:
            c = canonicalize(case["input"], base=case["base"])
        except InvalidURL as e:
            assert e.reason
            continue
        accepted += 1
        assert c.url.startswith(("http://", "https://"))
        assert canonicalize(c.url) == c
    assert accepted > 150
