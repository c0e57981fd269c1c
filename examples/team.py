"""A team from a roster: a planner wired to two researchers only the team may reach.

Run: python examples/team.py
(on a local Ray it starts, or the cluster at RAY_ADDRESS; the fleet's storage is
RAYFLEET_STORAGE, else ./.rayfleet). It applies examples/team.yaml, runs a plan over
peer messages, shows that the planner cannot reach an agent outside its team, and
writes the topology as team.dot in the current folder (and team.png when graphviz's
``dot`` command is installed). Exits 0 when every check held.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from _checks import conclude

import rayfleet as rf
from rayfleet.demo import Researcher

ROSTER = Path(__file__).with_name("team.yaml")
RESEARCHERS = ("team/researcher-history", "team/researcher-physics")


def main() -> None:
    with rf.connect() as fleet:
        report = fleet.apply(ROSTER)
        print(f"applied {ROSTER.name}: created {list(report.created)}, updated {list(report.updated)}, "
              f"unchanged {list(report.unchanged)}; wired {[str(edge) for edge in report.topology.wired]}")

        planner = fleet.agent("team/planner")
        findings = planner.call("plan", question="why is the sky blue?")
        print("the planner asked its peers:")
        for peer, finding in findings.items():
            print(f"  {peer}: {finding}")

        # Under `topology: enforced` the planner reaches its wired peers only.
        fleet.spawn("team/outsider", Researcher)
        outside = planner.call("ask_peer", peer="team/outsider", question="hi")
        print(f"the planner asking team/outsider, who is not its peer: {outside}")

        try:
            fleet.agent("team/researcher-history").call("research", question="from outside?")
            reached_from_outside = True
        except rf.NotAddressableError as error:
            print(f"a caller outside the fleet asking a researcher: refused ({error.message})")
            reached_from_outside = False

        again = fleet.apply(ROSTER)
        print(f"applying the roster again changes nothing: {not again.changed}")

        dot = fleet.topology.export("dot")
        target = Path("team.dot").resolve()
        target.write_text(dot)
        print(f"topology written to {target}")
        if shutil.which("dot"):
            subprocess.run(["dot", "-Tpng", str(target), "-o", str(target.with_suffix(".png"))], check=True)
            print(f"rendered {target.with_suffix('.png')}")
        else:
            print("install graphviz (the `dot` command) to render it as PNG")

    checks = {
        "both researchers answered the plan": sorted(findings) == sorted(RESEARCHERS),
        "the planner could not reach an agent outside its team": outside.startswith("refused"),
        "the researchers refuse callers outside the fleet": not reached_from_outside,
        "applying the same roster again is a no-op": not again.changed,
        "the DOT graph names every researcher": all(f'"{name}"' in dot for name in RESEARCHERS),
    }
    conclude("team", checks)


if __name__ == "__main__":
    main()
