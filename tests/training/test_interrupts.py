"""A real SIGINT or SIGTERM under ``stop_on_signals`` is recorded, not acted on: training
stops at the next step boundary (``StopAtSignal``), with its checkpoint. The whole path in
a real process, SIGTERM and SIGKILL: tests/training/checkpoints/test_kill_resume.py."""

import signal

import pytest

from zoo.training.interrupts import stop_on_signals


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_real_signal_is_recorded_not_raised_and_the_handlers_come_back(number):
    before = signal.getsignal(number)
    with stop_on_signals() as record:
        assert record.number is None
        signal.raise_signal(number)  # delivered to this (main) thread before raise_signal returns
        assert record.number == number  # no KeyboardInterrupt, no exit
    assert signal.getsignal(number) is before
