"""A group commit's statements are written for a few sizes of rows (statements.padded), so
that every size shares a prepared statement, and for at most seven rows more than it holds:
every padding row is bound and read (a parameter of each of its fields in each write) and
writes nothing, so a commit of 33 answers written for 64 did twice the binding it needed."""

from __future__ import annotations

import pytest

from notifier.store import statements


@pytest.mark.timeout(10)
def test_a_group_of_any_size_is_written_for_at_most_seven_rows_more() -> None:
    for n in range(1, 257):
        size = statements.padded(n)
        assert n <= size <= n + 7, (n, size)


@pytest.mark.timeout(10)
def test_small_groups_share_power_of_two_sizes_and_larger_ones_multiples_of_eight() -> None:
    assert [statements.padded(n) for n in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert [statements.padded(n) for n in (9, 16, 17, 33, 40, 41, 64)] == [
        16,
        16,
        24,
        40,
        40,
        48,
        64,
    ]


@pytest.mark.timeout(10)
def test_the_command_lines_largest_window_needs_few_prepared_statements() -> None:
    """Up to 64 rows (the largest window), eleven sizes: with five kinds of grouped write,
    55 texts, inside sqlite3's cache of 128 prepared statements."""
    assert len({statements.padded(n) for n in range(1, 65)}) == 11


@pytest.mark.timeout(10)
def test_the_padding_binds_null_for_every_field_of_every_row_past_the_group() -> None:
    assert statements.padding(("seq", "waited"), 33) == {
        f"{field}{i}": None for i in range(33, 40) for field in ("seq", "waited")
    }
