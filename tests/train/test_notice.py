"""A start-up wait that turns out long says what it waits for (`cgpt.train.notice`): the line
comes once the wait passes its threshold, never for a wait that ends sooner, and through
tqdm, so a progress bar on screen is redrawn rather than cut."""
import time

from cgpt.train.fit import Candidate, Choice, memory_for
from cgpt.train.notice import Notice, candidates


def test_a_long_wait_is_announced_with_its_seconds_and_again_while_it_lasts(capsys):
    with Notice("tiny-240k: compiling candidate training steps", after=0.01,
                every=0.01) as n:
        deadline = time.monotonic() + 60
        while n.said < 2 and time.monotonic() < deadline:  # until the timer has spoken twice
            time.sleep(0.01)
    said = n.said
    time.sleep(0.1)
    assert n.said == said  # the wait is over: nothing more
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == said >= 2 and n.seconds >= 0.01
    assert all(x.startswith("tiny-240k: compiling candidate training steps (") and
               x.endswith("s so far)") for x in lines)


def test_a_short_wait_and_a_disabled_notice_print_nothing(capsys):
    with Notice("quiet", after=600) as n:
        pass
    with Notice("not the writer", after=0, enabled=False) as m:
        time.sleep(0.05)
    assert not n.said and not m.said and capsys.readouterr().err == ""


def test_each_compiled_candidate_is_reported_with_its_result():
    def cand(m, remat, total):
        return Candidate(m, remat, {"total": total})

    tried = (cand(32, "save_dots", 22_000_000), cand(16, "save_dots", 10_000_000))
    choice = Choice(16, 2, "save_dots", tried[1].bytes, memory_for(17_000_000), tried)
    assert candidates("tiny-17k", choice) == (
        "tiny-17k: candidates (micro-batch/remat: bytes per device) "
        "32/save_dots: 22 MB too big, 16/save_dots: 10 MB fits")
