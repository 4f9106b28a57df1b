"""``Engine._advance`` runs the events inside a pass in place, where the engine's process used to
yield a SimPy timeout: SimPy itself is the oracle. The same random schedules (ties at the pass's
end on purpose: times on a coarse binary grid, both priorities, events that schedule more events,
some at once) run both ways, and every callback must run in the same order at the same clock, the
engine's resumption included, before and after the pass."""

from __future__ import annotations

from types import SimpleNamespace

import simpy
from hypothesis import given, settings
from hypothesis import strategies as hst
from simpy.events import NORMAL, URGENT

from memtp_sim.engine import Engine

GRID = 0.25  # binary-exact: sums of these tie exactly


class _Boom(Exception):
    pass


def _simulate(schedule, pass_at: int, pass_len: int, spawn, in_place: bool,
              raiser: str | None = None) -> list[tuple[str, float]]:
    # the log of every callback and of the engine's pass; the event named ``raiser`` raises, and
    # the log then ends with what came out of env.run
    env = simpy.Environment()
    log: list[tuple[str, float]] = []

    def fire(name: str, depth: int):
        def callback(_event):
            log.append((name, env.now))
            if name == raiser:
                raise _Boom(name)
            if depth < 2:  # some events schedule others (a prefill's end starting the next prompt)
                for j, (delay, urgent) in enumerate(spawn.get(name, ())):
                    _schedule(f"{name}.{j}", delay, urgent, depth + 1)
        return callback

    def _schedule(name: str, delay: int, urgent: bool, depth: int = 0) -> None:
        event = simpy.Event(env)
        event.callbacks.append(fire(name, depth))
        event._ok, event._value = True, None
        env.schedule(event, URGENT if urgent else NORMAL, delay * GRID)

    for j, (delay, urgent) in enumerate(schedule):
        _schedule(f"e{j}", delay, urgent)

    def engine():
        yield env.timeout(pass_at * GRID)
        log.append(("pass starts", env.now))
        if in_place:
            Engine._advance(SimpleNamespace(env=env), pass_len * GRID)
        else:
            yield env.timeout(pass_len * GRID)
        log.append(("pass ends", env.now))
        _schedule("after the pass", 0, False)  # an event the engine schedules as it resumes

    env.process(engine())
    try:
        env.run()
    except _Boom as err:
        log.append(("raised", str(err)))
    return log


events = hst.lists(hst.tuples(hst.integers(0, 8), hst.booleans()), max_size=12)


@settings(max_examples=300, deadline=None)
@given(schedule=events, pass_at=hst.integers(0, 4), pass_len=hst.integers(0, 4),
       spawn=hst.dictionaries(hst.sampled_from([f"e{j}" for j in range(12)]),
                              hst.lists(hst.tuples(hst.integers(0, 3), hst.booleans()), max_size=3), max_size=6))
def test_a_pass_runs_the_events_inside_it_in_simpys_order(schedule, pass_at, pass_len, spawn):
    expected = _simulate(schedule, pass_at, pass_len, spawn, in_place=False)
    assert _simulate(schedule, pass_at, pass_len, spawn, in_place=True) == expected


def test_simpys_private_queue_is_as_advance_reads_it():
    # Engine._advance reads SimPy 4.1's private queue, event-id counter and clock: a SimPy that
    # changed them must fail here, not give other answers
    env = simpy.Environment()
    env.timeout(1.5, "x")
    assert env._now == 0
    time, priority, eid, event = env._queue[0]
    assert (time, priority, event.value) == (1.5, NORMAL, "x")
    assert next(env._eid) == eid + 1



@settings(max_examples=200, deadline=None)
@given(schedule=events.filter(bool), pass_at=hst.integers(0, 4), pass_len=hst.integers(0, 4), data=hst.data())
def test_a_callback_that_raises_inside_a_pass_stops_the_run_at_once(schedule, pass_at, pass_len, data):
    # a progress callback's cancel or a Ctrl-C inside a pass: the run stops where SimPy's own step
    # raised it, with the same events run before it, and the same exception object comes out
    raiser = f"e{data.draw(hst.integers(0, len(schedule) - 1))}"
    outcomes = [_simulate(schedule, pass_at, pass_len, {}, in_place, raiser) for in_place in (False, True)]
    assert outcomes[0] == outcomes[1]
