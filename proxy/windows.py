"""Context windows per model: configured first, narrowed by what overflow errors reveal."""

from __future__ import annotations

import logging

from proxy.config import Settings

log = logging.getLogger(__name__)

# A named limit outside this range is a parsing accident or a server misreport, not a window to trust.
PLAUSIBLE_WINDOW = range(256, 100_000_001)


class ContextWindows:
    """The window the proxy plans with: the smaller of the configured and the learned one."""

    def __init__(self, settings: Settings, max_models: int = 4096) -> None:
        self._settings = settings
        self._learned: dict[str, int] = {}
        self._max_models = max_models

    def window(self, model: str | None) -> int:
        configured = self._settings.model_for(model).context_window
        learned = self._learned.get(model or "")
        return min(configured, learned) if learned else configured

    def learn(self, model: str | None, limit: int | None) -> bool:
        """Remember a limit an upstream error named; returns whether it was taken."""
        if not model or limit is None or limit not in PLAUSIBLE_WINDOW:
            return False
        if self._learned.get(model) == limit:
            return True
        if model not in self._learned and len(self._learned) >= self._max_models:
            self._learned.pop(next(iter(self._learned)))
        self._learned[model] = limit
        log.info("learned context window of %s: %d tokens", model, limit)
        return True
