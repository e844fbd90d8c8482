"""What the end-to-end tests ask a real Dagster webserver over GraphQL."""

from __future__ import annotations

from typing import Any

from kmq_dagster.demo.dagster_service import DagsterService

REPOSITORY = "__repository__"

LAUNCH = """
mutation($selector: JobOrPipelineSelector!) {
  launchRun(executionParams: {selector: $selector, runConfigData: "{}"}) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}"""
RUNS = """
query($job: String!) {
  runsOrError(filter: {pipelineName: $job}, limit: 50) {
    ... on Runs { results { runId status tags { key value } } }
  }
}"""
TERMINATE = """
mutation($runId: String!) {
  terminateRun(runId: $runId) { __typename ... on PythonError { message } }
}"""
RUN_LOG = """
query($runId: ID!) {
  logsForRun(runId: $runId, limit: 1000) {
    ... on EventConnection { events { __typename ... on MessageEvent { timestamp message } } }
  }
}"""
TICKS = """
query($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    ... on Sensor { sensorState { ticks(limit: 20) { status skipReason runIds timestamp } } }
  }
}"""
SENSOR_STATE = """
query($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) { ... on Sensor { sensorState { id status } } }
}"""
STOP_SENSOR = """
mutation($id: String!) {
  stopSensor(id: $id) { __typename ... on PythonError { message } }
}"""
FRESHNESS = """
query($path: [String!]!) {
  assetNodeOrError(assetKey: {path: $path}) {
    ... on AssetNode { freshnessStatusInfo { freshnessStatus } }
  }
}"""
MATERIALIZATIONS = """
query($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) {
    ... on Asset { assetMaterializations(limit: 50) { runId metadataEntries {
      label ... on IntMetadataEntry { intValue } } } }
  }
}"""


class DagsterClient:
    """Launch, list and terminate runs and read sensor ticks of the loaded code location."""

    def __init__(self, service: DagsterService) -> None:
        self.service = service
        location = service.location_name()
        assert location is not None
        self.location = location

    def launch(self, job: str) -> str:
        selector = {
            "repositoryLocationName": self.location,
            "repositoryName": REPOSITORY,
            "jobName": job,
        }
        answer = self.service.graphql(LAUNCH, {"selector": selector})["launchRun"]
        assert answer["__typename"] == "LaunchRunSuccess", answer
        return str(answer["run"]["runId"])

    def runs(self, job: str) -> list[dict[str, Any]]:
        """Runs of ``job``, newest first: ``runId``, ``status``, ``tags`` as a dict."""
        found = self.service.graphql(RUNS, {"job": job})["runsOrError"]["results"]
        return [{**run, "tags": {tag["key"]: tag["value"] for tag in run["tags"]}} for run in found]

    def status(self, job: str, run_id: str) -> str:
        return str(next(run["status"] for run in self.runs(job) if run["runId"] == run_id))

    def terminate(self, run_id: str) -> None:
        answer = self.service.graphql(TERMINATE, {"runId": run_id})["terminateRun"]
        assert answer["__typename"] == "TerminateRunSuccess", answer

    def run_log(self, run_id: str, last: int = 15) -> list[str]:
        """The last ``last`` lines of a run's event log as its run page lists them, for a
        test's failure message."""
        found = self.service.graphql(RUN_LOG, {"runId": run_id})["logsForRun"]
        lines = [
            f"{event['__typename']}: {event.get('message') or ''}"[:300]
            for event in found.get("events", [])
        ]
        return lines[-last:]

    def ticks(self, sensor: str) -> list[dict[str, Any]]:
        selector = {
            "repositoryLocationName": self.location,
            "repositoryName": REPOSITORY,
            "sensorName": sensor,
        }
        found = self.service.graphql(TICKS, {"selector": selector})["sensorOrError"]
        return list(found["sensorState"]["ticks"])

    def materializations(self, path: list[str]) -> list[dict[str, int]]:
        """Integer metadata of each materialization of the asset at ``path``, newest first."""
        found = self.service.graphql(MATERIALIZATIONS, {"path": path})["assetOrError"]
        return [
            {e["label"]: e["intValue"] for e in m["metadataEntries"] if "intValue" in e}
            for m in (found or {}).get("assetMaterializations", [])
        ]

    def stop_sensor(self, sensor: str) -> None:
        """Stop ``sensor`` as its page's toggle does."""
        selector = {
            "repositoryLocationName": self.location,
            "repositoryName": REPOSITORY,
            "sensorName": sensor,
        }
        found = self.service.graphql(SENSOR_STATE, {"selector": selector})
        state = found["sensorOrError"]["sensorState"]
        answer = self.service.graphql(STOP_SENSOR, {"id": state["id"]})["stopSensor"]
        assert answer["__typename"] == "StopSensorMutationResult", answer

    def freshness(self, path: list[str]) -> str:
        """The asset's freshness as its page shows it: ``HEALTHY``, ``WARNING``, ``DEGRADED``
        (its freshness policy fails) or ``UNKNOWN`` (not evaluated yet)."""
        found = self.service.graphql(FRESHNESS, {"path": path})["assetNodeOrError"]
        return str(found["freshnessStatusInfo"]["freshnessStatus"])
