"""``ebbtide run``: the controller process (see :mod:`controller.process.app`).

The process wiring (aiohttp, aiokafka, the engine) and the cluster adapters are imported when
the command runs, not when the CLI loads: ``ebbtide --version`` and ``policy validate`` should
not pay for them."""

from __future__ import annotations

import gc
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import structlog
from pydantic import ValidationError

from controller.cli.asyncrun import run_async
from controller.cli.options import load_policy_files
from controller.process.settings import ConfigFileError, Settings, load_settings
from policies.model import Policy

if TYPE_CHECKING:
    from controller.loop.port import ClusterRuntime

__all__ = ["COMMANDS", "GC_YOUNG_THRESHOLD", "tune_gc"]

log = structlog.get_logger("ebbtide")


async def make_runtime(settings: Settings, policy: Policy) -> ClusterRuntime:
    """The cluster adapter named by ``settings.cluster``."""
    if settings.cluster.startswith("sim:"):
        from controller.simcluster.sim_runtime import SimRuntime

        scenario = Path(settings.cluster.removeprefix("sim:"))
        return SimRuntime.from_file(scenario, policy, dry_run=settings.dry_run_for(policy))
    from controller.kube.kube_runtime import KubeRuntime

    return await KubeRuntime.connect(settings.kube, policy, dry_run=settings.dry_run_for(policy))


#: Allocations between collections of the youngest generation (CPython's default is 700). Under
#: heavy traffic ingest allocates that many in well under a millisecond, so the collector ran
#: very often, and its full collections walked whatever start-up built (BENCHMARKS.md,
#: "Collector pauses").
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Set the collector up for a long-running ingest process, once start-up is done: what
    start-up built (modules, the policy, the clients) lives as long as the process, so it is
    frozen out of every collection; and the youngest generation is collected after
    :data:`GC_YOUNG_THRESHOLD` allocations. Garbage with cycles is still collected, later."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)


def _settings_problem(error: Mapping[str, Any]) -> str:
    """One pydantic error as the user would fix it."""
    loc = ".".join(str(p) for p in error["loc"])
    if loc == "policies" and error["type"] == "too_short":
        return "no policy: give --policy FILE (or EBBTIDE_POLICIES=FILE[,FILE...])"
    return f"{loc}: {error['msg']}"


@click.command()
@click.option(
    "--policy",
    "policies",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Policy file (repeatable; several merge). Env: EBBTIDE_POLICIES=FILE[,FILE...].",
)
@click.option("--bootstrap", help="Kafka bootstrap servers. Env: EBBTIDE_KAFKA__BOOTSTRAP.")
@click.option("--cluster", help="kube (default) or sim:SCENARIO.yaml.")
@click.option(
    "--dry-run/--no-dry-run",
    " /--live",
    default=None,
    help="Decide and report; write nothing. Default: dry-run against a real cluster (kube) "
    "unless the policy says dryRun: false; live on a simulated one. Env: EBBTIDE_DRY_RUN.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(path_type=Path),
    help="YAML settings file. Env: EBBTIDE_CONFIG.",
)
@click.option("--kubeconfig", type=click.Path(path_type=Path), help="Default: in-cluster.")
@click.option("--metrics-address", help="host:port for /metrics, /healthz, /readyz.")
@click.option("--identity", help="This replica's name (Lease holder).")
@click.option(
    "--role",
    type=click.Choice(["all", "aggregate", "decide"]),
    help="all (default): read every event and decide. Sharded ingest: aggregate (fold the "
    "partitions Kafka's group assigns, publish partials) or decide (merge partials, decide). "
    "Env: EBBTIDE_SHARDS__ROLE.",
)
def run(
    policies: tuple[Path, ...],
    bootstrap: str | None,
    cluster: str | None,
    dry_run: bool | None,
    config_file: Path | None,
    kubeconfig: Path | None,
    metrics_address: str | None,
    identity: str | None,
    role: str | None,
) -> None:
    """Run the controller: consume events, evaluate the policy, act on the cluster."""
    kafka: dict[str, Any] = {"bootstrap": bootstrap} if bootstrap else {}
    kube: dict[str, Any] = {
        k: v for k, v in {"kubeconfig": kubeconfig, "identity": identity}.items() if v
    }
    try:
        settings = load_settings(
            config_file,
            policies=list(policies) or None,
            cluster=cluster,
            dry_run=dry_run,
            kafka=kafka or None,
            kube=kube or None,
            http={"address": metrics_address} if metrics_address else None,
            shards={"role": role} if role else None,
        )
    except ConfigFileError as exc:
        raise click.ClickException(str(exc)) from None
    except ValidationError as exc:
        problems = "; ".join(_settings_problem(e) for e in exc.errors())
        raise click.UsageError(f"invalid settings: {problems}") from None
    policy = load_policy_files(tuple(settings.policies))
    resolved = settings.for_policy(policy)
    if resolved.shards.role == "aggregate":  # folds events; decides and writes nothing
        from controller.process.aggregate import run_aggregator

        run_async(run_aggregator(resolved, policy))
        return
    if resolved.dry_run:
        log.warning(
            "controller.dry_run",
            why="--dry-run" if settings.dry_run else "the default against a real cluster",
            go_live="--live, EBBTIDE_DRY_RUN=false or the policy's dryRun: false",
        )

    from controller.process.app import Controller

    async def main() -> None:
        from controller.kube.kube_runtime import KubeRuntime

        runtime = await make_runtime(resolved, policy)
        objectives = runtime.objectives if isinstance(runtime, KubeRuntime) else None
        try:
            controller = Controller(resolved, runtime, policy, objectives=objectives)
            tune_gc()
            await controller.run()
        finally:
            await runtime.close()
        if controller.crashed:
            raise click.ClickException("stopped after a failure: " + "; ".join(controller.crashed))

    run_async(main())


COMMANDS = [run]
