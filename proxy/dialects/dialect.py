"""What a client API must tell the journey: the seam each dialect (chat, responses, messages) plugs into."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from proxy.core.messages import Message
from proxy.core.tokens import TokenCounter
from proxy.upstream.answer import StreamTap
from proxy.upstream.attempt import AnswerReader

# The request type a dialect parses its bodies into (ChatCall for chat completions).
CallT = TypeVar("CallT", contravariant=True)


class Dialect(AnswerReader, Protocol[CallT]):
    """One client API over the neutral conversation (today the chat message list, see core.messages).

    The journey asks a dialect for everything API-shaped: the history it may compact, the body it forwards, the
    upstream path, what the request costs besides its history, usage and overflow in an answer and in a stream."""

    name: str  # the route's and metrics' name for the API
    path: str  # below the upstream's base URL

    def history(self, call: CallT) -> list[Message] | None:
        """The conversation the journey may compact; None when the request is not compactable here."""
        ...

    def forwarded(self, call: CallT, history: list[Message], *, ask_usage: bool) -> bytes:
        """The request body with `history` in place of the client's, usage asked for in a stream if `ask_usage`."""
        ...

    def overhead(self, call: CallT, counter: TokenCounter) -> int:
        """Raw tokens of the request besides its history: tool definitions, instructions kept aside, framing."""
        ...

    def tools(self, call: CallT) -> Any:
        """The tool definitions the summariser sees, so a summary can name the tools a session used."""
        ...

    def asks_usage(self, call: CallT) -> bool:
        """Whether the client asked for usage in its stream (then nothing the proxy adds is hidden from it)."""
        ...

    def tap(self, *, hide_usage: bool) -> StreamTap: ...
