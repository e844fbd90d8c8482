"""kmq-dagster in a dg project, end to end with Dagster's own tools: ``dg list components``
finds the component, ``dg scaffold defs`` adds a queue next to one declared already and ``dg
check defs`` loads both, ``dg check defs`` and ``dg list defs`` load the example project (two
queues, two defs.yaml files) cleanly,
``dagster definitions validate`` loads workspace.yaml cleanly, and ``dg dev`` (a real webserver
and daemon, driven over GraphQL) operates the example's queue: provision, the keep-alive sensor's
tracker run, a processing run the backlog sensor launches, and the output's freshness policy
failing once the backlog sensor is stopped. (Terminating a tracker run, CANCELED, is shown in
``tests/e2e/test_dagster_daemon.py`` and ``tests/dagster/test_tracker_run.py``.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kmq_dagster.broker import EmbeddedBroker
from kmq_dagster.demo.orders import is_poison
from kmq_dagster.demo.pipeline import produce_orders
from kmq_dagster.settings import KmqSettings
from tests.e2e.dagster_graphql import DagsterClient
from tests.e2e.dg_project import EXAMPLE, ROOT, DgDev, own_warnings, project_env, run_dg
from tests.kafka_helpers import WaitBudget, wait_for

#: Run statuses of a run not ended yet, as the GraphQL API spells them.
IN_FLIGHT = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}

#: What the stale test may wait in all: for runs to start and end, and 2 minutes to go stale.
WAITS_S = 1500

QUEUE = "orders__invoicing"
PROVISION, PROCESS, TRACK = (f"{what}_{QUEUE}" for what in ("provision", "process", "track"))
BACKLOG = f"backlog_{QUEUE}"
OUTPUT = ["kmq", QUEUE, "output"]
#: The example's second queue: observed and operated, not processed (no function yet).
PAYMENTS = "payments__billing"


def test_dg_list_components_shows_the_kmq_component() -> None:
    result = run_dg("list", "components", "--json")

    assert result.returncode == 0, result.stdout
    listed = json.loads(result.stdout[result.stdout.index("{") :])
    summaries = {item["key"]: item["summary"] for item in listed["items"]}
    assert "kmq_dagster.KmqQueueComponent" in summaries, (
        "kmq-dagster's dagster_dg_cli.registry_modules entry point is not installed "
        f"(pip install -e '.[test]' again): {sorted(summaries)}"
    )
    assert "Kafka" in summaries["kmq_dagster.KmqQueueComponent"]


def test_dg_scaffold_defs_adds_a_second_queue_that_dg_checks_and_lists(tmp_path: Path) -> None:
    # the example without its second queue: orders alone, its resources declared (alerts too)
    project = tmp_path / "kmq-orders"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("payments", "__pycache__"))

    scaffolded = run_dg(
        "scaffold", "defs", "kmq_dagster.KmqQueueComponent", "payments", "--group", "billing",
        project=project,
    )  # fmt: skip

    assert scaffolded.returncode == 0, scaffolded.stdout
    written = (project / "src/kmq_orders/defs/payments/defs.yaml").read_text()
    assert written.startswith("type: kmq_dagster.KmqQueueComponent\n"), written
    for line in ("- topic: payments", "group: billing"):
        assert line in written, written
    assert "resources:" not in written, written  # it takes the ones orders/defs.yaml declares
    checked = run_dg("check", "defs", project=project)
    assert checked.returncode == 0, checked.stdout
    listed = run_dg("list", "defs", "--json", project=project)
    assert "provision_payments__billing" in listed.stdout
    assert "provision_orders__invoicing" in listed.stdout


def test_dg_check_defs_loads_the_example_cleanly() -> None:
    result = run_dg("check", "defs")

    assert result.returncode == 0, result.stdout
    assert "All definitions loaded successfully" in result.stdout
    assert own_warnings(result.stdout) == []


def test_dg_list_defs_lists_the_queues_assets_checks_jobs_and_sensors() -> None:
    result = run_dg("list", "defs", "--json")

    assert result.returncode == 0, result.stdout
    listed = json.loads(result.stdout[result.stdout.index("{") :])
    assert sorted(a["asset_key"] for a in listed["assets"]) == [
        f"kmq/{QUEUE}/output",
        f"kmq/{QUEUE}/queue",
        f"kmq/{PAYMENTS}/queue",
    ]
    assert {c["key"] for c in listed["asset_checks"]} >= {
        f"kmq/{QUEUE}/queue:breaker_closed",
        f"kmq/{QUEUE}/output:output_matches_acks",
        f"kmq/{PAYMENTS}/queue:breaker_closed",
    }
    assert {j["name"] for j in listed["jobs"]} >= {
        PROVISION, PROCESS, TRACK, f"replay_{QUEUE}", f"provision_{PAYMENTS}", f"track_{PAYMENTS}"
    }  # fmt: skip
    assert {s["name"] for s in listed["sensors"]} == {
        BACKLOG,
        *(f"{what}_{queue}" for what in ("breaker", "keep_tracker", "observe")
          for queue in (QUEUE, PAYMENTS)),
        "kmq_run_failures",
    }  # fmt: skip
    assert {s["name"] for s in listed["schedules"]} == {
        "kmq_audit_retention_daily",
        "kmq_dead_letter_digest_daily",
    }
    assert {r["name"] for r in listed["resources"]} == {"kmq", "audit", "pyspark", "alerts"}
    assert own_warnings(result.stdout) == []


def test_dagster_definitions_validate_loads_workspace_yaml_cleanly() -> None:
    dagster = Path(sys.executable).parent / "dagster"
    result = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", str(ROOT / "workspace.yaml")],
        cwd=ROOT,
        env=project_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=240,
        check=False,
    )

    assert result.returncode == 0, result.stdout
    assert "All code locations passed validation" in result.stdout
    assert own_warnings(result.stdout) == []


#: A dg project with one of each thing kmq makes (asset, check, job, sensor) and nothing of
#: kmq: what Dagster warns about while loading it is Dagster's own business.
BASELINE_DEFS = """
import dagster as dg

