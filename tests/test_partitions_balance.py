"""The balance of a partitioned group, rule by rule: pure functions of one look at the group.

No Redis here: ``redlease._election.balance`` decides from the live members,
the holders and the PTTLs a view read; ``test_partitions`` checks that the
members acting on it converge on a real server.
"""

from __future__ import annotations

import itertools

import pytest

from redlease._election import balance


def test_the_quotas_of_the_live_members_add_up_to_the_partitions() -> None:
    for partitions, members in itertools.product((1, 2, 7, 12, 64), (1, 2, 3, 5, 8)):
        live = [f"m{i}".encode() for i in range(members)]
        holders = [live[i % members] for i in range(partitions // 2)]
        quotas = [balance.quota(partitions, live, holders, me) for me in live]
        assert sum(quotas) == partitions
        assert set(quotas) <= {partitions // members, partitions // members + 1}


def test_the_extra_partitions_go_to_the_members_that_hold_the_most_then_by_id() -> None:
    live = [b"a", b"b", b"c"]
    # 7 over 3: one extra. b holds the most, so b keeps its extra one.
    holders = [b"b", b"b", b"b", b"a", b"", b"c", b"gone"]
    assert [balance.quota(7, live, holders, me) for me in live] == [2, 3, 2]
    # Nobody holds anything: the extra one goes by id.
    assert [balance.quota(7, live, [b""] * 7, me) for me in live] == [3, 2, 2]
    # A departed member's leases do not rank anybody.
    assert [balance.quota(7, live, [b"gone"] * 7, me) for me in live] == [3, 2, 2]


def test_a_member_hands_over_the_excess_it_prefers_least() -> None:
    rank = {"0": 5, "1": 1, "2": 9, "3": 3}
    assert balance.to_hand_over(["0", "1", "2", "3"], 2, rank.__getitem__) == ["1", "3"]
    assert balance.to_hand_over(["0", "1"], 2, rank.__getitem__) == []
    assert balance.to_hand_over(["0", "1"], 5, rank.__getitem__) == []


def test_a_member_takes_only_free_partitions_or_its_own_most_preferred_first() -> None:
    names = ["0", "1", "2", "3", "4"]
    holders = [b"me", b"", b"other", b"", b"me"]
    rank = {"0": 1, "1": 2, "2": 99, "3": 7, "4": 4}.__getitem__
    # Holding "0": "2" is another's; "4" is its own lease it no longer counts.
    assert balance.to_take(names, holders, ["0"], b"me", 3, rank) == ["3", "4"]
    assert balance.to_take(names, holders, ["0"], b"me", 9, rank) == ["3", "4", "1"]
    assert balance.to_take(names, holders, ["0"], b"me", 1, rank) == []
    with pytest.raises(ValueError):  # the holders are those of the names, one each
        balance.to_take(names, holders[:-1], [], b"me", 3, rank)


def test_each_member_prefers_the_partitions_in_an_order_of_its_own() -> None:
    names = [str(i) for i in range(16)]

    def order(member: str) -> list[str]:
        return sorted(names, key=lambda p: balance.preference(member, p), reverse=True)

    assert order("a") == order("a")  # stable: a member coming back reaches for the same
    assert order("a") != order("b")
    assert balance.preference("a", "1") == balance.preference("a", "1")
    assert balance.preference("a\x001", "") != balance.preference("a", "1")


def test_a_moving_group_is_looked_at_again_soon_then_less_often() -> None:
    assert balance.soon(1.0, 0, 0.0) == pytest.approx(0.005)
    assert balance.soon(1.0, 3, 0.5) == pytest.approx(0.005 * 8 * 1.5)
    assert balance.soon(1.0, 40, 0.99) == 1.0  # capped at one poll
    assert balance.soon(0.25, 10, 0.0) == 0.25


def test_a_departed_members_partitions_are_looked_at_when_its_first_lease_ends() -> None:
    holders = [b"a", b"gone", b"", b"gone", b"left"]
    pttls = [900, 400, -2, 250, -1]
    # "left" has no expiry (-1): it is not counted; the first of the rest ends in 250 ms.
    assert balance.lease_end(holders, pttls, [b"a"]) == pytest.approx(0.251)
    assert balance.lease_end(holders, pttls, [b"a", b"gone", b"left"]) is None
    assert balance.lease_end([], [], [b"a"]) is None
