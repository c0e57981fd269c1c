"""``python -m rayfleet.jobs.workflow pkg.module:attr --run-id ID``: run a workflow as a Ray job, resumably.

The run id is the job's identity across restarts. The first job with an id starts the
run; a job submitted again with the same id after the first was stopped or failed
resumes it from the journal (journaled steps are re-derived, never executed again);
once the run has ended, a job with its id only reports the recorded outcome. The
engine runs in the job's own driver and holds the run's lease: on ``ray job stop``
(SIGTERM) it stops dispatching and releases the lease, so the next job takes over at
once; if the job died without that (SIGKILL, a lost node), the next job waits for the
lease to lapse (one TTL, 10 s by default).

``attr`` is an ``rf.Workflow`` or a function taking no arguments that returns one;
``--roster`` applies a roster first (idempotently), so one job brings its agents too.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Sequence

import click

from ..errors import RunOwnedElsewhereError, UnknownRunError
from ..identity._agent import resolve_object_path
from ..platform._fleet import Fleet
from ..platform._runner import UNFINISHED, runner_holder_prefix
from ..workflow._definition import RunStatus, Workflow, WorkflowOutcome
from ._connection import EXIT_NOT_COMPLETED, EXIT_OK, EXIT_STOPPED, attach, emit_result, fleet_options, run_command


@click.command(name="rayfleet.jobs.workflow", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("workflow_path", metavar="WORKFLOW")
@click.option("--run-id", required=True,
              help="the run's id: a job submitted again with the same id resumes that run instead of starting another")
@click.option("--roster", type=click.Path(exists=True, dir_okay=False), default=None,
              help="a roster YAML file to apply first (idempotent)")
@click.option("--force", is_flag=True, help="resume a run that was started by a different version of the workflow")
@click.option("--takeover-wait", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="seconds to wait for a vanished earlier job's hold on the run to lapse")
@fleet_options
def command(workflow_path: str, run_id: str, roster: str | None, force: bool, takeover_wait: float,
            address: str | None, storage: str | None, ledger: str | None, namespace: str, hosts: int | None) -> int:
    """Run WORKFLOW ('package.module:attribute') as run --run-id, resuming it if it exists; print its outcome."""
    workflow = load_workflow(workflow_path)
    fleet = attach(address=address, storage=storage, ledger=ledger, namespace=namespace, hosts=hosts)
    try:
        if roster is not None:
            report = fleet.apply(roster)
            click.echo(f"applied {roster}: {len(report.created)} created, {len(report.updated)} updated, "
                       f"{len(report.unchanged)} unchanged")
        try:
            outcome, how = _run_or_resume(fleet, workflow, run_id, force=force, takeover_wait=takeover_wait)
        except asyncio.CancelledError:
            click.echo(f"stopped (SIGTERM): run {run_id!r} stays {fleet.runs.get(run_id).status.value} with its "
                       f"journal; submit this job again with --run-id {run_id} to resume it", err=True)
            return EXIT_STOPPED
        click.echo(f"run {run_id!r} ({how}): {outcome.status.value}"
                   + (f"; {outcome.error}" if outcome.error is not None else ""))
        emit_result({
            "job": "workflow", "workflow": workflow.name, "run_id": run_id, "how": how,
            "status": outcome.status.value, "outputs": dict(outcome.outputs), "compensated": list(outcome.compensated),
            "error": None if outcome.error is None else str(outcome.error), "invocations": outcome.invocations,
        })
        return EXIT_OK if outcome.status is RunStatus.COMPLETED else EXIT_NOT_COMPLETED
    finally:
        fleet.shutdown()  # a job attached to a running fleet leaves it running


def load_workflow(path: str) -> Workflow:
    """The workflow ``package.module:attribute`` names (an ``rf.Workflow``, or a function returning one).

    Raises:
        click.BadParameter: the path is malformed, does not import, or names something else.
    """
    module_name, _, attribute = path.partition(":")
    try:
        target = resolve_object_path(path)
    except ValueError:
        raise click.BadParameter(f"{path!r} must look like 'package.module:attribute'", param_hint="WORKFLOW") from None
    except ImportError as error:
        raise click.BadParameter(
            f"cannot import module {module_name!r} ({error}). Submit the job with --working-dir holding it "
            f"(the job runs from there), or install it on the cluster",
            param_hint="WORKFLOW",
        ) from None
    except AttributeError:
        raise click.BadParameter(f"module {module_name!r} has no {attribute!r}", param_hint="WORKFLOW") from None
    if not isinstance(target, Workflow) and callable(target):
        target = target()
    if not isinstance(target, Workflow):
        raise click.BadParameter(
            f"{path!r} is a {type(target).__name__}, not an rf.Workflow or a function returning one",
            param_hint="WORKFLOW",
        )
    return target


def _run_or_resume(
    fleet: Fleet, workflow: Workflow, run_id: str, *, force: bool, takeover_wait: float
) -> tuple[WorkflowOutcome, str]:
    """Start, resume or report run ``run_id``; returns the outcome and how it was reached.

    Raises:
        asyncio.CancelledError: SIGTERM arrived; the engine released the run's lease.
        RunOwnedElsewhereError: another engine still held the run after ``takeover_wait`` seconds.
    """
    try:
        before = fleet.runs.get(run_id)
    except UnknownRunError:
        before = None
    if before is not None and before.status.value not in UNFINISHED:
        # A finished run is never run again: its outcome is the answer, for every later job.
        return fleet.runs.wait(run_id, timeout=10), "already ended"
    if before is None:
        how = "started"
    else:
        how = "resumed"
        click.echo(f"resuming run {run_id!r}: {before.status.value}, {before.detail}")
    deadline = time.monotonic() + takeover_wait
    while True:
        try:
            return asyncio.run(_engine(fleet, workflow, run_id, force)), how
        except RunOwnedElsewhereError as error:
            if error.owner.startswith(runner_holder_prefix(fleet.config.namespace)):
                # Submitted with fleet.submit: the runner actor executes it; follow it there.
                click.echo(f"run {run_id!r} is executed by the fleet's runner actor; waiting for its outcome")
                return fleet.runs.wait(run_id), "followed"
            if time.monotonic() + error.expires_in > deadline:
                raise
            click.echo(f"run {run_id!r} is still held by {error.owner} (an earlier job that stopped or still "
                       f"runs); its hold lapses in {error.expires_in:.1f} s unless renewed. Waiting.")
            time.sleep(max(error.expires_in, 0.0) + 0.25)


async def _engine(fleet: Fleet, workflow: Workflow, run_id: str, force: bool) -> WorkflowOutcome:
    # ray job stop sends SIGTERM, then SIGKILL a few seconds later: cancelling the run
    # makes the engine stop dispatching and release the run's lease in that time, so the
    # next job with this run id does not wait a lease TTL.
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None  # a coroutine run by asyncio.run always has its task
    previous = signal.getsignal(signal.SIGTERM)  # ray.init's, which exits the process
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await fleet.run_async(workflow, run_id=run_id, force=force)
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        if previous is not None:  # None: set outside Python, nothing to restore
            signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] = ()) -> int:
    """Run the job with command-line arguments ``argv``; returns its exit code."""
    return run_command(command, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
