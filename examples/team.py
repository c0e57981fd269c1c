"""A planner and two researchers wired as a team; the topology rendered as DOT (and PNG with graphviz).

Run: python examples/team.py
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import rayfleet as rf
from rayfleet.demo import Researcher

ROSTER = Path(__file__).with_name("team.yaml")


def main() -> None:
    storage = tempfile.mkdtemp(prefix="rayfleet-team-")
    with rf.connect(storage=storage, namespace="rayfleet-team", hosts=2) as fleet:
        report = fleet.apply(ROSTER)
        print(f"created {list(report.created)}; wired {[str(edge) for edge in report.topology.wired]}")
        planner = fleet.agent("team/planner")
        for peer, finding in planner.call("plan", question="why is the sky blue?").items():
            print(f"  {peer}: {finding}")
        fleet.spawn("team/outsider", Researcher)
        print("  asking an agent outside the team:", planner.call("ask_peer", peer="team/outsider", question="hi"))
        print("applying again changes nothing:", not fleet.apply(ROSTER).changed)
        dot = fleet.topology.export("dot")
        target = Path(storage) / "team.dot"
        target.write_text(dot)
        print(f"topology written to {target}")
        if shutil.which("dot"):
            subprocess.run(["dot", "-Tpng", str(target), "-o", str(target.with_suffix(".png"))], check=True)
            print(f"rendered {target.with_suffix('.png')}")
        else:
            print("install graphviz (the 'dot' command) to render it as PNG")


if __name__ == "__main__":
    main()
