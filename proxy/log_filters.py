"""Secrets kept out of what the proxy shows: credential redaction for log records, and passwords masked in URLs."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from proxy.log_format import FIELDS_ATTRIBUTE

MASK = "***"
# A header line or a dict entry naming a credential, as aiohttp's bad-request messages (raw header bytes) and
# reprs of header mappings show them. The value runs to the end of the line, the closing quote, or an escaped
# \r or \n inside a bytes repr.
_CREDENTIAL_FIELD = re.compile(
    r"(?P<name>\b(?:proxy-)?authorization|\bx-proxy-api-key|\bx-api-key|\bapi-key|\bproxy-key)"
    r"(?P<separator>['\"]?\s*[:=]\s*['\"]?)"
    r"(?P<value>(?:(?!\\[rn])[^\r\n'\",}])+)",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(?P<scheme>\bbearer\s+)(?P<value>[A-Za-z0-9._~+/=-]+)", re.IGNORECASE)
# OpenAI-style secret keys (sk-..., sk-proj-...) wherever they appear, even outside a header.
_SECRET_KEY = re.compile(r"\bsk-[A-Za-z0-9_-]{8,}")
# scheme://user:password@ — the password, up to the last "@" before the path.
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-z][a-z0-9+.-]*://[^/\s:@'\"]*:)(?P<password>[^/\s'\"]*)@", re.IGNORECASE)


def _field(match: re.Match[str]) -> str:
    return f"{match['name']}{match['separator']}{MASK}" if match["value"].strip() else match[0]


# Every pattern above needs one of these (lower-cased) to match: a line with none is clean at the cost of one
# lower() and a few substring scans, not four regex passes -- the proxy writes a line per request.
_NEEDLES = ("authorization", "api-key", "proxy-key", "bearer", "sk-", "://")
# The two characters re.IGNORECASE matches to an ASCII letter that lower() leaves alone (dotless i, long s).
_CASE_FOLDING_ODDITIES = ("\u0131", "\u017f")


def _clean(text: str) -> bool:
    """Whether no pattern of redact() can match: every line logged is looked at, so loops, not generators (a
    generator's frames cost more than the scans)."""
    lowered = text.lower()
    for needle in _NEEDLES:
        if needle in lowered:
            return False
    for odd in _CASE_FOLDING_ODDITIES:
        if odd in text:
            return False
    return True


def redact(text: str) -> str:
    """`text` with credential header values, bearer tokens, sk- keys and URL passwords replaced by ***."""
    if _clean(text):
        return text
    text = _CREDENTIAL_FIELD.sub(_field, text)
    text = _BEARER.sub(lambda match: match["scheme"] + MASK, text)
    text = _SECRET_KEY.sub("sk-" + MASK, text)
    return _URL_PASSWORD.sub(lambda match: f"{match['head']}{MASK}@", text)


_QUERY_PASSWORD = re.compile(r"(^|&)(password=)[^&]*")


def mask_url(url: str) -> str:
    """The URL with its password, if any, replaced by *** (http://user:pass@host → http://user:***@host, and a
    `?password=` query parameter)."""
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return redact(url)
    userinfo, at, host = netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if at and colon and password:
        url = url.replace(netloc, f"{user}:{MASK}@{host}", 1)
    # Redis URLs may carry the password as a query parameter instead.
    base, question, query = url.partition("?")
    return base + question + _QUERY_PASSWORD.sub(rf"\1\2{MASK}", query) if question else url


class RedactSecrets(logging.Filter):
    """Redacts credentials in a record's message, its arguments and its traceback, before any handler formats it.

    aiohttp logs a malformed request with the raw header bytes in the exception text, bearer tokens included.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001  # a malformed call is the handler's to report; a filter must not raise
            message = str(record.msg)
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
            record.__dict__.pop(FIELDS_ATTRIBUTE, None)  # the fields would still say what was redacted
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
            # Formatters reuse exc_text; a formatter that formatted exc_info itself would show the raw text again.
            record.exc_info = None
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def install(handlers: Iterable[logging.Handler] | None = None) -> RedactSecrets:
    """Add the filter to `handlers` (default: the root logger's), which every propagated record passes through.

    A filter on a logger would only see records logged on that very logger, not on its children.
    """
    redaction = RedactSecrets()
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        if not any(isinstance(existing, RedactSecrets) for existing in handler.filters):
            handler.addFilter(redaction)
    return redaction
