"""Reading a callgrind dump: the instructions it counted in all, and those counted in the C library's memory copies.

Under valgrind a copy made with `rep movsb` (glibc's memcpy and memmove for large buffers, `rep stosb` in memset)
counts one instruction per byte moved, where the processor moves dozens of bytes a cycle: a request that moves a
475 KB body a few times counts millions of instructions that take tens of microseconds. Counted apart, the rest is
the work a request costs (the Python it runs), which is what the long histories' CPU time follows.
"""

from __future__ import annotations

import re

# The total at the head of a dump ("summary:", or "totals:" in older versions).
_TOTAL = re.compile(rb"^(?:summary|totals): (\d+)", re.MULTILINE)
# glibc's copies and fills by any variant's name (__memmove_avx_unaligned_erms, memcpy@@GLIBC_2.14, __wmemset_...).
COPIES = re.compile(r"mem(?:cpy|move|pcpy|set)")
# A line naming a function, the one its costs go to (fn=) or one it calls (cfn=): "(id) name" the first time a
# name is used, "(id)" after (name compression), or the name alone (a dump written without compression).
_NAMING = re.compile(rb"^(c?fn)=(?:\((\d+)\))? ?(.*)$")
_POSITIONS = re.compile(rb"^positions: (.*)$", re.MULTILINE)


def total_of(dump: bytes) -> int:
    """The instructions a callgrind dump counted in all (ValueError when it holds no total)."""
    found = _TOTAL.search(dump)
    if found is None:
        raise ValueError("no summary or totals line in the callgrind dump")
    return int(found.group(1))


def self_costs(dump: bytes) -> dict[str, int]:
    """Each function's own instructions (first event), its calls' costs left to the functions called."""
    positions = _POSITIONS.search(dump)
    width = len(positions.group(1).split()) if positions else 1
    names: dict[bytes, str] = {}
    costs: dict[str, int] = {}
    current: str | None = None
    after_call = False
    for line in dump.splitlines():
        if not line:
            continue
        if line[:1].isdigit() or line[:1] in (b"+", b"-", b"*"):
            if after_call:  # the cost of the call just named: the called function's, counted there
                after_call = False
                continue
            fields = line.split()
            if current is not None and len(fields) > width:
                costs[current] = costs.get(current, 0) + int(fields[width])
            continue
        if line.startswith(b"calls="):
            after_call = True
            continue
        naming = _NAMING.match(line)
        if naming is not None:
            name = _name(naming.group(2), naming.group(3), names)
            if naming.group(1) == b"fn":
                current = name
    return costs


def _name(number: bytes | None, text: bytes, names: dict[bytes, str]) -> str:
    if number is None:
        return text.decode("utf-8", "replace")
    if text:
        names[number] = text.decode("utf-8", "replace")
    return names.get(number, f"({number.decode()})")


def copies_of(dump: bytes) -> int:
    """The instructions a dump counted in the C library's memory copies and fills (COPIES)."""
    return sum(cost for name, cost in self_costs(dump).items() if COPIES.search(name))