@dg.asset
def thing() -> None: ...

@dg.asset_check(asset=thing)
def thing_is_fine() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True)

job = dg.define_asset_job("thing_job", selection=[thing])

@dg.sensor(job=job)
def thing_sensor(context: dg.SensorEvaluationContext) -> None: ...
"""

#: Loads a project's definitions as ``dg dev``'s code server does (the @definitions function,
#: the repository built, the sensors' targets read), printing every warning as JSON.
LOAD_RECORDING_WARNINGS = """
import importlib, json, sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    defs = importlib.import_module(sys.argv[1] + ".definitions").defs()
    for sensor in defs.get_repository_def().sensor_defs:
        sensor.targets
print(json.dumps(sorted({f"{w.category.__name__}: {w.message}" for w in caught})))
"""


def load_recording_warnings(src: Path, module: str, home: Path) -> set[str]:
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_RECORDING_WARNINGS, module],
        cwd=home,
        env=project_env({"DAGSTER_HOME": str(home), "PYTHONPATH": f"{ROOT}:{src}"}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert loaded.returncode == 0, loaded.stderr
    return set(json.loads(loaded.stdout.strip().splitlines()[-1]))


def test_loading_the_example_project_warns_about_nothing_of_ours(tmp_path: Path) -> None:
    # `dg check defs` and `dagster definitions validate` load code in a code server whose
    # warnings they do not print, so their clean output alone proves little: load here too
    baseline = tmp_path / "baseline"
    shutil.copytree(EXAMPLE, baseline, ignore=shutil.ignore_patterns("defs", "*.py", "*.md"))
    package = baseline / "src" / "kmq_orders"
    (package / "defs").mkdir(parents=True)
    (package / "defs" / "things.py").write_text(BASELINE_DEFS)
    shutil.copy(EXAMPLE / "src" / "kmq_orders" / "definitions.py", package)

    dagsters_own = load_recording_warnings(baseline / "src", "kmq_orders", tmp_path)
    loading_ours = load_recording_warnings(EXAMPLE / "src", "kmq_orders", tmp_path)

    assert sorted(loading_ours - dagsters_own) == []


def rows(output: Path) -> int:
    """Rows in the committed files of the output dataset."""
    parts = sorted(output.glob("part-*.parquet")) if output.exists() else []
    return sum(pq.read_metadata(part).num_rows for part in parts)


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(WAITS_S + 300)  # and dg dev's start (240 s at most), broker, teardown
def test_the_example_in_dg_dev_provisions_processes_and_goes_stale(tmp_path: Path) -> None:
    output = tmp_path / "orders_invoiced.parquet"
    # Each run is a new process importing Dagster and the project, Spark's a JVM: on a loaded
    # two-core machine one took over 180 s to start. Their waits share one budget.
    budget = WaitBudget(WAITS_S, limit_s=WAITS_S)
    with EmbeddedBroker(port=0) as broker:
        settings = KmqSettings(bootstrap_servers=broker.bootstrap_servers)
        env = project_env(
            {
                "KMQ_BOOTSTRAP_SERVERS": broker.bootstrap_servers,
                "KMQ_SESSION_TIMEOUT_MS": "6000",
                "KMQ_AUDIT_URL": f"sqlite:///{tmp_path / 'audit.db'}",
                "KMQ_ORDERS_OUTPUT": str(output),
                # processed within 2 minutes of arrival: the output is HEALTHY that long
                # after its run (under load the daemon's evaluation can come a minute late),
                # and the daemon evaluates freshness every 5 s instead of 30 s
                "KMQ_ORDERS_FRESHNESS_MINUTES": "2",
                "FRESHNESS_DAEMON_INTERVAL_SECONDS": "5",
            }
        )
        with DgDev(home=tmp_path / "home", env=env) as dagster:
            client = DagsterClient(dagster)

            # provision, launched with no config
            provision = client.launch(PROVISION)
            assert wait_for(lambda: client.status(PROVISION, provision) == "SUCCESS",
                            timeout_s=budget.left_s(), interval_s=1)  # fmt: skip

            # the keep-alive sensor starts a tracker run, and it tracks (its heartbeat)
            def started_tracker() -> bool:
                return any(
                    r["status"] == "STARTED" and "kmq/heartbeat" in r["tags"]
                    for r in client.runs(TRACK)
                )

            assert wait_for(started_tracker, timeout_s=budget.left_s(), interval_s=1)

            # orders arrive: the backlog sensor launches a processing run that succeeds
            produce_orders(settings, 40)
            invoiced = sum(1 for order_id in range(40) if not is_poison(order_id))

            def processed_by_the_sensor() -> bool:
                return any(
                    run["status"] == "SUCCESS" and run["tags"].get("dagster/sensor_name") == BACKLOG
                    for run in client.runs(PROCESS)
                )

            assert wait_for(processed_by_the_sensor, timeout_s=budget.left_s(), interval_s=2)
            assert wait_for(lambda: rows(output) >= invoiced, budget.left_s(), interval_s=2)
            assert wait_for(lambda: client.freshness(OUTPUT) == "HEALTHY",
                            timeout_s=budget.left_s(), interval_s=1)  # fmt: skip

            # the backlog sensor stopped while orders keep arriving: nothing processes them,
            # and the output fails its freshness policy
            client.stop_sensor(BACKLOG)
            # A tick under way when the sensor stopped may still launch its run (on a loaded
            # machine a tick takes many seconds): the count starts once the run list has held
            # still, with nothing in flight, over two looks 10 s apart.
            seen: list[list[tuple[str, str]]] = []

            def runs_settled() -> bool:
                seen.append(sorted((r["runId"], r["status"]) for r in client.runs(PROCESS)))
                in_flight = any(status in IN_FLIGHT for _run, status in seen[-1])
                return len(seen) > 1 and seen[-1] == seen[-2] and not in_flight

            assert wait_for(runs_settled, timeout_s=budget.left_s(), interval_s=10)

            def by_the_sensor() -> int:
                tags = [run["tags"] for run in client.runs(PROCESS)]
                return sum(tag.get("dagster/sensor_name") == BACKLOG for tag in tags)

            runs_before = by_the_sensor()
            produce_orders(settings, 20, first_id=40)
            assert wait_for(lambda: client.freshness(OUTPUT) == "DEGRADED",
                            timeout_s=budget.left_s(), interval_s=2)  # fmt: skip
            assert by_the_sensor() == runs_before  # the stopped sensor launched nothing

    # the code server and run workers print their warnings to dg dev's log: none of ours
    assert own_warnings((tmp_path / "home" / "dg-dev.log").read_text()) == []
