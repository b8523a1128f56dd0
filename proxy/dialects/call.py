"""What the journey reads of any client request, whichever API it came in: the `Call` each dialect parses into."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Call(Protocol):
    """A parsed client request. Its body is kept as sent: forwarded byte for byte when nothing is compacted."""

    @property
    def body(self) -> bytes: ...

    @property
    def headers(self) -> Mapping[str, str]:
        """The headers to forward (the proxy's own request headers, x-compaction-mode, taken out)."""
        ...

    @property
    def query(self) -> str:
        """The raw query string, forwarded as it came."""
        ...

    @property
    def mode(self) -> str:
        """The client's x-compaction-mode for this request, "" when it gave none (the configured mode applies)."""
        ...

    @property
    def model(self) -> str: ...

    @property
    def stream(self) -> bool: ...

    def reserved_output(self, default: int) -> int:
        """The output tokens the request asks room for, `default` when it names none."""
        ...
