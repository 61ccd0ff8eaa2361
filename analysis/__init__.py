"""Scripts over a run's history: plots (``python -m analysis.plots``), the side-by-side
policy comparison on a simulated web (``python -m analysis.compare``) and its offline model
(``python -m analysis.model``)."""

from __future__ import annotations

__all__: list[str] = []
