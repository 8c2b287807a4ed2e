"""`freight keys create | list | revoke | limits`: the API keys and tenant limits of `freight serve`.

They act on the store directly (the server reads keys within a second: no restart, no API call).
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import typer
from rich.console import Console
from rich.table import Table

from freight_cli.common import fail
from freight_cli.quantities import parse_size
from jobs.errors import FreightError
from jobs.settings import get_settings

app = typer.Typer(help="API keys and tenant limits of `freight serve` (in its store).", no_args_is_help=True)

StoreOpt = typer.Option(..., "--store", metavar="STORE", help="the store `freight serve --store` uses")


def _store(url: str):  # type: ignore[no-untyped-def]
    from jobs.storage import open_store

    try:
        return open_store(url, get_settings())
    except ValueError as exc:
        raise fail(str(exc)) from None


@app.command("create")
def create(
    tenant: str = typer.Option(..., "--tenant", metavar="NAME", help="the tenant the key acts for"),
    store: str = StoreOpt,
    name: str | None = typer.Option(None, "--name", help="a label, shown by `freight keys list`"),
) -> None:
    """Make a key and print it (stdout, once: the store keeps only its hash)."""
    from jobs.api.keys import create_key

    try:
        key, record = create_key(_store(store), tenant, name)
    except (FreightError, ValueError) as exc:
        raise fail(str(exc)) from None
    Console(stderr=True, highlight=False).print(
        f"key {record.key_id} for tenant {record.tenant}: shown once, keep it secret", soft_wrap=True)  # fmt: skip
    sys.stdout.write(key + "\n")


@app.command("list")
def list_(
    store: str = StoreOpt,
    tenant: str | None = typer.Option(None, "--tenant", metavar="NAME", help="only this tenant's keys"),
    as_json: bool = typer.Option(False, "--json", help="one JSON array"),
) -> None:
    """Every key's id, tenant, name, creation and revocation (never the key)."""
    from jobs.api.keys import list_keys

    try:
        records = list_keys(_store(store), tenant)
    except FreightError as exc:
        raise fail(str(exc)) from None
    if as_json:
        sys.stdout.write(json.dumps([r.model_dump() for r in records], indent=1) + "\n")
        return
    table = Table(title_justify="left")
    for column in ("key_id", "tenant", "name", "created", "revoked"):
        table.add_column(column)
    for r in records:
        table.add_row(r.key_id, r.tenant, r.name or "", _when(r.created_at), _when(r.revoked_at))
    Console(highlight=False).print(table)


def _when(at: int | None) -> str:
    return "" if at is None else datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@app.command("revoke")
def revoke(
    key_id: str = typer.Argument(..., metavar="KEY_ID", help="the key's id (`freight keys list`)"),
    store: str = StoreOpt,
) -> None:
    """Revoke a key: a running server refuses it within a second."""
    from jobs.api.keys import revoke_key

    try:
        record = revoke_key(_store(store), key_id)
    except FreightError as exc:
        raise fail(str(exc)) from None
    Console(stderr=True, highlight=False).print(f"key {record.key_id} of tenant {record.tenant} revoked")


@app.command("limits")
def limits(
    tenant: str = typer.Option(..., "--tenant", metavar="NAME", help="the tenant"),
    store: str = StoreOpt,
    max_stored: str | None = typer.Option(None, "--max-stored", metavar="SIZE",
                                          help="bytes of files the tenant may keep (200MiB, 10GB; default: the server's)"),
    max_batches: int | None = typer.Option(None, "--max-batches-in-flight", metavar="N",
                                           help="unfinished batches the tenant may have"),
) -> None:
    """Set one tenant's limits over the server's defaults (without a flag: show them)."""
    from jobs.api.layout import check_tenant
    from jobs.api.tenants import write_limits

    try:
        check_tenant(tenant)
        changes: dict[str, int | None] = {}
        if max_stored is not None:
            changes["max_stored_bytes"] = parse_size(max_stored, "--max-stored")
        if max_batches is not None:
            changes["max_batches_in_flight"] = max_batches
        own = write_limits(_store(store), tenant, changes)
    except (FreightError, ValueError) as exc:
        raise fail(str(exc).splitlines()[0]) from None
    sys.stdout.write(json.dumps(own.model_dump(exclude_none=True)) + "\n")


def register(main: typer.Typer) -> None:
    """Add the `keys` group to `main`."""
    main.add_typer(app, name="keys")
