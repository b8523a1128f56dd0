"""What a client API must tell the journey: the seam each dialect (chat, responses, messages) plugs into."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from proxy.core.messages import Message
from proxy.core.tokens import TokenCounter
from proxy.core.usage import Usage
from proxy.core.view import View
from proxy.dialects.call import Call
from proxy.dialects.kept_reads import Reads
from proxy.errors import ProxyError
from proxy.upstream.answer import StreamTap
from proxy.upstream.attempt import AnswerReader

# The request type a dialect parses its bodies into (ChatCall for chat completions).
CallT = TypeVar("CallT", bound=Call)


class Dialect(AnswerReader, Protocol[CallT]):
    """One client API over the neutral conversation (core.view: chat-shaped messages and the items they came from).

    The journey asks a dialect for everything API-shaped: the history it may compact, the body it forwards, the
    upstream path, what the request costs besides its history, usage and overflow in an answer and in a stream."""

    name: str  # the route's and metrics' name for the API
    path: str  # below the upstream's base URL
    # Bytes whose presence in a body means the request must be read (compaction.glance: a field the proxy acts on);
    # None: every request is read (a dialect that translates requests).
    quick_markers: tuple[bytes, ...] | None
    # Content whose tokens its bytes do not bound (an image, a file, audio): only the count needs such a request
    # read, so with compaction off a glance does not look for these.
    uncounted_markers: tuple[bytes, ...]
    # Fields that only make a request one the journey leaves alone (Dialect.left_alone): read with compaction on,
    # where the answer says why; with it off every request goes as it came, so a glance does not look for these.
    alone_markers: tuple[bytes, ...]
    # The body's field that holds the history ("messages", "input"): where a resent history is found in its bytes.
    history_key: str
    # Whether the history's values are the neutral messages themselves and `forwarded` is the body's object with
    # that list replaced, nothing else changed (chat): a forwarded body may then be spliced from the client's bytes.
    forwards_history_as_read: bool

    def parse(self, body: bytes, headers: Mapping[str, str], query: str,
              payload: dict[str, Any] | None = None, reads: Reads | None = None) -> CallT:
        """The client's request, read once; BadRequest when it cannot be (the proxy's error, in the API's shape).
        `payload` is the body's JSON object when it was read already (dialects.body_memo); `reads` what a view
        reader kept of its history (dialects.kept_reads), which spares the parse a look at what it read."""
        ...

    def history(self, call: CallT, reads: Reads | None = None) -> View | None:
        """The conversation the journey may compact, in the neutral view; None when it is not compactable here.
        `reads` (the body memo): a dialect whose view is read from the client's items may go on from its last
        read of the conversation (dialects.kept_reads)."""
        ...

    def left_alone(self, call: CallT) -> str | None:
        """Why a request the journey may not compact is left to the upstream (its history kept there, the upstream
        asked to manage it): reported as x-compaction: not-applicable; None for the ordinary "none"."""
        ...

    def edited(self, call: CallT, prompt_tokens: Callable[[], int], count: Callable[[Any], int]) -> CallT:
        """The request with the edits its client asked of the context applied to what is forwarded (Anthropic's
        clearing edits, where the proxy runs them); `prompt_tokens` is the request's size, `count` a value's, both
        in the upstream's tokens as far as calibration knows them. The call itself when there is nothing to do."""
        ...

    def forwarded(self, call: CallT, view: View, history: list[Message], *, ask_usage: bool) -> bytes:
        """The request body with `history` (the view's messages, compacted) in place of the client's, mapped back
        through `view`; usage asked for in a stream if `ask_usage`."""
        ...

    def rendered(self, made: list[Message]) -> list[Any]:
        """Messages compaction made (a stored summary's, and what follows it of a group its cut split) as the
        client's items, as `forwarded` renders a run of them."""
        ...

    def splices(self, call: CallT, view: View, front: list[Any], kept_from: int,
                reads: Reads | None = None) -> bool:
        """Whether `forwarded` sends the client's body with only its history's first `kept_from` items replaced by
        `front` (rendered): the body may then be spliced from the client's bytes. Chat's never is this way: it
        splices its messages as read (`forwards_history_as_read`). `reads`: where the history's read is kept."""
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

    def announced(self, call: CallT, view: View, history: list[Message] | None, synthetic: frozenset[int],
                  *, failed: bool = False) -> Any:
        """What a good answer tells the client of its context management, when the client asked to be told: the
        compaction in `history` (the conversation forwarded, its summary at `synthetic`; None when nothing was
        compacted, and `failed` when a compaction was wanted and failed) as a Responses `compaction` item or a
        Messages `compaction` block, and the Messages edits applied. None: nothing to tell, or no way to tell it."""
        ...

    def compaction_answer(self, call: CallT, view: View, history: list[Message], synthetic: frozenset[int],
                          usage: Usage) -> tuple[bytes, str]:
        """The answer, body and content type, to a request that asks for a compaction and nothing else (a
        `compaction_trigger`, an on-demand Messages `compaction`) or to a turn paused after one: `history` the
        compacted conversation, `usage` the tokens before and the summary's."""
        ...

    def tap(self, call: CallT, *, hide_usage: bool, announce: Any = None) -> StreamTap:
        """Watches a live answer; `announce` (from `announced`) is added to it where the API carries one."""
        ...

    def answer_body(self, call: CallT, status: int, body: bytes, announce: Any = None) -> bytes:
        """A whole answer as the client gets it: the upstream's bytes, or their translation when the upstream speaks
        another API (a bridge); `announce` (from `announced`) added to a good one."""
        ...

    def error_body(self, error: ProxyError) -> dict[str, Any]:
        """The proxy's own error as this API's clients expect errors to look."""
        ...
