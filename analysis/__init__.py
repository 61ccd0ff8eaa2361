"""Scripts over a run's history: plots (``python -m analysis.plots``) and the side-by-side
policy comparison on a simulated web (``python -m analysis.compare``)."""

from __future__ import annotations

__all__: list[str] = []
