"""Experience accounting as plain values: every stage counted on its own, so that a row lost
or doubled between two stages breaks an equation; sessions of a resumed run add up."""

from __future__ import annotations

import dataclasses

import pytest

from agentenv_jax.metrics.accounting import Accounting, ReplayAccounting

# A session: 1000 stepped, 960 sent and 40 still queued; 960 arrived, 896 trained, 64 late.
SESSION = Accounting(produced=1000, sent=960, received=960, trained=896, unsent=40, late=64)


def test_a_session_reconciles_and_one_row_off_at_any_stage_does_not():
    assert SESSION.reconciles
    for field in dataclasses.fields(Accounting):
        for off in (-1, 1):
            counts = SESSION.counts()
            counts[field.name] += off
            assert not Accounting(**counts).reconciles, (field.name, off)


def test_sessions_of_a_resumed_run_add_up_and_a_checkpoint_carries_what_was_trained():
    so_far = Accounting.trained_so_far(512)
    assert so_far.reconciles and so_far.trained == 512 and so_far.late == 0
    whole = SESSION + so_far + SESSION
    assert whole.reconciles
    assert whole.counts() == {
        "produced": 2512,
        "sent": 2432,
        "received": 2432,
        "trained": 2304,
        "unsent": 80,
        "late": 128,
        "discarded": 0,
    }


def test_rows_a_refilled_update_left_out_are_discarded_and_carried_across_a_resume():
    # 1200 stepped and sent; 1024 trained on, 160 left out of refilled updates, 16 late.
    refilled = Accounting(
        produced=1200, sent=1200, received=1200, trained=1024, late=16, discarded=160
    )
    assert refilled.reconciles
    assert not dataclasses.replace(refilled, discarded=0).reconciles
    so_far = Accounting.trained_so_far(1024, discarded=160)
    assert so_far.reconciles and so_far.discarded == 160 and so_far.received == 1184
    assert (so_far + refilled).reconciles


def _replay_report(**changes: int) -> dict[str, int]:
    report = dict(
        produced=1000,
        inserted=990,
        restored=0,
        pending=2,
        dropped=8,
        stored=900,
        overwritten=90,
        sampled=4096,
    )
    return report | changes


@pytest.mark.parametrize(
    "received, trained, prefetched, reconciles",
    [
        (3840, 3840, 256, True),
        (3840, 3840, 0, False),  # a prefetched answer that went missing
        (3840, 3584, 256, False),  # a received batch never trained on
        (4096, 4096, 256, False),  # a batch counted twice
    ],
)
def test_replay_prefetched_rows_are_counted_apart_from_sampled_and_received(
    received, trained, prefetched, reconciles
):
    reports = [_replay_report(), _replay_report(sampled=0)]
    accounting = ReplayAccounting.from_reports(reports, received, trained, prefetched)
    assert accounting.reconciles == reconciles
