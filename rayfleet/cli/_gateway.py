"""``gateway``: serve the fleet over HTTP (the server itself lives in ``rayfleet.gateway``)."""

from __future__ import annotations

import click

from ._session import FleetOptions, open_fleet, pass_options


def parse_modules(ctx: click.Context, param: click.Parameter, text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(name.strip() for name in text.split(",") if name.strip())


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8080, show_default=True,
              help="Port to listen on (0: any free port).")
@click.option("--insecure", is_flag=True, help="Serve without a token (refused unless --host is 127.0.0.1).")
@click.option("--token", envvar="RAYFLEET_GATEWAY_TOKEN", hidden=True, default=None,
              help="Bearer token clients must send (give it through RAYFLEET_GATEWAY_TOKEN, not the command line).")
@click.option("--allowed-modules", envvar="RAYFLEET_ALLOWED_MODULES", callback=parse_modules, default=None,
              metavar="MODULES", show_envvar=True,
              help="Comma-separated modules whose agent classes (in rosters) and workflows (in run "
                   "submissions) HTTP clients may name (default: only classes the fleet already knows, no workflows).")
@pass_options
def gateway(options: FleetOptions, host: str, port: int, insecure: bool, token: str | None,
            allowed_modules: tuple[str, ...] | None) -> None:
    """Serve the fleet's JSON API over HTTP until interrupted (bearer token from RAYFLEET_GATEWAY_TOKEN)."""
    from ..gateway import serve  # aiohttp and the API models load only for this command

    # Like `apply`, the gateway may create the fleet: a roster applied over HTTP is one way to start one.
    with open_fleet(options, create=True) as fleet:
        serve(fleet, host=host, port=port, token=token, insecure=insecure, allowed_modules=allowed_modules)
