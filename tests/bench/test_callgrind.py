"""bench.callgrind: a dump's total, each function's own instructions, and those counted in memory copies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.callgrind import copies_of, self_costs, total_of

HEAD = b"# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\npositions: line\nevents: Ir\nsummary: 0\n\n"


@pytest.mark.parametrize(("dump", "total"), [
    (b"# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 1234567\n\nfl=(1) a.c\n",
     1234567),
    (b"events: Ir\ntotals: 42\n", 42),  # older valgrind writes totals:
    (b"events: Ir\nsummary: 7\nfn=(2) f\n0 99\ntotals: 8\n", 7),  # the first of them, the dump's own
])
def test_a_dumps_total_is_read_from_its_summary_line(dump: bytes, total: int) -> None:
    assert total_of(dump) == total


@pytest.mark.parametrize("dump", [b"", b"events: Ir\n", b"events: Ir\nsummary:\n", b"xsummary: 12\n"])
def test_a_dump_without_a_total_is_refused(dump: bytes) -> None:
    with pytest.raises(ValueError, match="no summary or totals line"):
        total_of(dump)


@pytest.mark.parametrize(("body", "costs"), [
    # A function's cost lines, relative positions included; a name given once and then by its number.
    (b"fn=(1) main\n10 5\n+2 7\n-1 1\n* 2\nfn=(2) __memcpy_avx_unaligned_erms\n3 1000\nfn=(1)\n12 4\n",
     {"main": 19, "__memcpy_avx_unaligned_erms": 1000}),
    # A call's cost (the line after calls=) is the callee's, counted under its own fn=, not the caller's.
    (b"fn=(1) main\n10 5\ncfn=(2) __memmove_evex_unaligned_erms\ncalls=3 40\n11 600\n12 1\n"
     b"fn=(2)\n40 600\n", {"main": 6, "__memmove_evex_unaligned_erms": 600}),
    # A name first given by a cfn= line is known to a later fn=(id).
    (b"fn=(1) f\ncfn=(9) memset\ncalls=1 1\n5 30\nfn=(9)\n1 30\n", {"f": 0, "memset": 30}),
    # Files and objects change nothing; a cost line without a cost counts nothing; names without compression.
    (b"ob=(1) /lib/libc.so.6\nfl=(3) a.c\nfn=g\nfi=(4) b.h\n7\n8 3\nfe=(3)\n9 2\n", {"g": 5}),
    # Costs before any function are no one's.
    (b"5 100\nfn=(1) h\n6 1\n", {"h": 1}),
])
def test_each_function_is_given_its_own_instructions(body: bytes, costs: dict[str, int]) -> None:
    found = self_costs(HEAD + body)
    assert {name: found.get(name, 0) for name in costs} == costs
    assert set(found) <= set(costs)


def test_positions_of_instruction_and_line_are_both_skipped() -> None:
    dump = HEAD.replace(b"positions: line", b"positions: instr line") + b"fn=(1) f\n0x4000 10 7\n+3 11 5\n"
    assert self_costs(dump) == {"f": 12}


@pytest.mark.parametrize(("name", "copy"), [
    ("__memcpy_avx_unaligned_erms", True), ("__memmove_avx512_unaligned_erms", True), ("memcpy@@GLIBC_2.14", True),
    ("__memset_avx2_unaligned_erms", True), ("__wmemset_avx2_unaligned", True), ("__mempcpy_sse2", True),
    ("__memcmp_avx2_movbe", False), ("_PyEval_EvalFrameDefault", False), ("memory_getbuf", False),
])
def test_copies_are_the_c_librarys_copies_and_fills(name: str, copy: bool) -> None:
    dump = HEAD + f"fn=(1) {name}\n1 250\nfn=(2) other\n1 3\n".encode()
    assert copies_of(dump) == (250 if copy else 0)


FUNCTIONS = st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_@.]{0,20}", fullmatch=True),
                            st.lists(st.integers(0, 10**9), min_size=1, max_size=5), min_size=1, max_size=8)


@given(FUNCTIONS, st.booleans(), st.data())
def test_self_costs_read_back_what_was_written(functions: dict[str, list[int]], compress: bool,
                                               data: st.DataObject) -> None:
    """Written as callgrind writes it (names compressed or not, a function's costs in several runs of lines, calls
    between them), every function's own cost reads back exactly, and the costs add up to the total."""
    numbers = {name: index + 1 for index, name in enumerate(functions)}
    told: set[str] = set()
    lines: list[str] = []

    def naming(key: str, name: str) -> str:
        if not compress:
            return f"{key}={name}"
        first = name not in told
        told.add(name)
        return f"{key}=({numbers[name]}) {name}" if first else f"{key}=({numbers[name]})"

    names = list(functions)
    for name, costs in functions.items():
        lines.append(naming("fn", name))
        for position, cost in enumerate(costs):
            lines.append(f"{position + 1} {cost}")
            if data.draw(st.booleans()):
                callee = data.draw(st.sampled_from(names))
                called = data.draw(st.integers(0, 99))
                lines += [naming("cfn", callee), f"calls=1 {position}", f"{position + 1} {called}"]
    total = sum(sum(costs) for costs in functions.values())
    dump = HEAD.replace(b"summary: 0", f"summary: {total}".encode()) + "\n".join(lines).encode() + b"\n"
    found = self_costs(dump)
    assert found == {name: sum(costs) for name, costs in functions.items()}
    assert sum(found.values()) == total_of(dump)
