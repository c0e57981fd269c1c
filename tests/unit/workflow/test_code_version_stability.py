"""R19: a workflow's code version is the same in every process and after a pickle round trip.

A run is pinned to the code version it started with, and a runner that resumes it
recomputes the version from the definition it unpickled. Lambdas built in ``__main__``
are pickled by value, the case where byte-stability is least obvious.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent('''
    import cloudpickle
    import rayfleet as rf

    def build():
        factor = 3
        wf = rf.Workflow("pinned", budget=rf.Budget(invocations=10))
        wf.step("a", to="x/1", call="add", payload=lambda ctx: {"n": factor}).compensate(
            "add", payload=lambda ctx: {"n": -factor})
        wf.step("b", to="x/2", call="add", after=["a"], payload=lambda ctx: {"n": ctx.outputs["a"]})
        return wf

    wf = build()
    again = cloudpickle.loads(cloudpickle.dumps(wf))
    twice = cloudpickle.loads(cloudpickle.dumps(again))
    print(wf.code_version(), again.code_version(), twice.code_version(), build().code_version())
''')


def _versions() -> list[str]:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=120)
    return done.stdout.split()


def test_code_version_is_stable_across_processes_and_pickle_round_trips() -> None:
    first, second = _versions(), _versions()
    assert len(first) == 4 and len(set(first)) == 1, first
    assert first == second


def test_code_version_changes_when_a_lambda_changes() -> None:
    changed = SCRIPT.replace('{"n": -factor}', '{"n": -factor - 1}')
    done = subprocess.run([sys.executable, "-c", changed], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.split()[0] != _versions()[0]
