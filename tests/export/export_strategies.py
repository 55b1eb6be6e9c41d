"""Hypothesis strategies for 5-field cron expressions in cronsim's syntax."""

from __future__ import annotations

from hypothesis import strategies as st

MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
# Not Australia/Lord_Howe: after its 30-minute shift, cronsim's elapsed-time walk (what oncely
# uses for a wildcard minute) steps over wall times, e.g. from 2027-04-04T00:57+11:00 with
# "*/3 0 * * *" straight to 2027-04-05T00:30+10:30, so oncely's own slots are the odd ones.
ZONES = [
    "UTC",
    "America/New_York",
    "Europe/London",
    "Europe/Madrid",
    "America/Mexico_City",
    "America/Santiago",
    "Asia/Kolkata",
]


def _numeric(
    lo: int, hi: int, names: list[str] | None = None, base: int = 0
) -> st.SearchStrategy[str]:
    def show(v: int) -> st.SearchStrategy[str]:
        if names and lo <= v - base < len(names):
            return st.sampled_from([str(v), names[v - base]])
        return st.just(str(v))

    value = st.integers(lo, hi).flatmap(show)
    pair = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(sorted)
    range_ = pair.flatmap(lambda p: st.tuples(show(p[0]), show(p[1])).map("-".join))
    step = st.integers(2, max(2, (hi - lo) // 2 + 1)).map(str)
    term = st.one_of(
        value,
        range_,
        st.tuples(st.sampled_from(["*"]), step).map("/".join),
        st.tuples(value, step).map("/".join),
        st.tuples(range_, step).map("/".join),
    )
    return st.one_of(
        st.just("*"),
        term,
        st.lists(term, min_size=2, max_size=3).map(",".join),
    )


def _dom() -> st.SearchStrategy[str]:
    return st.one_of(
        st.just("*"),
        st.just("*"),
        st.sampled_from(["L", "LW"]),
        _numeric(1, 31),
        st.lists(st.sampled_from(["1", "15", "L", "LW", "28"]), min_size=2, max_size=2).map(
            ",".join
        ),
    )


def _dow() -> st.SearchStrategy[str]:
    special = st.one_of(
        st.tuples(st.integers(0, 7).map(str), st.just("L")).map("".join),
        st.tuples(st.sampled_from(DAYS), st.integers(1, 5).map(str)).map("#".join),
    )
    return st.one_of(
        st.just("*"),
        st.just("*"),
        _numeric(0, 7, DAYS, 0),
        special,
        st.lists(special, min_size=2, max_size=2).map(",".join),
    )


minutes = st.one_of(st.integers(0, 59).map(str), _numeric(0, 59))
hours = st.one_of(st.integers(0, 23).map(str), _numeric(0, 23))
months = st.one_of(st.just("*"), _numeric(1, 12, MONTHS, 1))
cron_expressions = st.tuples(minutes, hours, _dom(), months, _dow()).map(" ".join)
zones = st.sampled_from(ZONES)
