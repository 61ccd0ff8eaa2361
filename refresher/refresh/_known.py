"""Known change rates (``estimate.known_rates``): pages whose rate the operator already knows.

An operator sometimes knows how often pages change: from a previous crawl, a partner's feed or
their own CMS. A file of (url, rate in changes per second) names them: a CSV file with a
``url,rate`` header, a Parquet file of those columns, or the truth a simulated web writes
(``refresher simweb --truth PATH``: a DuckDB file or a Parquet directory with
``truth_pages(url, host, rate, created_at)``), read by the store
(:func:`refresher.store._truth.read_rates`). Each plan takes a listed page's rate as exact
(:func:`with_known_rates`): λ̂ is the known rate, the posterior sd of ln λ is 0, and a rate of 0
is a page that never changes (P₀ = 1). So under ``policy.decide = "expected"`` such a page gets
no exploration share (it is worth fetching with probability 0 or 1, :func:`worth_fetching`). The
pages not listed are estimated as ever. With every page listed the daemon plans as a
clairvoyant would (``analysis.family --real-policies clairvoyant``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from refresher._errors import ConfigError, InvalidURL, StoreError
from refresher.discover._url import TRACKING_PARAMS, canonicalize
from refresher.store._truth import read_rates

if TYPE_CHECKING:
    from refresher.refresh._allocate import PolicyInputs

__all__ = ["KEY", "KnownRates", "load_known_rates", "with_known_rates"]

KEY = "estimate.known_rates"
#: the λ a plan reads for a page known never to change (P₀ = 1 makes its value flat in f;
#: the expected-value planner takes ln λ, so λ stays > 0)
STATIC_RATE = 1e-12


@dataclass(frozen=True, slots=True, eq=False)
class KnownRates:
    """The pages of a known-rates file: canonical URLs and their rates (changes per second),
    one each. Equal only to itself: a reload reads the file again and plans anew."""

    path: Path
    urls: NDArray[np.str_]
    rates: NDArray[np.float64]


def load_known_rates(path: Path, *, strip_params: bool = True) -> KnownRates:
    """The file at ``path``, read once per version of it (its size and modification time);
    URLs canonicalised as the crawler stores them (``strip_params``: as
    ``discovery.strip_tracking_params``). ConfigError naming what is wrong and the fix."""
    try:
        stat = path.stat()
    except OSError as e:
        raise ConfigError(
            f"cannot read {str(path)!r} ({e.strerror}); fix the path or remove the key", key=KEY
        ) from e
    return _load(path, stat.st_mtime_ns, stat.st_size, strip_params)


@functools.lru_cache(maxsize=4)
def _load(path: Path, mtime_ns: int, size: int, strip_params: bool) -> KnownRates:
    try:
        urls, rates = read_rates(path)
    except StoreError as e:
        raise ConfigError(str(e), key=KEY) from e
    bad = ~np.isfinite(rates) | (rates < 0)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        rate = float(rates[row])
        raise ConfigError(
            f"{str(path)!r} row {row + 1}: the rate of {str(urls[row])!r} is {rate!r}; "
            "give each page a finite rate ≥ 0 in changes per second",
            key=KEY,
        )
    strip = TRACKING_PARAMS if strip_params else None
    canonical = []
    for row, url in enumerate(urls):
        try:
            canonical.append(canonicalize(str(url), strip_params=strip).url)
        except InvalidURL as e:
            raise ConfigError(
                f"{str(path)!r} row {row + 1}: {e}; give absolute http(s) URLs", key=KEY
            ) from e
    out = np.array(canonical, dtype=np.str_)
    names, counts = np.unique(out, return_counts=True)
    if (counts > 1).any():
        raise ConfigError(
            f"{str(path)!r} lists {str(names[counts > 1][0])!r} {int(counts.max())} times; "
            "give each page one rate",
            key=KEY,
        )
    return KnownRates(path=path, urls=out, rates=rates)


def with_known_rates(
    inputs: PolicyInputs, page_ids: NDArray[np.int64], rates: NDArray[np.float64]
) -> PolicyInputs:
    """``inputs`` with each page of ``page_ids`` (−1 or an id not planned: left alone) planned
    at its known rate in ``rates`` (changes per second) as exact: λ̂ the rate, the posterior
    sd of ln λ 0 (where the estimate has an sd at all), P₀ 1 for a rate of 0 and else 0."""
    n = inputs.page_ids.size
    pos = np.searchsorted(inputs.page_ids, page_ids)
    at = np.minimum(pos, max(n - 1, 0))
    ok = (page_ids >= 0) & (pos < n)
    if n:
        ok &= inputs.page_ids[at] == page_ids
    if not ok.any():
        return inputs
    pos, known = at[ok], np.asarray(rates, dtype=np.float64)[ok]
    new_rates = inputs.rates.copy()
    new_rates[pos] = np.maximum(known, STATIC_RATE)
    sd = None
    if inputs.rate_sd is not None:
        sd = inputs.rate_sd.copy()
        sd[pos] = 0.0
    static = np.zeros(n) if inputs.static_p is None else inputs.static_p.copy()
    static[pos] = np.where(known > 0, 0.0, 1.0)
    return replace(inputs, rates=new_rates, rate_sd=sd, static_p=static)
